"""An encoder's (T5's) time estimate, ``a + b n + c n^2``, the recorded-pass extrapolation and a time left that
never rises (core.runs.timing, issue 59 point 8)."""

from __future__ import annotations

import math
import os

import pytest

from core.data import tasks
from core.runs import engine, timing


def test_the_fit_recovers_known_a_b_c_from_synthetic_timings():
    """Passes timed at the encoder's sample lengths from a known ``a + b n + c n^2``, ``c`` handed over as the
    attention call gives it: ``a``, ``b`` come back, and the time at 16k with them; the square law from the
    longest sample (what the estimate was) says far more."""
    a, b, c = 0.05, 1.6e-4, 2.3e-7  # about the default T5's figures here: a quarter of its 2k pass is linear
    samples = [(n, a + b * n + c * n * n) for n in timing.ENCODER_SAMPLES]
    got = timing.quadratic_fit(samples, c)
    assert got == pytest.approx((a, b, c))
    want = a + b * 16384 + c * 16384**2
    assert timing.quadratic_estimate(samples, c, 16384) == pytest.approx(want)
    assert samples[-1][1] * 8**2 > 1.1 * want  # the square law from 2,048 tokens


def test_recorded_passes_extrapolate_a_line_and_a_square_past_the_longest():
    """Recorded passes at 8x and 16x of ``b n + c n^2`` give the time at 32x and 64x exactly; a power law read
    off the two (what the estimate was) said less, as the linear share shrinks with the length."""
    key = ("synthetic-encoder", "cpu", "float32")
    b, c = 1.6e-4, 2.3e-7
    timing.clear(key)
    try:
        for n in (2048, 4096):
            timing.record(key, n, b * n + c * n * n)
        for n in (8192, 16384):
            assert timing.estimate(key, n) == pytest.approx(b * n + c * n * n)
        k = math.log(timing.estimate(key, 4096) / timing.estimate(key, 2048)) / math.log(2)
        assert timing.estimate(key, 2048) * 4**k < 0.97 * (b * 8192 + c * 8192**2)
        # noise that makes the longer pass look linear or quadratic keeps both terms at 0 or above
        timing.clear(key)
        timing.record(key, 2048, 1.0)
        timing.record(key, 4096, 1.5)  # less than linear: the line through the longest
        assert timing.estimate(key, 8192) == pytest.approx(3.0)
        timing.clear(key)
        timing.record(key, 2048, 1.0)
        timing.record(key, 4096, 5.0)  # more than square: the square law from the longest
        assert timing.estimate(key, 8192) == pytest.approx(20.0)
    finally:
        timing.clear(key)


def test_the_time_left_never_rises_and_says_when_it_runs_over():
    """Calibrate's bar: its first steps free (passes already made: 18 % at 0.1 s), then real passes. The rate
    alone said "under 1 s left", then "about 19 s left"; the countdown starts from the plan and only falls."""
    plan = 37.0
    steps = [(0.0, 0.0), (0.18, 0.1), (0.41, 12.0), (0.5, 20.0), (0.9, 33.0), (0.95, 45.0), (0.97, 60.0)]
    rate_only = [timing.remaining(t, f) for f, t in steps[1:3]]
    assert rate_only[0] < 1 < 10 < rate_only[1]  # the jump the issue saw
    clock = timing.Countdown(plan)
    lefts = [clock.left(f, t) for f, t in steps]
    assert all(x is not None for x in lefts)
    assert all(later <= earlier for earlier, later in zip(lefts, lefts[1:])), lefts
    assert lefts[1] > 20  # at 18 % the plan's remainder, not the free steps' rate
    assert lefts[-1] == 0.0
    late = timing.Countdown(10.0)
    late.left(0.2, 2.0)
    assert "taking longer than estimated (30 s so far)" in late.text("Algorithm 1", 0.6, 30.0)
    assert timing.Countdown(None).text("x", 0.0, 0.0) == "x 0%"  # nothing to go on: no time left said
    assert timing.Countdown(None).text("x", 0.5, 4.0) == "x 50% · about 4 s left"
    assert timing.Countdown(plan).text("x", 1.0, 40.0) == "x 100%"


