"""bench/real_llm_tables.py: the Markdown of issue 57's three tables holds exactly the CSVs' numbers (the perplexity
cell's NLL ± SE and its position buckets, the pass key's accuracy ± binomial SE, the dispersion's means)."""

from __future__ import annotations

import pandas as pd

from bench import real_llm_tables
from core.experiments import csvio, perplexity, sweep


def _write(path, columns, rows):
    with csvio.ResultCSV(path, columns, "test") as sink:
        for r in rows:
            sink.write({c: r.get(c, "") for c in columns})


def test_markdown_from_the_csvs(tmp_path):
    stem = tmp_path / "m"
    ppl = [
        {
            "model": "m",
            "tokens": n,
            "scheme": "none",
            "method": m,
            "copy": "mixed",
            "nll_per_token": 3 + i / 7,
            "nll_se": 0.01 * (i + 1),
            "perplexity": 20,
            "nll_0-0.5x": 3.1 + i,
            "nll_1-2x": "" if n == 4 else 3.3,
        }
        for i, (n, m) in enumerate([(4, "none"), (8, "none"), (8, "yarn")])
    ]
    ppl[2]["scheme"], ppl[2]["method"] = "yarn-rope", "log-length"
    _write(tmp_path / "m-perplexity.csv", perplexity.COLUMNS, ppl)
    keys = [{"model": "m", "task": "passkey", "tokens": 8, "method": "none", "correct": c} for c in (1, 1, 0, 1, 0)]
    _write(tmp_path / "m-passkey.csv", sweep.COLUMNS, keys)
    assert real_llm_tables.main(["--stem", str(stem)]) == 0
    md = (tmp_path / "m.md").read_text()
    assert f"{3 + 1 / 7:.3f} ± 0.020" in md and "yarn-rope + log-length" in md
    assert "| none | 8 | 4.1 | 3.3 |" in md and "0.5-1x" not in md  # the buckets with a value: 0-0.5x, 1-2x
    assert "60.0 ± 21.9 (5)" in md  # 3 of 5, sqrt(.6 .4 / 5) = 0.219
    assert "Dispersion" not in md  # no CSV, no table


def test_no_csv_is_one_line(tmp_path, capsys):
    assert real_llm_tables.main(["--stem", str(tmp_path / "none")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_markdown_table():
    df = pd.DataFrame({"a": [1, 2]}, index=pd.Index(["x", "y"], name="k"))
    assert real_llm_tables.markdown_table(df) == "| k | a |\n|---|---|\n| x | 1 |\n| y | 2 |"
