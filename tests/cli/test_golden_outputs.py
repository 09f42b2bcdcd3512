"""The CLI's JSON and CSV for fixed inputs on the bundled default model, against outputs saved before a refactor.

Saved 2026-11-25 from commit 011df24 (before the method registry, core.runs.methods):
``python -m core run --json --tokens 512 --method pmax|infoscale``,
``calibrate --json --tokens 512 --fast`` and ``sweep --lengths 1x,2x
--methods none,log-length,prop2,0.8 --depths 0.5`` (stdout). Moving code
between modules must not change a number: everything but timings is
compared (floats to 1e-6 relative, for other CPUs' rounding). What was
added since, by name (:data:`ADDED`), may appear beside: methods the registry
gained (their own keys in ``calibrate``'s ``methods``) and Algorithm 1's
``reached`` / ``gap`` / ``band``, ``device`` / ``dtype`` (where and in what precision), and the sweep CSV's ``reached`` / ``gap``
columns (:data:`ADDED_COLUMNS`); every key that was there must still hold
what it held.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest

from core.cli import main
from core.models import default_model
from core.runs.methods import NAMES

GOLDEN = Path(__file__).with_name("golden")
TIMINGS = {"seconds", "timings"}
ADDED = {
    "": {"reached", "gap", "band", "device", "dtype"},
    ".methods": set(NAMES),
}  # where new keys may appear (see the docstring)
ADDED_COLUMNS = {"sweep.csv": ["reached", "gap"]}  # columns a CSV gained since (see the docstring)
#: ``--device cpu``: the goldens are CPU float32 numbers; on a GPU machine the default (CUDA, bfloat16) moves them.
CASES = {
    "run_pmax.json": ["run", "--json", "--tokens", "512", "--method", "pmax", "--device", "cpu"],
    "run_infoscale.json": ["run", "--json", "--tokens", "512", "--method", "infoscale", "--device", "cpu"],
    "calibrate.json": ["calibrate", "--json", "--tokens", "512", "--fast", "--device", "cpu"],
    "sweep.csv": [
        "sweep",
        "--lengths",
        "1x,2x",
        "--methods",
        "none,log-length,prop2,0.8",
        "--depths",
        "0.5",
        "--device",
        "cpu",
    ],
}

pytestmark = [
    pytest.mark.skipif(default_model() is None, reason="no bundled model in assets/models"),
    pytest.mark.usefixtures("one_thread"),
]


def _same(got, want, where: str = "") -> None:
    if isinstance(want, dict):
        added = ADDED.get(where, set()) - set(want)
        assert isinstance(got, dict) and set(got) - TIMINGS - added == set(want) - TIMINGS, where
        for k in set(want) - TIMINGS:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9), where
    else:
        assert got == want, where


@pytest.mark.parametrize("name", list(CASES))
def test_cli_output_is_what_it_was(name, capsys):
    capsys.readouterr()
    assert main(CASES[name]) == 0
    out = capsys.readouterr().out
    want = (GOLDEN / name).read_text()
    if name.endswith(".json"):
        _same(json.loads(out), json.loads(want))
    else:
        got_df, want_df = (pd.read_csv(io.StringIO(t)).drop(columns=["seconds"]) for t in (out, want))
        added = [c for c in ADDED_COLUMNS.get(name, []) if c not in want_df.columns]
        assert set(added) <= set(got_df.columns), name
        got_df = got_df.drop(columns=added)
        pd.testing.assert_frame_equal(got_df, want_df, rtol=1e-6)
