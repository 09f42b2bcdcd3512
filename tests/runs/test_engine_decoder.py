"""A decoder-only causal LM through the library end to end (issue 56, item 3, library level): ``load(folder)`` of a
saved tiny random Llama (heads as many as keys, and grouped-query), then ``engine.run`` on a pass-key document as a
prompt with the question last: a greedy answer with a KV cache, the document's probes on the decoder's prefill rows,
tau reaching the attention through a choice made for T5, the answer equal to transformers' eager greedy
``generate`` on the same prompt, and a left-padded batch equal to single runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from transformers import ByT5Tokenizer

from core.data import tasks
from core.errors import ModelLoadError, UserError
from core.kinds import CROSS, DECODER, ENCODER
from core.mechanics.attention import attention_call
from core.mechanics.probes import ProbeSpec
from core.models import load
from core.runs import engine
from core.values.choice import TRAINED, Choice

#: ByT5's bytes serve any model with at least 384 tokens (pad 0, eos 1, unk 2, bytes from 3, 125 extra ids).
VOCAB = 384
TRAIN_LENGTH = 256
ANSWER = engine.Pass(max_new_tokens=8)


def build_tiny_llama(folder, *, kv_heads: int = 4, seed: int = 0, layers: int = 2):
    """Save a random tiny LlamaForCausalLM (4 query heads of 16), ByT5's tokenizer and a card.json to ``folder``."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        head_dim=16,
        max_position_embeddings=1024,
        initializer_range=0.2,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    ByT5Tokenizer().save_pretrained(folder)
    (folder / "card.json").write_text(json.dumps({"train_length": TRAIN_LENGTH}))
    return folder


@pytest.fixture(scope="module", params=[4, 2], ids=["mha", "gqa"])
def llama_dir(request, tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp(f"tiny-llama-kv{request.param}"), kv_heads=request.param)


@pytest.fixture(scope="module")
def llama(llama_dir):
    return load(str(llama_dir), device="cpu")


@pytest.fixture(scope="module")
def doc(llama):
    return tasks.make("passkey", llama.tokenizer, 300, depth=0.3, seed=1)


def test_load_reads_a_decoder_only_model(llama, llama_dir):
    """``load`` gives a decoder-only Loaded: its family, sizes, L_tr from the card, the causal-LM class."""
    assert llama.family == "decoder" and llama.decoder_only and not llama.seq2seq
    assert isinstance(llama.model, transformers.LlamaForCausalLM)
    assert (llama.n_layers, llama.n_heads, llama.d_kv) == (2, 4, 16)
    assert llama.n_kv_heads == llama.config.num_key_value_heads
    assert llama.train_length == TRAIN_LENGTH
    d = llama.describe()
    assert d["family"] == "decoder" and d["kv_heads"] == llama.n_kv_heads
    assert engine.max_tokens(llama) > 10_000  # no L x L: a KV cache and activations per token


def test_config_against_weights_is_checked(tmp_path):
    """The safety checks read a decoder-only folder: more layers declared than stored, and query heads that do not
    split into key/value groups, are each one line before any weight is read."""
    folder = build_tiny_llama(tmp_path / "m", kv_heads=2)
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "num_hidden_layers": 3}))
    with pytest.raises(ModelLoadError, match="declares 3 decoder layers"):
        load(str(folder), device="cpu")
    (folder / "config.json").write_text(json.dumps({**raw, "num_key_value_heads": 3}))
    with pytest.raises(ModelLoadError, match="does not split into 3 key/value groups"):
        load(str(folder), device="cpu")


def test_run_answers_and_probes(llama, doc):
    """A run on the prompt: an answer string, the question and needle spans in tokens, the prefill rows' Pmax and H
    per layer and head (finite, in range), the question's profile over every position, a causal map."""
    r = engine.run(llama, doc, TRAINED, ANSWER)
    assert isinstance(r.answer, str) and r.answer_tokens
    assert r.tokens == len(llama.tokenizer(doc.text).input_ids) - 1  # the trailing end token dropped
    qa, qb = r.question_tokens
    assert "What is the pass key?" in doc.text[r.offsets[qa][0] : r.offsets[qb - 1][1]]
    assert qb == r.tokens  # the question is last
    p = r.probes
    assert p.pmax.shape == p.entropy.shape == (1, llama.n_layers, llama.n_heads)
    assert np.isfinite(p.pmax).all() and np.isfinite(p.entropy).all()
    assert ((p.pmax > 0) & (p.pmax <= 1)).all() and (p.entropy >= 0).all()
    assert p["decoder.*.pmax"].shape == (llama.n_layers, 1, llama.n_heads)
    assert p.profile.shape == (llama.n_layers, r.tokens)
    np.testing.assert_allclose(p.profile.sum(-1), 1.0, atol=1e-4)  # each question row's attention sums to 1
    m = p.heatmap_mean
    assert m is not None and np.allclose(np.triu(m, 1), 0.0)  # causal rows: nothing above the diagonal
    s = r.summary()
    assert s["tokens"] == r.tokens and len(s["layers"]) == llama.n_layers
    assert r.correct in (True, False) and r.expected == doc.expected  # scored by the passkey scorer
    assert set(r.seconds) >= {"tokenize", "encode", "generate", "total"}


