"""Why one global tau over- or under-sharpens: every head's Pmax against its own L_tr value.

    python research/head_alignment.py [--model NAME_OR_FOLDER] [--task passkey] [--multiples 4 8 16] [--samples 4]

Algorithm 1 matches the mean Pmax over all layers and heads. This script
keeps the heads apart: on calibration documents (seeds 100000.., as
bench/results.py calibrates; never its test seeds 0-99) it measures each
head's mean Pmax at L_tr (tau = 1) and at each longer length at tau = 1, at
Algorithm 1's pick (the paper's grid, bisection, as the tables use it) and at
per-head alignment's schedule (core.runs.temperature.per_head), and sorts the heads
into what a temperature can do for them:

* saturated: Pmax >= 0.9 at L_tr and still >= 0.9 at tau = 1 here (locked on
  one key whatever the length: nothing to restore, and a global tau < 1
  sharpens them further);
* unreachable: no tau of the grid brings the head back to its L_tr value
  (per-head alignment leaves it at 1 and lists it);
* restorable: the rest, with the grid tau that brings it closest.

It prints the counts, each head's ratio Pmax / Pmax(L_tr) at tau = 1, at the
global pick and with per-head taus, and the mean ratio of the restorable heads
at the global pick (> 1: over-sharpened, < 1: still dispersed). The "Why
Algorithm 1 over- or under-sharpens" finding in docs/results.md uses it.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from core.data import tasks
from core.runs import temperature
from core.runs.calibration import measure, reference_document
from core.models import default_model, load

SATURATED = 0.9


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="bundled name or a model folder (default: the default model)")
    p.add_argument("--task", default="passkey", choices=tasks.TASKS)
    p.add_argument("--multiples", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--samples", type=int, default=4)
    args = p.parse_args(argv)
    loaded = load(args.model or default_model())
    lt, L, H = loaded.train_length, loaded.n_layers, loaded.n_heads
    print(f"model {loaded.spec.name}, {args.task}, {args.samples} calibration documents per length "
          f"(seeds 100000..), {L} layers x {H} heads")
    for mult in args.multiples:
        docs = [tasks.make(args.task, loaded.tokenizer, lt * mult, depth=(i * 0.37) % 1, seed=100000 + i)
                for i in range(args.samples)]
        meas = measure(loaded, docs)
        ref = measure(loaded, [reference_document(loaded, d) for d in docs])(1.0)
        tr = ref.heads("pmax")
        glob = temperature.algorithm1(meas, ref, "pmax", fast=True)
        heads = temperature.per_head(meas, ref, L, H, "pmax")
        at1, atg, ath = (meas(t).heads("pmax") for t in (1.0, glob.tau, heads.schedule))
        saturated = (tr >= SATURATED) & (at1 >= SATURATED)
        unreached = np.zeros((L, H), bool)
        for layer, h in heads.unreached_heads:
            unreached[layer, h] = True
        unreached &= ~saturated
        restorable = ~saturated & ~unreached
        print(f"\n## {mult}x ({lt * mult} tokens): Algorithm 1 (Pmax) picks tau {glob.tau:.2f} "
              f"(reached: {glob.reached}, gap {glob.gap:+.4f})")
        print(f"heads: {int(saturated.sum())} saturated, {int(unreached.sum())} unreachable, "
              f"{int(restorable.sum())} restorable")
        if restorable.any():
            r = (atg / tr)[restorable]
            print(f"restorable heads at the global pick: mean Pmax / Pmax(L_tr) {r.mean():.2f} "
                  f"({int((r > 1.1).sum())} over-sharpened by > 10 %, {int((r < 0.9).sum())} still > 10 % short); "
                  f"their per-head taus: mean {np.asarray(heads.schedule)[restorable].mean():.2f}, "
                  f"range {np.asarray(heads.schedule)[restorable].min():.2f}-{np.asarray(heads.schedule)[restorable].max():.2f}")
        print("| layer.head | kind | Pmax L_tr | Pmax / L_tr at tau 1 | at global tau | per-head tau | at per-head tau |")
        print("|---|---|---|---|---|---|---|")
        for layer in range(L):
            for h in range(H):
                kind = "saturated" if saturated[layer, h] else "unreachable" if unreached[layer, h] else "restorable"
                print(f"| {layer}.{h} | {kind} | {tr[layer, h]:.3f} | {at1[layer, h] / tr[layer, h]:.2f} | "
                      f"{atg[layer, h] / tr[layer, h]:.2f} | {heads.schedule[layer][h]:.2f} | "
                      f"{ath[layer, h] / tr[layer, h]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
