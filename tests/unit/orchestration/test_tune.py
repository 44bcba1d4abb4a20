"""orchestration/tune.py's orchestration with stand-in servers and a stand-in A/B (run_compare is replaced,
so what each candidate 'measured' is exactly known): candidates, failures, a dying baseline, the
choice across variants, the verification spec and verdict, the exit code."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import pytest

from specadapt.analysis.latency import latency_summary
from specadapt.commands.tune import parse_ks, parse_on
from specadapt.configs.spec import SpecConfig
from specadapt.errors import ServerError, ServerStartError, UsageError
from specadapt.orchestration import tune as tuning
from specadapt.orchestration.probe import exit_reason
from specadapt.records import (
    AcceptanceSummary,
    CompareReport,
    CompareSettings,
    LevelResult,
    RatioCI,
    RequestSettings,
    ServerInfo,
    SpeedRatios,
)
from specadapt.records.tune import Candidate, LevelChoice, Recommendation, TuneReport, TuneSettings, Verification

BASE = SpecConfig(method="ngram", k=4, ngram_min=2, ngram_max=4)


def ratio(point: float, half: float = 0.05) -> RatioCI:
    return RatioCI(point=point, low=point - half, high=point + half, n=5, unit="pairs", method="t", level=0.95,
                   min_n=5)


def acceptance(per_pos: list[float], drafts: float = 100.0, gen: float = 400.0) -> AcceptanceSummary:
    return AcceptanceSummary(known=True, drafts=drafts, per_position_rate=per_pos, generation_tokens=gen,
                             mean_acceptance_length=1 + sum(per_pos))


def level(c: int, tpot: float, per_pos: list[float]) -> LevelResult:
    r = ratio(tpot)
    return LevelResult(concurrency=c, pairs=5, speed=SpeedRatios(tpot=r, e2e=r, throughput=r),
                       off=latency_summary([]), on=latency_summary([]), acceptance=acceptance(per_pos))


def compare_report(levels: list[LevelResult], suspect: int = 0, url: str = "http://on") -> CompareReport:
    info = ServerInfo(backend="vllm", base_url=url)
    return CompareReport(settings=CompareSettings(), off_server=ServerInfo(backend="vllm", base_url="http://off"),
                         on_server=info, levels=levels, counts={"identical": 3, "suspect": suspect, "near-tie": 0})


@dataclass
class FakeProcess:
    alive_: bool = True
    log_path: str = "/logs/x.log"
    tail: str = ""

    def log_tail(self) -> str:
        return self.tail

    @property
    def proc(self):
        return type("P", (), {"poll": staticmethod(lambda: None if self.alive_ else 9)})()

    def alive(self) -> bool:
        return self.alive_


@dataclass
class FakeServer:
    base_url: str
    process: FakeProcess | None = field(default_factory=FakeProcess)


def settings(levels=(1, 4)) -> TuneSettings:
    return TuneSettings(backend="vllm", base_spec={"method": "ngram", "k": 4}, ks=[0, 2, 4], concurrency=list(levels),
                        repeat=5, warmup=0, request=RequestSettings())


def no_progress(description, total):
    return lambda rec: None


def sweep(monkeypatch, candidates, results, off=None, opened=None):
    """Run run_sweep with run_compare answering from ``results`` (label -> CompareReport, or an
    exception to raise, or a callable run on the off server first)."""
    off = off or FakeServer("http://off")
    report = TuneReport(settings=settings())
    report.off_server = ServerInfo(backend="vllm", base_url=off.base_url)
    servers = {}

    @contextlib.contextmanager
    def open_candidate(cand):
        if isinstance(results.get(cand.label), ServerStartError):
            raise results[cand.label]
        servers[cand.label] = FakeServer(f"http://{cand.label}")
        (opened if opened is not None else []).append(cand.label)
        yield servers[cand.label]

    def fake_compare(o, on, prompts, s, progress):
        label = on.base_url.removeprefix("http://")
        result = results[label]
        if callable(result):
            return result(o, on)
        return result

    monkeypatch.setattr(tuning, "run_compare", fake_compare)
    tuning.run_sweep(report, off, candidates, open_candidate, [], CompareSettings(), no_progress, 10)
    return report


def test_candidates_vary_k_and_the_window_and_drop_the_base_schedule():
    base = BASE.model_copy(update={"k_per_batch_size": [(1, 2, 4), (3, 8, 2)]})
    cands = tuning.candidates_for(base, [0, 2, 4], [2, 3])
    assert [(c.label, c.k) for c in cands] == [("off", 0), ("k=2 ngram_max=2", 2), ("k=4 ngram_max=2", 4),
                                               ("k=2 ngram_max=3", 2), ("k=4 ngram_max=3", 4)]
    assert all(c.spec.k_per_batch_size is None for c in cands if c.spec)
    assert [(c.spec.ngram_min, c.spec.ngram_max) for c in cands if c.spec] == [(2, 2), (2, 2), (2, 3), (2, 3)]
    assert {c.variant for c in cands if c.k} == {"ngram_max=2", "ngram_max=3"}
    plain = tuning.candidates_for(BASE, [2, 0, 2])
    assert [(c.label, c.variant, c.spec.k if c.spec else None) for c in plain] == [("off", "", None), ("k=2", "", 2)]


def test_a_candidate_that_fails_is_recorded_and_the_sweep_goes_on(monkeypatch):
    cands = tuning.candidates_for(BASE, [0, 2, 4])
    results = {"k=2": ServerStartError("the vllm server exited with code 1 during start-up"),
               "k=4": compare_report([level(1, 1.5, [0.6, 0.4, 0.2, 0.1])], suspect=2, url="http://k=4")}
    report = sweep(monkeypatch, cands, results)
    by = {c.label: c for c in report.candidates}
    assert by["off"].status == "baseline" and by["off"].url == "http://off"
    assert by["k=2"].status == "failed" and "code 1 during start-up" in by["k=2"].error
    assert by["k=4"].status == "measured" and by["k=4"].suspect == 2 and by["k=4"].url == "http://k=4"
    assert not report.partial


def test_a_dying_candidate_is_failed_with_its_exit_code(monkeypatch):
    cands = tuning.candidates_for(BASE, [2, 4])

    def dies(off, on):
        on.process.alive_ = False
        return compare_report([level(1, 1.5, [0.5])])

    report = sweep(monkeypatch, cands, {"k=2": dies, "k=4": compare_report([level(1, 1.2, [0.5] * 4)])})
    by = {c.label: c for c in report.candidates}
    assert by["k=2"].status == "failed" and "exited with code 9" in by["k=2"].error and "/logs/x.log" in by["k=2"].error
    assert by["k=2"].compare is None
    assert by["k=4"].status == "measured"


def test_a_dying_baseline_stops_the_sweep_and_keeps_what_was_measured(monkeypatch):
    cands = tuning.candidates_for(BASE, [0, 2, 3, 4])
    off = FakeServer("http://off")

    def kill_off(o, on):
        off.process.alive_ = False
        return compare_report([level(1, 1.3, [0.5, 0.3, 0.1])])

    opened: list[str] = []
    report = sweep(monkeypatch, cands, {"k=2": compare_report([level(1, 1.2, [0.5, 0.3])]), "k=3": kill_off},
                   off=off, opened=opened)
    assert report.partial and "spec-off server exited with code 9" in report.partial_reason
    assert [(c.label, c.status) for c in report.candidates] == [
        ("off", "baseline"), ("k=2", "measured"), ("k=3", "measured"), ("k=4", "not run")]
    assert opened == ["k=2", "k=3"]  # k=4 never started


def test_a_given_server_never_counts_as_dead():
    assert not tuning.died(FakeServer("http://x", process=None))
    assert tuning.died(FakeServer("http://x", process=FakeProcess(alive_=False)))
    assert not tuning.died(FakeServer("http://x"))


def test_verification_spec_carries_the_schedule_of_the_chosen_variant():
    report = TuneReport(settings=settings())
    report.candidates = [tuning_candidate("k=4 ngram_max=3", "ngram_max=3", 4, {"method": "ngram", "k": 4,
                                                                                 "ngram_min": 2, "ngram_max": 3})]
    report.recommendation = Recommendation(form="schedule", variant="ngram_max=3", k=4,
                                           schedule=[(1, 3, 4), (4, 4, 2)])
    spec = tuning.verification_spec(report, BASE)
    assert (spec.k, spec.ngram_max, spec.k_per_batch_size) == (4, 3, [(1, 3, 4), (4, 4, 2)])
    report.recommendation = Recommendation(form="fixed", variant="ngram_max=3", k=4, schedule=[(1, 4, 4)])
    assert tuning.verification_spec(report, BASE).k_per_batch_size is None
    report.recommendation = Recommendation(form="off")
    assert tuning.verification_spec(report, BASE) is None


def test_the_verification_server_tune_starts_takes_the_schedule_on_its_command_line():
    """The launch tune builds for its verification server (launch_options_for with verification_spec):
    vLLM's command line carries num_speculative_tokens_per_batch_size (the live test verifies a
    session server started from the same launch options)."""
    import json
    import sys

    from specadapt.adapters.vllm import VLLMBackend
    from specadapt.orchestration.servers import ServerOptions, launch_options_for

    report = TuneReport(settings=settings())
    report.candidates = [tuning_candidate("k=4", "", 4, {"method": "ngram", "k": 4, "ngram_min": 2,
                                                          "ngram_max": 4})]
    report.recommendation = Recommendation(form="schedule", k=4, schedule=[(1, 1, 4), (2, 2, 2)])
    backend = VLLMBackend()
    launch = launch_options_for(backend, ServerOptions(python=sys.executable), "/m",
                                tuning.verification_spec(report, BASE), None)
    (arg,) = [a for a in backend.launch_plan(launch).spec_args if a.startswith("--speculative-config=")]
    config = json.loads(arg.split("=", 1)[1])
    assert config["num_speculative_tokens"] == 4
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 4], [2, 2, 2]]


def tuning_candidate(label, variant, k, spec):
    return Candidate(label=label, variant=variant, k=k, spec=spec)


@pytest.mark.parametrize("ver, form, code", [
    (Verification(status="passed"), "schedule", 0),
    (Verification(status="failed", reasons=["slower"]), "schedule", 1),
    (Verification(status="failed", reasons=["slower"], honoured="not honoured"), "schedule", 0),
    (Verification(status="failed", suspect=1, honoured="not honoured"), "schedule", 1),
    (Verification(status="passed", suspect=1), "fixed", 1),
    (Verification(status="not run"), "off", 0),
    (Verification(status="not run"), "none", 1),
])
def test_exit_code(ver, form, code):
    report = TuneReport(settings=settings(), verification=ver, recommendation=Recommendation(form=form))
    assert tuning.exit_code(report) == code


def test_settle_recommendation_falls_back_to_the_fixed_k_where_the_schedule_is_not_honoured():
    report = TuneReport(settings=settings(), recommendation=Recommendation(form="schedule", k=4, fixed_fallback_k=2,
                                                                           schedule=[(1, 3, 4), (4, 4, 2)]),
                        verification=Verification(status="failed", honoured="not honoured", reasons=["x"]))
    tuning.settle_recommendation(report)
    assert not report.recommendation.verified
    assert "did not honour" in report.recommendation.summary and "fixed k=2" in report.recommendation.summary
    ok = TuneReport(settings=settings(), recommendation=Recommendation(form="schedule", k=4, fixed_fallback_k=2),
                    verification=Verification(status="passed", honoured="honoured"))
    tuning.settle_recommendation(ok)
    assert ok.recommendation.verified and "Verified" in ok.recommendation.summary
    bad = TuneReport(settings=settings(), recommendation=Recommendation(form="fixed", k=4),
                     verification=Verification(status="failed", reasons=["concurrency 4: slower"]))
    tuning.settle_recommendation(bad)
    assert not bad.recommendation.verified and "FAILED: concurrency 4: slower" in bad.recommendation.summary


def test_parse_ks_and_on():
    assert parse_ks("0,2,4") == [0, 2, 4]
    assert parse_ks("4, 0-2") == [0, 1, 2, 4]
    for bad in ("", "a", "-1,2", "0", "0,0"):
        with pytest.raises(UsageError):
            parse_ks(bad)
    assert parse_on("4=http://h:1") == (4, "http://h:1")
    assert parse_on("http://h:1") == (None, "http://h:1")


# --- pinned for mutation testing (orchestration/tune.py is in [tool.mutmut]); every expected value below is
# worked out by hand from the docstrings of orchestration/tune.py and analysis/tune_model.py -------------------

def lvl(c: int, tpot: float, per_pos: list[float], e2e: float | None = None, drafts: float = 100.0) -> LevelResult:
    """A level whose e2e ratio may differ from its TPOT ratio (to tell which objective was read)."""
    t = ratio(tpot)
    return LevelResult(concurrency=c, pairs=5, speed=SpeedRatios(tpot=t, e2e=ratio(e2e) if e2e else t, throughput=t),
                       off=latency_summary([]), on=latency_summary([]), acceptance=acceptance(per_pos, drafts=drafts))


def measured(label: str, variant: str, k: int, levels: list[LevelResult], suspect: int = 0):
    return Candidate(label=label, variant=variant, k=k, compare=compare_report(levels, suspect=suspect),
                     suspect=suspect)


def failed(label: str, variant: str, k: int, error: str, status: str = "failed"):
    return Candidate(label=label, variant=variant, k=k, status=status, error=error)


def baseline():
    return Candidate(label="off", variant="", k=0, status="baseline")


def tune_report(candidates, levels=(1, 4), **kw) -> TuneReport:
    s = settings(levels).model_copy(update=kw)
    return TuneReport(settings=s, candidates=list(candidates))


class Recorder:
    """ProgressBars that record what they were asked for and give a known tick."""

    def __init__(self):
        self.bars: list[tuple[str, int]] = []
        self.tick = lambda rec: None

    def __call__(self, description, total):
        self.bars.append((description, total))
        return self.tick


START_FAIL = "the vllm server exited with code 1 during start-up"
SUSPECT_1 = "1 prompt(s) with a suspect divergence: output changed beyond a near-tie"


def test_candidates_drop_every_schedule_form_and_the_off_limit_and_keep_k_1():
    base = BASE.model_copy(update={"max_concurrency": 8, "draft_len_schedule": {1: 4, 8: 2}})
    cands = tuning.candidates_for(base, [1, 3])
    assert [(c.label, c.k) for c in cands] == [("k=1", 1), ("k=3", 3)]  # no 0 in ks: no off candidate
    assert [(c.spec.max_concurrency, c.spec.draft_len_schedule) for c in cands] == [(None, None), (None, None)]


def test_a_window_below_the_base_ngram_min_lowers_it_and_an_unset_min_is_1():
    high_min = tuning.candidates_for(BASE.model_copy(update={"ngram_min": 3}), [2], [2])
    assert [(c.spec.ngram_min, c.spec.ngram_max) for c in high_min] == [(2, 2)]
    no_min = tuning.candidates_for(BASE.model_copy(update={"ngram_min": None}), [2], [2])
    assert [(c.spec.ngram_min, c.spec.ngram_max) for c in no_min] == [(1, 2)]


def test_died_and_the_exit_reason_of_servers_without_a_process_or_its_handle():
    assert not tuning.died(type("Given", (), {"base_url": "http://x"})())  # no process attribute at all

    class NoHandle(FakeProcess):
        proc = None

    assert exit_reason(FakeServer("http://x", process=None), "k=2") == \
        "the k=2 server exited with code None during the run"
    assert exit_reason(FakeServer("http://x", process=NoHandle()), "k=2") == \
        "the k=2 server exited with code None during the run (log: /logs/x.log)"


def test_the_exit_reason_quotes_the_line_of_the_log_that_says_why():
    """A vLLM CPU engine that dies on a synthetic-acceptance config (log tail constructed after
    vllm/utils/cpu_triton_utils.py's assertion)."""
    dead = FakeProcess(alive_=False, tail="INFO 12-03 10:11:12 [core.py:90] started\nTraceback (most recent call last):\n"
                       "  File \"x.py\", line 1, in f\nAssertionError: Synthetic acceptance not supported with CPU "
                       "sampling\n")
    assert exit_reason(FakeServer("http://x", process=dead), "spec-on", "2 of 18 requests had finished") == (
        "the spec-on server exited with code 9 during the run, saying: AssertionError: Synthetic acceptance not "
        "supported with CPU sampling; 2 of 18 requests had finished (log: /logs/x.log)")


def test_the_sweep_passes_each_candidate_its_own_copy_of_the_settings_and_a_progress_bar(monkeypatch):
    off = FakeServer("http://off")
    prompts = ["p"]
    given = CompareSettings(concurrency=[1, 4])
    seen = []

    def fake_compare(o, on, p, s, tick):
        seen.append((o, on.base_url, p, s.concurrency[:], tick))
        s.concurrency.append(99)  # what the A/B does to its settings stays with it
        return compare_report([level(1, 1.2, [0.5, 0.3])], url=on.base_url)

    @contextlib.contextmanager
    def open_candidate(cand):
        yield FakeServer(f"http://{cand.label}")

    monkeypatch.setattr(tuning, "run_compare", fake_compare)
    bars = Recorder()
    report = TuneReport(settings=settings())
    tuning.run_sweep(report, off, tuning.candidates_for(BASE, [0, 2, 4]), open_candidate, prompts, given, bars, 7)
    assert bars.bars == [("k=2 vs off", 14), ("k=4 vs off", 14)]
    assert [(o is off, url, p is prompts, conc, tick is bars.tick) for o, url, p, conc, tick in seen] == [
        (True, "http://k=2", True, [1, 4], True), (True, "http://k=4", True, [1, 4], True)]
    assert given.concurrency == [1, 4]
    by = {c.label: c for c in report.candidates}
    assert (by["off"].k, by["off"].url) == (0, None)  # no off server recorded: no url
    assert by["k=2"].spec == {"method": "ngram", "k": 2, "ngram_min": 2, "ngram_max": 4}


def test_a_candidate_that_cannot_start_keeps_its_given_url_and_one_without_a_spec_has_none(monkeypatch):
    cands = [tuning.SweepCandidate(label="k=2", variant="", k=2, url="http://given:8000"),
             tuning.SweepCandidate(label="k=4", variant="", k=4)]
    compare = compare_report([level(1, 1.2, [0.5] * 4)], url="http://k=4")
    compare.counts = {"identical": 5}  # no suspect count at all
    report = sweep(monkeypatch, cands, {"k=2": ServerStartError(START_FAIL), "k=4": compare})
    by = {c.label: c for c in report.candidates}
    assert (by["k=2"].status, by["k=2"].url, by["k=2"].error) == ("failed", "http://given:8000", START_FAIL)
    assert (by["k=4"].spec, by["k=4"].compare is compare, by["k=4"].suspect) == (None, True, 0)


def test_a_candidate_failing_while_the_baseline_dies_stops_the_sweep_after_it(monkeypatch):
    cands = tuning.candidates_for(BASE, [0, 2, 3, 4])
    off = FakeServer("http://off")

    def off_dies(o, on):
        off.process.alive_ = False
        raise ServerError("the connection to http://off was refused")

    report = sweep(monkeypatch, cands, {"k=2": off_dies}, off=off)
    assert [(c.label, c.status, c.error) for c in report.candidates] == [
        ("off", "baseline", None), ("k=2", "failed", "the connection to http://off was refused"),
        ("k=3", "not run", "the sweep stopped before it"), ("k=4", "not run", "the sweep stopped before it")]
    assert report.partial_reason == "the spec-off server exited with code 9 during the run (log: /logs/x.log)"


def test_a_dying_candidate_names_itself():
    cands = tuning.candidates_for(BASE, [2])
    report = TuneReport(settings=settings())

    @contextlib.contextmanager
    def open_candidate(cand):
        yield FakeServer("http://k=2", process=FakeProcess(alive_=False))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tuning, "run_compare", lambda *a: compare_report([level(1, 1.2, [0.5, 0.3])]))
        tuning.run_sweep(report, FakeServer("http://off"), cands, open_candidate, [], CompareSettings(),
                         no_progress, 1)
    assert report.candidates[0].error == "the k=2 server exited with code 9 during the run (log: /logs/x.log)"


