"""Position schemes on decoder-only LMs (issue 56, item 4): the one ``Choice`` (its ``scheme``) through
:func:`core.runs.rope_pass.scheme_pass`, as for the rotary encoders.

Frequency schemes reach the model's rotary module: our plain model under PI, dynamic NTK, NTK and YaRN (its attention
factor included) gives, at the same length, the logits of transformers' own eager model whose config names the same
``rope_type`` (within 1e-5, float32), on tiny random Llama, Qwen2, Mistral and Gemma 2 configs; and the engine's
greedy answer under YaRN equals transformers' eager greedy ``generate`` with YaRN in its config.

Schemes with a mask or distances (window, ReRoPE, StreamingLLM, LM-Infinite) keep the rows causal: checked against a
reference written here from the papers' definitions in plain torch (float64, unrotated q and k, each logit rotated to
its own distance) on a tiny Llama, for the prefill's logits and for greedy decoding with a KV cache (the reference
reruns the whole sequence each step, so every cached step's mask and distances are checked). Those run where the
attention applies a scheme to a decoder's rows (``core.mechanics.attention.SCHEME_KINDS``); elsewhere the engine
refuses them in one line (checked).
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import transformers
from transformers import AttentionInterface, ByT5Tokenizer
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from core.data import tasks
from core.errors import UserError
from core.kinds import DECODER
from core.mechanics import attention, fused_softmax, softmax_block
from core.models import load
from core.runs import engine, rope_pass
from core.values.choice import TRAINED, Choice
from core.values.positions import Scheme, ntk_theta
from support.decoders import tiny_decoder_fields

VOCAB = 384  # ByT5's tokenizer serves any model with at least 384 tokens
TRAIN_LENGTH = 64
LENGTH = 150  # 2.3 x L_tr
TOL = 1e-5
THETA = 10000.0

SERVED = DECODER in getattr(attention, "SCHEME_KINDS", ())
needs_rows = pytest.mark.skipif(
    not SERVED, reason="the attention does not apply a scheme's mask and distances to a decoder's rows yet"
)


def _config(family: str, **extra):
    common = tiny_decoder_fields(
        vocab_size=VOCAB,
        max_position_embeddings=TRAIN_LENGTH,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        **extra,
    )
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "qwen2":
        return transformers.Qwen2Config(**common)
    if family == "mistral":
        return transformers.MistralConfig(**common, sliding_window=None)
    if family == "gemma2":
        return transformers.Gemma2Config(
            **common, sliding_window=4096, attn_logit_softcapping=None, final_logit_softcapping=None
        )
    raise AssertionError(family)


def _save(folder, family: str, seed: int = 0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(_config(family), dtype=torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    ByT5Tokenizer().save_pretrained(folder)
    (folder / "card.json").write_text(json.dumps({"train_length": TRAIN_LENGTH}))
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folders = {f: _save(tmp_path_factory.mktemp(f), f) for f in ("llama", "qwen2", "mistral", "gemma2")}
    # ByT5's tokenizer for every family (a Qwen2 folder would read its files as a Qwen2 tokenizer)
    return {f: load(str(d), device="cpu", tokenizer=str(folders["llama"])) for f, d in folders.items()}


def _ids(n: int, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, n), generator=g)


def _theirs(loaded, rope: dict, implementation: str = "eager"):
    """transformers' own model with the same weights and ``rope`` in its config's rope parameters (L_tr its
    ``max_position_embeddings``, as transformers' dynamic NTK divides by it)."""
    cfg = copy.deepcopy(loaded.model.config)
    cfg.rope_parameters = {**cfg.rope_parameters, **rope}
    cfg.max_position_embeddings = TRAIN_LENGTH
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=implementation)
    model.load_state_dict(loaded.model.state_dict())
    return model.eval()


def _ours(loaded, scheme: str, ids: torch.Tensor) -> torch.Tensor:
    choice = engine.choice_for(loaded, Choice.of(scheme=scheme))
    with torch.no_grad(), rope_pass.scheme_pass(loaded, choice, None, None, ids.shape[1]):
        return loaded.model(input_ids=ids).logits


