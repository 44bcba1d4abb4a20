"""`specadapt watch --emit DIR`: write the alerting rules, the Grafana dashboard and the
watcher's Deployment + Service (configs/watch.py builds them), and say how to load each."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specadapt.configs import watch as W


def emit(out_dir: Path, urls: Sequence[str | tuple[str, str]], image: str | None = None,
         namespace: str = "default", port: int = W.WATCH_PORT, **rule_options) -> list[Path]:
    """Write the three files into ``out_dir``; UsageError (one line) on bad input, before any
    file is written. ``urls``: ``URL`` / ``NAME=URL`` strings or (name, url) pairs (a name equal
    to its URL is no name); the watcher pod keeps the names as the ``server`` label.
    ``image`` None: ``configs.watch.DEFAULT_IMAGE``."""
    flags = [u if isinstance(u, str) else (u[1] if u[0] == u[1] else f"{u[0]}={u[1]}")
             for u in urls]
    return W.write_watch_artifacts(Path(out_dir), flags, image=image or W.DEFAULT_IMAGE,
                                   namespace=namespace, port=port, **rule_options)


def emit_lines(paths: list[Path], namespace: str = "default") -> list[str]:
    """What to print after :func:`emit`: each file, then how to load it."""
    by_name = {p.name: p for p in paths}
    lines = [str(p) for p in paths]
    rules = by_name.get(W.ALERTS_FILE)
    dash = by_name.get(W.DASHBOARD_FILE)
    deploy = by_name.get(W.DEPLOY_FILE)
    if rules:
        lines.append(f"# Prometheus: add {rules.name} under rule_files: (check it with "
                     f"'promtool check rules {rules}')")
    if dash:
        lines.append(f"# Grafana: Dashboards > New > Import, upload {dash.name} and pick the "
                     "Prometheus data source")
    if deploy:
        lines.append(f"# Kubernetes: kubectl apply -n {namespace} -f {deploy}")
    return lines