def two_variants(**kw) -> TuneReport:
    """ngram_max=2: k=2 and k=4 measured; ngram_max=3: k=2 measured, k=3 suspect, k=4 failed to start.
    Per level (1, 4) the best eligible point: ngram_max=2 k=4 1.30 | k=2 1.05 (score (ln 1.30 +
    ln 1.05) / 2 = 0.156); ngram_max=3 k=2 1.50 | off (k=2 at 0.90 [0.85, 0.95]) (score ln 1.5 / 2 =
    0.203): ngram_max=3 gives the schedule although listed second."""
    return tune_report([
        baseline(),
        measured("k=2 ngram_max=2", "ngram_max=2", 2, [lvl(1, 1.20, [0.5, 0.3]), lvl(4, 1.05, [0.5, 0.3])]),
        measured("k=4 ngram_max=2", "ngram_max=2", 4, [lvl(1, 1.30, [0.5, 0.3, 0.2, 0.1]),
                                                         lvl(4, 0.90, [0.5, 0.3, 0.2, 0.1])]),
        measured("k=2 ngram_max=3", "ngram_max=3", 2, [lvl(1, 1.50, [0.6, 0.4]), lvl(4, 0.90, [0.6, 0.4])]),
        measured("k=3 ngram_max=3", "ngram_max=3", 3, [lvl(1, 1.90, [0.6, 0.4, 0.3]), lvl(4, 0.80, [0.6, 0.4, 0.3])],
                 suspect=1),
        failed("k=4 ngram_max=3", "ngram_max=3", 4, START_FAIL),
    ], max_batch_size=8, ks=[0, 2, 3, 4], ngram_max=[2, 3], **kw)


