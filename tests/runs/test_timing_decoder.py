"""A decoder-only LM's time estimate, ``a + b n + c n^2`` (core.runs.timing, issue 56 item 5)."""

from __future__ import annotations

import math

import pytest
import transformers

from core.runs import timing


def test_the_fit_recovers_a_line_and_a_square():
    """Samples made from a known ``a + b n + c n^2`` give back ``a`` and ``b`` (``c`` handed over) and the time at
    a length far past them; a square law from the longest sample would say otherwise."""
    a, b, c = 0.4, 2e-3, 3e-7
    samples = [(n, a + b * n + c * n * n) for n in (512, 1024)]
    got = timing.quadratic_fit(samples, c)
    assert got[0] == pytest.approx(a) and got[1] == pytest.approx(b) and got[2] == c
    want = a + b * 8192 + c * 8192**2
    assert timing.quadratic_estimate(samples, c, 8192) == pytest.approx(want)
    assert samples[-1][1] * 8**2 > 2 * want  # what the square law from 1,024 tokens would have said


def test_noise_never_makes_a_fixed_cost_or_a_tokens_cost_negative():
    """Samples whose line would cross zero (a longer pass timed shorter) fall back to a line through the origin."""
    a, b, _ = timing.quadratic_fit([(512, 2.0), (1024, 1.9)], 0.0)
    assert a == 0.0 and b > 0
    a, b, _ = timing.quadratic_fit([(512, 1.0)], 1e-7)
    assert a == 0.0 and b == pytest.approx((1.0 - 1e-7 * 512**2) / 512)


def test_the_attention_term_is_a_timed_causal_call_of_the_models_shape():
    """``c`` from one causal grouped call of a tiny Llama's shape: positive, finite, and per pair (a call over twice
    the rows takes about four times as long, so c stays within a few times of itself)."""
    cfg = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3
    )
    assert timing.decoder_shape(cfg) == (4, 2, 16, 3)
    c1 = timing.attention_per_pair(cfg, probed=True, tokens=256)
    c2 = timing.attention_per_pair(cfg, probed=False, tokens=512)
    assert math.isfinite(c1) and c1 > 0 and math.isfinite(c2) and c2 > 0
    assert 0.05 < c2 / c1 < 20
