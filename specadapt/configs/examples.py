"""The example deployments in the repository's configs/ directory, and their regeneration.

    python -m specadapt.configs.examples [DIR]        # rewrite them
    specadapt config examples [--check] [--out DIR]   # the same from the CLI
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from specadapt.configs import watch
from specadapt.configs.multinode import Topology, replica_urls
from specadapt.configs.render import MULTINODE_FORMATS, available_formats, write_multinode, write_outputs
from specadapt.configs.spec import SpecConfig

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
# name -> (backend, spec); public model ids the upstream docs use for these methods
EXAMPLES: dict[str, tuple[str, SpecConfig]] = {
    "vllm-ngram": ("vllm", SpecConfig(target=LLAMA, method="ngram", k=4, ngram_min=2,
                                      ngram_max=4)),
    "vllm-eagle3": ("vllm", SpecConfig(target=LLAMA, method="eagle3", k=3,
                                       draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")),
    "vllm-draft-model": ("vllm", SpecConfig(
        target="meta-llama/Llama-3.1-70B-Instruct", method="draft_model", k=4,
        draft="meta-llama/Llama-3.2-1B-Instruct", draft_tp=1, tp=4,
        k_per_batch_size=[(1, 16, 4), (17, 64, 2), (65, 256, 0)])),
    "trtllm-eagle3": ("trtllm", SpecConfig(target=LLAMA, method="eagle3", k=3,
                                           draft="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                           max_concurrency=32)),
    "trtllm-mtp": ("trtllm", SpecConfig(target="deepseek-ai/DeepSeek-R1", method="mtp", k=3,
                                        tp=8)),
    "trtllm-ngram": ("trtllm", SpecConfig(target=LLAMA, method="ngram", k=3, ngram_max=4,
                                          draft_len_schedule={4: 3, 16: 2, 64: 1})),
}

_LLAMA70 = SpecConfig(target="meta-llama/Llama-3.3-70B-Instruct", method="eagle3", k=3,
                      draft="yuhuili/EAGLE3-LLaMA3.3-Instruct-70B", tp=4)
_R1 = SpecConfig(target="/models/DeepSeek-R1", method="mtp", k=3, tp=16,
                 draft_len_schedule={1: 3, 16: 2, 64: 1})
# name -> (backend, spec, topology): deployments across nodes
MULTINODE_EXAMPLES: dict[str, tuple[str, SpecConfig, Topology]] = {
    "multinode-vllm-eagle3": ("vllm", _LLAMA70, Topology(nodes=2, gpus_per_node=4, pp=2,
                                                          replicas=2)),
    "multinode-trtllm-mtp": ("trtllm", _R1, Topology(nodes=2, gpus_per_node=8)),
}


# name -> example whose Kubernetes manifest gets the `specadapt watch` sidecar (config --watch)
WATCH_EXAMPLES: dict[str, str] = {"watch-vllm-eagle3": "vllm-eagle3"}
# `specadapt watch --emit`: rules, dashboard and one watcher pod for the multi-node replicas
WATCH_FLEET = ("watch-fleet", "multinode-vllm-eagle3")


def _fleet_urls() -> list[str]:
    name = WATCH_FLEET[1]
    backend, spec, topo = MULTINODE_EXAMPLES[name]
    return [f"{name}-{i}={url}" for i, url in enumerate(replica_urls(spec, topo, backend))]


def write_examples(root: Path) -> list[Path]:
    written = []
    for name, (backend, spec) in EXAMPLES.items():
        written += write_outputs(spec, backend, available_formats(spec, backend), root / name)
    for name, (backend, spec, topo) in MULTINODE_EXAMPLES.items():
        written += write_multinode(spec, backend, list(MULTINODE_FORMATS[backend]), root / name,
                                   topo)
    for name, source in WATCH_EXAMPLES.items():
        backend, spec = EXAMPLES[source]
        written += write_outputs(spec, backend, ["k8s"], root / name,
                                 watch_image=watch.DEFAULT_IMAGE)
    written += watch.write_watch_artifacts(root / WATCH_FLEET[0], _fleet_urls())
    return written


def stale_examples(root: Path) -> list[str]:
    """Files under ``root`` that differ from (or are missing versus) a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        write_examples(fresh)
        want = {p.relative_to(fresh): p.read_text() for p in fresh.rglob("*") if p.is_file()}
    have = {p.relative_to(root): p.read_text() for p in root.rglob("*")
            if p.is_file() and p.name != "README.md"} if root.is_dir() else {}
    names = sorted(set(want) | set(have))
    return [str(n) for n in names if want.get(n) != have.get(n)]


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "configs")
    for path in write_examples(target):
        print(path)