def test_analyse_fits_every_variant_and_takes_the_schedule_of_the_best_scoring_one():
    report = two_variants()
    tuning.analyse(report)
    assert [(f.concurrency, f.variant, f.form, [p.k for p in f.points]) for f in report.fits] == [
        (1, "ngram_max=2", "1 + c k", [2, 4]), (4, "ngram_max=2", "1 + c k", [2, 4]),
        (1, "ngram_max=3", "1 + c k", [2, 3]), (4, "ngram_max=3", "1 + c k", [2, 3])]
    excluded = {3: SUSPECT_1, 4: f"not measured: {START_FAIL}"}
    # level 1 of ngram_max=3: y_2 = 2.0 / 1.5, y_3 = 2.3 / 1.9, c = (2 (y_2 - 1) + 3 (y_3 - 1)) / 13 = 0.0999;
    # predicted k=1 1.6 / 1.0999 = 1.45, k=2 2.0 / 1.1997 = 1.67, k=3 2.3 / 1.2996 = 1.77: the model's best
    # is k=3, which was measured (and excluded): no note asking to add it to --k.
    # level 4: y_2 = 2.0 / 0.9, y_3 = 2.3 / 0.8, c = 0.621: predicted k=1 0.99, below off's 1.0.
    assert [(ch.concurrency, ch.k, ch.label, ch.excluded, ch.model_best_k, ch.model_note)
            for ch in report.choices] == [(1, 2, "k=2 ngram_max=3", excluded, 3, None),
                                         (4, 0, "off", excluded, 0, None)]
    rec = report.recommendation
    assert (rec.form, rec.variant, rec.k, rec.schedule, rec.fixed_fallback_k) == (
        "schedule", "ngram_max=3", 2, [(1, 3, 2), (4, 8, 0)], 2)  # fallback: ln 1.5 + ln 0.9 > 0
    assert "Every level's choice is clear." in rec.summary
    assert report.schedule_ranges_note == (
        "Batch sizes 2-3 were not measured: they take k=2 of batch size 1; batch sizes 5-8 were not measured: "
        "they take k=0 of batch size 4; the engines carry the last range's k=0 to batch sizes above 8.")
    assert report.notes == ["the schedule uses the variant ngram_max=3, whose choices scored best over the levels"]


