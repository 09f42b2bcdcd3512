"""Many ``engine.run``s -> one tidy table, written row by row.

A sweep is the product lengths x depths x seeds x methods for one model and
task. Each finished document is appended to the CSV at once (a killed sweep
keeps what it finished); ``resume=True`` skips rows already there.

Measured methods (Algorithm 1, Prop. 1/2, per-layer) are calibrated once per
length on *calibration* documents whose seeds are disjoint from the test
seeds (``calib_seed`` onwards), so no method is tuned on the documents it is
scored on.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pandas as pd

from core import calibration, engine, tasks, temperature
from core.models import Loaded
from core.probes import ProbeSpec

COLUMNS = [
    "model", "task", "tokens", "actual_tokens", "depth", "seed", "method", "tau",
    "answer", "expected", "correct", "pmax", "entropy", "seconds",
]
KEY = ("model", "task", "tokens", "depth", "seed", "method")


def method_label(m: str | float) -> str:
    """A method name, or a number meaning a fixed tau (``0.8`` -> ``"tau=0.8"``)."""
    try:
        return f"tau={float(m):g}"
    except (TypeError, ValueError):
        if m not in temperature.METHODS or m == "fixed":
            raise ValueError(f"Unknown method '{m}'; use a number (fixed tau) or one of {', '.join(temperature.METHODS)}")
        return str(m)


@dataclass
class SweepPlan:
    model: str
    task: str
    lengths: list[int]
    depths: list[float]
    seeds: list[int]
    methods: list[str]
    calib_samples: int = 4
    calib_seed: int = 100_000
    haystack: str = "default"

    def cells(self) -> Iterable[tuple[int, float, int, str]]:
        for n in self.lengths:
            for d in self.depths:
                for s in self.seeds:
                    for m in self.methods:
                        yield n, d, s, m

    @property
    def total(self) -> int:
        return len(self.lengths) * len(self.depths) * len(self.seeds) * len(self.methods)


def _done_keys(path: Path) -> set[tuple]:
    if not path.exists() or path.stat().st_size == 0:
        return set()
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    return {tuple(_norm(k, r[k]) for k in KEY) for _, r in df.iterrows()}


def _norm(k: str, v) -> str:
    if k == "tokens" or k == "seed":
        return str(int(float(v)))
    if k == "depth":
        return f"{float(v):g}"
    return str(v)


def run_sweep(
    loaded: Loaded,
    plan: SweepPlan,
    out: str | Path | None = None,
    resume: bool = False,
    progress: Callable[[int, int, dict | None], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> pd.DataFrame:
    """Run the plan; append rows to ``out`` (CSV) as they finish; return the table.

    ``progress(done, total, row)`` is called after each row (and once at the
    start with ``row=None``); ``should_stop()`` is polled between rows (the
    app's cancel button).
    """
    plan = replace(plan, methods=[method_label(m) for m in plan.methods])
    path = Path(out) if out else None
    done = _done_keys(path) if (path and resume) else set()
    if path and not resume and path.exists():
        path.unlink()
    rows: list[dict] = []
    if path and path.exists() and resume:
        rows = pd.read_csv(path, keep_default_na=False).to_dict("records")
    writer_file = open(path, "a", newline="") if path else None
    writer = csv.DictWriter(writer_file, fieldnames=COLUMNS) if writer_file else None
    if writer and (not path.exists() or path.stat().st_size == 0):
        writer.writeheader()
        writer_file.flush()
    taus: dict[tuple[int, str], float | list] = {}
    count = 0
    if progress:
        progress(0, plan.total, None)
    try:
        for n, depth, seed, m in plan.cells():
            key = tuple(_norm(k, v) for k, v in zip(KEY, (plan.model, plan.task, n, depth, seed, m)))
            count += 1
            if key in done:
                if progress:
                    progress(count, plan.total, None)
                continue
            if should_stop and should_stop():
                break
            doc = tasks.make(plan.task, loaded.tokenizer, n, depth=depth, seed=seed, haystack=plan.haystack)
            tau = _tau_for(loaded, plan, n, m, doc, taus)
            res = engine.run(loaded, doc, engine.RunSettings(tau=tau, method=m, probes=ProbeSpec.stats_only()))
            row = {
                "model": plan.model, "task": plan.task, "tokens": n, "actual_tokens": res.tokens,
                "depth": depth, "seed": seed, "method": m,
                "tau": float(np.mean(tau)), "answer": res.answer, "expected": res.expected,
                "correct": bool(res.correct), "pmax": round(res.pmax, 5), "entropy": round(res.entropy, 5),
                "seconds": round(res.seconds["total"], 4),
            }
            rows.append(row)
            if writer:
                writer.writerow(row)
                writer_file.flush()
                os.fsync(writer_file.fileno())
            if progress:
                progress(count, plan.total, row)
    finally:
        if writer_file:
            writer_file.close()
    return pd.DataFrame(rows, columns=COLUMNS)


def _tau_for(loaded: Loaded, plan: SweepPlan, n: int, method: str, doc: tasks.Document, cache: dict) -> float | list:
    """Resolve a method at length n once, on calibration documents (seeds disjoint from the test seeds)."""
    if method.startswith("tau="):
        return float(method[4:])
    if method not in temperature.MEASURED:
        return calibration.resolve(loaded, doc, method)[0]
    if (n, method) not in cache:
        calib_doc = tasks.make(plan.task, loaded.tokenizer, n, depth=0.5, seed=plan.calib_seed + n, haystack=plan.haystack)
        cache[(n, method)] = calibration.resolve(loaded, calib_doc, method, samples=plan.calib_samples)[0]
    return cache[(n, method)]


def accuracy_table(df: pd.DataFrame, rows: str = "method", cols: str = "tokens") -> pd.DataFrame:
    """Accuracy (%) pivot, e.g. method x length (the paper's Table 4) or depth x length (needle heatmap)."""
    d = df.copy()
    d["correct"] = d["correct"].astype(str).str.lower().isin(["true", "1"])
    return (d.pivot_table(index=rows, columns=cols, values="correct", aggfunc="mean") * 100).round(1)
