"""Issue 48, point 4: the newer schedules, each against a hand computation (and its source's own code where it runs
here): Qwen's log-n per query position, LongRoPE's attention factor, critical attention scaling (gamma settable),
adaptive temperature from a row's entropy (maths only: it needs the attention's logits)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import adaptive_beta, adaptive_softmax
from core.data import tasks
from core.errors import UserError
from core.runs import methods, temperature
from core.values.schedule import QWEN_LOGN, RowTau, Schedule

# -- Qwen's log-n by query position -------------------------------------------------------------------------------


def test_qwen_rows_by_hand():
    r = RowTau(floor_scale=256, scheme=QWEN_LOGN)
    # row p's query x log_256(p + 1) once p + 1 > 256: rows 0..255 keep 1; row 256 (p + 1 = 257) gets ln 256 / ln 257;
    # row 2,047 (p + 1 = 2,048 = 2^11, 256 = 2^8) gets 8 / 11; row 65,535 gets 8 / 16
    np.testing.assert_allclose(
        r.taus([0, 100, 255, 256, 2047, 65535]), [1, 1, 1, math.log(256) / math.log(257), 8 / 11, 0.5], rtol=1e-12
    )
    # the mean over a 512-token input's rows: 256 ones and rows p = 256..511 at ln 256 / ln(p + 1)
    want = (256 + sum(math.log(256) / math.log(p + 1) for p in range(256, 512))) / 512
    assert r.mean(512) == pytest.approx(want, rel=1e-12)


def test_qwen_rows_are_the_inverse_of_qwens_own_logn_list():
    """Qwen-7B's QWenAttention builds ``logn_list = [math.log(i, seq_length) if i > seq_length else 1 for i in
    range(1, 32768)]`` and multiplies the query at position p by entry p: tau must be its inverse."""
    seq_length = 64
    logn_list = [math.log(i, seq_length) if i > seq_length else 1 for i in range(1, 4096)]
    got = RowTau(floor_scale=seq_length, scheme=QWEN_LOGN).taus(np.arange(len(logn_list)))
    np.testing.assert_allclose(got, 1 / np.array(logn_list), rtol=1e-12)


def test_qwen_rows_travel_as_a_schedule():
    s = Schedule.of({"scheme": QWEN_LOGN, "floor_scale": 256})
    assert s.rows == RowTau(256, scheme=QWEN_LOGN) and s.to_json() == {"scheme": QWEN_LOGN, "floor_scale": 256}
    assert s != Schedule.of(RowTau(256)) and s.key() != Schedule.of(RowTau(256)).key()  # not Llama 4's
    assert s.row_taus(0, 256) is None  # nothing to divide before L_tr
    np.testing.assert_allclose(s.row_taus(2040, 8), [math.log(256) / math.log(p + 1) for p in range(2040, 2048)])
    assert "Qwen log-n" in s.describe(2048)
    with pytest.raises(ValueError, match="no attn_scale"):
        RowTau(256, attn_scale=0.3, scheme=QWEN_LOGN)
    with pytest.raises(ValueError, match="log base"):
        RowTau(1, scheme=QWEN_LOGN)
    with pytest.raises(ValueError, match="known ones"):
        RowTau(256, scheme="qwen")


@pytest.fixture(scope="module")
def doc(tiny):
    return tasks.make("passkey", tiny.tokenizer, 600, depth=0.5, seed=1)


def test_qwen_rows_resolve_through_the_registry(tiny, doc):
    name = next(
        n
        for n, m in methods.REGISTRY.items()
        if m.resolve is not None and m.per == "row" and methods.resolve(tiny, doc, n)[0].rows.scheme == QWEN_LOGN
    )
    tau, info = methods.resolve(tiny, doc, name)
    n = info["length"]
    assert tau == Schedule.of(RowTau(tiny.train_length, scheme=QWEN_LOGN))
    lt = tiny.train_length
    want = (lt + sum(math.log(lt) / math.log(p + 1) for p in range(lt, n))) / n
    assert info["mean_tau"] == pytest.approx(want, rel=1e-9) and info["mean_tau"] < 1


# -- LongRoPE -----------------------------------------------------------------------------------------------------


def test_longrope_by_hand_and_equal_to_log_length():
    # 8x L_tr = 256: logits x (1 + ln 8 / ln 256) = 1 + 3/8 = 11/8, tau = 8/11
    assert temperature.longrope(256, 2048) == pytest.approx(8 / 11, rel=1e-12)
    assert temperature.longrope(256, 2048, factor=32) == pytest.approx(1 / (1 + 5 / 8), rel=1e-12)  # a fixed s = 32
    assert temperature.longrope(256, 200) == 1.0 and temperature.longrope(256, 256) == 1.0
    name = next(
        n
        for n in methods.FORMULAS
        if methods.get(n).same_as == "log-length"
        and methods.formula(n, 256, 2048, 32) == temperature.longrope(256, 2048)
        and n != "log-n"
    )
    for n in (100, 256, 257, 1000, 4096, 100_000):
        assert methods.formula(name, 256, n, 32) == pytest.approx(methods.formula("log-length", 256, n, 32), rel=1e-12)


def test_longrope_is_transformers_own_attention_factor():
    """transformers' longrope init (Phi-3) scales cos and sin by its attention_factor, so the logits by its square:
    tau must be 1 / attention_factor^2 for its factor max_position_embeddings / original_max_position_embeddings."""
    pytest.importorskip("transformers")
    from transformers import Phi3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for mult in (2, 8, 32):
        cfg = Phi3Config(
            hidden_size=32,
            num_attention_heads=2,
            max_position_embeddings=256 * mult,
            original_max_position_embeddings=256,
            rope_scaling={
                "rope_type": "longrope",
                "long_factor": [1.0] * 8,
                "short_factor": [1.0] * 8,
                "original_max_position_embeddings": 256,
            },
        )
        _, factor = ROPE_INIT_FUNCTIONS["longrope"](cfg, "cpu")
        assert temperature.longrope(256, 256 * mult) == pytest.approx(1 / factor**2, rel=1e-9)


# -- critical attention scaling -------------------------------------------------------------------------------------


def test_critical_by_hand():
    # tau = 1 / (gamma ln L): gamma 0.2 at 2,048 tokens: 1 / (0.2 x 7.62462) = 0.65577
    assert temperature.critical(2048, 0.2) == pytest.approx(1 / (0.2 * 11 * math.log(2)), rel=1e-12)
    assert temperature.critical(2048, 0.2) == pytest.approx(0.65577, abs=1e-5)
    # the default gamma = 1 / ln L_tr: tau = 1 at L_tr, log-length above it, softer below (ln 256 / ln 128 = 8/7)
    g = temperature.critical_gamma(256)
    assert g == pytest.approx(1 / (8 * math.log(2)))
    assert temperature.critical(256, g) == pytest.approx(1.0)
    assert temperature.critical(2048, g) == pytest.approx(8 / 11)
    assert temperature.critical(128, g) == pytest.approx(8 / 7)
    for bad in (0.0, -1.0, math.nan, 1e6):
        with pytest.raises(ValueError, match="gamma"):
            temperature.critical(2048, bad)
    with pytest.raises(ValueError, match="at least 2"):
        temperature.critical(1, 0.2)


def test_critical_gamma_is_settable_through_the_registry(tiny, doc):
    name = next(n for n, m in methods.REGISTRY.items() if m.param is not None)
    p = methods.get(name).param
    assert p.name == "gamma"
    assert methods.formula(name, 256, 2048, 32) == pytest.approx(8 / 11)
    assert methods.formula(name, 256, 2048, 32, params={"gamma": 0.2}) == pytest.approx(0.65577, abs=1e-5)
    with pytest.raises(UserError, match="gamma must be"):
        methods.formula(name, 256, 2048, 32, params={"gamma": -1})
    tau, info = methods.resolve(tiny, doc, name, params={"gamma": 0.25})
    assert float(tau) == pytest.approx(1 / (0.25 * math.log(info["length"]))) and info["gamma"] == 0.25
    tau, info = methods.resolve(tiny, doc, name)
    assert info["gamma"] == pytest.approx(1 / math.log(tiny.train_length))
    with pytest.raises(UserError, match="takes no gamma"):
        methods.resolve(tiny, doc, "yarn", params={"gamma": 0.2})
    with pytest.raises(UserError, match="takes no beta"):
        methods.resolve(tiny, doc, name, params={"beta": 0.2})


def test_every_closed_form_answers_the_four_argument_call():
    """Other modules call an entry's formula as (L_tr, L, d_kv, stats) (bench/results.py's InfoScale lookup): a form
    with a parameter must take its default there."""
    for name in methods.FORMULAS:
        m = methods.get(name)
        if not m.stats:
            assert m.formula(256, 2048, 32, None) == pytest.approx(methods.formula(name, 256, 2048, 32)), name
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import bench.results as br

    assert methods.get(br.infoscale_method()).formula(256, 2048, 32, None) == temperature.infoscale(256, 2048, 32)


# -- adaptive temperature -------------------------------------------------------------------------------------------


def _poly(h: float) -> float:
    return -0.037 * h**4 + 0.481 * h**3 - 2.3 * h**2 + 4.917 * h - 1.791


def test_adaptive_beta_by_hand():
    # H = ln 8 = 2.0794: beta = poly(H), above 1; H = 0.4: below the 0.5 threshold, 1; H = 0.6: poly 0.43 -> 1
    h8 = math.log(8)
    assert _poly(h8) > 1
    np.testing.assert_allclose(adaptive_beta([h8, 0.4, 0.6]), [_poly(h8), 1.0, 1.0], rtol=1e-12)
    assert _poly(0.6) < 1


def test_adaptive_softmax_by_hand():
    z = [0.0, 1.0, 2.0, 3.0]
    e = [math.exp(x) for x in z]
    p = [x / sum(e) for x in e]
    h = -sum(q * math.log(q + 1e-9) for q in p)
    beta = max(_poly(h), 1.0) if h > 0.5 else 1.0
    e2 = [math.exp(beta * x) for x in z]
    want = [x / sum(e2) for x in e2]
    got = adaptive_softmax([z])[0]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert beta > 1 and got[3] > p[3]  # it sharpened the row
    one_hot = adaptive_softmax([[0.0, 30.0, 0.0]])[0]  # entropy ~0: left alone
    np.testing.assert_allclose(one_hot, np.exp([0, 30, 0]) / np.exp([0, 30, 0]).sum())


def test_the_new_entries_are_in_the_registry_and_library_docs():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "library.md").read_text(encoding="utf-8")
    labels = {m.label for m in methods.REGISTRY.values()}
    assert {
        "log-n (Qwen) per query position",
        "LongRoPE attention factor",
        "critical attention scaling, gamma log n",
    } <= labels
    for name in methods.NAMES:
        assert f"`{name}`" in text, name
