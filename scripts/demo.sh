#!/usr/bin/env bash
# The main job on the embedded default: `specadapt demo` starts three local vLLM (CPU build)
# servers of the embedded SmolLM2-135M side by side (speculation off; n-gram k=4, a draft
# that matches input-grounded prompts; a draft model cut to the target's first 8 layers, a
# draft that matches badly), compares each spec-on server with the spec-off one on the same
# prompts, and writes one report (JSON, JUnit, Markdown, HTML) in OUTDIR.
# Usage: scripts/demo.sh PYTHON OUTDIR
set -euo pipefail
PY=${1:-.venv/bin/python}
OUT=${2:-out}
"$PY" -m specadapt demo --out "$OUT"
echo "open $OUT/report.html for the plots; $OUT/summary.md is the short version" >&2
