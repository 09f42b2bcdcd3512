"""The C++ kernel on a decoder's causal prefill (issue 56, item 5): causal rows, grouped K/V, Gemma 2's soft-cap.

A tiny random Llama, Qwen2 and Gemma 2 (3 layers, 6 query heads on 2 key/value heads, head dim 16, 40 tokens cut
into blocks of 7 rows by a small block budget): with the kernel the prefill's logits equal transformers' eager
attention at tau 1 and 0.7 (eager with the logits over 0.7), and every probe of the pass (Pmax and H per row and
layer, a layer's map, the question rows' profile and map) equals the ``torch`` backend's (the kernel switched off).
The backend chosen for each call is counted, so these fail if the kernel is not the one serving the prefill. Then
the attention function alone: the kernel never reads the keys a block's rows cannot see (they hold NaN here, which
the ``torch`` backend, reading them, turns into NaN output), rows at the end of cached keys, the raw logits a probe
asks for, and the kernel's own ``diagonal`` and ``out`` against torch.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers

from core.kinds import DECODER
from core.mechanics import attention, fused_softmax, softmax_block
from core.mechanics.probes import ProbeSpec, Recorder
from core.runs.apply import apply
from core.values.choice import Choice
from support.decoders import tiny_decoder_fields

pytestmark = pytest.mark.skipif(not fused_softmax.available(), reason="the fused kernel does not build here")

TOL = 1e-5
VOCAB = 96
TOKENS = 40
#: A block budget of 7 rows of the tiny models' calls (1 item x 6 heads x 40 keys x 4 bytes each): 6 blocks a call.
CHUNK = 7 * 6 * TOKENS * 4
COMMON = tiny_decoder_fields(
    vocab_size=VOCAB,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=6,
    max_position_embeddings=128,
)


def _model(family: str):
    """A tiny random ``family`` model on eager attention. Gemma 2's window is longer than the input, so its sliding
    layers' prefill is causal rows too (a window the input reaches is a mask of rows, the ``torch`` backend's), and
    its soft-cap is 1 (logits of a few units are capped hard)."""
    config = {
        "llama": lambda: transformers.LlamaConfig(**COMMON),
        "qwen2": lambda: transformers.Qwen2Config(**COMMON),
        "gemma2": lambda: transformers.Gemma2Config(
            **COMMON, sliding_window=64, attn_logit_softcapping=1.0, final_logit_softcapping=None
        ),
    }[family]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    return model.eval()


def _tempered_eager(model, tau: float):
    """A copy on eager attention with every logit fed to the softmax over ``tau`` (scaling and soft-cap over tau)."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for m in ref.modules():
            if hasattr(m, "scaling") and hasattr(m, "layer_idx"):
                m.scaling = m.scaling / tau
                if getattr(m, "attn_logit_softcapping", None) is not None:
                    m.attn_logit_softcapping = m.attn_logit_softcapping / tau
    return ref


def _ids() -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(1))


@pytest.fixture
def chosen(monkeypatch):
    """The backend of every attention call made in the test, in order."""
    seen: list[str] = []
    real = softmax_block.choose_backend

    def counting(x):
        seen.append(real(x))
        return seen[-1]

    monkeypatch.setattr(softmax_block, "choose_backend", counting)
    return seen


def _unprobed(model) -> str:
    """The backend of a prefill nobody probes: ``sdpa`` (:func:`softmax_block.sdpa_prefill`), the kernel where the
    logits are soft-capped (Gemma 2), which sdpa cannot do."""
    return softmax_block.CPU_KERNEL if getattr(model.config, "attn_logit_softcapping", None) else softmax_block.SDPA


def _spec() -> ProbeSpec:
    """Every probe a decoder's prefill has: Pmax and H per layer, layer 1's map, the question rows' profile."""
    return ProbeSpec(
        kind=DECODER, heatmap_layer=1, heatmap_size=16, profile_rows=(30, 36), sorted_logits=False, cosine_hist_bins=0
    )


def _probed(model, tau: float) -> tuple[torch.Tensor, dict]:
    ids = _ids()
    rec = Recorder(_spec(), torch.ones_like(ids, dtype=torch.bool))
    with torch.no_grad(), apply(model, tau=tau, recorder=rec, chunk_bytes=CHUNK):
        logits = model(input_ids=ids).logits
    return logits, rec.finish().named


