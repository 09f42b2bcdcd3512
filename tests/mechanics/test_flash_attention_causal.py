"""The CUDA backend's Triton kernel on a decoder's prefill (issue 56, item 5), run by Triton's interpreter here.

Causal rows (a prefill, and rows at the end of cached keys), grouped K/V (query heads sharing key heads, read in
place), Gemma 2's soft-cap, tau per head and per row: the kernel's output and each row's total, dot and max equal
torch's arithmetic; the key blocks no row of a program sees are never read (NaN there changes nothing); and the
``cuda`` backend inside the attention serves such a call (``cuda_serves``) equal to the ``torch`` backend.
"""

from __future__ import annotations

import pytest
import torch

from core.mechanics import flash_attention, softmax_block

pytestmark = pytest.mark.skipif(not flash_attention.has_triton(), reason="Triton is not installed")


@pytest.fixture(autouse=True)
def interpreter():
    if not flash_attention.interpreted():
        pytest.skip("no GPU and Triton's interpreter not chosen (TRITON_INTERPRET=1 before triton's import)")


def _reference(q, k, v, start, tau, softcap):
    """Causal grouped attention in float64 with K/V repeated (the reference only), finfo.min where masked."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
    x = q.double() @ k.transpose(-1, -2)
    if softcap is not None:
        x = torch.tanh(x / softcap) * softcap
    if tau is not None:
        x = x / tau.double()
    m_len, n_len = q.shape[-2], k.shape[-2]
    allowed = torch.arange(n_len)[None, :] <= start + torch.arange(m_len)[:, None]
    x = x.masked_fill(~allowed, torch.finfo(torch.float32).min)
    top = x.amax(-1, keepdim=True)
    e = torch.exp(x - top).masked_fill(~allowed, 0.0)
    total = e.sum(-1, keepdim=True)
    return (e / total) @ v, total, (e * (x - top).masked_fill(~allowed, 0.0)).sum(-1, keepdim=True), top


@pytest.mark.parametrize("softcap", [None, 1.5])
@pytest.mark.parametrize("tau_kind", ["head", "row"])
@pytest.mark.parametrize("shape", [(1, 4, 2, 70, 70, 16), (2, 6, 2, 9, 130, 24)], ids=["prefill", "after-cache"])
def test_causal_grouped_rows_equal_torch(shape, tau_kind, softcap):
    b, h, hk, m, n, d = shape
    g = torch.Generator().manual_seed(m + n)
    q = torch.randn(b, h, m, d, generator=g) * 2
    k, v = torch.randn(b, hk, n, d, generator=g), torch.randn(b, hk, n, d, generator=g)
    if tau_kind == "head":
        tau = torch.rand(h, generator=g) + 0.5
        ref_tau = tau.view(1, h, 1, 1)
    else:
        tau = torch.rand(m, generator=g) + 0.5
        ref_tau = tau.view(1, 1, m, 1)
    start = n - m
    out, total, dot, top = flash_attention.attend(q, k, v, None, (0, 0, 0), tau, tau_kind, None, start, softcap)
    r_out, r_total, r_dot, r_top = _reference(q, k, v, start, ref_tau, softcap)
    torch.testing.assert_close(out.double(), r_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(total.double(), r_total, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dot.double(), r_dot, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(top.double(), r_top, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # the second program reads the NaN on purpose
def test_key_blocks_past_a_programs_last_row_are_never_read():
    """128 causal rows in programs of 64: the first program's rows see keys 0..63, so keys 64 on holding NaN change
    none of its rows (the kernel would carry the NaN into them had it read those blocks)."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 128, 16, generator=g)
    k, v = torch.randn(1, 1, 128, 16, generator=g), torch.randn(1, 1, 128, 16, generator=g)
    clean = flash_attention.attend(q, k, v, diagonal=0)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, flash_attention.BLOCK_M :] = float("nan")
    v2[:, :, flash_attention.BLOCK_M :] = float("nan")
    poisoned = flash_attention.attend(q, k2, v2, diagonal=0)
    first = slice(0, flash_attention.BLOCK_M)
    for a, b in zip(poisoned, clean):
        assert torch.isfinite(a[:, :, first]).all()
        torch.testing.assert_close(a[:, :, first], b[:, :, first], rtol=0, atol=0)
    assert torch.isnan(poisoned[0][:, :, flash_attention.BLOCK_M :]).all()


def test_the_cuda_backend_serves_a_decoder_prefill_equal_to_torch():
    """``cuda_serves`` takes causal grouped rows with a soft-cap and row statistics asked, and the ``cuda`` backend's
    block (opened here on the CPU through the interpreter) equals the ``torch`` backend's."""
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 4, 40, 16, generator=g), torch.randn(1, 2, 40, 16, generator=g), torch.randn(1, 2, 40, 16)
    x = softmax_block.Inputs(
        q, k, v, tau=torch.full((4, 1, 1), 0.7), causal=True, softcap=2.0, needs=softmax_block.Needs(stats=True)
    )
    assert softmax_block.cuda_serves(x)
    assert not softmax_block.cuda_serves(
        softmax_block.Inputs(q, k, v, causal=True, needs=softmax_block.Needs(probs=True))
    )
    a = softmax_block.open_backend(softmax_block.CUDA, x, 40)(0, 40)
    b = softmax_block.open_backend(softmax_block.TORCH, x, 40)(0, 40)
    torch.testing.assert_close(a.out, b.out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.total, b.total, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.dot, b.dot, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a.probs_rows(30, 35, 40), (b.exp / b.total)[0, :, 30:35], rtol=1e-5, atol=1e-6)
