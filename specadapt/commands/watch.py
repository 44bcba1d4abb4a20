"""`specadapt watch`: the production monitor (orchestration/watch.py does the work), its
Prometheus endpoint, and `watch record-golden` for its canaries."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import click
from rich.console import Console
from rich.live import Live

from specadapt.analysis.watch import DriftSettings
from specadapt.commands._console import say, stderr, warn
from specadapt.commands.watch_golden import record_golden
from specadapt.errors import UsageError
from specadapt.orchestration.servers import api_key_from, tls_verify
from specadapt.orchestration.watch import Watcher, WatchSettings, load_baseline, open_watch
from specadapt.records import read_golden
from specadapt.records.reports import atomic_write_text
from specadapt.records.watch import FLEET
from specadapt.report.watch_render import event_line, status_lines, status_table, watch_report


def parse_targets(values: tuple[str, ...]) -> list[tuple[str, str]]:
    """``NAME=URL`` or ``URL`` -> (name, url); names distinct and not the fleet's."""
    out = []
    for v in values:
        name, eq, url = v.partition("=")
        if not eq or "://" in name:
            name, url = v, v
        name, url = name.strip(), url.strip()
        if not name or not url:
            raise UsageError(f"--url {v!r}: give URL or NAME=URL, e.g. --url a=http://10.0.0.5:8000")
        if name == FLEET:
            raise UsageError(f"--url {v!r}: the name {FLEET!r} is the aggregate of all servers; pick another")
        out.append((name, url))
    names = [n for n, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"--url: the server name {dup[0]!r} is given twice; names must be distinct")
    return out


