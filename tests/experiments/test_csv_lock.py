"""The CSV lock follows the real file, not the name typed: symlinks, hard links, ``rpe --out`` (issue 36, cause 3).

Why: the lock used to sit beside the name given to ``--out``, so a second
sweep writing through a symlink to a running sweep's CSV, or through a hard
link with ``--resume``, took a lock of its own and interleaved or doubled the
rows, and ``rpe --out`` renamed a new file over a running sweep's CSV. Each
test holds a real lock (a real sweep, in this process or as a second
``python -m core`` process, or :class:`core.experiments.csvio.ResultCSV` itself) and
checks that every other name for the same file is refused in one line and
that the holder's rows come out whole.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from core.cli import main
from core.errors import UserError
from core.experiments import csvio
from core.experiments.sweep import KEY, SweepPlan, run_sweep

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["id", "value"]

pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _names(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """The real CSV (empty for now), a symlink to it, a hard link to it, and its path through a symlinked folder."""
    real = tmp_path / "real" / "results.csv"
    real.parent.mkdir()
    real.write_bytes(b"")
    link = tmp_path / "link.csv"
    link.symlink_to(real)
    hard = tmp_path / "hard.csv"
    os.link(real, hard)
    folder = tmp_path / "folder-link"
    folder.symlink_to(real.parent, target_is_directory=True)
    return real, link, hard, folder / real.name


def _held_message(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "another sweep is writing" in msg and "\n" not in msg, msg
    return msg


def test_every_name_of_a_held_csv_is_refused_and_its_rows_stay(tmp_path):
    real, link, hard, via_folder = _names(tmp_path)
    with csvio.ResultCSV(real, COLUMNS) as holder:
        for i in range(3):
            holder.write({"id": f"r{i}", "value": i})
        before = real.read_bytes()
        for name in (real, link, hard, via_folder):
            for resume in (False, True):
                with pytest.raises(UserError) as err:
                    with csvio.ResultCSV(name, COLUMNS, resume=resume) as other:
                        other.write({"id": "intruder", "value": -1})
                msg = _held_message(err)
                assert str(name) in msg
                if name in (link, via_folder):
                    assert str(real) in msg  # the file behind the name, so the user sees which sweep holds it
            with pytest.raises(UserError) as err:
                csvio.write_csv(pd.DataFrame({"n": [0]}), name)
            _held_message(err)
        assert real.read_bytes() == before  # nothing truncated, appended or renamed over
        holder.write({"id": "r3", "value": 3})
    assert [r["id"] for r in _rows(real)] == ["r0", "r1", "r2", "r3"]
    assert link.is_symlink() and os.path.samefile(hard, real)  # no writer replaced a name
    assert not list(tmp_path.rglob("*.lock")) and not list(tmp_path.rglob("*.tmp"))  # the refused left nothing


def test_a_hard_link_resume_after_the_holder_is_done_adds_no_duplicate(tmp_path):
    real, _link, hard, _ = _names(tmp_path)
    with csvio.ResultCSV(real, COLUMNS) as holder:
        holder.write({"id": "a", "value": 1})
        with pytest.raises(UserError):
            csvio.ResultCSV(hard, COLUMNS, resume=True).__enter__()
        holder.write({"id": "b", "value": 2})
    with csvio.ResultCSV(hard, COLUMNS, resume=True) as again:  # free now: resumes the same rows, by inode
        assert [r["id"] for r in again.rows] == ["a", "b"]
        again.write({"id": "c", "value": 3})
    assert [r["id"] for r in _rows(real)] == ["a", "b", "c"]


def test_write_csv_replaces_through_a_symlink_only_when_free(tmp_path):
    real, link, _hard, _ = _names(tmp_path)
    csvio.write_csv(pd.DataFrame({"n": [0, 1], "note": ["=x", "ok"]}), link)
    assert link.is_symlink() and [r["note"] for r in _rows(real)] == ["'=x", "ok"]
    before = real.read_bytes()
    held = csvio._Lock(real)  # what every writer takes first (ResultCSV would truncate this file: not ours)
    try:
        with pytest.raises(UserError):
            csvio.write_csv(pd.DataFrame({"n": [2]}), link)
    finally:
        held.close()
    assert real.read_bytes() == before


def test_rpe_out_onto_a_running_sweep_is_refused_by_every_name(tiny, tiny_dir, tmp_path, capsys):
    """A real sweep in this process; ``rpe --out`` (the CLI) runs between two of its rows."""
    real, link, hard, _ = _names(tmp_path)
    plan = SweepPlan(model="tiny", task="passkey", lengths=[300], depths=[0.2, 0.8], seeds=[0], methods=["none", "0.7"])
    status: list[tuple[int, str]] = []

    def progress(done: int, total: int, row) -> None:
        if row is None or done != 2:
            return
        capsys.readouterr()
        for name in (real, link, hard):
            code = main(["rpe", "--model", str(tiny_dir), "--out", str(name), "--length", "40"])
            status.append((code, capsys.readouterr().err))

    df = run_sweep(tiny, plan, out=real, progress=progress)
    assert [code for code, _ in status] == [2, 2, 2]
    for _, err in status:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: another sweep is writing"), err
    rows = _rows(real)
    assert len(rows) == len(df) == plan.total and len({tuple(r[k] for k in KEY) for r in rows}) == plan.total
    assert link.is_symlink() and os.path.samefile(hard, real)


def _cli(argv: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "core", *argv],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="pauses the running sweep with SIGSTOP")
@pytest.mark.slow
def test_cli_sweeps_through_a_symlink_and_a_hard_link_are_refused_by_a_running_cli_sweep(tiny_dir, tmp_path):
    """``python -m core sweep --out X`` runs; once it has written a row it is paused (SIGSTOP: it keeps its
    locks), so the second writers meet it mid-sweep on any machine, however slow; then it finishes."""
    real, link, hard, _ = _names(tmp_path)
    sweep = [
        "sweep",
        "--model",
        str(tiny_dir),
        "--lengths",
        "300",
        "--depths",
        "0.1,0.5,0.9",
        "--samples",
        "2",
        "--methods",
        "none,0.7",
    ]
    total = 3 * 2 * 2
    first = _cli(sweep + ["--out", str(real)])
    others: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 120
        while first.poll() is None and time.monotonic() < deadline:
            if real.read_bytes().count(b"\n") >= 2:  # its header and a row: it holds the lock, mid-sweep
                break
            time.sleep(0.02)
        assert first.poll() is None, "the first sweep ended (or never wrote a row) before the others could start"
        first.send_signal(signal.SIGSTOP)
        time.sleep(0.2)  # a row being written when the signal came is out by now
        before = real.read_bytes()
        others = [
            _cli(sweep + ["--out", str(link)]),  # rpe --out: the test above (in this process: faster)
            _cli(sweep + ["--out", str(hard), "--resume"]),
        ]
        results = [p.communicate(timeout=180) for p in others]
        assert real.read_bytes() == before  # while paused, nobody else touched its rows
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
        for p in [first, *others]:
            try:
                p.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
    assert [p.returncode for p in others] == [2, 2], results
    for _out, err in results:
        assert err.count("error:") == 1 and "another sweep is writing" in err, err
    assert first.returncode == 0
    rows = _rows(real)
    assert len(rows) == total and len({tuple(r[k] for k in KEY) for r in rows}) == total
    assert link.is_symlink() and os.path.samefile(hard, real)
    assert not list(tmp_path.rglob("*.lock")) and not list(tmp_path.rglob("*.tmp"))
