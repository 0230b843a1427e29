#!/usr/bin/env bash
# One prepared GPU check (one CUDA GPU, no network, < 8 minutes): random LLaDA2.0-mini-sized
# checkpoint, full residency vs oled/lru offloading at 40 and 100 slots, identical tokens, figures;
# then the live prefetch path on CUDA (oled vs oled+previous, tokens identical to residency) and
# the same toy run on the emulated device, for the emulated-vs-CUDA comparison (each ~1 minute).
# Written by reading: it has not been run on a GPU yet.
# Usage: eval/gpu_check.sh [--model DIR] [extra eval/gpu_check.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
"$PY" eval/gpu_check.py --device cuda "$@"
TOY=oled_hf/toy/long/checkpoint
for dev in cuda emulated; do
  echo "== prefetch path, --device $dev (exit 1: tokens differ from full residency)"
  timeout 150 "$PY" -m oled_hf.cli.main benchmark --model "$TOY" --device "$dev" --system oled oled+previous \
    --cache-ratio 0.4 --gen-length 64 --runs 1 --warmup-runs 1 --quiet --json \
    | "$PY" -c "import json,sys; r=json.load(sys.stdin); [print(x['config'], 'tpot_ms', round(x['tpot_ms'], 3), 'same_tokens', x['same_tokens'], 'replay_tpot_s', x.get('replay_tpot_s')) for x in r['rows']]"
done
