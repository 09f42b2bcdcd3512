"""The real-LLM tables (issue 57) as Markdown, from the CSVs their commands write (docs/real-llm.md):

    python bench/real_llm_tables.py [--stem assets/results/smollm2] [--out assets/results/smollm2.md]

reads ``<stem>-perplexity.csv`` (``python -m core perplexity``), ``<stem>-passkey.csv`` (``python -m core
sweep``) and ``<stem>-dispersion.csv`` (``bench/dispersion.py``), whichever exist, and writes one Markdown file:
Table 3 (mean per-token NLL ± bootstrap SE over sequences, and the NLL by position bucket), the pass-key table
(accuracy ± binomial SE, documents per cell) and the dispersion table (the question rows' Pmax and H, mean over
layers ± the SE over documents of that mean). Numbers only from the CSVs: a cell not run yet is not there.
Safe to run while the tables are still being written (rows are whole lines).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # core, also without an installed package

import pandas as pd  # noqa: E402

from core.experiments import perplexity, sweep  # noqa: E402


def markdown_table(df: pd.DataFrame, index: bool = True) -> str:
    """A GitHub Markdown table of ``df`` (its index as the first column when ``index``): no extra package."""
    d = df.reset_index() if index else df
    head = [str(c) for c in d.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in d.itertuples(index=False):
        lines.append("| " + " | ".join("" if v is None or v != v else str(v) for v in row) + " |")
    return "\n".join(lines)


def _read(path: Path) -> pd.DataFrame | None:
    return pd.read_csv(path, keep_default_na=False) if path.exists() and path.stat().st_size else None


def perplexity_md(df: pd.DataFrame) -> str:
    out = ["## Perplexity (Table 3): mean per-token NLL ± bootstrap SE over sequences", ""]
    out += [markdown_table(perplexity.nll_table(df)), ""]
    d = perplexity._labelled(df)
    cols = [c for c in perplexity.BUCKET_COLUMNS if (d[c] != "").any()]
    if cols:
        out += ["NLL by position of the scored token (in units of L_tr):", ""]
        table = d[["method", "tokens", *cols]].rename(columns={c: c.removeprefix("nll_") for c in cols})
        out += [markdown_table(table, index=False), ""]
    return "\n".join(out)


def passkey_md(df: pd.DataFrame) -> str:
    return "\n".join(
        [
            "## Pass key: accuracy (%) ± binomial SE in points (documents)",
            "",
            markdown_table(sweep.accuracy_se_table(df)),
            "",
        ]
    )


def dispersion_md(df: pd.DataFrame) -> str:
    """Mean over layers of the question rows' Pmax and H per length x method, ± the SE over documents (the
    per-layer SEs averaged: an upper bound on the SE of the mean over layers)."""
    g = df.groupby(["method", "tokens"], sort=False)
    t = g.agg(tau=("tau", "first"), pmax=("pmax", "mean"), pse=("pmax_se", "mean"), h=("entropy", "mean"))
    t = t.join(g.agg(hse=("entropy_se", "mean"), docs=("documents", "first")))
    cells = t.apply(
        lambda r: f"{r['pmax']:.4f} ± {r['pse']:.4f} / {r['h']:.3f} ± {r['hse']:.3f} (tau {r['tau']:.3f})", axis=1
    )
    table = cells.unstack("tokens")
    return "\n".join(
        [
            "## Dispersion: the question rows' Pmax / H, mean over layers (± SE over documents)",
            "",
            markdown_table(table),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stem", default="assets/results/smollm2", help="the CSVs' common start")
    p.add_argument("--out", default=None, help="Markdown file (default: <stem>.md)")
    args = p.parse_args(argv)
    stem = Path(args.stem)
    parts = []
    for suffix, render in (("perplexity", perplexity_md), ("passkey", passkey_md), ("dispersion", dispersion_md)):
        df = _read(stem.with_name(f"{stem.name}-{suffix}.csv"))
        if df is not None and len(df):
            parts.append(render(df))
    if not parts:
        print(f"error: no {stem}-*.csv with rows yet", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else stem.with_suffix(".md")
    out.write_text(f"# {stem.name}: the real-LLM tables (from the CSVs beside this file)\n\n" + "\n".join(parts))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