def test_tau_reaches_the_attention(llama, doc):
    """A choice made for T5 (targets ``encoder``, the default) reaches a decoder-only model's self-attention: tau
    0.5 sharpens every layer's rows (Pmax up, H down) against tau 1."""
    one = engine.run(llama, doc, TRAINED, ANSWER)
    half = engine.run(llama, doc, Choice.of(tau=0.5), ANSWER)
    assert half.probes.layer_pmax.mean() > one.probes.layer_pmax.mean() + 1e-3
    assert half.probes.layer_entropy.mean() < one.probes.layer_entropy.mean() - 1e-3
    assert not np.allclose(half.probes.pmax, one.probes.pmax)
    assert engine.choice_for(llama, Choice.of(tau=0.5)).targets == (DECODER,)
    assert engine.choice_for(llama, Choice.of(tau=0.5, targets=(ENCODER, CROSS))).targets == (DECODER, CROSS)
    assert engine.choice_for(llama, Choice.of(tau=0.5, targets=())).targets == ()


def test_the_attention_still_refuses_a_direct_call_without_decoder(llama):
    """The engine reads the targets for the model; a direct call of the attention keeps its own safety net."""
    ids = torch.tensor([[5, 6, 7, 8]])
    with pytest.raises(UserError, match="do not name it"), attention_call(Choice.of(tau=0.5)):
        llama.model(input_ids=ids)


def test_answer_equals_eager_greedy_generate(llama, llama_dir, doc):
    """At tau 1 the engine's answer is transformers' own: the same folder on its eager attention, greedy
    ``generate`` on the same prompt ids, the same new tokens."""
    r = engine.run(llama, doc, TRAINED, ANSWER)
    eager = transformers.AutoModelForCausalLM.from_pretrained(
        llama_dir, attn_implementation="eager", dtype=torch.float32
    ).eval()
    ids = torch.as_tensor(engine.encode(llama, doc).input_ids)[None]
    with torch.no_grad():
        out = eager.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=ANSWER.max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    new = out[0, ids.shape[1] :].tolist()
    assert r.answer_tokens == engine._pieces(llama.tokenizer, new)
    assert r.answer == llama.tokenizer.decode(new, skip_special_tokens=True).strip()


def test_tau_reaches_every_decoding_step(llama, llama_dir, doc):
    """At tau 0.3 the engine's answer is eager's greedy ``generate`` with every attention's ``scaling`` over 0.3: tau
    reached the prefill and each cached step (and the answer differs from tau 1's)."""
    tau = 0.3
    r = engine.run(llama, doc, Choice.of(tau=tau), ANSWER)
    eager = transformers.AutoModelForCausalLM.from_pretrained(
        llama_dir, attn_implementation="eager", dtype=torch.float32
    ).eval()
    for m in eager.modules():
        if hasattr(m, "scaling") and hasattr(m, "layer_idx"):
            m.scaling = m.scaling / tau
    ids = torch.as_tensor(engine.encode(llama, doc).input_ids)[None]
    with torch.no_grad():
        out = eager.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=ANSWER.max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    assert r.answer_tokens == engine._pieces(llama.tokenizer, out[0, ids.shape[1] :].tolist())
    assert r.answer_tokens != engine.run(llama, doc, TRAINED, ANSWER).answer_tokens