def _listen(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    host, _, port = value.rpartition(":")
    try:
        p = int(port)
    except ValueError:
        p = -1
    if not 0 <= p <= 65535:
        raise UsageError(f"--listen {value!r}: give HOST:PORT (e.g. 0.0.0.0:9400) or :PORT")
    return (host or "0.0.0.0", p)


@click.group("watch", invoke_without_command=True)
@click.option("--url", "urls", multiple=True, help="Server to watch: URL or NAME=URL; repeat for a fleet.")
@click.option("--backend", default="vllm", show_default=True, help="Server kind (see 'specadapt backends').")
@click.option("--api-key", help="Bearer token (default: $SPECADAPT_API_KEY, then $OPENAI_API_KEY).")
@click.option("--insecure", is_flag=True, help="Do not verify TLS certificates (warns).")
@click.option("--ca-bundle", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="CA bundle for TLS.")
@click.option("--interval", type=click.FloatRange(0.05), default=10.0, show_default=True,
              help="Seconds between reads of each server.")
@click.option("--window", type=click.FloatRange(0.1), default=300.0, show_default=True,
              help="Seconds of reads the windowed figures cover.")
@click.option("--timeout", type=click.FloatRange(0.05), default=5.0, show_default=True,
              help="Seconds a read may take before the server counts as down for that round.")
@click.option("--max-backoff", type=click.FloatRange(0.1), default=300.0, show_default=True,
              help="Longest wait between tries of a server that keeps failing.")
@click.option("--listen", help="Serve Prometheus metrics at HOST:PORT (e.g. 0.0.0.0:9400); off by default.")
@click.option("--baseline", type=click.Path(path_type=Path),
              help="A compare or tune report of this deployment: the live acceptance becomes an expected speedup "
                   "at the live batch size, and 'costing time' an alert.")
@click.option("--golden", type=click.Path(path_type=Path),
              help="Golden answers (`specadapt watch record-golden`): canary rounds compare the server with them.")
@click.option("--canary-every", type=click.FloatRange(1), default=600.0, show_default=True,
              help="Seconds between canary rounds (with --golden).")
@click.option("--canary-prompts", type=click.IntRange(1, 16), default=4, show_default=True,
              help="Canary prompts per round, sent one at a time.")
@click.option("--drift-block", type=click.FloatRange(0.05), default=60.0, show_default=True,
              help="Seconds of reads per block of the drift test.")
@click.option("--drift-learn", type=click.IntRange(2), default=30, show_default=True,
              help="Blocks that make the drift test's reference window.")
@click.option("--false-alarms-per-day", type=click.FloatRange(1e-6), default=0.1, show_default=True,
              help="The drift test's false-alarm rate on a steady server (sets its decision level).")
@click.option("--drift-shift", type=click.FloatRange(0.1), default=2.0, show_default=True,
              help="The fall in acceptance (block standard deviations) the drift test catches fastest.")
@click.option("--drift-min-tokens", type=click.FloatRange(1), default=200.0, show_default=True,
              help="Draft tokens a block needs to be judged (quieter blocks are skipped).")
@click.option("--duration", type=click.FloatRange(0.1), help="Stop after this many seconds (default: run until "
                                                             "interrupted).")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the end report (JSON) here when the watch ends, however it ends.")
@click.option("--no-console", is_flag=True, help="No live table: one line per alert and a status line per window "
                                                 "(for logs).")
@click.option("--emit", "emit_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write the Prometheus alerting rules, the Grafana dashboard and a Kubernetes deployment of the "
                   "watcher for the --url servers to this folder, and exit.")
@click.option("--image", help="With --emit: the container image that runs specadapt.")
@click.option("--namespace", default="default", show_default=True, help="With --emit: the Kubernetes namespace.")
@click.pass_context
def watch(ctx: click.Context, urls, backend, api_key, insecure, ca_bundle, interval, window, timeout, max_backoff,
          listen, baseline, golden, canary_every, canary_prompts, drift_block, drift_learn, false_alarms_per_day,
          drift_shift, drift_min_tokens, duration, out_file, no_console, emit_dir, image, namespace) -> None:
    """Watch spec-on servers over time: windowed acceptance, drift, expected speedup, canaries.

    Exit 0: the watch ended (--duration) with no alert raised; 1: an alert was raised during the
    watch; 2: bad input; 130: interrupted (the end report is still written)."""
    if ctx.invoked_subcommand is not None:
        return
    targets = parse_targets(urls)
    if emit_dir is not None:
        from specadapt.commands.watch_emit import emit, emit_lines

        for line in emit_lines(emit(emit_dir, targets, image=image, namespace=namespace), namespace):
            say(line)
        return
    if not targets:
        raise UsageError("give the servers to watch: --url URL (or NAME=URL), repeated for a fleet")
    if window < interval:
        raise UsageError(f"--window {window:g} is shorter than --interval {interval:g}: a window must hold reads")
    listen_at = _listen(listen)
    model = load_baseline(baseline) if baseline is not None else None
    drift = DriftSettings(block_s=drift_block, learn_blocks=drift_learn, false_alarms_per_day=false_alarms_per_day,
                          shift_sigmas=drift_shift, min_draft_tokens=drift_min_tokens)
    settings = WatchSettings(interval_s=interval, window_s=window, timeout_s=timeout, max_backoff_s=max_backoff,
                             drift=drift, canary_every_s=canary_every if golden else None)
    verify = tls_verify(insecure, ca_bundle)
    if golden is not None and not golden.is_file():
        raise UsageError(f"--golden {golden} does not exist: record it with `specadapt watch record-golden`")
    answers = read_golden(golden) if golden is not None else None
    with contextlib.ExitStack() as stack:
        w = stack.enter_context(open_watch(targets, backend, settings, api_key=api_key_from(api_key), verify=verify,
                                           baseline=model, baseline_name=str(baseline), golden=answers,
                                           canary_prompts=canary_prompts, warn=warn))
        servers = w.servers
        exporter = None
        if listen_at:
            from specadapt.report.watch_export import Exporter

            try:
                exporter = Exporter(w, *listen_at)
            except OSError as exc:
                raise UsageError(f"--listen {listen}: cannot serve there ({exc.strerror or exc})") from exc
            stack.callback(exporter.close)
        say(f"watching {len(servers)} server{'s' if len(servers) != 1 else ''} every {interval:g} s, window "
            f"{window:g} s; drift: blocks of {drift_block:g} s, {drift_learn} to learn, decision level "
            f"{drift.h:.2f} for {false_alarms_per_day:g} false alarms a day, expected delay "
            f"{drift.delay_s():.0f} s after a fall of {drift_shift:g} sigma"
            + (f"; metrics at {exporter.url}" if exporter else ""))
        started_wall = time.time()
        end = "ended after --duration"
        try:
            _loop(w, duration, no_console or not stderr.is_terminal, settings)
        except KeyboardInterrupt:
            _write(out_file, w, started_wall, "interrupted", baseline)
            raise
        except SystemExit as exc:  # SIGTERM or SIGHUP (a pod being stopped): the report first
            _write(out_file, w, started_wall, f"stopped by a signal (exit {exc.code})", baseline)
            raise
        _write(out_file, w, started_wall, end, baseline)
        if w.raised_ever:
            say(f"{w.raised_ever} alert{'s were' if w.raised_ever != 1 else ' was'} raised during the watch")
            ctx.exit(1)


def _write(out_file: Path | None, w: Watcher, started_wall: float, end: str, baseline: Path | None) -> None:
    if out_file is None:
        return
    report = watch_report(w, started_wall, end, str(baseline) if baseline else None)
    atomic_write_text(out_file, report.model_dump_json(indent=2))
    say(f"wrote {out_file}")


def _loop(w: Watcher, duration: float | None, plain: bool, settings: WatchSettings) -> None:
    stop = threading.Event()
    until = w.clock() + duration if duration else None
    out = Console(highlight=False, soft_wrap=True)
    if plain:
        last_status = [w.clock()]

        def on_events(events) -> None:
            for ev in events:
                out.print(event_line(ev), markup=False)
            if w.clock() - last_status[0] >= settings.window_s:
                last_status[0] = w.clock()
                for line in status_lines(w):
                    out.print(line, markup=False)

        w.run(stop, until, on_events)
        if w.clock() - last_status[0] > settings.interval_s:  # not just printed
            for line in status_lines(w):
                out.print(line, markup=False)
        return
    with Live(status_table(w), console=out, refresh_per_second=2, transient=False) as live:
        def on_events(events) -> None:
            for ev in events:
                live.console.print(event_line(ev), markup=False)
            live.update(status_table(w))

        w.run(stop, until, on_events)
        live.update(status_table(w))


watch.add_command(record_golden)
