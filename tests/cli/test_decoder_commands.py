"""``python -m core calibrate``, ``sweep`` and ``perplexity`` on a decoder-only LM (issue 56, item 3), a tiny random
Llama saved as a folder, ``--train-length`` overridden so that "past L_tr" is cheap (as on SmolLM2 with
``--train-length 512 --tokens 1024``): each command's JSON or CSV, ``--resume`` running nothing new."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from core.cli import main
from core.experiments import perplexity
from tests.runs.test_engine_decoder import build_tiny_llama


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama-cli"), kv_heads=2)


@pytest.mark.slow
def test_calibrate(llama_dir, capsys):
    args = ["calibrate", "--model", str(llama_dir), "--train-length", "260", "--tokens", "400", "--fast", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["train_length"] == 260 and 399 <= out["tokens"] <= 400
    assert 0 < out["tau"] <= 2 and out["criterion"] == "pmax"
    taus = out["methods"]
    assert taus["log-length"] < 1 and taus["pmax"] == out["tau"]
    assert isinstance(taus["per-layer"], (float, list, dict)), taus["per-layer"]  # resolved, not "n/a (...)"


@pytest.mark.slow
def test_sweep_writes_and_resumes(llama_dir, tmp_path, capsys):
    out = tmp_path / "passkey.csv"
    args = ["sweep", "--model", str(llama_dir), "--train-length", "260", "--lengths", "1x,2x"]
    args += ["--depths", "0.3,0.7", "--methods", "none,log-length", "--out", str(out)]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "±" in table and "(2)" in table  # accuracy ± binomial SE (documents)
    df = pd.read_csv(out)
    assert len(df) == 2 * 2 * 2 and set(df["method"]) == {"none", "log-length"}
    before = out.read_text()
    assert main([*args, "--resume"]) == 0
    assert "0 jobs (0 rows)" in capsys.readouterr().err and out.read_text() == before


@pytest.mark.slow
def test_perplexity_writes_buckets_and_resumes(llama_dir, tmp_path, capsys):
    out = tmp_path / "ppl.csv"
    args = ["perplexity", "--model", str(llama_dir), "--train-length", "128", "--lengths", "1x,2x"]
    args += ["--methods", "none,log-length", "--sequences", "3", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "mean per-token NLL ± bootstrap SE" in printed
    df = pd.read_csv(out, keep_default_na=False)
    assert list(df.columns) == perplexity.COLUMNS and len(df) == 4
    two = df[(df["tokens"] == 256) & (df["method"] == "none")].iloc[0]
    assert two["nll_se"] > 0 and two["sequences"] == 3
    assert all(two[c] != "" for c in perplexity.BUCKET_COLUMNS[:3]) and two[perplexity.BUCKET_COLUMNS[3]] == ""
    before = out.read_text()
    assert main([*args, "--resume"]) == 0
    assert out.read_text() == before and "none" in capsys.readouterr().out  # nothing rerun; the table printed
    assert main([*args[:-2], "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {"nll_per_token", "nll_se", "by_position", "scheme"} <= set(rows[0])
    assert set(rows[-1]["by_position"]) == {"0-0.5x", "0.5-1x", "1-2x"}


def test_sweep_and_perplexity_take_schemes_as_mlm_does(llama_dir, tmp_path, capsys):
    """``--schemes`` (and ``--scheme-params``) on sweep and perplexity, spelt as mlm's: the rows name each scheme; a
    bad scheme is one line, exit 2."""
    out = tmp_path / "ppl.csv"
    args = ["perplexity", "--model", str(llama_dir), "--train-length", "128", "--lengths", "2x"]
    args += ["--methods", "none", "--sequences", "3", "--schemes", "none,yarn-rope", "--out", str(out)]
    assert main(args) == 0
    df = pd.read_csv(out, keep_default_na=False)
    assert sorted(df["scheme"]) == ["none", "yarn-rope"], df["scheme"]
    assert df["nll_per_token"].nunique() == 2  # the scheme reached the pass
    sweep = tmp_path / "passkey.csv"
    args = ["sweep", "--model", str(llama_dir), "--train-length", "260", "--lengths", "2x", "--depths", "0.5"]
    args += ["--methods", "none", "--schemes", "pi,ntk", "--out", str(sweep)]
    assert main(args) == 0
    assert set(pd.read_csv(sweep)["scheme"]) == {"pi", "ntk"}
    capsys.readouterr()
    assert main([*args[:-2], "--schemes", "no-such-scheme"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_perplexity_on_a_decoder_checks_memory_for_one_sequence(llama_dir, tmp_path, monkeypatch, capsys):
    """A decoder-only LM scores one sequence per pass, so the memory check before a perplexity table asks room
    for one sequence, not --batch-size of them (16,384 tokens x 8 was refused on SmolLM2 although it runs)."""
    from core.models import load, memory
    from core.runs import engine

    loaded = load(str(llama_dir), device="cpu")
    free = 1e6
    while engine_tokens(engine, loaded, memory, monkeypatch, free) < 300:  # room for one 256-token sequence ...
        free *= 1.2
    monkeypatch.setattr(memory, "free_bytes", lambda device: free)
    assert engine.max_tokens(loaded, batch=8) < 256  # ... and not for 8 of them
    out = tmp_path / "ppl.csv"
    args = ["perplexity", "--model", str(llama_dir), "--train-length", "128", "--lengths", "2x"]
    args += ["--methods", "none", "--sequences", "3", "--batch-size", "8", "--out", str(out)]
    assert main(args) == 0, capsys.readouterr().err


def engine_tokens(engine, loaded, memory, monkeypatch, free: float) -> int:
    """The longest sequence ``engine.max_tokens`` allows one at a time with ``free`` bytes free."""
    monkeypatch.setattr(memory, "free_bytes", lambda device: free)
    return engine.max_tokens(loaded)


def test_perplexity_says_before_a_calibration_what_it_runs_and_shows_its_progress(llama_dir, tmp_path, capsys):
    """Algorithm 1 at 2x is minutes of passes on a real LM before a cell's first sequence (on SmolLM2, about 5 of
    3.5 min each): the command says how many passes, then draws the search's bar, rather than sitting at 0/3."""
    args = ["perplexity", "--model", str(llama_dir), "--train-length", "128", "--lengths", "2x"]
    args += ["--methods", "none,pmax", "--sequences", "2", "--samples", "1", "--out", str(tmp_path / "p.csv")]
    assert main(args) == 0
    err = capsys.readouterr().err
    note = next((line for line in err.splitlines() if line.startswith("calibrating pmax at 256 tokens will run")), "")
    assert "encoder passes at 256 tokens" in note and "on this machine" in note, err  # tau = 1's cell timed a pass
    assert "calibrating: 100%" in err, err
    assert main([*args, "--resume"]) == 0
    assert "calibrating" not in capsys.readouterr().err  # nothing left to calibrate
