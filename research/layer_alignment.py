"""Which layer's Pmax alignment lands near the best tau? One tau per layer, measured.

    python research/layer_alignment.py [--model NAME_OR_FOLDER] [--task passkey] [--multiples 4 8 16] [--samples 4]

Algorithm 1 matches the mean Pmax over all layers. This script matches each
encoder layer on its own: for each length it measures per-layer mean Pmax
over the tau grid (1.0, 0.95, ..., 0.5) on calibration documents (seeds
100000.., as bench/results.py calibrates; never its test seeds 0-99) and
prints the grid tau whose Pmax is closest to that layer's value at L_tr with
tau = 1, plus the whole curve, so a flat or non-monotone layer shows. The
"Why Algorithm 1 over-sharpens" finding in docs/results.md uses it.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from core.data import tasks
from core.runs.calibration import measure
from core.models import default_model, load
from core.runs.temperature import GRID


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="bundled name or a model folder (default: the default model)")
    p.add_argument("--task", default="passkey", choices=tasks.TASKS)
    p.add_argument("--multiples", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--samples", type=int, default=4)
    args = p.parse_args(argv)
    loaded = load(args.model or default_model())
    l_tr = loaded.train_length

    def docs(n: int) -> list[tasks.Document]:
        return [tasks.make(args.task, loaded.tokenizer, n, depth=(i * 0.37) % 1, seed=100000 + i)
                for i in range(args.samples)]

    ref = measure(loaded, docs(l_tr))(1.0)
    print(f"model {loaded.spec.name}, {args.task}, {args.samples} calibration documents per length")
    print(f"L_tr = {l_tr}: Pmax per layer at tau = 1: {np.round(ref.pmax, 3).tolist()}")
    print("| length | layer | tau matching its L_tr Pmax | Pmax at tau = " + " / ".join(f"{t:g}" for t in GRID) + " |")
    print("|---|---|---|---|")
    for mult in args.multiples:
        f = measure(loaded, docs(l_tr * mult))
        rows = [f(t) for t in GRID]
        for layer in range(len(ref.pmax)):
            curve = [r.pmax[layer] for r in rows]
            best = GRID[int(np.argmin([abs(c - ref.pmax[layer]) for c in curve]))]
            print(f"| {mult}x | {layer} | {best:.2f} | " + " / ".join(f"{c:.3f}" for c in curve) + " |", flush=True)
        mean = GRID[int(np.argmin([abs(r.pmax.mean() - ref.pmax.mean()) for r in rows]))]
        print(f"| {mult}x | mean | {mean:.2f} | |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