S = LENGTH / TRAIN_LENGTH
FREQUENCY_CASES = [
    ("yarn-rope", {"rope_type": "yarn", "factor": S, "original_max_position_embeddings": TRAIN_LENGTH}),
    (
        "yarn-rope:factor=4:attention_factor=1.3",
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAIN_LENGTH, "attention_factor": 1.3},
    ),
    ("pi", {"rope_type": "linear", "factor": S}),
    ("pi:factor=3", {"rope_type": "linear", "factor": 3.0}),
    ("dynamic-ntk", {"rope_type": "dynamic", "factor": 1.0}),
    ("dynamic-ntk:factor=2", {"rope_type": "dynamic", "factor": 2.0}),
    ("ntk", {"rope_type": "default", "rope_theta": ntk_theta(THETA, 16, S)}),
]


@pytest.fixture
def torch_sums(monkeypatch):
    """The attention on torch's backend: what is compared here is the scheme's rotation, and the C++ kernel's (or
    sdpa's) other order of sums alone moves a logit by up to 1.5e-5 once YaRN's factor 1.3 enlarges them (their
    own equality with eager is tests/mechanics/test_decoder_families.py's)."""
    monkeypatch.setenv(fused_softmax.ENV_SWITCH, "0")
    monkeypatch.setattr(softmax_block, "sdpa_prefill", lambda x: False)


@pytest.mark.usefixtures("torch_sums")
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma2"])
@pytest.mark.parametrize("scheme,rope", FREQUENCY_CASES, ids=[c[0] for c in FREQUENCY_CASES])
def test_frequency_scheme_equals_transformers(models, family, scheme, rope):
    """Our plain model under a frequency scheme at L = 2.3 L_tr gives transformers' eager logits with that rope
    type in its config (YaRN's attention factor, default or given, included); and the scheme changes them."""
    loaded = models[family]
    ids = _ids(LENGTH)
    with torch.no_grad():
        want = _theirs(loaded, rope)(input_ids=ids).logits
        plain = _theirs(loaded, {})(input_ids=ids).logits
    got = _ours(loaded, scheme, ids)
    torch.testing.assert_close(got, want, atol=TOL, rtol=TOL)
    assert (got - plain).abs().max() > 1e-3  # the scheme did something


@pytest.mark.usefixtures("torch_sums")
def test_yarn_attention_factor_reaches_the_logits(models):
    """YaRN's attention factor is on cos and sin: ``attention_factor=1`` differs from the default 0.1 ln s + 1, and
    each equals transformers' with the same factor."""
    loaded = models["llama"]
    ids = _ids(LENGTH)
    base = {"rope_type": "yarn", "factor": S, "original_max_position_embeddings": TRAIN_LENGTH}
    with torch.no_grad():
        one = _theirs(loaded, {**base, "attention_factor": 1.0})(input_ids=ids).logits
    got_one = _ours(loaded, "yarn-rope:attention_factor=1", ids)
    torch.testing.assert_close(got_one, one, atol=TOL, rtol=TOL)
    assert (got_one - _ours(loaded, "yarn-rope", ids)).abs().max() > 1e-3
    assert rope_pass.attention_factor(loaded, Scheme.of("yarn-rope").bind(TRAIN_LENGTH, LENGTH)) == pytest.approx(
        0.1 * math.log(S) + 1
    )


@pytest.fixture(scope="module")
def passkey(models):
    return tasks.make("passkey", models["llama"].tokenizer, 300, depth=0.3, seed=1)


def test_engine_answer_under_yarn_equals_transformers_generate(models, passkey):
    """``engine.run`` with ``yarn-rope`` at a fixed factor: the greedy answer (KV cache) equals transformers' eager
    greedy ``generate`` whose config holds the same YaRN, token for token; the plain scheme's differs in logits."""
    loaded = models["llama"]
    enc = engine.encode(loaded, passkey)
    choice = Choice.of(scheme="yarn-rope:factor=3")
    r = engine.run(loaded, passkey, choice, engine.Pass(max_new_tokens=8))
    ref = _theirs(loaded, {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": TRAIN_LENGTH})
    ids = torch.as_tensor(enc.input_ids)[None]
    with torch.no_grad():
        out = ref.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, pad_token_id=0
        )
    want = loaded.tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True).strip()
    assert r.answer == want
    assert r.tokens == enc.n


# -- schemes with a mask or distances: a reference from the papers' definitions --------------------------------------

