"""Sweeps on Ray (core.experiments.cluster): the same rows as a local sweep, resume after a killed driver, failed jobs.

One local Ray for the module (``ray.init(num_cpus=2)``) and one pool of one
one-thread actor on it, shared by the tests (its other CPU is for the actor
of the driver the first test kills: starting actors is most of this module's
time on a 2-core machine); the tiny random T5 of conftest.py. The local side
of each comparison runs with one torch thread, like the actor, so both sides
do the same arithmetic. Heavy-first order already sends rows back out of plan
order with one actor.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import build_tiny_t5
from core.cli import main
from core.experiments import batch, cluster, csvio
from core.experiments.sweep import KEY, SweepPlan, run_sweep

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]
TIMING = {"seconds"}

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test's own job functions, for the actors
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def pool(ray_cluster):
    with cluster.RayEngine(actors=1, cpus_per_actor=1) as p:
        yield p


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _without_timing(rows: list[dict], key) -> list[dict]:
    return sorted(({k: v for k, v in r.items() if k not in TIMING} for r in rows), key=key)


def _sweep_key(r: dict) -> tuple:
    return tuple(str(r[k]) for k in KEY)


def _plan(**kw) -> SweepPlan:
    base = dict(
        model="tiny",
        task="passkey",
        lengths=[300, 400],
        depths=[0.2, 0.8],
        seeds=[0, 1],
        methods=["none", "0.7", "pmax"],
        calib_samples=2,
    )  # 24 rows
    return SweepPlan(**{**base, **kw})


# -- a killed driver ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_driver_killed_mid_run_resumes_to_exactly_one_row_per_cell(tiny, tiny_dir, pool, ray_cluster, tmp_path):
    """kill -9 of a CLI driver on the cluster: its actor dies with it, the resumed sweep adds each missing row once.

    The driver gets one actor, the module's pool (which the tests after this
    one use) starts its own meanwhile on the other CPU."""
    out = tmp_path / "s.csv"
    lengths, depths, samples, methods = [300], [0.1, 0.3, 0.5, 0.7, 0.9], 2, ["none", "0.7"]
    argv = [
        "sweep",
        "--model",
        str(tiny_dir),
        "--lengths",
        ",".join(map(str, lengths)),
        "--depths",
        ",".join(map(str, depths)),
        "--samples",
        str(samples),
        "--methods",
        ",".join(methods),
        "--engine",
        "ray",
        "--address",
        ray_cluster,
        "--actors",
        "1",
        "--out",
        str(out),
    ]
    total = len(lengths) * len(depths) * samples * len(methods)  # 20 rows: 4 jobs of 5 on one actor
    log = tmp_path / "driver.log"
    with open(log, "wb") as err:
        driver = subprocess.Popen(
            [sys.executable, "-m", "core", *argv],
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    starting = threading.Thread(target=pool.prepare, args=(pool.model_ref(tiny),))
    starting.start()
    try:
        # a generous deadline: the loop leaves at the first row, and on a busy 2-core machine the driver's
        # imports, Ray's connection and the model's load took over 90 s (seen with two benchmarks running)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and driver.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= 2:  # the header and at least one row
                break
            time.sleep(0.01)
        assert driver.poll() is None, log.read_text()[-2000:]
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
    finally:
        if driver.poll() is None:
            driver.kill()
        starting.join(120)
    killed = _rows(out)
    assert 1 <= len(killed) < total
    plan = SweepPlan(
        model=tiny.spec.name,
        task="passkey",
        lengths=lengths,
        depths=depths,
        seeds=list(range(samples)),
        methods=methods,
    )
    df = run_sweep(tiny, plan, out=out, resume=True, pool=pool)
    rows = _rows(out)
    assert rows[: len(killed) - 1] == killed[:-1]  # whole rows kept (the last may have been torn and redone)
    assert len(rows) == len(df) == total and len({_sweep_key(r) for r in rows}) == total


# -- the same rows ----------------------------------------------------------------------------


def test_a_generated_sweep_on_ray_gives_the_rows_of_a_local_one(tiny, pool, tmp_path):
    plan = _plan(seeds=[0])
    local = run_sweep(tiny, plan, out=tmp_path / "local.csv")
    seen: list[tuple] = []

    class Seen:
        def start(self, jobs, rows, seconds, where):
            seen.append(("start", jobs, rows, where))

        def advance(self, jobs=1, rows=0):
            seen.append(("job", jobs, rows))

        def add(self, jobs):
            pass

    remote = run_sweep(tiny, plan, out=tmp_path / "ray.csv", pool=pool, tracker=Seen())
    a, b = _rows(tmp_path / "local.csv"), _rows(tmp_path / "ray.csv")
    assert len(a) == len(b) == plan.total
    assert _without_timing(a, _sweep_key) == _without_timing(b, _sweep_key)
    # the returned tables are in plan order both ways
    assert local.drop(columns=["seconds"]).equals(remote.drop(columns=["seconds"]))
    # jobs: a calibration per length for pmax, then slices of documents; every row came from a job
    start, *jobs = seen
    assert start[0] == "start" and start[2] == plan.total and "on 1 Ray actor" in start[3]
    assert len(jobs) == start[1] and sum(r for _, _, r in jobs) == plan.total
    assert sum(1 for _, _, r in jobs if r == 0) == len(plan.lengths)  # the two calibrations


def _docs(n: int) -> list[dict]:
    out = []
    for i in range(n):
        if i % 2:
            out.append(
                {"id": f"d{i}", "text": f"Note {i}: the code word is tulip{i}. " * (2 + i % 5), "expected": f"tulip{i}"}
            )
        else:
            out.append(
                {
                    "context": f"Item {i} costs {100 + i} coins. " * (1 + i % 4),
                    "question": "How much?",
                    "expected": 100 + i,
                }
            )
    return out


def test_a_jsonl_sweep_on_ray_gives_the_rows_of_a_local_one(tiny, pool, tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in _docs(6)), encoding="utf-8")
    items = batch.read_jsonl(data, tiny.tokenizer, report=pytest.fail)
    settings = [
        batch.Setting("none", "none"),
        batch.Setting("tau=0.7", "fixed", 0.7),
        batch.Setting("log-length", "log-length"),
        batch.Setting("pmax", "pmax"),
    ]
    a, b = tmp_path / "local.csv", tmp_path / "ray.csv"
    ca = batch.run_items(tiny, items, settings, out=a, batch_size=4)
    cb = batch.run_items(tiny, items, settings, out=b, batch_size=4, pool=pool)
    assert ca == cb == {"written": 24, "skipped": 0, "failed": 0}
    key = lambda r: (int(r["line"]), r["setting"])  # noqa: E731
    assert _without_timing(_rows(a), key) == _without_timing(_rows(b), key)


def test_the_results_table_on_ray_is_the_local_one(tiny_dir, pool, tmp_path):
    """bench/results.py --engine ray: a cell cut into a calibration, a dispersion run and accuracy slices of one
    batch each (two per tau here) ends as the same CSV as the local loop writes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_bench", ROOT / "bench" / "results.py")
    rb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rb)
    args = (str(tiny_dir), ["passkey"], [1], 2, 1)
    local = rb.run_model(*args, tmp_path / "local", stats_docs=2)
    remote = rb.run_model(*args, tmp_path / "ray", stats_docs=2, pool=pool)
    name = f"{tiny_dir.name}.csv"
    assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
    assert (
        len(remote) == len(local) == len(rb.METHODS) + len(rb.FIXED)
        and not (tmp_path / "ray" / f"{tiny_dir.name}.partial.json").exists()
    )