def test_an_encoders_attention_term_is_a_timed_all_pairs_call_of_its_shape(tiny):
    """``c`` from one T5-shaped call (``d_kv`` head dim, the encoder's layers, a relative bias): positive, finite,
    and per pair (twice the rows take about four times as long)."""
    assert timing.encoder_shape(tiny.config) == (4, 4, 16, 2)
    c1 = timing.attention_per_pair(tiny.config, probed=True, tokens=256, causal=False)
    c2 = timing.attention_per_pair(tiny.config, probed=False, tokens=512, causal=False)
    assert math.isfinite(c1) and c1 > 0 and math.isfinite(c2) and c2 > 0
    assert 0.05 < c2 / c1 < 20


@pytest.mark.slow
def test_the_estimate_at_four_times_the_sample_beats_the_square_law(tiny):
    """A tiny T5's pass at 4x the longest short sample (8,192 tokens), estimated then timed: within a factor of 2,
    and nearer than the square law it replaced (the 2,048-token sample's time x 16). The 30 % the issue asks is
    met on the bundled model at 16x-64x (bench/estimates.py); on this tiny model fixed costs weigh more (1.5x in a
    quiet fresh-clone CI run). On a shared machine one pair may meet a burst of other work, so a second is tried."""
    n = 4 * timing.ENCODER_SAMPLES[-1]
    doc = tasks.make("passkey", tiny.tokenizer, n, seed=3)
    enc = engine.encode(tiny, doc)
    assert enc.n >= n
    sample = tasks.make("passkey", tiny.tokenizer, timing.ENCODER_SAMPLES[-1], seed=3)
    how = engine.Pass(generate=False)
    engine.run(tiny, sample, how=how)  # untimed: what a process pays once
    ok = False
    for _ in range(2):
        est = engine.estimate_pass(tiny, doc, enc)
        measured = engine.run(tiny, doc, how=how, encoded=enc).seconds["encode"]
        square = engine.run(tiny, sample, how=how).seconds["encode"] * (enc.n / timing.ENCODER_SAMPLES[-1]) ** 2
        ok = 0.5 <= est / measured <= 2.0 and abs(math.log(est / measured)) < abs(math.log(square / measured))
        if ok:
            break
    assert ok, f"estimate {est:.2f} s, square law {square:.2f} s, measured {measured:.2f} s (load {os.getloadavg()})"


def test_a_fitted_law_answers_past_the_passes_recorded_so_far():
    """Only 256-token passes recorded (a person at 1x who asks for 32x): their square overshoots a pass that is
    mostly linear there; once ``estimate_pass`` has fitted ``a + b n + c n^2`` for the model, that law answers
    past the longest recorded pass, and the recorded lengths still answer for themselves."""
    key = ("synthetic-law", "cpu", "float32")
    a, b, c = 0.01, 8e-5, 1.3e-7
    timing.clear(key)
    try:
        timing.record(key, 256, a + b * 256 + c * 256**2)
        square = timing.estimate(key, 8192)
        truth = a + b * 8192 + c * 8192**2
        assert square > 2 * truth  # the square of a short pass's mostly fixed and linear time
        timing.remember_law(key, a, b, c)
        assert timing.estimate(key, 8192) == pytest.approx(truth)
        assert timing.estimate(key, 256) == pytest.approx(a + b * 256 + c * 256**2)
        timing.clear(key)
        assert timing.law(key) is None
    finally:
        timing.clear(key)


@pytest.mark.slow
def test_estimate_pass_leaves_its_law_for_the_pages(tiny):
    """After ``estimate_pass`` on a long document, the pages' estimate at that length is the same law's."""
    key = timing.model_key(tiny)
    timing.clear(key)
    doc = tasks.make("passkey", tiny.tokenizer, 3000, seed=4)
    enc = engine.encode(tiny, doc)
    est = engine.estimate_pass(tiny, doc, enc)
    assert timing.law(key) is not None
    assert timing.estimate(key, enc.n) == pytest.approx(est)