def test_analyse_with_a_given_schedule_recommends_it_and_still_makes_the_choices():
    report = two_variants()
    tuning.analyse(report, [[1, 3, 1], [4, 8, 2]])
    assert [(ch.concurrency, ch.k) for ch in report.choices] == [(1, 2), (4, 0)]
    rec = report.recommendation
    assert (rec.form, rec.variant, rec.k, rec.schedule, rec.fixed_fallback_k) == (
        "schedule", "ngram_max=3", 2, [(1, 3, 1), (4, 8, 2)], 2)
    assert rec.summary == ("The schedule given with --schedule (1-3: k=1, 4-8: k=2), verified against the best "
                           "fixed k at each level; the sweep alone would choose 1-3: k=2, 4-8: k=0.")
    assert report.schedule_ranges_note == "the schedule was given with --schedule"


def test_analyse_ties_between_variants_go_to_the_first():
    report = tune_report([measured("k=2 ngram_max=2", "ngram_max=2", 2, [lvl(1, 1.5, [0.6, 0.4])]),
                          measured("k=2 ngram_max=3", "ngram_max=3", 2, [lvl(1, 1.5, [0.6, 0.4])])], levels=(1,))
    tuning.analyse(report)
    assert report.recommendation.variant == "ngram_max=2"


def test_analyse_names_the_base_variant_when_it_scores_best():
    report = tune_report([measured("k=2", "", 2, [lvl(1, 1.5, [0.6, 0.4])]),
                          measured("k=2 ngram_max=3", "ngram_max=3", 2, [lvl(1, 1.2, [0.6, 0.4])])], levels=(1,))
    tuning.analyse(report)
    assert report.recommendation.variant == ""
    assert report.notes == ["the schedule uses the variant of the base config, whose choices scored best over "
                            "the levels"]


