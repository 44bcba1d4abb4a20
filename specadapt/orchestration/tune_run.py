"""`specadapt tune` as library calls: ``plan_tune`` decides where each candidate runs and checks
every launch before anything starts, ``run_tune`` runs the sweep beside the spec-off server, the
analysis and the verification of the emitted configuration (orchestration/tune.py's pieces) on
the planned servers, and ``write_configs`` writes the recommendation for vLLM and TensorRT-LLM.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path

from specadapt.adapters.base import LaunchOptions, Server
from specadapt.adapters.placement import usable_cpus
from specadapt.adapters.registry import get_backend
from specadapt.configs.render import validate
from specadapt.configs.spec import SpecConfig
from specadapt.configs.tuned import write_tuned_configs
from specadapt.errors import UsageError
from specadapt.load.progress import ProgressBars, no_bars
from specadapt.orchestration.compare import total_requests
from specadapt.orchestration.servers import (
    LOGGED,
    Messages,
    ServerOptions,
    ServerPlan,
    Side,
    launch_options_for,
    off_and_on_halves,
    open_servers,
    plan_servers,
    resolve_dtype,
)
from specadapt.orchestration.tune import (
    SweepCandidate,
    analyse,
    candidates_for,
    ranges_text,
    recommended_spec,
    run_sweep,
    run_verification,
    settle_recommendation,
    verification_spec,
)
from specadapt.records import CompareSettings, Prompt
from specadapt.records.tune import TuneReport, TuneSettings, Verification

INTERRUPTED = "interrupted (Ctrl-C or a signal); the candidates measured before are kept"


@dataclass(frozen=True)
class TunePlan:
    """What plan_tune decided: the candidates, where each server runs (a URL, or launch options
    checked before anything starts) and the settings of the run."""

    servers: ServerPlan
    """The backend, API key, TLS and start-up timeout; the run sets its sides per server."""
    opts: ServerOptions
    """The server options as started servers run them (--dtype auto resolved)."""
    base: SpecConfig
    candidates: tuple[SweepCandidate, ...]
    settings: TuneSettings
    off_url: str | None = None
    verify_url: str | None = None
    launches: dict[str, LaunchOptions] = field(default_factory=dict)
    """Launch options of every server to start, by candidate label ("off": the spec-off server)."""
    model: str | None = None
    """The model started servers run (None when none is started)."""
    on_cpus: list[int] | None = None
    """The CPUs of every spec-on server started here (candidates, verification) when the spec-off server is
    started too: the other half of the machine from it (adapters/placement.py); None: not bound."""

    @property
    def to_start(self) -> list[SweepCandidate]:
        return [c for c in self.candidates if c.k > 0 and not c.url]

    def compare_settings(self) -> CompareSettings:
        """The settings of each candidate's A/B against the spec-off server (interleaved; with
        --until-decided, under the rule)."""
        s = self.settings
        return CompareSettings(concurrency=list(s.concurrency), repeat=s.repeat, warmup=s.warmup, request=s.request,
                               prompts_source=s.prompts_source, near_tie_threshold=s.near_tie_threshold,
                               dtype=s.dtype, triage=s.triage, interleaved=True, workload=s.workload,
                               workers=s.workers, ray_address=s.ray_address, sequential=s.sequential)

    def verify_settings(self) -> CompareSettings:
        """The verification's settings: the sweep's, in the fixed design (--repeat) as today."""
        return self.compare_settings().model_copy(update={"sequential": None})


def plan_tune(opts: ServerOptions, base: SpecConfig, settings: TuneSettings, off_url: str | None = None,
              on: Sequence[tuple[int | None, str]] = (), verify_url: str | None = None,
              messages: Messages = LOGGED) -> TunePlan:
    """Decide where each candidate of ``settings`` runs and check every launch; start nothing.

    ``on``: running candidates as (k, URL), k None to read it from the server; the spec-off server
    runs at ``off_url`` or is started, and so is the verification server at ``verify_url`` (when
    ``settings.verify``). The plan's settings have the k of every candidate, 0 included, and
    --dtype auto as the started servers will run it."""
    get_backend(opts.backend)  # an unknown backend is the first thing said
    servers = plan_servers(opts, [], messages)
    backend = servers.backend

    # which candidates run where: given ones first (their k read from the server), the rest started
    connected: dict[int, str] = {}
    for k, url in on:
        if k is None:
            given = replace(servers, sides=(Side(url=url, label="spec-on"),), launch=(None,))
            with open_servers(given, messages) as (server,):
                k = server.describe().num_speculative_tokens
            if not k:
                raise UsageError(f"cannot tell the draft length of --on {url}: write it as --on K={url}")
        if k in connected:
            raise UsageError(f"two --on servers have k={k}: give one server per draft length")
        connected[k] = url
    all_ks = sorted(set(settings.ks) | set(connected) | {0})
    candidates = candidates_for(base, all_ks, settings.ngram_max)
    candidates = [replace(c, url=connected.get(c.k)) if (c.k in connected and not c.variant) else c
                  for c in candidates]
    to_start = [c for c in candidates if c.k > 0 and not c.url]
    need_start = bool(to_start) or not off_url or (not verify_url and settings.verify)
    model = None
    launches: dict[str, LaunchOptions] = {}
    on_cpus = None
    if need_start:
        if not backend.capabilities.launch:
            raise UsageError(f"backend {opts.backend} cannot start servers: give --off URL, one --on URL per draft "
                             "length and --verify-url (or --no-verify)")
        opts = resolve_dtype(opts, messages)  # --dtype auto as the started servers will run it
        model = str(backend.resolve_model(opts.model))
        for c in to_start:  # every candidate's launch checked before anything starts
            launches[c.label] = launch_options_for(backend, opts, model, c.spec, None)
            if backend.spec_support.rules:  # the configs package's rules, model directories included
                validate(c.spec.model_copy(update={"target": model}), backend.spec_support.rules)
        if not off_url:
            launches["off"] = launch_options_for(backend, opts, model, None, None)
        on_cpus = place_tune(launches, messages)
        for launch in launches.values():
            backend.check_launch(launch)
        if not verify_url and settings.verify and not backend.spec_support.batch_schedule:
            raise UsageError(f"tune starts the verification server with a per-batch-size schedule, which backend "
                             f"{opts.backend} does not take: give --verify-url of a running server with the emitted "
                             "config, or --no-verify")
    return TunePlan(servers=servers, opts=opts, base=base, candidates=tuple(candidates),
                    settings=settings.model_copy(update={"ks": all_ks, "dtype": opts.dtype}), off_url=off_url,
                    verify_url=verify_url, launches=launches, model=model,
                    on_cpus=on_cpus)


def place_tune(launches: dict[str, LaunchOptions], messages: Messages = LOGGED) -> list[int] | None:
    """With the spec-off server and some spec-on server both started here: the spec-off one on one half
    of the CPUs, the spec-on ones (measured one at a time beside it) on the other, in ``launches`` (in
    place); returns the spec-on CPUs. One CPU: nothing bound, said so."""
    if "off" not in launches or len(launches) < 2:
        return None
    off, on, line = off_and_on_halves(usable_cpus(), "each spec-on server", "measured one at a time beside it")
    if on is None:
        messages.warn(line)
        return None
    for label, launch in launches.items():
        launches[label] = launch.model_copy(update={"cpus": off if label == "off" else on})
    messages.say(line)
    return on


def run_tune(plan: TunePlan, prompts: list[Prompt], bars: ProgressBars = no_bars,
             messages: Messages = LOGGED) -> TuneReport:
    """The sweep beside the spec-off server, the analysis, and the verification of the emitted
    configuration; every server started here is stopped when this returns or raises.

    On Ctrl-C or a signal (KeyboardInterrupt, SystemExit) the report so far, marked partial, rides
    on the exception as ``report``; a spec-off server that dies ends the run with a partial report."""
    report = TuneReport(settings=plan.settings)
    settings = plan.compare_settings()
    per_side = total_requests(len(prompts), settings, prompts) // 2
    measured = [c for c in plan.candidates if c.k > 0]
    most = "at most " if settings.sequential is not None else ""
    messages.say(f"tune: {len(measured)} candidate(s) ({', '.join(c.label for c in measured)}) beside the spec-off "
                 f"server, one at a time, at concurrency {','.join(map(str, plan.settings.concurrency))}; {most}"
                 f"{per_side} requests per server ({len(plan.to_start)} candidate server(s) to start)")
    try:
        _sweep_and_verify(report, plan, prompts, settings, per_side, bars, messages)
    except (KeyboardInterrupt, SystemExit) as exc:  # Ctrl-C; SIGTERM/SIGHUP arrive as SystemExit
        report.partial, report.partial_reason = True, INTERRUPTED
        exc.report = report  # type: ignore[attr-defined]
        raise
    return report


def _sweep_and_verify(report: TuneReport, plan: TunePlan, prompts: list[Prompt], settings: CompareSettings,
                      per_side: int, bars: ProgressBars, messages: Messages) -> None:
    servers = plan.servers
    off_plan = replace(servers, sides=(Side(url=plan.off_url, spec=False, label="spec-off"),),
                       launch=(None if plan.off_url else plan.launches["off"],))

    def one(url: str | None, launch: LaunchOptions | None) -> AbstractContextManager[list[Server]]:
        return open_servers(replace(servers, sides=(Side(url=url, label="spec-on"),), launch=(launch,)), messages)

    @contextlib.contextmanager
    def open_candidate(cand: SweepCandidate) -> Iterator[Server]:
        with one(cand.url, None if cand.url else plan.launches[cand.label]) as (server,):
            yield server

    @contextlib.contextmanager
    def open_verify(spec: SpecConfig) -> Iterator[Server]:
        launch = None if plan.verify_url else launch_options_for(servers.backend, plan.opts, plan.model or "", spec,
                                                                 None).model_copy(update={"cpus": plan.on_cpus})
        with one(plan.verify_url, launch) as (server,):
            yield server

    with open_servers(off_plan, messages) as (off,):
        report.off_server = off.describe()
        run_sweep(report, off, plan.candidates, open_candidate, prompts, settings, bars, per_side)
        analyse(report, plan.settings.given_schedule)
        if report.partial:
            return
        spec = verification_spec(report, plan.base)
        if spec is None:
            report.verification = Verification(status="not run", reason=(
                "speculation off is the recommendation: the spec-off server is the baseline itself"
                if report.recommendation.form == "off" else "nothing to verify"))
        elif not report.settings.verify:
            report.verification = Verification(status="not run", reason="--no-verify")
        else:
            messages.say(f"verifying the emitted configuration: {_describe(report)}")
            verify = plan.verify_settings()
            run_verification(report, off, open_verify, spec, prompts, verify, bars,
                             total_requests(len(prompts), verify, prompts) // 2)
        settle_recommendation(report)


def _describe(report: TuneReport) -> str:
    rec = report.recommendation
    if rec.form == "schedule":
        return "k per batch size " + ranges_text(rec.schedule)
    return f"fixed k={rec.k}"


def write_configs(report: TuneReport, plan: TunePlan, out_dir: Path) -> list[Path]:
    """The recommendation as a vLLM speculative config and a TensorRT-LLM YAML in ``out_dir``
    (recorded in ``report.configs``); nothing for a partial run or no recommendation. A config that
    cannot be written is a note in the report, not an error."""
    if report.partial or report.recommendation.form == "none":
        return []
    spec = recommended_spec(report, plan.base)
    spec = spec.model_copy(update={"target": spec.target or plan.model or plan.opts.model})
    try:
        report.configs = write_tuned_configs(spec, report.recommendation, out_dir)
    except UsageError as err:
        report.notes.append(f"the configs could not be written: {err}")
    return [Path(c.path) for c in report.configs if c.path]
