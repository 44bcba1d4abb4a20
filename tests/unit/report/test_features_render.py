"""The feature matrix's request bodies and answer parsing (orchestration/features.py) and its report
(report/features_render.py): JUnit outcomes per verdict, Markdown, HTML escaping, the console."""

from __future__ import annotations

import io
from html import unescape

from junitparser import JUnitXml
from rich.console import Console

from specadapt.adapters.base import TokenRequests
from specadapt.analysis.sampling_check import looks_outcome
from specadapt.orchestration.features import lossy_of, parse_answer, request_body
from specadapt.records import ServerInfo
from specadapt.records.features import Activity, CellResult, FeatureGate, FeatureReport, FeatureSettings
from specadapt.records.sampling_report import SamplingLook
from specadapt.records.server import LaunchRecord
from specadapt.report import features_render as R


def test_completion_and_chat_bodies():
    path, body = request_body("hi", "m", {"stop": ["x"]}, 8, TokenRequests())
    assert path == "/v1/completions"
    assert body == {"model": "m", "max_tokens": 8, "temperature": 0.0, "stream": False, "return_token_ids": True,
                    "stop": ["x"], "prompt": "hi"}
    path, body = request_body([{"role": "user", "content": "q"}], "m", {"logprobs": 5}, 4,
                              TokenRequests(output_ids=None))
    assert path == "/v1/chat/completions" and "return_token_ids" not in body
    assert body["logprobs"] is True and body["top_logprobs"] == 5 and body["messages"][0]["content"] == "q"
    path, body = request_body([1, 2, 3], "m", {}, 4, TokenRequests())
    assert path == "/v1/completions" and body["prompt"] == [1, 2, 3]


def test_parse_completion_answer():
    data = {"choices": [{"text": "ab", "finish_reason": "stop", "stop_reason": "x", "token_ids": [5, 6],
                         "logprobs": {"token_logprobs": [-0.5, -1.0],
                                      "top_logprobs": [{"a": -0.5, "z": -2.0}, {"q": -3.0, "b": -1.0}]}}],
            "usage": {"completion_tokens": 2, "prompt_tokens": 7}}
    a = parse_answer(data)
    assert (a.text, a.finish_reason, a.stop_reason, a.token_ids) == ("ab", "stop", "x", (5, 6))
    assert (a.completion_tokens, a.prompt_tokens, a.n_tokens) == (2, 7, 2)
    assert a.logprobs == (-0.5, -1.0)
    assert a.top_logprobs == ((("a", -0.5), ("z", -2.0)), (("b", -1.0), ("q", -3.0)))  # sorted best first


def test_parse_chat_answer():
    data = {"choices": [{"message": {"role": "assistant", "content": "yes"}, "finish_reason": "stop",
                         "logprobs": {"content": [{"token": "yes", "logprob": -0.1,
                                                   "top_logprobs": [{"token": "yes", "logprob": -0.1},
                                                                    {"token": "no", "logprob": -2.5}]}]}}]}
    a = parse_answer(data)
    assert a.text == "yes" and a.token_ids is None and a.n_tokens is None
    assert a.logprobs == (-0.1,) and a.top_logprobs == ((("yes", -0.1), ("no", -2.5)),)


def test_lossy_of_reads_the_launch_and_the_server_flags():
    info = ServerInfo(backend="trtllm", base_url="http://h:1")
    assert lossy_of(info) is None
    info.launch = LaunchRecord(backend="trtllm", argv=["x"],
                               spec_settings={"speculative_config": {"use_relaxed_acceptance_for_thinking": True}})
    assert "relaxed" in lossy_of(info)
    synthetic = '{"method": "ngram", "num_speculative_tokens": 4, "rejection_sample_method": "synthetic"}'
    vllm = ServerInfo(backend="vllm", base_url="http://h:1", launch=LaunchRecord(
        backend="vllm", argv=["vllm", "serve", "m", "--speculative-config", synthetic],
        spec_args=["--speculative-config", synthetic]))
    assert "synthetic" in lossy_of(vllm)


