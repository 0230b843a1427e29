#!/usr/bin/env bash
# Record every trace `oled-moe report` reads (CPU, offline; ~10 minutes on 2 busy cores).
#   eval/record_traces.sh OUT [LONG_MODEL]
# Held-out traces (the report's input) use held-out prompts; dev traces (policy tuning only) use
# training prompts. LONG_MODEL, when given (issue 10's long-answer model, oled_hf/toy/long/checkpoint),
# adds its traces at block 8/16/32 and batch 1/2/4/8 (held-out) and at block 16/32 on training
# prompts (dev). The toy addition model and the random-weight `small` preset are recorded too; the
# synthetic trace has LLaDA2.0-mini's shape (19 x 256, top-8).
# LONG_ONLY=1 records only the long-answer model's traces; LONG_N (default 10) is problems per task;
# LONG_SPLITS (default "held-out dev") which splits it records.
set -euo pipefail
OUT=${1:?usage: eval/record_traces.sh OUT [LONG_MODEL]}
LONG=${2:-}
LONG_N=${LONG_N:-10}
MOE="${OLED_MOE:-.venv/bin/oled-moe}"
mkdir -p "$OUT/held-out" "$OUT/dev"
rec() { "$MOE" trace record --threads 1 "$@" 2>&1 | grep -v "Loading weights" || true; }
TOY=oled_hf/toy/checkpoint
if [ -z "${LONG_ONLY:-}" ]; then
[ -d "$OUT/small" ] || "$MOE" make-tiny "$OUT/small" --preset small --seed 0
head -n 6 eval/prompts.txt > "$OUT/dev-prompts.txt"
tail -n 6 eval/prompts.txt > "$OUT/held-out-prompts.txt"
for B in 8 16 32; do
  rec --model $TOY --prompts oled_hf/toy/jsonl/test.jsonl --limit 64 --block-length $B --max-new-tokens 32 \
      --out "$OUT/held-out/toy-b$B-bs1.trace"
  rec --model "$OUT/small" --prompts "$OUT/held-out-prompts.txt" --block-length $B --max-new-tokens 64 \
      --out "$OUT/held-out/small-b$B-bs1.trace"
done
for BS in 2 4 8; do
  rec --model $TOY --prompts oled_hf/toy/jsonl/test.jsonl --limit 64 --block-length 32 --max-new-tokens 32 \
      --batch-size $BS --out "$OUT/held-out/toy-b32-bs$BS.trace"
done
for B in 16 32; do
  rec --model $TOY --prompts oled_hf/toy/jsonl/train.jsonl --limit 64 --block-length $B --max-new-tokens 32 \
      --out "$OUT/dev/toy-b$B-bs1.trace"
  rec --model "$OUT/small" --prompts "$OUT/dev-prompts.txt" --block-length $B --max-new-tokens 64 \
      --out "$OUT/dev/small-b$B-bs1.trace"
done
"$MOE" trace synth --out "$OUT/held-out/synthetic-mini-b32-bs1.trace" --block-length 32 --seed 1
"$MOE" trace synth --out "$OUT/dev/synthetic-mini-b32-bs1.trace" --block-length 32 --seed 2
fi
if [ -n "$LONG" ]; then
  # LONG_N problems per task of the checkpoint's mix, interleaved (held-out: the report; dev: tuning only)
  for SPLIT in ${LONG_SPLITS:-held-out dev}; do
    "${PYTHON:-.venv/bin/python}" -c "import sys; from oled_hf.toy.long.traces import split_questions as q
print('\n'.join(q(sys.argv[1], int(sys.argv[3]), sys.argv[2])))" "$LONG" $SPLIT "$LONG_N" > "$OUT/long-$SPLIT-prompts.txt"
    for B in 16 32; do
      rec --model "$LONG" --prompts "$OUT/long-$SPLIT-prompts.txt" --block-length $B --steps $B \
          --max-new-tokens 128 --out "$OUT/$SPLIT/long-b$B-bs1.trace"
    done
  done
  rec --model "$LONG" --prompts "$OUT/long-held-out-prompts.txt" --block-length 8 --steps 8 \
      --max-new-tokens 128 --out "$OUT/held-out/long-b8-bs1.trace"
  for BS in 2 4 8; do
    rec --model "$LONG" --prompts "$OUT/long-held-out-prompts.txt" --block-length 16 --steps 16 \
        --max-new-tokens 128 --batch-size $BS --out "$OUT/held-out/long-b16-bs$BS.trace"
  done
fi
ls -la "$OUT/held-out" "$OUT/dev"
