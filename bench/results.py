"""The results tables (docs/results.md) for the bundled models, in one command.

    python bench/results.py [--models retrieval-t5 ./a/local/folder ...] [--tasks passkey line ...] [--samples 100]
                            [--multiples 1 2 4 8 16] [--out assets/results]

For each model and task, at L_tr x multiples: accuracy for tau = 1,
log-length, InfoScale, Algorithm 1 (Pmax), Algorithm 1 (entropy), per-layer
Pmax alignment, and every fixed tau of a grid (the best one is reported);
plus the dispersion table (mean Pmax and H per layer at each length, tau = 1;
the paper's Table 1). Test documents use seeds 0..samples-1 with needle depth
drawn per seed; measured methods are calibrated per length on 4 documents
with seeds from 100,000 on (never the test documents). Accuracy runs record
no probes, so the attention takes torch's fused kernel (about 5x faster on the
CPU); Pmax and H are measured at tau = 1 on the first ``--stats-docs``
documents. Writes ``<out>/<model>.csv`` (one row per task, length, method)
cell by cell, so a killed run picks up where it stopped, and
``<out>/<model>.md`` (tables), with a progress bar. Inside a cell every
finished accuracy run (and the cell's calibrated taus and dispersion) goes to
``<out>/<model>.partial.json`` as it ends, so a 16x cell (close to an hour of
one CPU core) cut short by the end of a session resumes from its last run,
not from nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from core import calibration, engine, tasks, temperature
from core.models import bundled_specs, load
from core.probes import ProbeSpec
from core.temperature import infoscale, log_length

FIXED = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)
MEASURED = ("pmax", "entropy", "per-layer")
CALIB_SEED = 100_000


def docs_for(loaded, task: str, n: int, samples: int, seed0: int = 0) -> list[tasks.Document]:
    out = []
    for s in range(seed0, seed0 + samples):
        depth = random.Random(s * 7919 + n).random()
        out.append(tasks.make(task, loaded.tokenizer, n, depth=depth, seed=s))
    return out


def _run(loaded, docs, encs, settings: engine.RunSettings, batch: int) -> list[engine.Result]:
    res = []
    for i in range(0, len(docs), batch):
        res += engine.run_encoded(loaded, docs[i : i + batch], encs[i : i + batch], settings)
    return res


def accuracy(loaded, docs, encs, tau, batch: int) -> float:
    """Accuracy (%) at ``tau``. No probes: the attention takes torch's fused kernel (about 5x faster)."""
    res = _run(loaded, docs, encs, engine.RunSettings(tau=tau, probes=ProbeSpec.off()), batch)
    return 100.0 * float(np.mean([bool(r.correct) for r in res]))


