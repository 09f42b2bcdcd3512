"""core.values.positions: every position scheme against a hand computation on a tiny case.

Frequencies are checked twice, against the closed formula written here and
against transformers' own rope functions called on a config written here;
masks and distances against matrices drawn out by hand; the block-of-rows
functions against the rows of the whole matrix; the rotation and the
rectified logits against transformers' ``apply_rotary_pos_emb`` and a loop
over (i, j); and the way a scheme reaches a model against a model built from
the scheme's config, and, through a small attention function written here
(the hook the real one will get), against plain RoPE and an explicit mask.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AttentionInterface, ModernBertConfig, ModernBertForMaskedLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.modernbert.modeling_modernbert import ModernBertRotaryEmbedding, apply_rotary_pos_emb

from core.errors import UserError
from core.mechanics import patches
from core.values import positions as P

FULL = "full_attention"
#: (d, rope_theta, L_tr, L): head sizes, bases and length ratios (s = 4, 64, 2.34, 7.19)
CASES = [(16, 10_000.0, 64, 256), (32, 160_000.0, 64, 4096), (64, 10_000.0, 128, 300), (8, 500.0, 16, 115)]


def config(d: int, theta: float, heads: int = 2, layers: int = 1, max_pos: int = 64) -> ModernBertConfig:
    """A ModernBERT config with global attention everywhere and head size ``d``."""
    return ModernBertConfig(
        vocab_size=64,
        hidden_size=d * heads,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        global_attn_every_n_layers=1,
        max_position_embeddings=max_pos,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        attention_dropout=0.0,
        embedding_dropout=0.0,
        mlp_dropout=0.0,
        rope_parameters={
            FULL: {"rope_type": "default", "rope_theta": theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    )


def plain(theta: float, d: int) -> np.ndarray:
    """theta^(-2i/d) in float64: the hand formula every scheme is compared with."""
    return theta ** (-2.0 * np.arange(d // 2) / d)


def tf(kind: str, cfg: ModernBertConfig, seq_len: int | None = None, **params) -> tuple[np.ndarray, float]:
    """transformers' rope function ``kind`` on a copy of ``cfg`` whose full-attention parameters are ``params``."""
    import copy

    c = copy.deepcopy(cfg)
    c.rope_parameters[FULL] = {"rope_theta": cfg.rope_parameters[FULL]["rope_theta"], "rope_type": kind, **params}
    inv, a = ROPE_INIT_FUNCTIONS[kind](c, None, seq_len=seq_len, layer_type=FULL)
    return inv.double().numpy(), float(a)


def freqs(name: str, d: int, theta: float, lt: int, n: int, **values) -> tuple[np.ndarray, float]:
    inv, a = P.get(name).bind(lt, n, **values).frequencies(config(d, theta), FULL)
    return inv.double().numpy(), a


#: which test covers each registry entry (a new entry without its test fails test_every_scheme_is_tested)
TESTED = {
    "none": "test_plain_rope_is_the_model_s_own",
    "pi": "test_pi_divides_the_angles",
    "ntk": "test_ntk_base_by_hand",
    "dynamic-ntk": "test_dynamic_ntk_by_hand_and_its_stale_cache_in_transformers",
    "yarn-rope": "test_yarn_frequencies_by_hand",
    "rerope": "test_rerope_distances_drawn_out",
    "window": "test_window_mask_drawn_out",
    "streaming-llm": "test_streaming_llm_drawn_out",
    "lm-infinite": "test_lm_infinite_drawn_out",
    "alibi": "test_unavailable_schemes_say_why",
    "pose": "test_unavailable_schemes_say_why",
}