# -- a stopped driver -----------------------------------------------------------------------------


def test_ctrl_c_cancels_outstanding_jobs_and_keeps_finished_rows(tiny, pool, tmp_path):
    """Ctrl-C while a job is out (raised where the driver waits): the job is cancelled between two documents,
    the actor stays (warm) for the resumed sweep, and the rows written so far stay."""
    out = tmp_path / "s.csv"
    plan = _plan(methods=["none", "0.7"], lengths=[300])  # 8 rows: 4 jobs of 2 on one actor
    rows_seen: list[dict] = []

    def ctrl_c() -> bool:
        if rows_seen:
            raise KeyboardInterrupt
        return False

    with pytest.raises(KeyboardInterrupt):
        run_sweep(
            tiny, plan, out=out, pool=pool, progress=lambda d, t, row: row and rows_seen.append(row), should_stop=ctrl_c
        )
    kept = _rows(out)
    assert 1 <= len(kept) < plan.total and not csvio.lock_path(out).exists()
    actor = pool._pool[0]
    run_sweep(tiny, plan, out=out, resume=True, pool=pool)
    assert pool._pool == [actor]  # not killed: the cancelled job stopped at the next document
    rows = _rows(out)
    assert rows[: len(kept)] == kept
    assert len(rows) == plan.total and len({_sweep_key(r) for r in rows}) == plan.total


# -- failures --------------------------------------------------------------------------------------


