"""A Flan-T5-XL-shaped random T5 on a GPU at 15k (or 32k) tokens, probes on: time and memory.

    python bench/gpu.py                                   # CUDA, bfloat16, 15,000 tokens (needs a GPU)
    python bench/gpu.py --shape tiny --length 2048 --device cpu   # the same code path, on any machine
    python bench/gpu.py --length 32768 --steps no-probes --grid   # + the scrubber's 15-frame grid (issue 49, point 6)
    python bench/gpu.py --shape smollm2-135m --length 32768      # the decoder-only LLM's prefill (issue 56)
    python bench/gpu.py --shape tiny-llama --length 600 --device cpu --steps sdpa,no-probes,probes-full

Why: the app and the CLI promise a GPU path (CUDA + bfloat16, T5 overflows in
float16) that no CI machine has; this is its check. One process builds a
random T5 with Flan-T5-XL's shape (24+24 layers, 32 heads, d_model 2048,
d_ff 5120, ~2.8 B parameters; random weights: no hub here, and the cost of
attention does not depend on the weights' values), tokenises a pass key
document of ``--length`` tokens with the bundled tokenizer, and times, on
the same ids, best of ``--repeats``:

* ``sdpa``:         transformers' own T5 encoder pass (the reference),
* ``no-probes``:    our ``aligned`` attention at tau = 0.7, nothing recorded (``core.runs.apply``'s pass),
* ``probes-stats``: our attention with stats-only probes (batch runs, sweeps),
* ``probes-full``:  every probe of a view, question profile included,
* ``app-run``:      :func:`core.runs.engine.run`, what one tau move in the app costs:
                    tokenise, encoder with every probe, greedy answer;
* ``grid`` (``--grid``): what the app computes when a document is shown, through the code it
                    uses, without Streamlit: the scrubber's grid, 15 passes of
                    :func:`core.runs.engine.run` (tau 1.00, 0.95, ..., 0.30 in
                    :func:`core.views.frames.grid_order`'s order, the Explore page's probes:
                    :data:`GRID_PROBES`, answer included), the L_tr reference pass, and
                    :func:`core.views.frames.payload` of the 15 frames (the bytes the browser gets).
                    Timed once (no repeats: at 32k it is minutes on a CPU); its parts are
                    each pass's seconds, the reference's and the payload's.

``--shape smollm2-135m``: a random Llama with SmolLM2-135M's shape (30 layers, 9 query heads on 3 key/value
heads, head dim 64, d_model 576, d_ff 1536, vocabulary 49,152; random weights for the same reason: the GPU
machine reaches no package index, and the time does not depend on the values), its prefill over the same ids
(the base model, no cache: causal rows, grouped K/V), steps ``sdpa`` (transformers' sdpa attention),
``no-probes``, ``probes-stats`` and ``probes-full`` (tau = 0.7 on the decoder; the profile over the last 16
tokens, where the question sits). ``app-run`` and ``--grid`` are T5's (refused on a decoder shape). On a GPU the
prefill's layers take the Triton kernel (causal rows, grouped K/V), the one with a map ``torch``. ``tiny-llama``:
the same code path anywhere.

Peak memory is the device allocator's high-water mark during each step
(``torch.cuda.max_memory_allocated``; on the CPU the process's peak RSS,
which only grows) and its growth over the weights. The ratios are step time
/ sdpa time, measured in this one run. ``--json PATH`` saves every number.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: T5 configs by name: Flan-T5-XL's published shape, and a tiny one that runs the same code anywhere.
SHAPES = {
    "flan-t5-xl": dict(
        d_model=2048,
        d_kv=64,
        d_ff=5120,
        num_layers=24,
        num_decoder_layers=24,
        num_heads=32,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
    ),
    "tiny": dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=1, num_heads=4),
}
#: Decoder-only shapes (Llama configs): SmolLM2-135M's published shape, and a tiny one for any machine. The
#: vocabulary holds the bundled T5 tokenizer's ids (< 32,128).
DECODER_SHAPES = {
    "smollm2-135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    "tiny-llama": dict(
        vocab_size=32128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=65536,
    ),
}
STEPS = ("sdpa", "no-probes", "probes-stats", "probes-full", "app-run")


def grid_probes(layer: int):
    """What the Explore page's passes record (``ui.cache.explore_probes(layer, None)``, the page's default head
    mean): stats, one pooled 256 x 256 map of ``layer``, the question profile, the answer's cross-attention.
    Written out here so this script needs no Streamlit; tests/bench/test_gpu_grid_step.py checks it is the app's."""
    from core.mechanics.probes import ProbeSpec

    return ProbeSpec(
        heatmap_layer=int(layer),
        heatmap_head=None,
        heatmap_size=256,
        sorted_logits=False,
        cosine_hist_bins=0,
        names=("cross.*.map", "cross.*.profile"),
    )