def test_every_scheme_is_tested_and_complete():
    assert set(TESTED) == set(P.NAMES)
    for name in set(TESTED.values()):
        assert name in globals(), name
    assert P.PLAIN == "none" and P.NAMES[0] == P.PLAIN
    for s in P.REGISTRY.values():
        assert s.label and s.short and s.help and s.source, s.name
        assert set(s.changes) <= {P.FREQUENCIES, P.DISTANCES, P.MASK}
        assert (s.rope is not None) == (P.FREQUENCIES in s.changes), s.name
        assert (s.mask is not None) == (P.MASK in s.changes), s.name
        assert (s.distances is not None) == (P.DISTANCES in s.changes), s.name
        assert set(s.defaults(64)) <= set(s.params), s.name
    with pytest.raises(UserError, match="Unknown position scheme 'nope'"):
        P.get("nope")
    with pytest.raises(UserError, match="takes window; not factor"):
        P.get("window").bind(64, 128, factor=2.0)
    for bad in ({"window": -1}, {"window": 1.5}):
        with pytest.raises(UserError, match="whole number"):
            P.get("window").bind(64, 128, **bad)
    with pytest.raises(UserError, match="factor must be"):
        P.get("pi").bind(64, 128, factor=0.5)


def test_unavailable_schemes_say_why():
    assert set({n: s.reason for n, s in P.REGISTRY.items() if not s.available}) == {"alibi", "pose"}
    assert set(P.AVAILABLE) == set(P.NAMES) - {"alibi", "pose"}
    for name, why in {n: s.reason for n, s in P.REGISTRY.items() if not s.available}.items():
        assert "train" in why, name  # each needs its own training, and says so
        with pytest.raises(UserError, match=f"'{name}' is not available: .*train"):
            P.get(name).bind(64, 128)


def test_the_rope_types_are_keys_of_transformers_table():
    """Our rope_type names are data in transformers' vocabulary: each must be the key of the function it means
    (a rename in transformers fails here, not deep in a pass)."""
    from transformers import modeling_rope_utils as rope_utils

    table = rope_utils.ROPE_INIT_FUNCTIONS
    assert table[P.LINEAR_ROPE] is rope_utils._compute_linear_scaling_rope_parameters
    assert table[P.DYNAMIC_ROPE] is rope_utils._compute_dynamic_ntk_parameters
    assert table[P.YARN_ROPE] is rope_utils._compute_yarn_parameters


@pytest.mark.parametrize("d,theta,lt,n", CASES)
def test_plain_rope_is_the_model_s_own(d, theta, lt, n):
    cfg = config(d, theta)
    inv, a = freqs("none", d, theta, lt, n)
    np.testing.assert_allclose(inv, plain(theta, d), rtol=1e-6)
    assert a == 1.0
    model_inv, _ = ModernBertRotaryEmbedding.compute_default_rope_parameters(cfg, layer_type=FULL)
    np.testing.assert_array_equal(P.default_inv_freq(theta, d).numpy(), model_inv.numpy())


@pytest.mark.parametrize("d,theta,lt,n", CASES)
def test_pi_divides_the_angles(d, theta, lt, n):
    """PI: angles divided by s = L / L_tr (the paper's code multiplies them: this test fails on that bug)."""
    s = n / lt
    inv, a = freqs("pi", d, theta, lt, n)
    np.testing.assert_allclose(inv, plain(theta, d) / s, rtol=1e-6)
    np.testing.assert_allclose(inv, tf("linear", config(d, theta), factor=s)[0], rtol=1e-7)
    assert a == 1.0
    # the last position's angles stay inside what training saw (position L_tr); multiplying would give s^2 more
    assert np.all((n - 1) * inv < lt * plain(theta, d))
    assert not np.allclose(inv, plain(theta, d) * s)
    # a given factor is used as is (the paper's PI was fine-tuned at t = 4), and at L <= L_tr nothing changes
    np.testing.assert_allclose(freqs("pi", d, theta, lt, n, factor=4.0)[0], plain(theta, d) / 4, rtol=1e-6)
    np.testing.assert_allclose(freqs("pi", d, theta, lt, lt)[0], plain(theta, d), rtol=1e-6)


