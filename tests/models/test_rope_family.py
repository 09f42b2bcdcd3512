"""The rotary family (ModernBERT masked-LM) through our attention: loading, equality with transformers' own
attention, tau, CosScale, probes, core.runs.apply and a measured method, each against transformers or a hand
computation (never against our own output)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import ModernBertForMaskedLM

from conftest import build_tiny_rope
from core.data import tasks
from core.errors import ModelLoadError, UserError
from core.mechanics.attention import attention_call, attention_modules
from core.mechanics.probes import ProbeSpec, Recorder
from core.mechanics.run_pass import Pass
from core.models import load
from core.runs import apply as ap
from core.runs import engine, methods
from core.values.choice import TRAINED, Choice

L_TR = 64


@pytest.fixture(scope="module")
def rope_dir(tmp_path_factory):
    return build_tiny_rope(tmp_path_factory.mktemp("tiny-rope"), train_length=L_TR)


@pytest.fixture(scope="module")
def rope(rope_dir):
    return load(str(rope_dir), device="cpu")


@pytest.fixture(scope="module")
def cos_dir(tmp_path_factory):
    return build_tiny_rope(tmp_path_factory.mktemp("tiny-rope-cos"), cosine=16.0, seed=1)


def _reference(folder, impl: str = "sdpa", q_scale: float = 1.0) -> ModernBertForMaskedLM:
    """transformers' own model from the same weights; ``q_scale`` multiplies W_q (tau = 1 / q_scale, by hand)."""
    ref = ModernBertForMaskedLM.from_pretrained(str(folder), attn_implementation=impl).eval()
    hidden = ref.config.hidden_size
    with torch.no_grad():
        for layer in ref.model.layers:
            layer.attn.Wqkv.weight[:hidden].mul_(q_scale)
    return ref


def _batch(n: int = 80, pad_from: int = 50, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 2048, (2, n), generator=g)
    mask = torch.ones_like(ids)
    mask[1, pad_from:] = 0
    ids[1, pad_from:] = 0
    return ids, mask


def test_load_folder_describes_the_family(rope):
    assert rope.family == "rope" and not rope.seq2seq and not rope.language_model and not rope.cosine
    assert (rope.train_length, rope.n_layers, rope.n_heads, rope.d_kv) == (L_TR, 2, 4, 16)
    assert rope.model.config._attn_implementation == "aligned"
    assert all(t == "full_attention" for t in rope.config.layer_types)
    assert rope.describe()["family"] == "rope" and rope.describe()["d_kv"] == 16
    assert len(attention_modules(rope.model)) == 2


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_equals_transformers_with_padding(rope, rope_dir, impl):
    ref = _reference(rope_dir, impl)
    ids, mask = _batch()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        fused = rope.model(input_ids=ids, attention_mask=mask).logits  # no call: tau = 1, fused path
        rec = Recorder(ProbeSpec.stats_only(), mask.bool())
        with attention_call(Choice.of(tau=1.0), None, rec):  # probed, blocked path
            probed = rope.model(input_ids=ids, attention_mask=mask).logits
        with attention_call(Choice.of(tau=1.0), Pass(chunk_bytes=20_000)):  # 7 query rows a block
            blocked = rope.model(input_ids=ids, attention_mask=mask).logits
        alone = rope.model(input_ids=ids[1:, :50]).logits  # the padded item on its own: no mask, one fused call
    real = mask.bool()
    for got in (fused, probed, blocked):
        assert torch.allclose(got[real], want[real], atol=1e-5), (got[real] - want[real]).abs().max()
    # the padding mask arrived: the padded item's real tokens read as if alone (it would differ otherwise)
    assert torch.allclose(fused[1, :50], alone[0], atol=1e-5)


