"""How many intra-op threads a pass should use here: one session, a pass beside other work, sweeps.

    python bench/threads.py                  # the default model's probed pass at 4,096 tokens
    python bench/threads.py --length 8192

Every figure is a fresh process running ``bench/engine.py``'s probed pass (the default model, every probe
the CLI records), so the numbers are the same pass as bench/engine.py's table:

* ``alone``:   one pass on an idle machine with 1 and with 2 threads (a person's slider move, the app's
               background grid: the app runs one pass at a time, ui/pass_gate.py);
* ``beside``:  the same pass while a niced process of one thread runs the same pass in a loop (a sweep,
               a training run, another server on the same machine);

each with OpenMP's two wait policies (``OMP_WAIT_POLICY``: ACTIVE, libgomp's spinning default, and
PASSIVE, what ``core`` asks for, see core/__init__.py);
* ``sweep``:   throughput of ``2 x jobs`` passes: one process with all threads running them in turn,
               against ``jobs`` processes of one thread each running theirs at once (what ``--workers``
               or Ray actors of one thread do).

The ratios are measured in this one run; the machine line states the CPU and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "bench" / "engine.py"


def _pass(length: int, threads: int, reps: int = 1, wait: str = "PASSIVE") -> subprocess.Popen:
    env = {**os.environ, "OMP_WAIT_POLICY": wait}
    return subprocess.Popen(
        [sys.executable, str(ENGINE), "--child", "probes", str(length), str(reps), "--threads", str(threads)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env=env,
    )


def _seconds(p: subprocess.Popen) -> float:
    out, _ = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"a measurement failed (exit {p.returncode})")
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="processes in the sweep comparison")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from bench.engine import machine

    print(f"machine: {machine()}", flush=True)
    cores = os.cpu_count() or 2
    rows = []
    for wait in ("ACTIVE", "PASSIVE"):
        for t in sorted({1, cores}):
            rows.append(("alone", wait, t, _seconds(_pass(a.length, t, 2, wait))))
    for wait in ("ACTIVE", "PASSIVE"):
        for t in sorted({1, cores}):
            # the neighbour: the same pass in a loop, niced, one thread (a sweep or training run beside the app)
            hog = subprocess.Popen(
                [
                    "nice",
                    "-n",
                    "19",
                    sys.executable,
                    "-c",
                    (
                        "import subprocess, sys\n"
                        f"while True: subprocess.run([sys.executable, {str(ENGINE)!r}, '--child', 'probes', '{a.length}', '1', "
                        "'--threads', '1'], capture_output=True)\n"
                    ),
                ],
                cwd=ROOT,
                env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
                start_new_session=True,
            )
            try:
                time.sleep(8)  # the neighbour's first pass is under way
                rows.append(("beside", wait, t, _seconds(_pass(a.length, t, 1, wait))))
            finally:
                os.killpg(hog.pid, signal.SIGKILL)
                hog.wait()
    n = 2 * a.jobs
    t0 = time.perf_counter()
    for _ in range(n):
        _seconds(_pass(a.length, cores))
    seq = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(2):
        procs = [_pass(a.length, 1) for _ in range(a.jobs)]
        for p in procs:
            _seconds(p)
    par = time.perf_counter() - t0
    print(f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}; probed pass at {a.length:,} tokens")
    print(f"{'case':>8} {'OpenMP wait':>12} {'threads':>8} {'seconds':>8}")
    for case, wait, t, s in rows:
        print(f"{case:>8} {wait:>12} {t:>8} {s:>8.2f}")
    print(
        f"sweep of {n} passes: one process x {cores} threads in turn {seq:.1f} s; "
        f"{a.jobs} processes x 1 thread at once {par:.1f} s (ratio {par / seq:.2f}; process start-up included)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
