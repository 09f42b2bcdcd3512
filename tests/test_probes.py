"""Probes: padding is ignored, heatmaps pool correctly, the profile and sorted logits are right."""

from __future__ import annotations

import numpy as np
import torch

from core.attention import AttentionSettings, attention_call
from core.probes import ProbeSpec, Recorder, pool_edges


def _record(model, ids, mask, spec, tau=1.0):
    rec = Recorder(spec, mask.bool())
    with torch.no_grad(), attention_call(AttentionSettings(tau=tau), rec):
        model.get_encoder()(input_ids=ids, attention_mask=mask)
    return rec.finish()


def test_padding_is_ignored(tiny):
    g = torch.Generator().manual_seed(11)
    a = torch.randint(3, 300, (1, 40), generator=g)
    b = torch.randint(3, 300, (1, 55), generator=g)
    alone_a = _record(tiny.model, a, torch.ones_like(a), ProbeSpec(), 0.8)
    alone_b = _record(tiny.model, b, torch.ones_like(b), ProbeSpec(), 0.8)
    ids = torch.zeros(2, 55, dtype=torch.long)
    ids[0, :40], ids[1] = a[0], b[0]
    mask = torch.zeros_like(ids)
    mask[0, :40], mask[1] = 1, 1
    both = _record(tiny.model, ids, mask, ProbeSpec(), 0.8)
    np.testing.assert_allclose(both.pmax[0], alone_a.pmax[0], atol=1e-5)
    np.testing.assert_allclose(both.entropy[0], alone_a.entropy[0], atol=1e-5)
    np.testing.assert_allclose(both.pmax[1], alone_b.pmax[0], atol=1e-5)
    assert list(both.rows) == [40, 55]
    # item 0's views only see its 40 real tokens
    assert both.heatmap_mean.shape == (40, 40)
    np.testing.assert_allclose(both.heatmap_mean, alone_a.heatmap_mean, atol=1e-6)
    np.testing.assert_allclose(both.sorted_logits, alone_a.sorted_logits, atol=1e-4)


def test_heatmap_shapes_and_sums(tiny):
    n = 700
    ids = torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    for head in (None, 2):
        r = _record(tiny.model, ids, mask, ProbeSpec(heatmap_layer=1, heatmap_head=head, heatmap_size=512))
        assert r.heatmap_mean.shape == (512, 512) and r.heatmap_max.shape == (512, 512)
        edges = r.heatmap_edges
        assert edges[0] == 0 and edges[-1] == n and len(edges) == 513
        sizes = np.diff(edges)
        # each attention row sums to 1, so mass per row-bin (mean x cells) = 1 per row
        row_mass = (r.heatmap_mean * sizes[None, :]).sum(1)
        np.testing.assert_allclose(row_mass, 1.0, atol=1e-4)
        assert (r.heatmap_max >= r.heatmap_mean - 1e-7).all()
        assert r.heatmap_max.max() <= 1.0 + 1e-6
    small = _record(tiny.model, ids[:, :100], mask[:, :100], ProbeSpec(heatmap_size=64))
    assert small.heatmap_mean.shape == (64, 64)


def test_pool_edges_cover_all_positions():
    for n, b in [(10, 512), (513, 512), (16000, 512), (7, 3)]:
        e = pool_edges(n, b)
        assert e[0] == 0 and e[-1] == n and (np.diff(e) >= 1).all() and len(e) - 1 == min(n, b)


