"""The lazy relative bias (core.mechanics.relative_bias): T5's bias as one vector per head, equal to transformers' own.

Checked against transformers' ``compute_bias`` (bidirectional and causal buckets, with a generation
step's past), against eager attention end to end (encoder, teacher-forced decoder, generation with a
cache, gradients), and for what it is for: a long pass never holds ``[heads, L, L]``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import T5Config, T5ForConditionalGeneration, UMT5Config, UMT5ForConditionalGeneration

from core.mechanics import patches, relative_bias
from core.mechanics.attention import attention_call
from core.mechanics.probes import ProbeSpec, Recorder
from core.mechanics.relative_bias import RelativeBias, bias_vector
from core.runs import apply as apply_mod
from core.values.choice import TRAINED


def _t5(attn: str = "aligned", seed: int = 0, layers: int = 2, heads: int = 4) -> T5ForConditionalGeneration:
    torch.manual_seed(seed)
    cfg = T5Config(
        vocab_size=120,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=layers,
        num_decoder_layers=2,
        num_heads=heads,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    cfg._attn_implementation = attn
    model = T5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for m in relative_bias.bias_owners(model):
            m.relative_attention_bias.weight.normal_(0, 2.0)
    return model


@pytest.fixture(scope="module")
def t5():
    return _t5()


@settings(max_examples=40, deadline=None)
@given(q=st.integers(1, 300), extra=st.integers(0, 40), past=st.integers(0, 50), decoder=st.booleans())
def test_vector_equals_compute_bias(t5, q, extra, past, decoder):
    """Every value of the dense bias, bidirectional (encoder) or causal (decoder, at a generation step's past)."""
    owners = relative_bias.bias_owners(t5)
    module = owners[1] if decoder else owners[0]
    assert module.is_decoder == decoder
    k = q + extra
    dense = module.compute_bias(q, k, past_seen_tokens=past)  # the fixture's model is not swapped
    lazy = RelativeBias(bias_vector(module, q, k, past), q, k)
    assert lazy.shape == dense.shape
    assert torch.equal(lazy.full(), dense)
    r0 = q // 3
    assert torch.equal(lazy[:, :, r0:q], dense[:, :, r0:q])


def test_rows_with_a_per_head_scale(t5):
    module = relative_bias.bias_owners(t5)[0]
    dense = module.compute_bias(70, 70)
    lazy = RelativeBias(bias_vector(module, 70, 70), 70, 70)
    scale = torch.tensor([0.5, 2.0, 1.0, 3.0]).view(4, 1)
    torch.testing.assert_close(lazy.rows(10, 40, scale=scale), dense[:, :, 10:40] * scale.view(1, 4, 1, 1))
    with pytest.raises(IndexError):
        lazy.rows(10, 71)


def test_umt5_buckets_come_from_the_module():
    """UMT5 keeps its bucket settings on the module and a table in every layer: each layer's vector is its own."""
    torch.manual_seed(1)
    cfg = UMT5Config(
        vocab_size=100,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=1,
        num_heads=2,
        relative_attention_num_buckets=16,
        relative_attention_max_distance=64,
        decoder_start_token_id=0,
    )
    model = UMT5ForConditionalGeneration(cfg).eval()
    owners = relative_bias.bias_owners(model)
    assert len(owners) == 3  # every layer's self-attention owns a table
    for m in owners:
        for q, k, past in [(9, 9, 0), (1, 12, 11), (40, 40, 0)]:
            assert torch.equal(
                RelativeBias(bias_vector(m, q, k, past), q, k).full(), m.compute_bias(q, k, past_seen_tokens=past)
            )


def test_install_hands_out_the_vector_only_to_our_attention():
    model = _t5()
    done = patches.patch(model)
    assert len(done.classes) == 2 and done.kinds == {"lazy-bias"} and relative_bias.installed(model)
    assert not patches.patch(model).changed  # idempotent
    enc = relative_bias.bias_owners(model)[0]
    assert isinstance(enc.compute_bias(5, 5), RelativeBias)
    model.config._attn_implementation_internal = "eager"
    for cfg in (model.encoder.config, model.decoder.config):
        cfg._attn_implementation_internal = "eager"
    assert isinstance(enc.compute_bias(5, 5), torch.Tensor)  # eager gets transformers' dense tensor
    keys = set(model.state_dict())
    done.undo()
    assert not relative_bias.installed(model)
    assert type(enc).__name__ == "T5Attention" and set(model.state_dict()) == keys


def test_forward_generation_and_gradients_equal_eager():
    """Encoder, decoder (causal buckets), generation with a cache, and the gradient of the bias table."""
    eager, ours = _t5("eager", seed=3), _t5("aligned", seed=3)
    ours.load_state_dict(eager.state_dict())
    patches.patch(ours)
    ids = torch.randint(2, 120, (2, 90))
    ids[1, 70:] = 0
    mask = (ids != 0).long()
    dec = torch.randint(2, 120, (2, 7))
    with torch.no_grad():
        a = eager(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        b = ours(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
        ga = eager.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
        gb = ours.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert torch.equal(ga, gb)
    for m in (eager, ours):
        m.train()
        m.zero_grad()
        m(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, labels=dec).loss.backward()
    for name in (
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
    ):
        torch.testing.assert_close(ours.get_parameter(name).grad, eager.get_parameter(name).grad, atol=1e-5, rtol=1e-4)


def test_a_probe_wanting_whole_logits_gets_them():
    """``encoder.0.logits`` is q.k + the dense bias, though the pass only ever had the vector."""
    t5 = _t5(seed=4)
    module = relative_bias.bias_owners(t5)[0]
    dense = module.compute_bias(40, 40)
    patches.patch(t5)
    assert isinstance(module.compute_bias(40, 40), RelativeBias)
    ids = torch.randint(2, 120, (1, 40))
    rec = Recorder(ProbeSpec.of("encoder.0.logits"))
    captured = {}
    att = t5.encoder.block[0].layer[0].SelfAttention
    hook = att.q.register_forward_hook(lambda m, i, o: captured.setdefault("q", o))
    hook_k = att.k.register_forward_hook(lambda m, i, o: captured.setdefault("k", o))
    with torch.no_grad(), attention_call(TRAINED, None, rec):
        t5.encoder(input_ids=ids)
    hook.remove()
    hook_k.remove()
    z = rec.finish()["encoder.0.logits"]
    q = captured["q"].view(1, 40, 4, 8).transpose(1, 2)
    k = captured["k"].view(1, 40, 4, 8).transpose(1, 2)
    torch.testing.assert_close(z, q @ k.transpose(-1, -2) + dense, atol=1e-4, rtol=1e-5)


def test_apply_puts_it_in_and_takes_it_out():
    """A user's eager model: apply() swaps the lazy bias in for its block and restores the class after."""
    model = _t5("eager", seed=5)
    ids = torch.randint(2, 120, (1, 50))
    with torch.no_grad():
        want = model(input_ids=ids, decoder_input_ids=ids[:, :4]).logits
        with apply_mod.apply(model, tau=1.0):
            assert relative_bias.installed(model)
            got = model(input_ids=ids, decoder_input_ids=ids[:, :4]).logits
    assert not relative_bias.installed(model)
    assert type(model.encoder.block[0].layer[0].SelfAttention).__name__ == "T5Attention"
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_a_long_pass_never_holds_the_dense_bias(tmp_path):
    """8,192 tokens, 8 heads: the dense bias alone is 2 GiB of float32 (plus int64 buckets on the way);
    the whole probed pass, model and process included, stays far below it."""
    code = textwrap.dedent("""
        import resource, torch
        from transformers import T5Config, T5ForConditionalGeneration
        from core.mechanics import attention, patches
        from core.mechanics.probes import ProbeSpec, Recorder
        from core.values.choice import Choice
        torch.manual_seed(0)
        cfg = T5Config(vocab_size=100, d_model=32, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1,
                       num_heads=8, decoder_start_token_id=0)
        cfg._attn_implementation = "aligned"
        m = T5ForConditionalGeneration(cfg).eval()
        patches.patch(m)
        L = 8192
        ids = torch.randint(2, 100, (1, L))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with torch.no_grad(), attention.attention_call(Choice.of(tau=0.7), None,
                                                       Recorder(ProbeSpec(), torch.ones(1, L, dtype=torch.bool))):
            m.encoder(input_ids=ids)
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    grew = int(out.stdout.strip().splitlines()[-1])
    assert grew < 2**30 // 4, f"the pass grew the process by {grew / 2**20:.0f} MiB"
