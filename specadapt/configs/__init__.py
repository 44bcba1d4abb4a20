"""Speculative-decoding configs: one backend-neutral SpecConfig, renderers and validators.

    spec.py      SpecConfig (what the user wants)
    versions.py  backend versions and the methods each supports (with sources)
    checks.py    validation rules; model-dir checks (vocab, tokenizer, lengths, heads)
    vllm.py      vLLM flags, JSON, YAML; reading a raw vLLM speculative config
    trtllm.py    trtllm-serve YAML and argv, LLM-API kwargs, JSON-schema checks
    deploy.py    Kubernetes Deployment/Service, docker compose
    render.py    one entry point per output format
    files.py     validate / explain an existing file
    examples.py  the generated examples in the repository's configs/
    cli.py       `specadapt config`

Nothing here imports vllm, torch or tensorrt_llm.
"""
