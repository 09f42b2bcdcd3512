"""The CUDA backend's Triton kernel (core.mechanics.flash_attention), run on the CPU by Triton's interpreter.

No GPU here: the same kernel source runs through ``TRITON_INTERPRET=1`` (numpy under Triton's own
semantics), so its arithmetic is held to torch's here: output, each row's total, dot and max, with T5's
bias vector read in place, a dense bias, tau per head and per row, key padding, head dims that are not a
power of two, and more keys than queries. Then the backend inside the attention: a probed pass whose
encoder layers take ``cuda`` equals the CPU's, and a layer whose map is asked does not take it. The GPU's
speed is bench/gpu.py's, where a GPU is lent (tests/mechanics/test_gpu.py checks it against the CPU there).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.mechanics import flash_attention, softmax_block
from core.values.choice import Choice

pytestmark = pytest.mark.skipif(not flash_attention.has_triton(), reason="Triton is not installed")


@pytest.fixture(autouse=True)
def interpreter():
    """On a machine without a GPU the kernel runs on Triton's interpreter (tests/conftest.py chooses it
    before triton is imported); with a GPU, compiled, on CUDA tensors (tests/mechanics/test_gpu.py)."""
    if not flash_attention.interpreted():
        pytest.skip("no GPU and Triton's interpreter not chosen (TRITON_INTERPRET=1 before triton's import)")


def _reference(q, k, v, dense, tau, keymask):
    x = q @ k.transpose(-1, -2)
    if dense is not None:
        x = x + dense
    if tau is not None:
        x = x / tau
    if keymask is not None:
        x = x.masked_fill(~keymask[:, None, None, :], torch.finfo(torch.float32).min)
    m = x.amax(-1, keepdim=True)
    e = torch.exp(x - m)
    total = e.sum(-1, keepdim=True)
    return (e / total) @ v, total, (e * (x - m)).sum(-1, keepdim=True), m


@pytest.mark.parametrize("bias_kind", ["vector", "dense", None])
@pytest.mark.parametrize("tau_kind", ["head", "row", None])
@pytest.mark.parametrize("shape", [(2, 3, 70, 70, 16), (1, 2, 9, 130, 24), (1, 1, 65, 65, 32)])
def test_kernel_equals_torch(bias_kind, tau_kind, shape):
    b, h, m, n, d = shape
    g = torch.Generator().manual_seed(m * 7 + n + d)
    q = torch.randn(b, h, m, d, generator=g) * 2
    k, v = torch.randn(b, h, n, d, generator=g), torch.randn(b, h, n, d, generator=g)
    i, j = torch.arange(m)[:, None], torch.arange(n)[None]
    bias, strides, dense = None, (0, 0, 0), None
    if bias_kind == "vector":  # row i of head h starts at (m - 1 - i): T5's lazy bias, read backwards
        bias = torch.randn(h, m + n - 1, generator=g) * 3
        strides = (m + n - 1, -1, m - 1)
        dense = bias[:, (j - i) + m - 1][None]
    elif bias_kind == "dense":
        dense = torch.randn(1, h, m, n, generator=g) * 3
        bias, strides = dense, (dense.stride(1), dense.stride(2), 0)
    tau, ref_tau = None, None
    if tau_kind == "head":
        tau = torch.linspace(0.4, 1.6, h)
        ref_tau = tau.view(1, h, 1, 1)
    elif tau_kind == "row":
        tau = torch.linspace(0.5, 1.2, m)
        ref_tau = tau.view(1, 1, m, 1)
    keymask = torch.ones(b, n, dtype=torch.bool)
    keymask[-1, n // 2 :] = False
    got = flash_attention.attend(q, k, v, bias, strides, tau, tau_kind or "head", keymask)
    want = _reference(q, k, v, dense, ref_tau, keymask)
    for name, x, y in zip(("out", "total", "dot", "top"), got, want):
        torch.testing.assert_close(x, y, rtol=2e-5, atol=2e-5, msg=name)


def test_a_row_whose_every_key_is_masked_averages_its_values_as_eager_does():
    q, k, v = torch.randn(1, 1, 3, 16), torch.randn(1, 1, 5, 16), torch.randn(1, 1, 5, 16)
    keymask = torch.zeros(1, 5, dtype=torch.bool)
    out, total, _, _ = flash_attention.attend(q, k, v, keymask=keymask)
    torch.testing.assert_close(out, v.mean(-2, keepdim=True).expand_as(out), rtol=1e-5, atol=1e-6)
    assert torch.equal(total, torch.full_like(total, 5.0))


def _encoder_pass(tiny, ids, mask, spec, force_cuda, monkeypatch):
    from core.mechanics.attention import attention_call
    from core.mechanics.probes import Recorder

    chosen: list[str] = []
    choose = softmax_block.choose_backend

    def pick(x):
        name = softmax_block.CUDA if force_cuda and softmax_block.cuda_serves(x) else choose(x)
        chosen.append(name)
        return name

    monkeypatch.setattr(softmax_block, "choose_backend", pick)
    rec = Recorder(spec, mask.bool())
    with torch.no_grad(), attention_call(Choice.of(tau=[0.6, 0.9, 1.0, 1.3]), None, rec):
        hidden = tiny.model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    monkeypatch.setattr(softmax_block, "choose_backend", choose)
    return hidden, rec.finish(), chosen


def test_a_stats_pass_through_the_cuda_backend_equals_the_cpus(tiny, monkeypatch):
    """A padded batch, per-head tau, Pmax and H asked: every encoder layer takes ``cuda`` (the kernel on the
    interpreter), and the hidden states, Pmax and H equal the CPU path's."""
    from core.mechanics.probes import ProbeSpec

    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 300, (2, 90), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 60:] = 0
    spec = ProbeSpec.stats_only()
    want_h, want, _ = _encoder_pass(tiny, ids, mask, spec, False, monkeypatch)
    got_h, got, chosen = _encoder_pass(tiny, ids, mask, spec, True, monkeypatch)
    assert chosen == [softmax_block.CUDA] * tiny.model.config.num_layers
    real = mask.bool()[:, :, None]
    torch.testing.assert_close(got_h * real, want_h * real, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got.pmax, want.pmax, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.entropy, want.entropy, rtol=1e-5, atol=1e-5)


