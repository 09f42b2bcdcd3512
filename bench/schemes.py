"""What a position scheme costs a decoder's pass, beside plain RoPE: band schemes reading only their band's keys.

    python bench/schemes.py                                   # a tiny random Llama, 4,096 tokens, L_tr 256
    python bench/schemes.py --model smollm2-135m --tokens 16384 --reps 1 --schemes streaming-llm --every-key no

Each scheme's pass (the perplexity's: no probes, every row scored) is timed ``--reps`` times after a warm-up, and
the band schemes (windowed attention, StreamingLLM, LM-Infinite) also with the band's gather off
(``core.mechanics.attention.BAND_SHARE`` below 0: every block over every key, as before), so the table gives, in
one run, each scheme's time over plain RoPE's and the band's gain. The machine line states the CPU, its vector ISA
and its load before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bounds import machine  # noqa: E402

SCHEMES = ("none", "dynamic-ntk", "window", "streaming-llm", "lm-infinite")
BANDED = ("window", "streaming-llm", "lm-infinite")


def _tiny_llama(folder: Path, train_length: int) -> str:
    """A tiny random Llama (2 layers, 4 query heads over 2 key/value heads, d = 16) with ByT5's tokenizer."""
    import json

    import torch
    import transformers
    from transformers import ByT5Tokenizer

    sys.path.insert(0, str(ROOT / "tests"))
    from support.decoders import tiny_decoder_fields

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        **tiny_decoder_fields(vocab_size=384, max_position_embeddings=train_length, pad_token_id=0, eos_token_id=1)
    )
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(folder)
    ByT5Tokenizer().save_pretrained(folder)
    (folder / "card.json").write_text(json.dumps({"train_length": train_length}))
    return str(folder)


def _time(loaded, ids, scheme: str, reps: int) -> float:
    import torch

    from core.runs import engine, rope_pass
    from core.values.choice import Choice

    choice = engine.choice_for(loaded, Choice.of(scheme=scheme))
    how = engine.Pass(generate=False)
    seconds = []
    for _ in range(reps):
        t0 = time.perf_counter()
        with torch.inference_mode(), rope_pass.scheme_pass(loaded, choice, how, None, ids.shape[1]):
            loaded.model(input_ids=ids)
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a registry name or folder (default: a tiny random Llama)")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument(
        "--train-length", type=int, default=None, help="L_tr (the tiny Llama's: 256; a model's own by default)"
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--schemes", default=",".join(SCHEMES), help="comma list (plain RoPE is always timed)")
    ap.add_argument("--every-key", choices=("yes", "no"), default="yes", help="also time band schemes over every key")
    args = ap.parse_args(argv)
    schemes = [s for s in args.schemes.split(",") if s and s != "none"]

    import torch

    from core.mechanics import attention
    from core.models import load

    before = machine()
    with tempfile.TemporaryDirectory() as tmp:
        where = args.model or _tiny_llama(Path(tmp), args.train_length or 256)
        loaded = load(where, device="cpu", train_length=args.train_length)
        name = f"{args.model or 'a tiny random Llama'} (L_tr {loaded.train_length:,})"
        print(
            f"{name}, {args.tokens:,} tokens, one pass (no probes), median of {args.reps}; torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads\nmachine before: {before}",
            flush=True,
        )
        print(
            "| scheme | s | vs plain | every key (s) | vs plain | band's gain |\n|---|---|---|---|---|---|", flush=True
        )
        ids = torch.randint(
            3, min(384, loaded.model.config.vocab_size), (1, args.tokens), generator=torch.Generator().manual_seed(0)
        )
        _time(loaded, ids[:, : min(512, args.tokens)], "none", 1)  # warm-up: kernels, caches
        share = attention.BAND_SHARE
        rows = []
        base = _time(loaded, ids, "none", args.reps)
        rows.append(("none", base, None))
        _row(*rows[-1], base)
        for scheme in schemes:
            t = _time(loaded, ids, scheme, args.reps)
            full = None
            if scheme in BANDED and args.every_key == "yes":
                attention.BAND_SHARE = -1.0
                try:
                    full = _time(loaded, ids, scheme, args.reps)
                finally:
                    attention.BAND_SHARE = share
            rows.append((scheme, t, full))
            _row(*rows[-1], base)
    print(f"machine after:  {machine()}")
    return 0


def _row(scheme: str, t: float, full: float | None, base: float) -> None:
    """One table row, printed as soon as it is measured (a 16k pass of a real model takes minutes)."""
    if full is None:
        print(f"| {scheme} | {t:.2f} | {t / base:.2f} | | | |", flush=True)
    else:
        print(f"| {scheme} | {t:.2f} | {t / base:.2f} | {full:.2f} | {full / base:.2f} | {full / t:.1f}x |", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
