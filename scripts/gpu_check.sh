#!/usr/bin/env bash
# GPU check of the native reference engine (CUDA, torch + transformers, no network).
# Seeded random ~1B LLaMA-shaped target + 2-layer draft in bf16: greedy identity,
# target-only vs speculative tokens/s, verify-pass time; then batches of 1, 4 and 8
# different prompts (generate_batch): tokens/s and spec/off per batch size, rows identical
# to the same prompt alone (top-2 margin where not). Finishes in well under 8 minutes.
#   scripts/gpu_check.sh [NEW_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())"
timeout 420 "$PY" scripts/gpu_check.py "${1:-128}"
