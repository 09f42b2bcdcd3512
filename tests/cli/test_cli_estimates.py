"""Long work says first about how long it takes: the CLI's ``run`` before a pass of ESTIMATE_FROM tokens or more."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from core.data import tasks
from core.runs import engine

ROOT = Path(__file__).resolve().parents[2]


def _run(tiny_dir, tokens: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "core",
            "run",
            "--json",
            "--model",
            str(tiny_dir),
            "--tokens",
            str(tokens),
            "--device",
            "cpu",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_a_long_run_prints_its_estimate_first_and_its_json_stays_whole(tiny_dir):
    long = _run(tiny_dir, engine.ESTIMATE_FROM + 500)
    assert long.returncode == 0, long.stderr[-2000:]
    line = next(x for x in long.stderr.splitlines() if "-token pass:" in x)
    assert f"{engine.ESTIMATE_FROM + 500:,}-token pass: " in line and (" s here" in line or " min here" in line)
    assert json.loads(long.stdout)["tokens"] == engine.ESTIMATE_FROM + 500  # stdout is the JSON alone
    short = _run(tiny_dir, 600)
    assert short.returncode == 0 and "-token pass:" not in short.stderr


@pytest.mark.slow
def test_the_estimate_grows_between_linearly_and_with_the_square(tiny):
    """A document twice as long is estimated between two and four times as long (a + b n + c n^2: linear layers
    and all-pairs attention), give or take the samples' own noise (each call times its samples anew)."""
    doc = tasks.make("passkey", tiny.tokenizer, 6000, seed=1)
    enc = engine.encode(tiny, doc)
    est = engine.estimate_pass(tiny, doc, enc)
    assert math.isfinite(est) and est > 0
    sample = min(engine.SAMPLE_TOKENS, enc.n)
    twice = engine.Encoded(enc.input_ids.repeat(2), enc.offsets.repeat(2, axis=0), None, None)
    ratio = engine.estimate_pass(tiny, doc, twice) / est
    assert 1.5 < ratio < 10, ratio  # 4 at equal sample times
    assert sample == engine.SAMPLE_TOKENS