def test_analyse_one_window_excludes_a_failed_k_1_and_a_suspect_k_from_the_choice_and_the_fallback():
    report = tune_report([baseline(), failed("k=1 ngram_max=3", "ngram_max=3", 1, START_FAIL),
                          measured("k=2 ngram_max=3", "ngram_max=3", 2, [lvl(1, 1.9, [0.6, 0.4])], suspect=1),
                          measured("k=3 ngram_max=3", "ngram_max=3", 3, [lvl(1, 1.4, [0.6, 0.4, 0.3])])],
                         levels=(1,))
    tuning.analyse(report)
    assert [(ch.k, ch.excluded) for ch in report.choices] == [(3, {1: f"not measured: {START_FAIL}", 2: SUSPECT_1})]
    assert (report.recommendation.form, report.recommendation.fixed_fallback_k) == ("fixed", 3)
    assert report.notes == []  # one variant (the off candidate is none)


def test_analyse_skips_a_variant_with_nothing_measured_and_goes_on_to_the_next():
    report = tune_report([failed("k=2 ngram_max=2", "ngram_max=2", 2, START_FAIL),
                          measured("k=1 ngram_max=3", "ngram_max=3", 1, [lvl(1, 1.5, [0.6])])], levels=(1,))
    tuning.analyse(report)
    assert [(f.concurrency, f.variant) for f in report.fits] == [(1, "ngram_max=3")]
    rec = report.recommendation
    assert (rec.form, rec.variant, rec.k) == ("fixed", "ngram_max=3", 1)
    assert len(report.notes) == 1


