"""How long the bounded waits wait: each measured against its bound, in one run.

    python bench/bounds.py            # every wait, 3 runs each (medians)
    python bench/bounds.py --runs 5

Why a benchmark and not a test: the tests check what a bounded wait does (it gives up, says why in one line,
and waited at least its bound where that is the point), and leave how many seconds past the bound it took to
this script, because a busy 2-core machine stretches those seconds and a test that asserts them fails for
the machine's sake, not the code's. Every wait here talks to loopback servers this script starts itself.

The waits:

* ``cluster probe, silent port``: ``python -m core sweep --address`` against a port that accepts and never
  answers: :func:`core.experiments.cluster.check_address`, bound ``PROBE_TIMEOUT``.
* ``hub probe, stalled name lookup`` / ``closed port``: :func:`core.models.hub.hub_reachable` (bound 1.5 s,
  the lookup included), as a hub id is asked for with no copy on the machine.
* ``compiler that hangs``: the fused kernel's build with a ``g++`` that sleeps, stopped at its bound
  (``BUILD_TIMEOUT_S``, set to 2 s here), in a fresh process.
* ``refusal under a 2 GiB cap``: ``python -m core run --tokens 1000000000`` under ``ulimit -v`` (exit 2),
  the whole process: interpreter start, imports and the refusal.

Each line: the median seconds, the bound, and the median's excess over the bound.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def machine() -> str:
    """The CPU, its vector ISA and the load now: what every figure here must be read beside."""
    cpu, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == "unknown CPU":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE/other"
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    return f"{cpu}, {os.cpu_count()} cores, {isa}; load {load}"


class Silent:
    """A loopback TCP server that accepts every connection and never writes a byte."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.held.append(conn)
            except OSError:
                continue

    def close(self) -> None:
        self.stop.set()
        for c in self.held:
            c.close()
        self.sock.close()


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def timed(fn) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def cluster_probe(silent: Silent) -> float:
    from core.errors import UserError
    from core.experiments import cluster

    def probe() -> None:
        try:
            cluster.check_address(f"127.0.0.1:{silent.port}")
        except UserError:
            return
        raise SystemExit("the cluster probe accepted a silent port")

    return timed(probe)


def hub_probe(endpoint: str) -> float:
    from core.models import hub

    os.environ["HF_ENDPOINT"] = endpoint
    hub._REACH.clear()  # the probe remembers its answer for 30 s: each run asks afresh
    return timed(lambda: hub.hub_reachable(timeout=1.5))


def stalled_lookups() -> None:
    """Name lookups of ``stalled.invalid`` never answer (as a DNS server that drops the query): the hub probe's
    bound must cover the lookup too."""
    real = socket.getaddrinfo

    def lookup(host, *args, **kwargs):
        if host == "stalled.invalid":
            time.sleep(60)
        return real(host, *args, **kwargs)

    socket.getaddrinfo = lookup


def hanging_compiler(folder: Path) -> float:
    fake = folder / "bin"
    fake.mkdir(exist_ok=True)
    gxx = fake / "g++"
    gxx.write_text("#!/bin/sh\nsleep 300\n")
    gxx.chmod(0o755)
    code = (
        "import core.mechanics.fused_softmax as f; f.BUILD_TIMEOUT_S = 2; "
        "import sys; sys.exit(0 if not f.available() else 1)"
    )
    env = {
        **os.environ,
        "PATH": f"{fake}:{os.environ['PATH']}",
        "XDG_CACHE_HOME": str(folder / "cache"),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("AAE_FUSED_SOFTMAX", None)
    return timed(lambda: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120))


def capped_refusal() -> float:
    cap = 2 * 2**30

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    def run() -> None:
        p = subprocess.run(
            [sys.executable, "-m", "core", "run", "--json", "--tokens", "1000000000"],
            cwd=ROOT,
            preexec_fn=limit,
            capture_output=True,
            timeout=300,
        )
        if p.returncode != 2:
            raise SystemExit(f"the capped refusal exited {p.returncode}")

    return timed(run)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from core.experiments import cluster

    print(f"machine: {machine()}")
    stalled_lookups()
    silent = Silent()
    rows: list[tuple[str, list[float], float]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            waits = [
                ("cluster probe, silent port", lambda: cluster_probe(silent), cluster.PROBE_TIMEOUT),
                ("hub probe, stalled name lookup", lambda: hub_probe("http://stalled.invalid:80"), 1.5),
                ("hub probe, closed port", lambda: hub_probe(f"http://127.0.0.1:{closed_port()}"), 1.5),
                ("compiler that hangs (fresh process)", lambda: hanging_compiler(Path(tmp)), 2.0),
                ("refusal under a 2 GiB cap (whole CLI)", capped_refusal, float("nan")),
            ]
            for name, fn, bound in waits:
                rows.append((name, [fn() for _ in range(args.runs)], bound))
    finally:
        silent.close()
    print(f"{'wait':40s} {'median s':>9s} {'min':>6s} {'max':>6s} {'bound s':>8s} {'excess':>7s}")
    for name, took, bound in rows:
        med = statistics.median(took)
        excess = "" if bound != bound else f"{med - bound:+.2f}"
        shown = "-" if bound != bound else f"{bound:g}"
        print(f"{name:40s} {med:9.2f} {min(took):6.2f} {max(took):6.2f} {shown:>8s} {excess:>7s}")
    print(f"machine after: {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
