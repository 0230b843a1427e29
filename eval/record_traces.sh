#!/usr/bin/env bash
# Record every trace `oled-moe report` reads (CPU, offline; ~10 minutes on 2 busy cores).
#   eval/record_traces.sh OUT [LONG_MODEL]
# Held-out traces (the report's input) use held-out prompts; dev traces (policy tuning only) use
# training prompts. LONG_MODEL, when given (issue 10's long-answer model, oled_hf/toy/long/checkpoint),
# adds its traces at block 8/16/32 and batch 1/2/4/8 (held-out) and at block 16/32 on training
# prompts (dev). The toy addition model and the random-weight `small` preset are recorded too; the
# synthetic trace has LLaDA2.0-mini's shape (19 x 256, top-8).
# LONG_ONLY=1 records only the long-answer model's traces; LONG_N (default 10) is problems per task;
# LONG_SPLITS (default "held-out dev") which splits it records; LONG_LABEL (default "long") names its
# traces (LABEL-b16-bs1.trace, ...): "deep" for the 8-MoE-layer model; LONG_EXTRA=0 skips its block-8
# and batch 2/4/8 traces (only block 16 and 32 at batch 1).
set -euo pipefail
OUT=${1:?usage: eval/record_traces.sh OUT [LONG_MODEL]}
LONG=${2:-}
LONG_N=${LONG_N:-10}
MOE="${OLED_MOE:-.venv/bin/oled-moe}"
mkdir -p "$OUT/held-out" "$OUT/dev"
# Say what is done as it goes: one line before each trace (which, from what, how many prompts) and
# one after (seconds taken). `trace record` prints its own result line, and a per-prompt bar when
# stderr is a terminal (none in a log; transformers' "Loading weights" bars are off there too).
# A failing record stops the script (set -e): a missing trace would only surface in the report.
SPLITS=${LONG_SPLITS:-held-out dev}
LABEL=${LONG_LABEL:-long}
TOTAL=0
[ -z "${LONG_ONLY:-}" ] && TOTAL=15  # 13 recorded + 2 synthetic
EXTRA=${LONG_EXTRA:-1}
[ -n "$LONG" ] && TOTAL=$((TOTAL + 2 * $(wc -w <<< "$SPLITS") + 4 * (EXTRA != 0)))
N=0
START=$SECONDS
stage() { N=$((N + 1)); echo "[$N/$TOTAL, $(( SECONDS - START )) s] $*"; }
elapsed() { echo "    took $(( SECONDS - $1 )) s (all so far: $(( SECONDS - START )) s)"; }
count() {  # prompts a record uses: the file's lines, at most --limit
  local prompts="" limit="" prev=""
  for a in "$@"; do
    case $prev in --prompts) prompts=$a ;; --limit) limit=$a ;; esac
    prev=$a
  done
  local n; n=$(wc -l < "$prompts")
  [ -n "$limit" ] && [ "$limit" -lt "$n" ] && n=$limit
  echo "$n"
}
rec() {
  local out="" model="" bs=1 block="" prev=""
  for a in "$@"; do
    case $prev in --out) out=$a ;; --model) model=$a ;; --batch-size) bs=$a ;; --block-length) block=$a ;; esac
    prev=$a
  done
  stage "recording ${out#"$OUT"/}: $(count "$@") prompts through $model, block $block, batch $bs"
  local t0=$SECONDS
  "$MOE" trace record --threads 1 "$@"
  elapsed "$t0"
}
synth() {
  local t0=$SECONDS
  stage "synthesising ${2#"$OUT"/} (LLaDA2.0-mini's shape, no model run)"
  "$MOE" trace synth "$@"
  elapsed "$t0"
}
echo "recording $TOTAL traces into $OUT (${LONG:+with the long model $LONG, }CPU, one thread each)"
TOY=oled_hf/toy/checkpoint
if [ -z "${LONG_ONLY:-}" ]; then
if [ ! -d "$OUT/small" ]; then
  echo "writing the random-weight small checkpoint to $OUT/small"
  "$MOE" make-tiny "$OUT/small" --preset small --seed 0
fi
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
synth --out "$OUT/held-out/synthetic-mini-b32-bs1.trace" --block-length 32 --seed 1 --overwrite
synth --out "$OUT/dev/synthetic-mini-b32-bs1.trace" --block-length 32 --seed 2 --overwrite
fi
if [ -n "$LONG" ]; then
  # LONG_N problems per task of the checkpoint's mix, interleaved (held-out: the report; dev: tuning only)
  for SPLIT in $SPLITS; do
    echo "choosing $LONG_N $SPLIT problems per task of $LONG's mix -> $OUT/$LABEL-$SPLIT-prompts.txt"
    "${PYTHON:-.venv/bin/python}" -c "import sys; from oled_hf.toy.long.traces import split_questions as q
print('\n'.join(q(sys.argv[1], int(sys.argv[3]), sys.argv[2])))" "$LONG" $SPLIT "$LONG_N" > "$OUT/$LABEL-$SPLIT-prompts.txt"
    for B in 16 32; do
      rec --model "$LONG" --prompts "$OUT/$LABEL-$SPLIT-prompts.txt" --block-length $B --steps $B \
          --max-new-tokens 128 --out "$OUT/$SPLIT/$LABEL-b$B-bs1.trace"
    done
  done
  if [ "$EXTRA" != 0 ]; then
  rec --model "$LONG" --prompts "$OUT/$LABEL-held-out-prompts.txt" --block-length 8 --steps 8 \
      --max-new-tokens 128 --out "$OUT/held-out/$LABEL-b8-bs1.trace"
  for BS in 2 4 8; do
    rec --model "$LONG" --prompts "$OUT/$LABEL-held-out-prompts.txt" --block-length 16 --steps 16 \
        --max-new-tokens 128 --batch-size $BS --out "$OUT/held-out/$LABEL-b16-bs$BS.trace"
  done
  fi
fi
echo "recorded $N traces in $(( SECONDS - START )) s:"
ls -la "$OUT/held-out" "$OUT/dev"