def test_analyse_one_variant_reads_the_objective_and_leaves_out_a_level_a_candidate_lacks():
    """k=1 measured at level 1 only (e2e 1.40 there, TPOT 1.10); k=2 never ran; objective e2e."""
    report = tune_report([baseline(), measured("k=1", "", 1, [lvl(1, 1.10, [0.5], e2e=1.40)]),
                          failed("k=2", "", 2, "the sweep stopped before it", status="not run")], objective="e2e")
    tuning.analyse(report)
    assert [(f.concurrency, f.form, [p.k for p in f.points]) for f in report.fits] == [
        (1, "1 + c k", [1]), (4, "none", [])]
    not_run = {2: "not measured: the sweep stopped before it"}
    assert [(ch.concurrency, ch.k, ch.ratio.point if ch.ratio else None, ch.excluded) for ch in report.choices] == [
        (1, 1, 1.40, not_run), (4, 0, None, {**not_run, 1: "not measured at this level"})]
    rec = report.recommendation
    # k=1 has no point at level 4: it cannot be the fixed fallback
    assert (rec.form, rec.variant, rec.k, rec.schedule, rec.fixed_fallback_k) == (
        "schedule", "", 1, [(1, 3, 1), (4, 4, 0)], 0)
    assert report.notes == []


def test_analyse_with_nothing_measured():
    report = tune_report([baseline(), failed("k=2", "", 2, START_FAIL)])
    tuning.analyse(report)
    assert (report.choices, report.fits) == ([], [])
    assert report.recommendation.form == "none"
    assert report.recommendation.summary == "nothing was measured: no candidate ran to the end"


