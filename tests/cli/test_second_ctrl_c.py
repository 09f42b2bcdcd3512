"""A second Ctrl-C while the first is being honoured is quiet (hardening, round four).

``sweep --out`` got SIGINT once it had written a row, then another 20-200 ms later: the process printed
``interrupted: ...`` and then died by SIGINT (exit -2 as Python's subprocess sees it) instead of exit 130, because
the interpreter's shutdown puts the default SIGINT action back. The rows stayed whole either way; the exit status
is what a script reads. Here the two signals come a few ms apart, at several gaps.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: seconds to wait for the first row and for the stop (hang bounds, not timings)
HANG_S = 240


@pytest.mark.parametrize("gap_s", [0.005, 0.05, 0.15])
@pytest.mark.slow
def test_a_second_sigint_soon_after_the_first_still_exits_130_with_whole_rows(tiny_dir, tmp_path, gap_s):
    out = tmp_path / "sweep.csv"
    argv = [
        sys.executable,
        "-m",
        "core",
        "sweep",
        "--model",
        str(tiny_dir),
        "--lengths",
        "1x,2x",
        "--depths",
        "0.5",
        "--samples",
        "40",
        "--methods",
        "none,tau=0.8",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]
    run = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline and run.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= 2:  # the header and a row
                break
            time.sleep(0.01)
        assert run.poll() is None, "finished before it could be interrupted"
        run.send_signal(signal.SIGINT)
        time.sleep(gap_s)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=HANG_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 130, f"exit {run.returncode}: {err[-1500:]}"
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    assert "Traceback" not in err and sum(ln.startswith("interrupted: ") for ln in lines) == 1, err[-1500:]
    assert lines[-1].startswith("interrupted: ") and "--resume" in lines[-1]
    raw = out.read_text()
    assert raw.endswith("\n")
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(None not in row and None not in row.values() for row in rows)
