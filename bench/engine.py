"""Issue 2 benchmark: our probed encoder pass vs transformers' own sdpa pass, same weights, same run.

    python bench/engine.py                       # L = 1k, 4k, 16k tokens, CPU
    python bench/engine.py --lengths 1024,4096 --threads 1
    python bench/engine.py --lengths 4096 --heads 8 --variants sdpa,no-probes   # the default model's head count

For every length L and every variant

* ``sdpa``:          transformers' T5 encoder with ``attn_implementation="sdpa"``
                     (the reference; its attention is one fused kernel),
* ``probes-full``:   our ``aligned`` attention with every probe of a view
                     (``ProbeSpec()`` plus the question profile: what
                     ``core.engine.run`` records for the app),
* ``probes-stats``:  our attention with stats-only probes (what batch runs record),
* ``no-probes``:     our attention, no recorder, tau = 0.7 (what ``core.apply`` runs),

a *fresh subprocess* builds the same seeded tiny random T5 (as
tests/conftest.py does), runs one untimed warm-up pass, then times the
encoder forward (best of ``reps``) and reads its peak resident memory
(``getrusage(RUSAGE_SELF).ru_maxrss``: the high-water mark of the whole
process, which tracemalloc cannot see for torch). Ratios are variant time /
sdpa time at the same L, measured in this one run. Memory is reported as the
peak and as the growth over the process's footprint before the timed pass.

Note: T5 itself materialises the relative position bias ``[1, heads, L, L]``
once per pass (layer 0 computes it, every layer reuses it): 4 heads x 16k^2 x
4 bytes = 4 GiB at 16k, and computing the buckets takes several L x L int64
temporaries on the way. Every variant pays that, the sdpa reference included.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

VARIANTS = ("sdpa", "probes-full", "probes-stats", "no-probes")


def tiny_t5(layers: int = 2, heads: int = 4, d_kv: int = 16, seed: int = 0, attn: str = "sdpa"):
    """The tests' tiny random T5 (conftest.build_tiny_t5's weights), built in memory."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    cfg = T5Config(
        vocab_size=384, d_model=64, d_kv=d_kv, d_ff=128, num_layers=layers, num_decoder_layers=1,
        num_heads=heads, relative_attention_num_buckets=32, relative_attention_max_distance=128,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )
    cfg._attn_implementation = attn
    model = T5ForConditionalGeneration(cfg)
    with torch.no_grad():
        for blk in model.encoder.block:
            blk.layer[0].SelfAttention.q.weight.mul_(8.0)
        model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.normal_(0, 2.0)
    return model.eval()


def max_rss() -> int:
    """Peak resident set of this process so far, bytes (Linux reports KiB)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r * (1 if sys.platform == "darwin" else 1024)


def rss_now() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return max_rss()


def child(variant: str, length: int, reps: int, threads: int | None, heads: int = 4) -> dict:
    """One measurement in this (fresh) process."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    from core import attention  # registers "aligned"
    from core.probes import ProbeSpec, Recorder

    model = tiny_t5(heads=heads, attn="sdpa" if variant == "sdpa" else attention.ATTN_NAME)
    enc = model.get_encoder()
    g = torch.Generator().manual_seed(1)

    def one(n: int) -> float:
        ids = torch.randint(3, 300, (1, n), generator=g)
        mask = torch.ones_like(ids, dtype=torch.bool)
        if variant == "sdpa":
            ctx, rec = None, None
        elif variant == "no-probes":
            ctx, rec = attention.AttentionSettings(tau=0.7), None
        else:
            spec = ProbeSpec(profile_rows=(max(0, n - 16), n)) if variant == "probes-full" else ProbeSpec.stats_only()
            ctx, rec = attention.AttentionSettings(tau=0.7), Recorder(spec, mask)
        t0 = time.perf_counter()
        with torch.inference_mode():
            if ctx is None:
                enc(input_ids=ids)
            else:
                with attention.attention_call(ctx, rec):
                    enc(input_ids=ids)
                if rec is not None:
                    rec.finish()
        return time.perf_counter() - t0

    one(256)  # warm-up: allocator, kernels, lazy imports
    before = rss_now()
    times = [one(length) for _ in range(reps)]
    return {"variant": variant, "length": length, "heads": heads, "seconds": min(times), "all": times,
            "rss_before": before, "rss_peak": max_rss(), "threads": torch.get_num_threads()}


def run_child(variant: str, length: int, reps: int, threads: int | None, mem_limit_gb: float, heads: int = 4) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, str(length), str(reps), "--mem-limit-gb", str(mem_limit_gb),
           "--heads", str(heads)]
    if threads:
        cmd += ["--threads", str(threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1][:160]
        return {"variant": variant, "length": length, "error": f"exit {p.returncode}: {tail}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{cpu}, {os.cpu_count()} CPUs, {mem:.0f} GiB RAM, torch {torch.__version__}, "
            f"load average {' '.join(f'{x:.2f}' for x in load)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="1024,4096,16384")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads of the tiny T5 (the bundled default has 8)")
    ap.add_argument("--mem-limit-gb", type=float, default=18.0,
                    help="address-space cap per measurement, so a too-big pass fails instead of waking the OOM killer")
    ap.add_argument("--child", nargs=3, metavar=("VARIANT", "L", "REPS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        if args.mem_limit_gb > 0:
            lim = int(args.mem_limit_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        print(json.dumps(child(args.child[0], int(args.child[1]), int(args.child[2]), args.threads, args.heads)))
        return 0

    print(f"machine: {machine()}")
    lengths = [int(x) for x in args.lengths.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    rows = []
    for n in lengths:
        reps = 5 if n <= 2048 else 3 if n <= 8192 else 1
        for v in variants:
            r = run_child(v, n, reps, args.threads, args.mem_limit_gb, args.heads)
            rows.append(r)
            print(f"  measured {v:>13} at L={n:>6}: "
                  + (r["error"] if "error" in r else f"{r['seconds']:.3f}s, peak {r['rss_peak'] / 2**30:.2f} GiB"),
                  file=sys.stderr, flush=True)
    print(f"heads: {args.heads}; threads: {next((r['threads'] for r in rows if 'threads' in r), '?')}; load average after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'L':>6} {'variant':>13} {'seconds':>9} {'x sdpa':>7} {'peak GiB':>9} {'+GiB':>6}")
    for n in lengths:
        base = next((r for r in rows if r["length"] == n and r["variant"] == "sdpa" and "error" not in r), None)
        for r in (r for r in rows if r["length"] == n):
            if "error" in r:
                print(f"{n:>6} {r['variant']:>13}  failed: {r['error']}")
                continue
            ratio = f"{r['seconds'] / base['seconds']:.2f}" if base else "-"
            grow = (r["rss_peak"] - r["rss_before"]) / 2**30
            print(f"{n:>6} {r['variant']:>13} {r['seconds']:>9.3f} {ratio:>7} {r['rss_peak'] / 2**30:>9.2f} {grow:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
