"""bench/gpu.py's grid step (issue 49, point 6): the scrubber's 15-frame grid through the app's code, on the CPU.

The GPU figure (Flan-T5-XL shape, 32,768 tokens) needs a GPU; this checks the
step itself runs, on the tiny shape at a short length, and that it records what
the app's Explore page records.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_grid_probes_are_the_explore_pages():
    sys.path.insert(0, str(ROOT))
    from bench import gpu
    from ui import cache

    assert gpu.grid_probes(3) == cache.explore_probes(3, None)


@pytest.mark.slow
def test_the_grid_step_builds_15_frames_on_the_cpu(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench import gpu
    from core.views import frames

    out = tmp_path / "gpu.json"
    assert (
        gpu.main(["--shape", "tiny", "--length", "300", "--device", "cpu", "--steps", "", "--grid", "--json", str(out)])
        == 0
    )
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["step"] == "grid" and row["seconds"] > 0 and len(row["all"]) == 1
    parts = row["parts"]
    assert parts["frames"] == len(frames.SCRUB_GRID) == 15
    assert set(parts["seconds"]) == {f"{t:.2f}" for t in frames.SCRUB_GRID} | {"reference", "payload"}
    assert parts["payload_bytes"] > 0 and 0 < parts["passes_s"] <= row["seconds"]
