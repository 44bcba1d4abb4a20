"""Real servers with the embedded model, started once per test session.

The vLLM (CPU build) servers start side by side (their start-up is mostly single-threaded
compilation) through the same code the CLI uses; the reference servers
(`specadapt reference serve`) run as real subprocesses on loopback.

The Makefile runs this directory in three sessions (``SPECADAPT_LIVE_PHASE``): the tests of vLLM
servers (and those that start their own, or measure time) one at a time, those marked ``timed``
first and alone on the machine (``SPECADAPT_QUIET_DONE`` says when they are done: the tests that
share no server then run beside the rest); then the tests that use reference servers only, in
two sessions side by side (one for ``feature_reference_servers``, one for the other groups): a
test waits on its one-thread server most of the time, so two keep both CPUs busy, and each
session starts its own shared servers once.

Memory decides the schedule: a vLLM CPU server holds about 3.4 GB (its KV cache, the model in
float32, torch), a reference server about 1.3 GB, and all of them together (five vLLM servers,
eight reference servers) do not fit in 24 GB: the page cache is squeezed and every test
slows down many times over. So the tests that use vLLM servers run first and the tests that
use reference servers after them (``pytest_collection_modifyitems``), and each server is
stopped as soon as the last test that uses it has finished (``pytest_runtest_teardown``);
whatever is left is stopped at the end of the session.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from pathlib import Path

import httpx
import pytest

from specadapt.adapters.placement import split_cpus, usable_cpus
from specadapt.adapters.vllm import VLLMBackend, VLLMLaunch
from specadapt.configs.spec import SpecConfig
from specadapt.models import resolve_model_dir

NGRAM_K4 = SpecConfig(method="ngram", k=4, ngram_min=2, ngram_max=4)
# tune's verification server: n-gram k=4 that drafts 2 at batch size 2 (test_tune_live.SCHEDULE)
NGRAM_SCHEDULE = NGRAM_K4.model_copy(update={"k_per_batch_size": [(1, 1, 4), (2, 2, 2)]})


@pytest.fixture(scope="session")
def embedded_model() -> str:
    return str(resolve_model_dir(None))


DRAFT_K3 = "draft_model k=3"  # its SpecConfig names the truncated_model fixture's directory (made at session start)
SERVERS = {  # name: (spec config, dtype)
    "off_fp32": (None, "float32"), "ngram_fp32": (NGRAM_K4, "float32"), "off_bf16": (None, "bfloat16"),
    "ngram_schedule_fp32": (NGRAM_SCHEDULE, "float32"), "draft_fp32": (DRAFT_K3, "float32"),
}
# Fixture -> server. The pair that differs in speculation only is float32 (vllm_off and vllm_ngram
# are the float32 servers); the bfloat16 spec-off server is there for precision divergences.
FIXTURES = {"vllm_off": "off_fp32", "vllm_off_fp32": "off_fp32", "vllm_ngram": "ngram_fp32",
            "vllm_ngram_fp32": "ngram_fp32", "vllm_off_bf16": "off_bf16", "vllm_ngram_schedule": "ngram_schedule_fp32",
            "vllm_draft": "draft_fp32"}


@pytest.fixture(scope="session")
def vllm_servers(request, embedded_model):
    """The vLLM servers that the session's tests use, started side by side once per session
    and stopped after it."""
    used = {FIXTURES[name] for item in request.session.items for name in FIXTURES
            if name in getattr(item, "fixturenames", ())}
    names = [name for name in SERVERS if name in used] or list(SERVERS)
    # --enforce-eager: no torch.compile at start-up (about 80 s instead of 280 s for two servers on
    # 2 cores with a cold compile cache; requests about a third slower): the tests check behaviour,
    # never speed.
    def spec(name: str) -> SpecConfig | None:
        config = SERVERS[name][0]
        if config == DRAFT_K3:  # a poorly matched draft: the embedded model's first 4 of 30 layers
            return SpecConfig(method="draft_model", k=3, draft=request.getfixturevalue("truncated_model"))
        return config

    # The spec-off servers on one half of the CPUs, the spec-on ones on the other, as specadapt places
    # the two sides of a comparison it starts: a spec-off and a spec-on server never share a core, so
    # neither stalls the other's first token (adapters/placement.py).
    halves = split_cpus(usable_cpus(), 2) or [None, None]
    opts = [VLLMLaunch(model=embedded_model, spec_config=spec(name), dtype=SERVERS[name][1],
                       max_model_len=2048, extra_args=["--enforce-eager"],
                       cpus=halves[SERVERS[name][0] is not None]) for name in names]
    with VLLMBackend().launched_many(opts, startup_timeout_s=1500) as servers:
        by_name = dict(zip(names, servers, strict=True))
        _STARTED.update({name: [server] for name, server in by_name.items()})
        yield by_name


@pytest.fixture(scope="session")
def vllm_off(vllm_servers):
    return vllm_servers[FIXTURES["vllm_off"]]


@pytest.fixture(scope="session")
def vllm_ngram(vllm_servers):
    return vllm_servers[FIXTURES["vllm_ngram"]]


@pytest.fixture(scope="session")
def vllm_off_fp32(vllm_servers):
    return vllm_servers[FIXTURES["vllm_off_fp32"]]


@pytest.fixture(scope="session")
def vllm_ngram_fp32(vllm_servers):
    return vllm_servers[FIXTURES["vllm_ngram_fp32"]]


@pytest.fixture(scope="session")
def vllm_ngram_schedule(vllm_servers):
    """n-gram k=4 with a per-batch-size schedule: k=2 at batch size 2 (tune verifies it)."""
    return vllm_servers[FIXTURES["vllm_ngram_schedule"]]


@pytest.fixture(scope="session")
def vllm_draft(vllm_servers):
    """Spec on with a draft model that matches badly: the embedded model cut to 4 layers, k=3."""
    return vllm_servers[FIXTURES["vllm_draft"]]


@pytest.fixture(scope="session")
def vllm_off_bf16(vllm_servers):
    return vllm_servers[FIXTURES["vllm_off_bf16"]]


def raw_counter(base_url: str, name: str) -> float:
    """A counter read straight from /metrics by regex, independent of specadapt's parser."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