@pytest.mark.parametrize("d,theta,lt,n", CASES)
def test_ntk_base_by_hand(d, theta, lt, n):
    """NTK-aware: theta' = theta s^(d/(d-2)); its lowest frequency is the plain one divided by exactly s, its
    highest unchanged; the same numbers as transformers' dynamic formula with factor 1 at L = s L_tr."""
    s = n / lt
    inv, a = freqs("ntk", d, theta, lt, n)
    by_hand = plain(theta * s ** (d / (d - 2)), d)
    np.testing.assert_allclose(inv, by_hand, rtol=1e-6)
    assert inv[0] == 1.0 and inv[-1] == pytest.approx(plain(theta, d)[-1] / s, rel=1e-5)
    np.testing.assert_allclose(inv, tf("dynamic", config(d, theta, max_pos=lt), seq_len=n, factor=1.0)[0], rtol=1e-5)
    assert a == 1.0
    np.testing.assert_allclose(freqs("ntk", d, theta, lt, lt // 2)[0], plain(theta, d), rtol=1e-6)


@pytest.mark.parametrize("d,theta,lt,n", CASES)
@pytest.mark.parametrize("f", [1.0, 2.0])
def test_dynamic_ntk_by_hand_and_its_stale_cache_in_transformers(d, theta, lt, n, f):
    """dynamic NTK: theta' = theta (f L / L_tr - (f - 1))^(d/(d-2)) at the input's L; f = 1 is NTK fitted."""
    inv, a = freqs("dynamic-ntk", d, theta, lt, n, factor=f)
    np.testing.assert_allclose(inv, plain(theta * (f * n / lt - (f - 1)) ** (d / (d - 2)), d), rtol=1e-5)
    np.testing.assert_allclose(inv, tf("dynamic", config(d, theta, max_pos=lt), seq_len=n, factor=f)[0], rtol=1e-6)
    assert a == 1.0
    if f == 1.0:  # same_as: the registry says so, and it holds
        assert P.get("dynamic-ntk").same_as == "ntk"
        np.testing.assert_allclose(inv, freqs("ntk", d, theta, lt, n)[0], rtol=1e-5)


def test_transformers_dynamic_rotary_keeps_the_longest_length_seen():
    """Why a pass computes its scheme's frequencies (rotate_per_call) instead of leaving transformers' dynamic update on:
    after a long input, a shorter one (still past L_tr) keeps the long input's frequencies."""
    lt, d, theta = 16, 8, 500.0
    cfg = P.configured(config(d, theta, max_pos=lt), P.get("dynamic-ntk").bind(lt, 128))
    rot = ModernBertRotaryEmbedding(cfg)
    x = torch.zeros(1, 1, d)
    rot(x, torch.arange(128)[None], FULL)
    rot(x, torch.arange(32)[None], FULL)
    stale = getattr(rot, f"{FULL}_inv_freq").double().numpy()
    np.testing.assert_allclose(stale, freqs("dynamic-ntk", d, theta, lt, 128)[0], rtol=1e-6)
    assert not np.allclose(stale, freqs("dynamic-ntk", d, theta, lt, 32)[0], rtol=1e-3)


def yarn_by_hand(theta: float, d: int, lt: int, s: float, fast: float = 32, slow: float = 1) -> np.ndarray:
    """YaRN's NTK-by-parts as its reference code computes it (Peng et al., github.com/jquesnelle/yarn): the
    dimension where a frequency turns ``r`` times over L_tr, ``d ln(L_tr / (2 pi r)) / (2 ln theta)``, floored
    (r = beta_fast) and ceiled (r = beta_slow); a linear ramp over dimension indices between them: 0 keeps the
    frequency (extrapolation), 1 divides it by s (interpolation)."""

    def dim_of(r):
        return d * math.log(lt / (r * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(math.floor(dim_of(fast)), 0), min(math.ceil(dim_of(slow)), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
    return plain(theta, d) * (1 - ramp) + plain(theta, d) / s * ramp


@pytest.mark.parametrize("d,theta,lt,n", CASES)
def test_yarn_frequencies_by_hand(d, theta, lt, n):
    s = n / lt
    inv, a = freqs("yarn-rope", d, theta, lt, n)
    np.testing.assert_allclose(inv, yarn_by_hand(theta, d, lt, s), rtol=1e-5)
    t_inv, t_a = tf("yarn", config(d, theta), factor=s, original_max_position_embeddings=lt)
    np.testing.assert_allclose(inv, t_inv, rtol=1e-7)
    assert a == pytest.approx(0.1 * math.log(s) + 1) == t_a
    # the highest frequency is extrapolated (kept), the lowest interpolated (divided by s)
    assert inv[0] == pytest.approx(1.0) and inv[-1] == pytest.approx(plain(theta, d)[-1] / s, rel=1e-5)
    # the factor apart from the frequencies (to combine with a temperature method without counting it twice)
    inv1, a1 = freqs("yarn-rope", d, theta, lt, n, attention_factor=1.0)
    np.testing.assert_allclose(inv1, inv)
    assert a1 == 1.0
    inv_short, a_short = freqs("yarn-rope", d, theta, lt, lt)
    np.testing.assert_allclose(inv_short, plain(theta, d), rtol=1e-6)
    assert a_short == 1.0


def test_window_mask_drawn_out():
    want = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1]], bool)
    b = P.get("window").bind(64, 5, window=1)
    np.testing.assert_array_equal(b.mask(5, 5).numpy(), want)
    assert b.capped_positions(0, 5, 5) is None and not b.rectified
    assert P.get("window").bind(64, 5).window == 63  # every distance training saw, none other


def test_streaming_llm_drawn_out():
    b = P.get("streaming-llm").bind(64, 7, window=1, sinks=2)
    want = np.array(
        [
            [1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 1, 0, 0],
            [1, 1, 0, 1, 1, 1, 0],
            [1, 1, 0, 0, 1, 1, 1],
            [1, 1, 0, 0, 0, 1, 1],
        ],
        bool,
    )
    np.testing.assert_array_equal(b.mask(7, 7).numpy(), want)
    # positions in the cache [sinks][i - 1 .. i + 1]: sink j beyond the band sits at distance w + k - j = 3 - j
    dist = b.capped_positions(0, 7, 7).numpy()
    assert dist[6, 0] == 3 and dist[6, 1] == 2 and dist[3, 0] == 3 and dist[3, 1] == 2
    assert dist[2, 1] == 1  # within the band: the true distance
    assert dist[2, 0] == 2  # beyond the band, but the band [1, 3] still overlaps the sinks: cache = text here
    np.testing.assert_array_equal(
        dist[want & (np.arange(7)[None] >= 2)],
        (np.arange(7)[:, None] - np.arange(7)[None])[want & (np.arange(7)[None] >= 2)],
    )
    d = P.get("streaming-llm").bind(64, 4096)
    assert (d.sinks, d.window) == (4, 59)  # the largest cache distance, w + k, is L_tr - 1
    assert int(d.capped_positions(4000, 4001, 4096).abs().max()) > 63  # masked keys keep their true distance...
    allowed = d.mask_rows(4000, 4001, 4096)
    assert int(d.capped_positions(4000, 4001, 4096)[allowed].abs().max()) == 63  # ...no key it sees is further


def test_lm_infinite_drawn_out():
    b = P.get("lm-infinite").bind(64, 6, window=1, sinks=1, cap=2)
    want = np.array(
        [
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 0, 1, 1, 1, 0],
            [1, 0, 0, 1, 1, 1],
            [1, 0, 0, 0, 1, 1],
        ],
        bool,
    )
    np.testing.assert_array_equal(b.mask(6, 6).numpy(), want)
    np.testing.assert_array_equal(
        b.capped_positions(0, 6, 6).numpy(),
        [
            [0, -1, -2, -2, -2, -2],
            [1, 0, -1, -2, -2, -2],
            [2, 1, 0, -1, -2, -2],
            [2, 2, 1, 0, -1, -2],
            [2, 2, 2, 1, 0, -1],
            [2, 2, 2, 2, 1, 0],
        ],
    )
    d = P.get("lm-infinite").bind(64, 4096)
    assert (d.sinks, d.window, d.cap) == (5, 63, 63)


def test_rerope_distances_drawn_out():
    b = P.get("rerope").bind(64, 5, window=2)
    np.testing.assert_array_equal(
        b.capped_positions(0, 5, 5).numpy(),
        [[0, -1, -2, -2, -2], [1, 0, -1, -2, -2], [2, 1, 0, -1, -2], [2, 2, 1, 0, -1], [2, 2, 2, 1, 0]],
    )
    assert b.mask(5, 5) is None and b.rectified and P.get("rerope").bind(64, 5).window == 32


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["window", "streaming-llm", "lm-infinite", "rerope"]),
    st.integers(1, 40),
    st.integers(0, 12),
    st.integers(0, 6),
    st.integers(1, 12),
    st.data(),
)
def test_block_rows_are_the_rows_of_the_whole(name, n, window, sinks, cap, data):
    """A block of query rows r0..r1 is exactly those rows of the whole matrix, and the whole matrix is the hand
    rule at every (i, j): |i - j| <= w or j < sinks (mask); the scheme's distance (rectified)."""
    r0 = data.draw(st.integers(0, n))
    r1 = data.draw(st.integers(r0, n))
    s = P.get(name)
    values = {k: v for k, v in {"window": window, "sinks": sinks, "cap": cap}.items() if k in s.params}
    b = P.get(name).bind(64, n, **values)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    if b.scheme.mask is not None:
        whole = b.mask(n, n).numpy()
        np.testing.assert_array_equal(whole, (np.abs(i - j) <= b.window) | (j < b.sinks))
        np.testing.assert_array_equal(b.mask_rows(r0, r1, n).numpy(), whole[r0:r1])
    if b.rectified:
        whole = b.capped_positions(0, n, n).numpy()
        if name == "streaming-llm":
            far = (j < b.sinks) & (np.abs(i - j) > b.window)
            want = np.where(far, np.sign(i - j) * np.minimum(np.abs(i - j), b.window + b.sinks - j), i - j)
        else:
            c = b.window if name == "rerope" else b.cap
            want = np.clip(i - j, -c, c)
        np.testing.assert_array_equal(whole, want)
        np.testing.assert_array_equal(b.capped_positions(r0, r1, n).numpy(), whole[r0:r1])


