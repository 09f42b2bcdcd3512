"""The fused CPU softmax kernel (core.mechanics.fused_softmax) against torch, and the attention with it against eager.

Each kernel entry is held to the torch computation it replaces; the attention with the kernel on is
held to the attention with it off (torch's path) and to transformers' eager attention, probes included;
and a machine that cannot build it still runs (the kernel off, same numbers).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.data import tasks
from core.mechanics import fused_softmax
from core.mechanics.attention import attention_call
from core.mechanics.probes import SORTED_ROWS, ProbeSpec, Recorder, pool_edges
from core.mechanics.relative_bias import RelativeBias
from core.runs import engine
from core.values.choice import Choice

pytestmark = pytest.mark.skipif(not fused_softmax.available(), reason="no C++ compiler here: the kernel is off")

FLOOR = -87.0


def _reference(s, bias_dense, tau, keymask):
    x = s if bias_dense is None else s + bias_dense
    if tau is not None:
        x = x / tau
    if keymask is not None:
        x = x.masked_fill(~keymask[:, None, None, :], torch.finfo(torch.float32).min)
    m = x.amax(-1, keepdim=True)
    d = x - m
    e = torch.where(d < FLOOR, torch.zeros_like(d), torch.exp(d))
    return e, e.sum(-1, keepdim=True), (e * torch.where(d < FLOOR, torch.zeros_like(d), d)).sum(-1, keepdim=True)


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 5),
    c=st.integers(1, 40),
    k=st.integers(1, 300),
    tau_kind=st.sampled_from(["none", "head", "row"]),
    masked=st.booleans(),
    seed=st.integers(0, 10**6),
)
def test_softmax_rows_equals_torch(b, h, c, k, tau_kind, masked, seed):
    """Bias read in place from a RelativeBias vector, tau per head or per row, a padding mask (a row
    with every key masked included): exp, its row sums and sum(exp * shifted) as torch computes them."""
    g = torch.Generator().manual_seed(seed)
    q_len = c + 7
    s = torch.randn(b, h, c, k, generator=g) * 6
    vec = torch.randn(h, q_len + k - 1, generator=g) * 3
    r0 = 5
    dense = RelativeBias(vec, q_len, k).rows(r0, r0 + c)
    tau = None
    if tau_kind == "head":
        tau = torch.rand(h, generator=g) + 0.2
    elif tau_kind == "row":
        tau = torch.rand(c, generator=g) + 0.2
    keymask = None
    if masked:
        keymask = torch.rand(b, k, generator=g) > 0.3
        keymask[0] = False  # item 0 masks every key: uniform weights, as torch's finfo.min fill gives
    tau_b = None if tau is None else tau.view(1, h, 1, 1) if tau_kind == "head" else tau.view(1, 1, c, 1)
    e, total, dot = _reference(s, dense, tau_b, keymask)
    x = s.clone()
    t, d = fused_softmax.softmax_rows(
        x, vec, RelativeBias(vec, q_len, k).strides(r0), tau, tau_kind if tau is not None else "head", keymask
    )
    torch.testing.assert_close(x, e, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(t, total, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(d, dot, atol=1e-4, rtol=1e-4)


def test_non_finite_logits_stay_non_finite():
    """A NaN or infinite logit makes its row's total NaN, as torch's path does: the probes count it."""
    s = torch.randn(1, 2, 3, 40)
    s[0, 0, 1, 5] = float("nan")
    s[0, 1, 2, 7] = float("inf")
    t, _ = fused_softmax.softmax_rows(s, None)
    bad = ~torch.isfinite(t.view(2, 3))
    assert bad.tolist() == [[False, True, False], [False, False, True]]


def test_wrong_arguments_are_refused_in_one_line():
    with pytest.raises(ValueError, match="contiguous float32"):
        fused_softmax.softmax_rows(torch.randn(1, 2, 3, 4).transpose(-1, -2), None)
    with pytest.raises(ValueError, match="tau_per"):
        fused_softmax.softmax_rows(torch.randn(1, 2, 3, 4), None, tau=torch.ones(5), tau_per="head")
    with pytest.raises(ValueError, match="keymask"):
        fused_softmax.softmax_rows(torch.randn(1, 2, 3, 4), None, keymask=torch.ones(2, 4, dtype=torch.bool))


@pytest.mark.parametrize("head", [None, 2])
def test_pool_rows_equals_the_recorders_pooling(head):
    torch.manual_seed(0)
    h, c, k, n0, bins = 4, 50, 700, 650, 64
    e = torch.rand(h, c, k)
    total = e.sum(-1, keepdim=True)
    edges = pool_edges(n0, bins)
    idx = torch.from_numpy(np.repeat(np.arange(len(edges) - 1), np.diff(edges)))
    got_s, got_m = fused_softmax.pool_rows(e, total, 7, 31, n0, torch.from_numpy(edges), head)
    p = (e / total)[:, 7:31, :n0]
    p = p.mean(0) if head is None else p[head]
    want_s = torch.zeros(24, len(edges) - 1).index_add_(1, idx, p)
    want_m = torch.zeros(24, len(edges) - 1).scatter_reduce_(1, idx.expand(24, -1), p, "amax", include_self=True)
    torch.testing.assert_close(got_s, want_s, atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(got_m, want_m, atol=1e-9, rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 30), n=st.integers(1, 3000), seed=st.integers(0, 10**6))
def test_sorted_sum_equals_torch_sort(rows, n, seed):
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(seed)) * 50
    x[0, 0] = -0.0
    want = torch.sort(x, dim=-1, descending=True).values.double().sum(0)
    torch.testing.assert_close(fused_softmax.sorted_sum(x), want, atol=1e-9, rtol=1e-12)


def _probe_run(loaded, doc, tau, monkeypatch, kernel: bool):
    monkeypatch.setenv(fused_softmax.ENV_SWITCH, "1" if kernel else "0")
    spec = ProbeSpec(profile_rows=(5, 12), names=("cross.*.map",))
    return engine.run(loaded, doc, Choice.of(tau=tau), engine.Pass(probes=spec))


@pytest.mark.parametrize("tau", [1.0, 0.6, [0.5, 1.3]])
def test_probed_pass_with_and_without_the_kernel(tiny, monkeypatch, tau):
    """Answer, Pmax, H, maps, profile and sorted logits: the kernel's pass equals torch's path."""
    doc = tasks.make("passkey", tiny.tokenizer, 700, depth=0.3, seed=2)
    a = _probe_run(tiny, doc, tau, monkeypatch, kernel=False)
    b = _probe_run(tiny, doc, tau, monkeypatch, kernel=True)
    assert a.answer == b.answer
    np.testing.assert_allclose(b.probes.pmax, a.probes.pmax, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(b.probes.entropy, a.probes.entropy, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.probes.heatmap_mean, a.probes.heatmap_mean, rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(b.probes.profile, a.probes.profile, rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(b.probes.sorted_logits, a.probes.sorted_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.probes["cross.*.map"], a.probes["cross.*.map"], rtol=1e-4, atol=1e-7)


def test_padded_batch_with_and_without_the_kernel(tiny, monkeypatch):
    """A padded batch (two documents of different lengths): with the kernel on, every encoder self-attention
    call (its padding mask the same row of keys for every query) takes the kernel, and the numbers equal
    torch's path (the kernel off)."""
    from core.mechanics import softmax_block

    docs = [tasks.make("passkey", tiny.tokenizer, n, seed=s) for s, n in enumerate((300, 520))]
    choice, how = Choice.of(tau=0.7), engine.Pass(probes=ProbeSpec.stats_only())
    chosen: list[tuple[str, bool]] = []
    choose = softmax_block.choose_backend

    def spy(x):
        chosen.append(
            (
                choose(x),
                x.mask is not None and not x.causal and x.query.shape[2] > 1 and x.query.shape[2] == x.key.shape[2],
            )
        )
        return chosen[-1][0]

    monkeypatch.setattr(softmax_block, "choose_backend", spy)
    monkeypatch.setenv(fused_softmax.ENV_SWITCH, "0")
    a = engine.run_batch(tiny, docs, choice, how, batch_size=2)
    assert {name for name, _ in chosen} <= {softmax_block.TORCH, softmax_block.SDPA}
    chosen.clear()
    monkeypatch.setenv(fused_softmax.ENV_SWITCH, "1")
    b = engine.run_batch(tiny, docs, choice, how, batch_size=2)
    encoder = [name for name, padded_self in chosen if padded_self]
    assert len(encoder) >= tiny.model.config.num_layers
    assert set(encoder) == {softmax_block.CPU_KERNEL}
    for x, y in zip(a, b):
        assert x.answer == y.answer
        np.testing.assert_allclose(y.probes.pmax, x.probes.pmax, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(y.probes.entropy, x.probes.entropy, rtol=1e-5, atol=1e-6)


def test_sorted_logits_past_the_cap_sort_an_even_sample(tiny):
    """Past SORTED_ROWS document rows the probe sorts an evenly spaced sample, first and last row included:
    the same vector as sorting exactly those rows of the whole logit matrix."""
    n = SORTED_ROWS + 300
    ids = torch.randint(5, 250, (1, n))
    att = tiny.model.encoder.block[0].layer[0].SelfAttention
    got = {}
    hooks = [
        att.q.register_forward_hook(lambda m, i, o: got.setdefault("q", o)),
        att.k.register_forward_hook(lambda m, i, o: got.setdefault("k", o)),
    ]
    rec = Recorder(ProbeSpec(heatmap=False, cosine_hist_bins=0), torch.ones(1, n, dtype=torch.bool))
    with torch.no_grad(), attention_call(Choice.of(tau=0.8), None, rec):
        tiny.model.encoder(input_ids=ids)
    for h in hooks:
        h.remove()
    heads, d = att.n_heads, att.key_value_proj_dim
    q = got["q"].view(1, n, heads, d).transpose(1, 2)[0]
    k = got["k"].view(1, n, heads, d).transpose(1, 2)[0]
    with torch.no_grad():
        bias = att.compute_bias(n, n)
        bias = bias.full() if isinstance(bias, RelativeBias) else bias
    rows = torch.linspace(0, n - 1, SORTED_ROWS).round().long().unique()
    assert rows[0] == 0 and rows[-1] == n - 1 and len(rows) == SORTED_ROWS
    z = (q[:, rows] @ k.transpose(-1, -2)) + bias[0][:, rows]
    want = torch.sort(z, dim=-1, descending=True).values.double().mean(dim=(0, 1)).numpy()
    np.testing.assert_allclose(rec.finish().sorted_logits, want, rtol=1e-4, atol=1e-4)


def test_no_compiler_means_torchs_path_and_the_same_numbers(tiny, monkeypatch):
    """A machine without g++ (or a failed build): available() is False, one reason is kept, passes still run."""
    doc = tasks.make("passkey", tiny.tokenizer, 500, seed=4)
    want = engine.run(tiny, doc, Choice.of(tau=0.7))
    monkeypatch.setattr(fused_softmax, "_LIB", None)
    monkeypatch.setattr(fused_softmax, "_TRIED", False)
    monkeypatch.setattr(fused_softmax.shutil, "which", lambda name: None)
    assert not fused_softmax.available()
    assert "compiler" in fused_softmax.why_not()
    got = engine.run(tiny, doc, Choice.of(tau=0.7))
    assert got.answer == want.answer
    np.testing.assert_allclose(got.probes.pmax, want.probes.pmax, rtol=1e-5)


def test_kernel_pass_equals_transformers_eager_attention(tiny, tiny_dir, monkeypatch):
    """A probed encoder pass whose every attention call takes the kernel (the backend spied on) equals
    transformers' eager attention: the hidden states, and Pmax and H against those of eager's own attention
    weights (output_attentions). Unpadded: a padded batch's mask arrives as ``[B, 1, L, L]``, which the kernel
    does not take (its padding mask is tested above, on the kernel itself)."""
    from transformers import T5ForConditionalGeneration

    from core.mechanics import softmax_block

    monkeypatch.setenv(fused_softmax.ENV_SWITCH, "1")
    ref = T5ForConditionalGeneration.from_pretrained(str(tiny_dir), attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 300, (2, 70), generator=g)
    mask = torch.ones_like(ids)
    chosen: list[str] = []
    choose = softmax_block.choose_backend
    monkeypatch.setattr(softmax_block, "choose_backend", lambda x: chosen.append(choose(x)) or chosen[-1])
    rec = Recorder(ProbeSpec.stats_only(), mask.bool())
    with torch.no_grad():
        want = ref.get_encoder()(input_ids=ids, output_attentions=True)
        with attention_call(Choice.of(tau=1.0), None, rec):
            got = tiny.model.get_encoder()(input_ids=ids).last_hidden_state
    assert chosen == [softmax_block.CPU_KERNEL] * tiny.model.config.num_layers
    torch.testing.assert_close(got, want.last_hidden_state, atol=1e-5, rtol=1e-5)
    w = torch.stack(want.attentions, 1).double()  # [batch, layers, heads, rows, keys]
    pmax = w.amax(-1).mean(-1)
    ent = -torch.special.xlogy(w, w).sum(-1).mean(-1)
    r = rec.finish()
    np.testing.assert_allclose(r.pmax, pmax.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(r.entropy, ent.numpy(), rtol=1e-5, atol=1e-5)
