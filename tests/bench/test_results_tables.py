"""bench/results.py's tables show each cell with its count and a binomial standard error (issue 48), the
masked-token table holds at least 8 sequences per cell, and the RULER block resumes and grows cell by cell."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

import bench.results as br


def test_binomial_se_and_the_cell_by_hand():
    assert br.binomial_se(0.57, 100) == pytest.approx(math.sqrt(0.57 * 0.43 / 100))
    assert br.binomial_se(0.0, 100) == 0.0 and br.binomial_se(1.0, 48) == 0.0
    assert br.count_cell(57.0, 100, "tau 1.00") == "57 ± 5.0 (57/100, tau 1.00)"
    # 77.1 % of 48 documents is 37 of them; SE sqrt(.771 * .229 / 48) = 6.06 points
    assert br.count_cell(100 * 37 / 48, 48) == "77 ± 6.1 (37/48)"
    assert br.count_cell(25.0, 20, "tau 0.73*") == "25 ± 9.7 (5/20, tau 0.73*)"


def test_retrieval_markdown_cells_carry_count_and_se():
    loaded = SimpleNamespace(train_length=256, n_layers=1, spec=SimpleNamespace(name="m"))
    rows = []
    for k, accs in ((1, (100, 100)), (8, (5, 61))):
        for method, acc in zip(("none", "llama4"), accs):
            rows.append(
                {
                    "task": "passkey",
                    "multiple": k,
                    "tokens": 256 * k,
                    "method": method,
                    "tau": 1.0,
                    "accuracy": acc,
                    "samples": 100,
                    "reached": "",
                    "pmax": 0.3,
                    "entropy": 2.0,
                    "pmax_layers": [0.3],
                    "entropy_layers": [2.0],
                    "stats_docs": 20,
                    "distinct_docs": 100,
                }
            )
        for t, acc in ((1.0, accs[0]), (0.7, 100)):
            rows.append({**rows[-1], "method": f"tau={t:g}", "tau": t, "accuracy": acc})
    md = br.markdown(pd.DataFrame(rows), loaded, 100)
    assert "| none (tau = 1) | 100 ± 0.0 (100/100, tau 1.00) | 5 ± 2.2 (5/100, tau 1.00) |" in md
    assert "61 ± 4.9 (61/100, tau 1.00)" in md
    assert "| best fixed tau (oracle) | 100 ± 0.0 (100/100, tau 1.00) | 100 ± 0.0 (100/100, tau 0.70) |" in md
    assert "binomial standard error" in md


def test_mlm_cells_carry_the_se_over_masked_positions():
    dot = SimpleNamespace(train_length=64, spec=SimpleNamespace(name="dot"))
    cos = SimpleNamespace(spec=SimpleNamespace(name="cos"), cosine_scale=16.0)
    df = pd.DataFrame(
        [
            {
                "scheme": "window",
                "variant": v,
                "tokens": 4096,
                "sequences": 8,
                "masked": 4912,
                "accuracy": 0.329,
                "perplexity": 29.79,
            }
            for v in br.MLM_VARIANTS
        ]
    )
    md = br.mlm_markdown(df, dot, cos)
    se = math.sqrt(0.329 * 0.671 / 4912)  # 0.0067
    assert f"29.79 / 0.33 ± {se:.3f}" in md and f"{se:.3f}" == "0.007"
    assert "4,096: 8 sequences, >= 4912 masked" in md


def test_mlm_sequences_at_least_the_asked_count(monkeypatch):
    seq = SimpleNamespace(positions=list(range(614)))  # mlm.sequence's masked positions at 4,096 tokens
    monkeypatch.setattr(br.mlm, "sequence", lambda loaded, n, seed: (None, seq))
    assert br.mlm_sequences(None, 4096, 500) == 1
    assert br.mlm_sequences(None, 4096, 500, 0, 8) == 8
    assert br.mlm_sequences(None, 4096, 4800, 0, 1) == 8  # 8 x 614 = 4,912 >= 4,800 > 7 x 614
    assert br.mlm_sequences(None, 4096, 5000, 0, 8) == 9
    assert br.MLM_MIN_SEQUENCES >= 8


def test_ruler_block_resumes_and_grows(tmp_path, monkeypatch):
    calls = []

    def fake_accuracy(loaded, docs, encs, tau, batch):
        calls.append(len(docs))
        return 50.0

    monkeypatch.setattr(br, "accuracy", fake_accuracy)
    out = tmp_path / "r"
    md = br.run_ruler("retrieval-t5", ["multikey"], [1, 2], 2, 2, out, ["none", "log-length"])
    csv = out / "ruler-retrieval-t5.csv"
    first = pd.read_csv(csv)
    assert len(first) == 4 and len(calls) == 3  # 1x: none and log-length are both tau 1, one run
    assert "50 ± 35.4 (1/2, tau 1.00)" in md.read_text()

    calls.clear()
    br.run_ruler("retrieval-t5", ["multikey"], [1, 2], 2, 2, out, ["none", "log-length"])
    assert calls == [] and len(pd.read_csv(csv)) == 4  # nothing measured again

    br.run_ruler("retrieval-t5", ["vartrack"], [1], 2, 2, out, ["none"])  # another row into the same block
    both = pd.read_csv(csv)
    assert len(calls) == 1 and len(both) == 5 and set(both["task"]) == {"multikey", "vartrack"}
    text = md.read_text()
    assert "**multikey**" in text and "**vartrack**" in text

    # killed after its first cell: the rows written so far stay, the rerun measures only the rest
    def boom(*a, **k):
        raise KeyboardInterrupt

    calls.clear()
    orig = br.ruler_rows

    def stop_after_first(*a, on_cell=None, **k):
        def once(cell):
            on_cell(cell)
            boom()

        return orig(*a, on_cell=once, **k)

    monkeypatch.setattr(br, "ruler_rows", stop_after_first)
    with pytest.raises(KeyboardInterrupt):
        br.run_ruler("retrieval-t5", ["multikey"], [4, 8], 2, 2, out, ["none"])
    assert len(pd.read_csv(csv)) == 6 and len(calls) == 1
    monkeypatch.setattr(br, "ruler_rows", orig)
    br.run_ruler("retrieval-t5", ["multikey"], [4, 8], 2, 2, out, ["none"])
    assert len(pd.read_csv(csv)) == 7 and len(calls) == 2