REF = "decoder-scheme-reference-test"
#: ours (float32) against the reference (float64): a logit or two of ~1e4 differ by 1.2e-5 after two layers
REF_TOL = 3e-5
W, SINKS, CAP = 40, 4, 50


def _visible_and_distance(name: str, i: int, j: int) -> tuple[bool, int]:
    """Whether query i sees key j (j <= i) under scheme ``name`` and at which relative distance, from the papers."""
    d = i - j
    if name == "window":  # windowed attention: the last W + 1 keys
        return d <= W, d
    if name == "rerope":  # ReRoPE (Su 2023): every key, distances past W counted as W
        return True, min(d, W)
    if name == "lm-infinite":  # Han et al.: Lambda mask (SINKS first keys + the band), distances capped
        return (j < SINKS or d <= W), min(d, CAP)
    if name == "streaming-llm":  # Xiao et al.: the cache holds the sinks and the last W + 1 tokens, positions in it
        cache = sorted({*range(min(SINKS, i + 1)), *range(max(0, i - W), i + 1)})
        if j not in cache:
            return False, d
        return True, cache.index(i) - cache.index(j)
    raise AssertionError(name)


SPEC = {
    "window": f"window:window={W}",
    "rerope": f"rerope:window={W}",
    "lm-infinite": f"lm-infinite:window={W}:sinks={SINKS}:cap={CAP}",
    "streaming-llm": f"streaming-llm:window={W}:sinks={SINKS}",
}
_TABLES: dict = {}


def _table(name: str, n: int):
    key = (name, n)
    if key not in _TABLES:
        vis = torch.zeros(n, n, dtype=torch.bool)
        dist = torch.zeros(n, n, dtype=torch.long)
        for i in range(n):
            for j in range(i + 1):
                v, d = _visible_and_distance(name, i, j)
                vis[i, j], dist[i, j] = v, d
        _TABLES[key] = (vis, dist)
    return _TABLES[key]


def _rot(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """RoPE from its definition (float64): angle p / theta^(2i/d), x cos + rotate_half(x) sin."""
    d = x.shape[-1]
    inv = 1.0 / THETA ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[..., None] * inv
    ang = torch.cat((ang, ang), -1)
    half = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), -1)
    return x * ang.cos() + half * ang.sin()


