"""The data that crosses layers: request records, summaries, ratio intervals, identity, reports.

The ground floor of specadapt: every other package imports these types from here, and this
package imports nothing of specadapt's but ``errors``. All models are pydantic; their field
descriptions are the documentation of the saved JSON reports.
"""

from specadapt.records.canary import (
    CANARY_VERDICTS,
    CanaryResult,
    CanaryRound,
    CanaryVerdict,
    GoldenAnswer,
    GoldenFile,
    read_golden,
    write_golden,
)
from specadapt.records.client_load import ClientLoad
from specadapt.records.demo import DemoReport, DemoRun, DemoTimings, read_demo_report
from specadapt.records.identity import Divergence, PromptActivity, PromptIdentity, SpecActivity, Triage, Verdict
from specadapt.records.metrics import (
    AcceptanceSummary,
    Crossover,
    Distribution,
    LatencySummary,
    RatioCI,
)
from specadapt.records.prompts import ChatMessage, Prompt
from specadapt.records.reports import (
    SCHEMA_VERSION,
    CompareReport,
    CompareSettings,
    CounterPair,
    Gate,
    LevelResult,
    ProbeReport,
    ProbeSettings,
    PromptSpeed,
    RateBound,
    ReportEnvelope,
    SpeedRatios,
    TheoryCheck,
    read_compare_report,
    read_report,
    report_kind,
    write_report,
)
from specadapt.records.requests import (
    ErrorKind,
    RequestRecord,
    RequestSettings,
    TokenSource,
)
from specadapt.records.scale import MergeSource, ReplicaResult, ScaleLayout, WorkerInfo
from specadapt.records.sequential import SequentialDesign, SequentialOutcome
from specadapt.records.server import CounterSnapshot, GpuInfo, HardwareInfo, ServerInfo
from specadapt.records.workload import WorkloadInfo

__all__ = [
    "CANARY_VERDICTS", "CanaryResult", "CanaryRound", "CanaryVerdict", "GoldenAnswer", "GoldenFile", "read_golden",
    "write_golden",
    "SCHEMA_VERSION", "AcceptanceSummary", "ChatMessage", "ClientLoad", "CompareReport", "CompareSettings",
    "CounterPair",
    "CounterSnapshot", "Crossover", "DemoReport", "DemoRun", "DemoTimings", "Distribution", "Divergence",
    "ErrorKind", "Gate", "GpuInfo", "HardwareInfo", "LatencySummary",
    "LevelResult", "MergeSource", "ProbeReport", "ProbeSettings", "Prompt", "PromptActivity", "PromptIdentity", "PromptSpeed",
    "RateBound", "RatioCI", "SpecActivity",
    "ReplicaResult", "ReportEnvelope", "RequestRecord", "RequestSettings", "SequentialDesign", "SequentialOutcome", "ServerInfo",
    "ScaleLayout", "SpeedRatios",
    "TheoryCheck", "Triage", "TokenSource", "Verdict", "WorkerInfo", "WorkloadInfo", "read_compare_report",
    "read_demo_report",
    "read_report", "report_kind", "write_report",
]