def test_length_refused_by_memory(llama, doc, monkeypatch):
    """The decoder's memory rule: activations and a KV cache per token, no L x L; too little memory is one line."""
    from core.errors import InputTooLong
    from core.models import memory

    per_token = 8 * (64 + 128 + (4 + 2 * llama.n_kv_heads) * 16) * 4 + 2 * 2 * llama.n_kv_heads * 16 * 4
    monkeypatch.setattr(memory, "free_bytes", lambda device: (4 * llama.n_params * 4 + 100 * per_token) / 0.8)
    assert 90 <= engine.max_tokens(llama, chunk_bytes=4096) <= 110
    with pytest.raises(InputTooLong, match="at most about"):
        engine.run(llama, doc, TRAINED, ANSWER)


def test_padded_batch_equals_single_runs(llama):
    """Two documents of different lengths as one left-padded batch: each one's answer and Pmax/H as alone."""
    docs = [tasks.make("passkey", llama.tokenizer, n, depth=0.5, seed=s) for n, s in ((270, 2), (330, 3))]
    how = engine.Pass(probes=ProbeSpec.stats_only(), max_new_tokens=6)
    batch = engine.run_batch(llama, docs, Choice.of(tau=0.7), how)
    for d, b in zip(docs, batch):
        single = engine.run(llama, d, Choice.of(tau=0.7), how)
        assert b.tokens == single.tokens and b.answer_tokens == single.answer_tokens and b.answer == single.answer
        np.testing.assert_allclose(b.probes.pmax, single.probes.pmax, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b.probes.entropy, single.probes.entropy, rtol=1e-5, atol=1e-6)


def test_pass_without_answer(llama, doc):
    """``generate=False``: the prefill alone (the base model, no vocabulary logits), probes as with an answer."""
    r = engine.run(llama, doc, Choice.of(tau=0.7), engine.Pass(probes=ProbeSpec.stats_only(), generate=False))
    full = engine.run(llama, doc, Choice.of(tau=0.7), engine.Pass(probes=ProbeSpec.stats_only(), max_new_tokens=3))
    assert r.answer == "" and r.correct is None
    np.testing.assert_allclose(r.probes.pmax, full.probes.pmax, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("probes", [ProbeSpec(), ProbeSpec.off()], ids=["probed", "unprobed"])
def test_estimate_and_nan(llama_dir, doc, probes):
    """The estimate before a long pass times the prefill alone; NaN weights are one NumericalError naming float32's
    range, not an answer, with probes or without (then the scores of the answer's steps are what is checked)."""
    from core.errors import NumericalError

    broken = load(str(llama_dir), device="cpu", train_length=257 if probes.wanted else 258)  # a copy of its own
    enc = engine.encode(broken, doc)
    assert engine.estimate_pass(broken, doc, enc) > 0
    with torch.no_grad():
        broken.model.model.layers[1].self_attn.k_proj.weight.fill_(float("nan"))
    with pytest.raises(NumericalError, match="NaN") as err:
        engine.run(broken, doc, TRAINED, engine.Pass(probes=probes, max_new_tokens=2))
    assert "float32" in str(err.value) and "\n" not in str(err.value)


def test_lm_perplexity_equals_eager(llama, llama_dir):
    """An ``lm`` document on a decoder: its continuation's summed -log p after the prompt, teacher-forced, equals
    eager's on prompt + continuation at tau 1; a batch of two equals the single runs; tau 0.5 changes it."""
    docs = [tasks.make("lm", llama.tokenizer, n, seed=s, continuation=c) for n, s, c in ((260, 1, 24), (300, 2, 16))]
    how = engine.Pass(probes=ProbeSpec.off(), generate=False)
    singles = [engine.run(llama, d, TRAINED, how) for d in docs]
    eager = transformers.AutoModelForCausalLM.from_pretrained(
        llama_dir, attn_implementation="eager", dtype=torch.float32
    ).eval()
    for d, r in zip(docs, singles):
        prompt = list(engine.encode(llama, d).input_ids)
        cont = tasks.continuation_ids(d)
        with torch.no_grad():
            logits = eager(input_ids=torch.tensor([prompt + cont])).logits[0]
        want = torch.nn.functional.cross_entropy(logits[len(prompt) - 1 : -1], torch.tensor(cont), reduction="sum")
        assert r.scored_tokens == len(cont) and r.perplexity is not None
        assert r.nll == pytest.approx(float(want), rel=1e-4)
    batch = engine.run_batch(llama, docs, TRAINED, how)
    for b, r in zip(batch, singles):
        assert b.nll == pytest.approx(r.nll, rel=1e-5) and b.scored_tokens == r.scored_tokens
    assert engine.run(llama, docs[0], Choice.of(tau=0.5), how).nll != pytest.approx(singles[0].nll, rel=1e-3)
