"""How long ``python -m core --help`` and a bad option take, from a fresh process each time.

Why: the CLI answers both before torch and transformers are imported (tests/cli/test_cli_startup.py checks the import
list; time is this machine's business, so it is measured here, not asserted). Prints the median of ``--runs`` runs
of each case, the machine's CPU and its load (``/proc/loadavg``) before and after, and, with ``--torch``, the time
``import torch, transformers`` alone takes here for comparison (what each answer used to wait for).

    python bench/cli_startup.py [--runs 7] [--torch]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "--help": ["--help"],
    "bad option (run --bogus)": ["run", "--bogus"],
    "bad value (run --tokens 0)": ["run", "--tokens", "0"],
}


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def _seconds(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--torch", action="store_true", help="also time `import torch, transformers` alone")
    args = p.parse_args()
    print(f"machine: {_cpu()}; load before: {_load()}")
    cases = {name: [sys.executable, "-m", "core", *argv] for name, argv in CASES.items()}
    if args.torch:
        cases["import torch, transformers"] = [sys.executable, "-c", "import torch, transformers"]
    for name, cmd in cases.items():
        _seconds(cmd)  # one warm-up run: the file cache
        times = [_seconds(cmd) for _ in range(args.runs)]
        print(
            f"{name:<28} median {statistics.median(times):.2f} s  (min {min(times):.2f}, max {max(times):.2f}, "
            f"{args.runs} runs)"
        )
    print(f"load after: {_load()}")


if __name__ == "__main__":
    main()