def test_a_layer_whose_map_is_asked_is_not_served_by_the_cuda_kernel(tiny, monkeypatch):
    """The map of layer 0 needs every row's probabilities: that layer takes another backend, the others
    ``cuda`` (the question's profile rows computed on demand from the kernel's row statistics); every probe's
    numbers equal the CPU path's."""
    from core.mechanics.probes import ProbeSpec

    ids = torch.randint(3, 300, (1, 80), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    spec = ProbeSpec(profile_rows=(3, 9))
    _, want, _ = _encoder_pass(tiny, ids, mask, spec, False, monkeypatch)
    _, got, chosen = _encoder_pass(tiny, ids, mask, spec, True, monkeypatch)
    assert chosen[0] != softmax_block.CUDA and set(chosen[1:]) == {softmax_block.CUDA}
    np.testing.assert_allclose(got.pmax, want.pmax, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.entropy, want.entropy, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.heatmap_mean, want.heatmap_mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.profile, want.profile, rtol=1e-4, atol=1e-7)  # on demand from the kernel's stats


def test_the_cuda_backend_is_chosen_only_on_a_gpu_with_triton():
    """Here (no GPU) it is registered but never available, so no CPU pass can take it."""
    assert softmax_block.BACKENDS[softmax_block.CUDA].open is not None
    assert softmax_block.BACKENDS[softmax_block.CUDA].available == (
        torch.cuda.is_available() and flash_attention.usable()
    )
