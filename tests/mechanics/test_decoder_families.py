"""Decoder-only LLM families through our attention (issue 56, item 1).

Each registered family (:data:`core.mechanics.attention.FAMILIES` ``decoder``) as a tiny random model (2 layers, 4
query heads, 2 key/value heads, head dim 16): with our attention at tau = 1 it gives transformers' eager logits
within 1e-5 (float32), at tau = 0.7 eager's with the logits over 0.7 (each attention module's ``scaling``, Gemma 2's
``attn_logit_softcapping`` and gpt-oss's ``sinks`` divided by 0.7: the same as dividing the capped logits and the
sink logits fed to the softmax), a forward pass and greedy generation with a KV cache, with the fused C++ kernel on
and off. Every comparison also counts the calls our function served, so the tests fail if transformers' own
attention served the pass instead.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

from core.errors import UserError
from core.kinds import DECODER
from core.mechanics import attention, fused_softmax, softmax_block
from core.mechanics.probes import ProbeSpec, Recorder
from core.runs.apply import apply, check_supported
from core.values.choice import Choice
from support.decoders import tiny_decoder_fields

TAU = 0.7
#: Logits of ours and eager's agree to 1e-5, absolute and relative (float32; the logits are a few units, so
#: the sdpa and kernel backends' other order of sums shows up at 1e-5 of them after two layers).
TOL = 1e-5
VOCAB = 128
COMMON = tiny_decoder_fields(vocab_size=VOCAB)


def _config(family: str):
    """A tiny random config of ``family`` (``model_type``), with the family's own features switched on where
    short inputs reach them: Mistral's sliding window (8 < the 20 tokens), Gemma 2's soft-capping at 1 (logits of a
    few units are capped hard) and its own ``query_pre_attn_scalar``, gpt-oss's sinks and window."""
    if family == "llama":
        return transformers.LlamaConfig(**COMMON)
    if family == "mistral":
        return transformers.MistralConfig(**COMMON, sliding_window=8)
    if family == "qwen2":
        return transformers.Qwen2Config(**COMMON)
    if family == "qwen3":
        return transformers.Qwen3Config(**COMMON)
    if family == "gemma2":
        return transformers.Gemma2Config(
            **COMMON,
            sliding_window=8,
            attn_logit_softcapping=1.0,
            final_logit_softcapping=None,
            query_pre_attn_scalar=24,
        )
    if family == "phi3":
        return transformers.Phi3Config(**{k: v for k, v in COMMON.items() if k != "head_dim"}, pad_token_id=0)
    if family == "gpt_oss":
        return transformers.GptOssConfig(
            **COMMON,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
        )
    raise AssertionError(family)


FAMILIES = attention.FAMILIES[attention.CAUSAL_LM]


def _model(family: str, seed: int = 0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        _config(family), attn_implementation="eager", dtype=torch.float32
    )
    if family == "gpt_oss":  # sinks start at 0 here: random ones, so the sink column matters
        with torch.no_grad():
            for m in model.modules():
                if hasattr(m, "sinks"):
                    m.sinks.normal_(0.0, 1.0)
    return model.eval()


def _tempered_eager(model, tau: float):
    """A copy of ``model`` on transformers' eager attention with every logit fed to the softmax over ``tau``: each
    attention module's ``scaling`` (and Gemma 2's soft-cap, gpt-oss's sink logits) divided by tau."""
    ref = copy.deepcopy(model)
    ref.set_attn_implementation("eager")
    with torch.no_grad():
        for m in ref.modules():
            if hasattr(m, "scaling") and hasattr(m, "layer_idx"):
                m.scaling = m.scaling / tau
                if getattr(m, "attn_logit_softcapping", None) is not None:
                    m.attn_logit_softcapping = m.attn_logit_softcapping / tau
                if isinstance(getattr(m, "sinks", None), torch.Tensor):
                    m.sinks.div_(tau)
    return ref


