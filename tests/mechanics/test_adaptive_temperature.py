"""Adaptive temperature inside the attention (issue 48, point 4): each query row's logits multiplied by a beta
from that row's own tau = 1 entropy (Velickovic et al. 2024), on the ``torch`` backend, which every other backend
leaves it to; asked for by the run's schedule, :data:`core.values.schedule.ADAPTIVE` (the registry's method:
tests/runs/test_adaptive_method.py). Checked against a hand computation on a tiny tensor, against the paper's function
(``adaptive_softmax`` of tests/conftest.py, itself checked by hand in tests/values/test_schedule_rules.py), and against
a real small model's pass through an independent reference attention registered with transformers."""

from __future__ import annotations

import math

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from conftest import adaptive_beta, adaptive_softmax
from core.mechanics import attention, softmax_block
from core.mechanics.attention import aligned_attention, attention_call
from core.mechanics.probes import ProbeSpec, Recorder
from core.values.choice import TRAINED, Choice
from core.values.schedule import ADAPTIVE
from support.reference import REF, adaptive_reference


def _poly(h: float) -> float:
    return -0.037 * h**4 + 0.481 * h**3 - 2.3 * h**2 + 4.917 * h - 1.791


def _attend(q, k, v, bias=None, mask=None, **settings):
    """Our attention function on bare tensors (an encoder self-attention: a module with no flags)."""
    with torch.no_grad(), attention_call(Choice.of(**settings)):
        out, weights = aligned_attention(
            torch.nn.Module(), q, k, v, mask, scaling=1.0, position_bias=bias, output_attentions=True
        )
    return out, weights


def test_one_row_by_hand():
    # one head, one query row over 4 keys whose logits are 0, 1, 2, 3 (q = 1, k = 0..3, no bias)
    q = torch.ones(1, 1, 1, 1)
    k = torch.arange(4.0).view(1, 1, 4, 1)
    v = torch.eye(4).view(1, 1, 4, 4)  # the output row is the weights themselves
    z = [0.0, 1.0, 2.0, 3.0]
    p = [math.exp(x) / sum(math.exp(y) for y in z) for x in z]
    h = -sum(a * math.log(a + 1e-9) for a in p)  # 1.0725 nats: above 0.5
    beta = max(_poly(h), 1.0)  # 1.293
    assert h > 0.5 and beta > 1
    want = [math.exp(beta * x) / sum(math.exp(beta * y) for y in z) for x in z]
    out, weights = _attend(q, k, v, tau=ADAPTIVE)
    np.testing.assert_allclose(out.view(-1).numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(weights.view(-1).numpy(), want, rtol=1e-5)
    plain, _ = _attend(q, k, v)
    np.testing.assert_allclose(plain.view(-1).numpy(), p, rtol=1e-5)
    assert out.view(-1)[3] > plain.view(-1)[3]  # it sharpened the row


def test_each_row_gets_its_own_beta_and_masks_hold():
    torch.manual_seed(0)
    b, h, n, d = 2, 3, 7, 4
    q, k, v = torch.randn(b, h, n, d) * 2, torch.randn(b, h, n, d), torch.randn(b, h, n, d)
    bias = torch.randn(1, h, n, n)
    mask = torch.ones(b, 1, n, n, dtype=torch.bool)
    mask[1, :, :, 5:] = False  # item 1: its last two keys are padding
    logits = (q @ k.transpose(-1, -2) + bias).double().numpy()
    logits = np.where(mask.numpy(), logits, -np.inf)
    want = adaptive_softmax(logits)  # the paper's function, row by row, float64
    out, weights = _attend(q, k, v, bias=bias, mask=mask, tau=ADAPTIVE)
    np.testing.assert_allclose(weights.numpy(), want, atol=2e-6)
    np.testing.assert_allclose(out.transpose(1, 2).numpy(), want.astype(np.float32) @ v.numpy(), atol=1e-5)
    assert (weights[1, :, :, 5:] == 0).all()
    # the rows differ in entropy, so in beta: one tau for all of them would not give these weights
    p = torch.softmax(torch.from_numpy(logits), -1)
    ent = -(p * torch.log(p + 1e-9)).sum(-1)
    betas = adaptive_beta(ent.numpy())
    assert len(np.unique(betas.round(6))) > 5


def test_low_entropy_rows_are_left_alone():
    q = torch.tensor([[[[30.0]]]])
    k = torch.tensor([[[[0.0], [1.0], [0.0]]]])
    v = torch.eye(3).view(1, 1, 3, 3)
    out, _ = _attend(q, k, v, tau=ADAPTIVE)
    plain, _ = _attend(q, k, v)
    assert torch.equal(out, plain)


def test_it_touches_only_the_targeted_attentions():
    q, k, v = torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 3)
    plain, _ = _attend(q, k, v)
    off, _ = _attend(q, k, v, tau=ADAPTIVE, targets=("decoder",))
    assert torch.equal(off, plain)
    # a decoder or cross attention under it (targets beyond the paper's encoder) takes its beta too
    dec, _ = _attend_as(_Decoderish(), q, k, v, tau=ADAPTIVE, targets=("encoder", "decoder", "cross"))
    not_dec, _ = _attend_as(_Decoderish(), q, k, v, tau=ADAPTIVE)
    assert not torch.equal(dec, not_dec) and torch.equal(not_dec, _attend_as(_Decoderish(), q, k, v)[0])


