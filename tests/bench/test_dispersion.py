"""bench/dispersion.py (issue 57, item 1) on a tiny random Llama: one row per length x method x layer with the
question rows' Pmax and H (as Calibrate reads them), a method's tau applied, ``--resume`` running nothing twice."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench import dispersion
from core.models import load
from core.runs import calibration
from tests.runs.test_engine_decoder import build_tiny_llama


@pytest.mark.slow
def test_rows_per_layer_and_resume(tmp_path):
    folder = build_tiny_llama(tmp_path / "llama", kv_heads=2)
    out = tmp_path / "dispersion.csv"
    args = ["--model", str(folder), "--train-length", "260", "--multiples", "1", "2", "--documents", "2"]
    args += ["--methods", "none", "log-length", "--out", str(out)]
    assert dispersion.main(args) == 0
    df = pd.read_csv(out, keep_default_na=False)
    assert len(df) == 2 * 2 * 2 and list(df.columns) == dispersion.COLUMNS
    loaded = load(str(folder), train_length=260)
    docs = dispersion.documents(loaded, 520, 2)
    want = calibration.measure(loaded, docs)(1.0)
    got = df[(df["tokens"] == 520) & (df["method"] == "none")].sort_values("layer")
    np.testing.assert_allclose(got["pmax"], want.pmax, atol=2e-6)
    np.testing.assert_allclose(got["entropy"], want.entropy, atol=2e-6)
    long = df[(df["tokens"] == 520) & (df["method"] == "log-length")]
    assert long["tau"].iloc[0] == pytest.approx(np.log(260) / np.log(520), abs=1e-4)
    assert (long["pmax"].to_numpy() != got["pmax"].to_numpy()).all()
    before = out.read_text()
    assert dispersion.main([*args, "--resume"]) == 0 and out.read_text() == before


def test_depths_spread():
    assert dispersion.depths(1) == [0.5] and dispersion.depths(5) == [0.1, 0.3, 0.5, 0.7, 0.9]
