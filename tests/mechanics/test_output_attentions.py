"""``output_attentions=True`` under our attention: the weights BertViz draws (issue 37, point 4).

transformers 5 asks an attention function for its weights by passing ``output_attentions=True``
down with the forward's other kwargs, and a forward hook on each attention layer collects the
second value the function returns into ``encoder_attentions``, ``decoder_attentions`` and
``cross_attentions``. Our function used to return None there. These tests hold what comes back to
transformers' own eager attention on the same weights (never to our own code), so they fail if a
weight, a mask, the bias or the tau is wrong.

BertViz is not imported (it is not a dependency of the project): its ``head_view`` documents
(and its ``format_attention`` checks) a tuple or list with one tensor per layer, each
``[batch (must be 1), heads, L_query, L_key]``, squeezed and stacked to ``[layers, heads, Lq, Lk]``;
:func:`_bertviz_format` checks exactly that.
"""

from __future__ import annotations

import types

import pytest
import torch
from transformers import T5ForConditionalGeneration

from core.errors import UserError
from core.mechanics import attention
from core.mechanics.attention import attention_call
from core.mechanics.probes import ProbeSpec, Recorder
from core.runs.apply import apply
from core.values.choice import TRAINED

TEXT = "The keeper counted 4182 boats in the harbour that spring."
DECODER_IDS = torch.tensor([[0, 52, 48, 53, 54, 55]])  # teacher-forced answer tokens, start token first
KINDS = ("encoder_attentions", "decoder_attentions", "cross_attentions")


@pytest.fixture(scope="module")
def eager(tiny_dir):
    """The same saved weights as ``tiny``, run by transformers' eager attention (the reference)."""
    return T5ForConditionalGeneration.from_pretrained(str(tiny_dir), attn_implementation="eager").eval()


def _bertviz_format(weights, n_layers: int, heads: int, q_len: int, k_len: int) -> None:
    """What BertViz's head_view takes for one attention kind: one ``[1, heads, Lq, Lk]`` tensor per layer,
    stackable (after squeezing the batch) into ``[layers, heads, Lq, Lk]``; each row a distribution."""
    assert isinstance(weights, tuple) and len(weights) == n_layers
    for w in weights:
        assert isinstance(w, torch.Tensor) and w.dtype.is_floating_point
        assert tuple(w.shape) == (1, heads, q_len, k_len)
    stacked = torch.stack([w.squeeze(0) for w in weights])
    assert tuple(stacked.shape) == (n_layers, heads, q_len, k_len)
    torch.testing.assert_close(stacked.sum(-1), torch.ones(n_layers, heads, q_len), atol=1e-5, rtol=0)


def _enc(tiny, *texts):
    return tiny.tokenizer(list(texts), return_tensors="pt", padding=True)


def test_tau_one_equals_eager_in_bertviz_format(tiny, eager):
    """A model loaded by core.models.load (no call active: tau = 1) returns all three kinds, equal to eager."""
    enc = _enc(tiny, TEXT)
    with torch.no_grad():
        ours = tiny.model(**enc, decoder_input_ids=DECODER_IDS, output_attentions=True)
        want = eager(**enc, decoder_input_ids=DECODER_IDS, output_attentions=True)
    n, m = enc.input_ids.shape[1], DECODER_IDS.shape[1]
    cfg = tiny.model.config
    _bertviz_format(ours.encoder_attentions, cfg.num_layers, cfg.num_heads, n, n)
    _bertviz_format(ours.decoder_attentions, cfg.num_decoder_layers, cfg.num_heads, m, m)
    _bertviz_format(ours.cross_attentions, cfg.num_decoder_layers, cfg.num_heads, m, n)
    for kind in KINDS:
        for got, ref in zip(getattr(ours, kind), getattr(want, kind), strict=True):
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    # the decoder's self-attention is causal: nothing above the diagonal
    assert not ours.decoder_attentions[0][0].triu(1).any()
    torch.testing.assert_close(ours.logits, want.logits, atol=1e-5, rtol=1e-5)