def _reference(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Causal attention whose logit (i, j) is rot(q_i, d_ij) . k_j (q and k arrive unrotated: position ids 0), with
    the visibility and distances of :func:`_visible_and_distance`, in float64; grouped K/V repeated."""
    name = _reference.scheme
    b, h, n, d = query.shape
    groups = h // key.shape[1]
    k = key.double().repeat_interleave(groups, 1)
    v = value.double().repeat_interleave(groups, 1)
    vis, dist = _table(name, n)
    q = query.double()
    z = torch.empty(b, h, n, n, dtype=torch.float64)
    for i in range(n):
        z[:, :, i, :] = torch.einsum("bhjd,bhjd->bhj", _rot(q[:, :, i : i + 1, :].expand(b, h, n, d), dist[i]), k)
    z = z * scaling
    z = z.masked_fill(~vis, -math.inf)
    p = torch.softmax(z, -1)
    return (p @ v).to(value.dtype).transpose(1, 2).contiguous(), None


@pytest.fixture(scope="module")
def reference_model(models):
    AttentionInterface.register(REF, _reference)
    AttentionMaskInterface.register(REF, sdpa_mask)
    loaded = models["llama"]
    return _theirs(loaded, {}, implementation=REF)


def _reference_logits(model, name: str, ids: torch.Tensor) -> torch.Tensor:
    _reference.scheme = name
    with torch.no_grad():
        return model(input_ids=ids, position_ids=torch.zeros_like(ids)).logits


@needs_rows
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "streaming-llm" else n for n in SPEC])
def test_mask_and_distance_schemes_equal_the_reference(models, reference_model, name):
    """Prefill logits under each scheme equal the reference's, and differ from the plain model's (the scheme acts)."""
    loaded = models["llama"]
    ids = _ids(110, seed=5)
    got = _ours(loaded, SPEC[name], ids)
    want = _reference_logits(reference_model, name, ids)
    torch.testing.assert_close(got, want, atol=REF_TOL, rtol=REF_TOL)
    assert (got - _ours(loaded, "none", ids)).abs().max() > 1e-3


@needs_rows
@pytest.mark.parametrize("name", ["window", "lm-infinite", "streaming-llm", "rerope"])
def test_band_blocks_equal_the_reference(models, reference_model, name, monkeypatch):
    """Blocks of 16 rows, each reading only the sinks and the band its rows see, or (ReRoPE) the keys up to its last
    row (``softmax_block._band_block``; tests/runs/test_band_columns.py), give the reference's prefill logits too."""
    loaded = models["llama"]
    ids = _ids(110, seed=5)
    rows = 16 * (softmax_block.RECTIFIED_BLOCK_SHARE if name != "window" else 1)
    how = engine.Pass(chunk_bytes=rows * 4 * 110 * 4)  # rows x heads x keys x float32
    ran = []
    real = softmax_block._band_block
    monkeypatch.setattr(softmax_block, "_band_block", lambda *a, **k: ran.append(1) or real(*a, **k))
    choice = engine.choice_for(loaded, Choice.of(scheme=SPEC[name]))
    with torch.no_grad(), rope_pass.scheme_pass(loaded, choice, how, None, ids.shape[1]):
        got = loaded.model(input_ids=ids).logits
    assert len(ran) >= 2 * loaded.n_layers, "the band's blocks ran"  # the first blocks' keys: under 3/4 of all
    torch.testing.assert_close(got, _reference_logits(reference_model, name, ids), atol=REF_TOL, rtol=REF_TOL)


@needs_rows
@pytest.mark.slow
@pytest.mark.parametrize("name", list(SPEC))
def test_cached_decoding_steps_follow_the_scheme(models, reference_model, name):
    """Greedy decoding with a KV cache under each scheme gives the reference's tokens, the reference rerunning the
    whole sequence at each step (so every cached step's mask and distances are checked), and each step's logits."""
    loaded = models["llama"]
    ids = _ids(90, seed=7)
    steps = 6
    choice = engine.choice_for(loaded, Choice.of(scheme=SPEC[name]))
    with torch.no_grad(), rope_pass.scheme_pass(loaded, choice, None, None, ids.shape[1]):
        out = loaded.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=steps,
            do_sample=False,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    seq = ids
    for t in range(steps):
        logits = _reference_logits(reference_model, name, seq)[:, -1]
        torch.testing.assert_close(out.scores[t], logits, atol=REF_TOL, rtol=REF_TOL)
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    assert out.sequences.tolist() == seq.tolist()


@needs_rows
@pytest.mark.slow
def test_engine_runs_a_sink_scheme_on_a_padded_batch_one_by_one(models):
    """StreamingLLM's sinks are each prompt's first tokens: a batch of two lengths gives each document's single run."""
    loaded = models["llama"]
    docs = [tasks.make("passkey", loaded.tokenizer, n, depth=0.5, seed=n) for n in (300, 270)]
    choice = Choice.of(scheme=SPEC["streaming-llm"])
    how = engine.Pass(max_new_tokens=4)
    batch = engine.run_batch(loaded, docs, choice, how)
    for doc, b in zip(docs, batch):
        single = engine.run_batch(loaded, [doc], choice, how)[0]
        assert b.answer_tokens == single.answer_tokens


@pytest.mark.skipif(SERVED, reason="the attention serves a decoder's scheme rows")
@pytest.mark.parametrize("name", list(SPEC))
def test_mask_schemes_refused_until_the_attention_serves_them(models, passkey, name):
    """Without the attention's decoder rows, a mask or distance scheme is one line, never a pass without positions."""
    with pytest.raises(UserError, match="not there yet"):
        engine.run(models["llama"], passkey, Choice.of(scheme=SPEC[name]), engine.Pass(max_new_tokens=2))


def test_plain_scheme_run_unchanged(models, passkey):
    """The plain scheme through the scheme pass: the same answer as with no scheme named at all."""
    loaded = models["llama"]
    a = engine.run(loaded, passkey, TRAINED, engine.Pass(max_new_tokens=4))
    b = engine.run(loaded, passkey, Choice.of(scheme="none"), engine.Pass(max_new_tokens=4))
    assert a.answer_tokens == b.answer_tokens
