"""A Flan-T5-XL-shaped random T5 on a GPU at 15k (or 32k) tokens, probes on: time and memory.

    python bench/gpu.py                                   # CUDA, bfloat16, 15,000 tokens (needs a GPU)
    python bench/gpu.py --shape tiny --length 2048 --device cpu   # the same code path, on any machine
    python bench/gpu.py --length 32768 --steps no-probes --grid   # + the scrubber's 15-frame grid (issue 49, point 6)

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

from core.values.choice import Choice

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
    ap.add_argument("--shape", choices=sorted(SHAPES), default="flan-t5-xl")
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

    try:
        device, dtype = pick_device(a.device, a.dtype)
    except ModelLoadError as err:
        ap.exit(2, f"error: {err}\n")
    print(f"machine: {machine(device)}", flush=True)
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


if __name__ == "__main__":
    sys.exit(main())
