"""Each side of a comparison on its own share of the machine (adapters/placement.py), the plans
that carry it (the process tree bound, vLLM's OpenMP binding), and what the report says of it."""

from __future__ import annotations

import os
import sys
import time

import pytest

from specadapt.adapters.placement import cpu_list, plan_placement, split_cpus, usable_cpus
from specadapt.adapters.plan import LaunchPlan, launch_record
from specadapt.adapters.process import ManagedProcess
from specadapt.adapters.reference import ReferenceBackend, ReferenceLaunch
from specadapt.adapters.vllm import OMP_BIND, VLLMBackend, VLLMLaunch
from specadapt.analysis.sides import launch_differences
from specadapt.errors import UsageError
from specadapt.orchestration.demo import ON_SERVERS
from specadapt.orchestration.servers import ServerOptions, ab_sides, off_and_on_halves, place_sides


@pytest.mark.parametrize(("cpus", "groups", "want"), [
    ([0, 1], 2, [[0], [1]]),
    ([0, 1, 2, 3, 4], 2, [[0, 1], [2, 3]]),  # the odd one left out: equal shares
    ([4, 2, 3, 5], 2, [[2, 3], [4, 5]]),
    ([0, 1, 2, 3], 1, [[0, 1, 2, 3]]),
    ([0], 2, None),
])
def test_split_cpus(cpus, groups, want):
    assert split_cpus(cpus, groups) == want


def test_split_cpus_needs_a_group():
    with pytest.raises(ValueError):
        split_cpus([0, 1], 0)


@pytest.mark.parametrize(("cpus", "text"), [([0], "0"), ([0, 1], "0-1"), ([0, 1, 2, 5], "0-2,5"),
                                            ([3, 5, 7], "3,5,7"), ([8, 9, 11, 12], "8-9,11-12")])
def test_cpu_list(cpus, text):
    assert cpu_list(cpus) == text
    assert cpu_list(list(reversed(cpus))) == text


def test_usable_cpus_is_this_process_mask():
    assert usable_cpus() == sorted(os.sched_getaffinity(0))


def test_two_sides_split_in_halves_and_said():
    p = plan_placement(["spec-off", "spec-on"], [0, 1, 2, 3])
    assert p.cpus == [[0, 1], [2, 3]] and p.gpus == [None, None] and p.refused is None and not p.shared
    assert p.lines == ["each side on its own share of the machine: spec-off on CPUs 0-1; spec-on on CPUs 2-3"]


def test_an_odd_cpu_is_left_unused_and_said():
    p = plan_placement(["spec-off", "spec-on"], [0, 1, 2])
    assert p.cpus == [[0], [1]]
    assert p.lines[0].endswith("(1 CPU left unused so that the shares are equal)")


def test_one_cpu_is_refused_with_what_to_do():
    p = plan_placement(["spec-off", "spec-on"], [0])
    assert p.refused.startswith("this machine gives specadapt 1 CPU: 2 servers side by side would share it")
    assert "--launch sequential" in p.refused and "--launch shared" in p.refused


def test_gpus_are_split_or_refused():
    p = plan_placement(["spec-off", "spec-on"], [0, 1, 2, 3], gpus=2)
    assert p.gpus == [[0], [1]] and "spec-off on CPUs 0-1, GPU 0; spec-on on CPUs 2-3, GPU 1" in p.lines[0]
    one = plan_placement(["spec-off", "spec-on"], [0, 1, 2, 3], gpus=1)
    assert one.refused.startswith("this machine has 1 GPU for 2 servers") and "--launch sequential" in one.refused
    theirs = plan_placement(["spec-off", "spec-on"], [0, 1], gpus=1, gpus_set_by_user=True)
    assert theirs.refused is None and theirs.gpus == [None, None]


def test_shared_binds_nothing_and_says_so():
    p = plan_placement(["spec-off", "spec-on"], [0, 1], gpus=1, shared=True)
    assert p.cpus == [None, None] and p.shared and p.refused is None
    assert p.lines == ["the spec-off and spec-on servers share this machine's 2 CPUs and 1 GPU (--launch shared): "
                       "each may stall the other's first token"]


def test_a_single_group_is_never_bound():
    p = plan_placement(["spec-on"], [0, 1])
    assert p.cpus == [None] and p.lines == [] and not p.shared


def test_demo_puts_spec_off_on_one_half_and_both_spec_on_servers_on_the_other():
    off, on, line = off_and_on_halves([0, 1], *ON_SERVERS)
    assert (off, on) == ([0], [1]) and "spec-off server runs on CPU 0, the two spec-on servers on CPU 1" in line
    off, on, line = off_and_on_halves([0], *ON_SERVERS)
    assert (off, on) == (None, None) and line.startswith("this machine gives specadapt 1 CPU: the servers share it")


