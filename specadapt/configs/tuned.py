"""Deployable configs for what `specadapt tune` recommends, for vLLM and TensorRT-LLM.

A recommendation is a draft length per batch size in vLLM's form: inclusive ranges
``[start, end, k]`` (``num_speculative_tokens_per_batch_size``; a batch size in a gap or past
the last range takes the k of the range before it). TensorRT-LLM says the same with other
words (``tensorrt_llm/_torch/speculative/utils.py`` get_draft_len_for_batch_size and
``llmapi/llm_args.py`` DecodingBaseConfig, main 2026):

* ``draft_len_schedule {batch_size: draft_len}``: the keys are upper bounds; a batch size
  takes the value of the first key >= it, and past the largest key nothing is drafted. The
  smallest key's value must equal ``max_draft_len``, so the draft length can only fall as
  the batch grows.
* ``max_concurrency``: speculation at ``max_draft_len`` up to that batch size, off above.

So a vLLM schedule becomes a TensorRT-LLM one with each range's end as key (a gap belongs
to the range before it, as in vLLM); where the last range still drafts, its key is
TensorRT-LLM's default ``max_batch_size`` so that batch sizes past the sweep keep drafting
as vLLM's do. ``first_disagreement`` checks the two lookups batch size by batch size.
"""

from __future__ import annotations

import importlib.util
import json
from bisect import bisect_left
from collections.abc import Sequence
from pathlib import Path

import yaml

from specadapt.configs import render
from specadapt.configs import versions as V
from specadapt.configs.checks import Problem, check_spec, errors, raise_on_errors
from specadapt.configs.deploy import TRTLLM_CONFIG_NAME
from specadapt.configs.spec import SpecConfig
from specadapt.configs.trtllm import check_trtllm_config, read_trtllm_form
from specadapt.configs.vllm import vllm_spec_dict
from specadapt.errors import UsageError
from specadapt.records.reports import atomic_write_text
from specadapt.records.schedule import k_for_batch, schedule_problems
from specadapt.records.tune import Recommendation, WrittenConfig

VLLM_FILE = "vllm-speculative-config.json"
VLLM_FIXED_FILE = "vllm-fixed-k.json"
TRTLLM_FILE = TRTLLM_CONFIG_NAME
# TensorRT-LLM LlmArgs.max_batch_size default: no batch is larger unless the server raises it
TRTLLM_MAX_BATCH_SIZE = 2048

OFF_NOTE = ("speculation did not pay at any measured batch size: deploy without a speculative "
            "config")
NONE_NOTE = ("no speculative candidate was measured, so there is nothing to recommend: deploy "
             "without a speculative config until a sweep measures one")
FALLBACK_NOTE = ("the best single k over all measured batch sizes, for a vLLM server that does not "
                 "apply num_speculative_tokens_per_batch_size (versions before 0.32 do not know the key)")
TRTLLM_RULES = "TensorRT-LLM field rules"

Schedule = Sequence[Sequence[int]]


# ------------------------------------------------------------------ the two lookups

def trtllm_draft_len(spec: SpecConfig, batch_size: int) -> int | None:
    """The draft length TensorRT-LLM runs ``spec`` at ``batch_size``."""
    if spec.draft_len_schedule is not None:
        keys = sorted(spec.draft_len_schedule)
        idx = bisect_left(keys, batch_size)
        return spec.draft_len_schedule[keys[idx]] if idx < len(keys) else 0
    if spec.max_concurrency is not None and batch_size > spec.max_concurrency:
        return 0
    return spec.k


def first_disagreement(schedule: Schedule | None, k: int, trt: SpecConfig,
                       upto: int = TRTLLM_MAX_BATCH_SIZE) -> int | None:
    """The smallest batch size in 1..``upto`` where TensorRT-LLM's draft length under ``trt``
    differs from vLLM's under ``schedule`` with engine k ``k``; None when they agree."""
    for batch_size in range(1, upto + 1):
        if trtllm_draft_len(trt, batch_size) != k_for_batch(schedule or [], batch_size, k):
            return batch_size
    return None


def _steps(schedule: Schedule) -> list[tuple[int, int]]:
    """vLLM's lookup as (last batch size, k) steps: a gap belongs to the range before it,
    neighbours with the same k are one step."""
    entries = sorted(tuple(e) for e in schedule)
    ends = [nxt[0] - 1 for nxt in entries[1:]] + [entries[-1][1]]
    steps: list[tuple[int, int]] = []
    for (_, _, kk), end in zip(entries, ends):
        if steps and steps[-1][1] == kk:
            steps.pop()
        steps.append((end, kk))
    return steps


# ------------------------------------------------------------------ one spec per engine

def _check_k(k: int) -> None:
    if k <= 0:
        raise ValueError(f"k={k}: speculation off has no speculative config (deploy the target alone).")


