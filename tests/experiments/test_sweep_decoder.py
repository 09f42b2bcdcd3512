"""A pass-key sweep on a decoder-only LM (issue 56 item 3, issue 57 item 3) on a tiny random Llama: rows for every
length x depth x seed x method with the greedy answer scored, a measured method calibrated on the question's rows,
``resume`` skipping finished rows, the table's binomial SE, and a position scheme's cells carried by their choice
(or refused in one line while decoder-only models take none)."""

from __future__ import annotations

import pandas as pd
import pytest

from core.errors import UserError
from core.experiments import sweep
from core.experiments.sweep import SweepPlan, accuracy_se_table, run_sweep
from core.models import load
from tests.runs.test_engine_decoder import build_tiny_llama


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load(str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama-sweep"), kv_heads=2)), device="cpu")


@pytest.mark.slow
def test_passkey_sweep_rows_and_resume(llama, tmp_path):
    out = tmp_path / "sweep.csv"
    plan = SweepPlan(
        model="tiny",
        task="passkey",
        lengths=[250, 400],
        depths=[0.2, 0.8],
        seeds=[0],
        methods=["none", "log-length", "pmax"],
        calib_samples=1,
    )
    df = run_sweep(llama, plan, out=out)
    assert len(df) == 2 * 2 * 1 * 3 and list(df.columns) == sweep.COLUMNS
    assert set(df["correct"]) <= {True, False} and (df["expected"].astype(str).str.len() > 0).all()
    long = df[df["tokens"] == 400].set_index("method")["tau"]
    assert long["none"].iloc[0] == 1.0 and long["log-length"].iloc[0] < 1.0  # past L_tr (256)
    assert df[df["method"] == "pmax"]["reached"].astype(str).isin(["True", "False"]).all()
    before = out.read_text()
    again = run_sweep(llama, plan, out=out, resume=True)
    assert out.read_text() == before and len(again) == len(df)


def test_binomial_se_table():
    df = pd.DataFrame(
        {"method": ["none"] * 4 + ["pmax"] * 4, "tokens": [8] * 8, "correct": [True, True, True, False] + [False] * 4}
    )
    table = accuracy_se_table(df)
    assert table.loc["none", 8] == "75.0 ± 21.7 (4)"  # sqrt(.75 .25 / 4) = 0.2165
    assert table.loc["pmax", 8] == "0.0 ± 0.0 (4)"


@pytest.mark.slow
def test_scheme_cells(llama, tmp_path):
    plan = SweepPlan(
        model="tiny",
        task="passkey",
        lengths=[300],
        depths=[0.5],
        seeds=[0],
        methods=["none"],
        schemes=("none", "yarn-rope"),
    )
    assert plan.has_schemes and sweep.columns(plan)[-2:] == sweep.SCHEME_COLUMNS
    try:
        df = run_sweep(llama, plan, out=tmp_path / "s.csv")
    except UserError as err:  # until decoder-only models take position schemes: one line naming the scheme
        assert "yarn-rope" in str(err) and "\n" not in str(err)
        return
    assert list(df["scheme"]) == ["none", "yarn-rope"]
    assert accuracy_se_table(df).index.tolist() == ["none", "yarn-rope + none"]


def test_a_plain_plan_keeps_the_columns():
    plan = SweepPlan(model="m", task="passkey", lengths=[64], depths=[0.5], seeds=[0], methods=["none"])
    assert not plan.has_schemes and sweep.columns(plan) == sweep.COLUMNS
    with pytest.raises(UserError, match="twice"):
        SweepPlan(
            model="m", task="passkey", lengths=[64], depths=[0.5], seeds=[0], methods=["none"], schemes=("pi", "pi")
        ).validated()


def test_a_decoder_rows_pmax_and_entropy_are_the_questions(llama, tmp_path):
    """A decoder-only LM's sweep row reads Pmax and H on the question's rows (as Algorithm 1 does, issue 57's
    dispersion), not on every prompt row: the row equals a run asking the question's rows, and differs from one
    asking every row."""
    from core.data import tasks
    from core.mechanics.probes import ProbeSpec
    from core.runs import engine
    from core.values.choice import Choice

    plan = SweepPlan(model="tiny", task="passkey", lengths=[300], depths=[0.5], seeds=[0], methods=["tau=0.8"])
    (row,) = run_sweep(llama, plan, out=tmp_path / "s.csv").to_dict("records")
    doc = tasks.make("passkey", llama.tokenizer, 300, depth=0.5, seed=0)
    choice = Choice.of(tau=0.8, method="tau=0.8")
    stats = {}
    for question in (True, False):
        res = engine.run(llama, doc, choice, engine.Pass(probes=ProbeSpec.stats_only(question_rows=question)))
        stats[question] = (round(res.pmax, 5), round(res.entropy, 5))
    assert (row["pmax"], row["entropy"]) == stats[True] != stats[False]
