"""Probes: padding is ignored, heatmaps pool correctly, the profile and sorted logits are right."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.mechanics.attention import attention_call
from core.mechanics.probes import ProbeSpec, Recorder, pool_edges
from core.mechanics.softmax_block import EXP_FLOOR, Block
from core.values.choice import TRAINED, Choice


def _record(model, ids, mask, spec, tau=1.0):
    rec = Recorder(spec, mask.bool())
    with torch.no_grad(), attention_call(Choice.of(tau=tau), None, rec):
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


def _exp_block(r0, r1, scores, dot=True):
    """A Block as the torch backend makes it from scores: exp(s - max) clamped at EXP_FLOOR, its row sums,
    and (``dot``) sum(exp * shifted)."""
    shifted = (scores - scores.amax(-1, keepdim=True)).clamp(min=EXP_FLOOR)
    e = torch.exp(shifted)
    d = torch.einsum("bhck,bhck->bhc", e, shifted).unsqueeze(-1) if dot else None
    return Block(r0, r1, exp=e, total=e.sum(-1, keepdim=True), dot=d)


@pytest.mark.parametrize("dot", [True, False], ids=["dot", "no-dot"])
def test_fast_pmax_entropy_match_the_definitions(dot):
    """A Block of exp and row sums (Pmax = 1 / total, H = log total - dot / total; without dot, from exp / total)
    gives the Pmax and H of the definitions on a Block of normalised probabilities, padded keys included."""
    g = torch.Generator().manual_seed(5)
    scores = torch.randn(2, 3, 7, 40, generator=g) * 3
    scores[1, :, :, 30:] = torch.finfo(torch.float32).min
    probs = torch.softmax(scores, -1)
    recs = []
    for block in (Block(0, 7, probs=probs), _exp_block(0, 7, scores, dot)):
        rec = Recorder(ProbeSpec.stats_only(), torch.ones(2, 7, dtype=torch.bool))
        rec.observe(0, block)
        recs.append(rec.finish())
    np.testing.assert_allclose(recs[0].pmax, recs[1].pmax, rtol=1e-6)
    np.testing.assert_allclose(recs[0].entropy, recs[1].entropy, atol=2e-5)
    assert np.isfinite(recs[1].entropy).all()


def test_unnormalised_route_matches_the_definitions():
    """Blocks of exp(s - max) and row sums (what the backends hand over, never p) give the same Pmax, H, heatmap
    and profile as blocks of normalised probabilities, padding included."""
    g = torch.Generator().manual_seed(7)
    n = 40
    scores = torch.randn(2, 3, n, n, generator=g) * 4
    scores[1, :, :, 30:] = torch.finfo(torch.float32).min
    probs = torch.softmax(scores, -1)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, 30:] = False
    spec = ProbeSpec(heatmap_size=8, profile_rows=(33, 38), sorted_logits=False, cosine_hist_bins=0)
    a, b = Recorder(spec, mask), Recorder(spec, mask)
    for r0 in range(0, n, 16):  # blocks of rows, as the attention hands them over
        r1 = min(n, r0 + 16)
        a.observe(0, Block(r0, r1, probs=probs[:, :, r0:r1]))
        b.observe(0, _exp_block(r0, r1, scores[:, :, r0:r1]))
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
    g = torch.Generator().manual_seed(11)
    scores = torch.randn(1, 2, 8, 300, generator=g) * 60  # many keys 100+ below each row's max
    top = scores.amax(-1, keepdim=True)
    exact = torch.softmax(scores.double(), -1)
    shifted = (scores - top).clamp(min=EXP_FLOOR)
    e = torch.exp(shifted)
    p = e / e.sum(-1, keepdim=True)
    assert (scores - top).min() < EXP_FLOOR  # the clamp was exercised
    np.testing.assert_allclose(p.double().numpy(), exact.numpy(), atol=1e-30, rtol=1e-5)


# --------------------------------------------------------------------------- probes by name


def test_probe_names_parse_and_unknown_ones_are_refused():
    from core.errors import UserError
    from core.mechanics.probes import PROBES, ProbeName, parse

    assert parse("cross.*.map") == ProbeName("cross", None, "map")
    assert parse(" encoder.3.pmax ") == ProbeName("encoder", 3, "pmax")
    assert str(parse("decoder.*.logits")) == "decoder.*.logits"
    for bad in ("cros.*.map", "cross.x.map", "cross.1.pmaxx", "cross.1", "cross.-1.map", "cross.1.map.max", ""):
        with pytest.raises(UserError, match="kind.layer.probe") as err:
            parse(bad)
        assert all(p in str(err.value) for p in PROBES)  # the message lists the choices
    with pytest.raises(UserError, match="not defined for decoder"):
        parse("decoder.*.sorted_logits")  # decoder rows have as many keys as answer tokens so far
    with pytest.raises(ValueError):
        ProbeSpec(names=("encoder.*.pmax", "nonsense"))
    with pytest.raises(ValueError):
        ProbeSpec(names="cross.*.map")  # one string is not a list of names
    # canonical names: the same probes make equal, hashable specs (the app's cache keys)
    a = ProbeSpec(names=["cross.*.map", " cross.*.map", "decoder.0.pmax"])
    b = ProbeSpec(names=("decoder.0.pmax", "cross.*.map"))
    assert a == b and hash(a) == hash(b) and a.names == ("cross.*.map", "decoder.0.pmax")


def test_the_switches_stand_for_names():
    names = {str(p) for p in ProbeSpec(heatmap_layer=2, profile_rows=(3, 5)).probes}
    assert names == {
        "encoder.*.pmax",
        "encoder.*.entropy",
        "encoder.2.map",
        "encoder.*.profile",
        "encoder.0.sorted_logits",
        "encoder.0.cosine_hist",
    }
    assert {str(p) for p in ProbeSpec.stats_only().probes} == {"encoder.*.pmax", "encoder.*.entropy"}
    assert not ProbeSpec.off().wanted and ProbeSpec.of("cross.1.map").wanted
    assert ProbeSpec.of("cross.1.map").asks("decoder", "cross") and not ProbeSpec().asks("decoder", "cross")


def test_encoder_probes_by_name_equal_the_switches(tiny):
    g = torch.Generator().manual_seed(12)
    ids = torch.randint(3, 300, (2, 70), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 50:] = 0
    old = _record(tiny.model, ids, mask, ProbeSpec(heatmap_layer=1, heatmap_size=32, profile_rows=(60, 70)), 0.7)
    new = _record(
        tiny.model,
        ids,
        mask,
        ProbeSpec.of(
            "encoder.*.pmax",
            "encoder.*.entropy",
            "encoder.1.map",
            "encoder.*.profile",
            "encoder.0.sorted_logits",
            heatmap_size=32,
            profile_rows=(60, 70),
        ),
        0.7,
    )
    for f in ("pmax", "entropy", "profile", "sorted_logits"):
        np.testing.assert_array_equal(getattr(new, f), getattr(old, f))
    np.testing.assert_array_equal(new["encoder.1.map"], old.heatmap_mean)
    np.testing.assert_array_equal(new["encoder.*.pmax"], old.pmax.transpose(1, 0, 2))  # [layers, batch, heads]
    np.testing.assert_array_equal(new["encoder.0.entropy"], old.entropy[:, 0])
    np.testing.assert_array_equal(new["encoder.1.profile"], old.profile[1])
    # only what was asked is in the record, and a name that was not recorded says what was
    assert "encoder.0.map" not in new.named and "encoder.0.cosine_hist" not in new.named
    with pytest.raises(KeyError, match="encoder.0.pmax"):
        new["cross.0.map"]
    # one map by name, nothing else: the other layer runs the fused kernel and records nothing
    rec = Recorder(ProbeSpec.of("encoder.1.map", heatmap_size=32), mask.bool())
    assert rec.asked("encoder", 0) == frozenset() and rec.asked("encoder", 1) == {"map"}
    only = _record(tiny.model, ids, mask, ProbeSpec.of("encoder.1.map", heatmap_size=32), 0.7)
    assert list(only.named) == ["encoder.1.map"] and only.pmax.size == 0
    np.testing.assert_allclose(only["encoder.1.map"], old.heatmap_mean, atol=1e-6)


def _eager_and_ours(tmp_path, names, heatmap_size=4096):
    """A tiny T5 with two decoder layers, run teacher-forced by transformers' eager attention
    (output_attentions) and by ours with a recorder asking for ``names``."""
    from transformers import T5ForConditionalGeneration

    from conftest import build_tiny_t5
    from core.models import load

    path = build_tiny_t5(tmp_path / "m", decoder_layers=2)
    ours = load(str(path), device="cpu")
    eager = T5ForConditionalGeneration.from_pretrained(str(path), attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, 300, (2, 50), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 38:] = 0
    dec = torch.tensor([[0, 5, 7, 9, 4], [0, 11, 13, 2, 6]])
    with torch.no_grad():
        want = eager(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, output_attentions=True)
        rec = Recorder(ProbeSpec.of(*names, heatmap_size=heatmap_size), mask.bool())
        with attention_call(TRAINED, None, rec):
            ours.model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec)
    return ours, eager, rec.finish(), want, mask


def test_decoder_and_cross_probes_equal_eager_attention(tmp_path):
    names = [f"{k}.*.{p}" for k in ("decoder", "cross") for p in ("pmax", "entropy", "map", "profile", "logits")]
    _, _, got, want, mask = _eager_and_ours(tmp_path, names)
    n0 = 50  # item 0 is not padded
    for kind, probs in (("decoder", want.decoder_attentions), ("cross", want.cross_attentions)):
        assert sorted(got.layers(kind, "map")) == [0, 1]
        for layer, p in enumerate(probs):  # [batch, heads, answer tokens, keys]
            keys = n0 if kind == "cross" else p.shape[-1]
            ent = -torch.special.xlogy(p, p).sum(-1)
            np.testing.assert_allclose(got[f"{kind}.{layer}.pmax"], p.amax(-1).mean(-1).numpy(), rtol=1e-5)
            np.testing.assert_allclose(got[f"{kind}.{layer}.entropy"], ent.mean(-1).numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got[f"{kind}.{layer}.map"], p[0].mean(0)[:, :keys].numpy(), atol=1e-6)
            np.testing.assert_allclose(got[f"{kind}.{layer}.profile"], p[0].mean(0).mean(0)[:keys].numpy(), atol=1e-6)
            lg = got[f"{kind}.{layer}.logits"]  # raw, unmasked: masking them by hand gives the probabilities
            if kind == "cross":
                lg = lg.masked_fill(~mask.bool()[:, None, None, :], float("-inf"))
            else:
                lg = lg.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
            torch.testing.assert_close(lg.softmax(-1), p, atol=1e-6, rtol=1e-5)


def test_cross_map_rows_sum_to_one_before_pooling(tmp_path):
    got = _eager_and_ours(tmp_path, ["cross.*.map"], heatmap_size=8)[2]
    edges = got.heatmap_edges
    assert len(edges) == 9 and edges[-1] == 50
    for layer in (0, 1):
        m = got[f"cross.{layer}.map"]  # [answer tokens, bins]: the mean probability per pooled key bin
        assert m.shape == (5, 8)
        np.testing.assert_allclose((m * np.diff(edges)).sum(-1), 1.0, atol=1e-5)
    assert got["cross.*.map"].shape == (2, 5, 8)


def test_generation_appends_one_answer_row_per_step(tmp_path):
    """engine.run generates token by token with a key/value cache: the recorded decoder and cross maps
    must equal what transformers' eager generate reports step by step."""
    from core.data import tasks
    from core.runs import engine

    ours, eager = _eager_and_ours(tmp_path, ["cross.*.map"])[:2]
    doc = tasks.make("passkey", ours.tokenizer, 300, depth=0.5, seed=1)
    spec = ProbeSpec(heatmap_size=4096, names=("cross.*.map", "decoder.*.map", "cross.*.pmax"))
    res = engine.run(ours, doc, TRAINED, engine.Pass(probes=spec, max_new_tokens=5))
    ids = torch.from_numpy(engine.encode(ours, doc).input_ids)[None]
    with torch.no_grad():
        out = eager.generate(
            input_ids=ids,
            max_new_tokens=5,
            do_sample=False,
            num_beams=1,
            output_attentions=True,
            return_dict_in_generate=True,
        )
    steps = len(out.cross_attentions)
    assert len(res.answer_tokens) == steps == out.sequences.shape[1] - 1
    for layer in (0, 1):
        cross = torch.cat([s[layer][0].mean(0) for s in out.cross_attentions])  # [steps, document tokens]
        np.testing.assert_allclose(res.probes[f"cross.{layer}.map"], cross.numpy(), atol=1e-6)
        dec = res.probes[f"decoder.{layer}.map"]
        for t, s in enumerate(out.decoder_attentions):
            row = s[layer][0].mean(0)[0]  # step t sees t + 1 keys
            np.testing.assert_allclose(dec[t, : t + 1], row.numpy(), atol=1e-6)
            assert not dec[t, t + 1 :].any()
        pmax = torch.stack([s[layer][0].amax(-1)[:, 0] for s in out.cross_attentions]).mean(0)
        np.testing.assert_allclose(res.probes[f"cross.{layer}.pmax"][0], pmax.numpy(), rtol=1e-5)
    assert res.probes.pmax.shape[1] == ours.n_layers  # the encoder's numbers are there as always


