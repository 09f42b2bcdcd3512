"""bench/gpu.py's decoder shapes (issue 56, item 5): SmolLM2's prefill for a lent GPU, run here on the tiny shape.

The GPU figure (a SmolLM2-135M-shaped Llama at 32,768 tokens) needs a GPU; this checks the same code path runs on
the CPU at a short length, every step of a decoder, and that the T5-only steps are refused in one line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_decoder_steps_run_on_the_tiny_shape(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench import gpu

    out = tmp_path / "gpu.json"
    steps = "sdpa,no-probes,probes-stats,probes-full"
    args = ["--shape", "tiny-llama", "--length", "300", "--device", "cpu", "--repeats", "1", "--steps", steps]
    assert gpu.main([*args, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["step"] for r in data["rows"]] == steps.split(",")
    assert all(r["seconds"] > 0 for r in data["rows"]) and 250 < data["tokens"] <= 300


def test_a_decoder_shape_refuses_the_t5_steps(capsys):
    sys.path.insert(0, str(ROOT))
    from bench import gpu

    with pytest.raises(SystemExit) as err:
        gpu.main(["--shape", "tiny-llama", "--device", "cpu", "--steps", "app-run"])
    assert err.value.code == 2
    assert "T5's steps" in capsys.readouterr().err
    assert gpu.DECODER_SHAPES["smollm2-135m"]["num_key_value_heads"] == 3
