"""engine.run end to end on a tiny model: spans, probes, batching, refusals."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from core.data import tasks
from core.errors import InputTooLong, NumericalError, UserError
from core.mechanics.probes import ProbeSpec
from core.models import memory
from core.runs import calibration, engine, methods
from core.values.choice import TRAINED, Choice


@pytest.fixture(scope="module")
def doc(tiny):
    return tasks.make("passkey", tiny.tokenizer, 600, depth=0.3, seed=1)


def test_run_maps_needle_and_question(tiny, doc):
    r = engine.run(tiny, doc)
    a, b = r.needle_tokens
    text = doc.text[r.offsets[a][0] : r.offsets[b - 1][1]]
    assert doc.expected in text and "pass key" in text
    qa, qb = r.question_tokens
    assert "What is the pass key?" in doc.text[r.offsets[qa][0] : r.offsets[qb - 1][1]]
    assert r.tokens == len(tiny.tokenizer(doc.text).input_ids)
    assert r.probes.profile.shape == (tiny.n_layers, r.tokens)
    assert r.probes.pmax.shape == (1, tiny.n_layers, tiny.n_heads)
    s = r.summary()
    for key in ("answer", "expected", "correct", "tau", "tokens", "train_length", "seconds", "layers"):
        assert key in s
    assert [l["layer"] for l in s["layers"]] == list(range(tiny.n_layers))
    assert set(r.seconds) >= {"tokenize", "encode", "generate", "total"}


def test_tau_in_result_and_sharper(tiny, doc):
    r1 = engine.run(tiny, doc, Choice.of(tau=1.0))
    r6 = engine.run(tiny, doc, Choice.of(tau=0.6))
    assert np.all(r6.tau == 0.6) and r6.pmax > r1.pmax and r6.entropy < r1.entropy


def test_batch_equals_single(tiny):
    docs = [tasks.make("passkey", tiny.tokenizer, n, seed=s) for n, s in [(290, 1), (340, 2), (300, 3)]]
    singles = [engine.run(tiny, d, Choice.of(tau=0.8)) for d in docs]
    batch = engine.run_batch(tiny, docs, Choice.of(tau=0.8), engine.Pass(probes=ProbeSpec.stats_only()), batch_size=3)
    for s, b in zip(singles, batch):
        assert s.answer == b.answer
        np.testing.assert_allclose(s.probes.pmax, b.probes.pmax, atol=1e-5)
        np.testing.assert_allclose(s.probes.entropy, b.probes.entropy, atol=1e-4)


def test_too_long_is_refused_with_the_limit(tiny, doc, monkeypatch):
    monkeypatch.setattr(memory, "free_bytes", lambda device: 4 * 2**30)
    cap = engine.max_tokens(tiny)
    long_doc = tasks.make("passkey", tiny.tokenizer, cap + 200, seed=0)
    with pytest.raises(InputTooLong) as err:
        engine.run(tiny, long_doc)
    assert f"{cap:,}" in str(err.value)


def test_empty_text_is_refused(tiny):
    with pytest.raises(UserError, match="empty"):
        engine.run(tiny, tasks.Document("text", "   ", "", (0, 0), (0, 0), 0.5, 0))


def test_nan_attention_is_reported(tiny_dir, doc):
    from core.models import load

    broken = load(str(tiny_dir), device="cpu", train_length=257)  # a separate cached copy
    with torch.no_grad():
        broken.model.encoder.block[1].layer[0].SelfAttention.q.weight.fill_(float("nan"))
    with pytest.raises(NumericalError, match="NaN") as err:
        engine.run(broken, doc)
    # a float32 run is not told that float16 overflows (issue 36): it is told what can leave float32's range
    assert "float16" not in str(err.value) and "float32" in str(err.value) and "\n" not in str(err.value)


def test_reference_document_is_at_train_length(tiny, doc):
    ref = calibration.reference_document(tiny, doc)
    n = len(tiny.tokenizer(ref.text).input_ids)
    assert abs(n - tiny.train_length) <= 16 and ref.seed == doc.seed and ref.task == doc.task


def test_text_reference_keeps_needle(tiny):
    text = " ".join(f"Sentence number {i} talks about nothing much." for i in range(60))
    d = tasks.from_text(text, tiny.tokenizer, depth=0.7, seed=3)
    ref = calibration.reference_document(tiny, d)
    assert len(tiny.tokenizer(ref.text).input_ids) <= tiny.train_length
    assert d.expected in ref.text[ref.needle_span[0] : ref.needle_span[1]]


def test_resolve_methods(tiny, doc):
    n = len(tiny.tokenizer(doc.text).input_ids)
    assert methods.resolve(tiny, doc, "none")[0].is_one
    assert float(methods.resolve(tiny, doc, "log-length")[0]) == pytest.approx(np.log(256) / np.log(n))
    fast = methods.resolve(tiny, doc, "pmax")
    grid = calibration.calibrate(tiny, doc, "pmax", fast=False)
    assert float(fast[0]) == grid.tau  # the bisection finds Algorithm 1's grid point
    assert fast[1]["passes"] < grid.passes == 11
    sched, _ = methods.resolve(tiny, doc, "per-layer")
    assert sched.ndim == 1 and len(np.asarray(sched)) == tiny.n_layers
    with pytest.raises(UserError):
        methods.resolve(tiny, doc, "fixed")


def test_probes_off_takes_the_fused_path_with_the_same_answers(tiny, tiny_dir, doc):
    """Accuracy-only sweeps run without a recorder; tau and padding must still apply."""
    docs = [tasks.make("passkey", tiny.tokenizer, n, seed=s) for n, s in [(290, 1), (340, 2)]]
    for tau in (1.0, 0.6):
        probed = engine.run_batch(
            tiny, docs, Choice.of(tau=tau), engine.Pass(probes=ProbeSpec.stats_only()), batch_size=2
        )
        off = engine.run_batch(tiny, docs, Choice.of(tau=tau), engine.Pass(probes=ProbeSpec.off()), batch_size=2)
        assert [r.answer for r in off] == [r.answer for r in probed]
        assert all(r.probes is None for r in off)

    from core.models import load

    broken = load(str(tiny_dir), device="cpu", train_length=258)
    with torch.no_grad():
        broken.model.encoder.block[0].layer[0].SelfAttention.k.weight.fill_(float("nan"))
    with pytest.raises(NumericalError, match="NaN"):
        engine.run(broken, doc, TRAINED, engine.Pass(probes=ProbeSpec.off()))


def test_more_decoder_than_encoder_layers_still_generates(tmp_path, doc):
    """generate sizes its own cache from T5's num_layers (the encoder depth); a model a training
    stage grew to more decoder layers must still answer (the engine hands generate a growing cache)."""
    from conftest import build_tiny_t5
    from core.models import load

    deep = load(str(build_tiny_t5(tmp_path / "deep", layers=1, decoder_layers=3)), device="cpu")
    with warnings.catch_warnings():  # and under the cache's current name: no deprecation on every run
        warnings.simplefilter("error", FutureWarning)
        r = engine.run(deep, doc, TRAINED, engine.Pass(max_new_tokens=4))
    assert r.correct is not None  # scored: generate ran through all three decoder layers


def test_runs_build_no_autograd_graph(tiny, doc):
    """Inference must not record autograd history: with it, a batch of ten 4,096-token documents
    kept ~2 GB of saved activations per document (22 GB instead of 1.7 GB), enough to get killed."""
    seen = []
    hooks = [
        m.register_forward_hook(lambda mod, args, out: seen.append(torch.is_grad_enabled()))
        for m in (tiny.model.get_encoder(), tiny.model.get_decoder())
    ]
    try:
        engine.run(tiny, doc, TRAINED, engine.Pass(max_new_tokens=2, probes=ProbeSpec.off()))
    finally:
        for h in hooks:
            h.remove()
    assert len(seen) >= 2 and not any(seen)


def test_where_the_answer_looks(tmp_path, doc):
    """Explore's cross-attention view from one run: answer tokens x document bins, a layer or the mean,
    the needle's share, the table and the figure (token labels that survive plotly's markup)."""
    from conftest import build_tiny_t5
    from core.models import load
    from core.views import plots, tables

    two = load(str(build_tiny_t5(tmp_path / "two", decoder_layers=2)), device="cpu")
    spec = ProbeSpec(heatmap_size=64, names=("cross.*.map", "cross.*.profile"))
    res = engine.run(two, doc, TRAINED, engine.Pass(probes=spec, max_new_tokens=4))
    z, tokens = tables.answer_attention(res)
    assert tokens == res.answer_tokens and z.shape == (len(tokens), 64)
    maps = res.probes["cross.*.map"]
    np.testing.assert_allclose(z, maps.mean(0)[: len(tokens)])
    np.testing.assert_array_equal(tables.answer_attention(res, 1)[0], maps[1][: len(tokens)])
    share = tables.needle_share(res, 0)
    a, b = res.needle_tokens
    assert share == pytest.approx(float(res.probes["cross.0.profile"][a:b].sum())) and 0 < share < 1
    table = tables.answer_attention_table(res, 1)
    assert table.shape == z.shape and table.columns[0] == "key_0"
    fig = plots.answer_attention(
        z, res.probes.heatmap_edges, res.needle_tokens, ["</s>", " 4", "x", "<pad>"][: len(tokens)]
    )
    assert fig.layout.yaxis.ticktext[0] == "0: &lt;/s&gt;" and fig.layout.yaxis.title.text == "answer token"
    assert tables.answer_attention(engine.run(two, doc, TRAINED, engine.Pass(max_new_tokens=2))) is None  # not asked
