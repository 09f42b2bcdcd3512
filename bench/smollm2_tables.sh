#!/bin/bash
# Issue 57's tables on SmolLM2-135M (L_tr 8,192): the exact commands that wrote assets/results/smollm2-*.csv,
# cheapest first. Every command resumes (--resume skips finished cells), so this can be stopped and run again;
# it runs niced, so other work on the machine goes first. docs/real-llm.md says what each table holds.
#   bash bench/smollm2_tables.sh > smollm2-tables.log 2>&1 &
# Started in a session of its own (setsid, nohup under some shells), Linux's autogroup scheduler gives it a whole
# share whatever its nice: then also `echo 19 > /proc/<its pid>/autogroup` (each of its python processes).
# At 1x L_tr every method but Algorithm 1 is the model's own pass, and Algorithm 1 there is tau = 1: the cells
# share one pass per document (seconds 0 in their rows). 2x cells are ~3.5 min a document on the 2-core AVX2 CPU.
cd "$(dirname "$0")/.."
M=smollm2-135m
P=assets/results/smollm2-perplexity.csv
K=assets/results/smollm2-passkey.csv
R="nice -n 19 python -m core"
PP="--model $M --sequences 3 --samples 2 --batch-size 1 --out $P --resume"
# pass key: 5 depths x 1 seed first (5 documents a cell), then the second seed (10 a cell) (2026-11-29 the second seed ran
# depth by depth, 0.5, 0.9, 0.1, 0.7, 0.3, across the five cells, with --depths D: the same rows, another order)
K1="--model $M --task passkey --depths 0.1,0.3,0.5,0.7,0.9 --samples 1 --out $K --resume"
K2="--model $M --task passkey --depths 0.1,0.3,0.5,0.7,0.9 --samples 2 --out $K --resume"
step() { echo "=== $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg): $*"; "$@"; echo "=== rc $? at $(date -u +%H:%M:%S)"; }
# 1x L_tr: one pass per document for all six methods (they share it; Qwen's log-n by position, log-n-rows, moves the
# answer's rows past L_tr, so its pass-key cells at 1x run their own passes)
step $R perplexity $PP --lengths 1x --methods none,log-length,pmax
step $R perplexity $PP --lengths 1x --methods none,log-n-rows --schemes yarn-rope
step $R perplexity $PP --lengths 1x --methods none --schemes dynamic-ntk
step $R sweep $K2 --lengths 1x --methods none --schemes none,yarn-rope,dynamic-ntk
step $R sweep $K2 --lengths 1x --methods log-length,pmax
step $R sweep $K2 --lengths 1x --methods log-n-rows --schemes yarn-rope
# 2x L_tr: the six methods' perplexity, then pass key 5 documents a cell for all, then 10; Algorithm 1 last (its
# calibration at 2x is ~20 prefills of 16k tokens)
step $R perplexity $PP --lengths 2x --methods none,log-length
step $R perplexity $PP --lengths 2x --methods none,log-n-rows --schemes yarn-rope
step $R perplexity $PP --lengths 2x --methods none --schemes dynamic-ntk
# a second cell re-run on other sequences (100-102; the first re-run, at 0.5x and 1x, is the same command's rows)
step $R perplexity --model $M --sequences 3 --samples 2 --batch-size 1 --seed 100 --lengths 2x --methods none \
  --out assets/results/smollm2-perplexity-rerun.csv --resume
# dispersion of the question's rows at 2x under log-length's tau (tau = 1's rows at 0.5x, 1x, 2x are there)
step nice -n 19 python bench/dispersion.py --model $M --multiples 2 --documents 2 --methods log-length \
  --out assets/results/smollm2-dispersion.csv --resume
step $R sweep $K1 --lengths 2x --methods none --schemes none,yarn-rope,dynamic-ntk
step $R sweep $K1 --lengths 2x --methods log-length
step $R sweep $K1 --lengths 2x --methods log-n-rows --schemes yarn-rope
step $R sweep $K2 --lengths 2x --methods none --schemes none,yarn-rope,dynamic-ntk
step $R sweep $K2 --lengths 2x --methods log-length
step $R sweep $K2 --lengths 2x --methods log-n-rows --schemes yarn-rope
# Algorithm 1 (Pmax) at 2x: calibrated on 1 language-modelling sequence (every row read, ~3.5 min a pass) and on 2
# pass-key documents (the question's rows), so that the two fit one session of this CPU
step $R perplexity $PP --lengths 2x --methods pmax --samples 1
step $R sweep $K2 --lengths 2x --methods pmax --calib-samples 2
# Llama 4's temperature tuning (a tau per query row past its floor scale, here L_tr): not shared at 1x
step $R perplexity $PP --lengths 1x,2x --methods llama4
# 0.5x L_tr for the other methods (all but Algorithm 1 share tau = 1's pass there)
step $R perplexity $PP --lengths 0.5x --methods none,log-length,pmax
step $R perplexity $PP --lengths 0.5x --methods none,log-n-rows --schemes yarn-rope
step $R perplexity $PP --lengths 0.5x --methods none --schemes dynamic-ntk
step $R sweep $K2 --lengths 0.5x --methods none --schemes none,yarn-rope,dynamic-ntk
step $R sweep $K2 --lengths 0.5x --methods log-length,pmax --calib-samples 2
step $R sweep $K2 --lengths 0.5x --methods log-n-rows --schemes yarn-rope
echo "=== all done $(date -u +%H:%M:%S)"
