#!/usr/bin/env bash
# Regenerate eval/report/ (the fair contest: every system composed of the same parts, tuned on the
# dev split, judged against the valid LP bound, sim/bounds/lp.py, in windows of 2 forwards) in one command:
#   eval/report/regenerate.sh [TRACES]      (default TRACES=traces)
# Headline traces: the 8-MoE-layer deep toy (recorded, held-out prompts, block 16 and 32), a
# synthetic workload at LLaDA2.0-mini's published figures (19 MoE layers x 256, block 32; seeds 1-5,
# reported as median [min-max] over the seeds; the LP bound on seed 1 only) and one at
# LLaDA2.0-flash's (31 MoE layers, timed at flash's expert size; one seed, 9 sequences to bound the
# LP's time); every assumed figure is printed with its source in the report (from
# `oled_hf/sim/synth_like.py`); then the 3-MoE-layer long toy's traces (block 8/16/32, batch 1/2/4/8).
# Missing traces are recorded first (CPU, one thread: ~3 min for the long toy, ~8 min for the deep
# one; ~1 min per synthetic trace), then everything is replayed
# (~25 min on one busy core). Every system is tuned on the deep toy's dev trace (training
# prompts). Section (j) adds the LP bound in windows of 8 forwards on the main trace (~10 min). Simulated times are deterministic: the figures do not depend on the machine (except
# section (g), measured host time).
set -euo pipefail
T=${1:-traces}
MOE="${OLED_MOE:-.venv/bin/oled-moe}"
PY="${PYTHON:-.venv/bin/python}"
H=$T/held-out
DEEP_MODEL=oled_hf/toy/deep/checkpoint
LONG_MODEL=oled_hf/toy/long/checkpoint
DEEP="$H/deep-b16-bs1.trace $H/deep-b32-bs1.trace"
LONG="$H/long-b16-bs1.trace $H/long-b32-bs1.trace $H/long-b8-bs1.trace $H/long-b16-bs2.trace $H/long-b16-bs4.trace $H/long-b16-bs8.trace"
MINI_SEEDS="11 12 13 14 15"  # not 1-2: those seeds are the dev split of the mini-like workload
MINI=""
for s in $MINI_SEEDS; do MINI="$MINI $H/mini-like-s$s.trace"; done
FLASH="$H/flash-like-s1.trace"
DEV=$T/dev/deep-b16-bs1.trace
for f in $LONG $T/dev/long-b16-bs1.trace; do
  if [ ! -f "$f" ]; then LONG_ONLY=1 eval/record_traces.sh "$T" $LONG_MODEL; break; fi
done
MAIN=deep-b16-bs1
if [ -f $DEEP_MODEL/config.json ]; then
  for f in $DEEP $DEV; do
    if [ ! -f "$f" ]; then LONG_ONLY=1 LONG_LABEL=deep LONG_EXTRA=0 eval/record_traces.sh "$T" $DEEP_MODEL; break; fi
  done
else  # a clone without the deep toy: the long toy's traces lead
  DEEP="" DEV=$T/dev/long-b16-bs1.trace MAIN=long-b16-bs1
fi
for s in $MINI_SEEDS; do  # 25 sequences each (trace synth --like's default: 1 warm-up + 24 timed)
  if [ ! -f "$H/mini-like-s$s.trace" ]; then
    "$MOE" trace synth --like llada2.0-mini --out "$H/mini-like-s$s.trace" --seed "$s"
  fi
done
if [ ! -f "$FLASH" ]; then  # 1 warm-up + 8 timed sequences: the LP bound at 31 layers is the slow part
  "$MOE" trace synth --like llada2.0-flash --out "$FLASH" --seed 1 --sequences 9
fi
# predictor quality on the headline recorded trace (section (i) links the figure)
"$PY" eval/predictor_quality.py --dev "$DEV" "$H/$MAIN.trace" --out eval/report/i_predictors.png \
    --overwrite > eval/report/i_predictors.txt
# shellcheck disable=SC2086
"$MOE" report $DEEP $MINI $FLASH $LONG --dev "$DEV" --main $MAIN --out eval/report --sizes 15 25 40 100 \
    --as-model llada2.0-mini --planner-us 20 --bracket-window 8 --overwrite