def test_verification_spec_of_a_variant_ignores_other_variants_and_the_off_candidate():
    base = BASE.model_copy(update={"max_concurrency": 8})
    report = tune_report([baseline()] + [tuning_candidate(f"k=2 ngram_max={w}", f"ngram_max={w}", 2,
                                                          {"method": "ngram", "k": 2, "ngram_min": 2, "ngram_max": w})
                                         for w in (2, 3)])
    report.recommendation = Recommendation(form="fixed", variant="ngram_max=3", k=2, schedule=[(1, 4, 2)])
    assert tuning.verification_spec(report, base).ngram_max == 3
    plain = tune_report([baseline(), tuning_candidate("k=2", "", 2, {"method": "ngram", "k": 2, "ngram_min": 2,
                                                                     "ngram_max": 4})])
    plain.recommendation = Recommendation(form="fixed", variant="", k=2, schedule=[(1, 4, 2)])
    assert tuning.verification_spec(plain, base).max_concurrency is None  # the candidate's spec, not the base


def test_verification_spec_falls_back_to_the_base_with_the_recommended_k():
    base = BASE.model_copy(update={"k_per_batch_size": [(1, 2, 4), (3, 8, 2)]})
    report = tune_report([baseline()])
    report.recommendation = Recommendation(form="fixed", variant="", k=2, schedule=[(1, 4, 2)])
    spec = tuning.verification_spec(report, base)
    assert (spec.k, spec.ngram_max, spec.k_per_batch_size) == (2, 4, None)
    report.recommendation = Recommendation(form="none")
    assert tuning.verification_spec(report, base) is None


def schedule_report() -> TuneReport:
    """Sweep: k=2 and k=4 (TPOT at levels 1 | 4: 1.3 | 1.2 and 1.5 | 1.1); chosen k=4 at 1, k=2 at 4."""
    report = tune_report([baseline(),
                          measured("k=2", "", 2, [lvl(1, 1.3, [0.8, 0.6]), lvl(4, 1.2, [0.8, 0.6])]),
                          measured("k=4", "", 4, [lvl(1, 1.5, [0.8, 0.6, 0.4, 0.2]),
                                                  lvl(4, 1.1, [0.8, 0.6, 0.4, 0.2])])])
    report.choices = [LevelChoice(concurrency=1, k=4, label="k=4", ratio=ratio(1.5), certainty="clear", reason=""),
                      LevelChoice(concurrency=4, k=2, label="k=2", ratio=ratio(1.2), certainty="clear", reason="")]
    report.recommendation = Recommendation(form="schedule", variant="", k=4, schedule=[(1, 3, 4), (4, 4, 2)])
    return report


def test_judge_verification_per_level_against_the_best_fixed_k_with_the_honour_check():
    report = schedule_report()
    # level 4: scheduled k=2 below the engine's 4; accepted above position 2: 0 in the verification run,
    # (0.4 + 0.2) * 100 = 60 >= 20 of 400 generated in the fixed k=4 run: ratio 0 -> honoured
    slow = compare_report([lvl(1, 1.52, [0.8, 0.6, 0.4, 0.2]), lvl(4, 1.0, [0.8, 0.6, 0.0, 0.0])],
                          url="http://verify")
    slow.counts = {"identical": 3}
    ver = tuning.judge_verification(report, slow)
    assert [(lv.concurrency, lv.scheduled_k, lv.ratio.point, lv.best_fixed_k, lv.best_fixed_ratio.point, lv.as_good,
             lv.honour.verdict) for lv in ver.levels] == [(1, 4, 1.52, 4, 1.5, True, "not applicable"),
                                                          (4, 2, 1.0, 2, 1.2, False, "honoured")]
    assert (ver.status, ver.honoured, ver.suspect, ver.near_tie, ver.url, ver.compare is slow) == (
        "failed", "honoured", 0, 0, "http://verify", True)
    assert ver.reasons == ["At concurrency 4 the emitted config's 1.00x [0.95, 1.05] falls short of k=2's "
                           "1.20x [1.15, 1.25]: its interval does not reach the other's."]
    fast = compare_report([lvl(1, 1.52, [0.8, 0.6, 0.4, 0.2]), lvl(4, 1.2, [0.8, 0.6, 0.0, 0.0])])
    ok = tuning.judge_verification(report, fast)
    assert (ok.status, ok.reasons, ok.honoured) == ("passed", [], "honoured")


def test_judge_verification_of_a_schedule_whose_engine_k_was_not_swept_cannot_tell_the_honouring():
    report = schedule_report()
    report.recommendation = Recommendation(form="schedule", variant="", k=5, schedule=[(1, 3, 5), (4, 4, 2)])
    ver = tuning.judge_verification(report, compare_report([lvl(1, 1.6, [0.8, 0.6, 0.4, 0.2, 0.1]),
                                                            lvl(4, 1.2, [0.8, 0.6, 0.0, 0.0, 0.0])]))
    assert [lv.honour.verdict for lv in ver.levels] == ["not applicable", "undetermined"]
    assert ver.honoured == "undetermined"


