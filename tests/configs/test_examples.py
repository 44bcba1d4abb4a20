"""configs/ holds the generated examples; this fails when they are out of date."""

from __future__ import annotations

from specadapt.configs.examples import EXAMPLES, MULTINODE_EXAMPLES, stale_examples


def test_examples_are_up_to_date(repo_root):
    stale = stale_examples(repo_root / "configs")
    assert stale == [], ("out of date: " + ", ".join(stale) +
                         " -- regenerate with: python -m specadapt.configs.examples configs")


def test_examples_cover_the_required_set():
    assert set(EXAMPLES) == {"vllm-ngram", "vllm-eagle3", "vllm-draft-model", "trtllm-eagle3",
                             "trtllm-mtp", "trtllm-ngram"}
    assert set(MULTINODE_EXAMPLES) == {"multinode-vllm-eagle3", "multinode-trtllm-mtp"}


def test_docs_show_the_generated_examples(repo_root):
    docs = (repo_root / "docs" / "configs.md").read_text()
    for rel in ("vllm-ngram/serve.sh", "vllm-eagle3/vllm-config.yaml",
                "vllm-draft-model/speculative-config.json", "trtllm-eagle3/trtllm-config.yaml",
                "trtllm-eagle3/serve.sh", "trtllm-mtp/trtllm-config.yaml",
                "trtllm-ngram/trtllm-config.yaml"):
        text = (repo_root / "configs" / rel).read_text().rstrip("\n")
        assert text in docs, f"docs/configs.md is missing the current configs/{rel}"


def test_multinode_docs_show_the_generated_examples(repo_root):
    docs = (repo_root / "docs" / "multinode.md").read_text()
    for rel in ("multinode-vllm-eagle3/lws.yaml", "multinode-vllm-eagle3/probe-replicas.sh",
                "multinode-trtllm-mtp/sbatch.sh", "multinode-trtllm-mtp/trtllm-config.yaml"):
        text = (repo_root / "configs" / rel).read_text().rstrip("\n")
        assert text in docs, f"docs/multinode.md is missing the current configs/{rel}"