def grid(loaded, doc, enc) -> dict:
    """The scrubber's grid of ``doc`` as the app builds it (:mod:`ui.prefetch`'s passes, ``ui/scrubber.py``'s
    payload): 15 passes, the L_tr reference, the payload. Returns the parts' seconds and the payload's bytes."""
    from core.mechanics.probes import ProbeSpec
    from core.runs import calibration, engine, methods
    from core.values.choice import Choice
    from core.views import frames

    probes = grid_probes(loaded.n_layers - 1)  # the page's default map: the last layer
    passes: dict[float, object] = {}
    seconds: dict[str, float] = {}
    for tau in frames.grid_order(1.0):
        t = time.perf_counter()
        passes[tau] = engine.run(
            loaded,
            doc,
            Choice.of(tau=tau, method=methods.FIXED, targets=("encoder",)),
            engine.Pass(probes=probes),
            encoded=enc,
        )
        seconds[f"{tau:.2f}"] = round(time.perf_counter() - t, 4)
    t = time.perf_counter()
    ref_doc = calibration.reference_document(loaded, doc)
    ref = engine.run(
        loaded,
        ref_doc,
        Choice.of(tau=1.0, method=methods.AS_TRAINED),
        engine.Pass(generate=False, probes=ProbeSpec(heatmap=False, sorted_logits=True, cosine_hist_bins=0)),
    )
    seconds["reference"] = round(time.perf_counter() - t, 4)
    t = time.perf_counter()
    data = frames.payload(passes[1.0], ref, passes, None, doc.text, frames.ViewSpec(), grid_taus=frames.SCRUB_GRID)
    seconds["payload"] = round(time.perf_counter() - t, 4)
    return {
        "frames": len(passes),
        "passes_s": round(sum(v for k, v in seconds.items() if k[0].isdigit()), 4),
        "payload_bytes": len(data),
        "seconds": seconds,
        "answer_at_1": passes[1.0].answer[:40],
    }