# --- plans -----------------------------------------------------------------------------------
def vllm_plan(cpus):
    backend = VLLMBackend()
    opts = VLLMLaunch(model="/m", python=sys.executable, cpus=cpus)
    return backend.placed(backend.launch_plan(opts), opts)


def test_vllm_binds_its_openmp_threads_to_the_same_cpus(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    plan = vllm_plan([2, 3])
    assert plan.cpus == [2, 3] and plan.env[OMP_BIND] == "2-3" and plan.env["OMP_NUM_THREADS"] == "2"
    assert plan.per_server_env == [OMP_BIND]
    unbound = vllm_plan(None)
    assert unbound.cpus is None and OMP_BIND not in unbound.env and "OMP_NUM_THREADS" not in unbound.env


def test_the_users_omp_num_threads_is_kept(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert "OMP_NUM_THREADS" not in vllm_plan([0]).env  # inherited as it is


def test_gpus_become_cuda_visible_devices():
    backend = ReferenceBackend()
    opts = ReferenceLaunch(model="/m", gpus=[2, 3])
    plan = backend.placed(backend.launch_plan(opts), opts)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "2,3" and "CUDA_VISIBLE_DEVICES" in plan.per_server_env


def test_split_sides_differ_in_speculation_only():
    off, on = launch_record(vllm_plan([0])), launch_record(vllm_plan([1]))
    assert off.cpus == [0] and on.cpus == [1] and off.per_server_env == [OMP_BIND]
    assert launch_differences(off, on) == []


def test_unequal_or_one_sided_binding_is_a_difference():
    assert launch_differences(launch_record(vllm_plan([0])), launch_record(vllm_plan([1, 2]))) == [
        "environment OMP_NUM_THREADS: 1 on the spec-off side, 2 on the spec-on side",
        "CPUs: 1 CPU on the spec-off side, 2 CPUs on the spec-on side"]
    lines = launch_differences(launch_record(vllm_plan([0])), launch_record(vllm_plan(None)))
    assert "CPUs: 1 CPU on the spec-off side, every CPU (not bound) on the spec-on side" in lines


def test_a_started_process_tree_runs_on_its_cpus(tmp_path):
    """The bound server and the processes it starts run on the plan's CPUs only (real processes)."""
    cpu = [usable_cpus()[-1]]
    code = ("import os, subprocess, sys; print(sorted(os.sched_getaffinity(0)), "
            "subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'], "
            "capture_output=True, text=True).stdout.strip(), flush=True); import time; time.sleep(30)")
    plan = LaunchPlan(backend="t", argv=[sys.executable, "-c", code], port=1, spec_enabled=False, model="m", cpus=cpu)
    with ManagedProcess(plan, log_path=tmp_path / "log") as proc:
        deadline = time.monotonic() + 60  # until the child has printed what it runs on
        while not (text := (tmp_path / "log").read_text()).strip():
            assert time.monotonic() < deadline, "the child printed nothing within 60 s"
            time.sleep(0.05)
        assert text.strip() == f"{cpu} {cpu}"
        assert sorted(os.sched_getaffinity(proc.pid)) == cpu


# --- planning the sides ------------------------------------------------------------------------
def opts_pair():
    o = VLLMLaunch(model="/m", python=sys.executable)
    return [o, o.model_copy()]


def test_place_sides_binds_started_sides(monkeypatch):
    monkeypatch.setattr("specadapt.orchestration.servers.usable_cpus", lambda: [0, 1])
    said = []
    from specadapt.orchestration.servers import Messages
    launch = opts_pair()
    lines = place_sides(VLLMBackend(), ab_sides(), launch, "parallel", Messages(say=said.append, warn=said.append))
    assert [o.cpus for o in launch] == [[0], [1]]
    assert lines == said == ["each side on its own share of the machine: spec-off on CPU 0; spec-on on CPU 1"]


def test_place_sides_sequential_and_given_urls_bind_nothing(monkeypatch):
    monkeypatch.setattr("specadapt.orchestration.servers.usable_cpus", lambda: [0, 1])
    launch = opts_pair()
    assert place_sides(VLLMBackend(), ab_sides(), launch, "sequential") == [] and launch[0].cpus is None
    one = [None, VLLMLaunch(model="/m", python=sys.executable)]
    assert place_sides(VLLMBackend(), ab_sides("http://a", None), one, "parallel") == [] and one[1].cpus is None


def test_place_sides_on_one_cpu_is_a_usage_error(monkeypatch):
    monkeypatch.setattr("specadapt.orchestration.servers.usable_cpus", lambda: [0])
    with pytest.raises(UsageError, match="--launch sequential"):
        place_sides(VLLMBackend(), ab_sides(), opts_pair(), "parallel")
    launch = opts_pair()
    warned = []
    from specadapt.orchestration.servers import Messages
    place_sides(VLLMBackend(), ab_sides(), launch, "shared", Messages(warn=warned.append))
    assert [o.cpus for o in launch] == [None, None] and "(--launch shared)" in warned[0]


def test_server_options_default_is_unchanged():
    assert ServerOptions().backend == "vllm"


def test_tune_puts_the_spec_off_server_on_one_half_and_every_candidate_on_the_other(monkeypatch):
    from specadapt.orchestration.tune_run import place_tune

    monkeypatch.setattr("specadapt.orchestration.tune_run.usable_cpus", lambda: [0, 1, 2, 3])
    o = VLLMLaunch(model="/m", python=sys.executable)
    launches = {"off": o, "k=2": o.model_copy(), "k=4": o.model_copy()}
    assert place_tune(launches) == [2, 3]
    assert {k: v.cpus for k, v in launches.items()} == {"off": [0, 1], "k=2": [2, 3], "k=4": [2, 3]}
    given_off = {"k=2": o.model_copy()}
    assert place_tune(given_off) is None and given_off["k=2"].cpus is None
    monkeypatch.setattr("specadapt.orchestration.tune_run.usable_cpus", lambda: [0])
    one = {"off": o, "k=2": o.model_copy()}
    assert place_tune(one) is None and one["off"].cpus is None


@pytest.mark.parametrize(("args", "ranks"), [([], 1), (["--tensor-parallel-size", "2"], 2), (["-tp=2"], 2),
                                             (["--tensor-parallel-size=2", "--pipeline-parallel-size", "2"], 4),
                                             (["-tp", "x"], 1), (["--max-num-seqs", "4"], 1)])
def test_vllm_local_ranks_from_the_server_args(args, ranks):
    from specadapt.adapters.vllm import local_ranks

    assert local_ranks(args) == ranks


def test_vllm_binds_one_cpu_list_per_rank():
    backend = VLLMBackend()
    opts = VLLMLaunch(model="/m", python=sys.executable, cpus=[4, 5, 6, 7], extra_args=["--tensor-parallel-size=2"])
    assert backend.placed(backend.launch_plan(opts), opts).env[OMP_BIND] == "4-5|6-7"
    more = opts.model_copy(update={"extra_args": ["-tp", "8"]})  # more ranks than CPUs: one list, vLLM says why
    assert backend.placed(backend.launch_plan(more), more).env[OMP_BIND] == "4-7"


# --- the exact words, counts and plurals (mutation-tested) -------------------------------------
@pytest.mark.parametrize(("groups", "cpus", "gpus", "line"), [
    (2, 4, 4, "each side on its own share of the machine: g0 on CPUs 0-1, GPUs 0-1; g1 on CPUs 2-3, GPUs 2-3"),
    (3, 5, 0, "each side on its own share of the machine: g0 on CPU 0; g1 on CPU 1; g2 on CPU 2 "
              "(2 CPUs left unused so that the shares are equal)"),
    (2, 2, 0, "each side on its own share of the machine: g0 on CPU 0; g1 on CPU 1"),
])
def test_placement_lines(groups, cpus, gpus, line):
    p = plan_placement([f"g{i}" for i in range(groups)], list(range(cpus)), gpus=gpus)
    assert p.lines == [line] and len(p.cpus) == groups and p.refused is None


@pytest.mark.parametrize(("groups", "cpus", "gpus", "refused"), [
    (3, 2, 0, "this machine gives specadapt 2 CPUs: 3 servers side by side would share them and stall each other; "
              "use --launch sequential (one server at a time) or --launch shared (side by side anyway, flagged in "
              "the report)"),
    (3, 3, 2, "this machine has 2 GPUs for 3 servers: side by side they would share it and stall each other; use "
              "--launch sequential, or --launch shared to run them side by side anyway (flagged in the report)"),
])
def test_refusals_say_the_counts(groups, cpus, gpus, refused):
    p = plan_placement([f"g{i}" for i in range(groups)], list(range(cpus)), gpus=gpus)
    assert p.refused == refused and p.cpus == [None] * groups and p.gpus == [None] * groups and p.lines == []


def test_shared_lines_name_the_gpus_only_where_there_are_some():
    assert plan_placement(["a", "b"], [0, 1, 2], gpus=2, shared=True).lines == [
        "the a and b servers share this machine's 3 CPUs and 2 GPUs (--launch shared): each may stall the other's "
        "first token"]
    assert plan_placement(["a", "b"], [0, 1], shared=True).lines == [
        "the a and b servers share this machine's 2 CPUs (--launch shared): each may stall the other's first token"]


def test_bad_values_say_what_is_wrong():
    with pytest.raises(ValueError, match="groups must be at least 1, not 0"):
        split_cpus([0], 0)


def test_usable_cpus_without_an_affinity_call_counts_the_cpus(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert usable_cpus() == [0, 1, 2]
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert usable_cpus() == [0]
