"""The CUDA path (skipped without a GPU; CI has none): what ran only on CPUs until a GPU found it broken.

bench/gpu.py is the timing check; these are the correctness checks. The first
GPU run of the engine failed in ``Recorder.finish`` (sums on the GPU divided
by a row count on the CPU): every probed pass on CUDA, the app's included.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.data import tasks
from core.mechanics.probes import ProbeSpec
from core.models import load
from core.runs import engine
from core.values.choice import Choice

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def pair(tiny_dir):
    return load(str(tiny_dir), device="cpu"), load(str(tiny_dir), device="cuda", dtype="float32")


def test_probed_run_on_cuda_float32_equals_the_cpu(pair):
    cpu, gpu = pair
    assert gpu.device.type == "cuda" and gpu.dtype == torch.float32
    doc = tasks.make("passkey", cpu.tokenizer, 900, depth=0.4, seed=3)
    for tau in (1.0, 0.6):
        a = engine.run(cpu, doc, Choice.of(tau=tau))
        b = engine.run(gpu, doc, Choice.of(tau=tau))
        assert a.answer == b.answer
        np.testing.assert_allclose(b.probes.pmax, a.probes.pmax, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(b.probes.entropy, a.probes.entropy, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(b.probes.profile, a.probes.profile, rtol=1e-3, atol=1e-6)
        np.testing.assert_allclose(b.probes.heatmap_mean, a.probes.heatmap_mean, rtol=1e-3, atol=1e-6)
        assert b.probes.nonfinite_layers == []


def test_batched_stats_on_cuda_bfloat16_are_finite_and_close(pair, tiny_dir):
    cpu, _ = pair
    bf = load(str(tiny_dir), device="cuda")  # the default GPU precision
    assert bf.dtype == torch.bfloat16
    docs = [tasks.make("passkey", cpu.tokenizer, n, seed=s) for s, n in enumerate((300, 520, 700))]
    choice, how = Choice.of(tau=0.7), engine.Pass(probes=ProbeSpec.stats_only())
    a = engine.run_batch(cpu, docs, choice, how, batch_size=3)
    b = engine.run_batch(bf, docs, choice, how, batch_size=3)
    for x, y in zip(a, b):
        assert np.isfinite(y.probes.pmax).all() and y.probes.nonfinite_layers == []
        # bfloat16 keeps 8 bits of mantissa: Pmax agrees to about a percent, not to float32's digits
        np.testing.assert_allclose(y.probes.pmax, x.probes.pmax, rtol=0.05, atol=0.01)


def test_the_cuda_kernel_serves_the_encoder_and_equals_the_cpu(pair, tiny_dir, monkeypatch):
    """The Triton kernel (core.mechanics.flash_attention) on the GPU: a probed pass (map and sorted logits of
    layer 0, Pmax and H and the profile everywhere) takes ``cuda`` for every encoder layer but the map's, and
    the answer, Pmax/H, profile and map equal the CPU float32 pass; in bfloat16 within its precision."""
    from core.mechanics import flash_attention, softmax_block

    if not flash_attention.usable():
        pytest.skip("Triton is not importable here")
    cpu, gpu = pair
    chosen: list[str] = []
    choose = softmax_block.choose_backend
    monkeypatch.setattr(softmax_block, "choose_backend", lambda x: chosen.append(choose(x)) or chosen[-1])
    doc = tasks.make("passkey", cpu.tokenizer, 900, depth=0.4, seed=3)
    a = engine.run(cpu, doc, Choice.of(tau=0.6))
    chosen.clear()
    b = engine.run(gpu, doc, Choice.of(tau=0.6))
    assert chosen.count(softmax_block.CUDA) >= gpu.model.config.num_layers - 1
    assert a.answer == b.answer
    np.testing.assert_allclose(b.probes.pmax, a.probes.pmax, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(b.probes.entropy, a.probes.entropy, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(b.probes.profile, a.probes.profile, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(b.probes.heatmap_mean, a.probes.heatmap_mean, rtol=1e-3, atol=1e-6)
    bf = load(str(tiny_dir), device="cuda")
    c = engine.run(bf, doc, Choice.of(tau=0.6))
    np.testing.assert_allclose(c.probes.pmax, a.probes.pmax, rtol=0.05, atol=0.01)
    np.testing.assert_allclose(c.probes.entropy, a.probes.entropy, rtol=0.05, atol=0.05)