@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2"])
def test_the_kernel_serves_the_prefill_equal_to_eager_and_to_torch(family, tau, chosen, monkeypatch):
    """Logits of a probed prefill through the kernel equal eager's (tempered), and its probes the ``torch``
    backend's; every layer's call took the kernel (and, switched off, ``torch``): counted."""
    model = _model(family)
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        expect = _tempered_eager(model, tau)(input_ids=_ids()).logits
    got, probes = _probed(model, tau)
    assert chosen == [softmax_block.CPU_KERNEL] * layers
    torch.testing.assert_close(got, expect, rtol=TOL, atol=TOL)
    with torch.no_grad(), apply(model, tau=tau, chunk_bytes=CHUNK):  # nothing probed: sdpa (soft-capped: the kernel)
        plain = model(input_ids=_ids()).logits
    assert chosen[layers:] == [_unprobed(model)] * layers
    torch.testing.assert_close(plain, expect, rtol=TOL, atol=TOL)

    monkeypatch.setenv(fused_softmax.ENV_SWITCH, "0")
    del chosen[:]
    off, reference = _probed(model, tau)
    assert chosen == [softmax_block.TORCH] * layers
    torch.testing.assert_close(got, off, rtol=TOL, atol=TOL)
    assert set(probes) == set(reference)
    assert {f"decoder.{i}.pmax" for i in range(layers)} | {"decoder.1.map", "decoder.0.profile"} <= set(probes)
    for name, want in reference.items():
        if isinstance(want, np.ndarray):
            np.testing.assert_allclose(probes[name], want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_probes_of_the_kernel_equal_eager_weights(chosen):
    """Pmax and H per layer of the kernel's prefill equal those of eager's own weights (output_attentions)."""
    model = _model("llama")
    ids = _ids()
    with torch.no_grad():
        weights = model(input_ids=ids, output_attentions=True).attentions
    _, probes = _probed(model, 1.0)
    assert chosen == [softmax_block.CPU_KERNEL] * len(weights)
    for layer, w in enumerate(weights):
        w = w.double()
        np.testing.assert_allclose(probes[f"decoder.{layer}.pmax"], w.amax(-1).mean(-1).numpy(), atol=1e-5)
        ent = (-torch.special.xlogy(w, w).sum(-1)).mean(-1).numpy()
        np.testing.assert_allclose(probes[f"decoder.{layer}.entropy"], ent, atol=1e-4)


def _call(q_len: int, k_len: int, seed: int = 0, softcap: float | None = None, needs=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 6, q_len, 16, generator=g) * 2
    k = torch.randn(2, 2, k_len, 16, generator=g) * 2
    v = torch.randn(2, 2, k_len, 16, generator=g)
    tau = torch.full((6, 1, 1), 0.7)
    return softmax_block.Inputs(q, k, v, tau=tau, causal=True, softcap=softcap, needs=needs)


def test_keys_no_row_of_a_block_sees_are_never_read():
    """A block of rows ``[0, 5)`` of a 30-row prefill sees keys ``0 .. 4``: keys and values from 5 on set to NaN
    change nothing of the kernel's block, while the ``torch`` backend, which multiplies every key, gives NaN (so the
    test would fail if the kernel read them)."""
    x = _call(30, 30, softcap=1.5, needs=softmax_block.Needs(stats=True, probs=True))
    clean = softmax_block.open_backend(softmax_block.CPU_KERNEL, x, 5)(0, 5)
    key, value = x.key.clone(), x.value.clone()
    key[:, :, 5:] = float("nan")
    value[:, :, 5:] = float("nan")
    poisoned = softmax_block.Inputs(**{**x.__dict__, "key": key, "value": value})
    block = softmax_block.open_backend(softmax_block.CPU_KERNEL, poisoned, 5)(0, 5)
    for a, b in ((block.out, clean.out), (block.total, clean.total), (block.dot, clean.dot), (block.exp, clean.exp)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert tuple(block.exp.shape) == (2, 6, 5, 30) and not block.exp[..., 5:].any()
    torch_block = softmax_block.open_backend(softmax_block.TORCH, poisoned, 5)(0, 5)
    assert torch.isnan(torch_block.out).any()


@pytest.mark.parametrize("shape", [(30, 30), (9, 30), (1, 30)], ids=["prefill", "rows-after-cache", "one-row"])
@pytest.mark.parametrize("probs", [False, True], ids=["stats", "probs"])
def test_every_block_equals_the_torch_backends(shape, probs):
    """Blocks of 4 rows through the kernel and through ``torch``: output, total, dot, exp (over every key, when a
    view reads the probabilities; else none) and the raw logits of the rows a probe names, all keys included."""
    q_len, k_len = shape
    needs = softmax_block.Needs(stats=True, probs=probs, raw_rows=lambda r0, r1: torch.arange(0, r1 - r0, 2))
    x = _call(q_len, k_len, seed=q_len, softcap=2.0, needs=needs)
    kernel = softmax_block.open_backend(softmax_block.CPU_KERNEL, x, 4)
    plain = softmax_block.open_backend(softmax_block.TORCH, x, 4)
    for r0 in range(0, q_len, 4):
        a, b = kernel(r0, min(q_len, r0 + 4)), plain(r0, min(q_len, r0 + 4))
        torch.testing.assert_close(a.out, b.out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.total, b.total, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.dot, b.dot, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a.raw, b.raw, rtol=1e-5, atol=1e-5)
        if probs or q_len == 1:
            torch.testing.assert_close(a.exp, b.exp, rtol=1e-5, atol=1e-6)
        else:
            assert a.exp is None


def test_the_kernels_diagonal_and_out_equal_torch():
    """``softmax_rows(diagonal=, out=)``: rows of 11 keys written into rows of 16 (the rest untouched), row i
    seeing keys up to ``diagonal + i``, equal to torch's softmax pieces with the mask made by hand."""
    g = torch.Generator().manual_seed(5)
    s = torch.randn(2, 3, 4, 11, generator=g) * 3
    out = torch.full((2, 3, 4, 16), 7.0)
    total, dot = fused_softmax.softmax_rows(s.clone(), None, diagonal=7, out=out)
    allowed = torch.arange(11)[None, :] <= 7 + torch.arange(4)[:, None]
    x = s.masked_fill(~allowed, torch.finfo(torch.float32).min)
    d = x - x.amax(-1, keepdim=True)
    e = torch.exp(d).masked_fill(~allowed, 0.0)
    torch.testing.assert_close(out[..., :11], e, rtol=1e-5, atol=1e-7)
    assert (out[..., 11:] == 7.0).all()
    torch.testing.assert_close(total, e.sum(-1, keepdim=True), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dot, (e * d.masked_fill(~allowed, 0.0)).sum(-1, keepdim=True), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="out must be"):
        fused_softmax.softmax_rows(s.clone(), None, out=torch.empty(2, 3, 4, 10))


def test_the_causal_kernel_makes_no_tensor_of_every_row_and_key(monkeypatch):
    """A 128-row prefill in blocks of 8 rows: no op makes a mask or scores of all rows by all keys, even of one
    head (the largest tensors: the query and the call's output, 6 heads x 128 rows x 16; a block's scores are
    6 x 8 x 128)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    Largest.largest = max(Largest.largest, t.numel())
            return out

    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, h, 128, 16, generator=g) for h in (6, 2, 2))

    class Module(torch.nn.Module):
        is_causal = True
        layer_idx = 0

    monkeypatch.setattr(softmax_block, "_chunk_rows", lambda *a: 8)
    with torch.no_grad(), attention.attention_call(Choice.of(tau=0.7, targets=(DECODER,))), Largest():
        out, _ = attention.aligned_attention(Module(), q, k, v, None, scaling=0.25)
    assert Largest.largest <= q.numel() < 128 * 128
    assert torch.isfinite(out).all()


def test_no_mask_of_every_row_and_key_reaches_the_attention(chosen):
    """An unpadded prefill, with an attention mask of ones as ``generate`` hands one over or with none: transformers'
    mask function (ours, through ``compact_mask``) hands over no mask, so no ``L x L`` mask is ever made and
    ``sdpa`` takes the causal rows (``is_causal``); a padded batch's mask (rows of its own) is not the kernel's."""
    model = _model("llama")
    ids = _ids()
    seen: list = []
    real = attention.aligned_attention

    def spy(module, query, key, value, attention_mask, *args, **kwargs):
        seen.append(attention_mask)
        return real(module, query, key, value, attention_mask, *args, **kwargs)

    attention.patches.register_name(attention.ATTN_NAME, spy, attention.compact_mask)
    try:
        with torch.no_grad(), apply(model, tau=0.7):
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
            model(input_ids=ids)
    finally:
        attention.register()
    layers = model.config.num_hidden_layers
    assert seen == [None] * (2 * layers)
    assert chosen == [softmax_block.SDPA] * (2 * layers)


@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_question_rows_probed_after_an_unprobed_prefix(tau, monkeypatch):
    """A recorder reading Pmax and H on some rows only (a decoder's question, :mod:`core.runs.calibration`): the
    rows before them go through ``sdpa`` unprobed, one block a layer (counted), and the logits and the statistics
    equal those of the same pass with every row through the probed backend."""
    model = _model("llama")
    layers = model.config.num_hidden_layers
    ids = _ids()
    spec = ProbeSpec(kind=DECODER, heatmap=False, sorted_logits=False, cosine_hist_bins=0)
    rows = torch.zeros_like(ids, dtype=torch.bool)
    rows[0, 30:36] = True

    def probed() -> tuple[torch.Tensor, dict]:
        rec = Recorder(spec, rows)
        with torch.no_grad(), apply(model, tau=tau, recorder=rec, chunk_bytes=CHUNK):
            logits = model(input_ids=ids).logits
        return logits, rec.finish().named

    prefixes: list[int] = []
    real = attention._fused

    def fused(x, step):
        prefixes.append(step)
        return real(x, step)

    monkeypatch.setattr(attention, "_fused", fused)
    got, stats = probed()
    assert prefixes == [30] * layers  # one sdpa block of the 30 rows before the question, every layer
    monkeypatch.setattr(attention, "_unread_prefix", lambda x: 0)
    expect, reference = probed()
    assert prefixes == [30] * layers
    torch.testing.assert_close(got, expect, rtol=TOL, atol=TOL)
    for i in range(layers):
        for stat in ("pmax", "entropy"):
            name = f"decoder.{i}.{stat}"
            np.testing.assert_allclose(stats[name], reference[name], rtol=1e-5, atol=1e-6, err_msg=name)
