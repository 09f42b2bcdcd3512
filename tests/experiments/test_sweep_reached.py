"""Sweep rows say whether Algorithm 1 reached the L_tr reference and the gap it left (issue 28, item 1)."""

from __future__ import annotations

import csv

import pytest

from core.data import tasks
from core.errors import UserError
from core.experiments.sweep import COLUMNS, SweepPlan, run_sweep
from core.runs import methods


def _plan(tiny, **kw) -> SweepPlan:
    base = dict(
        model=tiny.spec.name,
        task="passkey",
        lengths=[tiny.train_length, 4 * tiny.train_length],
        depths=[0.5],
        seeds=[0, 1],
        methods=["none", "pmax", "log-length"],
        calib_samples=2,
    )
    return SweepPlan(**{**base, **kw})


def test_search_rows_carry_reached_and_gap_of_the_calibration(tiny, tmp_path, one_thread):
    plan = _plan(tiny)
    out = tmp_path / "s.csv"
    df = run_sweep(tiny, plan, out=out)
    assert list(df.columns) == COLUMNS and COLUMNS[-2:] == ["reached", "gap"] and len(df) == plan.total
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for n in plan.lengths:
        calib = tasks.make(plan.task, tiny.tokenizer, n, depth=0.5, seed=plan.calib_seed + n, haystack=plan.haystack)
        info = methods.resolve(tiny, calib, "pmax", samples=plan.calib_samples)[1]
        for r in (r for r in df.to_dict("records") if r["tokens"] == n and r["method"] == "pmax"):
            assert r["reached"] in (True, False) and r["reached"] == info["reached"]
            assert isinstance(r["gap"], float) and r["gap"] == pytest.approx(info["gap"], abs=1e-6)
        for r in (r for r in rows if int(r["tokens"]) == n and r["method"] == "pmax"):
            assert r["reached"] == str(info["reached"]) and float(r["gap"]) == pytest.approx(info["gap"], abs=1e-6)
    for r in df.to_dict("records") + rows:
        if r["method"] != "pmax":
            assert r["reached"] == "" and r["gap"] == "", r


def test_resuming_a_csv_without_the_new_columns_is_refused_in_one_line(tiny, tmp_path):
    old = tmp_path / "old.csv"
    old_columns = [c for c in COLUMNS if c not in ("reached", "gap")]
    text = ",".join(old_columns) + "\r\n" + f"{tiny.spec.name},passkey,256,254,0.5,0,none,1.0,1,1,True,0.3,2.6,0.1\r\n"
    old.write_bytes(text.encode())
    with pytest.raises(UserError) as err:
        run_sweep(tiny, _plan(tiny, methods=["none"]), out=old, resume=True)
    msg = str(err.value)
    assert "\n" not in msg and "use another --out" in msg
    assert old.read_bytes() == text.encode()  # left alone


@pytest.mark.parametrize("n_calib", [1, 3])
def test_calib_samples_option_sets_the_calibration_documents(n_calib, tiny, tiny_dir, tmp_path, one_thread, capsys):
    """``sweep --calib-samples N``: Algorithm 1's tau and gap in the rows are those of N calibration documents
    (the default is 4). Two counts give two gaps, so an option the sweep ignored would fail one of them."""
    from core.cli import main

    out = tmp_path / f"c{n_calib}.csv"
    argv = ["sweep", "--model", str(tiny_dir), "--task", "passkey", "--lengths", "4x", "--methods", "pmax"]
    assert main([*argv, "--calib-samples", str(n_calib), "--out", str(out)]) == 0
    with out.open(newline="") as f:
        (row,) = list(csv.DictReader(f))
    n = 4 * tiny.train_length
    calib = tasks.make("passkey", tiny.tokenizer, n, depth=0.5, seed=SweepPlan.calib_seed + n)
    tau, info = methods.resolve(tiny, calib, "pmax", samples=n_calib)
    assert float(row["gap"]) == pytest.approx(info["gap"], abs=1e-6)
    assert float(row["tau"]) == pytest.approx(tau.mean(int(row["actual_tokens"])))
    other = methods.resolve(tiny, calib, "pmax", samples=4 if n_calib == 1 else 1)[1]
    assert other["gap"] != pytest.approx(info["gap"], abs=1e-6)  # the count matters on this model
    capsys.readouterr()
    assert main([*argv, "--calib-samples", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
