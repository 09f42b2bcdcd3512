"""Long documents on the default model: transformers' sdpa, ours with and without probes, and the arithmetic floor.

    python bench/engine.py                                   # 2k, 4k, 8k, 16k, 32k tokens; torch's thread count
    python bench/engine.py --lengths 2048,8192 --threads 1
    python bench/engine.py --variants floor,probes --lengths 16384
    python bench/engine.py --lengths 8192 --isa avx2          # an AVX2-only CPU's code paths, on this machine
    python bench/engine.py --model smollm2-135m --lengths 8192  # the decoder-only LLM (fetched beforehand)
    python bench/engine.py --model smollm2-135m --lengths 32768 --variants probes --layers 2  # its peak memory

For every length L, each figure in a *fresh subprocess* (so peak memory is that figure's own), on the
bundled default model (retrieval-t5: 4 encoder layers x 8 heads, d_kv 32) and a pass key document of L
tokens:

* ``sdpa``:      transformers' own T5 encoder (``attn_implementation="sdpa"``): it builds the dense
                 ``[1, H, L, L]`` relative bias and its int64 buckets; skipped where those alone would not
                 fit in this machine's memory (32k: 34 GiB of bias).
* ``ours``:      our attention (``core.models.load``: lazy bias, fused CPU kernel), tau = 0.7, no probes:
                 what ``core.runs.apply`` and accuracy-only sweeps run.
* ``probes``:    the same with every probe the CLI's ``run`` records (``ProbeSpec()``: Pmax and H of every
                 layer, layer 0's map, its sorted logits, and the question's profile).
* ``floor``:     no pass: the arithmetic a pass cannot avoid, timed on this machine in the same run. The
                 encoder's q.k and p.v matmuls (``2 d_kv`` FLOPs per score each, at the block shapes the
                 pass uses), one ``exp`` per score, and the projections and feed-forward layers (their
                 FLOPs at the rate ``linear`` reaches on the pass's shapes). The floor is their FLOPs and
                 exps divided by the measured rates: nothing else (bias, tau, mask, max, sums, probes)
                 is counted, so a pass cannot reach it.

``--model smollm2-135m``: the decoder-only LLM (Llama, 30 layers, 9 query heads on 3 key/value heads, head dim 64)
from the user's cache (``python -m core models fetch smollm2-135m``; without it the run says so in one line and
stops). The pass is its prefill over the prompt (the base model, no cache kept, no answer: what a probed pass's
statistics and views come from): ``sdpa`` is transformers' own sdpa attention, ``ours`` and ``probes`` ours with
tau = 0.7 on the decoder (``probes``: Pmax and H of every layer, layer 0's map, the question's profile: the CLI's
``run`` records these on a decoder). Its ``floor``: the linear layers (q, k, v, o projections with the grouped
k and v, the gated feed-forward) at the rate ``linear`` reaches on the pass's shapes, plus HALF the attention's
q.k and p.v FLOPs (causal rows: a row sees the keys before it; grouped heads: ``H`` query heads of head dim
``d``) and half its exps, at the block shapes the kernel uses. ``--layers N`` keeps only the first N decoder layers
after loading (every weight was loaded, so the peak memory is the whole model's with one layer's largest
attention call): how 32,768 tokens' peak memory is measured without a half-hour pass.

``--isa avx2`` runs every child as an AVX2-only CPU would: torch's own kernels (``ATEN_CPU_CAPABILITY``),
MKL's and oneDNN's matmuls (``MKL_ENABLE_INSTRUCTIONS``, ``ONEDNN_MAX_CPU_ISA``) and our kernel
(``AAE_KERNEL_MARCH=haswell``) all limited to AVX2, floor included, so the ratio is the one such a CPU sees
(its clock and caches aside).

Each line: seconds (encoder pass, best of the repeats after an untimed warm-up), ratio to the floor and
to sdpa at the same L, the same in the process's CPU seconds (all threads; on a busy machine the wall
time counts other processes' work, the CPU time far less of it, so its ratio is the steadier one), the process's peak resident memory (``ru_maxrss``) and its growth over the
footprint before the timed pass. The machine line states the CPU, its load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VARIANTS = ("floor", "sdpa", "ours", "probes")
#: The decoder-only LLM this bench knows (core.models' catalog name); any other --model is the T5 default's path.
DECODER_MODEL = "smollm2-135m"
#: The environment that makes this machine run an older CPU's code paths (see the module doc).
ISA_ENV = {
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "AAE_KERNEL_MARCH": "haswell",
    },
    "native": {},
}
MODEL = "retrieval-t5"


def tiny_t5(layers: int = 2, heads: int = 4, d_kv: int = 16, seed: int = 0, attn: str = "sdpa"):
    """bench/batch.py's model: the tests' tiny random T5 (conftest.build_tiny_t5's weights), built in memory."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    cfg = T5Config(
        vocab_size=384,
        d_model=64,
        d_kv=d_kv,
        d_ff=128,
        num_layers=layers,
        num_decoder_layers=1,
        num_heads=heads,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    cfg._attn_implementation = attn
    model = T5ForConditionalGeneration(cfg)
    with torch.no_grad():
        for blk in model.encoder.block:
            blk.layer[0].SelfAttention.q.weight.mul_(8.0)
        model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.normal_(0, 2.0)
    return model.eval()


def max_rss() -> int:
    """Peak resident set of this process so far, bytes (``core.models.memory.peak_bytes`` on the CPU)."""
    from core.models import memory

    return memory.peak_bytes("cpu")


def rss_now() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return max_rss()


def machine(isa: str = "native") -> str:
    import torch

    from core.mechanics.machine import vector_isa

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    runs = vector_isa() if isa == "native" else f"{isa} code paths (the CPU has {vector_isa()})"
    return (
        f"{cpu}, {runs}, {os.cpu_count()} CPUs, {mem:.0f} GiB RAM, torch {torch.__version__}, "
        f"load average {' '.join(f'{x:.2f}' for x in load)}"
    )


def _document(loaded, n: int):
    from core.data import tasks
    from core.runs import engine

    doc = tasks.make("passkey", loaded.tokenizer, n, seed=0)
    return engine.encode(loaded, doc)


def _timed(fn, reps: int, cpu: list[float] | None = None) -> list[float]:
    """Wall seconds of ``reps`` calls; the process's CPU seconds of each appended to ``cpu`` if given (all
    threads: on a busy machine the wall time counts the others' work too, the CPU time much less of it)."""
    out = []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        out.append(time.perf_counter() - t0)
        if cpu is not None:
            cpu.append(time.process_time() - c0)
    return out


def _load(model: str):
    """The model ``model`` on the CPU (the decoder from the user's cache: a clear line and exit 2 when not fetched)."""
    from core import models
    from core.errors import UserError

    try:
        return models.load(model, device="cpu")
    except UserError as err:
        print(f"bench/engine.py: {model} is not available here ({err}); fetch it first", file=sys.stderr)
        sys.exit(2)


def decoder_floor_child(model: str, length: int, layers_kept: int | None) -> dict:
    """The arithmetic floor of one decoder prefill at ``length`` tokens on this machine (see the module doc):
    the linear layers' FLOPs and half the attention's (causal rows), at rates measured here, at the shapes the
    pass uses."""
    import torch

    from core.mechanics import softmax_block

    loaded = _load(model)
    cfg = loaded.config
    H, Hk, layers, dm, dff = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.intermediate_size,
    )
    layers = min(layers, layers_kept or layers)
    d = getattr(cfg, "head_dim", None) or dm // H
    rows = max(1, min(length, softmax_block.KERNEL_CHUNK_BYTES // (H * length * 4)))
    g = torch.Generator().manual_seed(0)
    # a block of rows in the middle of the prefill: it sees half the keys (the mean over the pass's blocks)
    seen = max(rows, length // 2)
    q = torch.randn(1, H, rows, d, generator=g)
    kT = torch.randn(1, Hk, seen, d, generator=g).transpose(-1, -2)
    v = torch.randn(1, Hk, seen, d, generator=g)
    s = torch.empty(1, H, rows, seen)
    e = torch.rand(1, H, rows, seen, generator=g) * -20
    e_out = torch.empty_like(e)
    x = torch.randn(length, dm, generator=g)
    w_up, w_down = torch.randn(2 * dff, dm, generator=g), torch.randn(dm, dff, generator=g)
    w_q = torch.randn(H * d + 2 * Hk * d, dm, generator=g)
    w_o = torch.randn(dm, H * d, generator=g)
    cpu_parts: dict[str, float] = {}

    def best(name: str, fn, n: int) -> float:
        fn()
        cpu: list[float] = []
        wall = min(_timed(lambda: [fn() for _ in range(n)], 3, cpu)) / n
        cpu_parts[name] = min(cpu) / n
        return wall

    gm = softmax_block.grouped_matmul
    t_qk = best("qk", lambda: gm(q, kT, out=s), 10)
    t_pv = best("pv", lambda: gm(e, v), 10)
    t_exp = best("exp", lambda: torch.exp(e, out=e_out), 10)
    lin = torch.nn.functional.linear

    def layer_linears():
        lin(x, w_q)
        lin(x, w_o)
        lin(lin(x, w_up)[:, :dff], w_down)

    t_lin = best("linear", layer_linears, 2)
    per_block = H * rows * seen
    scores = layers * H * length * length / 2  # causal rows: half of every row-key pair
    lin_per_layer = 2 * length * (dm * (H * d + 2 * Hk * d) + H * d * dm + 3 * dm * dff)
    lin_timed = 2 * length * (dm * (H * d + 2 * Hk * d) + H * d * dm + 2 * dff * dm + dff * dm)
    rate_qk, rate_pv, rate_exp = 2 * d * per_block / t_qk, 2 * d * per_block / t_pv, per_block / t_exp
    rate_lin = lin_timed / t_lin
    parts = {
        "qk": 2 * d * scores / rate_qk,
        "pv": 2 * d * scores / rate_pv,
        "exp": scores / rate_exp,
        "linear": layers * lin_per_layer / rate_lin,
    }
    scale = {"qk": scores / per_block, "pv": scores / per_block, "exp": scores / per_block}
    scale["linear"] = layers * lin_per_layer / lin_timed
    cpu = {k: cpu_parts[k] * scale[k] for k in scale}
    return {
        "variant": "floor",
        "length": length,
        "seconds": sum(parts.values()),
        "cpu_seconds": sum(cpu.values()),
        # the floor as issue 56 words it: the linear layers and half of q.k and p.v, no exp (a lower floor)
        "matmul_seconds": sum(v for k, v in parts.items() if k != "exp"),
        "matmul_cpu_seconds": sum(v for k, v in cpu.items() if k != "exp"),
        "parts": parts,
        "cpu_parts": cpu,
        **_machine_rates(rate_qk, rate_pv, rate_exp, rate_lin),
    }


def decoder_pass_child(model: str, variant: str, length: int, reps: int, layers_kept: int | None) -> dict:
    """One decoder prefill variant at ``length`` tokens (the base model, no cache), timed in this fresh process."""
    import torch

    from core.kinds import DECODER
    from core.mechanics import attention, softmax_block
    from core.mechanics.probes import ProbeSpec, Recorder
    from core.values.choice import Choice

    loaded = _load(model)
    enc = _document(loaded, length)
    ids = torch.as_tensor(enc.input_ids)[None]
    base = loaded.model.base_model
    if layers_kept:
        base.layers = base.layers[:layers_kept]
    if variant == "sdpa":
        attention.set_implementation(loaded.model, "sdpa")
    chosen: list[str] = []
    real = softmax_block.choose_backend

    def counting(x):
        chosen.append(real(x))
        return chosen[-1]

    softmax_block.choose_backend = counting  # which backend served the prefill, said in the table

    def one(x: torch.Tensor) -> None:
        with torch.inference_mode():
            if variant == "sdpa":
                base(input_ids=x, use_cache=False)
                return
            rec = None
            if variant == "probes":
                n = x.shape[1]
                rows = enc.question_tokens if n == ids.shape[1] else (max(0, n - 16), n)
                spec = ProbeSpec(profile_rows=rows, kind=DECODER)
                rec = Recorder(spec, torch.ones_like(x, dtype=torch.bool))
            with attention.attention_call(Choice.of(tau=0.7, targets=(DECODER,)), None, rec):
                base(input_ids=x, use_cache=False)
            if rec is not None:
                rec.finish()

    one(ids[:, :256])  # warm-up: allocator, kernel library, lazy imports
    before = rss_now()
    del chosen[:]
    cpu: list[float] = []
    times = _timed(lambda: one(ids), reps, cpu)
    return {
        "variant": variant,
        "length": int(ids.shape[1]),
        "seconds": min(times),
        "all": times,
        "cpu_seconds": min(cpu),
        "rss_before": before,
        "rss_peak": max_rss(),
        "threads": torch.get_num_threads(),
        "backends": sorted(set(chosen)),
    }


def _machine_rates(rate_qk: float, rate_pv: float, rate_exp: float, rate_lin: float) -> dict:
    """The rates a floor was timed at, the threads and memory of the process: one record for every floor."""
    import torch

    return {
        "rates": {
            "qk_gflops": rate_qk / 1e9,
            "pv_gflops": rate_pv / 1e9,
            "exp_g_per_s": rate_exp / 1e9,
            "linear_gflops": rate_lin / 1e9,
        },
        "threads": torch.get_num_threads(),
        "rss_before": rss_now(),
        "rss_peak": max_rss(),
    }


def floor_child(length: int, reps: int) -> dict:
    """The arithmetic floor of one encoder pass at ``length`` tokens on this machine (see the module doc)."""
    import torch

    from core import models
    from core.mechanics import attention

    loaded = models.load(MODEL, device="cpu")
    cfg = loaded.config
    H, d, layers, dm, dff = cfg.num_heads, cfg.d_kv, cfg.num_layers, cfg.d_model, cfg.d_ff
    rows = max(1, min(length, attention.KERNEL_CHUNK_BYTES // (H * length * 4)))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, H, rows, d, generator=g)
    kT = torch.randn(1, H, length, d, generator=g).transpose(-1, -2)
    v = torch.randn(1, H, length, d, generator=g)
    s = torch.empty(1, H, rows, length)
    e = torch.rand(1, H, rows, length, generator=g) * -20
    e_out = torch.empty_like(e)
    x = torch.randn(length, dm, generator=g)
    w_in, w_out = torch.randn(dff, dm, generator=g), torch.randn(dm, dff, generator=g)

    cpu_parts: dict[str, float] = {}

    def best(name: str, fn, n: int) -> float:
        fn()
        cpu: list[float] = []
        wall = min(_timed(lambda: [fn() for _ in range(n)], 3, cpu)) / n
        cpu_parts[name] = min(cpu) / n
        return wall

    t_qk = best("qk", lambda: torch.matmul(q, kT, out=s), 20)
    t_pv = best("pv", lambda: torch.matmul(e, v), 20)
    t_exp = best("exp", lambda: torch.exp(e, out=e_out), 20)
    t_lin = best("linear", lambda: torch.nn.functional.linear(torch.nn.functional.linear(x, w_in), w_out), 5)
    scores = layers * H * length * length
    per_block = H * rows * length
    rate_qk = 2 * d * per_block / t_qk
    rate_pv = 2 * d * per_block / t_pv
    rate_exp = per_block / t_exp
    rate_lin = 4 * length * dm * dff / t_lin
    # q, k, v, o projections (4 x dm x H d) and the feed-forward (2 x dm x d_ff, gated adds one), per token and layer
    gated = 3 if "gated" in str(getattr(cfg, "feed_forward_proj", "")) else 2
    lin_flops = layers * length * 2 * (4 * dm * H * d + gated * dm * dff)
    parts = {
        "qk": 2 * d * scores / rate_qk,
        "pv": 2 * d * scores / rate_pv,
        "exp": scores / rate_exp,
        "linear": lin_flops / rate_lin,
    }
    # the same sums in CPU seconds: each part's count over its CPU-time rate
    scale = {
        "qk": scores / per_block,
        "pv": scores / per_block,
        "exp": scores / per_block,
        "linear": lin_flops / (4 * length * dm * dff),
    }
    cpu_seconds = sum(cpu_parts[k] * scale[k] for k in scale)
    return {
        "variant": "floor",
        "length": length,
        "seconds": sum(parts.values()),
        "cpu_seconds": cpu_seconds,
        "parts": parts,
        **_machine_rates(rate_qk, rate_pv, rate_exp, rate_lin),
    }


def pass_child(variant: str, length: int, reps: int) -> dict:
    """One encoder pass variant at ``length`` tokens, timed in this (fresh) process."""
    import torch

    from core import models
    from core.mechanics import attention
    from core.mechanics.probes import ProbeSpec, Recorder
    from core.values.choice import Choice

    loaded = models.load(MODEL, device="cpu")
    enc = _document(loaded, length)
    ids = torch.as_tensor(enc.input_ids)[None]
    model = loaded.model
    if variant == "sdpa":
        attention.set_implementation(model, "sdpa")  # every stack (5.17); the lazy bias then hands out a dense tensor
    encoder = model.get_encoder()

    def one(x: torch.Tensor) -> None:
        with torch.inference_mode():
            if variant == "sdpa":
                encoder(input_ids=x)
                return
            rec = None
            if variant == "probes":
                n = x.shape[1]
                rows = enc.question_tokens if n == ids.shape[1] else (max(0, n - 16), n)
                rec = Recorder(ProbeSpec(profile_rows=rows), torch.ones_like(x, dtype=torch.bool))
            with attention.attention_call(Choice.of(tau=0.7), None, rec):
                encoder(input_ids=x)
            if rec is not None:
                rec.finish()

    one(ids[:, :256])  # warm-up: allocator, kernel library, lazy imports
    before = rss_now()
    cpu: list[float] = []
    times = _timed(lambda: one(ids), reps, cpu)
    return {
        "variant": variant,
        "length": length,
        "seconds": min(times),
        "all": times,
        "cpu_seconds": min(cpu),
        "rss_before": before,
        "rss_peak": max_rss(),
        "threads": torch.get_num_threads(),
    }


def dense_bias_bytes(length: int, heads: int = 8) -> int:
    """What transformers' T5 holds for the bias of one pass: float32 ``[H, L, L]`` and about three int64 ``L x L``."""
    return length * length * (4 * heads + 24)


def run_child(
    variant: str,
    length: int,
    reps: int,
    threads: int | None,
    isa: str = "native",
    model: str = MODEL,
    layers: int | None = None,
) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, str(length), str(reps), "--model", model]
    if threads:
        cmd += ["--threads", str(threads)]
    if layers:
        cmd += ["--layers", str(layers)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **ISA_ENV[isa]})
    if p.returncode == 2 and "is not available here" in p.stderr:
        print(p.stderr.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(2)
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1][:160]
        return {"variant": variant, "length": length, "error": f"exit {p.returncode}: {tail}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2048,4096,8192,16384,32768")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--json", type=Path, help="save every number here")
    ap.add_argument(
        "--isa",
        choices=sorted(ISA_ENV),
        default="native",
        help="run as a CPU with only these vector instructions would (avx2: no AVX-512)",
    )
    ap.add_argument("--model", default=MODEL, help=f"{MODEL} (default) or the decoder {DECODER_MODEL}")
    ap.add_argument("--layers", type=int, default=None, help="decoder: keep only the first N layers (peak memory)")
    ap.add_argument("--reps", type=int, default=None, help="timed passes per figure (default: by length)")
    ap.add_argument("--child", nargs=3, metavar=("VARIANT", "L", "REPS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.child:
        variant, n, reps = args.child[0], int(args.child[1]), int(args.child[2])
        if args.model == DECODER_MODEL:
            out = (
                decoder_floor_child(args.model, n, args.layers)
                if variant == "floor"
                else decoder_pass_child(args.model, variant, n, reps, args.layers)
            )
        else:
            out = floor_child(n, reps) if variant == "floor" else pass_child(variant, n, reps)
        print(json.dumps(out))
        return 0

    header = machine(args.isa)
    print(f"machine: {header}", flush=True)
    lengths = [int(x) for x in args.lengths.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    rows = []
    for n in lengths:
        reps = args.reps or (3 if n <= 4096 else 2 if n <= 8192 else 1)
        for v in variants:
            if v == "sdpa" and args.model != DECODER_MODEL and dense_bias_bytes(n) > 0.8 * free:
                r = {
                    "variant": v,
                    "length": n,
                    "error": f"skipped: its dense bias alone needs {dense_bias_bytes(n) / 2**30:.0f} GiB",
                }
            else:
                r = run_child(v, n, reps, args.threads, args.isa, args.model, args.layers)
            rows.append(r)
            print(
                f"  {v:>6} at L={n:>6}: "
                + (r["error"] if "error" in r else f"{r['seconds']:.3f}s, peak {r['rss_peak'] / 2**30:.2f} GiB"),
                file=sys.stderr,
                flush=True,
            )
    threads = next((r["threads"] for r in rows if "threads" in r), "?")
    kept = f" (first {args.layers} layers)" if args.layers else ""
    print(
        f"model {args.model}{kept}; threads {threads}; "
        f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    for r in rows:
        if r.get("variant") == "floor" and "rates" in r:
            rt = r["rates"]
            print(
                f"  rates at L={r['length']}: q.k {rt['qk_gflops']:.0f} GFLOP/s, p.v {rt['pv_gflops']:.0f} GFLOP/s, "
                f"exp {rt['exp_g_per_s']:.2f} G/s, linear {rt['linear_gflops']:.0f} GFLOP/s; parts (s): "
                + ", ".join(f"{k} {v:.1f}" for k, v in r["parts"].items())
            )
        if r.get("variant") == "floor" and "matmul_seconds" in r:
            probed = next((p for p in rows if p.get("variant") == "probes" and p["length"] == r["length"]), None)
            ratio = ""
            if probed is not None and "seconds" in probed:
                ratio = (
                    f"; probes {probed['seconds'] / r['matmul_seconds']:.2f}x it "
                    f"({probed['cpu_seconds'] / r['matmul_cpu_seconds']:.2f}x in cpu s)"
                )
            print(
                f"  floor without the exps at L={r['length']} (matmuls only): {r['matmul_seconds']:.1f} s, "
                f"cpu {r['matmul_cpu_seconds']:.1f} s{ratio}"
            )
        if r.get("backends"):
            print(f"  {r['variant']} at L={r['length']}: attention served by {', '.join(r['backends'])}")
    print(
        f"{'L':>6} {'variant':>7} {'seconds':>9} {'x floor':>8} {'x sdpa':>7} {'peak GiB':>9} {'+GiB':>6}"
        f" {'cpu s':>8} {'cpu x floor':>11}"
    )
    for n in lengths:
        at = {r["variant"]: r for r in rows if r["length"] == n and "error" not in r}
        for r in (r for r in rows if r["length"] == n):
            if "error" in r:
                print(f"{n:>6} {r['variant']:>7}  {r['error']}")
                continue
            fl = f"{r['seconds'] / at['floor']['seconds']:.2f}" if "floor" in at else "-"
            sd = f"{r['seconds'] / at['sdpa']['seconds']:.2f}" if "sdpa" in at else "-"
            grow = (r["rss_peak"] - r["rss_before"]) / 2**30 if r["variant"] != "floor" else 0.0
            peak = f"{r['rss_peak'] / 2**30:.2f}" if r["variant"] != "floor" else "-"
            cs = r.get("cpu_seconds")
            cfl = (
                f"{cs / at['floor']['cpu_seconds']:.2f}"
                if cs is not None and "floor" in at and at["floor"].get("cpu_seconds")
                else "-"
            )
            print(
                f"{n:>6} {r['variant']:>7} {r['seconds']:>9.3f} {fl:>8} {sd:>7} {peak:>9} {grow:>6.2f}"
                f" {'-' if cs is None else f'{cs:.2f}':>8} {cfl:>11}"
            )
    if args.json:
        args.json.write_text(json.dumps({"machine": header, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
