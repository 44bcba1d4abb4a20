#!/usr/bin/env bash
# The main job on the embedded default: a local vLLM (CPU build) with the embedded
# SmolLM2-135M, speculative decoding off, then ngram k=4, the same prompts, and a report.
# Usage: scripts/demo.sh PYTHON OUTDIR
set -euo pipefail
PY=${1:-.venv/bin/python}
OUT=${2:-out}
mkdir -p "$OUT"
NGRAM='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
echo "== spec off ==" >&2
"$PY" -m specadapt probe --dtype bfloat16 --max-tokens 128 --json "$OUT/probe-off.json"
echo "== spec on: ngram k=4 ==" >&2
"$PY" -m specadapt probe --dtype bfloat16 --max-tokens 128 --spec-config "$NGRAM" --json "$OUT/probe-ngram.json"
echo "== side by side ==" >&2
"$PY" -m specadapt report compare "$OUT/probe-off.json" "$OUT/probe-ngram.json"
echo "reports: $OUT/probe-off.json $OUT/probe-ngram.json" >&2