def dispersion(loaded, docs, encs, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean Pmax and H per layer at tau = 1 (over all heads and query rows, then documents)."""
    res = _run(loaded, docs, encs, engine.RunSettings(tau=1.0, probes=ProbeSpec.stats_only(), generate=False), batch)
    return np.mean([r.probes.layer_pmax for r in res], axis=0), np.mean([r.probes.layer_entropy for r in res], axis=0)


def calibrated_taus(loaded, task: str, k: float, n: int) -> dict[str, object]:
    """Every method's tau (a schedule for per-layer) at ``n`` = ``k`` x L_tr tokens.

    Measured methods calibrate on 4 documents from seed CALIB_SEED on, never
    the test documents; at L_tr they are 1 by definition."""
    lt = loaded.train_length
    taus: dict[str, object] = {"none": 1.0, "log-length": log_length(lt, n), "infoscale": infoscale(lt, n, loaded.d_kv)}
    calib_docs = docs_for(loaded, task, n, 4, CALIB_SEED)
    measure = calibration.measure(loaded, calib_docs)
    reference = calibration.measure(loaded, [calibration.reference_document(loaded, d) for d in calib_docs])(1.0)
    for m in MEASURED:
        if k == 1:
            taus[m] = 1.0 if m != "per-layer" else [1.0] * loaded.n_layers
        elif m == "per-layer":
            taus[m] = [float(t) for t in temperature.per_layer(measure, reference, loaded.n_layers, "pmax").schedule]
        else:
            taus[m] = float(temperature.algorithm1(measure, reference, m, fast=True).tau)
    for t in FIXED:
        taus[f"tau={t:g}"] = t
    return taus


class Partial:
    """What a cell has finished so far, in a JSON file beside the CSV.

    Why: a 16x cell is about ten accuracy runs of 100 documents of 4,096
    tokens, close to an hour of one CPU core; a run cut short (the end of a
    session) keeps every finished run and resumes after it. Keys start with
    the cell (``task|multiple|samples``); a finished cell's keys are dropped,
    the file when none is left."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, object] = json.loads(path.read_text()) if path.exists() else {}

    def get(self, key: str):
        return self.data.get(key)

    def put(self, key: str, value) -> None:
        self.data[key] = value
        self._write()

    def drop(self, *cells: str) -> None:
        """Forget finished cells and save (the file goes when nothing is left)."""
        self.data = {k: v for k, v in self.data.items() if not k.startswith(tuple(c + "|" for c in cells))}
        if self.data:
            self._write()
        elif self.path.exists():
            self.path.unlink()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        tmp.replace(self.path)  # atomic: a kill mid-write leaves the previous file


def card_tasks(loaded) -> list[str]:
    """The tasks the model's card lists, in its order: what a table covers and how its cells are sorted."""
    card = Path(loaded.spec.source) / "card.json"
    return json.loads(card.read_text()).get("tasks", []) if card.is_file() else []


def csv_path(out: Path, name: str) -> Path:
    """``<out>/<stem>.csv`` (its tables: the same path with ``.md``); a local folder's stem is its last part.

    Why: ``--models ./runs/my-t5`` must write ``<out>/my-t5.csv``, not a path
    that leaves ``<out>``."""
    return out / f"{Path(name).name if Path(name).is_dir() else name}.csv"


def run_model(name: str, task_names: list[str], multiples: list[float], samples: int, batch: int, out: Path,
              stats_docs: int = 20) -> pd.DataFrame:
    """Fill ``<out>/<name>.csv`` cell by cell; cells already there are kept (a killed run resumes)."""
    loaded = load(name)
    lt = loaded.train_length
    out.mkdir(parents=True, exist_ok=True)
    csv = csv_path(out, name)
    done = _read_csv(csv)
    rows = done.to_dict("records") if done is not None else []
    have = {(r["task"], float(r["multiple"])) for r in rows if int(r["samples"]) == samples}
    rows = [r for r in rows if (r["task"], float(r["multiple"])) in have]
    partial = Partial(csv.with_suffix(".partial.json"))
    total = len(task_names) * len(multiples)
    bar = tqdm(total=total, desc=name, file=sys.stderr)
    for task in task_names:
        for k in multiples:
            if (task, float(k)) in have:
                bar.update(1)
                continue
            n = int(round(k * lt))
            t0 = time.time()
            docs = docs_for(loaded, task, n, samples)
            encs = [engine.encode(loaded, d) for d in docs]
            cell = f"{task}|{k:g}|{samples}"
            taus = partial.get(f"{cell}|taus")
            if taus is None:
                taus = calibrated_taus(loaded, task, k, n)
                partial.put(f"{cell}|taus", taus)
            stats = partial.get(f"{cell}|dispersion|{stats_docs}")
            if stats is None:
                stats = [a.tolist() for a in dispersion(loaded, docs[:stats_docs], encs[:stats_docs], batch)]
                partial.put(f"{cell}|dispersion|{stats_docs}", stats)
            pml, hl = (np.asarray(a) for a in stats)
            cache = {}
            for m, tau in taus.items():
                key = tuple(np.atleast_1d(np.asarray(tau, float)).round(6))
                if key not in cache:
                    done_key = f"{cell}|accuracy|" + ",".join(repr(float(x)) for x in key)
                    cache[key] = partial.get(done_key)
                    if cache[key] is None:
                        cache[key] = accuracy(loaded, docs, encs, tau, batch)
                        partial.put(done_key, cache[key])
                rows.append({"model": csv.stem, "task": task, "multiple": k, "tokens": n, "method": m,
                             "tau": float(np.mean(tau)), "schedule": np.round(np.atleast_1d(tau), 3).tolist(),
                             "accuracy": cache[key], "pmax": float(pml.mean()), "entropy": float(hl.mean()),
                             "pmax_layers": np.round(pml, 4).tolist(), "entropy_layers": np.round(hl, 4).tolist(),
                             "samples": samples, "stats_docs": min(stats_docs, samples)})
            bar.update(1)
            bar.set_postfix(task=task, n=n, s=f"{time.time() - t0:.0f}")
            pd.DataFrame(rows).to_csv(csv, index=False)
            partial.drop(cell)
    bar.close()
    df = pd.DataFrame(rows)
    csv.with_suffix(".md").write_text(markdown(df, loaded, samples))
    return df


def merge(name: str, sources: list[Path], out: Path) -> pd.DataFrame | None:
    """Fold the cells of ``sources`` (other ``--out`` folders) into ``<out>/<name>.csv``, its tables and partial file.

    Why: one process may write one ``--out`` (it rewrites its whole CSV), so a
    table computed by several processes side by side (one per core, say
    ``--tasks`` split) is written to several folders and merged here. A cell
    already in ``out`` wins over the same cell elsewhere; cells are ordered
    by the model card's tasks, then length; unfinished runs of every partial
    file are kept for cells still missing."""
    loaded = load(name)
    csv = csv_path(out, name)
    frames = [df for df in (_read_csv(csv_path(d, name)) for d in [out, *sources]) if df is not None]
    if not frames:
        return None
    df = pd.concat(frames, ignore_index=True).drop_duplicates(["task", "multiple", "method"])
    order = {t: i for i, t in enumerate(card_tasks(loaded))}
    df = df.sort_values(["task", "multiple"], key=lambda c: c.map(lambda t: order.get(t, len(order))) if c.name == "task" else c,
                        kind="stable").reset_index(drop=True)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(csv, index=False)
    partial = Partial(csv.with_suffix(".partial.json"))
    for d in sources:
        partial.data.update({k: v for k, v in Partial(csv_path(d, name).with_suffix(".partial.json")).data.items()
                             if k not in partial.data})
    partial.drop(*(f"{task}|{k:g}|{n}" for (task, k, n), _ in df.groupby(["task", "multiple", "samples"])))
    csv.with_suffix(".md").write_text(markdown(df, loaded, int(df["samples"].iloc[0])))
    return df


def _read_csv(path: Path) -> pd.DataFrame | None:
    import ast

    if not path.exists():
        return None
    df = pd.read_csv(path)
    for col in ("pmax_layers", "entropy_layers", "schedule"):
        df[col] = df[col].map(ast.literal_eval)
    return df


def markdown(df: pd.DataFrame, loaded, samples: int) -> str:
    lt = loaded.train_length
    lines = [f"### {loaded.spec.name} (L_tr = {lt} tokens)", "",
             f"Accuracy (%) over {samples} documents per cell (seeds 0..{samples - 1}, needle depth drawn per seed); "
             "measured methods calibrated on 4 other documents per length (seeds >= 100000).", ""]
    for task, d in df.groupby("task", sort=False):
        mult = sorted(d["multiple"].unique())
        head = "| method | " + " | ".join(f"{m:g}x ({int(m * lt)})" for m in mult) + " |"
        lines += [f"**{task}**", "", head, "|---" * (len(mult) + 1) + "|"]
        fixed = d[d["method"].str.startswith("tau=")]
        for method in ["none", "log-length", "infoscale", "pmax", "entropy", "per-layer"]:
            cells = []
            for m in mult:
                r = d[(d["method"] == method) & (d["multiple"] == m)].iloc[0]
                cells.append(f"{r['accuracy']:.0f} (tau {r['tau']:.2f})")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        cells = []
        for m in mult:
            f = fixed[fixed["multiple"] == m]
            best = f.loc[f["accuracy"].idxmax()]
            cells.append(f"{best['accuracy']:.0f} (tau {best['tau']:.2f})")
        lines.append("| best fixed tau | " + " | ".join(cells) + " |")
        lines.append("")
    sd = int(df["stats_docs"].max()) if "stats_docs" in df and df["stats_docs"].notna().any() else samples
    lines += [f"**Dispersion at tau = 1** (mean Pmax / H per encoder layer, {df['task'].iloc[0]}, "
              f"up to {sd} documents per length; the paper's Table 1)", "",
              "| tokens | " + " | ".join(f"layer {i}" for i in range(loaded.n_layers)) + " | mean |",
              "|---" * (loaded.n_layers + 2) + "|"]
    d = df[(df["method"] == "none")]
    first = d["task"].iloc[0]
    for _, r in d[d["task"] == first].iterrows():
        cells = [f"{p:.3f} / {h:.2f}" for p, h in zip(r["pmax_layers"], r["entropy_layers"])]
        lines.append(f"| {r['tokens']} | " + " | ".join(cells) + f" | {r['pmax']:.3f} / {r['entropy']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="*", default=None)
    p.add_argument("--tasks", nargs="*", default=None)
    p.add_argument("--multiples", nargs="*", type=float, default=[1, 2, 4, 8, 16])
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--stats-docs", type=int, default=20, help="documents whose Pmax/H (tau = 1) the dispersion table averages")
    p.add_argument("--out", default="assets/results")
    p.add_argument("--tables-only", action="store_true", help="rewrite the .md tables from the existing .csv files")
    p.add_argument("--merge", nargs="+", metavar="DIR", default=None,
                   help="fold the cells of these other --out folders into --out (runs side by side need one --out each)")
    a = p.parse_args()
    out = Path(a.out)
    names = a.models or [s.name for s in bundled_specs()]
    if a.merge:
        for name in names:
            if merge(name, [Path(d) for d in a.merge], out) is not None:
                print(csv_path(out, name).with_suffix(".md").read_text())
        return
    if a.tables_only:
        for name in names:
            md = csv_path(out, name).with_suffix(".md")
            df = _read_csv(md.with_suffix(".csv"))
            if df is not None:
                md.write_text(markdown(df, load(name), int(df["samples"].iloc[0])))
                print(md.read_text())
        return
    for name in names:
        run_model(name, a.tasks or card_tasks(load(name)), a.multiples, a.samples, a.batch, out, a.stats_docs)
        print(csv_path(out, name).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
