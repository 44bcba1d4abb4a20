"""probes/tune.py's orchestration with stand-in servers and a stand-in A/B (run_compare is replaced,
so what each candidate 'measured' is exactly known): candidates, failures, a dying baseline, the
choice across variants, the verification spec and verdict, the exit code."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import pytest

from specadapt.commands.tune import parse_ks, parse_on
from specadapt.configs.spec import SpecConfig
from specadapt.errors import ServerStartError, UsageError
from specadapt.probes import tune as tuning
from specadapt.probes.latency import latency_summary
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
from specadapt.records.tune import Recommendation, TuneReport, TuneSettings, Verification

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


@contextlib.contextmanager
def no_progress(description, total):
    yield lambda rec: None


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


def tuning_candidate(label, variant, k, spec):
    from specadapt.records.tune import Candidate
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
