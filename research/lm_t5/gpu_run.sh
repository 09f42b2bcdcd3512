#!/usr/bin/env bash
# Train the two lm-t5 candidates (research/lm_t5/{supervised,curriculum}.json) at once on one GPU, then
# measure held-out perplexity with and without an earlier copy (1x and 8x L_tr first, more while time lasts).
#
#   bash research/lm_t5/gpu_run.sh            # from the repository root; $OUT: an empty folder that comes back
#
# Why this shape: the GPU is lent for one call of about 7 minutes. Each variant trains in its own process
# (the tiny model leaves the GPU mostly idle, so two share it well), bounded twice: the trainer's own
# max_minutes (it stops, evaluates and saves as usual, its card saying how far it got) and `timeout` (a hard
# kill; the last periodic save stays). One variant failing does not stop the other. Everything lands in $OUT
# as at most 8 files (the device's limit on what comes back): three logs, two model tars, the perplexity
# table (text), its rows (JSON and CSV).
#
# Knobs (environment): TRAIN_MINUTES (3.8), STEPS (3000), WORKERS (6 data processes per variant),
# TOTAL_S (380: the evaluation's budget ends here, counted from the script's start), SEQUENCES (200),
# PHASES (6: how many of evaluate.py's phases at most), DEVICE (cuda), VARIANTS, EVAL_EVERY (1000), WORK.
set -u
OUT=${OUT:?set OUT to an empty output folder}
TRAIN_MINUTES=${TRAIN_MINUTES:-3.8}
STEPS=${STEPS:-3000}
WORKERS=${WORKERS:-6}
TOTAL_S=${TOTAL_S:-380}
SEQUENCES=${SEQUENCES:-200}
PHASES=${PHASES:-6}
EVAL_EVERY=${EVAL_EVERY:-1000}
DEVICE=${DEVICE:-cuda}
VARIANTS=${VARIANTS:-"supervised curriculum"}
WORK=${WORK:-/tmp/lm_t5_run}
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=10 OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT" "$WORK"
# the hard limit: the trainer's own stop, plus start-up (data processes load the corpus), its final evaluation
# and the save
HARD_S=$(python -c "print(int(60 * $TRAIN_MINUTES + 75))")

echo "== $(date -u +%FT%TZ) lm-t5 GPU run: variants [$VARIANTS], steps $STEPS, max ${TRAIN_MINUTES} min (hard ${HARD_S} s), $WORKERS workers each"
python - <<'EOF' || true
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "(no GPU)")
EOF

declare -A PID
for v in $VARIANTS; do
  timeout -k 10 "$HARD_S" python -m core train --config "research/lm_t5/$v.json" \
      --tokenizer assets/models/retrieval-t5 --out "$WORK/$v" --stages-dir "$WORK/stages" \
      --steps "$STEPS" --max-minutes "$TRAIN_MINUTES" --workers "$WORKERS" --eval-every "$EVAL_EVERY" \
      --device "$DEVICE" >"$OUT/train_$v.log" 2>&1 &
  PID[$v]=$!
done
TRAINED=""
for v in $VARIANTS; do
  wait "${PID[$v]}"; rc=$?
  echo "train $v: exit $rc after ${SECONDS} s (124: killed by the hard limit)"
  if [ -f "$WORK/$v/model.safetensors" ]; then
    TRAINED="$TRAINED $WORK/$v"
    tar -C "$WORK" -cf "$OUT/$v.tar" "$v" || echo "tar $v failed"
    python - "$WORK/$v/card.json" <<'EOF' || echo "card of $v unreadable"
import json, sys
c = json.load(open(sys.argv[1]))
m = c.get("metrics", {})
steps, minutes = c.get("steps_done", 0), c.get("minutes", 0) or 1e-9
look = c.get("needle_attention_curve") or [None]
print(f"  {sys.argv[1].split('/')[-2]}: {steps} steps, {m.get('steps_per_second')} steps/s of training proper "
      f"({minutes:.2f} min with start-up and evaluations); {m.get('stopped', 'all steps done')}")
print(f"  loss (last window) {(c.get('loss_curve') or [None])[-1]}, copy attention loss {look[-1]}, "
      f"eval {json.dumps(m.get('accuracy', {}))}")
EOF
  else
    echo "  $v left no weights: see train_$v.log"
  fi
done

LEFT=$((TOTAL_S - SECONDS))
if [ -z "$TRAINED" ]; then
  echo "no model trained: nothing to evaluate"
elif [ "$LEFT" -lt 30 ]; then
  echo "only ${LEFT} s left: no evaluation"
else
  echo "== evaluation: ${LEFT} s left, ${SEQUENCES} sequences a cell (seeds from 0)"
  timeout -k 5 $((LEFT + 15)) python research/lm_t5/evaluate.py --models $TRAINED --out "$WORK/eval" \
      --sequences "$SEQUENCES" --budget-s $((LEFT - 25)) --device "$DEVICE" --phases "$PHASES" >"$OUT/eval.log" 2>&1
  echo "evaluate: exit $? after ${SECONDS} s"
  if [ -f "$WORK/eval/perplexity.txt" ]; then cp "$WORK/eval/perplexity.txt" "$OUT/perplexity.txt"; cat "$OUT/perplexity.txt"; fi
  if [ -f "$WORK/eval/perplexity.json" ]; then cp "$WORK/eval/perplexity.json" "$OUT/perplexity.json"; fi
  # the rows so far, also when the evaluation was cut short before its JSON
  python - "$WORK/eval" "$OUT/perplexity.csv" <<'EOF' || echo "no perplexity rows"
import sys
from pathlib import Path
import pandas as pd
parts = [pd.read_csv(p) for p in sorted(Path(sys.argv[1]).glob("*.csv"))]
if parts:
    pd.concat(parts).to_csv(sys.argv[2], index=False)
    print(f"{sum(map(len, parts))} perplexity rows in perplexity.csv")
EOF
  grep -E "phase|budget|rror" "$OUT/eval.log" | tail -n 20
fi
echo "== done after ${SECONDS} s; files: $(ls "$OUT" | tr '\n' ' ')"
