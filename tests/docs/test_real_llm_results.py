"""The real-LLM section of docs/results.md says only what its CSV holds: each of its table's cells is the CSV's mean
per-token NLL ± bootstrap SE of that method and length, to the digits shown (issue 57: every number in the new
docs section comes from the CSVs)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "assets" / "results" / "smollm2-perplexity.csv"
NAMES = {"tau = 1": "none", "log-length": "log-length"}


def _section() -> str:
    text = (ROOT / "docs" / "results.md").read_text()
    start = text.index("## On a real LLM: SmolLM2-135M")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_the_sections_table_is_the_csvs():
    df = pd.read_csv(CSV, keep_default_na=False)
    section = _section()
    header = next(line for line in section.splitlines() if line.startswith("| method |"))
    lengths = [int(re.sub(r"\D", "", c.split("tokens")[0])) for c in header.strip("|").split("|")[1:]]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    assert rows, "the section has its table"
    seen = 0
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        method = NAMES[cells[0]]
        for tokens, cell in zip(lengths, cells[1:]):
            row = df[(df["method"] == method) & (df["tokens"] == tokens) & (df["scheme"] == "none")].iloc[0]
            assert cell == f"{row['nll_per_token']:.3f} ± {row['nll_se']:.3f}", (method, tokens, cell)
            seen += 1
    assert seen == len(rows) * len(lengths)


def test_the_position_figures_are_the_csvs():
    df = pd.read_csv(CSV, keep_default_na=False)
    row = df[(df["method"] == "none") & (df["tokens"] == 8192)].iloc[0]
    section = _section()
    assert f"{float(row['nll_0.5-1x']):.3f}" in section and f"{float(row['nll_0-0.5x']):.3f}" in section
