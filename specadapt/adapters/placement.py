"""Where started servers run: each side of a comparison on its own CPUs (and GPUs), so that
neither disturbs the other.

Two servers started side by side on one machine share its cores unless told otherwise. vLLM's
CPU worker binds its OpenMP threads to cores it picks from the whole node, so two servers bind to
the same cores, and the request that follows the other server's request can wait for its first
token (docs/placement.md has the measurement). The cure is a split: each group of servers that run at the
same time gets its own share of the CPUs this process may use, the whole process tree bound to
it (``sched_setaffinity`` before exec, inherited by every child) and the backend told how many
threads to run there (vLLM: ``VLLM_CPU_OMP_THREADS_BIND``).

Pure functions decide the split (``split_cpus``, ``plan_placement``); ``usable_cpus`` and the
GPU list come from the machine. A split needs at least one CPU per group; on a GPU machine one
GPU per group. Where there is too little for a split, ``plan_placement`` says so and what to do
instead (``--launch sequential``), and ``shared`` starts the servers side by side anyway, said in
the report.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Placement", "cpu_list", "plan_placement", "split_cpus", "usable_cpus"]


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask: a container's or taskset's limit included)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: every CPU the OS counts
        return list(range(os.cpu_count() or 1))


def split_cpus(cpus: Sequence[int], groups: int) -> list[list[int]] | None:
    """``cpus`` cut into ``groups`` disjoint runs of equal length (consecutive CPUs together, the
    remainder left unused so that no group has more than another); None with fewer CPUs than groups."""
    if groups < 1:
        raise ValueError(f"groups must be at least 1, not {groups}")
    cpus = sorted(cpus)
    size = len(cpus) // groups
    if size == 0:
        return None
    return [cpus[i * size:(i + 1) * size] for i in range(groups)]


def cpu_list(cpus: Sequence[int]) -> str:
    """CPUs as Linux and vLLM write them: ranges of consecutive ones, e.g. [0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


@dataclass(frozen=True)
class Placement:
    """Per group of servers that run at the same time: its CPUs (None: not bound) and GPUs (None:
    not set); what was decided, in words; and ``refused``, a reason when no split is possible."""

    cpus: list[list[int] | None]
    gpus: list[list[int] | None]
    lines: list[str] = field(default_factory=list)
    refused: str | None = None
    shared: bool = False


def plan_placement(groups: Sequence[str], cpus: Sequence[int], gpus: int = 0, shared: bool = False,
                   gpus_set_by_user: bool = False) -> Placement:
    """How ``groups`` (their names, e.g. ['spec-off', 'spec-on']) that run at the same time share this
    machine: with ``shared`` all on every CPU (said, and flagged); else each group its own CPUs
    and, where there are ``gpus``, its own GPUs (unless the user's CUDA_VISIBLE_DEVICES decides).
    Too few CPUs or GPUs for one per group: ``refused`` says why and what to do."""
    n = len(groups)
    if n < 2 or shared:
        lines = [] if n < 2 else [f"the {' and '.join(groups)} servers share this machine's {len(cpus)} CPUs"
                                   + (f" and {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "")
                                   + " (--launch shared): each may stall the other's first token"]
        return Placement(cpus=[None] * n, gpus=[None] * n, lines=lines, shared=n >= 2)
    cpu_shares = split_cpus(cpus, n)
    if cpu_shares is None:
        return Placement(cpus=[None] * n, gpus=[None] * n, refused=(
            f"this machine gives specadapt {len(cpus)} CPU{'s' if len(cpus) != 1 else ''}: {n} servers side by side "
            f"would share {'it' if len(cpus) == 1 else 'them'} and stall each other; use --launch sequential (one "
            "server at a time) or --launch shared (side by side anyway, flagged in the report)"))
    gpu_shares: list[list[int] | None] = [None] * n
    lines = [f"{name} on CPU{'s' if len(share) > 1 else ''} {cpu_list(share)}"
             for name, share in zip(groups, cpu_shares, strict=True)]
    if gpus and not gpus_set_by_user:
        split = split_cpus(range(gpus), n)
        if split is None:
            return Placement(cpus=[None] * n, gpus=[None] * n, refused=(
                f"this machine has {gpus} GPU{'s' if gpus != 1 else ''} for {n} servers: side by side they would "
                "share it and stall each other; use --launch sequential, or --launch shared to run them side by "
                "side anyway (flagged in the report)"))
        gpu_shares = list(split)
        lines = [f"{line}, GPU{'s' if len(g) > 1 else ''} {cpu_list(g)}"
                 for line, g in zip(lines, split, strict=True)]
    unused = len(cpus) - sum(len(s) for s in cpu_shares)
    tail = f" ({unused} CPU{'s' if unused != 1 else ''} left unused so that the shares are equal)" if unused else ""
    return Placement(cpus=list(cpu_shares), gpus=gpu_shares,
                     lines=["each side on its own share of the machine: " + "; ".join(lines) + tail])
