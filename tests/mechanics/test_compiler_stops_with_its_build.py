"""The kernel's compiler never outlives the build that asked for it, and what a dead build leaves goes at once
(hardening, round four).

The compiler ran in a session of its own and nothing stopped it on Ctrl-C or when its parent died: with a fake
``g++`` that sleeps first on PATH, ``python -m core run --tokens 300`` and a Ctrl-C during the build exited 130 with
the compiler still running, and a SIGKILLed build left the compiler running and an empty ``build-*.so`` in the cache
folder until a later build more than 600 s on. The fake compiler here starts a child of its own (as g++ starts
cc1plus) and writes both pids, so the test sees the whole group.

Also: a library planted with a matching digest but the wrong arithmetic kept the kernel off in every later process,
and the message did not name the file.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.mechanics import fused_softmax

ROOT = Path(__file__).resolve().parents[2]
#: seconds to wait for something that happens at once on a quiet machine (a hang bound, not a timing)
HANG_S = 120

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")

ASK = "from core.mechanics import fused_softmax as f; print(f.available(), f.why_not())"


def _fake_compiler(tmp_path: Path, body: str) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    gxx = folder / "g++"
    gxx.write_text("#!/bin/sh\n" + body)
    gxx.chmod(0o755)
    return folder


def _sleeping_compiler(tmp_path: Path) -> tuple[Path, Path]:
    """A ``g++`` that writes its pid and its child's to a file, then waits on the child (a 150 s sleep)."""
    pids = tmp_path / "compiler-pids"
    return _fake_compiler(tmp_path, f'echo $$ >> "{pids}"\nsleep 150 &\necho $! >> "{pids}"\nwait\n'), pids


def _env(tmp_path: Path, bin_folder: Path) -> dict:
    env = {
        **os.environ,
        "PATH": f"{bin_folder}:{os.environ['PATH']}",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    env.pop(fused_softmax.ENV_SWITCH, None)
    return env


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_for_pids(pids: Path, run: subprocess.Popen) -> list[int]:
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline and run.poll() is None:
        if pids.exists() and len(pids.read_text().split()) >= 2:
            return [int(p) for p in pids.read_text().split()]
        time.sleep(0.02)
    raise AssertionError(f"the fake compiler never started (exit {run.poll()}): {run.stderr.read()[-1500:]}")


def _still_running_after_a_while(pids: list[int]) -> list[int]:
    """The pids still running once they had up to :data:`HANG_S` to end (at once when they do)."""
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _running(p)]


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_ctrl_c_during_the_build_stops_the_compiler(tmp_path):
    bin_folder, pids_file = _sleeping_compiler(tmp_path)
    run = subprocess.Popen(
        [sys.executable, "-m", "core", "run", "--tokens", "300", "--device", "cpu"],
        cwd=ROOT,
        env=_env(tmp_path, bin_folder),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids: list[int] = []
    try:
        pids = _wait_for_pids(pids_file, run)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=HANG_S)
        assert run.returncode == 130, err[-1500:]
        assert err.strip().splitlines()[-1].startswith("interrupted: ") and "Traceback" not in err
        assert _still_running_after_a_while(pids) == [], "the compiler outlived the Ctrl-C"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        _kill_all(pids)


def test_a_killed_build_takes_its_compiler_along_and_its_file_goes_at_the_next_build(tmp_path):
    bin_folder, pids_file = _sleeping_compiler(tmp_path)
    run = subprocess.Popen(
        [sys.executable, "-c", ASK],
        cwd=ROOT,
        env=_env(tmp_path, bin_folder),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids: list[int] = []
    try:
        pids = _wait_for_pids(pids_file, run)
        run.kill()  # SIGKILL: no Python code of the build runs again
        run.wait(HANG_S)
        assert _still_running_after_a_while(pids) == [], "the compiler outlived its SIGKILLed parent"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        _kill_all(pids)
    folder = tmp_path / "cache" / "attention-explorer"
    left = list(folder.glob("build-*"))
    assert left, "the killed build left no file: nothing to check"
    # the next build (a compiler that fails at once here) removes the dead process's file, young as it is
    failing = _fake_compiler(tmp_path / "second", "echo 'no compiler today' >&2\nexit 1\n")
    done = subprocess.run(
        [sys.executable, "-c", ASK],
        cwd=ROOT,
        env=_env(tmp_path, failing),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert done.stdout.startswith("False") and "no compiler today" in done.stdout, done.stderr[-1500:]
    assert list(folder.glob("build-*")) == [], "a dead build's file stayed"


def test_a_live_builds_file_stays(tmp_path):
    """The file of a build under way in a live process is never taken (this test's own pid is alive)."""
    folder = tmp_path / "attention-explorer"
    folder.mkdir(mode=0o700)
    mine = folder / f"{fused_softmax._BUILD_PREFIX}{fused_softmax._host()}-{os.getpid()}-abc.so"
    mine.write_bytes(b"a build under way")
    fused_softmax._clean_leftovers(folder)
    assert mine.exists()


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a real C++ compiler")
def test_a_planted_library_with_its_digest_is_named_removed_and_rebuilt_by_the_next_process(tmp_path):
    """A library whose digest matches but whose arithmetic is wrong: the process that finds it stays on torch's path
    (its loader has the library open), names the file and removes it; the next process builds its own."""
    src = fused_softmax.SOURCE.read_text().replace("total[r] = T;", "total[r] = 2.0f * T;")
    assert src != fused_softmax.SOURCE.read_text()
    (tmp_path / "wrong.cpp").write_text(src)
    folder = tmp_path / "cache" / "attention-explorer"
    folder.mkdir(mode=0o700, parents=True)
    lib = folder / fused_softmax.library_name()
    subprocess.run(
        ["g++", *fused_softmax.flags(), str(tmp_path / "wrong.cpp"), "-o", str(lib)], check=True, timeout=HANG_S
    )
    (folder / (lib.name + ".sha256")).write_text(fused_softmax._sha256(lib) + "\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    env.pop(fused_softmax.ENV_SWITCH, None)
    first = subprocess.run(
        [sys.executable, "-c", ASK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_S
    )
    assert first.stdout.startswith("False"), first.stdout + first.stderr
    assert str(lib) in first.stderr and "self-test" in first.stderr and first.stderr.count("\n") == 1, first.stderr
    assert not lib.exists()
    second = subprocess.run(
        [sys.executable, "-c", ASK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_S
    )
    assert second.stdout.startswith("True"), second.stdout + second.stderr
