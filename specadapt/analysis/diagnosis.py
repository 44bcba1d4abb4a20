"""Why speculation was faster or slower here: the figures, the causes they support, what to do.

Pure functions over records (no I/O, no servers), shared by compare, equiv and tune.

Formulas at one level. N = the spec-on side's decode tokens (output tokens - 1, summed over its
measured requests); D = verify passes (the server's draft count); A = accepted draft tokens;
S = the measured TPOT ratio off/on (> 1: spec on is faster), with its interval.
- plain steps      P = N - A - D: decode steps in which no draft was proposed (an n-gram miss)
- tokens per pass  L = 1 + A / D (the bonus token counted)
- pass cost        v(S) = (N / S - P) / D, in spec-off decode steps: the spec-on side spent N / S
                   decode steps' worth of time, P of them on plain steps. With P = 0, v = L / S.
                   Its interval is v(S_high) .. v(S_low).
- draft cost       k c_d per pass, c_d the cost of one draft-model token in decode steps
                   (--draft-cost, or the draft's parameter count over the target's); 0 for n-gram.
- break-even       L* = v tokens per pass; the i.i.d. acceptance a* with (1 - a^(k+1)) / (1 - a)
                   = L*; impossible when v > k + 1 (even a draft that is always right cannot pay).
- ideal            N / (P + D (1 + k c_d)): every verify pass one decode step plus the draft's own
                   cost (the memory-bound limit).
- model            tune's fit v + c k where several k were measured, else 1 + c k with
                   c = (v - 1) / k; with rho = P / D plain steps per pass,
                   S(k') = (rho + 1 + sum_{i<k'} p_i) / (rho + v + c k') (rho = 0: analysis/tune_model's),
                   and the k' <= k it predicts best (0: off). With one k it reproduces the measured S.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from specadapt.analysis.interference import detected_interference, stalls_text, where_text
from specadapt.analysis.pairs import Pair, level_records, pair_records
from specadapt.analysis.pass_notes import speculation_of
from specadapt.analysis.passes import NOT_AVAILABLE
from specadapt.analysis.stats import ratio_ci
from specadapt.analysis.text import pct
from specadapt.analysis.tune_model import predict_ratio
from specadapt.native_reference import theory
from specadapt.records import AcceptanceSummary, LevelResult, RatioCI, RequestRecord, ServerInfo
from specadapt.records.diagnosis import Advice, Cause, Diagnosis, Landing, LandingClass, LevelFigures
from specadapt.records.interference import InterferenceFinding
from specadapt.records.passes import PassFigures, SpeculationSeen

COMPUTE_BOUND = 1.5
"""A verify pass (the draft's own cost left out) costing more decode steps than this, beyond its
interval, is compute-bound: the k + 1 tokens are not verified for the price of one."""
LOW_ACCEPTANCE = 0.3
"""Accepted / drafted tokens below this: the draft does not match the traffic."""
DRAFT_SHARE = 0.25
"""The draft model's own cost above this share of the pass cost makes it a cause."""
MIN_DRAFTS = 30
"""Fewer verify passes than this at a level: acceptance is too thin to read."""
TTFT_OVERHEAD = 1.25
"""Mean time to first token on / off above this: work outside decoding that speculation adds (not
when the servers stalled each other's first token: analysis/interference.py; that is its own cause)."""
MODEL_GAIN = 1.02
"""The model's best k must beat the running k by this factor to be advised."""
GPU_SATURATED_AT = 8
"""On a GPU, a compute-bound verify pass from this concurrency on is put down to the batch."""

LAND_ACCEPTANCE = 0.5
"""Accepted / drafted tokens at or above this: the drafts land. A verify pass of k draft tokens of
which a share r is accepted yields 1 + r k tokens: at r = 0.5 that is 1 + k / 2, at least 1.5 for
any k >= 1, half as much again as a plain decode step's one token. Below LOW_ACCEPTANCE they do not
land (the bound of the low-acceptance cause); in between they land partly."""
NAMED_PROMPTS = 3
"""At most this many prompts named per kind of landing within a category (the most extreme first)."""

THRESHOLDS = {"compute_bound_pass_cost": COMPUTE_BOUND, "low_acceptance": LOW_ACCEPTANCE,
              "draft_share": DRAFT_SHARE, "min_drafts": MIN_DRAFTS, "ttft_overhead": TTFT_OVERHEAD,
              "model_gain": MODEL_GAIN, "land_acceptance": LAND_ACCEPTANCE}


@dataclass(frozen=True)
class Hardware:
    """What the diagnosis needs to know of the spec-on server's machine (None: not known)."""

    cpu_model: str | None = None
    cores: int | None = None
    native_dtypes: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    missing_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class DraftCost:
    """The draft's own cost per draft token, in decode steps of the target, and where it came from."""

    per_token: float
    source: str


@dataclass(frozen=True)
class Context:
    """Everything besides the levels: k, method, dtype, hardware, the draft's cost."""

    k: int | None = None
    dtype: str | None = None
    hardware: Hardware | None = None
    draft: DraftCost | None = None
    spec_enabled: bool | None = None
    categories: Mapping[str, RatioCI] = field(default_factory=dict)
    """The first level's TPOT ratio per prompt category."""
    interference: InterferenceFinding | None = None
    """The servers stalled each other's first token (a finding that detected it), or None."""


# --- the arithmetic -----------------------------------------------------------------------------
def decode_tokens(records: Sequence[RequestRecord]) -> int:
    """N: output tokens - 1 over the succeeded requests with a TPOT (two tokens or more)."""
    return sum(r.output_tokens - 1 for r in records if r.ok and r.output_tokens >= 2
               and r.e2e_ns is not None and r.ttft_ns is not None)


def plain_steps(n: int, acc: AcceptanceSummary) -> float | None:
    """P = N - A - D, or None where it cannot be known (no counters, or P < 0 beyond 5% of D:
    the counts disagree, e.g. output cut by max_tokens after acceptance); small negatives are 0."""
    if not acc.drafts or acc.accepted_tokens is None:
        return None
    p = n - acc.accepted_tokens - acc.drafts
    if p < -0.05 * acc.drafts:
        return None
    return max(0.0, p)


def pass_cost(n: int, plain: float, drafts: float, s: float | None) -> float | None:
    """v(S) = (N / S - P) / D; None without S > 0 or drafts."""
    if s is None or s <= 0 or drafts <= 0:
        return None
    return (n / s - plain) / drafts


def break_even_acceptance(cost: float, k: int) -> float | None:
    """The i.i.d. acceptance a at which a pass yields ``cost`` tokens; 0 when even a = 0 pays
    (cost <= 1); None when impossible (cost > k + 1)."""
    if cost <= 1.0:
        return 0.0
    if cost > k + 1:
        return None
    return theory.acceptance_from_mean_length(cost, k)


def ideal_speedup(n: int, plain: float, drafts: float, k: int, draft_per_token: float) -> float | None:
    """N / (P + D (1 + k c_d))."""
    cost = plain + drafts * (1.0 + k * draft_per_token)
    return n / cost if cost else None


def verdict_of(r: RatioCI | None) -> str:
    """faster / slower / no clear difference from the interval; unknown without one."""
    if r is None or r.point is None or r.low is None or r.high is None:
        return "unknown"
    return r.verdict


def level_name(lv: LevelResult) -> str:
    if lv.request_rate is not None:
        rate = "all at once" if math.isinf(lv.request_rate) else f"{lv.request_rate:g} req/s"
        return rate
    return f"concurrency {lv.concurrency}"


def ttft_ratio(pairs: Sequence[Pair]) -> RatioCI:
    """TTFT on / off over the (off, on) pairs of one concurrency-1 level (analysis/pairs), each pair
    with a first token on both sides one unit: exp(mean log(ttft_on / ttft_off)) with its t interval."""
    logs = [math.log(on.ttft_ns / off.ttft_ns) for off, on in pairs if off.ttft_ns and on.ttft_ns]
    return ratio_ci(logs, "pairs")


def level_figures(lv: LevelResult, on_records: Sequence[RequestRecord], k: int | None,
                  draft: DraftCost | None, fit_v: float | None = None, fit_c: float | None = None,
                  ttft: RatioCI | None = None) -> LevelFigures:
    """The arithmetic of one level (module docstring); ``fit_v``/``fit_c``: tune's fit at this level;
    ``ttft``: the level's TTFT ratio on/off (concurrency 1)."""
    acc = lv.acceptance
    s = lv.speed.tpot
    fig = LevelFigures(level=level_name(lv), concurrency=lv.concurrency, request_rate=lv.request_rate,
                       tpot_ratio=s, verdict=verdict_of(s), e2e_ratio=lv.speed.e2e, ttft_ratio=ttft)
    if not acc.known or not acc.drafts or acc.accepted_tokens is None:
        return fig
    k = k or len(acc.per_position_rate) or None
    fig.k = k
    fig.acceptance_rate = acc.acceptance_rate
    fig.per_position_rate = list(acc.per_position_rate)
    fig.tokens_per_pass = acc.mean_acceptance_length
    fig.verify_passes = acc.drafts
    n = decode_tokens(on_records)
    plain = plain_steps(n, acc)
    if plain is None:  # the counts disagree: every step taken for a pass (v = L / S)
        n, plain = int(round(acc.drafts + acc.accepted_tokens)), 0.0
        fig.pass_cost_source = "tokens per pass / TPOT ratio (decode steps without a draft unknown)"
    else:
        fig.plain_steps = plain
        fig.pass_cost_source = "(decode tokens / TPOT ratio - plain steps) / verify passes"
    fig.tokens_per_step = n / (plain + acc.drafts)  # acc.drafts > 0 here
    fig.pass_cost = pass_cost(n, plain, acc.drafts, s.point)
    fig.pass_cost_low = pass_cost(n, plain, acc.drafts, s.high)
    fig.pass_cost_high = pass_cost(n, plain, acc.drafts, s.low)
    per_token = draft.per_token if draft else 0.0
    if k:
        fig.draft_cost_per_pass = k * per_token
        fig.draft_cost_source = draft.source if draft else None
        fig.ideal_speedup = ideal_speedup(n, plain, acc.drafts, k, per_token)
    if fig.ideal_speedup and s.point:
        fig.measured_over_ideal = s.point / fig.ideal_speedup
    if fig.pass_cost is not None and k:
        fig.break_even_tokens_per_pass = fig.pass_cost
        fig.break_even_acceptance = break_even_acceptance(fig.pass_cost, k)
        fig.break_even_possible = fig.pass_cost <= k + 1
    _model(fig, fit_v, fit_c)
    return fig


def model_ratio(rates: Sequence[float], v: float, c: float, k: int, rho: float) -> float | None:
    """The model's TPOT ratio at k with rho plain steps per verify pass (steps that draft nothing
    cost one step and yield one token): (rho + 1 + sum_{i<k} p_i) / (rho + v + c k); 1 at k = 0;
    with rho = 0 tune's predict_ratio."""
    base = predict_ratio(rates, v, c, k)
    if k == 0 or base is None:
        return base
    return (rho + 1.0 + sum(rates[:k])) / (rho + v + c * k)


def _model(fig: LevelFigures, fit_v: float | None, fit_c: float | None) -> None:
    """The cost model's figures: tune's v + c k, or 1 + c k through this level's pass cost."""
    k = fig.k
    if not k or not fig.per_position_rate:
        return
    if fit_v is not None and fit_c is not None:
        fig.model, v, c = "v + c k", fit_v, fit_c
    elif fig.pass_cost is not None:
        fig.model, v, c = "1 + c k", 1.0, (fig.pass_cost - 1.0) / k
    else:
        return
    fig.model_v, fig.model_c = v, c
    rates = fig.per_position_rate
    rho = (fig.plain_steps or 0.0) / fig.verify_passes  # verify_passes > 0 wherever there is a k
    predicted = {kk: p for kk in range(k + 1) if (p := model_ratio(rates, v, c, kk, rho)) is not None}
    fig.model_speedup = predicted.get(k)
    if fig.model == "v + c k" and fig.model_speedup and fig.tpot_ratio and fig.tpot_ratio.point:
        fig.measured_over_model = fig.tpot_ratio.point / fig.model_speedup
    if predicted:
        best = max(predicted, key=lambda kk: (predicted[kk], -kk))
        fig.model_best_k, fig.model_best_speedup = best, predicted[best]


# --- the causes ---------------------------------------------------------------------------------
def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def ratio_text(r: RatioCI | None) -> str:
    """"1.20x [1.10, 1.30]", "1.20x (no interval)" or "-"."""
    if r is None or r.point is None:
        return "-"
    if r.low is None or r.high is None:
        return f"{r.point:.2f}x (no interval)"
    return f"{r.point:.2f}x [{r.low:.2f}, {r.high:.2f}]"


def _interval(lo: float | None, hi: float | None) -> str:
    return "" if lo is None or hi is None else f" [{lo:.2f}, {hi:.2f}]"


def verify_cost(f: LevelFigures) -> tuple[float, float, float] | None:
    """(point, low, high) of the pass cost with the draft's own cost taken out; None without an
    interval (low and high are set together)."""
    if f.pass_cost is None or f.pass_cost_low is None or f.pass_cost_high is None:
        return None
    d = f.draft_cost_per_pass or 0.0
    return f.pass_cost - d, f.pass_cost_low - d, f.pass_cost_high - d


def pass_tokens(k: int | None) -> str:
    """The tokens a verify pass checks: '5' for k = 4, 'k + 1' where k is not known."""
    return f"{k + 1}" if k else "k + 1"


UNKNOWN_HARDWARE = ("the hardware is not known (the server was given by URL on another host), so the reason "
                    "cannot be told")


def compute_bound_reason(ctx: Context, f: LevelFigures) -> tuple[str, list[Advice]]:
    """The likely reason a verify pass is compute-bound, where the hardware and dtype tell it."""
    hw, dtype = ctx.hardware, ctx.dtype
    if hw is None:
        return UNKNOWN_HARDWARE, []
    tokens = pass_tokens(f.k)
    if hw.gpus:
        gpu = hw.gpus[0]
        if f.concurrency >= GPU_SATURATED_AT or f.request_rate is not None:
            return (f"the GPU ({gpu}) is saturated at {f.level}: every request's {tokens} tokens per step keep it "
                    "computing"), [
                Advice(code="batch-size", text="speculate at lower batch sizes only: `specadapt tune` writes a "
                                               "per-batch-size schedule")]
        return f"on the GPU ({gpu}) a pass costs more than a step even at {f.level} (a large k or model)", []
    cpu = hw.cpu_model or "this CPU"
    if dtype in ("bfloat16", "float16") and dtype not in hw.native_dtypes:
        missing = ", ".join(x for x in hw.missing_flags if "16" in x or "amx" in x) or "native instructions for it"
        alt = next((d for d in reversed(hw.native_dtypes) if d != dtype), "float32")
        return f"{dtype} has no native support on {cpu} (no {missing}): its matrix products are emulated", [
            Advice(code="dtype", text=f"serve {alt} here (native on {cpu}; `--dtype auto` picks it), or use a CPU "
                                      f"with AVX512-BF16/AMX or a GPU for {dtype}")]
    cores = f"{hw.cores} cores" if hw.cores else "its cores"
    return f"on {cpu} ({cores}) the pass is limited by arithmetic, not memory, even in {dtype or 'its dtype'}", []


def level_causes(f: LevelFigures, ctx: Context) -> tuple[list[Cause], list[Advice], list[str]]:
    """The causes one level's figures support, the advice they lead to, and the evidence gaps."""
    causes: list[Cause] = []
    advice: list[Advice] = []
    gaps: list[str] = []
    if f.verify_passes is None:  # set together with tokens_per_pass, where the counters were read
        if ctx.spec_enabled is False:
            causes.append(Cause(code="speculation-off", level=f.level,
                                text="the spec-on server shows no speculation counters: speculation is off there, "
                                     "so there is nothing to diagnose"))
        else:
            gaps.append(f"{f.level}: acceptance unknown (no spec-decode counters read), so the pass cost and "
                        "the causes cannot be told apart")
        return causes, advice, gaps
    if f.verify_passes < MIN_DRAFTS:
        gaps.append(f"{f.level}: only {f.verify_passes:.0f} verify passes (fewer than {MIN_DRAFTS}): too few "
                    "to read acceptance; send more prompts or tokens")
        return causes, advice, gaps
    if f.pass_cost is None:
        gaps.append(f"{f.level}: no TPOT ratio, so the pass cost is unknown")
        return causes, advice, gaps
    if f.pass_cost_low is None:
        gaps.append(f"{f.level}: the TPOT ratio has no interval (too few pairs or blocks), so the pass cost "
                    f"{f.pass_cost:.2f} decode steps is a point estimate only; add --repeat")
    k = f.k  # known wherever a draft cost, a model or a break-even exists
    vc = verify_cost(f)
    if f.verdict == "faster":
        causes.append(Cause(code="pays", level=f.level, text=(
            f"speculation pays: {f.tokens_per_pass:.2f} tokens per verify pass at a cost of {f.pass_cost:.2f}"
            f"{_interval(f.pass_cost_low, f.pass_cost_high)} decode steps"
            + (f" (ideal {_x(f.ideal_speedup)} if a pass cost one step)" if f.ideal_speedup else "")),
            figures={"tokens_per_pass": f.tokens_per_pass, "pass_cost": f.pass_cost}))
    if vc is not None and vc[1] > COMPUTE_BOUND:
        reason, adv = compute_bound_reason(ctx, f)
        causes.append(Cause(code="verify-compute-bound", level=f.level, text=(
            f"the verify pass is compute-bound: checking {pass_tokens(f.k)} tokens costs {vc[0]:.2f}{_interval(vc[1], vc[2])} "
            f"decode steps (memory-bound ideal: 1); {reason}"), figures={"verify_cost": vc[0], "low": vc[1]}))
        advice = list(adv)  # the level's first advice
    if f.acceptance_rate is not None and f.acceptance_rate < LOW_ACCEPTANCE:
        rates = " / ".join(pct(r, 0) for r in f.per_position_rate)
        causes.append(Cause(code="low-acceptance", level=f.level, text=(
            f"the draft does not match this traffic: {pct(f.acceptance_rate, 0)} of draft tokens accepted "
            f"(per position {rates}), {f.tokens_per_pass:.2f} tokens per pass")
            + _categories(ctx.categories), figures={"acceptance_rate": f.acceptance_rate}))
        advice.append(Advice(code="draft", text="a better-matched draft: EAGLE/MTP heads trained for this target, "
                                                "or n-gram only where the answer copies the input"
                                                + _categories(ctx.categories, short=True)))
    elif (f.break_even_possible and f.tokens_per_pass < f.break_even_tokens_per_pass  # never when faster
          and f.break_even_acceptance is not None and f.acceptance_rate is not None):
        causes.append(Cause(code="low-acceptance", level=f.level, text=(
            f"acceptance below break-even: at {f.pass_cost:.2f} decode steps per pass it takes "
            f"{f.break_even_tokens_per_pass:.2f} tokens per pass (acceptance {pct(f.break_even_acceptance, 0)} per "
            f"token) to break even; the draft gives {f.tokens_per_pass:.2f} ({pct(f.acceptance_rate, 0)})"),
            figures={"break_even_acceptance": f.break_even_acceptance, "acceptance_rate": f.acceptance_rate}))
    if f.draft_cost_per_pass and f.draft_cost_per_pass >= DRAFT_SHARE * f.pass_cost:
        per = f.draft_cost_per_pass / k  # a draft cost per pass is set only with k
        causes.append(Cause(code="draft-expensive", level=f.level, text=(
            f"the draft model is expensive: {per:.2f} decode steps per draft token, {f.draft_cost_per_pass:.2f} of "
            f"the {f.pass_cost:.2f} a pass costs ({f.draft_cost_source})"),
            figures={"draft_cost_per_pass": f.draft_cost_per_pass}))
        advice.append(Advice(code="draft", text="a smaller draft (or fewer draft tokens): each draft token costs "
                                                f"{per:.2f} decode steps here"))
    if f.model_best_k is not None and f.model_speedup:  # the best k is the argmax over 0..k
        if f.model_best_speedup > MODEL_GAIN * f.model_speedup:
            if f.model_best_k == 0:
                advice.append(Advice(code="off", text=(
                    f"turn speculation off at {f.level}: the cost model ({f.model}, c = {f.model_c:.2f}) "
                    f"predicts no k up to {k} beats off (k={k}: {_x(f.model_speedup)})")))
            else:
                later = " / ".join(pct(r, 0) for r in f.per_position_rate[f.model_best_k:])
                causes.append(Cause(code="k-too-long", level=f.level, text=(
                    f"k={k} drafts too far: positions after {f.model_best_k} are accepted {later} of passes, too "
                    f"little for the {f.model_c:.2f} decode steps each extra draft token costs; the model predicts "
                    f"{_x(f.model_best_speedup)} at k={f.model_best_k} against {_x(f.model_speedup)} at k={k}"),
                    figures={"model_best_k": f.model_best_k, "model_best_speedup": f.model_best_speedup}))
                advice.append(Advice(code="k", text=(
                    f"run k={f.model_best_k} at {f.level} (predicted {_x(f.model_best_speedup)}); "
                    f"`specadapt tune --k 0,{f.model_best_k},{k}` measures it")))
    if f.break_even_possible is False:
        advice.append(Advice(code="off", text=(
            f"at {f.pass_cost:.2f} decode steps per pass no acceptance can pay at {f.level}: even a draft that is "
            f"always right gives {k + 1} tokens per pass")))
    t = f.ttft_ratio
    if (ctx.interference is None and t is not None and t.point is not None and t.low is not None and t.low > 1.0
            and t.point > TTFT_OVERHEAD):
        causes.append(Cause(code="overhead", level=f.level, text=(
            f"the first token comes {pct(t.point - 1, 0)} later with speculation on (TTFT on/off {ratio_text(t)}): work "
            "outside the decode steps (prefill, scheduling, the proposer"
            + (", the draft model's own prefill)" if ctx.draft is not None else ")")),
            figures={"ttft_ratio": t.point}))
    return causes, advice, gaps


INTERFERENCE_ADVICE = Advice(code="interference", text=(
    "give each server its own hardware: its own CPUs or GPUs (servers specadapt starts side by side get them, "
    "unless `--launch shared`), separate machines, or the sides one after the other (`--launch sequential`); "
    "then TTFT, E2E and tokens/s measure each server alone"))


def interference_cause(f: InterferenceFinding, ttft: RatioCI | None) -> Cause:
    """The servers stalled each other's first token: the cause that takes the TTFT overhead's place."""
    where = "in the check before the run " if f.source == "check" else ""
    ttft_part = (f"; the TTFT ratio on/off {ratio_text(ttft)} is theirs, not speculation's"
                 if ttft is not None and ttft.point is not None and ttft.point > TTFT_OVERHEAD else "")
    figures = {"stalls": float(f.stalls), "stall_ms": f.stall_ms, "p_value": f.p_value}
    return Cause(code="interference", level="concurrency 1", text=(
        f"the servers stall each other, not speculation: {where}{stalls_text(f)}, "
        f"{where_text(f.stalls_after_other, f.stalls)}{ttft_part}; TTFT, E2E and tokens/s include the stalls, "
        "TPOT does not"), figures={k: v for k, v in figures.items() if v is not None})


def _categories(cats: Mapping[str, RatioCI], short: bool = False) -> str:
    """'; it pays on code (1.4x [1.2, 1.6]) and loses on qa (...)' from per-category TPOT ratios."""
    pays = [c for c, r in cats.items() if r.low is not None and r.low > 1.0]
    loses = [c for c, r in cats.items() if r.high is not None and r.high < 1.0]
    if not pays and not loses:
        return ""
    if short:
        return f" (it pays on {', '.join(pays)})" if pays else ""
    parts = []
    if pays:
        parts.append("pays on " + ", ".join(f"{c} ({ratio_text(cats[c])})" for c in pays))
    if loses:
        parts.append("loses on " + ", ".join(f"{c} ({ratio_text(cats[c])})" for c in loses))
    return "; by prompt category it " + " and ".join(parts)


def crossover_cause(figs: Sequence[LevelFigures]) -> tuple[Cause | None, Advice | None]:
    """Faster at a lower concurrency, slower at a higher one: the load is past the crossover."""
    closed = [f for f in figs if f.request_rate is None]
    faster = [f for f in closed if f.verdict == "faster"]
    if not faster:
        return None, None
    slower = [f for f in closed if f.verdict == "slower" and f.concurrency > faster[0].concurrency]
    if not slower:
        return None, None
    last = max((f for f in faster if f.concurrency < slower[0].concurrency), key=lambda f: f.concurrency)
    first = slower[0]
    rise = ""
    if last.pass_cost is not None and first.pass_cost is not None:
        rise = (f": a verify pass costs {last.pass_cost:.2f} decode steps at {last.concurrency} and "
                f"{first.pass_cost:.2f} at {first.concurrency}, as the batch fills the hardware")
    cause = Cause(code="past-crossover", level=f"concurrency {first.concurrency} and above", text=(
        f"the load is past the crossover: faster up to concurrency {last.concurrency} "
        f"({ratio_text(last.tpot_ratio)}), slower from {first.concurrency} ({ratio_text(first.tpot_ratio)}){rise}"),
        figures={"last_faster": last.concurrency, "first_slower": first.concurrency})
    advice = Advice(code="batch-size", text=(
        f"speculate up to concurrency {last.concurrency} only: `specadapt tune` writes the per-batch-size "
        "schedule (vLLM num_speculative_tokens_per_batch_size, TensorRT-LLM draft_len_schedule)"))
    return cause, advice


def _merge(causes: list[Cause]) -> list[Cause]:
    """One cause per code: the first level's sentence, the other levels named after it."""
    out: dict[str, Cause] = {}
    for c in causes:
        if c.code in out:
            first = out[c.code]
            first.level = f"{first.level}, {c.level}"
        else:
            out[c.code] = c
    return list(out.values())


def _dedupe(advice: list[Advice]) -> list[Advice]:
    seen: set[str] = set()
    out = []
    for a in advice:
        if a.text not in seen:
            seen.add(a.text)
            out.append(a)
    return out


_PRIORITY = ("speculation-off", "verify-compute-bound", "draft-expensive", "low-acceptance", "past-crossover",
             "k-too-long", "interference", "overhead", "pays")


VERDICT_WORDS = {"faster": "faster", "slower": "slower", "no clear difference": "neither clearly faster nor slower",
                 "unknown": "of unknown speed"}


def headline(figs: Sequence[LevelFigures], causes: Sequence[Cause]) -> str:
    """The verdict at the first level and its main cause: where it is faster, why it pays; else the
    cause that weighs most (_PRIORITY), "it pays" left out (it may hold at another level)."""
    if not figs:
        return "nothing was measured"
    f = figs[0]
    head = f"Spec on is {VERDICT_WORDS[f.verdict]} at {f.level} (TPOT {ratio_text(f.tpot_ratio)})"
    if f.verdict == "faster":
        main = next((c for c in causes if c.code == "pays"), None)
    else:
        main = min((c for c in causes if c.code != "pays"), key=lambda c: _PRIORITY.index(c.code), default=None)
    stalled = any(c.code == "interference" for c in causes)
    stalls = STALLS_NOTE if stalled and (main is None or main.code != "interference") else ""
    if main is None:
        return head + "; the figures point to no single cause." + stalls
    return f"{head}: {main.text}." + stalls


STALLS_NOTE = " The servers stalled each other's first token: TTFT, E2E and tokens/s include it, TPOT does not."


def diagnose(figs: Sequence[LevelFigures], ctx: Context) -> Diagnosis:
    """Causes, advice and gaps over every level's figures."""
    causes: list[Cause] = []
    advice: list[Advice] = []
    gaps: list[str] = []
    for f in figs:
        c, a, g = level_causes(f, ctx)
        causes += c
        advice += a
        gaps += g
    cross, cross_advice = crossover_cause(figs)
    if cross is not None:
        causes.append(cross)
        advice.append(cross_advice)
    if ctx.interference is not None:
        first = next((f.ttft_ratio for f in figs if f.ttft_ratio is not None), None)
        causes.append(interference_cause(ctx.interference, first))
        advice.insert(0, INTERFERENCE_ADVICE)
    if gaps:
        advice.append(Advice(code="evidence", text="more evidence: --repeat or --max-tokens higher, or more prompts"))
    merged = _merge(causes)
    return Diagnosis(headline=headline(figs, merged), levels=list(figs), causes=merged, advice=_dedupe(advice),
                     evidence_gaps=gaps, thresholds=dict(THRESHOLDS))


# --- the draft's cost -----------------------------------------------------------------------------
def param_count(config: Mapping[str, object]) -> float | None:
    """Approximate parameters of a decoder-only transformer from its HF config.json: embeddings
    (twice unless tied) + layers x (attention q, o + k, v at the KV heads' width + an MLP of 3 or 2
    matrices)."""
    try:
        h = int(config["hidden_size"])  # type: ignore[arg-type]
        layers = int(config["num_hidden_layers"])  # type: ignore[arg-type]
        vocab = int(config["vocab_size"])  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        return None
    inter = int(config.get("intermediate_size") or 4 * h)  # type: ignore[arg-type]
    heads = int(config.get("num_attention_heads") or 1)  # type: ignore[arg-type]
    kv = int(config.get("num_key_value_heads") or heads)  # type: ignore[arg-type]
    kv_width = h * kv // heads
    gated = config.get("hidden_act", "silu") in ("silu", "swiglu", "gelu_pytorch_tanh")  # gate, up and down
    mlp = (3 if gated else 2) * h * inter
    attn = 2 * h * h + 2 * h * kv_width
    embed = vocab * h * (1 if config.get("tie_word_embeddings") is True else 2)
    return float(embed + layers * (attn + mlp))


def draft_cost_from_configs(draft: Mapping[str, object], target: Mapping[str, object]) -> DraftCost | None:
    """c_d = the draft's parameter count over the target's (a decode step reads every weight once)."""
    pd, pt = param_count(draft), param_count(target)
    if not pd or not pt:
        return None
    return DraftCost(per_token=pd / pt, source=f"the draft's parameters over the target's ({pd / 1e6:.0f}M / "
                                               f"{pt / 1e6:.0f}M, from their config.json)")


# --- where drafts land -----------------------------------------------------------------------------
def land_rate(fig: PassFigures, k: int | None) -> float | None:
    """The acceptance a group's landing is judged by: accepted / drafted where its drafted tokens are
    known (0 where none were drafted); else (T - 1) / k from its tokens per pass T of the target (a
    pass checks at most k draft tokens and the passes keep T - 1 on average, so this is at most
    accepted / drafted); None where neither is known."""
    if fig.drafted is not None:
        return fig.accepted / fig.drafted if fig.drafted else 0.0
    if fig.tokens_per_pass is not None and k:
        return (fig.tokens_per_pass - 1.0) / k
    return None


def land_class(rate: float | None) -> LandingClass:
    """land: rate >= LAND_ACCEPTANCE; not: rate < LOW_ACCEPTANCE; partly in between; unknown: no rate."""
    if rate is None:
        return "unknown"
    if rate >= LAND_ACCEPTANCE:
        return "land"
    if rate < LOW_ACCEPTANCE:
        return "not"
    return "partly"


def _landing(fig: PassFigures, kind: str, category: str, k: int | None, tpot: RatioCI | None = None) -> Landing:
    rate = land_rate(fig, k)
    return Landing(kind=kind, name=fig.name, category=category, requests=fig.requests,
                   acceptance_rate=fig.acceptance_rate, drafted=fig.drafted, tokens_per_pass=fig.tokens_per_pass,
                   land_rate=rate, lands=land_class(rate), tpot_ratio=tpot)


def landing_of(seen: SpeculationSeen, speeds: Mapping[str, RatioCI]) -> list[Landing]:
    """Each category of the section (with its TPOT ratio from ``speeds``), then the prompts of each
    category that holds several."""
    out = [_landing(c, "category", c.name, seen.k, speeds.get(c.name)) for c in seen.categories]
    category_of = {a.prompt_id: a.category for a in seen.requests}
    for c in seen.categories:
        prompts = [p for p in seen.prompts if category_of.get(p.name) == c.name]
        if len(prompts) > 1:
            out += [_landing(p, "prompt", c.name, seen.k) for p in prompts]
    return out


def _group_text(g: Landing) -> str:
    """'code (acceptance 71%, 3.40 tokens per pass)'."""
    parts = []
    if g.acceptance_rate is not None:
        parts.append(f"acceptance {pct(g.acceptance_rate, 0)}")
    elif g.drafted == 0:
        parts.append("no draft proposed")
    if g.tokens_per_pass is not None:
        parts.append(f"{g.tokens_per_pass:.2f} tokens per pass")
    return f"{g.name} ({', '.join(parts)})" if parts else g.name


def _and(items: Sequence[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


_LAND_WORDS: tuple[tuple[LandingClass, str, str], ...] = (
    ("land", "drafts land on", "they land on"), ("partly", "drafts land partly on", "partly on"),
    ("not", "drafts do not land on", "they do not on"),
    ("unknown", "whether drafts land is not known on", "not known on"))


def land_clauses(groups: Sequence[Landing], most: int | None = None) -> str:
    """'drafts land on code (...) and rag (...); partly on qa (...); they do not on chat (...)': the
    groups by kind of landing, the most extreme first (the highest landing rate where they land, the
    lowest where they do not); with ``most``, at most that many named per kind, the others counted."""
    clauses: list[str] = []
    for cls, first, later in _LAND_WORDS:
        mine = [g for g in groups if g.lands == cls]
        if not mine:
            continue
        mine.sort(key=lambda g: g.land_rate or 0.0, reverse=cls != "not")
        names = [_group_text(g) for g in mine[:most]]
        if most is not None and len(mine) > most:
            names.append(f"{len(mine) - most} more")
        clauses.append(f"{later if clauses else first} {_and(names)}")
    return "; ".join(clauses)


_TIES: dict[tuple[LandingClass, str], str] = {
    ("land", "faster"): ", where its drafts land",
    ("land", "no clear difference"): " although its drafts land: its passes cost about what their accepted "
                                     "tokens save",
    ("land", "slower"): " although its drafts land: its passes cost more than their accepted tokens save",
    ("partly", "faster"): ", where its drafts land partly",
    ("partly", "no clear difference"): ", where its drafts land partly",
    ("partly", "slower"): ", where its drafts land partly",
    ("not", "faster"): " although its drafts do not land",
    ("not", "no clear difference"): ", where its drafts do not land",
    ("not", "slower"): ", where its drafts do not land: its passes check drafts that are thrown away",
}


def speed_clauses(groups: Sequence[Landing]) -> str:
    """Each category whose TPOT ratio has a verdict, its speed tied to its landing: 'code is faster
    (TPOT 1.40x [1.20, 1.60]), where its drafts land; chat is slower (...), where its drafts do not
    land: its passes check drafts that are thrown away'."""
    parts = []
    for g in groups:
        verdict = verdict_of(g.tpot_ratio)
        if g.kind == "category" and verdict != "unknown":
            parts.append(f"{g.name} is {VERDICT_WORDS[verdict]} (TPOT {ratio_text(g.tpot_ratio)})"
                         + _TIES.get((g.lands, verdict), ""))
    return "; ".join(parts)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def drafts_land(seen: SpeculationSeen | None, why_not: str, first: LevelResult | None) -> tuple[list[Landing], str]:
    """Where drafts land, per category and per prompt of a category with several, by acceptance and by
    the TPOT ratio per category at the ``first`` level; without per-request acceptance, why not
    (``why_not``: why the section could not be read); ([], "") without a section."""
    if seen is None:
        return [], _sentence(NOT_AVAILABLE + why_not) if why_not else ""
    if not seen.available:
        return [], _sentence(seen.source_note or NOT_AVAILABLE + "no reason given")
    speeds = {name: r.tpot for name, r in first.by_category.items()} if first is not None else {}
    groups = landing_of(seen, speeds)
    cats = [g for g in groups if g.kind == "category"]
    sentences = [_sentence(land_clauses(cats))]
    for c in cats:
        prompts = [g for g in groups if g.kind == "prompt" and g.category == c.name]
        if len({g.lands for g in prompts}) > 1:
            sentences.append(_sentence(f"within {c.name}, {land_clauses(prompts, NAMED_PROMPTS)}"))
    speed = speed_clauses(cats)
    if speed:  # only with a first level
        sentences.append(_sentence(f"by speed at {level_name(first)}: {speed}"))
    return groups, " ".join(sentences)


# --- a compare report ------------------------------------------------------------------------------
def hardware_of(info: ServerInfo) -> Hardware | None:
    """The diagnosis's view of a ServerInfo's hardware facts (None: not known)."""
    hw = info.hardware
    if hw is None:
        return None
    return Hardware(cpu_model=hw.cpu_model, cores=hw.cores, native_dtypes=tuple(hw.native_dtypes),
                    gpus=tuple(g.name for g in hw.gpus), missing_flags=tuple(hw.cpu_flags_missing))


def diagnose_compare(report, draft: DraftCost | None = None,
                     fits: Mapping[int, tuple[float, float]] | None = None) -> Diagnosis:
    """The diagnosis of a compare report (its levels, counters, servers and settings); ``fits``:
    {concurrency: (v, c)} of tune's cost model fitted over several k (the model then is v + c k)."""
    on = report.on_server
    k = on.num_speculative_tokens
    fits = fits or {}
    figs = []
    for lv in [*report.levels, *report.rate_levels]:
        on_recs = [r for r in level_records(report.requests, lv.concurrency, lv.request_rate) if r.side == "on"]
        v, c = fits.get(lv.concurrency, (None, None))  # rate levels (concurrency 0) have no fit
        ttft = None
        if lv.concurrency == 1 and lv.request_rate is None:
            ttft = ttft_ratio(pair_records(report.requests, 1))
        figs.append(level_figures(lv, on_recs, k, draft, v, c, ttft))
    first = report.levels[0] if report.levels else (report.rate_levels[0] if report.rate_levels else None)
    cats = {name: r.tpot for name, r in first.by_category.items()} if first and len(first.by_category) > 1 else {}
    ctx = Context(k=k, dtype=report.settings.dtype or on.dtype, hardware=hardware_of(on),
                  draft=draft, spec_enabled=on.spec_enabled, categories=cats,
                  interference=detected_interference(report))
    d = diagnose(figs, ctx)
    seen, why_not = speculation_of(report)
    d.landing, d.drafts_land = drafts_land(seen, why_not, first)
    return d


def diagnose_tune(report) -> Diagnosis | None:
    """A tune report's diagnosis: the largest measured k of the chosen variant, read through the cost
    model tune fitted over every k of that variant (v + c k with 3+ k measured, else 1 + c k)."""
    variant = report.recommendation.variant
    measured = [c for c in report.candidates if c.status == "measured" and c.compare is not None and c.k > 0
                and c.variant == variant]
    if not measured:
        return None
    top = max(measured, key=lambda c: c.k)
    fits = {f.concurrency: (f.v, f.c) for f in report.fits
            if f.variant == variant and f.form == "v + c k" and f.v is not None and f.c is not None}
    base = top.compare.diagnosis
    d = diagnose_compare(top.compare, _draft_of(base), fits)
    d.headline = f"{top.label}, the largest k measured: {d.headline}"
    return d


def _draft_of(d: Diagnosis | None) -> DraftCost | None:
    """The draft cost a compare's diagnosis used (per token, source), to diagnose it again."""
    if d is None:
        return None
    for f in d.levels:
        if f.draft_cost_per_pass and f.k and f.draft_cost_source:
            return DraftCost(per_token=f.draft_cost_per_pass / f.k, source=f.draft_cost_source)
    return None
