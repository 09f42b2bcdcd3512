"""Dispersion on a real LLM (issue 57, item 1): Pmax and entropy H of the question's rows, per layer, at multiples of
L_tr, under tau = 1 and under each method's tau; one CSV row per length x method x layer, written as each
length x method finishes, ``--resume`` skipping those already there.

    python bench/dispersion.py --model smollm2-135m --multiples 0.5 1 2 4 --documents 4 \\
        --methods none log-length pmax yarn llama4 --out assets/results/smollm2-dispersion.csv --resume

The documents are pass-key documents (seeds 0..documents-1, needle depths spread evenly over 0.1..0.9), the
question last; the rows are read as Calibrate reads them (:func:`core.runs.calibration.measure`: on a
decoder-only LM the question's tokens, on an encoder every token). A measured method (Algorithm 1 on Pmax or
H, per layer) is calibrated at each length on other documents (seeds 100,000 + length on, as sweeps do), never
on the ones measured. ``--train-length`` overrides L_tr (to make "past L_tr" cheap while trying the command).
Run it niced in the background for long lengths; every row names the seconds its cell took.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # core, also without an installed package

import numpy as np  # noqa: E402

from core.data import tasks  # noqa: E402
from core.errors import UserError  # noqa: E402
from core.experiments import csvio  # noqa: E402
from core.experiments.sweep import SweepPlan, resolve_for  # noqa: E402
from core.models import load  # noqa: E402
from core.runs import calibration, methods  # noqa: E402

COLUMNS = [
    "model",
    "task",
    "tokens",
    "actual_tokens",
    "train_length",
    "ratio",
    "method",
    "tau",
    "layer",
    "pmax",
    "entropy",
    "pmax_se",
    "entropy_se",
    "documents",
    "seconds",
    "reached",
    "gap",
]


def depths(k: int) -> list[float]:
    """``k`` needle depths spread evenly over 0.1..0.9 (one document: the middle)."""
    return [0.5] if k == 1 else [round(0.1 + 0.8 * i / (k - 1), 3) for i in range(k)]


def documents(loaded, n: int, k: int, task: str = "passkey") -> list[tasks.Document]:
    return [tasks.make(task, loaded.tokenizer, n, depth=d, seed=i) for i, d in enumerate(depths(k))]


def cell_rows(loaded, n: int, method: str, docs: list[tasks.Document], cache: dict, samples: int) -> list[dict]:
    """One length x method: its tau (resolved as a sweep resolves it) and the per-layer Pmax and H of the rows
    Calibrate reads, mean over ``docs`` with its standard error over them."""
    t0 = time.perf_counter()
    plan = SweepPlan(
        model=loaded.spec.name,
        task=docs[0].task,
        lengths=[n],
        depths=[0.5],
        seeds=[0],
        methods=[method],
        calib_samples=samples,
    )
    tau, outcome = resolve_for(loaded, plan, n, methods.method_label(method), docs[0], cache)
    stats = calibration.measure(loaded, docs)(tau)
    k = len(docs)
    se = (lambda a: np.std(a, axis=0, ddof=1) / np.sqrt(k)) if k > 1 else (lambda a: np.zeros(a.shape[1]))
    pmax_se, ent_se = se(stats.doc_pmax), se(stats.doc_entropy)
    tokens = int(round(np.mean([len(loaded.tokenizer(d.text).input_ids) for d in docs])))
    seconds = round(time.perf_counter() - t0, 2)
    return [
        {
            "model": loaded.spec.name,
            "task": docs[0].task,
            "tokens": n,
            "actual_tokens": tokens,
            "train_length": loaded.train_length,
            "ratio": round(n / loaded.train_length, 4),
            "method": methods.method_label(method),
            "tau": round(tau.mean(n), 6),
            "layer": layer,
            "pmax": round(float(stats.pmax[layer]), 6),
            "entropy": round(float(stats.entropy[layer]), 6),
            "pmax_se": round(float(pmax_se[layer]), 6),
            "entropy_se": round(float(ent_se[layer]), 6),
            "documents": k,
            "seconds": seconds,
            **outcome,
        }
        for layer in range(len(stats.pmax))
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="registry name, hub id or folder")
    p.add_argument("--train-length", type=int, default=None, help="override the model's L_tr")
    p.add_argument("--multiples", type=float, nargs="+", default=[0.5, 1, 2, 4], help="lengths as multiples of L_tr")
    p.add_argument("--documents", type=int, default=4, help="pass-key documents per length")
    p.add_argument(
        "--methods",
        nargs="+",
        default=[methods.AS_TRAINED, methods.BASELINE, methods.ALGORITHM1["pmax"]],
        help="method names or tau=X",
    )
    p.add_argument("--samples", type=int, default=2, help="calibration documents of a measured method")
    p.add_argument("--out", required=True, help="CSV written as each length x method ends")
    p.add_argument("--resume", action="store_true", help="skip the length x method cells already in --out")
    args = p.parse_args(argv)
    try:
        loaded = load(args.model, train_length=args.train_length)
        for m in args.methods:
            methods.method_label(m)
        lengths = [int(round(k * loaded.train_length)) for k in args.multiples]
        with csvio.ResultCSV(Path(args.out), COLUMNS, "dispersion", resume=args.resume) as sink:
            done = {(str(int(float(r["tokens"]))), r["method"]) for r in sink.rows}
            cache: dict = {}
            for n in lengths:
                todo = [m for m in args.methods if (str(n), methods.method_label(m)) not in done]
                if not todo:
                    continue
                docs = documents(loaded, n, args.documents)
                for m in todo:
                    rows = cell_rows(loaded, n, m, docs, cache, args.samples)
                    for row in rows:
                        sink.write(row)
                    mean_p = np.mean([r["pmax"] for r in rows])
                    mean_h = np.mean([r["entropy"] for r in rows])
                    print(
                        f"{n} tokens, {m}: tau {rows[0]['tau']}, mean over layers Pmax {mean_p:.4f} H {mean_h:.3f} "
                        f"({rows[0]['seconds']} s)",
                        flush=True,
                    )
    except (UserError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
