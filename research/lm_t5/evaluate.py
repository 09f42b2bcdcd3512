"""Held-out perplexity of trained lm-t5 candidates, with and without an earlier copy, under a wall-clock budget.

``python research/lm_t5/evaluate.py --models DIR [DIR ...] --out OUT --budget-s 120``

Why a script of its own: a lent GPU is held for minutes, and the question the
runs answer (does dispersion cost the copy past L_tr, and does a temperature
give it back?) is answered by a few cells first: tau = 1 and log-length at 1x
and 8x L_tr, copy and no copy. Those run first for every model; then, while
the budget lasts, more lengths and the measured methods. Each phase writes its
rows to ``OUT/<model>.csv`` as they finish (:func:`core.experiments.perplexity.run_perplexity`,
resumable), so a run cut short keeps what it measured; at the end
``OUT/perplexity.json`` holds every row and stdout a compact table per model
(perplexity, copy / no copy, and the 8x / 1x ratio).

A second run (``--plan second``, research/lm_t5/gpu_eval.sh) measures what the
first GPU run left out: per-layer and per-head Algorithm 1 at 8x and 16x, and
the 16x Pmax / entropy / YaRN cells. ``--resume-from`` seeds each model's CSV
with the first run's rows, so cells already measured are skipped (not re-run)
and the tables at the end hold both runs; ``OUT/taus.json`` keeps what each
measured method resolved to (the per-layer / per-head schedules, which heads
reached their L_tr Pmax).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from the repository root
    sys.path.insert(0, str(ROOT))

from core.runs import methods  # noqa: E402
from core.models import load  # noqa: E402
from core.experiments.perplexity import COPY_WITH, COPY_WITHOUT, PerplexityPlan, perplexity_table, run_perplexity  # noqa: E402

#: Method names asked of the registry (tests/runs/test_method_registry_owner.py): tau = 1, the paper's baseline, YaRN (the
#: other advised closed form), Algorithm 1 on Pmax and on entropy, per layer and per head.
AS_TRAINED, BASELINE = methods.AS_TRAINED, methods.BASELINE
YARN = next(n for n in methods.ADVISED if n != BASELINE)
PMAX, ENTROPY = methods.ALGORITHM1["pmax"], methods.ALGORITHM1["entropy"]
PER_LAYER, PER_HEAD = methods.PER_LAYER, methods.PER_HEAD
#: (multiples of L_tr, methods), most important first: the budget decides how far down the list a run gets.
PHASES: list[tuple[tuple[float, ...], tuple[str, ...]]] = [
    ((1, 8), (AS_TRAINED, BASELINE)),
    ((16,), (AS_TRAINED, BASELINE)),
    ((8,), (PMAX, ENTROPY, YARN)),
    ((2, 4), (AS_TRAINED, BASELINE)),
    ((16,), (PMAX, ENTROPY, YARN)),
    ((8, 16), (PER_LAYER, PER_HEAD)),
]
#: The second GPU run: what the first left out, cheapest answer to the bar first. Phase 6's per-layer and
#: per-head at 8x (the bar is read at 8x; ~280 calibration passes a model), then phase 5 (16x Pmax / entropy /
#: YaRN; ~60 passes), then phase 6 at 16x (the dearest). Cells already in --resume-from rows are skipped.
SECOND: list[tuple[tuple[float, ...], tuple[str, ...]]] = [
    ((8,), PHASES[5][1]),
    PHASES[4],
    ((16,), PHASES[5][1]),
]
#: On the CPU, after the GPU was spent (one thread, a few dozen sequences): the 1x reference on the same sequences,
#: then per-layer and per-head Algorithm 1 at 8x (the bar), then tau = 1 at 8x.
CPU: list[tuple[tuple[float, ...], tuple[str, ...]]] = [
    ((1,), (AS_TRAINED,)),
    ((8,), (PER_LAYER,)),
    ((8,), (PER_HEAD,)),
    ((8,), (AS_TRAINED,)),
]
PLANS = {"first": PHASES, "second": SECOND, "cpu": CPU}
COPIES = {"with": (COPY_WITH,), "without": (COPY_WITHOUT,), "split": (COPY_WITH, COPY_WITHOUT)}


def evaluate(model_dirs: list[str], out: Path, sequences: int, budget_s: float, device: str | None,
             batch_size: int, phases: int, plan: str = "first", resume_from: Path | None = None,
             copies: tuple[str, ...] = (COPY_WITH, COPY_WITHOUT)) -> pd.DataFrame:
    """Every model through the phases in turn (all models' phase 1 before any phase 2), until ``budget_s``."""
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    if resume_from is not None:
        seed_rows(resume_from, out, [Path(d).name for d in model_dirs])
    loaded = {d: load(d, device=device, dtype="float32") for d in model_dirs}
    frames: dict[str, pd.DataFrame] = {}
    resolved: list[dict] = []
    names = {id(lm): Path(d).name for d, lm in loaded.items()}
    methods.resolve = _recording(methods.resolve, resolved, out / "taus.json", names)  # undone below
    try:
        return _phases(loaded, frames, out, sequences, budget_s, batch_size, PLANS[plan][:phases], t0, copies)
    finally:
        methods.resolve = methods.resolve.__wrapped__


def _phases(loaded: dict, frames: dict, out: Path, sequences: int, budget_s: float, batch_size: int,
            phases: list, t0: float, copies: tuple[str, ...] = (COPY_WITH, COPY_WITHOUT)) -> pd.DataFrame:
    for k, (multiples, names) in enumerate(phases):
        for d, lm in loaded.items():
            if time.time() - t0 > budget_s:
                print(f"budget of {budget_s:g} s spent: phase {k + 1} of {d} not run", file=sys.stderr)
                continue
            lt = lm.train_length
            plan = PerplexityPlan(model=Path(d).name, lengths=[int(round(m * lt)) for m in multiples],
                                  methods=list(names), sequences=sequences, batch_size=batch_size,
                                  copies=copies)
            csv = out / f"{Path(d).name}.csv"
            t1 = time.time()
            df = run_perplexity(lm, plan, out=csv, resume=csv.exists(),
                                should_stop=lambda: time.time() - t0 > budget_s)
            print(f"{Path(d).name}: phase {k + 1} ({', '.join(f'{m:g}x' for m in multiples)}; {', '.join(names)}) "
                  f"{time.time() - t1:.1f} s", file=sys.stderr)
            frames[d] = df
            write(frames, out, sequences)  # after every phase: a run killed later keeps what it measured
    return write(frames, out, sequences)


def seed_rows(previous: Path, out: Path, models: list[str]) -> None:
    """Each model's rows of an earlier run's CSV (``perplexity.csv``: every model) as ``out/<model>.csv``, so
    :func:`core.experiments.perplexity.run_perplexity` (resume) skips the cells measured there; a model's CSV already in
    ``out`` is kept as it is."""
    if not previous.is_file():
        print(f"no earlier rows at {previous}: every cell is measured", file=sys.stderr)
        return
    old = pd.read_csv(previous)
    for name in models:
        csv = out / f"{name}.csv"
        rows = old[old["model"] == name]
        if len(rows) and not csv.exists():
            rows.to_csv(csv, index=False)
            print(f"{name}: {len(rows)} rows from {previous} (those cells are not run again)", file=sys.stderr)


def _recording(resolve, log: list[dict], path: Path, names: dict[int, str]):
    """``methods.resolve``, also writing what each measured method resolved to (its schedule: a tau per layer
    for per-layer, per layer and head for per-head; reached, gap, unreached heads) to ``path``."""
    def recorded(loaded, document, method, *args, **kwargs):
        schedule, info = resolve(loaded, document, method, *args, **kwargs)
        if methods.get(methods.parse(method)[0]).measured and "length" in info:
            keep = {k: v for k, v in info.items() if k not in ("curve", "grid", "band", "refined")}
            log.append({"model": names.get(id(loaded), "?"), "method": method, "tokens": info["length"],
                        "mean_tau": schedule.mean(info["length"]), **keep})
            path.write_text(json.dumps(log, indent=1, default=_plain))
        return schedule, info

    recorded.__wrapped__ = resolve
    return recorded


def _plain(x):
    """JSON for numpy values in a search's info."""
    return x.tolist() if hasattr(x, "tolist") else str(x)


def write(frames: dict[str, pd.DataFrame], out: Path, sequences: int) -> pd.DataFrame:
    """``out/perplexity.json`` (every row so far) and ``out/perplexity.txt`` (:func:`report`); the rows."""
    rows = [{**r, "dir": d} for d, df in frames.items() for r in df.to_dict("records")]
    (out / "perplexity.json").write_text(json.dumps({"sequences": sequences, "first_seed": 0, "rows": rows}, indent=1,
                                                    default=str))
    df = pd.DataFrame(rows)
    if len(df):
        (out / "perplexity.txt").write_text(report(df) + "\n")
    return df


def report(df: pd.DataFrame) -> str:
    """Per model: perplexity by (copy, method) x length, and each row's ratio to its own 1x value."""
    lines = []
    for model, d in df.groupby("model", sort=False):
        table = perplexity_table(d)
        lt = int(d["train_length"].iloc[0])
        table.columns = [f"{int(c)} ({int(c) / lt:g}x)" for c in table.columns]
        lines += [f"== {model}: perplexity of the next 32 tokens, {int(d['sequences'].max())} sequences a cell "
                  f"(copy=with: seeds with an earlier copy; without: the same seeds, no copy)", table.to_string()]
        base = d[d["tokens"] == lt].set_index(["copy", "method"])["perplexity"]
        if len(base):
            ratio = table.copy()
            for idx in ratio.index:
                ref = base.get(idx, base.get((idx[0], AS_TRAINED)))
                ratio.loc[idx] = (ratio.loc[idx] / ref).round(2) if ref else None
            lines += ["ratio to 1x (tau = 1 at 1x where the method has no 1x row)", ratio.to_string()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", required=True, help="model folders (python -m core train --out)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--sequences", type=int, default=200, help="held-out sequences per cell (seeds from 0)")
    p.add_argument("--budget-s", type=float, default=120.0, help="no new phase starts, nor cell, after this")
    p.add_argument("--device", default=None)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--phases", type=int, default=len(PHASES), help="at most this many of the plan's phases")
    p.add_argument("--plan", choices=sorted(PLANS), default="first",
                   help="first: the phases of the first GPU run; second: per-layer / per-head at 8x and 16x, and "
                        "the 16x Pmax / entropy / YaRN cells; cpu: 1x tau = 1, then per-layer, per-head and tau = 1 "
                        "at 8x")
    p.add_argument("--copies", choices=sorted(COPIES), default="split",
                   help="with: only sequences with an earlier copy; without: the same seeds, no copy; split: both")
    p.add_argument("--resume-from", type=Path, default=None,
                   help="an earlier run's perplexity.csv: its cells are kept, not measured again")
    a = p.parse_args(argv)
    found = [d for d in a.models if (Path(d) / "model.safetensors").is_file()]
    for d in sorted(set(a.models) - set(found)):
        print(f"skipped {d}: no model.safetensors", file=sys.stderr)
    if not found:
        print("error: no trained model to evaluate", file=sys.stderr)
        return 2
    df = evaluate(found, a.out, a.sequences, a.budget_s, a.device, a.batch_size, a.phases, a.plan, a.resume_from,
                  COPIES[a.copies])
    if len(df):
        print((a.out / "perplexity.txt").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
