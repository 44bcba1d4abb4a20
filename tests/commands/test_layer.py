"""The command layer parses options and prints: no module under specadapt/commands builds a
report, plans or starts a server, or runs requests on an event loop of its own. Orchestration
does those, callable without click. The check reads the source (AST), and is shown to catch
each of them put back."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import specadapt.records
from specadapt.records.reports import ReportEnvelope

COMMANDS = Path(__file__).resolve().parents[2] / "specadapt" / "commands"

# What a Backend does to plan or start servers (adapters/base.py): orchestration.servers calls these.
BACKEND_CALLS = {"connect", "connect_launched", "launch_options", "launch_plan", "check_launch", "launched",
                 "launched_many", "resolve_model"}
# What a server plan is made of (orchestration.servers): plan_servers, ab_sides, replica_sides build them.
PLAN_TYPES = {"ServerPlan", "Side", "LaunchOptions", "TunePlan"}
# Event loops: requests are run by orchestration, on the client's loop runner.
LOOP_MODULES = {"asyncio", "uvloop"}


def report_types() -> set[str]:
    """Every saved report kind: the ReportEnvelope subclasses of specadapt.records."""
    for info in pkgutil.iter_modules(specadapt.records.__path__):
        importlib.import_module(f"specadapt.records.{info.name}")
    found, todo = set(), [ReportEnvelope]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.add(sub.__name__)
            todo.append(sub)
    return found


REPORTS = report_types()


def offences(source: str) -> list[str]:
    """What in ``source`` builds a report, plans or starts a server, or runs an event loop."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            out += [f"line {node.lineno}: imports {m}" for m in modules if m.split(".")[0] in LOOP_MODULES]
            if isinstance(node, ast.ImportFrom) and node.module == "specadapt.load.client":
                out += [f"line {node.lineno}: imports the client's loop runner"
                        for a in node.names if a.name == "run"]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in REPORTS | PLAN_TYPES:
            out.append(f"line {node.lineno}: builds a {func.id}")
        elif isinstance(func, ast.Attribute):
            if func.attr in BACKEND_CALLS:
                out.append(f"line {node.lineno}: calls .{func.attr}() of a backend")
            elif isinstance(func.value, ast.Name) and func.value.id in REPORTS | PLAN_TYPES:
                out.append(f"line {node.lineno}: builds a {func.value.id} ({func.attr})")
    return sorted(out, key=lambda text: (int(text.split(":")[0].removeprefix("line ")), text))


def test_the_report_kinds_are_found():
    assert {"ProbeReport", "CompareReport", "SamplingReport", "TuneReport", "DemoReport"} <= REPORTS


@pytest.mark.parametrize("path", sorted(COMMANDS.glob("*.py")), ids=lambda p: p.name)
def test_no_command_builds_a_report_plans_a_server_or_runs_a_loop(path):
    assert offences(path.read_text()) == []


def test_the_check_catches_the_orchestration_put_back_in_a_command():
    """What the commands did before orchestration held it: each is one offence."""
    source = '''
import asyncio
from specadapt.load.client import run
from specadapt.records.tune import TuneReport

def one_after_the_other(plan, prompts, settings, on_info, off_info, records):
    return CompareReport(settings=settings, off_server=off_info, on_server=on_info, requests=records)

def sample_on(on, inputs, settings):
    return asyncio.run(draw_samples(on, inputs, settings.samples))

def plan(opts, backend, model, url):
    plan = ServerPlan(backend_name=opts.backend, backend=backend, sides=(), launch=())
    side = Side(url=url, label="spec-on")
    launch = backend.launch_options(model=model)
    backend.check_launch(launch)
    with plan.backend.launched_many([launch]) as servers:
        return servers, backend.connect(url), TuneReport.model_validate({})
'''
    assert offences(source) == [
        "line 2: imports asyncio",
        "line 3: imports the client's loop runner",
        "line 7: builds a CompareReport",
        "line 13: builds a ServerPlan",
        "line 14: builds a Side",
        "line 15: calls .launch_options() of a backend",
        "line 16: calls .check_launch() of a backend",
        "line 17: calls .launched_many() of a backend",
        "line 18: builds a TuneReport (model_validate)",
        "line 18: calls .connect() of a backend",
    ]


def test_a_command_that_only_parses_and_prints_passes():
    source = '''
import click
from specadapt.orchestration.ab import compare_servers
from specadapt.orchestration.servers import ab_sides, plan_servers

def run(opts, prompts, settings, console):
    plan = plan_servers(opts, ab_sides(None, None), console.messages)
    report = compare_servers(plan, prompts, settings, console.bars, console.messages)
    click.echo(report.model_dump_json())
    return read_model("r.json", TuneReport, "tune")
'''
    assert offences(source) == []
