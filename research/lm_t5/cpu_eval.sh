#!/usr/bin/env bash
# Per-layer and per-head Algorithm 1 at 8x on the CPU (after the second GPU evaluation failed for memory):
# curriculum first (1x tau = 1, then 8x per-layer, per-head, tau = 1), then supervised (1x, 8x per-layer) while
# the total time lasts. Sequences with an earlier copy only, seeds from 0; rows in $OUT/<model>.csv as each cell
# ends, schedules in $OUT/taus.json.
#
#   OUT=runs/lm_t5_cpu MODELS=runs/lm_t5_gpu bash research/lm_t5/cpu_eval.sh
#
# Knobs: SEQUENCES (48), TOTAL_S (1180: everything), CURRICULUM_BUDGET_S (600: no new curriculum cell after this).
set -u
OUT=${OUT:?set OUT}; MODELS=${MODELS:?set MODELS}
SEQUENCES=${SEQUENCES:-48}; TOTAL_S=${TOTAL_S:-1180}; CURRICULUM_BUDGET_S=${CURRICULUM_BUDGET_S:-600}
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT/curriculum" "$OUT/supervised"
echo "== $(date -u +%FT%TZ) curriculum"
timeout -k 5 $((TOTAL_S - 60)) nice -n 19 python research/lm_t5/evaluate.py --models "$MODELS/curriculum" \
    --out "$OUT/curriculum" --plan cpu --copies with --sequences "$SEQUENCES" --budget-s "$CURRICULUM_BUDGET_S" \
    --device cpu --batch-size 8 >"$OUT/curriculum/eval.log" 2>&1
echo "curriculum: exit $? after ${SECONDS} s"
LEFT=$((TOTAL_S - SECONDS))
if [ "$LEFT" -gt 60 ]; then
  echo "== $(date -u +%FT%TZ) supervised (${LEFT} s left)"
  timeout -k 5 "$LEFT" nice -n 19 python research/lm_t5/evaluate.py --models "$MODELS/supervised" \
      --out "$OUT/supervised" --plan cpu --phases 2 --copies with --sequences "$SEQUENCES" \
      --budget-s $((LEFT - 30)) --device cpu --batch-size 8 >"$OUT/supervised/eval.log" 2>&1
  echo "supervised: exit $? after ${SECONDS} s"
fi
echo "== $(date -u +%FT%TZ) done after ${SECONDS} s"