def _check_schedule(schedule: Schedule | None, k: int) -> None:
    if schedule is not None:
        raise_on_errors([Problem(m) for m in schedule_problems([list(e) for e in schedule], k)])


def vllm_spec(base: SpecConfig, k: int, schedule: Schedule | None) -> SpecConfig:
    """``base`` at draft length ``k`` with ``schedule`` as num_speculative_tokens_per_batch_size;
    no schedule key when there is none or it gives k at every batch size. ValueError for
    k <= 0 (off has no speculative config); UsageError for a schedule vLLM would not run as
    written."""
    _check_k(k)
    _check_schedule(schedule, k)
    fixed = not schedule or all(kk == k for _, _, kk in schedule)
    return base.model_copy(update={
        "k": k, "max_concurrency": None, "draft_len_schedule": None,
        "k_per_batch_size": None if fixed else [tuple(e) for e in sorted(tuple(e) for e in schedule)]})


def trtllm_spec(base: SpecConfig, k: int, schedule: Schedule | None) -> tuple[SpecConfig | None, str]:
    """The TensorRT-LLM form of ``vllm_spec(base, k, schedule)`` and a note on it: a plain
    max_draft_len, a max_concurrency cut-off, or a draft_len_schedule; (None, why) when
    TensorRT-LLM cannot run the method or cannot say the schedule."""
    _check_k(k)
    _check_schedule(schedule, k)
    dropped = [name for name in ("draft_tp", "ngram_min") if getattr(base, name) is not None]
    plain = base.model_copy(update={"k_per_batch_size": None, "max_concurrency": None,
                                    "draft_len_schedule": None, "draft_tp": None, "ngram_min": None})
    entries = sorted(tuple(e) for e in schedule or [])
    for (_, _, before), (start, _, after) in zip(entries, entries[1:]):
        if after > before:
            return None, (f"the schedule raises the draft length from {before} to {after} above batch "
                          f"size {start - 1}; TensorRT-LLM drafts the most at the smallest batch size "
                          "(draft_len_schedule's smallest key must equal max_draft_len), so it cannot "
                          "say this: deploy the fixed k instead")
    steps = _steps(entries) if entries else []
    top = steps[0][1] if steps else k
    if top == 0:
        return None, "the schedule drafts nothing at any batch size: deploy without a speculative config"
    problems = errors(check_spec(plain.model_copy(update={"k": top}), "trtllm"))
    if problems:
        return None, "TensorRT-LLM cannot run this config: " + " ".join(p.message for p in problems)
    tail = (f" ({', '.join(dropped)} dropped: TensorRT-LLM runs the draft at the target's tensor "
            "parallel size and has no minimum n-gram)") if dropped else ""
    if base.method == "draft_model" and any(kk == 0 for _, kk in steps):
        tail += ("; newer TensorRT-LLM drafts at least 1 token with Draft_Target where this says 0 "
                 "(min_runtime_draft_len)")
    if len(steps) <= 1:
        return plain.model_copy(update={"k": top}), f"max_draft_len {top} at every batch size{tail}"
    if len(steps) == 2 and steps[1][1] == 0:
        cut = steps[0][0]
        return (plain.model_copy(update={"k": top, "max_concurrency": cut}),
                f"max_draft_len {top} up to batch size {cut}, speculation off above (max_concurrency){tail}")
    keys = dict(steps)
    last_end, last_k = steps[-1]
    note = ("draft_len_schedule: each key is the largest batch size of its draft length (TensorRT-LLM "
            "takes the first key >= the batch size)")
    if last_k > 0:  # TensorRT-LLM drafts nothing past the largest key; vLLM carries the last k on
        keys[max(last_end, TRTLLM_MAX_BATCH_SIZE)] = keys.pop(last_end)
        if last_end < TRTLLM_MAX_BATCH_SIZE:
            note += (f"; the last key is TensorRT-LLM's default max_batch_size ({TRTLLM_MAX_BATCH_SIZE}), "
                     f"so batch sizes above {last_end} keep draft length {last_k} as in vLLM (TensorRT-LLM "
                     "drafts nothing past the largest key)")
    return plain.model_copy(update={"k": top, "draft_len_schedule": keys}), note + tail


# ------------------------------------------------------------------ vLLM's own check

def _local_dir(path: str | None) -> bool:
    return bool(path) and (Path(path) / "config.json").is_file()