@pytest.fixture(scope="session")
def settled_counter():
    return _settled_counter


def _settled_counter(base_url: str, name: str) -> float:
    """Read until two reads 0.3 s apart agree (stats land just after the response)."""
    last = raw_counter(base_url, name)
    for _ in range(20):
        time.sleep(0.3)
        now = raw_counter(base_url, name)
        if now == last:
            return now
        last = now
    return last


@pytest.fixture(scope="session")
def truncated_model(tmp_path_factory, embedded_model) -> str:
    """The embedded model cut to its first 4 of 30 layers: a different model, same tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("smol-4-layers")
    model = AutoModelForCausalLM.from_pretrained(embedded_model)
    model.model.layers = model.model.layers[:4]
    model.config.num_hidden_layers = 4
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(embedded_model).save_pretrained(out)
    return str(out)


REF_NGRAM = SpecConfig(method="ngram", k=4, ngram_min=1, ngram_max=4)


@pytest.fixture(scope="session")
def reference_servers(embedded_model, truncated_model):
    """`specadapt reference serve` (float32, CPU): spec off; ngram with accept-always; ngram
    with perturb-logits=0.1 on the verify pass; ngram with batch-drop (a token lost only where two or
    more requests share a pass); and spec off on a different (4-layer) model."""
    from specadapt.adapters.reference import ReferenceBackend, ReferenceLaunch

    opts = {"off": ReferenceLaunch(model=embedded_model),
            "accept_always": ReferenceLaunch(model=embedded_model, spec_config=REF_NGRAM, fault="accept-always"),
            "perturb": ReferenceLaunch(model=embedded_model, spec_config=REF_NGRAM, fault="perturb-logits=0.1"),
            "batch_drop": ReferenceLaunch(model=embedded_model, spec_config=REF_NGRAM, fault="batch-drop"),
            "other_model": ReferenceLaunch(model=truncated_model)}
    with ReferenceBackend().launched_many(list(opts.values())) as servers:
        _STARTED["reference_servers"] = servers
        yield dict(zip(opts, servers, strict=True))


@pytest.fixture(scope="session")
def reference_ngram_server(embedded_model):
    """One `specadapt reference serve` with a healthy n-gram k=4 (float32, CPU): the reference A/A's server,
    started alone (the groups above start four at once)."""
    from specadapt.adapters.reference import ReferenceBackend, ReferenceLaunch

    with ReferenceBackend().launched_many([ReferenceLaunch(model=embedded_model, spec_config=REF_NGRAM)]) as servers:
        _STARTED["reference_ngram_server"] = servers
        yield servers[0]


REF_NGRAM_K2 = SpecConfig(method="ngram", k=2, ngram_min=1, ngram_max=4)


@pytest.fixture(scope="session")
def sampling_reference_servers(embedded_model):
    """Spec-on `specadapt reference serve` servers for `equiv --sampling` (float32, CPU), scored
    against reference_servers["off"]: healthy n-gram k=4, and three faults of the sampler:
    residual-p (n-gram k=4: a rejected draft is replaced from p, not the residual); bonus-previous
    (n-gram k=2, so that every draft is accepted often and the bonus, drawn from the previous
    position's p, is frequent); draft-temperature=0.5 (the target as its own draft, k=2: every
    draft is accepted, so the output is the draft's samples at half the temperature)."""
    from specadapt.adapters.reference import ReferenceBackend, ReferenceLaunch

    self_draft = SpecConfig(method="draft_model", k=2, draft=embedded_model)
    opts = {"ngram": ReferenceLaunch(model=embedded_model, spec_config=REF_NGRAM),
            "residual_p": ReferenceLaunch(model=embedded_model, spec_config=REF_NGRAM, fault="residual-p"),
            "bonus_previous": ReferenceLaunch(model=embedded_model, spec_config=REF_NGRAM_K2, fault="bonus-previous"),
            "draft_temperature": ReferenceLaunch(model=embedded_model, spec_config=self_draft,
                                                 fault="draft-temperature=0.5")}
    with ReferenceBackend().launched_many(list(opts.values())) as servers:
        _STARTED["sampling_reference_servers"] = servers
        yield dict(zip(opts, servers, strict=True))


@pytest.fixture(scope="session")
def feature_reference_servers(embedded_model):
    """`specadapt reference serve` servers for `equiv --features` (float32, CPU, max_model_len 1024, so that
    the long-prompt cells stay cheap): spec off, healthy n-gram k=4, and n-gram k=4 with each planted fault
    of a request feature."""
    from specadapt.adapters.reference import ReferenceBackend, ReferenceLaunch
    from specadapt.native_reference.faults import FEATURE_FAULTS

    short = ["--max-model-len=1024"]
    opts = {"off": ReferenceLaunch(model=embedded_model, extra_args=short),
            "ngram": ReferenceLaunch(model=embedded_model, spec_config=REF_NGRAM, extra_args=short)}
    opts.update({fault: ReferenceLaunch(model=embedded_model, spec_config=REF_NGRAM, fault=fault, extra_args=short)
                 for fault in FEATURE_FAULTS})
    with ReferenceBackend().launched_many(list(opts.values())) as servers:
        _STARTED["feature_reference_servers"] = servers
        yield dict(zip(opts, servers, strict=True))


# --- the schedule: vLLM first, reference servers after, each server stopped after its last test ---
REFERENCE_GROUPS = ("reference_servers", "sampling_reference_servers", "feature_reference_servers",
                    "reference_ngram_server")
_STARTED: dict[str, list] = {}  # a vLLM server's name or a reference group: its started servers
_LAST_USER: dict[str, str] = {}  # the same keys: node id of the last test that uses them


def servers_used(fixturenames: Iterable[str]) -> set[str]:
    """The session servers a test uses: vLLM server names and reference groups. (The fixture
    closure holds ``vllm_servers`` for every test of a vLLM server: only the named fixtures tell
    which servers; no test asks for ``vllm_servers`` itself.)"""
    names = set(fixturenames)
    return {FIXTURES[n] for n in names if n in FIXTURES} | {g for g in REFERENCE_GROUPS if g in names}


def schedule_rank(used: set[str]) -> int:
    """0: vLLM servers only; 1: vLLM and reference servers; 2: reference servers only; 3: none of
    the shared servers (a test that starts its own runs when the shared ones are stopped)."""
    ref = bool(used & set(REFERENCE_GROUPS))
    vllm = bool(used - set(REFERENCE_GROUPS))
    return 1 if ref and vllm else 2 if ref else 0 if vllm else 3


MAIN_PAIR = {"off_fp32", "ngram_fp32"}  # the vLLM servers most tests use; the others have a test or two each
EXTRA_VLLM = set(SERVERS) - MAIN_PAIR


def run_order(item) -> tuple[int, float, int]:
    """The tests marked ``timed`` first, those that start their own servers before the others (nothing shared is
    up yet, so nothing else runs on the machine); then the others by schedule_rank, with a test that may stop its
    shared servers (marked ends_servers) moved after every other test of its rank and of the next (so after the
    tests that use the same vLLM servers with reference ones). Among the untimed tests of a rank, those of a vLLM
    server outside MAIN_PAIR come first, so that those servers are stopped early (ROOM_ENV)."""
    used = servers_used(getattr(item, "fixturenames", ()))
    rank = schedule_rank(used)
    if item.get_closest_marker("timed"):
        return 0, (-1 if rank == 3 else rank), 0
    late = rank + 1.5 if item.get_closest_marker("ends_servers") and rank < 2 else rank
    return 1, late, 0 if used & EXTRA_VLLM else 1  # the few users of the other vLLM servers first: they stop early


# --- sessions, when asked: the vLLM tests one at a time, then two sessions of reference-server tests side by side ---
PHASE_ENV = "SPECADAPT_LIVE_PHASE"
"""``vllm``: this session keeps every test of this directory but those of the reference phases;
``reference`` and ``features``: only those of that phase (the Makefile runs the two side by side).
Unset: every test, one at a time."""
PHASES = ("vllm", "reference", "features")
QUIET_ENV = "SPECADAPT_QUIET_DONE"
"""A file to create once the session's tests marked ``timed`` (which run first, see run_order) have finished, or at
once when it has none: the Makefile starts the tests that may run beside the rest of this session when it appears.
Until then nothing else runs on the machine."""
_LAST_TIMED: list[str] = []  # node id of the session's last timed test (none: the file is created at collection)
ROOM_ENV = "SPECADAPT_ROOM_DONE"
"""A file to create once the vLLM servers outside MAIN_PAIR are stopped (after the last test that uses one): from
then on this session holds two vLLM servers at most, and the Makefile starts the reference sessions beside it."""
_LAST_EXTRA: list[str] = []  # node id of the last test that uses a vLLM server outside MAIN_PAIR


def live_phase(item) -> str:
    """``features`` or ``reference`` for a test that uses reference servers only and measures no time
    (not marked ``timed``): nothing it asserts rests on a quiet machine, so the two groups may run side
    by side, each in its own session with its own shared servers (``features``: the tests of
    ``feature_reference_servers``; ``reference``: the others); ``vllm`` for every other test here."""
    names = getattr(item, "fixturenames", ())
    if schedule_rank(servers_used(names)) != 2 or item.get_closest_marker("timed"):
        return "vllm"
    return "features" if "feature_reference_servers" in names else "reference"


def _select_phase(config, items, here: Path) -> None:
    phase = os.environ.get(PHASE_ENV)
    if not phase:
        return
    if phase not in PHASES:
        raise pytest.UsageError(f"{PHASE_ENV}={phase!r}: use one of {', '.join(PHASES)} (or leave it unset)")
    kept = [i for i in items if not i.path.is_relative_to(here) or live_phase(i) == phase]
    dropped = [i for i in items if i not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_collection_modifyitems(session, config, items):
    here = Path(__file__).parent
    _select_phase(config, items, here)
    mine = [i for i, item in enumerate(items) if item.path.is_relative_to(here)]
    if not mine:
        return
    ordered = sorted((items[i] for i in mine), key=run_order)
    for slot, item in zip(mine, ordered, strict=True):  # the other directories keep their places
        items[slot] = item
    _LAST_USER.clear()
    for item in items:
        for key in servers_used(getattr(item, "fixturenames", ())):
            _LAST_USER[key] = item.nodeid
    _LAST_TIMED[:] = [item.nodeid for item in items if item.get_closest_marker("timed")][-1:]
    _LAST_EXTRA[:] = [i.nodeid for i in items if servers_used(getattr(i, "fixturenames", ())) & EXTRA_VLLM][-1:]
    if not _LAST_TIMED:
        _signal(QUIET_ENV)
    if not _LAST_EXTRA:
        _signal(ROOM_ENV)


def _signal(env: str) -> None:
    if os.environ.get(env):
        Path(os.environ[env]).touch()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    for key, last in _LAST_USER.items():
        if last == item.nodeid:
            for server in _STARTED.pop(key, []):
                server.process.stop()  # the fixture's own exit stops it again: a no-op by then
    if item.nodeid in _LAST_TIMED:
        _signal(QUIET_ENV)
    if item.nodeid in _LAST_EXTRA:
        _signal(ROOM_ENV)


def pytest_sessionfinish(session, exitstatus):
    for env in (QUIET_ENV, ROOM_ENV):  # a session stopped early (-x, a crash of the collection) frees the rest too
        _signal(env)