def report(*cells: CellResult, passed: bool = False) -> FeatureReport:
    settings = FeatureSettings(features=[c.name for c in cells], max_tokens=16, samples=2, sample_tokens=16,
                               alpha=0.01, top_logprobs=20, concurrency=4, seed=0, request_timeout_s=60,
                               near_tie_threshold=0.01, source="server")
    info = ServerInfo(backend="vllm", base_url="http://on", spec_enabled=True, model_id="m")
    return FeatureReport(settings=settings, on_server=info, baseline_server=info.model_copy(update={
        "spec_enabled": False}), cells=list(cells), gate=FeatureGate(passed=passed, reasons=["b: fail"]))


def cell(name: str, verdict: str, reason: str = "why <b>") -> CellResult:
    return CellResult(name=name, kind="deterministic", title="t", verdict=verdict, reason=reason,
                      activity=Activity(state="active"))


def test_junit_outcome_per_verdict():
    r = report(cell("a", "pass"), cell("b", "fail"), cell("c", "inactive"), cell("d", "error"),
               cell("e", "unsupported"), cell("f", "near-tie"), cell("g", "lossy"), cell("h", "not-exact"))
    suite = next(iter(JUnitXml.fromstring(R.to_junit(r))))
    outcome = {case.name: (type(case.result[0]).__name__ if case.result else "passed") for case in suite}
    assert outcome == {"a": "passed", "b": "Failure", "c": "Skipped", "d": "Failure", "e": "Skipped",
                       "f": "passed", "g": "Skipped", "h": "Skipped"}


def test_markdown_and_html():
    r = report(cell("a", "pass", "ok | fine"), cell("b", "fail", "x <script>"))
    md = R.to_markdown(r)
    assert "**Gate: FAIL** - b: fail" in md and "| `a` | deterministic | pass | active | ok \\| fine |" in md
    html = R.to_html(r)
    assert "x &lt;script&gt;" in html and "<script>" not in html and "<tr class='fail'>" in html
    assert "cells: 1 pass, 1 fail" in md


def test_console_lists_the_reasons_of_cells_that_did_not_pass():
    out = io.StringIO()
    R.render_console(report(cell("a", "pass", "fine"), cell("b", "inactive", "no drafts")),
                     Console(file=out, width=200))
    text = out.getvalue()
    assert "b: speculation inactive: no drafts" in text and "a: pass" not in text
    assert "gate: FAIL: b: fail" in text


def looked(settings_looks: int | None = 4) -> FeatureReport:
    """A distribution cell rejected at look 1 of 4 (alpha 0.01) beside a deterministic cell."""
    history = [SamplingLook(look=1, samples=6, tokens=192, alpha=0.01 / 6, status="inconsistent", smallest_p=1e-9)]
    looks = looks_outcome(0.01, 4, 24, history)
    dist = CellResult(name="top-k-20", kind="distribution", title="top_k 20", verdict="fail", reason="distribution: x",
                      activity=Activity(state="active"), looks=looks, notes=[f"until decided: {looks.text}"])
    r = report(dist, cell("a", "pass"))
    r.settings.looks = settings_looks
    return r


SPLIT = ("until decided: each distribution cell sends its samples in 4 looks and stops early only to reject; alpha "
         "0.01 split over the looks: 0.00167 at each of looks 1-3 and 0.005 at the last (at most alpha per cell in "
         "all); a pass is decided at the last look only")


def test_with_looks_every_form_states_the_split_and_where_each_distribution_cell_stopped():
    r = looked()
    assert R.header_lines(r)[-1] == SPLIT  # 0.01 / (2 * 3) = 0.001667, 0.01 / 2 = 0.005
    out = io.StringIO()
    R.render_console(r, Console(file=out, width=400))
    text, md, html = out.getvalue(), R.to_markdown(r), unescape(R.to_html(r))
    stop = "top-k-20: until decided: stopped at look 1 of 4"
    for form in (text, md, html):
        assert SPLIT in form and stop in form and "after 6 of the fixed design's 24 samples" in form
    assert "a: until decided" not in text  # the deterministic cell has no looks


def test_without_looks_no_form_mentions_them():
    r = report(cell("a", "pass"), cell("b", "fail"))
    out = io.StringIO()
    R.render_console(r, Console(file=out, width=400))
    for form in (out.getvalue(), R.to_markdown(r), R.to_html(r)):
        assert "until decided" not in form and "looks" not in form
