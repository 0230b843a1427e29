#!/usr/bin/env bash
# The prepared GPU check (one CUDA GPU, no network, under 8 minutes): eval/gpu_check.py's stages, each its own
# process with its own time limit, each writing its result file into $OUT as it ends, so a run cut short still
# returns what it did. The checkpoint has LLaDA2.0-mini's full width and $LAYERS layers (default 6: writing
# all 20, 30 GiB, and reading it into pinned memory for every row would not fit the minutes); it is kept in
# $CKPT for the next run. The report at the end fails loudly (exit 1) if any check failed or any stage wrote
# nothing. Written by reading: it has not been run on a GPU yet.
# Usage: eval/gpu_check.sh [extra eval/gpu_check.py flags, e.g. --cache-sizes 40 100]
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
LAYERS=${LAYERS:-6}
OUT=${OUT:-/tmp/oled_gpu_check-$(date +%Y%m%d-%H%M%S)}
CKPT=${CKPT:-/tmp/oled_gpu_check_ckpt-mini-${LAYERS}l}
BUDGET_S=${BUDGET_S:-470}  # the whole run, stages started only while their limit still fits
START=$SECONDS
"$PY" -c "import torch, sys; ok = torch.cuda.is_available(); print(torch.cuda.get_device_name() if ok else 'no CUDA device', file=sys.stdout if ok else sys.stderr); sys.exit(0 if ok else 2)" || exit 2
mkdir -p "$OUT"
echo "gpu_check: results in $OUT, checkpoint $CKPT"
COMMON=(--device cuda --model "$CKPT" --layers "$LAYERS" --out-dir "$OUT" --overwrite "$@")

stage() {  # stage LIMIT_S ARGS...: run one stage unless its limit no longer fits the budget
  local limit=$1; shift
  local left=$((BUDGET_S - (SECONDS - START)))
  if [ "$left" -lt "$limit" ]; then
    echo "gpu_check: skipped $* (${left} s left of ${BUDGET_S}, it may take ${limit})"
    return 0
  fi
  timeout --kill-after=10 "$limit" "$PY" eval/gpu_check.py "$@" "${COMMON[@]}"
  local rc=$?
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo "gpu_check: $* killed after ${limit} s (no result file)"
  return 0
}

stage 200 build
stage 120 resident
mapfile -t ROWS < <("$PY" eval/gpu_check.py --list-rows "$@")
for row in "${ROWS[@]}"; do
  stage 90 row --row "$row"
done
timeout 60 "$PY" eval/gpu_check.py report "${COMMON[@]}"
rc=$?
echo "gpu_check: $((SECONDS - START)) s in all, exit $rc"
exit $rc