def test_profile_and_sorted_logits(tiny):
    n = 80
    ids = torch.randint(3, 300, (1, n), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    r = _record(tiny.model, ids, mask, ProbeSpec(profile_rows=(70, 80)))
    assert r.profile.shape == (2, n)
    np.testing.assert_allclose(r.profile.sum(1), 1.0, atol=1e-5)  # a mean of attention rows
    v = r.sorted_logits
    assert v.shape == (n,) and (np.diff(v) <= 1e-5).all()  # descending
    assert abs(r.sigma - v.std()) < 1e-9 and abs(r.l_max - v[0]) < 1e-9
    # independent computation of layer 0's logits: q.k + bias, sorted per row, averaged
    attn = tiny.model.encoder.block[0].layer[0].SelfAttention
    with torch.no_grad():
        h = tiny.model.encoder.embed_tokens(ids)
        h = tiny.model.encoder.block[0].layer[0].layer_norm(h)
        q = attn.q(h).view(1, n, 4, -1).transpose(1, 2)
        k = attn.k(h).view(1, n, 4, -1).transpose(1, 2)
        z = q @ k.transpose(-1, -2) + attn.compute_bias(n, n)
    want = z.sort(-1, descending=True).values.mean(dim=(0, 1, 2)).numpy()
    np.testing.assert_allclose(v, want, rtol=1e-4, atol=1e-4)


def test_fast_pmax_entropy_match_the_definitions():
    """The attention hands the probes (row max, normaliser); both routes give the same Pmax and H."""
    g = torch.Generator().manual_seed(5)
    scores = torch.randn(2, 3, 7, 40, generator=g) * 3
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 30:] = False
    scores[1, :, :, 30:] = torch.finfo(torch.float32).min
    top = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - top)
    total = e.sum(-1, keepdim=True)
    probs = e / total
    recs = []
    for norm in (None, (top.squeeze(-1), total.squeeze(-1))):
        rec = Recorder(ProbeSpec.stats_only(), torch.ones(2, 7, dtype=torch.bool))
        rec.observe(0, 0, 7, scores, scores, probs, norm)
        recs.append(rec.finish())
    np.testing.assert_allclose(recs[0].pmax, recs[1].pmax, rtol=1e-6)
    np.testing.assert_allclose(recs[0].entropy, recs[1].entropy, atol=2e-5)
    assert np.isfinite(recs[1].entropy).all()


def test_unnormalised_route_matches_the_definitions():
    """observe_exp (what the attention calls: exp(s - max) and its row sums, never p) gives the same Pmax, H,
    heatmap and profile as the definitions on normalised probabilities, padding included."""
    g = torch.Generator().manual_seed(7)
    n = 40
    scores = torch.randn(2, 3, n, n, generator=g) * 4
    scores[1, :, :, 30:] = torch.finfo(torch.float32).min
    probs = torch.softmax(scores, -1)
    shifted = (scores - scores.amax(-1, keepdim=True)).clamp(min=-87.0)
    e = torch.exp(shifted)
    total = e.sum(-1, keepdim=True)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, 30:] = False
    spec = ProbeSpec(heatmap_size=8, profile_rows=(33, 38), sorted_logits=False, cosine_hist_bins=0)
    a, b = Recorder(spec, mask), Recorder(spec, mask)
    for r0 in range(0, n, 16):  # blocks of rows, as the attention hands them over
        r1 = min(n, r0 + 16)
        a.observe(0, r0, r1, scores[:, :, r0:r1], scores[:, :, r0:r1], probs[:, :, r0:r1])
        b.observe_exp(0, r0, r1, None, shifted[:, :, r0:r1], e[:, :, r0:r1], total[:, :, r0:r1])
    ra, rb = a.finish(), b.finish()
    np.testing.assert_allclose(ra.pmax, rb.pmax, rtol=1e-5)
    np.testing.assert_allclose(ra.entropy, rb.entropy, atol=1e-4)
    np.testing.assert_allclose(ra.heatmap_mean, rb.heatmap_mean, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ra.profile, rb.profile, rtol=1e-5, atol=1e-7)
    # the question's rows of the map: one row per question token, keys pooled like the map
    assert list(rb.question_rows) == list(range(33, 38))
    want = probs[0, :, 33:38].mean(0)
    edges = rb.heatmap_edges
    pooled = np.stack([want[:, s:t].mean(-1).numpy() for s, t in zip(edges[:-1], edges[1:])], 1)
    np.testing.assert_allclose(rb.question_map_mean, pooled, rtol=1e-5, atol=1e-7)


def test_probed_attention_far_keys_do_not_change_the_numbers():
    """Clamping exponents at EXP_FLOOR (the CPU's exp is slow below it) changes no statistic float32 can show."""
    from core.attention import EXP_FLOOR

    g = torch.Generator().manual_seed(11)
    scores = torch.randn(1, 2, 8, 300, generator=g) * 60  # many keys 100+ below each row's max
    top = scores.amax(-1, keepdim=True)
    exact = torch.softmax(scores.double(), -1)
    shifted = (scores - top).clamp(min=EXP_FLOOR)
    e = torch.exp(shifted)
    p = e / e.sum(-1, keepdim=True)
    assert (scores - top).min() < EXP_FLOOR  # the clamp was exercised
    np.testing.assert_allclose(p.double().numpy(), exact.numpy(), atol=1e-30, rtol=1e-5)
