"""Issue 27 benchmark: a sweep here and on a local Ray (same run), and the results table projected on 8 and 64 workers.

    python bench/ray_sweep.py                      # both parts, ~5 min on 2 busy cores
    python bench/ray_sweep.py --skip-run           # the projection only (measures the per-length costs)
    python bench/ray_sweep.py --save-costs c.json  # keep the measured per-length costs (e.g. on a GPU node) ...
    python bench/ray_sweep.py --skip-run --costs c.json   # ... and project from them elsewhere

Part 1, measured: one generated sweep of the bundled model (``--lengths``
x ``--methods``, ``--samples`` documents each) through
:func:`core.experiments.sweep.run_sweep`, first in this process with one torch thread,
then on a local Ray with ``--actors`` actors of one thread each (started
first, its start-up timed on its own). Prints both times, their ratio, the
rows compared (all but ``seconds`` must be equal), and the overhead per job:
the round trip of an empty job through the same pool (median of 200).

Part 2, projected: the job list ``bench/results.py --engine ray`` submits
for the whole results table of the model (every task of its card, 1x-16x
L_tr, ``--table-samples`` documents per cell, batches of 10: a calibration
and a dispersion run per cell, and per distinct tau its documents in slices
of one batch), each job costed from per-length costs measured here (seconds
per document of an accuracy run, batch of up to 10, probes off; of a
stats-only encoder pass; the encoder passes Algorithm 1's calibration ran at
2x, counted), then scheduled by :func:`core.experiments.cluster.simulate`, the same queue
the Ray engine uses, on 1, 8 and 64 workers, heaviest first and, to show
what that saves, in plan order. The measured taus of ``assets/results``
decide which accuracy runs the calibrated methods share, as a real run
would. **A simulation, not a measurement**: no start-up, no contention, one
worker = one CPU thread of this machine unless ``--costs`` came from
elsewhere (a GPU node: ``--save-costs`` there).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import results as rb  # bench/results.py: a sibling script (bench/ is sys.path[0])
from engine import machine  # bench/engine.py

ROOT = Path(__file__).resolve().parent.parent
MULTIPLES = (1, 2, 4, 8, 16)


def _noop(loaded, payload):
    return payload


def _load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- part 1: the same sweep here and on Ray -------------------------------------------------------


def compare(loaded, lengths: list[int], methods: list[str], samples: int, actors: int) -> dict:
    import pandas as pd

    from core.experiments import cluster
    from core.experiments.sweep import SweepPlan, run_sweep

    plan = SweepPlan(
        model=loaded.spec.name,
        task="passkey",
        lengths=lengths,
        depths=[0.5],
        seeds=list(range(samples)),
        methods=methods,
    )
    rb.docs_for(loaded, "passkey", lengths[0], 1)  # warm the tokenizer and filler text
    t0 = time.perf_counter()
    local = run_sweep(loaded, plan)
    t_local = time.perf_counter() - t0
    jobs: list[int] = []
    t0 = time.perf_counter()
    with cluster.RayEngine(actors=actors, cpus_per_actor=1) as pool:
        pool.prepare(pool.model_ref(loaded))
        t_start = time.perf_counter() - t0

        class Count:
            def start(self, n, rows, seconds, where):
                jobs.append(n)

            def advance(self, jobs=1, rows=0):
                pass

            def add(self, jobs):
                pass

        t0 = time.perf_counter()
        remote = run_sweep(loaded, plan, pool=pool, tracker=Count())
        t_ray = time.perf_counter() - t0
        trips = []
        for i in range(200):
            t0 = time.perf_counter()
            pool.run([cluster.Job(_noop, i, "noop")], lambda job, r: None, lambda job, why: None)
            trips.append(time.perf_counter() - t0)
    same = local.drop(columns=["seconds"]).equals(remote.drop(columns=["seconds"]))
    return {
        "rows": plan.total,
        "jobs": jobs[0],
        "local_s": t_local,
        "ray_s": t_ray,
        "ray_start_s": t_start,
        "ratio": t_local / t_ray,
        "efficiency": t_local / (actors * t_ray),
        "noop_job_s": statistics.median(trips),
        "same_rows": bool(same),
        "row_seconds": float(pd.to_numeric(local["seconds"]).sum()),
    }


# -- part 2: per-length costs, then the table's jobs on a clock -----------------------------------------


def measure_costs(loaded, batch: int = 10) -> dict:
    """Seconds per document at each multiple of L_tr (one torch thread): an accuracy run (probes off, answer
    generated, up to ``batch`` documents at once) and a stats-only encoder pass; and the encoder passes
    :func:`results.calibrated_taus` runs at 2x (here and at L_tr), counted."""
    from core.runs import timing

    lt = loaded.train_length
    docs_at = {1: 10, 2: 10, 4: 5, 8: 2, 16: 1}
    out: dict = {"train_length": lt, "accuracy_s": {}, "stats_s": {}, "device": str(loaded.device)}
    rb.correct_flags(loaded, *_docs(loaded, lt, 2), 1.0, batch)  # warm-up
    for k, count in docs_at.items():
        n = k * lt
        docs, encs = _docs(loaded, n, count)
        t0 = time.perf_counter()
        rb.correct_flags(loaded, docs, encs, 1.0, batch)
        out["accuracy_s"][n] = (time.perf_counter() - t0) / count
        m = max(1, count // 2)
        t0 = time.perf_counter()
        rb.dispersion(loaded, docs[:m], encs[:m], batch)
        out["stats_s"][n] = (time.perf_counter() - t0) / m
        print(
            f"  {k:>2}x ({n:>5} tokens): accuracy {out['accuracy_s'][n]:.3f} s/doc ({count} docs), "
            f"stats pass {out['stats_s'][n]:.3f} s/doc ({m})",
            flush=True,
        )
    seen: Counter = Counter()
    real = timing.record

    def counting(key, tokens, seconds, kind=timing.ENCODE):
        if kind == timing.ENCODE:
            seen[int(tokens)] += 1
        real(key, tokens, seconds, kind)

    timing.record = counting
    try:
        rb.calibrated_taus(loaded, "passkey", 2, 2 * lt)
    finally:
        timing.record = real
    here = sum(c for n, c in seen.items() if n > lt)
    out["calibration_passes"] = {"here": here, "reference": sum(seen.values()) - here}
    print(
        f"  calibration at 2x: {here} encoder passes at 2x, {out['calibration_passes']['reference']} at L_tr",
        flush=True,
    )
    return out


def _docs(loaded, n: int, count: int):
    from core.runs import engine

    docs = rb.docs_for(loaded, "passkey", n, count)
    return docs, [engine.encode(loaded, d) for d in docs]


def _nearest(table: dict, n: int) -> float:
    """Seconds at ``n`` tokens: measured, else scaled by the square from the nearest measured length."""
    table = {int(k): float(v) for k, v in table.items()}
    if n in table:
        return table[n]
    near = min(table, key=lambda m: abs(m - n))
    return table[near] * (n / near) ** 2


def recorded_taus(model_name: str) -> dict[tuple[str, float], dict]:
    """The calibrated taus of the committed tables (assets/results), per (task, multiple): method -> schedule."""
    path = ROOT / "assets" / "results" / f"{model_name}.csv"
    if not path.exists():
        return {}
    import pandas as pd

    out: dict = {}
    for _, r in pd.read_csv(path).iterrows():
        sched = ast.literal_eval(r["schedule"])
        out.setdefault((r["task"], float(r["multiple"])), {})[r["method"]] = sched[0] if len(sched) == 1 else sched
    return out


def project(
    loaded, costs: dict, tasks: list[str], samples: int, workers_list: list[int], overhead: float
) -> list[dict]:
    from core.experiments import cluster

    lt = loaded.train_length
    ref = int(costs["train_length"])
    scale = lambda n: n * ref // lt  # noqa: E731 - costs measured for another L_tr: the same multiple
    acc_s = lambda n: _nearest(costs["accuracy_s"], scale(n))  # noqa: E731
    stats_s = lambda n: _nearest(costs["stats_s"], scale(n))  # noqa: E731
    calib = costs["calibration_passes"]
    taus = recorded_taus(loaded.spec.name)

    def seconds(job) -> float:
        if job.kind == "accuracy":
            return job.payload[3] * acc_s(job.payload[1])
        if job.kind == "dispersion":
            return job.payload[2] * stats_s(job.payload[1])
        n = job.payload[2]
        return calib["here"] * stats_s(n) + calib["reference"] * stats_s(lt)

    rows = []
    for heavy in (True, False):
        for w in workers_list:
            plan = rb.TablePlan(loaded, tasks, list(MULTIPLES), samples, 10, 20)

            def follow(job):
                if job.kind == "taus":
                    task, k, n = job.payload
                    got = taus.get((task, float(k)), {})
                    # the measured taus as recorded (grid values: exact at 3 decimals); not recorded: all distinct
                    measured = {m: got.get(m, -1.0 - i) for i, m in enumerate(rb.MEASURED)}
                    return plan.done(
                        job, {**rb.closed_taus(loaded, n), **measured, **{f"tau={t:g}": t for t in rb.FIXED}}
                    )
                if job.kind == "accuracy":
                    return plan.done(job, [True] * job.payload[3])
                return plan.done(job, [[0.0], [0.0]])

            sim = cluster.simulate(plan.jobs(), w, seconds, follow, overhead=overhead, heavy_first=heavy)
            rows.append(
                {
                    "workers": w,
                    "heavy_first": heavy,
                    "makespan_s": sim.makespan,
                    "work_s": sim.work,
                    "jobs": sim.jobs,
                    "busy": sim.busy,
                    "longest_job_s": sim.longest,
                }
            )
    return rows


def _hours(s: float) -> str:
    return f"{s / 3600:.2f} h" if s >= 3600 else f"{s / 60:.1f} min"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the bundled default model")
    p.add_argument("--lengths", default="1,2,4", help="part 1: multiples of L_tr")
    p.add_argument("--methods", default="none,log-length,0.8,pmax", help="part 1: methods")
    p.add_argument("--samples", type=int, default=4, help="part 1: documents per length and method")
    p.add_argument("--actors", type=int, default=2, help="part 1: Ray actors (one thread each)")
    p.add_argument("--skip-run", action="store_true", help="skip part 1")
    p.add_argument("--table-samples", type=int, default=100, help="part 2: documents per cell (the tables' 100)")
    p.add_argument("--workers", default="1,8,64", help="part 2: pool sizes to simulate")
    p.add_argument("--costs", help="part 2: per-length costs from a JSON (--save-costs) instead of measuring here")
    p.add_argument("--save-costs", help="part 2: write the measured per-length costs to this JSON")
    a = p.parse_args(argv)

    import torch

    from core.models import default_model, load

    torch.set_num_threads(1)  # one thread here, like each actor: the unit of both parts
    loaded = load(a.model or default_model(), device="cpu")
    lt = loaded.train_length
    print(f"machine: {machine()}")
    print(
        f"model: {loaded.spec.name} (L_tr {lt}), torch threads 1, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    overhead = 0.0
    if not a.skip_run:
        lengths = [int(float(k) * lt) for k in a.lengths.split(",")]
        print(
            f"\n1. one sweep, here vs a local Ray with {a.actors} actors: lengths {lengths}, methods {a.methods}, "
            f"{a.samples} documents each (load before {_load_avg()})",
            flush=True,
        )
        r = compare(loaded, lengths, a.methods.split(","), a.samples, a.actors)
        overhead = r["noop_job_s"]
        print(
            f"   here (1 process, 1 thread):  {r['local_s']:.1f} s for {r['rows']} rows "
            f"({r['row_seconds']:.1f} s inside the rows' own passes)"
        )
        print(
            f"   Ray ({a.actors} actors x 1 thread):   {r['ray_s']:.1f} s in {r['jobs']} jobs "
            f"(+ {r['ray_start_s']:.1f} s once: start Ray, load the model on every actor)"
        )
        print(
            f"   ratio here / Ray: {r['ratio']:.2f}x (per actor {r['efficiency']:.2f}); "
            f"overhead per job (empty job's round trip, median of 200): {1000 * r['noop_job_s']:.2f} ms"
        )
        print(f"   rows equal (all but seconds): {r['same_rows']}  (load after {_load_avg()})", flush=True)
    if a.costs:
        costs = json.loads(Path(a.costs).read_text())
        print(f"\n2. per-length costs from {a.costs} ({costs.get('device', '?')})")
    else:
        print(f"\n2. per-length costs measured here (one thread; load {_load_avg()}):", flush=True)
        costs = measure_costs(loaded)
    if a.save_costs:
        Path(a.save_costs).write_text(json.dumps(costs, indent=1))
    tasks = rb.card_tasks(loaded) or ["passkey"]
    workers = [int(w) for w in a.workers.split(",")]
    rows = project(loaded, costs, tasks, a.table_samples, workers, overhead)
    print(
        f"\n   projected (a simulation of the job list, not a measurement): the full results table of "
        f"{loaded.spec.name}, {len(tasks)} tasks x {len(MULTIPLES)} lengths x {a.table_samples} documents, "
        f"one worker = one thread here, + {1000 * overhead:.2f} ms per job"
    )
    one = next(r["makespan_s"] for r in rows if r["workers"] == 1 and r["heavy_first"])
    print("   | workers | heavy first | speed-up | busy | in plan order |")
    print("   |---:|---:|---:|---:|---:|")
    for w in workers:
        h = next(r for r in rows if r["workers"] == w and r["heavy_first"])
        f = next(r for r in rows if r["workers"] == w and not r["heavy_first"])
        print(
            f"   | {w} | {_hours(h['makespan_s'])} | {one / h['makespan_s']:.1f}x | {h['busy']:.0%} | "
            f"{_hours(f['makespan_s'])} |"
        )
    h = rows[0]
    print(
        f"   {h['jobs']} jobs, {_hours(h['work_s'])} of work; the longest job {h['longest_job_s']:.0f} s "
        "(a 16x calibration, which the cell's measured-tau runs wait for)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
