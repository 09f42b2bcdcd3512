"""Perplexity apart for sequences with and without an earlier copy: the sequences each kind scores, the rows
(CSV and ``perplexity --json``), the table, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from conftest import bench_module
from core.errors import UserError
from core.experiments.perplexity import (
    COPY_MIXED,
    COPY_WITH,
    COPY_WITHOUT,
    PerplexityPlan,
    perplexity_table,
    run_perplexity,
    sequences,
)
from core.models import load
from core.runs import methods


@pytest.fixture(scope="module")
def bundled():
    """The bundled retrieval model: its tokenizer spells a copy in ~50 tokens (a byte-level tiny model's
    copies rarely fit), and it is small enough to score a few sequences in seconds."""
    return load("retrieval-t5", device="cpu")


def test_with_and_without_are_the_same_seeds_with_and_without_the_copy(bundled):
    plan = PerplexityPlan(model="m", lengths=[256], methods=[methods.AS_TRAINED], sequences=6, seed=3)
    with_copy, without = (sequences(bundled, 256, plan, c) for c in (COPY_WITH, COPY_WITHOUT))
    mixed = sequences(bundled, 256, plan, COPY_MIXED)
    assert [d.seed for d in with_copy] == [d.seed for d in without] and len(with_copy) == 6
    assert all(d.meta["repeat"] for d in with_copy) and not any(d.meta["repeat"] for d in without)
    for a, b in zip(with_copy, without):
        assert a.meta["continuation_ids"] == b.meta["continuation_ids"] and a.text != b.text
        head = bundled.tokenizer.decode(list(a.meta["continuation_ids"])[:10]).strip()
        assert head in a.text and head not in b.text
    assert [d.seed for d in mixed] == list(range(3, 9))
    # a seed whose held-out sequence has a copy (repeat 0.75) has the same one when a copy is asked for
    copied = {d.seed: d.text for d in mixed if d.meta["repeat"]}
    assert copied and all(d.text == copied[d.seed] for d in with_copy if d.seed in copied)
    assert set(copied) <= {d.seed for d in with_copy}


def test_rows_per_copy_kind_in_csv_table_and_json(bundled, tmp_path):
    out = tmp_path / "p.csv"
    plan = PerplexityPlan(
        model="m",
        lengths=[128, 256],
        methods=[methods.AS_TRAINED, methods.BASELINE],
        sequences=2,
        continuation=8,
        copies=(COPY_WITH, COPY_WITHOUT),
    )
    df = run_perplexity(bundled, plan, out=out)
    assert len(df) == 8 and set(df["copy"]) == {COPY_WITH, COPY_WITHOUT}
    assert (df["last_seed"] >= df["first_seed"]).all()
    a = df.set_index(["tokens", "method", "copy"])["perplexity"]
    assert a[(256, methods.AS_TRAINED, COPY_WITH)] != a[(256, methods.AS_TRAINED, COPY_WITHOUT)]
    table = perplexity_table(df)
    assert table.index.names == ["copy", "method"] and table.loc[(COPY_WITH, methods.BASELINE), 256] == pytest.approx(
        a[(256, methods.BASELINE, COPY_WITH)], abs=0.01
    )
    again = run_perplexity(bundled, plan, out=out, resume=True)  # every cell done: nothing rerun
    assert len(again) == 8 and len(out.read_text().splitlines()) == 9


@pytest.mark.slow
def test_cli_copy_split_json(bundled):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "core",
            "perplexity",
            "--model",
            "retrieval-t5",
            "--lengths",
            "1x",
            "--methods",
            methods.AS_TRAINED,
            "--sequences",
            "2",
            "--continuation",
            "8",
            "--copy",
            "split,mixed",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["rows"]
    assert sorted(str(r["copy"]) for r in rows) == ["False", "None", "True"]
    for r in rows:
        assert r["sequences"] == 2 and r["perplexity"] > 1 and r["last_seed"] >= r["first_seed"]


@pytest.mark.parametrize("args", [("--copy", "sometimes"), ("--copy", "with,")])
def test_cli_bad_copy_is_one_line(args, capsys):
    from core.cli import main

    assert main(["perplexity", "--model", "retrieval-t5", "--lengths", "64", "--sequences", "2", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1 and "--copy" in err, err


def test_plan_refuses_unknown_kinds_and_lengths_too_short_for_a_copy(bundled):
    with pytest.raises(UserError, match="copies"):
        run_perplexity(
            bundled,
            PerplexityPlan(model="m", lengths=[128], methods=[methods.AS_TRAINED], sequences=2, copies=("sometimes",)),
        )
    with pytest.raises(UserError, match="earlier copy at 40 tokens"):
        run_perplexity(
            bundled,
            PerplexityPlan(model="m", lengths=[40], methods=[methods.AS_TRAINED], sequences=2, copies=(COPY_WITH,)),
        )
    with pytest.raises(UserError, match="overlap"):
        run_perplexity(
            bundled,
            PerplexityPlan(
                model="m", lengths=[128], methods=[methods.AS_TRAINED], sequences=10, calib_seed=30, copies=(COPY_WITH,)
            ),
        )


def test_old_rows_without_a_copy_column_read_as_mixed():
    df = pd.DataFrame({"method": [methods.AS_TRAINED], "tokens": [256], "perplexity": [12.5]})
    assert perplexity_table(df).loc[methods.AS_TRAINED, 256] == 12.5


def _results_bench():
    return bench_module("results")


def test_bench_table_has_a_block_per_copy_kind_and_an_oracle_each(bundled):
    bench = _results_bench()
    fixed = [methods.spell(methods.FIXED, t) for t in (0.9, 0.7)]
    plan = PerplexityPlan(
        model="m",
        lengths=[256, 512],
        methods=[methods.AS_TRAINED, *fixed],
        sequences=2,
        continuation=8,
        copies=(COPY_WITH, COPY_WITHOUT),
    )
    df = run_perplexity(bundled, plan)
    text = bench.lm_markdown(df, "m", 256, 8, 2)
    blocks = text.split("## copy: ")[1:]
    assert [b.split(":")[0] for b in blocks] == [COPY_WITH, COPY_WITHOUT]
    for kind, block in zip((COPY_WITH, COPY_WITHOUT), blocks):
        d = df[df["copy"] == kind]
        oracle = next(ln for ln in block.splitlines() if ln.startswith("| best fixed tau (oracle)"))
        best = d[d["method"].isin(fixed)].groupby("tokens")["perplexity"].min().round(2)  # as the pivot rounds
        assert oracle.split("|")[2].strip() == f"{best[256]:.1f}" and oracle.split("|")[3].strip() == f"{best[512]:.1f}"
        assert not any(ln.startswith(f"| {fixed[0]} ") for ln in block.splitlines())  # folded into the oracle
        assert f"seeds {d['first_seed'].min()}..{d['last_seed'].max()}" in block
