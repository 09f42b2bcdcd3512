"""Sweeps of masked-token evaluation (core.experiments.mlm.run_mlm_sweep, ``python -m core mlm --out/--resume/--engine``): one
row per (length, scheme, method) written through core.experiments.csvio as each cell ends; a killed run resumes to exactly one
row per cell; the CSV holds the rows ``--json`` prints; Ray with one actor gives the rows of a local run.

One local Ray for the module and one pool of one one-thread actor, as tests/experiments/test_ray_sweep.py does; the local side
runs with one torch thread too, so both sides do the same arithmetic."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import build_tiny_rope
from core.cli import main
from core.errors import UserError
from core.experiments import cluster, mlm
from core.models import load
from core.values import positions

ROOT = Path(__file__).resolve().parents[2]
L_TR = 32
TIMING = {"seconds"}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def rope_dir(tmp_path_factory):
    return build_tiny_rope(tmp_path_factory.mktemp("mlm-sweep"), layers=1, hidden=32, train_length=L_TR, seed=3)


@pytest.fixture(scope="module")
def rope(rope_dir):
    return load(str(rope_dir), device="cpu")


def _plan(**kw) -> mlm.MlmPlan:
    base = dict(
        lengths=[32, 64],
        methods=["none", "tau=0.7", "pmax"],
        schemes=("none", "window:window=8"),
        sequences=3,
        batch_size=2,
    )  # 12 cells
    return mlm.MlmPlan(**{**base, **kw})


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _keyed(rows: list[dict]) -> dict:
    return {mlm.row_key(r): {k: str(v) for k, v in r.items() if k not in TIMING} for r in rows}


def _as_csv(value) -> str:
    """A JSON row's value as the CSV writer spells it."""
    return "" if value is None else str(value)


# -- one row per cell, and the CSV is the run's rows -------------------------------------------------------


def test_a_run_writes_one_row_per_cell_in_plan_order_and_returns_them(rope, tmp_path):
    plan = _plan()
    out = tmp_path / "m.csv"
    rows = mlm.run_mlm_sweep(rope, plan, out=out)
    written = _rows(out)
    cells = [
        (n, positions.Scheme.of(s).name, positions.Scheme.of(s).params_text(), m)
        for n in plan.lengths
        for s in plan.schemes
        for m in plan.methods
    ]
    assert len(rows) == len(written) == len(cells) == 12
    assert [(r["tokens"], r["scheme"], r["scheme_params"], r["method"]) for r in rows] == cells
    assert [{k: _as_csv(r[k]) for k in mlm.COLUMNS} for r in rows] == written
    assert {r["masked"] for r in rows if r["tokens"] == 64} == {rows[-1]["masked"]}  # same sequences in every cell
    strip = lambda rs: [{k: r[k] for k in mlm.ROW_KEYS if k not in TIMING} for r in rs]  # noqa: E731
    assert strip(mlm.run_mlm(rope, plan)) == strip(rows)  # the library's run_mlm: the same cells, no CSV


def test_the_csv_equals_the_json_rows(rope_dir, tmp_path, capsys):
    out = tmp_path / "cli.csv"
    argv = [
        "mlm",
        "--model",
        str(rope_dir),
        "--lengths",
        "1x,2x",
        "--schemes",
        "none,rerope",
        "--methods",
        "none,infoscale",
        "--sequences",
        "2",
        "--out",
        str(out),
        "--json",
    ]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    written = _rows(out)
    assert len(rows) == len(written) == 8
    assert [{k: _as_csv(r[k]) for k in mlm.ROW_KEYS} for r in rows] == [
        {k: w[k] for k in mlm.ROW_KEYS} for w in written
    ]
    assert {w["model"] for w in written} == {load(str(rope_dir)).spec.name}
    # --resume with nothing left: the same rows, the file untouched
    before = out.read_bytes()
    assert main(argv + ["--resume"]) == 0
    again = json.loads(capsys.readouterr().out)["rows"]
    assert out.read_bytes() == before
    assert [{k: _as_csv(r[k]) for k in mlm.ROW_KEYS} for r in again] == [
        {k: w[k] for k in mlm.ROW_KEYS} for w in written
    ]


# -- resume ----------------------------------------------------------------------------------------------