# --------------------------------------------------------------------------- the training tap


def _hooked_cross_logits(model):
    """The training tap as it was before probes had names (forward hooks on each cross-attention's q and k):
    the reference the named probe must equal."""
    from core.mechanics.attention import logit_operands

    q, k, hooks = {}, {}, []
    cfg = model.config
    cosine = float(cfg.cosine_scale) if getattr(cfg, "cosine_attention", False) else None
    first = model.decoder.block[0].layer[1].EncDecAttention
    heads, d_kv, scaling = first.n_heads, first.key_value_proj_dim, getattr(first, "scaling", 1.0)
    for i, block in enumerate(model.decoder.block):
        att = block.layer[1].EncDecAttention
        hooks.append(att.q.register_forward_hook(lambda m, a, out, i=i: q.__setitem__(i, out)))
        hooks.append(att.k.register_forward_hook(lambda m, a, out, i=i: k.__setitem__(i, out)))

    def logits():
        out = []
        for i in sorted(q):
            qi = q[i].view(*q[i].shape[:2], heads, d_kv).transpose(1, 2)
            ki = k[i].view(*k[i].shape[:2], heads, d_kv).transpose(1, 2)
            qi, ki = logit_operands(qi, ki, scaling, cosine)
            out.append(qi @ ki.transpose(-1, -2))
        return out

    return logits, hooks


