#!/usr/bin/env bash
# The main job on the embedded default: a local vLLM (CPU build) with the embedded
# SmolLM2-135M, speculative decoding off and ngram k=4 side by side, the built-in prompts
# interleaved, and a report (JSON, JUnit, Markdown, HTML) in OUTDIR.
# Usage: scripts/demo.sh PYTHON OUTDIR
set -euo pipefail
PY=${1:-.venv/bin/python}
OUT=${2:-out}
NGRAM='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}'
"$PY" -m specadapt compare --spec-config "$NGRAM" --dtype bfloat16 --repeat 2 --max-tokens 128 \
    --reference "$("$PY" -m specadapt models path)" --out "$OUT"
echo "open $OUT/report.html for the plots; $OUT/summary.md is the short version" >&2
