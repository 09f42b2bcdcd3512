"""A band scheme's blocks read only their band's keys (windowed attention, StreamingLLM, LM-Infinite), and a decoder's
blocks under any mask or distance scheme (ReRoPE too) none after their last row: the same pass as over every key, at
the cost of the keys the rows can see.

Why: over every key, a StreamingLLM pass of a tiny Llama at 4,096 tokens (window 251) took 12x its plain pass, and
LM-Infinite 9.5x; SmolLM2's StreamingLLM cells of issue 57 were out of reach. Each block of rows now computes only
the sinks and the band its rows can see (:attr:`core.mechanics.attention._SchemeOps.columns`,
:func:`core.mechanics.softmax_block._band_block`); every other key has weight 0 in both.

Checked on a tiny random Llama (causal rows, grouped K/V) and on the bundled rotary encoder (rope-mlm: both sides of
the band): the output logits, the answer, Pmax and H per layer and head, the question's profile and the map equal
those of the same pass over every key (the band's gather switched off: ``attention.BAND_SHARE`` below 0), and the
band's blocks were the ones that ran. ``tests/runs/test_decoder_schemes.py`` holds the same schemes, band blocks
included, to a reference written from the papers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from transformers import ByT5Tokenizer

from core.data import tasks
from core.mechanics import attention, softmax_block
from core.mechanics.probes import ProbeSpec
from core.models import load
from core.runs import engine, rope_pass
from core.values.choice import Choice
from core.values.positions import Scheme, band_span
from support.decoders import tiny_decoder_fields

ROOT = Path(__file__).resolve().parents[2]
SCHEMES = ["window:window=40", "streaming-llm:window=40:sinks=4", "lm-infinite:window=40:sinks=5:cap=40"]
#: ReRoPE has no band, but a decoder's causal rows need no key after their last row either.
DECODER_SCHEMES = [*SCHEMES, "rerope:window=40"]
#: Blocks of a few rows, so that a block's band is a small share of the keys.
SMALL_BLOCKS = 512 * 1024


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        **tiny_decoder_fields(vocab_size=384, max_position_embeddings=64, pad_token_id=0, eos_token_id=1)
    )
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(folder)
    ByT5Tokenizer().save_pretrained(folder)
    (folder / "card.json").write_text(json.dumps({"train_length": 64}))
    return load(str(folder), device="cpu")


@pytest.fixture(scope="module")
def rope_mlm():
    return load(str(ROOT / "assets" / "models" / "rope-mlm"), device="cpu")


def _run(loaded, scheme: str, doc, monkeypatch, banded: bool):
    """One probed run (answer, Pmax/H, profile, map) under ``scheme``, with or without the band's gather, and how
    many blocks read only their band."""
    monkeypatch.setattr(attention, "BAND_SHARE", attention.BAND_SHARE if banded else -1.0)
    seen = []
    real = softmax_block._band_block

    def counted(*a, **k):
        seen.append(1)
        return real(*a, **k)

    monkeypatch.setattr(softmax_block, "_band_block", counted)
    how = engine.Pass(probes=ProbeSpec(), chunk_bytes=SMALL_BLOCKS, max_new_tokens=4)
    res = engine.run(loaded, doc, Choice.of(scheme=scheme), how)
    monkeypatch.undo()
    return res, len(seen)


def _same(a, b) -> None:
    assert a.answer == b.answer
    np.testing.assert_allclose(a.probes.pmax, b.probes.pmax, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.probes.entropy, b.probes.entropy, rtol=1e-5, atol=1e-5)
    for name in ("profile", "heatmap_mean", "heatmap_max", "question_map_mean"):
        x, y = getattr(a.probes, name), getattr(b.probes, name)
        assert (x is None) == (y is None), name
        if x is not None:
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("scheme", DECODER_SCHEMES)
def test_a_decoders_band_blocks_equal_every_key(llama, scheme, monkeypatch):
    doc = tasks.make("passkey", llama.tokenizer, 400, depth=0.3, seed=2)
    banded, n_band = _run(llama, scheme, doc, monkeypatch, banded=True)
    full, n_full = _run(llama, scheme, doc, monkeypatch, banded=False)
    assert n_band > 0 and n_full == 0
    _same(banded, full)
    assert banded.probes.profile is not None and banded.probes.heatmap_mean is not None


@pytest.mark.parametrize("scheme", [pytest.param(s, marks=pytest.mark.slow) if "sinks" in s else s for s in SCHEMES])
def test_an_encoders_band_blocks_equal_every_key(rope_mlm, scheme, monkeypatch):
    doc = tasks.make("passkey", rope_mlm.tokenizer, 8 * rope_mlm.train_length, depth=0.6, seed=1)
    banded, n_band = _run(rope_mlm, scheme, doc, monkeypatch, banded=True)
    full, n_full = _run(rope_mlm, scheme, doc, monkeypatch, banded=False)
    assert n_band > 0 and n_full == 0
    _same(banded, full)


@pytest.mark.parametrize("scheme", DECODER_SCHEMES)
def test_the_logits_of_a_prefill_equal_every_key(llama, scheme, monkeypatch):
    ids = torch.randint(3, 384, (1, 300), generator=torch.Generator().manual_seed(4))
    choice = engine.choice_for(llama, Choice.of(scheme=scheme))
    how = engine.Pass(chunk_bytes=SMALL_BLOCKS)

    def logits(share: float) -> torch.Tensor:
        monkeypatch.setattr(attention, "BAND_SHARE", share)
        with torch.no_grad(), rope_pass.scheme_pass(llama, choice, how, None, ids.shape[1]):
            return llama.model(input_ids=ids).logits

    torch.testing.assert_close(logits(attention.BAND_SHARE), logits(-1.0), atol=2e-5, rtol=2e-5)


def test_the_span_holds_every_key_the_mask_lets_through():
    """:func:`band_span` against the mask it stands for: every key outside the span is masked for every row."""
    bound = Scheme.of("streaming-llm:window=7:sinks=3").bind(16, 80)
    for r0, r1 in [(0, 5), (5, 20), (30, 41), (70, 80)]:
        s, lo, hi = band_span(r0, r1, 80, 7, 3)
        mask = bound.mask_rows(r0, r1, 80)
        inside = torch.zeros(80, dtype=torch.bool)
        inside[:s] = True
        inside[lo:hi] = True
        assert not mask[:, ~inside].any(), (r0, r1)
        assert mask[:, inside].any(0).all(), (r0, r1)  # and no key of the span is seen by no row
