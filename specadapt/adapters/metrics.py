"""Prometheus text exposition -> summed samples, with prometheus_client's own parser."""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from specadapt.errors import NotAServer
from specadapt.records.watch import HistogramState


def parse_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``{sample_name: [(labels, value), ...]}`` for every sample in ``text``.

    Sample names keep their suffixes (``_total``, ``_bucket``, ...). Raises NotAServer if
    the text is not Prometheus exposition.
    """
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[sample.name].append((dict(sample.labels), float(sample.value)))
    except (ValueError, TypeError, IndexError) as exc:
        raise NotAServer(f"/metrics is not Prometheus text ({exc})") from exc
    return dict(out)


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    """Sum of ``name`` over all label sets, or None when absent."""
    rows = samples.get(name)
    if not rows:
        return None
    return sum(v for _labels, v in rows)


def by_label(samples: dict[str, list[tuple[dict[str, str], float]]], name: str,
             label: str) -> dict[str, float]:
    """``{label_value: sum}`` of ``name`` grouped by one label (others summed away)."""
    grouped: dict[str, float] = defaultdict(float)
    for labels, value in samples.get(name, []):
        if label in labels:
            grouped[labels[label]] += value
    return dict(grouped)


def histogram_state(samples: dict[str, list[tuple[dict[str, str], float]]], *names: str) -> HistogramState | None:
    """The running sum and count of the first histogram of ``names`` present (label sets summed)."""
    for name in names:
        s, n = total(samples, name + "_sum"), total(samples, name + "_count")
        if s is not None and n is not None:
            return HistogramState(sum=s, count=n)
    return None
