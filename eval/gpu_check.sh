#!/usr/bin/env bash
# One prepared GPU check (one CUDA GPU, no network, < 8 minutes): random LLaDA2.0-mini-sized
# checkpoint, full residency vs oled/lru offloading at 40 and 100 slots, identical tokens, figures.
# Usage: eval/gpu_check.sh [--model DIR] [extra eval/gpu_check.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
exec "$PY" eval/gpu_check.py --device cuda "$@"