def test_judge_verification_of_a_fixed_k_reads_the_objective_counts_suspects_and_skips_a_missing_level():
    report = schedule_report()
    report.settings.objective = "e2e"
    report.recommendation = Recommendation(form="fixed", variant="", k=2, schedule=[(1, 4, 2)])
    compare = compare_report([lvl(4, 1.0, [0.8, 0.6], e2e=1.2)], suspect=2)  # TPOT would fall short of 1.15
    compare.counts["near-tie"] = 3
    ver = tuning.judge_verification(report, compare)
    assert [(lv.concurrency, lv.scheduled_k, lv.ratio.point, lv.best_fixed_k, lv.as_good, lv.honour)
            for lv in ver.levels] == [(4, 2, 1.2, 2, True, None)]
    assert (ver.status, ver.honoured, ver.suspect, ver.near_tie) == ("failed", "not applicable", 2, 3)
    assert ver.reasons == ["2 prompts diverged from the spec-off output beyond a near-tie (suspect)."]


def verify_run(monkeypatch, on_server, compare=None, start_error=None):
    report = schedule_report()
    off, bars, seen, opened = FakeServer("http://off"), Recorder(), [], []
    prompts, given = ["p"], CompareSettings(concurrency=[1, 4])

    @contextlib.contextmanager
    def open_verify(spec):
        opened.append(spec)
        if start_error:
            raise start_error
        yield on_server

    def fake_compare(o, on, p, s, tick):
        seen.append((o is off, on is on_server, p is prompts, s == given and s is not given, tick is bars.tick))
        return compare

    monkeypatch.setattr(tuning, "run_compare", fake_compare)
    spec = BASE.model_copy(update={"k_per_batch_size": [(1, 3, 4), (4, 4, 2)]})
    tuning.run_verification(report, off, open_verify, spec, prompts, given, bars, 6)
    assert opened == [spec]
    return report, bars, seen


def test_run_verification_judges_the_emitted_config_beside_off(monkeypatch):
    compare = compare_report([lvl(1, 1.52, [0.8, 0.6, 0.4, 0.2]), lvl(4, 1.2, [0.8, 0.6, 0.0, 0.0])],
                             url="http://verify")
    report, bars, seen = verify_run(monkeypatch, FakeServer("http://verify"), compare)
    assert bars.bars == [("verifying", 12)]
    assert seen == [(True, True, True, True, True)]
    assert (report.verification.status, report.verification.compare is compare, len(report.verification.levels)) == (
        "passed", True, 2)


def test_run_verification_fails_with_the_reason_when_its_server_dies_or_cannot_start(monkeypatch):
    dead = FakeServer("http://verify", process=FakeProcess(alive_=False))
    report, _, _ = verify_run(monkeypatch, dead, compare_report([lvl(1, 1.5, [0.8])]))
    reason = "the verification server exited with code 9 during the run (log: /logs/x.log)"
    ver = report.verification
    assert (ver.status, ver.reason, ver.reasons, ver.compare) == ("failed", reason, [reason], None)
    report, _, seen = verify_run(monkeypatch, None, start_error=ServerStartError(START_FAIL))
    ver = report.verification
    assert (ver.status, ver.reason, ver.reasons, seen) == ("failed", START_FAIL, [START_FAIL], [])


def settled(form: str, ver: Verification, fallback: int | None = None) -> Recommendation:
    report = TuneReport(settings=settings(), verification=ver,
                        recommendation=Recommendation(form=form, k=4, fixed_fallback_k=fallback, summary="S."))
    tuning.settle_recommendation(report)
    return report.recommendation


def test_settle_recommendation_not_run():
    for form in ("schedule", "fixed"):
        rec = settled(form, Verification(status="not run", reason="--no-verify"))
        assert (rec.summary, rec.verified) == ("S. Not verified: --no-verify.", False)
    for form in ("off", "none"):
        assert settled(form, Verification(status="not run", reason="nothing to verify")).summary == "S."


def test_settle_recommendation_not_honoured_without_a_fallback_k_says_speculation_off():
    for fallback in (0, None):
        rec = settled("schedule", Verification(status="passed", honoured="not honoured"), fallback)
        assert rec.verified is False
        assert rec.summary == (
            "S. This server did not honour the schedule (its counters show drafts above the scheduled k at larger "
            "batch sizes): on this build deploy speculation off; keep the schedule for a build that applies it.")


def test_settle_recommendation_passed_and_failed():
    verified = ("S. Verified: the emitted configuration ran as fast as the best fixed k at every level (within the "
                "intervals), with no suspect divergence.")
    rec = settled("schedule", Verification(status="passed", honoured="honoured"))
    assert (rec.summary, rec.verified) == (verified, True)
    rec = settled("schedule", Verification(status="passed", honoured="undetermined"))
    assert rec.summary == verified + " Whether the server applied the schedule could not be told from its counters."
    rec = settled("fixed", Verification(status="failed", reasons=["a", "b"]))
    assert (rec.summary, rec.verified) == ("S. Verification FAILED: a; b.", False)
