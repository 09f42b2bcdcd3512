"""The fused kernel's cache folder is not trusted blindly (issue 47, point 1).

Each case plants something in a fresh cache folder (``XDG_CACHE_HOME``) where the library of this source,
flags and CPU is looked for, then asks a fresh process for the kernel: a truncated, empty, foreign or
planted library, a folder others can write, a compiler that hangs, a build that died and left its file.
A fresh process each time because before the digest check a truncated library killed its process with
SIGBUS, and a planted library's constructor ran in it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.mechanics import fused_softmax

pytestmark = pytest.mark.skipif(not fused_softmax.available(), reason="no C++ compiler here: the kernel is off")

ROOT = Path(__file__).resolve().parents[2]

ASK = """
import json, sys
from core.mechanics import fused_softmax as f
import torch
ok = f.available()
out = {"available": ok, "why": f.why_not()}
if ok:
    s = torch.randn(1, 1, 2, 40) * 3
    e, _ = s.clone(), None
    total, dot = f.softmax_rows(e)
    want = torch.exp(s - s.amax(-1, keepdim=True))
    out["right"] = bool(torch.allclose(e, want, rtol=1e-5, atol=1e-7))
    km = torch.rand(1, 40) > 0.3
    e2 = s.clone()
    f.softmax_rows(e2, keymask=km)
    x = s.masked_fill(~km[:, None, None, :], torch.finfo(torch.float32).min)
    out["right_masked"] = bool(torch.allclose(e2, torch.exp(x - x.amax(-1, keepdim=True)), rtol=1e-5, atol=1e-7))
    out["isa"] = f.built_isa()
print(json.dumps(out))
"""


def _ask(cache: Path, env: dict | None = None, timeout: float = 120) -> tuple[dict, str, int]:
    full = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(ROOT), **(env or {})}
    full.pop(fused_softmax.ENV_SWITCH, None)
    done = subprocess.run(
        [sys.executable, "-c", ASK], capture_output=True, text=True, env=full, timeout=timeout, cwd=ROOT
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return (json.loads(lines[-1]) if lines else {}), done.stderr, done.returncode


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "attention-explorer"
    folder.mkdir(mode=0o700, parents=True)
    return folder


def _good_library(tmp_path: Path) -> bytes:
    """The bytes of a library this code builds, built once in a folder of its own."""
    cache = tmp_path / "good"
    got, err, rc = _ask(cache)
    assert got.get("available") and got.get("right"), err
    return (cache / "attention-explorer" / fused_softmax.library_name()).read_bytes()


def test_a_fresh_folder_gets_a_library_with_its_digest_and_a_private_mode(tmp_path):
    got, err, rc = _ask(tmp_path)
    assert rc == 0 and got["available"] and got["right"], err
    folder = tmp_path / "attention-explorer"
    lib = folder / fused_softmax.library_name()
    assert (folder / (lib.name + ".sha256")).read_text().strip() == fused_softmax._sha256(lib)
    assert stat.S_IMODE(folder.stat().st_mode) & 0o022 == 0
    assert err == ""  # a plain build says nothing


@pytest.mark.parametrize("damage", ["truncated", "empty"])
@pytest.mark.slow
def test_a_damaged_library_is_rebuilt_not_loaded(tmp_path, damage):
    good = _good_library(tmp_path)
    folder = _folder(tmp_path / "c")
    lib = folder / fused_softmax.library_name()
    lib.write_bytes(good[: len(good) // 3] if damage == "truncated" else b"")
    (folder / (lib.name + ".sha256")).write_text(fused_softmax.hashlib.sha256(good).hexdigest() + "\n")
    got, err, rc = _ask(tmp_path / "c")
    assert rc == 0, f"the process died (exit {rc}): {err[-400:]}"
    assert got["available"] and got["right"]
    assert "rebuilding" in err and err.count("\n") == 1, err
    assert (
        lib.read_bytes() == good or fused_softmax._sha256(lib) == (folder / (lib.name + ".sha256")).read_text().strip()
    )


def test_a_foreign_library_never_runs_its_constructor(tmp_path):
    """A library without our digest beside it (planted, or from another tool) is not opened: its constructor,
    which writes a marker file, never runs; it is replaced by a build of our own."""
    marker = tmp_path / "constructor-ran"
    src = tmp_path / "planted.cpp"
    src.write_text(
        "#include <cstdio>\n__attribute__((constructor)) static void planted() {"
        f' FILE* f = std::fopen("{marker}", "w"); if (f) std::fclose(f); }}\n'
        'extern "C" void aae_softmax_rows() {}\n'
    )
    folder = _folder(tmp_path / "c")
    lib = folder / fused_softmax.library_name()
    subprocess.run(["g++", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True, timeout=120)
    got, err, rc = _ask(tmp_path / "c")
    assert rc == 0 and got["available"] and got["right"], err
    assert not marker.exists()
    assert "no digest" in err


def test_a_planted_library_with_a_digest_but_wrong_arithmetic_is_refused(tmp_path):
    """Even a library whose digest matches (written by whoever could write the folder) must compute what the
    kernel computes: one that loads but returns something else fails the self-test, and the pass takes
    torch's path with one line saying why."""
    src = fused_softmax.SOURCE.read_text().replace("total[r] = T;", "total[r] = 2.0f * T;")
    assert src != fused_softmax.SOURCE.read_text()
    wrong = tmp_path / "wrong.cpp"
    wrong.write_text(src)
    folder = _folder(tmp_path / "c")
    lib = folder / fused_softmax.library_name()
    subprocess.run(["g++", *fused_softmax.flags(), str(wrong), "-o", str(lib)], check=True, timeout=120)
    (folder / (lib.name + ".sha256")).write_text(fused_softmax._sha256(lib) + "\n")
    got, err, rc = _ask(tmp_path / "c")
    assert rc == 0 and not got["available"]
    assert "self-test" in got["why"] and "torch's path" in err