def test_a_failing_job_is_reported_with_its_cells_and_the_rest_finish(pool, tmp_path):
    """A model whose layer-0 logits are ~1e36 runs at tau = 1, and overflows float32 at tau = 0.001 (NaN): every
    try of those cells raises; the others are written. (Any tau the bounds accept is fine on a sane model.)"""
    import torch
    from transformers import T5ForConditionalGeneration

    from core.models import load

    folder = build_tiny_t5(tmp_path / "loud-t5", train_length=256)
    model = T5ForConditionalGeneration.from_pretrained(folder)
    with torch.no_grad():
        model.encoder.block[0].layer[0].SelfAttention.q.weight.mul_(1e36)
    model.save_pretrained(folder, safe_serialization=True)
    loud = load(str(folder))
    plan = _plan(model=str(folder), methods=["none", "tau=0.001"], lengths=[300], seeds=[0], depths=[0.5])
    said: list[str] = []
    df = run_sweep(loud, plan, out=tmp_path / "s.csv", pool=pool, report=said.append)
    assert list(df["method"]) == ["none"] and len(_rows(tmp_path / "s.csv")) == 1
    assert len(said) == 1, said
    assert "method tau=0.001" in said[0] and "300 tokens" in said[0] and "NumericalError" in said[0]
    assert "tried 2 times" in said[0] and "--resume" in said[0]


def _job(loaded, payload):
    """A job function for the pool alone: ``die-once`` kills its actor the first time, ``raise`` always raises."""
    what, marker = payload
    with open(marker, "a") as f:
        f.write("try\n")
    if what == "raise":
        raise RuntimeError("boom")
    if what == "die-once" and Path(marker).read_text().count("try") == 1:
        os._exit(1)
    return what


def test_a_job_whose_actor_dies_is_retried_and_one_that_raises_is_reported_after_two_tries(pool, tmp_path):
    names = ["a", "b", "die-once", "raise", "c", "d"]
    jobs = [
        cluster.Job(_job, (w, str(tmp_path / f"{w}.tries")), f"job {w}", passes=((1, 100 + i),))
        for i, w in enumerate(names)
    ]
    done, failed = [], []
    assert pool.run(jobs, lambda job, result: done.append(result), lambda job, why: failed.append((job.label, why)))
    assert sorted(done) == sorted(w for w in names if w != "raise")
    assert failed == [("job raise", "RuntimeError: boom (tried 2 times)")]
    assert (tmp_path / "raise.tries").read_text().count("try") == 2
    assert (tmp_path / "die-once.tries").read_text().count("try") == 2


# -- the scheduler ----------------------------------------------------------------------------------


def _sized(tokens: int, unlocks: float = 0.0) -> cluster.Job:
    return cluster.Job(_job, None, f"{tokens}", passes=((1, tokens),), unlocks=unlocks)


def test_the_queue_gives_the_heaviest_first_and_counts_what_a_job_unlocks():
    q = cluster.Queue([_sized(256), _sized(4096), _sized(1024), _sized(512, unlocks=4096.0**2)])
    assert [q.pop().label for _ in range(len(q))] == ["512", "4096", "1024", "256"]


def test_heaviest_first_ends_sooner_than_in_order_and_the_simulation_adds_up():
    jobs = [_sized(n) for n in [256] * 20 + [4096]]  # the big one last, as a plan lists it
    seconds = lambda job: job.cost / 256.0**2  # noqa: E731
    heavy = cluster.simulate(jobs, 2, seconds)
    assert heavy.makespan == 256 and heavy.work == 20 + 256 and heavy.jobs == 21
    fifo_end = 10 + 256  # in order, the 4096-token job starts after ten short ones on each worker
    assert heavy.makespan < fifo_end
    follow = cluster.simulate(
        [_sized(1024, unlocks=1.0)], 4, seconds, follow=lambda j: [_sized(256)] * 8 if j.label == "1024" else []
    )
    assert follow.makespan == 16 + 2 and follow.jobs == 9


# -- bad options: one line, exit 2, before anything starts -----------------------------------------


@pytest.mark.parametrize(
    "argv,why",
    [
        (["--address", "auto"], "only with --engine ray"),
        (["--actors", "2"], "only with --engine ray"),
        (["--engine", "ray", "--address", "127.0.0.1:9"], "cannot reach a Ray cluster"),
        (["--engine", "ray", "--address", "nonsense"], "not host:port"),
        (["--engine", "ray", "--actors", "0"], "--actors must be"),
    ],
)
def test_bad_cluster_options_exit_2_in_one_line(tiny_dir, tmp_path, capsys, argv, why):
    out = tmp_path / "s.csv"
    out.write_bytes(b"precious\r\n")
    capsys.readouterr()
    assert main(["sweep", "--model", str(tiny_dir), "--lengths", "300", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and why in err[0], err
    assert out.read_bytes() == b"precious\r\n"