def test_rotate_is_transformers_rotation():
    cfg = config(8, 500.0)
    rot = ModernBertRotaryEmbedding(cfg)
    q, k = torch.randn(2, 3, 11, 8, generator=torch.Generator().manual_seed(0)).unbind(0)
    q, k = q[None], k[None]
    cos, sin = rot(q, torch.arange(11)[None], FULL)
    tq, tk = apply_rotary_pos_emb(q, k, cos, sin)
    inv = getattr(rot, f"{FULL}_inv_freq")
    torch.testing.assert_close(P.rotate(q, torch.arange(11), inv), tq, rtol=0, atol=0)
    torch.testing.assert_close(P.rotate(k, torch.arange(11), inv, 1.3), tk * 1.3, rtol=1e-6, atol=1e-6)


def _qk(n: int = 9, d: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, n, d, generator=g), torch.randn(1, 2, n, d, generator=g), P.default_inv_freq(500.0, d)


def test_rectified_logits_by_hand():
    """Each logit is rot(q_i, distance[i, j]) . k_j (k at 0), the true distance giving plain RoPE's logit."""
    q0, k0, inv = _qk()
    n = q0.shape[-2]
    ar = torch.arange(n)
    plain_logits = P.rotate(q0, ar, inv) @ P.rotate(k0, ar, inv).transpose(-1, -2)
    true = P.relative_positions(0, n, n)
    torch.testing.assert_close(P.rectified_logits(q0, k0, inv, true, 0), plain_logits)
    for name, values in (
        ("rerope", {"window": 2}),
        ("lm-infinite", {"window": 2, "sinks": 2, "cap": 3}),
        ("streaming-llm", {"window": 2, "sinks": 2}),
    ):
        b = P.get(name).bind(64, n, **values)
        dist = b.capped_positions(0, n, n)
        hand = torch.empty(1, 2, n, n)
        for i in range(n):
            for j in range(n):
                hand[..., i, j] = (P.rotate(q0[..., i, :], dist[i, j], inv) * k0[..., j, :]).sum(-1)
        allowed = b.mask(n, n)
        for r0, r1 in ((0, n), (3, 7)):
            got = P.rectified_logits(q0, k0, inv, b.capped_positions(r0, r1, n), r0, allowed=None)
            torch.testing.assert_close(got, hand[..., r0:r1, :], rtol=1e-5, atol=1e-5)
            if allowed is not None:
                got = P.rectified_logits(q0, k0, inv, b.capped_positions(r0, r1, n), r0, allowed=allowed[r0:r1])
                torch.testing.assert_close(
                    got[..., allowed[r0:r1]], hand[..., r0:r1, :][..., allowed[r0:r1]], rtol=1e-5, atol=1e-5
                )
    # the attention factor on cos and sin multiplies every logit by its square
    dist = P.capped_distances(0, n, n, 2)
    torch.testing.assert_close(
        P.rectified_logits(q0, k0, inv, dist, 0, scale=1.5),
        P.rectified_logits(q0, k0, inv, dist, 0) * 2.25,
        rtol=1e-5,
        atol=1e-5,
    )