@pytest.mark.parametrize("cosine", [None, 24.0], ids=["dot", "cosine"])
def test_training_tap_equals_the_hooked_tap(tmp_path, cosine):
    """CrossAttentionTap now asks a standing recorder for cross.*.logits: the same logits, the same
    needle-attention loss and the same gradients as the forward hooks it replaced, and the model's own
    loss is what it is untapped."""
    from conftest import build_tiny_t5
    from core.models import load
    from core.training import CrossAttentionTap, needle_attention_loss

    model = load(str(build_tiny_t5(tmp_path / "m", decoder_layers=2, cosine=cosine)), device="cpu").model
    model.train()
    g = torch.Generator().manual_seed(8)
    ids = torch.randint(3, 300, (3, 40), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 30:] = 0
    labels = torch.randint(3, 300, (3, 6), generator=g)
    labels[1, 4:] = -100
    needle = torch.zeros(3, 40, dtype=torch.bool)
    needle[:, 10:14] = True
    weight = torch.tensor([1.0, 0.5, 1.0])
    untapped = model(input_ids=ids, attention_mask=mask, labels=labels).loss

    old, hooks = _hooked_cross_logits(model)
    tap = CrossAttentionTap(model)
    try:
        lm = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        new_logits, old_logits = tap.logits(), old()
    finally:
        tap.remove()
        for h in hooks:
            h.remove()
    assert torch.equal(lm, untapped)
    assert len(new_logits) == len(old_logits) == 2
    for a, b in zip(new_logits, old_logits):
        assert a.shape == (3, 4, 6, 40) and a.requires_grad
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    losses = [needle_attention_loss(lg, mask.bool(), needle, weight, labels != -100) for lg in (new_logits, old_logits)]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=1e-7)
    params = [model.decoder.block[i].layer[1].EncDecAttention.q.weight for i in (0, 1)]
    grads = [torch.autograd.grad(l, params, retain_graph=True) for l in losses]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # read once per forward; taken off, the model records nothing more
    assert tap.logits() == []
    model(input_ids=ids, attention_mask=mask, labels=labels)
    assert tap.logits() == []
    assert not any("_aligned_installed_call" in m.__dict__ for m in model.modules())
