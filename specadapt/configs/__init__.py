"""Speculative-decoding configs: one backend-neutral SpecConfig, renderers and validators.

    spec.py        SpecConfig (what the user wants)
    spec_input.py  --spec-config: the neutral form or a backend's own, read into a SpecConfig
    versions.py    backend versions and the methods each supports (with sources)
    checks.py      validation rules (one-field errors too); model-dir checks
    vllm.py        vLLM flags, JSON, YAML; reading vLLM's speculative config
    trtllm.py      trtllm-serve YAML and argv, LLM-API kwargs, JSON-schema checks; reading
                   its speculative_config
    sglang.py      SGLang's speculative flags, rendered, checked and read
    llamacpp.py    llama-cpp-python's prompt-lookup flags, rendered and read
    deploy.py      Kubernetes Deployment/Service, docker compose
    render.py      one entry point per output format
    tuned.py       the vLLM and TensorRT-LLM files for what `specadapt tune` recommends
    files.py       validate / explain an existing file
    examples.py    the generated examples in the repository's configs/

`specadapt config` itself lives in specadapt/commands/config.py.

Nothing here imports vllm, torch or tensorrt_llm.
"""