# ---- reaching a model -------------------------------------------------------------------------------------------


def _model(cfg: ModernBertConfig, seed: int = 0) -> ModernBertForMaskedLM:
    """A random tiny ModernBERT whose attention is sharp enough for positions to matter (its init's q and k are
    so small that attention is almost uniform: scaled up here)."""
    torch.manual_seed(seed)
    model = ModernBertForMaskedLM(cfg).eval().to(torch.float32).requires_grad_(False)
    for layer in model.model.layers:
        layer.attn.Wqkv.weight.mul_(25.0)
    return model


def _ids(n: int) -> torch.Tensor:
    return torch.randint(3, 64, (1, n), generator=torch.Generator().manual_seed(1))


_ROTATING: dict[str, P.Bound | None] = {"bound": None}


@pytest.mark.parametrize("name", ["pi", "ntk", "dynamic-ntk", "yarn-rope"])
def test_the_per_call_rotation_equals_a_model_built_from_the_scheme_config_and_changes_nothing_shared(name):
    """The rotary subclass (rotate_per_call) gives exactly a model built from the scheme's config while a scheme is
    current, the model as trained otherwise (before, after, and after an error), and never touches the module's
    buffers: nothing shared changes per pass."""
    lt, n = 16, 72
    cfg = config(8, 500.0, layers=2, max_pos=lt)
    model = _model(cfg)
    ids = _ids(n)
    before = model(ids).logits
    buffers = [b.clone() for b in model.model.rotary_emb.buffers()]
    bound = P.get(name).bind(lt, n)
    other = _model(P.configured(cfg, bound))
    other.load_state_dict(model.state_dict())
    patches.rotate_per_call(model, lambda: _ROTATING["bound"])
    patches.rotate_per_call(model, lambda: _ROTATING["bound"])  # idempotent: swapped once
    assert type(model.model.rotary_emb).__mro__[1] is ModernBertRotaryEmbedding
    torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)  # no scheme current: the parent's forward
    _ROTATING["bound"] = bound
    try:
        during = model(ids).logits
    finally:
        _ROTATING["bound"] = None
    torch.testing.assert_close(during, other(ids).logits, rtol=1e-5, atol=1e-5)
    assert (during - before).abs().max() > 1e-3  # the scheme changed something
    torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.model.rotary_emb.buffers()))
    assert model.model.rotary_emb.rope_type[FULL] == "default"