def test_a_torn_last_row_is_dropped_and_every_missing_cell_run_once(rope, tmp_path):
    plan = _plan()
    whole = tmp_path / "whole.csv"
    mlm.run_mlm_sweep(rope, plan, out=whole)
    text = whole.read_bytes()
    lines = text.split(b"\n")
    torn = tmp_path / "torn.csv"
    torn.write_bytes(b"\n".join(lines[:6]) + b"\n" + lines[6][: len(lines[6]) // 2])  # header, 5 rows, half a row
    rows = mlm.run_mlm_sweep(rope, plan, out=torn, resume=True)
    got = _rows(torn)
    assert len(got) == len(rows) == 12 and len({mlm.row_key(r) for r in got}) == 12
    assert got[:5] == _rows(whole)[:5]
    assert _keyed(got) == _keyed(_rows(whole))  # the redone cells are the cells a whole run wrote


@pytest.mark.slow
def test_a_run_killed_mid_way_resumes_to_exactly_one_row_per_cell(rope, rope_dir, tmp_path):
    """kill -9 of a CLI run after its first row: --resume keeps its whole rows and adds each missing one once."""
    out = tmp_path / "k.csv"
    argv = [
        "mlm",
        "--model",
        str(rope_dir),
        "--lengths",
        "1x,2x,4x",
        "--schemes",
        "none,window:window=8",
        "--methods",
        "none,tau=0.7",
        "--sequences",
        "4",
        "--batch-size",
        "2",
        "--out",
        str(out),
    ]
    total = 3 * 2 * 2
    log = tmp_path / "run.log"
    with open(log, "wb") as err:
        run = subprocess.Popen(
            [sys.executable, "-m", "core", *argv],
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and run.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= 2:  # the header and at least one row
                break
            time.sleep(0.005)
        assert run.poll() is None, log.read_text()[-2000:]
        run.send_signal(signal.SIGKILL)
        run.wait(10)
    finally:
        if run.poll() is None:
            run.kill()
    killed = _rows(out)
    assert 1 <= len(killed) < total
    assert main(argv + ["--resume"]) == 0
    rows = _rows(out)
    assert rows[: len(killed) - 1] == killed[:-1]  # whole rows kept (the last may have been torn and redone)
    assert len(rows) == total and len({mlm.row_key(r) for r in rows}) == total


def test_resume_runs_again_what_was_measured_otherwise(rope, tmp_path):
    """A cell measured on other sequences (or another s) is another cell: resumed, it is added, not taken as done."""
    out = tmp_path / "m.csv"
    mlm.run_mlm_sweep(rope, _plan(lengths=[32], methods=["none"], schemes=("none",)), out=out)
    mlm.run_mlm_sweep(rope, _plan(lengths=[32], methods=["none"], schemes=("none",), sequences=4), out=out, resume=True)
    assert [r["sequences"] for r in _rows(out)] == ["3", "4"]


def test_resume_refuses_a_file_of_other_rows(rope, tmp_path):
    out = tmp_path / "other.csv"
    out.write_text("a,b\n1,2\n")
    with pytest.raises(UserError):
        mlm.run_mlm_sweep(rope, _plan(lengths=[32], methods=["none"], schemes=("none",)), out=out, resume=True)
    assert out.read_text() == "a,b\n1,2\n"  # untouched


def test_bad_engine_options_are_one_line(rope_dir, tmp_path, capsys):
    assert main(["mlm", "--model", str(rope_dir), "--lengths", "1x", "--actors", "2"]) == 2
    assert "--actors: only with --engine ray" in capsys.readouterr().err
    assert main(["mlm", "--model", str(rope_dir), "--lengths", "1x", "--resume"]) == 2
    assert "--resume needs --out" in capsys.readouterr().err


# -- Ray -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def pool(ray_cluster):
    with cluster.RayEngine(actors=1, cpus_per_actor=1) as p:
        yield p


@pytest.mark.slow
def test_ray_with_one_actor_gives_the_rows_of_a_local_run(rope, pool, tmp_path):
    plan = _plan()
    local = mlm.run_mlm_sweep(rope, plan, out=tmp_path / "local.csv")
    seen: list[tuple] = []

    class Seen:
        def start(self, jobs, rows, seconds, where):
            seen.append(("start", jobs, where))

        def advance(self, jobs=1, rows=0):
            seen.append(("advance", jobs, rows))

        def add(self, jobs):
            pass

    remote = mlm.run_mlm_sweep(rope, plan, out=tmp_path / "ray.csv", pool=pool, tracker=Seen())
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows]  # noqa: E731
    assert strip(remote) == strip(local)  # plan order, equal numbers
    a, b = _rows(tmp_path / "local.csv"), _rows(tmp_path / "ray.csv")
    assert _keyed(a) == _keyed(b) and len(b) == 12
    assert seen[0] == ("start", 12, pool.where) and sum(s[2] for s in seen[1:]) == 12
    # resumed on Ray with nothing left: nothing runs, the rows come back
    again = mlm.run_mlm_sweep(rope, plan, out=tmp_path / "ray.csv", resume=True, pool=pool)
    assert len(again) == 12 and _rows(tmp_path / "ray.csv") == b
