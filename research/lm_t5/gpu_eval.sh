#!/usr/bin/env bash
# The second lm-t5 GPU evaluation: what the first run (gpu_run.sh) left out, on its two trained models.
#
#   MODELS=runs/lm_t5_gpu bash research/lm_t5/gpu_eval.sh      # from the repository root; $OUT: an empty folder
#
# $MODELS holds the first run's model folders (curriculum/, supervised/) and its perplexity.csv. It runs
# `research/lm_t5/evaluate.py --plan second`, three phases, each for every model (curriculum first) before the
# next: (1) per-layer and per-head Algorithm 1 (Pmax: the registry has no entropy variant of either) at 8x,
# (2) the 16x Pmax / entropy / YaRN cells the curriculum model missed (and supervised's one missing cell),
# (3) per-layer and per-head at 16x; with and without an earlier copy, 200 held-out sequences a cell (seeds
# from 0). Expect (1) and (2) inside the budget and (3) only partly: per-layer + per-head calibrate with ~280
# encoder passes a model and length. The first run's rows are read in (--resume-from), so its cells are not run again and the tables
# at the end hold both runs. Rows land in $OUT as each cell ends (curriculum.csv, supervised.csv), the tables
# (perplexity.txt / .json) and the resolved schedules (taus.json) after each phase: a run cut short keeps what
# it measured. Bounded twice: evaluate.py starts no new cell after BUDGET_S, `timeout` kills at HARD_S.
#
# Knobs (environment): SEQUENCES (200), BUDGET_S (115: no new cell after this, from evaluate.py's start),
# HARD_S (140), DEVICE (cuda), VARIANTS ("curriculum supervised"), PHASES (3), BATCH (16).
set -u
OUT=${OUT:?set OUT to an empty output folder}
MODELS=${MODELS:?set MODELS to the folder holding curriculum/ and supervised/ of the first run}
SEQUENCES=${SEQUENCES:-200}
BUDGET_S=${BUDGET_S:-115}
HARD_S=${HARD_S:-140}
DEVICE=${DEVICE:-cuda}
VARIANTS=${VARIANTS:-"curriculum supervised"}
PHASES=${PHASES:-3}
BATCH=${BATCH:-16}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"

DIRS=""
for v in $VARIANTS; do
  if [ -f "$MODELS/$v/model.safetensors" ]; then DIRS="$DIRS $MODELS/$v"; else echo "no model at $MODELS/$v"; fi
done
[ -n "$DIRS" ] || { echo "no model to evaluate"; exit 2; }
RESUME=()
if [ -f "$MODELS/perplexity.csv" ]; then RESUME=(--resume-from "$MODELS/perplexity.csv"); else echo "no $MODELS/perplexity.csv: every cell runs"; fi

echo "== $(date -u +%FT%TZ) lm-t5 second evaluation:$DIRS; $SEQUENCES sequences a cell, budget ${BUDGET_S} s, hard ${HARD_S} s"
timeout -k 5 "$HARD_S" python research/lm_t5/evaluate.py --models $DIRS --out "$OUT" --plan second \
    --phases "$PHASES" "${RESUME[@]}" --sequences "$SEQUENCES" --budget-s "$BUDGET_S" --device "$DEVICE" \
    --batch-size "$BATCH" >"$OUT/eval.log" 2>&1
rc=$?
echo "evaluate: exit $rc after ${SECONDS} s (124: killed by the hard limit; the rows so far are in $OUT/*.csv)"
grep -vE "Loading weights|^\s*$" "$OUT/eval.log" | grep -E "phase|budget|rows from|rror|Traceback" | tail -n 20
rm -f "$OUT"/*.lock
# the tables from every row written, also those of a phase the hard limit cut short (evaluate.py writes its
# tables only after a phase ends)
python - "$OUT" <<'EOF' || echo "no perplexity rows"
import sys
from pathlib import Path
import pandas as pd
sys.path.insert(0, "research/lm_t5")
from evaluate import report
out = Path(sys.argv[1])
parts = [pd.read_csv(p) for p in sorted(out.glob("*.csv")) if p.name != "perplexity.csv"]
if parts:
    df = pd.concat(parts)
    df.to_csv(out / "perplexity.csv", index=False)
    (out / "perplexity.txt").write_text(report(df) + "\n")
    print(f"{len(df)} rows ({(df['sequences'] < df['sequences'].max()).sum()} with fewer sequences than the rest)")
    print((out / "perplexity.txt").read_text())
EOF
python - "$OUT" <<'EOF' || true
import json, sys
from pathlib import Path
p = Path(sys.argv[1]) / "taus.json"
for r in json.loads(p.read_text()) if p.is_file() else []:
    sched = r.get("schedule")
    print(f"{r['model']:>10} {r['method']:>9} {r['tokens']:>5}: mean tau {r['mean_tau']:.3f}, reached {r.get('reached')}, "
          f"gap {r.get('gap')}" + (f", unreached heads {len(r['unreached_heads'])}" if "unreached_heads" in r else "")
          + (f"\n{'':>28}{json.dumps(sched)}" if sched is not None else ""))
EOF
echo "== done after ${SECONDS} s; files: $(ls "$OUT" | tr '\n' ' ')"