def test_a_folder_others_can_write_is_not_used(tmp_path):
    folder = _folder(tmp_path)
    folder.chmod(0o777)
    got, err, rc = _ask(tmp_path)
    assert rc == 0 and got["available"] and got["right"], err
    assert "not only yours" in err and err.count("\n") == 1
    assert not (folder / fused_softmax.library_name()).exists()


def test_a_hanging_compiler_is_stopped_and_torchs_path_taken(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    gxx = fake / "g++"
    gxx.write_text("#!/bin/sh\nsleep 300\n")
    gxx.chmod(0o755)
    env = {"PATH": f"{fake}:{os.environ['PATH']}"}
    code = ASK.replace(
        "import json, sys", "import json, sys\nimport core.mechanics.fused_softmax as _f; _f.BUILD_TIMEOUT_S = 2"
    )
    full = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "c"), "PYTHONPATH": str(ROOT), **env}
    full.pop(fused_softmax.ENV_SWITCH, None)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=400)
    took = time.monotonic() - t0
    got = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert not got["available"] and "took over 2 s" in got["why"]
    assert took < 300, took  # the fake compiler sleeps 300 s: the build was stopped, not waited out
    folder = tmp_path / "c" / "attention-explorer"
    assert not list(folder.glob("build-*")), "the stopped build left its file"


def test_a_dead_builds_leftover_is_cleaned(tmp_path):
    folder = _folder(tmp_path)
    old = folder / "build-abc123.so"
    old.write_bytes(b"half a library")
    past = time.time() - fused_softmax.STALE_BUILD_S - 60
    os.utime(old, (past, past))
    young = folder / "build-def456.so"
    young.write_bytes(b"another process's build under way")
    got, err, rc = _ask(tmp_path)
    assert rc == 0 and got["available"]
    assert not old.exists() and young.exists()


def test_an_unknown_march_is_one_line_not_a_crash(tmp_path):
    got, err, rc = _ask(tmp_path, env={fused_softmax.MARCH_ENV: "no such cpu; rm -rf"})
    assert rc == 0 and not got["available"] and fused_softmax.MARCH_ENV in got["why"]


@pytest.mark.parametrize("march, isa", [("haswell", "avx2"), ("x86-64", "sse2")])
def test_older_cpus_builds_compute_the_same(tmp_path, march, isa):
    """The kernel built for an AVX2-only CPU (32-byte vectors) and for plain x86-64 (SSE2) gives
    torch's numbers, padding mask included (the vector width follows the target: issue 49)."""
    if os.uname().machine != "x86_64":
        pytest.skip("x86 targets")
    got, err, rc = _ask(tmp_path, env={fused_softmax.MARCH_ENV: march})
    assert rc == 0 and got["available"], err
    assert got["isa"] == isa and got["right"] and got["right_masked"]
