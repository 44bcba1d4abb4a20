"""The versioned report model. Every output format renders from a saved report."""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from specadapt import __version__
from specadapt.adapters.base import CounterSnapshot, ServerInfo
from specadapt.errors import UsageError
from specadapt.probes.acceptance import AcceptanceSummary
from specadapt.probes.client import RequestRecord, RequestSettings
from specadapt.probes.latency import LatencySummary

SCHEMA_VERSION = 1


class ProbeSettings(BaseModel):
    concurrency: int
    repeat: int
    warmup: int
    prompts_source: str
    request: RequestSettings


class ReportEnvelope(BaseModel):
    """What every report starts with: schema version, kind, who wrote it and when."""

    schema_version: int = SCHEMA_VERSION
    kind: str
    specadapt_version: str = __version__
    created_at: str = Field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))


class ProbeReport(ReportEnvelope):
    """One probe run against one server."""

    kind: Literal["probe"] = "probe"
    server: ServerInfo
    settings: ProbeSettings
    partial: bool = Field(False, description="The run stopped early (the server died); only finished requests are in.")
    partial_reason: str | None = Field(None, description="Why the run is partial, with the server's exit code.")
    latency: LatencySummary = Field(description="Requests answered on their first send (all of them with retries off).")
    latency_retried: LatencySummary | None = Field(
        None, description="Requests that needed more than one send (retries on); kept apart, their times include the waits.")
    failures: dict[str, int] = Field(default_factory=dict, description="Failed requests per error kind (HTTP errors per status: http_429, ...).")
    by_category: dict[str, LatencySummary] = Field(default_factory=dict)
    acceptance: AcceptanceSummary
    counters_before: CounterSnapshot
    counters_after: CounterSnapshot
    token_sources: dict[str, int] = Field(default_factory=dict, description="Requests per token-count source.")
    notes: list[str] = Field(default_factory=list)
    requests: list[RequestRecord] = Field(default_factory=list)


def atomic_write_text(path: Path, text: str) -> None:
    """Write a file atomically: a temp file in the same directory, flushed to disk, then renamed
    over ``path``; a crash at any point leaves the old file or none, never half a report that a
    staging gate could read as valid."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(report: BaseModel, path: Path) -> None:
    """Write a report model as JSON, atomically."""
    atomic_write_text(path, report.model_dump_json(indent=2))


def read_model(path: Path, model: type[BaseModel], what: str):
    """A saved report of one kind, or UsageError saying why the file is not one."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"report {path} does not exist")
    try:
        return model.model_validate_json(path.read_text())
    except ValidationError as exc:
        raise UsageError(f"{path} is not a specadapt {what} report ({exc.error_count()} problems; "
                         f"first: {exc.errors()[0]['msg']})") from exc


def report_kind(path: Path) -> str | None:
    """The ``kind`` field of a saved report ("probe", "compare"), None if unreadable."""
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data.get("kind") if isinstance(data, dict) else None


def read_report(path: Path) -> ProbeReport:
    return read_model(path, ProbeReport, "probe")
