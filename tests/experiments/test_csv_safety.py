"""CSV formula injection (OWASP): hostile text cells are neutralised in every CSV we write; numbers stay numbers."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.experiments import batch, csvio
from core.experiments.sweep import SweepPlan, run_sweep
from core.views import tables

HOSTILE = ['=HYPERLINK("http://x","y")', "=1+1", "+1+cmd", "-2+3", "@SUM(A1)", "\tx", "\rx", "'=1+1"]
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


pytestmark = pytest.mark.usefixtures("one_thread")


def _cells(data: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))


def _assert_safe(cells: list[list[str]]) -> None:
    for row in cells:
        for c in row:
            assert not c.startswith(FORMULA_START) or csvio._NUMBER.fullmatch(c), (c, row)


@pytest.mark.parametrize("text", HOSTILE + ["-x", "@", "'", "''=a", "plain", ""])
def test_neutralise_is_reversible_and_leaves_no_formula(text):
    safe = csvio.neutralise(text)
    assert not safe.startswith(FORMULA_START)
    assert csvio.restore(safe) == text
    if not text.lstrip("'").startswith(FORMULA_START):
        assert safe == text  # ordinary text is written as it is


@pytest.mark.parametrize("value", [-5, -0.25, 3, 1.5e-7, None, True, "-5", "-0.25", "+3", "1e-3"])
def test_numbers_stay_numbers(value):
    assert csvio.neutralise(value) == value


def test_batch_csv_neutralises_ids_and_expected_and_resume_recognises_them(tiny, tmp_path):
    docs = [{"id": h, "text": f"Document {i} says hello.", "expected": h} for i, h in enumerate(HOSTILE)]
    docs.append({"id": "neg", "text": "A number doc.", "expected": -5})
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    items = batch.read_jsonl(data, tiny.tokenizer, report=pytest.fail)
    out = tmp_path / "rows.csv"
    setting = [batch.Setting("none", "none")]
    assert batch.run_items(tiny, items, setting, out=out)["written"] == len(docs)
    cells = _cells(out.read_bytes())
    _assert_safe(cells)
    col = {c: i for i, c in enumerate(cells[0])}
    ids = [r[col["id"]] for r in cells[1:]]
    assert sorted(ids) == sorted(csvio.neutralise(h) for h in HOSTILE) + ["neg"]
    assert "'=1+1" in ids and "''=1+1" in ids  # "=1+1" and "'=1+1" stay two ids
    neg = next(r for r in cells[1:] if r[col["id"]] == "neg")
    assert neg[col["expected"]] == "-5"
    # every row is recognised as done, the neutralised ids included
    assert batch.run_items(tiny, items, setting, out=out, resume=True) == {
        "written": 0,
        "skipped": len(docs),
        "failed": 0,
    }
    assert len(_cells(out.read_bytes())) == len(docs) + 1


def test_sweep_csv_neutralises_text_and_resume_recognises_it(tiny, tmp_path):
    """The model label is the one text cell of a sweep row we choose here; floats stay numbers."""
    out = tmp_path / "s.csv"
    plan = SweepPlan(
        model='=HYPERLINK("http://evil")', task="passkey", lengths=[300], depths=[0.5], seeds=[0, 1], methods=["0.7"]
    )
    df = run_sweep(tiny, plan, out=out)
    cells = _cells(out.read_bytes())
    _assert_safe(cells)
    col = {c: i for i, c in enumerate(cells[0])}
    assert {r[col["model"]] for r in cells[1:]} == {"'" + plan.model}
    assert all(float(r[col["tau"]]) == 0.7 for r in cells[1:])
    assert set(df["model"]) == {plan.model}  # the table in memory keeps the text as it was
    ran: list[dict] = []
    df2 = run_sweep(tiny, plan, out=out, resume=True, progress=lambda d, t, row: row and ran.append(row))
    assert ran == [] and len(df2) == plan.total
    assert set(df2["model"]) == {plan.model}


def test_app_downloads_are_neutralised_and_keep_negative_floats(tiny):
    from ui import csv_of

    curves = np.array([[-1.25, 0.5, -3.0], [2.0, -0.75, 0.0]])
    got = pd.read_csv(io.BytesIO(csv_of(lambda: tables.rpe_table(curves))()))
    assert np.array_equal(got.to_numpy(), curves.T) and got.dtypes.map(pd.api.types.is_float_dtype).all()

    df = pd.DataFrame(
        {"label": HOSTILE, "value": -np.arange(len(HOSTILE), dtype=float) - 0.5},
        index=pd.Index([f"=r{i}" for i in range(len(HOSTILE))], name="row"),
    )
    data = csv_of(lambda: df)()
    cells = _cells(data)
    _assert_safe(cells)
    back = pd.read_csv(io.BytesIO(data), index_col=0, keep_default_na=False)
    assert back["value"].tolist() == df["value"].tolist()
    assert [csvio.restore(v) for v in back["label"]] == HOSTILE
    assert [csvio.restore(v) for v in back.index] == list(df.index)


def test_write_csv_for_files(tmp_path: Path):
    """What ``python -m core rpe --out`` is to use: the same rule, to a file."""
    df = pd.DataFrame({"n": [0, 1], "head0": [-0.5, 1.5], "note": ["=bad", "ok"]})
    out = tmp_path / "x.csv"
    csvio.write_csv(df, out)
    assert _cells(out.read_bytes()) == [["n", "head0", "note"], ["0", "-0.5", "'=bad"], ["1", "1.5", "ok"]]