def vllm_checkable(spec: SpecConfig) -> bool:
    """vLLM is importable here and every model the spec names is a local directory (so the
    check reads config files and never the network)."""
    return (importlib.util.find_spec("vllm") is not None and _local_dir(spec.target)
            and (spec.draft is None or _local_dir(spec.draft)))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def vllm_engine_check(spec: SpecConfig) -> str:
    """Build vLLM's SpeculativeConfig from the spec's --speculative-config through EngineArgs
    (and run vLLM's validator of the batch schedule); the label of what checked it. UsageError
    with vLLM's message when vLLM refuses it or reads it differently."""
    import vllm
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    where = f"vLLM {vllm.__version__}"
    sd = vllm_spec_dict(spec)
    shown = json.dumps(sd, separators=(",", ":"))
    try:
        args = EngineArgs(model=spec.target, speculative_config=dict(sd), tensor_parallel_size=spec.tp,
                          max_model_len=spec.max_model_len, dtype=spec.dtype or "auto")
        sc = args.create_speculative_config(args.create_model_config(),
                                            ParallelConfig(tensor_parallel_size=spec.tp))
        schedule = sc.num_speculative_tokens_per_batch_size
        if schedule is not None:
            schedule = validate_and_normalize_dynamic_sd_schedule(schedule)
    except Exception as exc:  # vLLM's own refusal, whatever its type: one line, no traceback
        raise UsageError(f"{where} refuses the speculative config {shown}: {_one_line(exc)}") from None
    written = sorted(tuple(e) for e in spec.k_per_batch_size) if spec.k_per_batch_size else None
    read = [tuple(e) for e in schedule] if schedule is not None else None
    if (sc.num_speculative_tokens, read) != (spec.k, written):
        raise UsageError(f"{where} reads the speculative config {shown} as num_speculative_tokens="
                         f"{sc.num_speculative_tokens}, schedule {read}: the config was not written.")
    label = f"{where} create_speculative_config"
    return label + " and validate_and_normalize_dynamic_sd_schedule" if written else label


# ------------------------------------------------------------------ the files

def _vllm_file(spec: SpecConfig, path: Path, form: str, note: str | None,
               vllm_check: bool) -> tuple[str, WrittenConfig]:
    render.validate(spec, "vllm")
    checked = [f"specadapt rules (vLLM {V.fmt(V.resolve_version('vllm', None))})"]
    if vllm_check and vllm_checkable(spec):
        checked.append(vllm_engine_check(spec))
    return render.render(spec, "vllm", "json"), WrittenConfig(
        engine="vllm", path=str(path), form=form, note=note, checked_by=checked)


def _trtllm_file(spec: SpecConfig | None, note: str, path: Path, schedule: Schedule | None,
                 k: int) -> tuple[str | None, WrittenConfig]:
    if spec is None:
        return None, WrittenConfig(engine="trtllm", note=note)  # no file
    render.validate(spec, "trtllm")
    text = render.render(spec, "trtllm", "yaml")
    doc = yaml.safe_load(text)
    raise_on_errors(check_trtllm_config(doc))
    read_trtllm_form(doc["speculative_config"])  # every key typed and in range, as TensorRT-LLM reads it
    checked = ["specadapt rules (TensorRT-LLM)", TRTLLM_RULES]
    bad = first_disagreement(schedule, k, spec)
    if bad is not None:  # a conversion error, never the user's: refuse rather than deploy it
        raise RuntimeError(f"TensorRT-LLM's draft length differs from vLLM's at batch size {bad}")
    checked.append(f"draft length equal to vLLM's at batch sizes 1-{TRTLLM_MAX_BATCH_SIZE}")
    form = ("schedule" if spec.draft_len_schedule else
            "max_concurrency" if spec.max_concurrency else "fixed")
    return text, WrittenConfig(engine="trtllm", path=str(path), form=form, note=note, checked_by=checked)


def write_tuned_configs(base: SpecConfig, rec: Recommendation, out_dir: Path, *,
                        target: str | None = None, vllm_check: bool = True) -> list[WrittenConfig]:
    """Write the recommendation's configs into ``out_dir``: the vLLM --speculative-config JSON,
    the fixed fallback k for vLLM, the trtllm-serve config YAML (each validated before any file
    is written); for off/none, no files and one WrittenConfig per engine saying why."""
    if rec.form in ("off", "none"):
        note = OFF_NOTE if rec.form == "off" else NONE_NOTE
        return [WrittenConfig(engine=e, form="off", note=note) for e in ("vllm", "trtllm")]
    base = base.model_copy(update={"target": target or base.target})
    out_dir = Path(out_dir)
    schedule = rec.schedule if rec.form == "schedule" else None
    vspec = vllm_spec(base, rec.k, schedule)
    files = [_vllm_file(vspec, out_dir / VLLM_FILE, "schedule" if vspec.k_per_batch_size else "fixed",
                        None, vllm_check)]
    if vspec.k_per_batch_size and rec.fixed_fallback_k:
        files.append(_vllm_file(vllm_spec(base, rec.fixed_fallback_k, None), out_dir / VLLM_FIXED_FILE,
                                "fixed", FALLBACK_NOTE, vllm_check))
    tspec, note = trtllm_spec(base, rec.k, schedule)
    files.append(_trtllm_file(tspec, note, out_dir / TRTLLM_FILE, schedule, rec.k))
    for text, written in files:
        if text is not None:
            atomic_write_text(Path(written.path), text)
    return [written for _, written in files]
