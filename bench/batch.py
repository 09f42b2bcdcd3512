"""Issue 5 benchmark: the costs of taking a chosen tau into batch runs, as ratios measured in one run.

    python bench/batch.py            # everything (CPU; a few minutes on 2 busy cores)
    python bench/batch.py --quick    # skip the 16k-token memory runs
    python bench/batch.py --padded   # only (e)

(a) ``core.runs.apply`` with tau = 0.7 and no probes vs plain transformers
    (``attn_implementation="sdpa"``) ``generate``, same model object, same
    inputs, 16 new tokens forced (aim: <= 1.15x);
(b) a batch run's pass with stats-only probes vs the same pass without probes
    (encoder with/without a Recorder, then generation from that encoder
    output, as ``core.runs.engine.run_encoded`` does; aim: <= 1.5x);
(c) Algorithm 1's fast search vs the full grid (``core.runs.calibration.calibrate``
    ``fast=True/False``): forward passes and time (aim: <= 0.5x);
(d) peak resident memory of a probed encoder pass at 4k and 16k tokens with
    the default chunk budget vs one block for all rows (``chunk_bytes`` huge),
    each in a fresh subprocess (``getrusage`` max RSS), under an address-space
    cap so that a pass too big for the machine fails on its own instead of
    calling the kernel's OOM killer;
(e) a padded batch (4 documents of 1,000-2,600 tokens, the bundled default
    model, stats probes, ``core.runs.engine.run_batch``) with the fused CPU
    kernel vs torch's path (``AAE_FUSED_SOFTMAX=0``: the path every padded
    batch took before its mask was handed over as one row of keys, issue 49),
    wall and CPU seconds (on a busy machine the CPU time is the steadier one).

Timings interleave the two sides of a ratio and keep the best of several
repeats, which damps (but cannot remove) noise from other processes. The
model is the tests' tiny random T5 (bench/engine.py's ``tiny_t5``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine import machine, max_rss, rss_now, tiny_t5  # bench/engine.py: a sibling script (bench/ is sys.path[0])

from core.mechanics.run_pass import Pass
from core.values.choice import Choice

ROOT = Path(__file__).resolve().parent.parent


def best_pair(f, g, reps: int) -> tuple[float, float]:
    """Best-of-``reps`` times of f and g, interleaved."""
    tf, tg = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        tf.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        g()
        tg.append(time.perf_counter() - t0)
    return min(tf), min(tg)


def bench_apply(lengths_batches, reps: int) -> list[dict]:
    import torch

    from core.runs.apply import apply

    model = tiny_t5(attn="sdpa")
    out = []
    for n, b in lengths_batches:
        ids = torch.randint(3, 300, (b, n), generator=torch.Generator().manual_seed(n))
        mask = torch.ones_like(ids)
        kw = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, num_beams=1)

        def plain():
            with torch.inference_mode():
                return model.generate(input_ids=ids, attention_mask=mask, **kw)

        def aligned():
            with apply(model, tau=0.7), torch.inference_mode():
                return model.generate(input_ids=ids, attention_mask=mask, **kw)

        plain(), aligned()  # warm-up
        tp, ta = best_pair(plain, aligned, reps)
        out.append({"L": n, "batch": b, "sdpa_s": tp, "apply_s": ta, "ratio": ta / tp})
    return out


def bench_probes(lengths_batches, reps: int) -> list[dict]:
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    from core.mechanics.attention import attention_call
    from core.mechanics.probes import ProbeSpec, Recorder

    model = tiny_t5(attn="aligned")
    enc = model.get_encoder()
    st = Choice.of(tau=0.7)
    out = []
    for n, b in lengths_batches:
        ids = torch.randint(3, 300, (b, n), generator=torch.Generator().manual_seed(n))
        mask = torch.ones_like(ids)

        def run(probes: bool, generate: bool):
            t0 = time.perf_counter()
            with torch.inference_mode():
                rec = Recorder(ProbeSpec.stats_only(), mask.bool()) if probes else None
                with attention_call(st, None, rec):
                    h = enc(input_ids=ids).last_hidden_state
                if rec is not None:
                    rec.finish()
                t1 = time.perf_counter()
                if generate:
                    with attention_call(st, None):
                        model.generate(
                            encoder_outputs=BaseModelOutput(last_hidden_state=h),
                            attention_mask=mask,
                            max_new_tokens=16,
                            min_new_tokens=16,
                            do_sample=False,
                            num_beams=1,
                        )
            return t1 - t0, time.perf_counter() - t0

        run(True, True), run(False, True)  # warm-up
        on_e, on_t, off_e, off_t = [], [], [], []
        for _ in range(reps):
            e, t = run(True, True)
            on_e.append(e), on_t.append(t)
            e, t = run(False, True)
            off_e.append(e), off_t.append(t)
        times = {"on_total": min(on_t), "off_total": min(off_t), "on_encoder": min(on_e), "off_encoder": min(off_e)}
        out.append(
            {
                "L": n,
                "batch": b,
                **times,
                "ratio": times["on_total"] / times["off_total"],
                "ratio_encoder": times["on_encoder"] / times["off_encoder"],
            }
        )
    return out


def bench_algorithm1(length_factor: int) -> dict:
    from transformers import ByT5Tokenizer

    from core.data import tasks
    from core.models import load
    from core.runs import calibration

    with tempfile.TemporaryDirectory(prefix="bench-tiny-") as tmp:
        folder = Path(tmp)
        tiny_t5(attn="sdpa").save_pretrained(folder, safe_serialization=True)
        ByT5Tokenizer().save_pretrained(folder)
        (folder / "card.json").write_text(json.dumps({"train_length": 256}))
        loaded = load(str(folder), device="cpu")  # weights and tokenizer are in memory from here on
    n = length_factor * loaded.train_length
    doc = tasks.make("passkey", loaded.tokenizer, n, depth=0.5, seed=0)
    calibration.calibrate(loaded, doc, "pmax", fast=True)  # warm-up (tokenisation caches, kernels)
    res = {}
    for fast in (False, True, False, True):
        t0 = time.perf_counter()
        cal = calibration.calibrate(loaded, doc, "pmax", fast=fast)
        dt = time.perf_counter() - t0
        key = "fast" if fast else "grid"
        if key not in res or dt < res[key]["seconds"]:
            res[key] = {"seconds": dt, "passes": cal.passes, "tau": cal.tau}
    res["L"] = n
    res["ratio"] = res["fast"]["seconds"] / res["grid"]["seconds"]
    return res


def mem_child(length: int, chunk_bytes: int, threads: int | None) -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)
    from core.mechanics.attention import attention_call
    from core.mechanics.probes import ProbeSpec, Recorder

    model = tiny_t5(attn="aligned")
    enc = model.get_encoder()

    def one(n: int, cb: int) -> float:
        ids = torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(n))
        rec = Recorder(ProbeSpec.stats_only(), torch.ones_like(ids, dtype=torch.bool))
        t0 = time.perf_counter()
        with torch.inference_mode(), attention_call(Choice.of(tau=0.7), Pass(chunk_bytes=cb), rec):
            enc(input_ids=ids)
        rec.finish()
        return time.perf_counter() - t0

    one(256, chunk_bytes)
    before = rss_now()
    dt = one(length, chunk_bytes)
    return {"L": length, "chunk_bytes": chunk_bytes, "seconds": dt, "rss_before": before, "rss_peak": max_rss()}


def bench_memory(lengths, threads, limit_gb: float) -> list[dict]:
    from core.mechanics.attention import default_chunk_bytes

    out = []
    for n in lengths:
        for label, cb in (("chunked", default_chunk_bytes("cpu")), ("unchunked", 2**62)):
            cmd = [sys.executable, __file__, "--mem-child", str(n), str(cb), "--mem-limit-gb", str(limit_gb)]
            if threads:
                cmd += ["--threads", str(threads)]
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if p.returncode == 0:
                r = json.loads(p.stdout.strip().splitlines()[-1])
            else:
                why = (p.stderr.strip().splitlines() or ["?"])[-1][:140]
                r = {"L": n, "chunk_bytes": cb, "error": f"failed under the {limit_gb:g} GiB cap: {why}"}
            r["label"] = label
            out.append(r)
            print(
                f"  memory {label} L={n}: " + (r.get("error") or f"peak {r['rss_peak'] / 2**30:.2f} GiB"),
                file=sys.stderr,
                flush=True,
            )
    return out


def bench_padded(reps: int) -> dict:
    """(e): a padded batch's pass with the kernel and without it, interleaved, best of ``reps`` each."""
    from core import models
    from core.data import tasks
    from core.mechanics import fused_softmax
    from core.mechanics.probes import ProbeSpec
    from core.runs import engine

    loaded = models.load("retrieval-t5", device="cpu")
    docs = [tasks.make("passkey", loaded.tokenizer, n, seed=i) for i, n in enumerate((1000, 1600, 2100, 2600))]
    choice, how = Choice.of(tau=0.7), engine.Pass(probes=ProbeSpec.stats_only(), max_new_tokens=8)
    best: dict[str, list[float]] = {}
    old = os.environ.get(fused_softmax.ENV_SWITCH)
    try:
        for rep in range(reps + 1):
            for side in ("kernel", "torch"):
                os.environ[fused_softmax.ENV_SWITCH] = "1" if side == "kernel" else "0"
                t0, c0 = time.perf_counter(), time.process_time()
                engine.run_batch(loaded, docs, choice, how, batch_size=4)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                if rep:  # the first round warms up both sides
                    b = best.setdefault(side, [float("inf"), float("inf")])
                    best[side] = [min(b[0], wall), min(b[1], cpu)]
    finally:
        if old is None:
            os.environ.pop(fused_softmax.ENV_SWITCH, None)
        else:
            os.environ[fused_softmax.ENV_SWITCH] = old
    return {"kernel": best["kernel"], "torch": best["torch"], "kernel_available": fused_softmax.available()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="memory at 4k only")
    ap.add_argument("--padded", action="store_true", help="only (e): a padded batch with and without the kernel")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--mem-limit-gb", type=float, default=18.0)
    ap.add_argument("--mem-child", nargs=2, metavar=("L", "CHUNK_BYTES"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.mem_child:
        lim = int(args.mem_limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        print(json.dumps(mem_child(int(args.mem_child[0]), int(args.mem_child[1]), args.threads)))
        return 0

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"machine: {machine()}; torch threads {torch.get_num_threads()}")
    shapes = [(1024, 4), (4096, 1)]
    t0 = time.perf_counter()
    if args.padded:
        _print_padded(bench_padded(args.reps))
        print(
            f"\ntotal {time.perf_counter() - t0:.0f}s; load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        return 0

    print("\n(a) core.runs.apply(tau=0.7), no probes  vs  plain sdpa generate (16 new tokens)   aim <= 1.15x")
    for r in bench_apply(shapes, args.reps):
        print(
            f"    L={r['L']:>5} x{r['batch']}: sdpa {r['sdpa_s']:.3f}s  apply {r['apply_s']:.3f}s  ratio {r['ratio']:.2f}x "
            f"[{'met' if r['ratio'] <= 1.15 else 'MISSED'}]"
        )

    print("\n(b) stats-only probes on  vs  off (encoder + 16-token generation, tau=0.7)      aim <= 1.5x")
    for r in bench_probes(shapes, args.reps):
        print(
            f"    L={r['L']:>5} x{r['batch']}: off {r['off_total']:.3f}s  on {r['on_total']:.3f}s  ratio {r['ratio']:.2f}x "
            f"[{'met' if r['ratio'] <= 1.5 else 'MISSED'}]   (encoder alone: {r['ratio_encoder']:.2f}x)"
        )

    print("\n(c) Algorithm 1 (pmax): fast search  vs  full grid                                aim <= 0.5x")
    r = bench_algorithm1(4)
    print(
        f"    L={r['L']}: grid {r['grid']['passes']} passes {r['grid']['seconds']:.2f}s (tau {r['grid']['tau']})  "
        f"fast {r['fast']['passes']} passes {r['fast']['seconds']:.2f}s (tau {r['fast']['tau']})  "
        f"ratio {r['ratio']:.2f}x [{'met' if r['ratio'] <= 0.5 else 'MISSED'}]"
    )

    lengths = [4096] if args.quick else [4096, 16384]
    print(f"\n(d) peak memory of a probed encoder pass, default chunks vs one block (cap {args.mem_limit_gb:g} GiB)")
    for r in bench_memory(lengths, args.threads, args.mem_limit_gb):
        if "error" in r:
            print(f"    L={r['L']:>5} {r['label']:>9}: {r['error']}")
        else:
            print(
                f"    L={r['L']:>5} {r['label']:>9}: peak {r['rss_peak'] / 2**30:.2f} GiB "
                f"(+{(r['rss_peak'] - r['rss_before']) / 2**30:.2f} GiB over the idle process), {r['seconds']:.1f}s"
            )
    _print_padded(bench_padded(args.reps))
    print(f"\ntotal {time.perf_counter() - t0:.0f}s; load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def _print_padded(r: dict) -> None:
    print("\n(e) a padded batch (4 documents, 1,000-2,600 tokens, stats probes): fused kernel vs torch's path")
    if not r["kernel_available"]:
        print("    the kernel is not available here (no compiler, or switched off): nothing to compare")
        return
    (kw, kc), (tw, tc) = r["kernel"], r["torch"]
    print(
        f"    kernel {kw:.2f}s wall, {kc:.2f}s CPU   torch {tw:.2f}s wall, {tc:.2f}s CPU   "
        f"ratio {kw / tw:.2f}x wall, {kc / tc:.2f}x CPU"
    )


if __name__ == "__main__":
    sys.exit(main())
