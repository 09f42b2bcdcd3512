"""The registered attention equals transformers' own path at tau = 1, and tau/chunking/threads behave."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from transformers import T5ForConditionalGeneration

from core.mechanics.attention import attention_call
from core.mechanics.probes import ProbeSpec, Recorder
from core.mechanics.run_pass import Pass
from core.values.choice import TRAINED, Choice
from core.values.schedule import RowTau, Schedule


def _batch(seed=0, n=60, pad_from=45):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 300, (2, n), generator=g)
    mask = torch.ones_like(ids)
    mask[1, pad_from:] = 0
    ids[1, pad_from:] = 0
    return ids, mask


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_equals_transformers_at_tau_one(tiny, tiny_dir, impl):
    ref = T5ForConditionalGeneration.from_pretrained(str(tiny_dir), attn_implementation=impl).eval()
    ids, mask = _batch()
    dec = torch.tensor([[0, 5, 7, 9], [0, 11, 13, 2]])
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        got = tiny.model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        with attention_call(Choice.of(tau=1.0, targets=("encoder", "decoder", "cross"))):
            got2 = tiny.model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert tiny.model.config._attn_implementation == "aligned"
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert torch.allclose(got2, want, atol=1e-5)


def test_generate_equals_transformers(tiny, tiny_dir):
    ref = T5ForConditionalGeneration.from_pretrained(str(tiny_dir), attn_implementation="sdpa").eval()
    ids, mask = _batch(3)
    kw = dict(max_new_tokens=6, do_sample=False, num_beams=1)
    with torch.no_grad():
        assert torch.equal(
            ref.generate(input_ids=ids, attention_mask=mask, **kw),
            tiny.model.generate(input_ids=ids, attention_mask=mask, **kw),
        )


def _stats(model, ids, mask, tau=1.0, chunk_bytes=256 * 2**20, spec=None, targets=("encoder",)):
    rec = Recorder(spec or ProbeSpec(), mask.bool())
    with torch.no_grad(), attention_call(Choice.of(tau=tau, targets=targets), Pass(chunk_bytes=chunk_bytes), rec):
        h = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    return h, rec.finish()


def test_tau_below_one_sharpens_every_layer(tiny):
    ids, mask = _batch(1)
    _, r1 = _stats(tiny.model, ids, mask, 1.0)
    _, r6 = _stats(tiny.model, ids, mask, 0.6)
    assert (r6.pmax.mean(-1) > r1.pmax.mean(-1)).all()
    assert (r6.entropy.mean(-1) < r1.entropy.mean(-1)).all()


def test_tau_changes_only_targeted_attention(tiny):
    ids, mask = _batch(2)
    h1, _ = _stats(tiny.model, ids, mask, 1.0)
    h_dec, _ = _stats(tiny.model, ids, mask, 0.5, targets=("decoder",))
    h_enc, _ = _stats(tiny.model, ids, mask, 0.5, targets=("encoder",))
    assert torch.equal(h1, h_dec)  # decoder-only tau leaves the encoder alone
    assert not torch.allclose(h1, h_enc)


def test_chunked_equals_unchunked(tiny):
    ids, mask = _batch(4, n=90, pad_from=70)
    h_big, r_big = _stats(tiny.model, ids, mask, 0.7)
    # a budget of ~1 row per block: 90 blocks per layer
    h_small, r_small = _stats(tiny.model, ids, mask, 0.7, chunk_bytes=1)
    # float32 noise only: another CPU's GEMM kernels (an Intel Xeon with torch 2.11) differ by ~1e-5 between
    # block shapes; a block-boundary bug moves hidden states by ~0.1
    torch.testing.assert_close(h_small, h_big, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(r_big.pmax, r_small.pmax, atol=1e-6)
    np.testing.assert_allclose(r_big.entropy, r_small.entropy, atol=1e-5)
    np.testing.assert_allclose(r_big.heatmap_mean, r_small.heatmap_mean, atol=1e-6)
    np.testing.assert_allclose(r_big.sorted_logits, r_small.sorted_logits, atol=1e-4)


@pytest.mark.parametrize(
    "tau", [1.0, 0.6, [[0.5, 0.7, 0.9, 1.0], [0.8, 0.6, 1.0, 0.55]]], ids=["tau-1", "tau-0.6", "per-head"]
)
@pytest.mark.parametrize("chunk_bytes", [1, 2000, 256 * 2**20], ids=["row-blocks", "small-blocks", "one-block"])
def test_fused_path_equals_the_probed_path(tiny, tau, chunk_bytes):
    """Without a recorder the blocks go through torch's fused kernel, the bias divided into a
    buffer every block of the layer reuses: the encoder must compute exactly
    what the probed softmax does, padded rows included, whatever the block size."""
    ids, mask = _batch(7, n=90, pad_from=70)
    want, _ = _stats(tiny.model, ids, mask, tau)
    with torch.no_grad(), attention_call(Choice.of(tau=tau), Pass(chunk_bytes=chunk_bytes)):
        enc = tiny.model.get_encoder()
        got = enc(input_ids=ids, attention_mask=mask).last_hidden_state
        again = enc(input_ids=ids, attention_mask=mask).last_hidden_state  # a second pass in the same call
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()  # q / tau per head rounds ~2e-5
    assert torch.equal(got, again)
    with torch.no_grad(), attention_call(Choice.of(tau=0.5), Pass(chunk_bytes=chunk_bytes)):
        other = tiny.model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert not torch.allclose(other, got, atol=1e-3)  # tau does reach the fused path


def test_per_layer_and_per_head_schedules(tiny):
    ids, mask = _batch(5)
    _, r_one = _stats(tiny.model, ids, mask, 0.6)
    _, r_layers = _stats(tiny.model, ids, mask, [0.6, 0.6])
    _, r_heads = _stats(tiny.model, ids, mask, [[0.6] * 4, [0.6] * 4])
    np.testing.assert_allclose(r_one.pmax, r_layers.pmax)
    np.testing.assert_allclose(r_one.pmax, r_heads.pmax)
    _, r_mixed = _stats(tiny.model, ids, mask, [0.6, 1.0])
    _, r_base = _stats(tiny.model, ids, mask, 1.0)
    assert r_mixed.pmax[:, 0].mean() > r_base.pmax[:, 0].mean()  # layer 0 sharpened
    with pytest.raises(ValueError, match="per-layer tau needs 2"):
        Schedule.of([0.5, 0.5, 0.5]).matrix(2, 4)
    with pytest.raises(ValueError, match="tau must be"):
        Schedule.of(0.0)


def test_threads_keep_their_own_tau(tiny):
    ids, mask = _batch(6)
    want = {t: _stats(tiny.model, ids, mask, t)[1].pmax for t in (1.0, 0.6)}
    got: dict[float, list] = {1.0: [], 0.6: []}
    barrier = threading.Barrier(2)

    def worker(t):
        barrier.wait()
        for _ in range(4):
            got[t].append(_stats(tiny.model, ids, mask, t, chunk_bytes=2000)[1].pmax)

    threads = [threading.Thread(target=worker, args=(t,)) for t in (1.0, 0.6)]
    [th.start() for th in threads]
    [th.join() for th in threads]
    for t in (1.0, 0.6):
        assert len(got[t]) == 4
        for p in got[t]:
            np.testing.assert_allclose(p, want[t], atol=1e-6)
    assert not np.allclose(want[1.0], want[0.6])


def test_cosine_mode(tiny_cos_dir):
    from core.models import load

    cos = load(str(tiny_cos_dir), device="cpu")
    assert cos.cosine and cos.cosine_scale == 24.0
    ids, mask = _batch(7)
    rec = Recorder(ProbeSpec(), mask.bool())
    with torch.no_grad(), attention_call(TRAINED, None, rec):
        cos.model.get_encoder()(input_ids=ids, attention_mask=mask)
    r = rec.finish()
    assert r.cosine_hist is not None and r.cosine_hist.sum() > 0
    # larger s -> sharper attention (CosScale approaches a window)
    _, lo = _stats(cos.model, ids, mask, 1.0)
    rec = Recorder(ProbeSpec(), mask.bool())
    with torch.no_grad(), attention_call(Choice.of(cosine_scale=96.0), None, rec):
        cos.model.get_encoder()(input_ids=ids, attention_mask=mask)
    hi = rec.finish()
    assert hi.pmax.mean() > lo.pmax.mean()


def test_block_budget_is_checked():
    for bad in (0, -5, 1.5):
        with pytest.raises(ValueError, match="chunk_bytes"):
            Pass(chunk_bytes=bad)


# -- a tau per query row (Llama 4's attention temperature tuning) ---------------------------------------------


class _EncoderModule(torch.nn.Module):
    """What aligned_attention reads of a T5 attention module: not a decoder, layer 0, no cosine config."""

    is_decoder = False
    layer_idx = 0


@pytest.mark.parametrize("chunk_bytes", [1, 4000, 256 * 2**20], ids=["row-blocks", "small-blocks", "one-block"])
@pytest.mark.parametrize("probed", [False, True], ids=["fused", "probed"])
def test_row_tau_divides_each_row_by_its_own_tau(chunk_bytes, probed):
    """softmax((q.k + bias) / tau_row) @ v, row by row, with tau_row = 1 / (0.1 ln(1 + floor((p + 1) / 4)) + 1):
    written out here by hand, for the fused kernel and the probed softmax, whatever the block size."""
    from core.mechanics.attention import aligned_attention

    g = torch.Generator().manual_seed(0)
    b, h, n, d = 2, 3, 23, 8
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    bias = torch.randn(1, h, n, n, generator=g)
    mask = torch.ones(b, 1, n, n, dtype=torch.bool)
    mask[1, :, :, 17:] = False  # padding of the second item
    pos = torch.arange(n, dtype=torch.float64)
    row = (1.0 / (0.1 * torch.log(1 + torch.floor((pos + 1) / 4)) + 1.0)).float()
    logits = (q @ k.transpose(-1, -2) + bias) / row[:, None]
    logits = logits.masked_fill(~mask, torch.finfo(torch.float32).min)
    want = (torch.softmax(logits, -1) @ v).transpose(1, 2)
    rec = Recorder(ProbeSpec(), mask[:, 0, 0]) if probed else None
    with torch.no_grad(), attention_call(Choice.of(tau=RowTau(floor_scale=4)), Pass(chunk_bytes=chunk_bytes), rec):
        got, _ = aligned_attention(_EncoderModule(), q, k, v, mask, scaling=1.0, position_bias=bias)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert row[2] == 1.0 and row[3] < 1.0  # rows before floor_scale - 1 keep tau = 1; the schedule does act


def test_row_tau_in_a_model_and_its_keys(tiny):
    ids, mask = _batch(8, n=90, pad_from=70)
    with torch.no_grad():
        plain, _ = _stats(tiny.model, ids, mask, 1.0)
        rows, rec = _stats(tiny.model, ids, mask, RowTau(floor_scale=16))
        with attention_call(Choice.of(tau=RowTau(floor_scale=16))):  # fused path: the same numbers
            fused = tiny.model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        huge, _ = _stats(tiny.model, ids, mask, RowTau(floor_scale=10_000))  # every row before floor_scale: tau = 1
    assert torch.allclose(rows, fused, atol=1e-4)
    assert not torch.allclose(rows, plain, atol=1e-3)
    assert torch.equal(huge, plain)
    assert rows[:, :15].sub(plain[:, :15]).abs().max() > 0  # bidirectional: early rows see the sharpened layers below
    r = RowTau(floor_scale=16)
    s = Schedule.of(r)
    assert s.key() == Schedule.of(RowTau(16, 0.1)).key() != Schedule.of(RowTau(16, 0.2)).key()
    assert s.to_json() == {"scheme": "llama4", "floor_scale": 16, "attn_scale": 0.1}
    assert Schedule.of(s.to_json()) == s and RowTau.from_dict(s.to_json()) == r
    want = float(np.mean([1 / (0.1 * np.log1p((p + 1) // 16) + 1) for p in range(90)]))
    assert s.mean(90) == pytest.approx(want, rel=1e-12)
    assert np.unique(s.matrix(2, 4, rows=90)).item() == pytest.approx(want)
    for bad in (
        dict(floor_scale=0),
        dict(floor_scale=2.5),
        dict(floor_scale=4, attn_scale=float("nan")),
        dict(floor_scale=4, scheme="qwen"),
        dict(floor_scale=10**400),
        dict(floor_scale=4, attn_scale=1e300),
    ):
        with pytest.raises(ValueError):
            RowTau(**bad)


# -- one softmax block: the backends and their choice ---------------------------------------------------------


def _block_inputs(tau="head", **kw):
    """A call's inputs as aligned_attention makes them: 2 items x 3 heads x 37 rows, a RelativeBias, item 1's
    keys from 29 on padded ([B, 1, 1, K]: what the kernel reads as one row of keys per item)."""
    from core.mechanics.relative_bias import RelativeBias
    from core.mechanics.softmax_block import Inputs

    g = torch.Generator().manual_seed(1)
    b, h, n, d = 2, 3, 37, 8
    q, k, v = (torch.randn(b, h, n, d, generator=g) * 2 for _ in range(3))
    mask = torch.ones(b, 1, 1, n, dtype=torch.bool)
    mask[1, ..., 29:] = False
    t = {
        "head": torch.tensor([0.5, 0.8, 1.3]).view(h, 1, 1),
        "row": torch.linspace(0.6, 1.2, n).view(1, n, 1),
        None: None,
    }[tau]
    args = dict(
        query=q, key=k, value=v, mask=mask, bias=RelativeBias(torch.randn(h, 2 * n - 1, generator=g), n, n), tau=t
    )
    return Inputs(**{**args, **kw})


def test_choose_backend_is_the_one_place_with_the_rules(monkeypatch):
    import dataclasses

    from core.mechanics import fused_softmax
    from core.mechanics import softmax_block as sb

    probed = sb.Needs(stats=True)
    x = _block_inputs()
    kernel = sb.CPU_KERNEL if fused_softmax.available() else sb.SDPA
    assert sb.choose_backend(x) == kernel
    assert sb.choose_backend(dataclasses.replace(x, needs=probed)) == (
        sb.CPU_KERNEL if fused_softmax.available() else sb.TORCH
    )
    # what only the torch backend does: whole weights, dropout, autograd with probes
    for change in (dict(weights=True), dict(dropout=0.1), dict(grad=True, needs=probed)):
        assert sb.choose_backend(dataclasses.replace(x, **change)) == sb.TORCH, change
    # causal rows (a decoder's prefill): the C++ kernel where it is built, probed or not
    for needs in (None, probed):
        assert sb.choose_backend(dataclasses.replace(x, causal=True, mask=None, needs=needs)) == (
            sb.CPU_KERNEL if fused_softmax.available() else sb.TORCH
        )
    assert sb.choose_backend(dataclasses.replace(x, grad=True)) == sb.SDPA  # autograd, nothing probed
    assert (
        sb.choose_backend(dataclasses.replace(x, query=x.query.double(), key=x.key.double(), value=x.value.double()))
        == sb.SDPA
    )
    monkeypatch.setenv(fused_softmax.ENV_SWITCH, "0")
    assert sb.choose_backend(x) == sb.SDPA
    assert sb.choose_backend(dataclasses.replace(x, needs=probed)) == sb.TORCH
    # the CUDA kernel: registered, available only with a GPU and Triton, never chosen for a CPU tensor
    assert (
        sb.CUDA in sb.BACKENDS
        and sb.BACKENDS[sb.CUDA].available == torch.cuda.is_available()
        and sb.BACKENDS[sb.CUDA].available == sb._cuda_usable()
    )
    assert sb.cuda_serves(x) and sb.cuda_serves(dataclasses.replace(x, needs=probed))
    for change in (
        dict(weights=True),
        dict(grad=True),
        dict(needs=sb.Needs(stats=True, probs=True)),
        dict(needs=sb.Needs(raw_rows=lambda a, b: None)),
    ):
        assert not sb.cuda_serves(dataclasses.replace(x, **change)), change


@pytest.mark.parametrize("tau", ["head", "row", None])
def test_every_backend_gives_the_same_block(tau):
    """One Inputs, blocks of 10 rows: the kernel's and torch's Blocks carry the same exp, row sums, entropy
    dots and raw-logit rows, and every backend (sdpa included) the same output rows."""
    import dataclasses

    from core.mechanics import flash_attention, fused_softmax
    from core.mechanics import softmax_block as sb

    x = _block_inputs(tau, needs=sb.Needs(stats=True, raw_rows=lambda r0, r1: torch.arange(0, r1 - r0, 3)))
    names = [sb.TORCH, sb.SDPA] + ([sb.CPU_KERNEL] if fused_softmax.available() else [])
    # the CUDA kernel on Triton's interpreter (no GPU here): output and row statistics only
    names += [sb.CUDA] if flash_attention.has_triton() and flash_attention.interpreted() else []
    blocks = {}
    for name in names:
        given = (
            dataclasses.replace(x, needs=None)
            if name == sb.SDPA
            else dataclasses.replace(x, needs=sb.Needs(stats=True))
            if name == sb.CUDA
            else x
        )
        rows = sb.open_backend(name, given, 10)
        blocks[name] = []
        for r0 in range(0, 37, 10):
            blk = rows(r0, min(37, r0 + 10))
            # the kernel's and torch's exp may live in a buffer the next block overwrites: copy what is compared
            blocks[name].append(dataclasses.replace(blk, exp=None if blk.exp is None else blk.exp.clone()))
    ref = blocks[sb.TORCH]
    for name in names:
        for a, b in zip(blocks[name], ref, strict=True):
            assert (a.r0, a.r1) == (b.r0, b.r1)
            torch.testing.assert_close(a.out, b.out, atol=1e-4, rtol=1e-4)  # float32 noise of block shapes
            if name == sb.SDPA:
                assert a.exp is None and a.total is None and a.dot is None and a.raw is None
                continue
            if name == sb.CUDA:  # its total and dot are relative to its row max, as torch's are
                assert a.exp is None and a.raw is None
                torch.testing.assert_close(a.total, b.total, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(a.dot, b.dot, atol=1e-4, rtol=1e-4)
                continue
            torch.testing.assert_close(a.exp, b.exp, atol=1e-6, rtol=1e-5)  # below exp(-87): torch 1.6e-38, kernel 0
            torch.testing.assert_close(a.total, b.total, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(a.dot, b.dot, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(a.raw, b.raw, atol=1e-5, rtol=1e-5)
    want = (
        torch.softmax(
            (x.query @ x.key.transpose(-1, -2) + x.bias.full()) / (1 if x.tau is None else x.tau)
            + torch.where(x.mask, 0.0, torch.finfo(torch.float32).min),
            -1,
        )
        @ x.value
    )
    torch.testing.assert_close(torch.cat([b.out for b in ref], 2), want, atol=1e-4, rtol=1e-4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref[0].r0 = 1


@pytest.mark.parametrize("dropout", [0.0, 0.5], ids=["no-dropout", "dropout"])
def test_training_with_probes_and_weights(dropout):
    """Autograd through the torch backend with a recorder and whole weights (no out= buffers while it records):
    the gradients flow, the weights' masked keys are exactly 0, and without dropout the output, Pmax and H are
    those of the same pass without autograd."""
    from core.mechanics.attention import aligned_attention

    x = _block_inputs()
    mask = x.mask.expand(-1, -1, 37, -1)
    module = _EncoderModule().train()
    q, k, v = (t.clone().requires_grad_() for t in (x.query, x.key, x.value))
    runs = {}
    for grad in (True, False):
        rec = Recorder(ProbeSpec.stats_only(), x.mask[:, 0, 0])
        with torch.set_grad_enabled(grad), attention_call(Choice.of(tau=0.7), None, rec):
            out, w = aligned_attention(
                module, q, k, v, mask, scaling=1.0, dropout=dropout, position_bias=x.bias.full(), output_attentions=True
            )
        runs[grad] = out, w, rec.finish()
    out, w, r = runs[True]
    out.square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))
    assert (w[1, :, :, 29:] == 0).all() and (w[0] > 0).any()
    assert np.isfinite(r.pmax).all() and np.isfinite(r.entropy).all()
    if not dropout:
        torch.testing.assert_close(out.detach(), runs[False][0])
        torch.testing.assert_close(w.detach(), runs[False][1])
        np.testing.assert_allclose(r.pmax, runs[False][2].pmax, rtol=1e-6)
        np.testing.assert_allclose(r.entropy, runs[False][2].entropy, rtol=1e-6)
