"""Many ``engine.run``s -> one tidy table, written row by row.

A sweep is the product lengths x depths x seeds x methods for one model and
task. Each finished document is appended to the CSV at once (a killed sweep
keeps what it finished); ``resume=True`` skips rows already there and redoes
a last row cut short by a kill. The whole plan is checked before the CSV is
touched, and one sweep at a time writes a CSV (:class:`core.csvio.ResultCSV`:
lock, resume checks, spreadsheet-safe cells).

Measured methods (Algorithm 1, Prop. 1/2, per-layer) are calibrated once per
length on *calibration* documents whose seeds are disjoint from the test
seeds (``calib_seed`` onwards), so no method is tuned on the documents it is
scored on.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, ContextManager, Iterable

import numpy as np
import pandas as pd

from core import csvio, engine, methods, tasks
from core.methods import method_label
from core.validation import Depth, Samples, Seed, Tokens, validate
from core.errors import UserError
from core.models import Loaded
from core.probes import ProbeSpec

COLUMNS = [
    "model", "task", "tokens", "actual_tokens", "depth", "seed", "method", "tau",
    "answer", "expected", "correct", "pmax", "entropy", "seconds",
]
KEY = ("model", "task", "tokens", "depth", "seed", "method")


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

    def validated(self) -> SweepPlan:
        """This plan with methods as labels, or a :class:`UserError` naming the first bad option.

        Called first by :func:`run_sweep`, so a bad option never costs the
        rows of an existing CSV.
        """
        try:
            methods = [method_label(m) for m in self.methods]
        except ValueError as err:
            raise UserError(f"Bad sweep option: {err}") from None
        where = "Bad sweep option"  # the bounds every entry point uses (core.validation)
        return replace(
            self, lengths=validate(list[Tokens], self.lengths, f"{where}: lengths"),
            depths=validate(list[Depth], self.depths, f"{where}: depths"),
            seeds=validate(list[Seed], self.seeds, f"{where}: seeds"), methods=methods,
            calib_samples=validate(Samples, self.calib_samples, f"{where}: calib_samples"),
            calib_seed=validate(Seed, self.calib_seed, f"{where}: calib_seed"),
        )


def _done_keys(rows: list[dict[str, str]], path: Path | None) -> set[tuple]:
    """Keys of the rows a resumed CSV already holds (cells as written, restored by csvio)."""
    try:
        return {tuple(_norm(k, r[k]) for k in KEY) for r in rows}
    except ValueError as err:
        raise UserError(f"{path} holds a row that is not a sweep row ({err}); use another --out or drop --resume") from None


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
    guard: Callable[[], ContextManager] = contextlib.nullcontext,
) -> pd.DataFrame:
    """Run the plan; append rows to ``out`` (CSV) as they finish; return the table.

    ``progress(done, total, row)`` is called after each row (and once at the
    start with ``row=None``); ``should_stop()`` is polled between rows (the
    app's cancel button). ``guard()`` is entered around each row's passes:
    the app passes its pass gate, so a sweep and other sessions' passes take
    turns instead of sharing the memory one of them was checked against.
    """
    plan = plan.validated()
    if plan.total:
        engine.check_length(loaded, max(plan.lengths))  # before a huge document is built, or the CSV touched
        _check_task(loaded, plan)
    path = Path(out) if out else None
    with csvio.ResultCSV(path, COLUMNS, "sweep", resume=resume) as sink:
        done = _done_keys(sink.rows, path)
        rows: list[dict] = _typed(path) if sink.rows else []
        taus: dict[tuple[int, str], float | list] = {}
        count = 0
        if progress:
            progress(0, plan.total, None)
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
            with guard():
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
            sink.write(row)
            if progress:
                progress(count, plan.total, row)
    return pd.DataFrame(rows, columns=COLUMNS)


def _check_task(loaded: Loaded, plan: SweepPlan) -> None:
    """Build the shortest document once, so an unknown task or haystack, or a length too short for the task,
    is refused before the CSV is touched (a longer document only has more filler)."""
    try:
        tasks.make(plan.task, loaded.tokenizer, min(plan.lengths), depth=plan.depths[0], seed=plan.seeds[0],
                   haystack=plan.haystack)
    except ValueError as err:
        raise UserError(f"Bad sweep option: {err}") from None


def _typed(path: Path) -> list[dict]:
    """The rows a resumed CSV holds, typed as pandas reads them, text as it was before neutralising."""
    return csvio.restore_frame(pd.read_csv(path, keep_default_na=False)).to_dict("records")


def _tau_for(loaded: Loaded, plan: SweepPlan, n: int, method: str, doc: tasks.Document, cache: dict) -> float | list:
    """Resolve a method at length n once, on calibration documents (seeds disjoint from the test seeds)."""
    if method.startswith("tau="):
        return float(method[4:])
    if method not in methods.MEASURED:
        return methods.resolve(loaded, doc, method)[0]
    if (n, method) not in cache:
        calib_doc = tasks.make(plan.task, loaded.tokenizer, n, depth=0.5, seed=plan.calib_seed + n, haystack=plan.haystack)
        cache[(n, method)] = methods.resolve(loaded, calib_doc, method, samples=plan.calib_samples)[0]
    return cache[(n, method)]


def accuracy_table(df: pd.DataFrame, rows: str = "method", cols: str = "tokens") -> pd.DataFrame:
    """Accuracy (%) pivot, e.g. method x length (the paper's Table 4) or depth x length (needle heatmap)."""
    d = df.copy()
    d["correct"] = d["correct"].astype(str).str.lower().isin(["true", "1"])
    return (d.pivot_table(index=rows, columns=cols, values="correct", aggfunc="mean") * 100).round(1)