def test_sliding_window_layers_equal_transformers(tmp_path):
    """A hub-style ModernBERT (global attention every 2nd layer, a 16-token window): the window reaches our attention
    in the mask our mask function builds."""
    folder = build_tiny_rope(tmp_path, global_every=2, seed=3)
    model = load(str(folder), device="cpu").model
    assert model.config.layer_types[1] == "sliding_attention"
    ref = _reference(folder)
    ids, mask = _batch(n=64, pad_from=40, seed=2)
    with torch.no_grad():
        want, got = ref(input_ids=ids, attention_mask=mask).logits, model(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(got[mask.bool()], want[mask.bool()], atol=1e-5)


@pytest.mark.parametrize("tau", [0.5, 1.6])
def test_tau_equals_scaled_queries(rope, rope_dir, tau):
    """softmax(q.k * scaling / tau): transformers' model with W_q / tau (rotary is linear in q) is the hand check."""
    ref = _reference(rope_dir, q_scale=1.0 / tau)
    ids, mask = _batch(seed=4)
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        plain = rope.model(input_ids=ids, attention_mask=mask).logits
        with attention_call(Choice.of(tau=tau)):
            got = rope.model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert torch.allclose(got[real], want[real], atol=1e-5), (got - want)[real].abs().max()
    assert (got - plain)[real].abs().max() > 1e-3  # tau moved the logits by far more than the tolerance


def _eager_weights(folder, ids, mask) -> tuple[torch.Tensor, ...]:
    ref = _reference(folder, "eager")
    with torch.no_grad():
        return ref(input_ids=ids, attention_mask=mask, output_attentions=True).attentions


def test_probes_equal_eager_weights(rope, rope_dir):
    """Pmax, entropy, map and profile from the engine's pass equal the same numbers computed from transformers'
    eager attention weights (one document, 64 tokens: the map is not pooled)."""
    doc = tasks.make(tasks.LM, rope.tokenizer, L_TR, seed=5)
    spec = ProbeSpec(
        stats=True, heatmap=True, heatmap_layer=1, profile_rows=(10, 20), sorted_logits=False, cosine_hist_bins=0
    )
    res = engine.run(rope, doc, TRAINED, engine.Pass(probes=spec, generate=False))
    ids = torch.tensor([rope.tokenizer(doc.text).input_ids])
    weights = _eager_weights(rope_dir, ids, torch.ones_like(ids))  # per layer [1, heads, L, L]
    w = torch.stack([a[0] for a in weights]).double()  # [layers, heads, L, L]
    pmax = w.amax(-1).mean(-1)
    ent = -(w * torch.log(w.clamp_min(1e-30))).sum(-1).mean(-1)
    assert res.tokens == L_TR and res.answer == "" and res.correct is None
    np.testing.assert_allclose(res.probes.pmax[0], pmax.numpy(), atol=1e-5)
    np.testing.assert_allclose(res.probes.entropy[0], ent.numpy(), atol=1e-4)
    np.testing.assert_allclose(res.probes.heatmap_mean, w[1].mean(0).numpy(), atol=1e-5)
    np.testing.assert_allclose(res.probes.profile, w.mean(1)[:, 10:20].mean(1).numpy(), atol=1e-5)


def test_tau_below_one_sharpens(rope):
    doc = tasks.make(tasks.LM, rope.tokenizer, 2 * L_TR, seed=1)
    stats = ProbeSpec.stats_only()
    one = engine.run(rope, doc, Choice.of(tau=1.0), engine.Pass(probes=stats, generate=False))
    sharp = engine.run(rope, doc, Choice.of(tau=0.6), engine.Pass(probes=stats, generate=False))
    assert (sharp.probes.layer_pmax > one.probes.layer_pmax).all()
    assert (sharp.probes.layer_entropy < one.probes.layer_entropy).all()


def _hand_cosine_layer0(model: ModernBertForMaskedLM, ids: torch.Tensor, s: float, tau: float = 1.0) -> torch.Tensor:
    """Layer 0's attention output by hand: softmax(s * cos(Rq, Rk) / tau) @ v, then W_o (no 1/sqrt(d) on top)."""
    from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

    m = model.model
    x = m.embeddings(input_ids=ids)  # layer 0's attn_norm is the identity
    n, heads = ids.shape[1], model.config.num_attention_heads
    qkv = m.layers[0].attn.Wqkv(x).view(1, n, 3, heads, -1)
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
    cos, sin = m.rotary_emb(x, torch.arange(n)[None], "full_attention")
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    p = torch.exp(s * q @ k.transpose(-1, -2) / tau)
    out = (p / p.sum(-1, keepdim=True)) @ v
    return m.layers[0].attn.Wo(out.transpose(1, 2).reshape(1, n, -1))


@pytest.mark.parametrize("s, tau", [(None, 1.0), (40.0, 1.0), (40.0, 0.7)])
def test_cosine_layer_equals_hand_computation(cos_dir, s, tau):
    loaded = load(str(cos_dir), device="cpu")
    assert loaded.cosine and loaded.cosine_scale == 16.0
    ids = torch.tensor([loaded.tokenizer(tasks.make(tasks.LM, loaded.tokenizer, 48, seed=2).text).input_ids])
    seen = []
    hook = loaded.model.model.layers[0].attn.register_forward_hook(lambda mod, args, out: seen.append(out[0]))
    try:
        with torch.no_grad(), attention_call(Choice.of(tau=tau, cosine_scale=s)):
            loaded.model(input_ids=ids)
            want = _hand_cosine_layer0(loaded.model, ids, s or 16.0, tau)
    finally:
        hook.remove()
    assert torch.allclose(seen[0], want, atol=1e-5), (seen[0] - want).abs().max()


def test_refuses_a_pickle_only_folder(rope, tmp_path):
    rope.model.config.save_pretrained(tmp_path)
    torch.save(rope.model.state_dict(), tmp_path / "pytorch_model.bin")
    rope.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="safetensors"):
        load(str(tmp_path), device="cpu")