class _Decoderish(torch.nn.Module):
    """A cross-attention as the attention function tells kinds apart (``is_decoder``, not causal)."""

    is_decoder, is_causal = True, False


def _attend_as(module, q, k, v, **settings):
    with torch.no_grad(), attention_call(Choice.of(**settings)):
        return aligned_attention(module, q, k, v, None, scaling=1.0, output_attentions=True)


def test_every_other_backend_declines_it():
    q, k, v = torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 3)
    x = softmax_block.Inputs(q, k, v)
    assert softmax_block.choose_backend(x) != softmax_block.TORCH  # sdpa or the C++ kernel serve the plain call
    y = softmax_block.Inputs(q, k, v, adaptive=True)
    assert softmax_block.choose_backend(y) == softmax_block.TORCH
    assert not softmax_block.cuda_serves(y)


# -- a real small model -------------------------------------------------------------------------------------------


def test_a_real_model_pass_matches_an_independent_reference(tiny):
    AttentionInterface.register(REF, adaptive_reference)
    AttentionMaskInterface.register(REF, sdpa_mask)
    model = tiny.model
    ids = torch.tensor([list(range(4, 300))])  # 296 tokens: past L_tr = 256, so rows are dispersed
    encoder = model.get_encoder()
    with torch.no_grad():
        before = attention.point(model, REF)
        try:
            want = encoder(input_ids=ids).last_hidden_state
        finally:
            attention.point_back(before)
        plain = encoder(input_ids=ids).last_hidden_state
        with attention_call(Choice.of(tau=ADAPTIVE)):
            got = encoder(input_ids=ids).last_hidden_state
        rec = Recorder(ProbeSpec(heatmap=False, sorted_logits=False, cosine_hist_bins=0))
        with attention_call(TRAINED, None, rec):
            encoder(input_ids=ids)
        rec_a = Recorder(ProbeSpec(heatmap=False, sorted_logits=False, cosine_hist_bins=0))
        with attention_call(Choice.of(tau=ADAPTIVE), None, rec_a):
            encoder(input_ids=ids)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=2e-4)
    assert (got - plain).abs().max() > 1e-2  # adaptive temperature changed the pass
    one, ada = rec.finish(), rec_a.finish()
    assert ada.pmax[0].mean() > one.pmax[0].mean() and ada.entropy[0].mean() < one.entropy[0].mean()
