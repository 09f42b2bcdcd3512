"""How close the time estimates before a long pass come on the default bundled T5 (issue 59 point 8).

    nice python bench/estimates.py                       # retrieval-t5 at 16x, 32x, 64x L_tr (4,096-16,384 tokens)
    nice python bench/estimates.py --multiples 16,32     # skip 64x (about a minute a pass here)

For each multiple of L_tr, a pass key document, then:

* ``estimate_pass`` (what the CLI prints before a long pass): ``a + b n + c n^2`` from one timed attention call
  and two short passes (:mod:`core.runs.timing`), and what it cost to make;
* the recorded-pass estimate the app's pages give (``timing.estimate``), from the passes this script already
  timed at the shorter multiples (none before the first: the app then has the lengths the person visited);
* the square law this replaced (a 2,048-token pass's time, timed twice here, scaled by the square of the length);
* the pass itself, timed (probed, no answer: what the estimates are of), and each estimate / measured.

One line per multiple, with the machine (CPU, ISA), torch's threads and the load average before and after: every
wall time here includes other processes' work, so a number means nothing without the load beside it.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def machine() -> str:
    """'AMD EPYC ... (2 cores, avx2), torch 2.x, 2 threads': what a figure was measured on."""
    import torch

    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu in ("", platform.machine(), platform.processor()):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = "avx512f" if "avx512f" in flags else "avx2" if "avx2" in flags else "no avx2"
    return f"{cpu} ({os.cpu_count()} cores, {isa}), torch {torch.__version__}, {torch.get_num_threads()} threads"


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--multiples", default="16,32,64", help="multiples of L_tr, comma separated")
    ap.add_argument("--model", default="retrieval-t5")
    args = ap.parse_args(argv)

    from core import models
    from core.data import tasks
    from core.errors import UserError
    from core.runs import engine, timing

    try:
        multiples = [int(x) for x in args.multiples.split(",")]
        loaded = models.load(args.model, device="cpu")
    except (ValueError, UserError) as err:
        print(f"bench/estimates.py: {err}")
        return 2
    how = engine.Pass(generate=False)
    key = timing.model_key(loaded)
    print(f"{args.model} (L_tr {loaded.train_length:,}) on {machine()}", flush=True)
    print(
        "multiple  tokens  estimate_pass (cost)  recorded-pass est.  old square law  measured  est/meas  rec/meas  "
        "square/meas  load",
        flush=True,
    )
    done: list[tuple[int, float]] = []
    for k in multiples:
        n = k * loaded.train_length
        doc = tasks.make("passkey", loaded.tokenizer, n, seed=0)
        enc = engine.encode(loaded, doc)
        before = load()
        # the app's estimate: only the full passes timed so far (estimate_pass's short samples are recorded too)
        timing.clear(key)
        for m, s in done:
            timing.record(key, m, s)
        recorded = timing.estimate(key, enc.n) if done else None
        t = time.perf_counter()
        est = engine.estimate_pass(loaded, doc, enc)
        cost = time.perf_counter() - t
        head = replace(
            enc, input_ids=enc.input_ids[:2048], offsets=enc.offsets[:2048], needle_tokens=None, question_tokens=None
        )
        square = [engine.run(loaded, doc, how=how, encoded=head).seconds["encode"] for _ in range(2)][-1]
        square *= (enc.n / 2048) ** 2
        measured = engine.run(loaded, doc, how=how, encoded=enc).seconds["encode"]
        done.append((enc.n, measured))
        rec = "         -" if recorded is None else f"{recorded:9.1f} s"
        rec_ratio = "   -" if recorded is None else f"{recorded / measured:4.2f}"
        print(
            f"{k:>6}x  {enc.n:>6}  {est:8.1f} s ({cost:4.1f} s)   {rec}        {square:8.1f} s  {measured:6.1f} s  "
            f"{est / measured:6.2f}    {rec_ratio}    {square / measured:6.2f}    {before} -> {load()}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