def test_refuses_a_config_that_does_not_fit(rope_dir, tmp_path):
    import shutil

    folder = tmp_path / "more-layers"
    shutil.copytree(rope_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(num_hidden_layers=3, layer_types=None)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="declares 3 encoder layers"):
        load(str(folder), device="cpu")


def test_refuses_a_tokenizer_without_mask_token(tmp_path):
    folder = build_tiny_rope(tmp_path, seed=2)
    tok = json.loads((folder / "tokenizer_config.json").read_text())
    tok.pop("mask_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    with pytest.raises(ModelLoadError, match="no mask token"):
        load(str(folder), device="cpu")


def test_folder_without_card_takes_max_positions(tmp_path):
    folder = build_tiny_rope(tmp_path, card=False, seed=4)
    assert load(str(folder), device="cpu").train_length == 8192


def test_apply_on_a_users_modernbert(rope_dir):
    """core.runs.apply on a ModernBERT the user loaded with sdpa: tau in the block (checked against scaled queries),
    sdpa restored after, decoder targets refused."""
    model = _reference(rope_dir)
    ids, mask = _batch(seed=6)
    want = _reference(rope_dir, q_scale=1 / 0.5)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
        hand = want(input_ids=ids, attention_mask=mask).logits
        with ap.apply(model, tau=0.5):
            got = model(input_ids=ids, attention_mask=mask).logits
            assert model.config._attn_implementation == "aligned"
        assert model.config._attn_implementation == "sdpa"
        ap.install(model, tau=0.5)
        installed = model(input_ids=ids, attention_mask=mask).logits
        ap.uninstall(model)
        after = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert torch.allclose(got[real], hand[real], atol=1e-5) and torch.allclose(installed[real], hand[real], atol=1e-5)
    assert torch.equal(after, plain) and (got - plain)[real].abs().max() > 1e-3
    with pytest.raises(UserError, match="encoder self-attention only"):
        ap.apply(model, tau=0.5, targets=("decoder",))


def test_measured_method_resolves_on_the_rope_model(rope):
    doc = tasks.make(tasks.LM, rope.tokenizer, 4 * L_TR, seed=7)
    pmax = methods.ALGORITHM1["pmax"]
    tau, info = methods.resolve(rope, doc, pmax)
    assert tau.scalar is not None and tau.scalar < 1.0  # a longer input dilutes attention: Algorithm 1 sharpens it
    assert info["source"] == "resolved" and "reached" in info
    # the schedule it found does move Pmax toward the L_tr reference
    stats = ProbeSpec.stats_only()
    ref = engine.run(
        rope, tasks.make(tasks.LM, rope.tokenizer, L_TR, seed=7), TRAINED, engine.Pass(probes=stats, generate=False)
    )
    at1 = engine.run(rope, doc, TRAINED, engine.Pass(probes=stats, generate=False))
    at_tau = engine.run(rope, doc, Choice.of(tau=tau), engine.Pass(probes=stats, generate=False))
    assert abs(at_tau.pmax - ref.pmax) < abs(at1.pmax - ref.pmax)
