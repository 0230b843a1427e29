#!/usr/bin/env bash
# Record every trace `oled-moe report` reads (CPU, offline; ~10 minutes on 2 busy cores).
#   eval/record_traces.sh OUT [LONG_MODEL]
# Held-out traces (the report's input) use held-out prompts; dev traces (policy tuning only) use
# training prompts. LONG_MODEL, when given (issue 10's long-answer model), adds its traces at block
# 16/32 and batch 1/2/4/8. The toy addition model and the random-weight `small` preset are what
# exists today; the synthetic trace has LLaDA2.0-mini's shape (19 x 256, top-8).
set -euo pipefail
OUT=${1:?usage: eval/record_traces.sh OUT [LONG_MODEL]}
LONG=${2:-}
MOE="${OLED_MOE:-.venv/bin/oled-moe}"
mkdir -p "$OUT/held-out" "$OUT/dev"
rec() { "$MOE" trace record --threads 1 "$@" 2>&1 | grep -v "Loading weights" || true; }
TOY=oled_hf/toy/checkpoint
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
if [ -n "$LONG" ]; then
  for B in 16 32; do
    rec --model "$LONG" --prompts "${LONG_HELD_OUT:-$LONG/held_out_prompts.txt}" --block-length $B \
        --max-new-tokens 128 --out "$OUT/held-out/long-b$B-bs1.trace"
  done
fi
ls -la "$OUT/held-out" "$OUT/dev"
