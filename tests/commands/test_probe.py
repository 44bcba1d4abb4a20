"""`specadapt probe --show N`: the answers the probe report draws pass by pass."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specadapt.analysis.probe_report import build_probe_report
from specadapt.cli import cli
from specadapt.records import CounterSnapshot, ProbeSettings, RequestSettings, ServerInfo
from tests.unit.report.test_passes_render import LESSON_PASSES, LESSON_TOKENS, POOR_PASSES, POOR_TOKENS, record


def probe_report(show: int = 1):
    """Two answers one request at a time, their own counts adding up to the counters; ``show`` of them drawn."""
    recs = [record("capital", "factual", LESSON_TOKENS, LESSON_PASSES), record("poor", "open", POOR_TOKENS, POOR_PASSES)]
    before = CounterSnapshot(drafts=0, draft_tokens=0, accepted_tokens=0, generation_tokens=0, source="m")
    after = CounterSnapshot(drafts=sum(r.spec_steps for r in recs), draft_tokens=sum(r.spec_drafted for r in recs),
                            accepted_tokens=sum(r.spec_accepted for r in recs),
                            generation_tokens=sum(r.output_tokens for r in recs), source="m")
    settings = ProbeSettings(concurrency=1, repeat=1, warmup=0, prompts_source="built-in", request=RequestSettings(),
                             show=show)
    server = ServerInfo(backend="vllm", base_url="http://p:8000", model_id="pm", spec_enabled=True,
                        num_speculative_tokens=5)
    return build_probe_report(server, settings, recs, before, after, scale=None)


@pytest.mark.parametrize(("args", "shown"), [([], 1), (["--show", "2"], 2), (["--show", "0"], 0),
                                             (["--show", "9"], 2)])
def test_show_sets_how_many_answers_the_report_draws(monkeypatch, tmp_path, args, shown):
    from specadapt.commands import probe as probe_command

    monkeypatch.setattr(probe_command, "probe_servers", lambda *a, **kw: probe_report(kw["show"]))
    out = tmp_path / "probe.json"
    result = CliRunner().invoke(cli, ["probe", "--url", "http://p:8000", "--json", str(out), *args])
    assert result.exit_code == 0, result.output
    saved = json.loads(out.read_text())
    n = int(args[1]) if args else 1
    assert saved["settings"]["show"] == n
    drawn = [saved["speculation"]["requests"][i]["prompt_id"] for i in saved["speculation"]["shown"]]
    assert len(drawn) == shown and len(set(drawn)) == shown  # one per prompt, two prompts at most
    assert ("[La capital de Francia es| París]" in result.output) == ("capital" in drawn)


def test_a_negative_show_is_refused():
    result = CliRunner().invoke(cli, ["probe", "--url", "http://p:8000", "--show", "-1"])
    assert result.exit_code == 2 and "--show" in result.output