def build_decoder(shape: str, device, dtype):
    """A random Llama of ``shape`` (:data:`DECODER_SHAPES`) on ``device``, its attention ours."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from core.mechanics import attention

    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**DECODER_SHAPES[shape]))
    model = model.to(dtype).eval()
    attention.set_implementation(model, attention.ATTN_NAME)
    if not attention.served_by_us(model):
        raise SystemExit("bench/gpu.py: the model's attention does not run through ours with this transformers")
    return model


def build(shape: str, device, dtype):
    """A random T5 of ``shape`` made directly on ``device`` (no 11 GB float32 copy on the host)."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    from core.mechanics import attention, patches

    cfg = T5Config(
        vocab_size=32128,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = T5ForConditionalGeneration(cfg)
    model = model.to(dtype).eval()
    attention.set_implementation(model, attention.ATTN_NAME)  # every stack: 5.17's own call left them on sdpa
    patches.patch(model)  # as core.models.load does: the bias as one vector per head (sdpa still gets it dense)
    if not attention.served_by_us(model):  # a run whose attention is not ours must not be timed as ours (issue 49)
        raise SystemExit("bench/gpu.py: the model's attention does not run through ours with this transformers")
    return model


def machine(device) -> str:
    """The GPU (when the pass runs on one), then bench/engine.py's description of the host and its load."""
    import torch

    from bench.engine import machine as host

    gpu = f"{torch.cuda.get_device_name(device)}, " if device.type == "cuda" else ""
    return gpu + host()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES) + sorted(DECODER_SHAPES), default="flan-t5-xl")
    ap.add_argument("--length", type=int, default=15_000, help="tokens of the pass key document")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", default=",".join(STEPS), help="comma list of steps ('' for none)")
    ap.add_argument(
        "--grid", action="store_true", help="also build the scrubber's 15-frame grid as the app does (timed once)"
    )
    ap.add_argument("--json", type=Path, help="save every number here")
    a = ap.parse_args(argv)

    import torch

    from core.data import tasks
    from core.errors import ModelLoadError
    from core.mechanics import attention
    from core.mechanics.probes import ProbeSpec, Recorder
    from core.models import Loaded, load, memory, pick_device, resolve
    from core.runs import engine
    from core.values.choice import Choice

    try:
        device, dtype = pick_device(a.device, a.dtype)
    except ModelLoadError as err:
        ap.exit(2, f"error: {err}\n")
    decoder = a.shape in DECODER_SHAPES
    if decoder and (a.grid or "app-run" in a.steps.split(",")):
        ap.exit(2, "error: app-run and --grid are T5's steps; a decoder shape takes sdpa and the probes steps\n")
    print(f"machine: {machine(device)}", flush=True)
    if decoder:
        return decoder_main(a, device, dtype)
    t0 = time.perf_counter()
    model = build(a.shape, device, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    tok = load("retrieval-t5", device="cpu").tokenizer  # any T5 tokenizer: its ids are < 32128
    loaded = Loaded(spec=resolve("flan-t5-xl"), model=model, tokenizer=tok, device=device, dtype=dtype)
    weights = memory.peak_bytes(device)
    print(
        f"built {a.shape}: {loaded.n_params / 1e9:.2f} B parameters, {dtype}, on {device} "
        f"in {time.perf_counter() - t0:.1f}s; weights {weights / 2**30:.2f} GiB; "
        f"max_tokens() says {engine.max_tokens(loaded):,} tokens fit now",
        flush=True,
    )

    doc = tasks.make("passkey", tok, a.length, seed=0)
    enc = engine.encode(loaded, doc)
    ids = torch.as_tensor(enc.input_ids, device=device)[None]
    mask = torch.ones_like(ids, dtype=torch.bool)
    encoder = model.get_encoder()

    def encoder_pass(step: str, x: torch.Tensor, m: torch.Tensor) -> None:
        if step == "sdpa":
            attention.set_implementation(model, "sdpa")
            try:
                encoder(input_ids=x)
            finally:
                attention.set_implementation(
                    model, attention.ATTN_NAME
                )  # every stack: 5.17's own call left them on sdpa
            return
        rec = None
        if step != "no-probes":
            spec = ProbeSpec(profile_rows=enc.question_tokens) if step == "probes-full" else ProbeSpec.stats_only()
            rec = Recorder(spec, m)
        with attention.attention_call(Choice.of(tau=0.7), None, rec):
            encoder(input_ids=x)
        if rec is not None:
            rec.finish()

    def one(step: str) -> tuple[float, int, dict]:
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        sync()
        t = time.perf_counter()
        parts: dict = {}
        with torch.inference_mode():
            if step == "grid":
                parts = grid(loaded, doc, enc)
            elif step == "app-run":
                res = engine.run(loaded, doc, Choice.of(tau=0.7), encoded=enc)
                parts = {k: round(float(v), 4) for k, v in res.seconds.items()}
                parts["answer"] = res.answer[:40]
            else:
                encoder_pass(step, ids, mask)
        sync()
        return time.perf_counter() - t, memory.peak_bytes(device), parts

    steps = [s for s in a.steps.split(",") if s] + (["grid"] if a.grid else [])
    unknown = set(steps) - set(STEPS) - {"grid"}
    if unknown:
        ap.exit(
            2, f"error: unknown step(s) {', '.join(sorted(unknown))}; choose from {', '.join(STEPS)} (and --grid)\n"
        )
    with torch.inference_mode():  # warm-up: kernels, allocator, lazy imports
        for s in steps:
            if s not in ("app-run", "grid"):
                encoder_pass(s, ids[:, :512], mask[:, :512])
        if "grid" in steps and "no-probes" not in steps:
            encoder_pass("no-probes", ids[:, :512], mask[:, :512])
    rows = []
    for s in steps:
        try:
            runs = [one(s) for _ in range(1 if s == "grid" else a.repeats)]
        except torch.OutOfMemoryError as err:
            rows.append({"step": s, "error": f"out of memory: {str(err).splitlines()[0][:120]}"})
            print(f"  {s:>13}: out of memory", flush=True)
            continue
        best = min(runs, key=lambda r: r[0])
        rows.append(
            {
                "step": s,
                "seconds": best[0],
                "all": [r[0] for r in runs],
                "peak": max(r[1] for r in runs),
                "parts": best[2],
            }
        )
        shown = {k: v for k, v in best[2].items() if k != "seconds"} if s == "grid" else best[2]
        print(f"  {s:>13}: {best[0]:.3f}s, peak {rows[-1]['peak'] / 2**30:.2f} GiB {shown or ''}", flush=True)

    base = next((r["seconds"] for r in rows if r["step"] == "sdpa" and "seconds" in r), None)
    print(
        f"\n{a.shape} ({loaded.n_layers} encoder layers x {loaded.n_heads} heads), {enc.n:,} tokens, {dtype}, "
        f"{device}; load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"{'step':>13} {'seconds':>8} {'x sdpa':>7} {'peak GiB':>9} {'+GiB':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['step']:>13}  failed: {r['error']}")
            continue
        ratio = f"{r['seconds'] / base:.2f}" if base else "-"
        print(
            f"{r['step']:>13} {r['seconds']:>8.3f} {ratio:>7} {r['peak'] / 2**30:>9.2f} {(r['peak'] - weights) / 2**30:>6.2f}"
        )
    if a.json:
        a.json.write_text(
            json.dumps(
                {
                    "machine": machine(device),
                    "shape": a.shape,
                    "tokens": enc.n,
                    "dtype": str(dtype),
                    "weights_bytes": weights,
                    "rows": rows,
                },
                indent=1,
            )
        )
    return 0


def decoder_main(a, device, dtype) -> int:
    """The decoder shapes' run: build, then each step's prefill over the same ids, best of ``--repeats``."""
    import torch

    from core.data import tasks
    from core.kinds import DECODER
    from core.mechanics import attention
    from core.mechanics.probes import ProbeSpec, Recorder
    from core.models import load, memory
    from core.values.choice import Choice

    t0 = time.perf_counter()
    model = build_decoder(a.shape, device, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    weights = memory.peak_bytes(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"built {a.shape}: {n_params / 1e6:.0f} M parameters, {dtype}, on {device} in {time.perf_counter() - t0:.1f}s;"
        f" weights {weights / 2**30:.2f} GiB",
        flush=True,
    )
    tok = load("retrieval-t5", device="cpu").tokenizer  # any tokenizer whose ids fit the vocabulary
    doc = tasks.make("passkey", tok, a.length, seed=0)
    ids = torch.as_tensor(tok(doc.text, add_special_tokens=False).input_ids[: a.length], device=device)[None]
    n = ids.shape[1]
    base = model.base_model
    choice = Choice.of(tau=0.7, targets=(DECODER,))

    def prefill(step: str, x: torch.Tensor) -> None:
        if step == "sdpa":
            attention.set_implementation(model, "sdpa")
            try:
                base(input_ids=x, use_cache=False)
            finally:
                attention.set_implementation(model, attention.ATTN_NAME)
            return
        rec = None
        if step != "no-probes":
            m = x.shape[1]
            full = ProbeSpec(profile_rows=(max(0, m - 16), m), kind=DECODER)
            stats = ProbeSpec(heatmap=False, sorted_logits=False, cosine_hist_bins=0, kind=DECODER)
            rec = Recorder(full if step == "probes-full" else stats, torch.ones_like(x, dtype=torch.bool))
        with attention.attention_call(choice, None, rec):
            base(input_ids=x, use_cache=False)
        if rec is not None:
            rec.finish()

    steps = [s for s in a.steps.split(",") if s]
    unknown = set(steps) - set(STEPS) - {"app-run"}
    if unknown:
        raise SystemExit(f"bench/gpu.py: unknown step(s) {', '.join(sorted(unknown))}; choose from {', '.join(STEPS)}")
    with torch.inference_mode():
        for s in steps:
            prefill(s, ids[:, :512])  # warm-up: kernels, allocator, lazy imports
    rows = []
    for s in steps:
        runs = []
        try:
            for _ in range(a.repeats):
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                sync()
                t = time.perf_counter()
                with torch.inference_mode():
                    prefill(s, ids)
                sync()
                runs.append((time.perf_counter() - t, memory.peak_bytes(device)))
        except torch.OutOfMemoryError as err:
            rows.append({"step": s, "error": f"out of memory: {str(err).splitlines()[0][:120]}"})
            print(f"  {s:>13}: out of memory", flush=True)
            continue
        best = min(runs)
        rows.append({"step": s, "seconds": best[0], "all": [r[0] for r in runs], "peak": max(r[1] for r in runs)})
        print(f"  {s:>13}: {best[0]:.3f}s, peak {rows[-1]['peak'] / 2**30:.2f} GiB", flush=True)
    base_s = next((r["seconds"] for r in rows if r["step"] == "sdpa" and "seconds" in r), None)
    print(
        f"\n{a.shape} (random weights, {model.config.num_hidden_layers} layers x {model.config.num_attention_heads} "
        f"heads on {model.config.num_key_value_heads}), {n:,} tokens, {dtype}, {device}; load average after "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"{'step':>13} {'seconds':>8} {'x sdpa':>7} {'peak GiB':>9} {'+GiB':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['step']:>13}  failed: {r['error']}")
            continue
        ratio = f"{r['seconds'] / base_s:.2f}" if base_s else "-"
        print(
            f"{r['step']:>13} {r['seconds']:>8.3f} {ratio:>7} {r['peak'] / 2**30:>9.2f} {(r['peak'] - weights) / 2**30:>6.2f}"
        )
    if a.json:
        a.json.write_text(
            json.dumps(
                {"machine": machine(device), "shape": a.shape, "tokens": n, "dtype": str(dtype), "rows": rows},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
