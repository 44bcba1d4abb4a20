"""SGLang speculative-decoding flags: render them from a SpecConfig and check a set of them.

Flag names: python/sglang/srt/server_args.py in sgl-project/sglang (checked at commit
469c63e54e7d94591617ef9590c6aa26d54dc1bb) and its tests (``--speculative-algorithm EAGLE3
--speculative-draft-model-path P --speculative-num-steps 3 --speculative-eagle-topk 1
--speculative-num-draft-tokens 4``).
"""

from __future__ import annotations

from typing import Any

from specadapt.configs.checks import FieldError, Problem, UnknownField
from specadapt.configs.spec import SpecConfig
from specadapt.errors import UsageError

MODULE = "sglang.launch_server"
F_MODEL, F_HOST, F_PORT, F_TP, F_DTYPE, F_CTX = ("--model-path", "--host", "--port", "--tp-size", "--dtype",
                                                 "--context-length")
F_ALGO = "--speculative-algorithm"
F_DRAFT = "--speculative-draft-model-path"
F_STEPS = "--speculative-num-steps"
F_TOPK = "--speculative-eagle-topk"
F_TOKENS = "--speculative-num-draft-tokens"
SPEC_FLAGS = (F_ALGO, F_DRAFT, F_STEPS, F_TOPK, F_TOKENS)
# specadapt method -> SGLang algorithm (NEXTN: SGLang's name for MTP heads, run as EAGLE)
ALGORITHM = {"eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM", "draft_model": "STANDALONE", "mtp": "NEXTN"}
NEEDS_DRAFT = ("EAGLE", "EAGLE3", "STANDALONE")
METHOD_OF = {algo: method for method, algo in ALGORITHM.items()}
# SpecConfig field -> the flag that carries it (k: the steps; NGRAM: draft tokens - 1)
NEUTRAL_KEYS: dict[str, str] = {"method": F_ALGO, "k": F_STEPS, "draft": F_DRAFT}


def sglang_spec_flags(spec: SpecConfig) -> list[str]:
    """The ``--speculative-*`` flags for ``spec`` (empty for off). A chain draft: top-k 1,
    k steps, k+1 draft tokens (the verified root counts, as SGLang's EAGLE trees do), unless
    ``native_extras["sglang"]`` sets the top-k or draft tokens of a tree."""
    if not spec.enabled:
        return []
    algo = ALGORITHM.get(spec.method)
    if algo is None:
        raise UsageError(f"SGLang has no {spec.method!r} speculation: use one of {', '.join(sorted(ALGORITHM))}")
    if not spec.k:
        raise UsageError("k (num_speculative_tokens) is needed for SGLang: set it (3 is typical)")
    if algo in NEEDS_DRAFT and not spec.draft:
        raise UsageError(f"SGLang {algo} needs a draft model path: add it (vLLM JSON key 'model')")
    flags = [F_ALGO, algo]
    if spec.draft and algo != "NGRAM":
        flags += [F_DRAFT, spec.draft]
    if algo == "NGRAM":
        return flags + [F_TOKENS, str(spec.k + 1)]
    tree = spec.native_extras.get("sglang", {})
    return flags + [F_STEPS, str(spec.k), F_TOPK, str(tree.get(F_TOPK, 1)),
                    F_TOKENS, str(tree.get(F_TOKENS, spec.k + 1))]


def _count(flags: dict[str, Any], flag: str) -> int | None:
    if flag not in flags:
        return None
    try:
        value = int(str(flags[flag]))
    except ValueError:
        raise FieldError(flag, "must be an integer") from None
    if value < 1:
        raise FieldError(flag, "must be >= 1")
    return value