_CURRENT: dict[str, P.Bound] = {}


def _scheme_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The hook the project's attention function will get (docs/positions.md), in a dozen lines: rectified
    logits from the unrotated q and k a rectified scheme's rotary override hands over, the scheme's mask ANDed
    with the padding mask, softmax, values."""
    b = _CURRENT["bound"]
    n = query.shape[-2]
    layer_type = module.config.layer_types[module.layer_idx]
    allowed = b.mask(n, key.shape[-2], query.device)
    if b.rectified:
        inv, a = b.frequencies(module.config, layer_type)
        logits = P.rectified_logits(query, key, inv, b.capped_positions(0, n, key.shape[-2]), 0, a, allowed)
    else:
        logits = (query @ key.transpose(-1, -2)).float()
    logits = logits * scaling
    if allowed is not None:
        logits = logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)
    if attention_mask is not None:
        floor = torch.finfo(logits.dtype).min
        logits = (
            logits.masked_fill(~attention_mask, floor)
            if attention_mask.dtype == torch.bool
            else logits + attention_mask
        )
    return (torch.softmax(logits, -1).to(value.dtype) @ value).transpose(1, 2).contiguous(), None


AttentionInterface.register("positions-test", _scheme_attention)


def _run(model: ModernBertForMaskedLM, bound: P.Bound, ids: torch.Tensor) -> torch.Tensor:
    _CURRENT["bound"] = _ROTATING["bound"] = bound
    model.set_attn_implementation("positions-test")
    patches.rotate_per_call(model, lambda: _ROTATING["bound"])
    try:
        return model(ids).logits
    finally:
        _ROTATING["bound"] = None
        model.set_attn_implementation("sdpa")


def test_the_hook_gives_plain_rope_when_nothing_is_capped_and_the_mask_of_an_explicit_mask():
    lt, n = 16, 40
    model = _model(config(8, 500.0, layers=2, max_pos=lt))
    ids = _ids(n)
    ref = model(ids).logits
    # ReRoPE with a window past every distance, and LM-Infinite with everything visible: plain RoPE, computed
    # from unrotated q and k (the rotary module turns nothing meanwhile)
    for bound in (P.get("rerope").bind(lt, n, window=n), P.get("lm-infinite").bind(lt, n, window=n, cap=n)):
        torch.testing.assert_close(_run(model, bound, ids), ref, rtol=1e-4, atol=1e-4)
    assert (_run(model, P.get("rerope").bind(lt, n, window=3), ids) - ref).abs().max() > 1e-3
    # windowed attention equals the eager model given the same band as an explicit additive mask
    bound = P.get("window").bind(lt, n, window=4)
    additive = torch.zeros(1, 1, n, n).masked_fill(~bound.mask(n, n), torch.finfo(torch.float32).min)
    model.set_attn_implementation("eager")
    want = model(ids, attention_mask={FULL: additive, "sliding_attention": additive}).logits
    model.set_attn_implementation("sdpa")
    torch.testing.assert_close(_run(model, bound, ids), want, rtol=1e-4, atol=1e-4)
    # and LM-Infinite with its cap at the window's edge is that band plus sinks, its sinks seen at the cap
    got = _run(model, P.get("lm-infinite").bind(lt, n, window=4, sinks=2, cap=4), ids)
    assert torch.isfinite(got).all() and (got - want).abs().max() > 1e-4