def test_tau_half_is_softmax_of_eager_logits_over_tau(eager, tiny, monkeypatch):
    """Under apply(model, tau=0.5) the encoder weights are softmax(eager's own pre-softmax scores / 0.5):
    the bias is divided too, not only q.k. Eager's scores are taken from its own softmax call.

    Only layer 0 sees the same input at both taus (its input is the embeddings); a per-layer schedule
    [1, 0.5] leaves layer 0 alone, so layer 1 then sees eager's input and is checked the same way."""
    enc = _enc(tiny, TEXT)
    scores: list[torch.Tensor] = []
    softmax = torch.nn.functional.softmax

    def spy(x, *args, **kwargs):
        scores.append(x.detach().clone())
        return softmax(x, *args, **kwargs)

    with torch.no_grad():
        with monkeypatch.context() as mp:
            mp.setattr(torch.nn.functional, "softmax", spy)
            at_one = eager(**enc, decoder_input_ids=DECODER_IDS, output_attentions=True)
        with apply(eager, tau=0.5):  # switches this eager model to our attention for the block
            half = eager(**enc, decoder_input_ids=DECODER_IDS, output_attentions=True).encoder_attentions
        with apply(eager, schedule=[1.0, 0.5]):
            second = eager(**enc, decoder_input_ids=DECODER_IDS, output_attentions=True).encoder_attentions
    assert eager.config._attn_implementation == "eager"  # restored
    ones = at_one.encoder_attentions
    assert eager.config.num_layers == len(half) == len(second) == 2 and len(scores) >= 2  # encoder scores first
    for layer in (0, 1):
        torch.testing.assert_close(scores[layer].softmax(-1), ones[layer], atol=1e-6, rtol=0)  # the spy saw them
    torch.testing.assert_close(half[0], (scores[0] / 0.5).softmax(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(second[0], ones[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(second[1], (scores[1] / 0.5).softmax(-1), atol=1e-5, rtol=0)
    for sharp, one in ((half[0], ones[0]), (half[1], ones[1]), (second[1], ones[1])):
        assert (sharp - one).abs().max() > 0.05
    # sharper: the largest weight of every row grows (or stays, where it was already 1)
    assert bool((half[0].amax(-1) >= ones[0].amax(-1) - 1e-6).all())


@pytest.mark.parametrize("probed", [False, True], ids=["plain", "with-recorder"])
def test_padding_masked_keys_get_zero(tiny, eager, probed):
    """A batch of two lengths: every weight equals eager's, and the padded keys get exactly 0 in the
    encoder and cross-attention. ``probed``: a recorder wants the encoder's blocks, so the weights come
    from the probed path (exp / total with clamped exponents), which must give the same."""
    enc = _enc(tiny, TEXT, "Short one.")
    pad = ~enc.attention_mask.bool()
    assert pad[1].any() and not pad[0].any()
    dec = DECODER_IDS.repeat(2, 1)
    with torch.no_grad():
        want = eager(**enc, decoder_input_ids=dec, output_attentions=True)
        if probed:
            rec = Recorder(ProbeSpec.of("encoder.*.pmax", "cross.*.pmax"), enc.attention_mask.bool())
            with attention_call(TRAINED, None, rec):
                ours = tiny.model(**enc, decoder_input_ids=dec, output_attentions=True)
            assert rec.finish()["encoder.0.pmax"].size  # the recorder was fed too
        else:
            ours = tiny.model(**enc, decoder_input_ids=dec, output_attentions=True)
    for kind in KINDS:
        for got, ref in zip(getattr(ours, kind), getattr(want, kind), strict=True):
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    for kind in ("encoder_attentions", "cross_attentions"):
        for w in getattr(ours, kind):
            assert bool((w[1][..., pad[1]] == 0).all())
            assert bool((w[1][..., ~pad[1]] > 0).any())


def test_size_guard_refuses_with_one_line(tiny, monkeypatch):
    """Past MAX_WEIGHT_BYTES a pass asking for weights raises one UserError naming the length that fits;
    the same pass without output_attentions is untouched by the bound."""
    cfg = tiny.model.config
    per_token2 = cfg.num_layers * cfg.num_heads * 4  # bytes of encoder weights per (query, key) pair, batch 1
    monkeypatch.setattr(attention, "MAX_WEIGHT_BYTES", 10 * 10 * per_token2)  # holds exactly 10 tokens
    enc = _enc(tiny, TEXT)
    assert enc.input_ids.shape[1] > 10
    with torch.no_grad():
        with pytest.raises(UserError) as err:
            tiny.model(**enc, decoder_input_ids=DECODER_IDS, output_attentions=True)
        out = tiny.model(**enc, decoder_input_ids=DECODER_IDS)
    msg = str(err.value)
    assert "\n" not in msg
    assert "output_attentions=True" in msg and "MAX_WEIGHT_BYTES" in msg and "up to 10 tokens" in msg
    assert out.encoder_attentions is None
    short = _enc(tiny, "Nine char")  # 9 bytes + </s> = 10 tokens: fits exactly
    with torch.no_grad():
        ok = tiny.model(**short, decoder_input_ids=DECODER_IDS[:, :1], output_attentions=True)
    assert ok.encoder_attentions[0].shape[-1] == 10


def test_size_guard_bound_is_a_gibibyte():
    """The real bound: 2**28 float32 weights per kind and pass, counted over the stack's layers."""
    assert attention.MAX_WEIGHT_BYTES == 2**30
    module = types.SimpleNamespace(config=types.SimpleNamespace(num_layers=8))
    attention._check_weight_size(module, "encoder", 1, 8, 2048, 2048)  # 1 GiB exactly: allowed
    with pytest.raises(UserError, match=r"up to 2,048 tokens"):
        attention._check_weight_size(module, "encoder", 1, 8, 2049, 2049)
    with pytest.raises(UserError, match=r"encoder inputs of up to 4,096 tokens at this decoder length"):
        attention._check_weight_size(module, "cross", 1, 8, 1024, 4097)


def test_generate_with_output_attentions_equals_eager(tiny, eager):
    """generate() hands output_attentions to every step: the per-step tuples equal eager's, and a tau
    under apply() reaches the returned encoder weights."""
    enc = _enc(tiny, TEXT)
    gen = dict(max_new_tokens=4, do_sample=False, num_beams=1, output_attentions=True, return_dict_in_generate=True)
    with torch.no_grad():
        ours = tiny.model.generate(**enc, **gen)
        want = eager.generate(**enc, **gen)
        with apply(tiny.model, tau=0.7):
            sharp = tiny.model.generate(**enc, **gen)
            forward = tiny.model(**enc, decoder_input_ids=DECODER_IDS, output_attentions=True)
    assert torch.equal(ours.sequences, want.sequences)
    for got, ref in zip(ours.encoder_attentions, want.encoder_attentions, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    for kind in ("decoder_attentions", "cross_attentions"):
        steps, ref_steps = getattr(ours, kind), getattr(want, kind)
        assert len(steps) == len(ref_steps) == ours.sequences.shape[1] - 1
        for step, ref_step in zip(steps, ref_steps, strict=True):  # one tuple of layers per generated token
            for got, ref in zip(step, ref_step, strict=True):
                torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    for got, ref in zip(sharp.encoder_attentions, forward.encoder_attentions, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)
    assert (sharp.encoder_attentions[0] - ours.encoder_attentions[0]).abs().max() > 0.05


def test_config_output_attentions_is_honoured_under_apply(tiny_dir, tiny):
    """transformers lets an eager model carry output_attentions=True in its config (no kwarg then); its
    collector still waits for weights after apply() switches the model to ours, and must get them,
    not an empty tuple. An explicit output_attentions=False still wins."""
    model = T5ForConditionalGeneration.from_pretrained(
        str(tiny_dir), attn_implementation="eager", output_attentions=True
    ).eval()
    enc = _enc(tiny, TEXT)
    with torch.no_grad():
        want = model(**enc, decoder_input_ids=DECODER_IDS)
        with apply(model, tau=1.0):
            got = model(**enc, decoder_input_ids=DECODER_IDS)
            off = model(**enc, decoder_input_ids=DECODER_IDS, output_attentions=False)
    assert len(want.encoder_attentions) == model.config.num_layers
    for kind in KINDS:
        for g, w in zip(getattr(got, kind), getattr(want, kind), strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=0)
    assert off.encoder_attentions is None


def test_without_the_request_nothing_changes(tiny, monkeypatch):
    """No output_attentions: no weights, and a fused path (torch's sdpa, or on the CPU our fused softmax kernel)
    still serves every attention; asking for weights is what moves a pass off it."""
    calls = []
    for name in ("_fused", "_kernel_blocks"):
        fused = getattr(attention, name)
        monkeypatch.setattr(attention, name, lambda *a, _f=fused, **k: calls.append(1) or _f(*a, **k))
    enc = _enc(tiny, TEXT)
    with torch.no_grad():
        plain = tiny.model(**enc, decoder_input_ids=DECODER_IDS)
        n_plain = len(calls)
        asked = tiny.model(**enc, decoder_input_ids=DECODER_IDS, output_attentions=True)
    assert plain.encoder_attentions is None and plain.cross_attentions is None
    # encoder, decoder self (its causal rows, served too) and cross
    assert n_plain == tiny.model.config.num_layers + 2 * tiny.model.config.num_decoder_layers
    assert len(calls) == n_plain  # the asking pass added none
    torch.testing.assert_close(asked.logits, plain.logits, atol=1e-5, rtol=1e-5)