def read_sglang_flags(flags: dict[str, Any]) -> SpecConfig:
    """SGLang's speculative flags (``{"--speculative-algorithm": "EAGLE3", ...}``) -> SpecConfig.
    A tree draft (top-k > 1, or draft tokens other than steps + 1) is kept in
    ``native_extras["sglang"]``. FieldError naming the flag when one is unknown or wrong."""
    for flag in flags:
        if flag not in SPEC_FLAGS:
            raise UnknownField(flag)
    algo = flags.get(F_ALGO)
    if algo is None:
        raise FieldError(F_ALGO, f"is required (one of {', '.join(sorted(METHOD_OF))})")
    if algo not in METHOD_OF:
        raise FieldError(F_ALGO, f"must be one of {', '.join(sorted(METHOD_OF))}, not {algo!r}")
    steps, topk, tokens = (_count(flags, f) for f in (F_STEPS, F_TOPK, F_TOKENS))
    draft = str(flags[F_DRAFT]) if F_DRAFT in flags else None
    if algo == "NGRAM":
        for flag in (F_STEPS, F_TOPK, F_DRAFT):
            if flag in flags:
                raise FieldError(flag, "does not apply to NGRAM (it drafts from the context): remove it")
        if tokens is None or tokens < 2:
            raise FieldError(F_TOKENS, "is required for NGRAM and must be >= 2 (k + 1)")
        return SpecConfig(method="ngram", k=tokens - 1)
    if steps is not None and tokens is not None and tokens > steps * (topk or 1) + 1:
        raise FieldError(F_TOKENS, f"{tokens} exceeds {F_STEPS} x {F_TOPK} + 1 = {steps * (topk or 1) + 1}: lower it")
    tree = {f: v for f, v, chain in ((F_TOPK, topk, 1), (F_TOKENS, tokens, (steps or 0) + 1))
            if v is not None and v != chain}
    return SpecConfig(method=METHOD_OF[algo], k=steps, draft=draft, native_extras={"sglang": tree} if tree else {})


def flags_to_dict(argv: list[str]) -> dict[str, str]:
    """``--flag value`` / ``--flag=value`` pairs of the speculative flags in ``argv``."""
    out: dict[str, str] = {}
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in SPEC_FLAGS:
            out[name] = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return out


def _int(d: dict[str, Any], key: str) -> int | None:
    try:
        return int(d[key]) if key in d else None
    except (TypeError, ValueError):
        return -1


def check_sglang_spec(flags: dict[str, Any]) -> list[Problem]:
    """Rules SGLang enforces (or silently fixes) for its speculative flags."""
    algo = flags.get(F_ALGO)
    if algo is None:
        return [Problem(f"{flag} without {F_ALGO} does nothing: add the algorithm.", "warning")
                for flag in SPEC_FLAGS[1:] if flag in flags]
    out: list[Problem] = []
    known = set(ALGORITHM.values())
    if algo not in known:
        return [Problem(f"{F_ALGO} {algo} is not one specadapt checks: use one of {', '.join(sorted(known))}.")]
    if algo in NEEDS_DRAFT and not flags.get(F_DRAFT):
        out.append(Problem(f"{algo} needs {F_DRAFT}: add the draft model or EAGLE head."))
    if algo == "NGRAM" and flags.get(F_DRAFT):
        out.append(Problem(f"NGRAM drafts from the context: remove {F_DRAFT}."))
    steps, topk, tokens = _int(flags, F_STEPS), _int(flags, F_TOPK), _int(flags, F_TOKENS)
    for name, value in ((F_STEPS, steps), (F_TOPK, topk), (F_TOKENS, tokens)):
        if value is not None and value < 1:
            out.append(Problem(f"{name} must be an integer >= 1."))
    if algo != "NGRAM" and steps and topk == 1 and tokens and tokens > 0 and tokens != steps + 1:
        out.append(Problem(f"with {F_TOPK} 1 the draft is a chain: {F_TOKENS} must be {F_STEPS} + 1 "
                           f"({steps + 1}); SGLang rewrites it otherwise.", "warning"))
    if algo != "NGRAM" and steps and topk and tokens and tokens > steps * topk + 1:
        out.append(Problem(f"{F_TOKENS} {tokens} exceeds {F_STEPS} x {F_TOPK} + 1 = {steps * topk + 1}: lower it."))
    return out