class _Served:
    """Counts the calls :func:`core.mechanics.attention.aligned_attention` serves inside the block."""

    def __enter__(self):
        self.count = [0]
        self._token = attention._SERVED.set(self.count)
        return self

    def __exit__(self, *exc):
        attention._SERVED.reset(self._token)

    @property
    def calls(self) -> int:
        return self.count[0]


def _inputs(seed: int = 1, padded: bool = False):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (2, 20), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :5] = 0  # left padding of the second item
    return ids, mask


@pytest.fixture(params=["kernel", "no-kernel"])
def kernel_path(request, monkeypatch):
    if request.param == "no-kernel":
        monkeypatch.setenv(fused_softmax.ENV_SWITCH, "0")
    return request.param


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_forward_equals_eager(family, padded, kernel_path):
    """Logits of a forward pass: ours at tau = 1 equal eager's, at tau = 0.7 eager's with logits over 0.7; our
    function served every layer (counted), and tau 0.7 changed the logits."""
    model = _model(family)
    ids, mask = _inputs(padded=padded)
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
        sharp = _tempered_eager(model, TAU)(input_ids=ids, attention_mask=mask).logits
        with _Served() as served, apply(model, tau=1.0):
            ours1 = model(input_ids=ids, attention_mask=mask).logits
        assert served.calls == layers
        with _Served() as served, apply(model, tau=TAU) as choice:
            ours7 = model(input_ids=ids, attention_mask=mask).logits
        assert served.calls == layers
    assert choice.targets == (DECODER,)
    keep = mask.bool()  # padded rows are garbage in eager and ours alike (a row with no key)
    torch.testing.assert_close(ours1[keep], plain[keep], rtol=TOL, atol=TOL)
    torch.testing.assert_close(ours7[keep], sharp[keep], rtol=TOL, atol=TOL)
    assert (ours7[keep] - plain[keep]).abs().max() > 1e-2  # the tau reached the logits
    assert model.config._attn_implementation == "eager"  # apply put the model back


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_per_layer_schedule_equals_eager(family):
    """A tau per layer (0.9, then 0.6) equals eager with each layer's logits over its own tau."""
    model = _model(family)
    ids, mask = _inputs(padded=True)
    ref = copy.deepcopy(model)
    for layer, tau in enumerate((0.9, 0.6)):
        one = _tempered_eager(model, tau)  # a copy tempered everywhere; its layer `layer` goes into ref
        ref.model.layers[layer] = one.model.layers[layer]
    with torch.no_grad():
        expect = ref(input_ids=ids, attention_mask=mask).logits
        with _Served() as served, apply(model, schedule=[0.9, 0.6]):
            got = model(input_ids=ids, attention_mask=mask).logits
    assert served.calls == 2
    keep = mask.bool()
    torch.testing.assert_close(got[keep], expect[keep], rtol=TOL, atol=TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_with_cache_equals_eager(family, kernel_path):
    """Greedy generation with a KV cache (a padded batch: prefill rows, then one row per step at the end of the
    keys): each step's logits equal eager's, at tau = 1 and at 0.7; our function served the prefill and every step."""
    model = _model(family)
    ids, mask = _inputs(padded=True)
    steps = 4
    kw = dict(max_new_tokens=steps, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    for tau, ref in ((1.0, model), (TAU, _tempered_eager(model, TAU))):
        expect = ref.generate(input_ids=ids, attention_mask=mask, **kw)
        with _Served() as served, apply(model, tau=tau):
            got = model.generate(input_ids=ids, attention_mask=mask, **kw)
        assert served.calls == model.config.num_hidden_layers * steps
        assert torch.equal(got.sequences, expect.sequences)
        for a, b in zip(got.logits, expect.logits):
            torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_kernel_serves_the_cached_steps(family, monkeypatch):
    """With the kernel built, a cached decoding step (one query row, grouped K/V, Gemma 2's soft-cap) takes the
    C++ kernel; the prefill nobody probes (causal rows) takes ``sdpa``, soft-capped ones the kernel: the backends
    chosen are counted."""
    if not fused_softmax.available():
        pytest.skip("the fused kernel does not build here")
    chosen: list[str] = []
    real = softmax_block.choose_backend

    def counting(x):
        chosen.append(real(x))
        return chosen[-1]

    monkeypatch.setattr(softmax_block, "choose_backend", counting)
    model = _model(family)
    ids, mask = _inputs()
    with apply(model, tau=TAU):
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0)
    layers = model.config.num_hidden_layers
    # the prefill's causal rows take sdpa (the kernel where soft-capped: sdpa cannot cap); a sliding-window layer
    # (Gemma 2's every other one) stays on torch: transformers hands a window over as a whole L x L mask, which
    # the kernel does not read
    types = getattr(model.config, "layer_types", None) or ["full_attention"] * layers
    causal = softmax_block.CPU_KERNEL if getattr(model.config, "attn_logit_softcapping", None) else softmax_block.SDPA
    for i, kind in enumerate(types):
        want = {softmax_block.TORCH, softmax_block.SDPA} if kind == "sliding_attention" else {causal}
        assert chosen[i] in want, (i, kind, chosen[:layers])
    assert chosen[layers:] == [softmax_block.CPU_KERNEL] * (2 * layers)


def _reference(q, k, v, mask, scaling, tau, softcap=None, sinks=None):
    """Eager attention in float64 with repeat_kv (the reference only), logits over tau after the soft-cap."""
    groups = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(groups, dim=1)
    v = v.double().repeat_interleave(groups, dim=1)
    z = q.double() @ k.transpose(-1, -2) * scaling
    if softcap is not None:
        z = torch.tanh(z / softcap) * softcap
    z = z / tau
    z = z.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        s = (sinks.double() / tau).view(1, -1, 1, 1).expand(z.shape[0], -1, z.shape[2], 1)
        p = torch.softmax(torch.cat([z, s], -1), -1)[..., :-1]
    else:
        p = torch.softmax(z, -1)
    return (p @ v).transpose(1, 2)


class _Module(torch.nn.Module):
    is_causal = True  # a decoder-only model's attention: no is_decoder

    def __init__(self):
        super().__init__()
        self.layer_idx = 0


@pytest.mark.parametrize("backend", [softmax_block.TORCH, softmax_block.SDPA, softmax_block.CPU_KERNEL])
@pytest.mark.parametrize("case", ["causal", "window", "step", "chunk", "softcap", "softcap-step", "sinks"])
def test_every_backend_serves_grouped_causal_rows(backend, case, monkeypatch):
    """The attention function alone, each backend forced where it can serve the case: grouped K/V (8 query heads
    over 2 key heads), causal rows (no mask and ``is_causal``), a sliding-window mask, a cached step (1 row at the
    end of 12 keys), a chunk (3 rows at the end), Gemma 2's soft-cap, gpt-oss's sinks; tau 0.7 per call."""
    if backend == softmax_block.CPU_KERNEL and not fused_softmax.available():
        pytest.skip("the fused kernel does not build here")
    g = torch.Generator().manual_seed(3)
    q_len, k_len = {"step": (1, 12), "softcap-step": (1, 12), "chunk": (3, 12)}.get(case, (12, 12))
    q = torch.randn(2, 8, q_len, 16, generator=g) * 2
    k = torch.randn(2, 2, k_len, 16, generator=g) * 2
    v = torch.randn(2, 2, k_len, 16, generator=g)
    rows = torch.arange(q_len)[:, None] + (k_len - q_len)
    cols = torch.arange(k_len)[None, :]
    allowed = (cols <= rows).expand(2, 1, q_len, k_len)
    mask = None
    if case == "window":
        allowed = allowed & (rows - cols < 4)
        mask = allowed
    elif case == "chunk":
        mask = allowed
    kwargs = {}
    if case.startswith("softcap"):
        kwargs["softcap"] = 1.5
    if case == "sinks":
        kwargs["s_aux"] = torch.randn(8, generator=g)
    unsupported = (backend == softmax_block.SDPA and case in ("softcap", "softcap-step", "sinks")) or (
        backend == softmax_block.CPU_KERNEL and case in ("window", "chunk", "sinks")
    )
    if unsupported:
        assert (
            softmax_block.choose_backend(
                softmax_block.Inputs(
                    q,
                    k,
                    v,
                    mask,
                    causal=mask is None and q_len > 1,
                    softcap=kwargs.get("softcap"),
                    sinks=kwargs.get("s_aux"),
                )
            )
            != backend
        )
        pytest.skip(f"{backend} is not chosen for {case}")
    monkeypatch.setattr(softmax_block, "choose_backend", lambda x: backend)
    choice = Choice.of(tau=TAU, targets=(DECODER,))
    with torch.no_grad(), attention.attention_call(choice):
        out, _ = attention.aligned_attention(_Module(), q, k, v, mask, scaling=0.25, **kwargs)
    expect = _reference(q, k, v, allowed, 0.25, TAU, kwargs.get("softcap"), kwargs.get("s_aux"))
    torch.testing.assert_close(out.double(), expect, rtol=0, atol=2e-5)


def test_grouped_matmul_equals_repeat_kv():
    """The grouped product equals the product with K repeated per query head (transformers' repeat_kv order)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 6, 5, 8, generator=g)
    m = torch.randn(2, 3, 8, 7, generator=g)
    expect = a @ m.repeat_interleave(2, dim=1)
    torch.testing.assert_close(softmax_block.grouped_matmul(a, m), expect)
    out = torch.empty(2, 6, 5, 7)
    assert softmax_block.grouped_matmul(a, m, out=out) is out
    torch.testing.assert_close(out, expect)


class _Largest(TorchDispatchMode):
    """Records the largest tensor any torch op makes inside the block (its number of elements)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("backend", [softmax_block.TORCH, softmax_block.SDPA, softmax_block.CPU_KERNEL])
def test_grouped_keys_are_never_repeated(backend, monkeypatch):
    """A chunk of 3 query rows over 64 cached keys, 8 query heads on 2 key heads: no op of the call (whichever
    backend) makes a tensor larger than K or V as they came (the largest: a contiguous copy of V's transposed view
    for the matmul, a quarter of V repeated per query head; the scores of 3 rows, the folded query, the output
    are smaller)."""
    if backend == softmax_block.CPU_KERNEL and not fused_softmax.available():
        pytest.skip("the fused kernel does not build here")
    g = torch.Generator().manual_seed(4)
    b, h, hk, c, k_len, d = 1, 8, 2, 3, 64, 16
    q = torch.randn(b, c, h, d, generator=g).transpose(1, 2)  # transformers' layout: a transposed view
    k = torch.randn(b, k_len, hk, d, generator=g).transpose(1, 2)
    v = torch.randn(b, k_len, hk, d, generator=g).transpose(1, 2)
    mask = torch.ones(b, 1, 1, k_len, dtype=torch.bool)  # a cached step's key mask (the kernel reads it in place)
    monkeypatch.setattr(softmax_block, "choose_backend", lambda x: backend)
    with torch.no_grad(), attention.attention_call(Choice.of(tau=TAU, targets=(DECODER,))), _Largest() as seen:
        out, _ = attention.aligned_attention(_Module(), q, k, v, mask, scaling=0.25)
    assert seen.largest <= b * hk * k_len * d < b * h * k_len * d
    expect = _reference(q, k, v, torch.ones(b, 1, c, k_len, dtype=torch.bool), 0.25, TAU)
    torch.testing.assert_close(out.double(), expect, rtol=0, atol=2e-5)


def test_probes_on_a_decoder_give_pmax_and_entropy(kernel_path):
    """A probed pass on a decoder (``decoder.*.pmax``/``entropy``) gives each row's Pmax and entropy of eager's
    own attention weights (output_attentions), averaged over the rows, at tau = 1."""
    model = _model("llama")
    ids, mask = _inputs()
    with torch.no_grad():
        weights = model(input_ids=ids, output_attentions=True).attentions
        rec = Recorder(ProbeSpec.of("decoder.*.pmax", "decoder.*.entropy"), mask.bool())
        with apply(model, tau=1.0, recorder=rec):
            model(input_ids=ids)
    got = rec.finish().named
    for layer, w in enumerate(weights):
        w = w.double()
        pmax = w.amax(-1).mean(-1).numpy()
        ent = (-torch.special.xlogy(w, w).sum(-1)).mean(-1).numpy()
        torch.testing.assert_close(
            torch.as_tensor(got[f"decoder.{layer}.pmax"]).double(), torch.as_tensor(pmax), rtol=0, atol=1e-5
        )
        torch.testing.assert_close(
            torch.as_tensor(got[f"decoder.{layer}.entropy"]).double(), torch.as_tensor(ent), rtol=0, atol=1e-4
        )


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt_oss"])
def test_output_attentions_equal_eager(family):
    """``output_attentions=True`` on a decoder under our attention returns eager's weights (grouped heads, causal
    rows, soft-cap, sinks), at tau = 0.7 those of eager with the logits over 0.7."""
    model = _model(family)
    ids, mask = _inputs(padded=True)
    with torch.no_grad():
        expect = _tempered_eager(model, TAU)(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        with apply(model, tau=TAU):
            got = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    keep = mask.bool()
    for a, b in zip(got, expect):
        torch.testing.assert_close(a[0], b[0], rtol=TOL, atol=TOL)
        torch.testing.assert_close(a[1][:, keep[1]], b[1][:, keep[1]], rtol=TOL, atol=TOL)


def test_install_on_a_decoder():
    """``install`` puts a standing tau on a decoder-only model (its causal self-attention), every pass and thread,
    until ``uninstall``; generation with a cache included."""
    from core.runs import apply as applying

    model = _model("mistral")
    ids, mask = _inputs()
    kw = dict(max_new_tokens=3, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    expect = _tempered_eager(model, TAU).generate(input_ids=ids, attention_mask=mask, **kw)
    choice = applying.install(model, tau=TAU)
    try:
        assert choice.targets == (DECODER,)
        with _Served() as served:
            got = model.generate(input_ids=ids, attention_mask=mask, **kw)
        assert served.calls == 2 * 3
    finally:
        applying.uninstall(model)
    assert model.config._attn_implementation == "eager"
    for a, b in zip(got.logits, expect.logits):
        torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


def test_encoder_probes_on_a_decoder_are_refused():
    """The default ProbeSpec asks for encoder probes, which a decoder-only model does not have: a probed pass with
    it is a one-line UserError naming the decoder probes, not empty results."""
    model = _model("llama")
    ids, mask = _inputs()
    rec = Recorder(ProbeSpec.stats_only(), mask.bool())
    with pytest.raises(UserError, match=r"decoder\.\*"), torch.no_grad(), apply(model, tau=TAU, recorder=rec):
        model(input_ids=ids)


def test_targets_that_miss_the_decoder_are_refused():
    """A decoder-only model's one attention is ``decoder``: apply gives it that target when none is given, refuses
    targets that miss it, and a pass under a choice made for T5 (encoder targets) fails instead of running at
    tau = 1."""
    model = _model("llama")
    check_supported(model)
    with pytest.raises(UserError, match="decoder-only"):
        apply(model, tau=TAU, targets=("encoder",))
    ids, _ = _inputs()
    from core.mechanics import patches

    patches.set_implementation(model, attention.ATTN_NAME)
    with pytest.raises(UserError, match="targets"):
        with torch.no_grad(), attention.attention_call(Choice.of(tau=TAU)):
            model(input_ids=ids)
    with torch.no_grad(), attention.attention_call(Choice.of(tau=1.0)):  # tau = 1 changes nothing: runs
        model(input_ids=ids)


def test_served_by_us_on_a_decoder():
    """The loader's check (one short pass counting our calls) sees a decoder-only model on our attention, and not
    one on eager."""
    model = _model("qwen2")
    assert not attention.served_by_us(model)
    from core.mechanics import patches

    patches.set_implementation(model, attention.ATTN_NAME)
    assert attention.served_by_us(model)
