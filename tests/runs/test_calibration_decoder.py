"""Calibrate on a decoder-only LM (issue 56, item 3): Algorithm 1's ``measure`` reads the question's rows at L_ex and
the same question's rows at L_tr (:func:`core.runs.calibration.decoder_records`), checked against transformers' own
eager attention weights on a tiny random Llama; every criterion and per-layer / per-head search resolves on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from core.data import tasks
from core.models import load
from core.runs import calibration, engine, methods
from core.values.choice import Choice
from tests.runs.test_engine_decoder import build_tiny_llama


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama-calib"), kv_heads=2)


@pytest.fixture(scope="module")
def llama(llama_dir):
    return load(str(llama_dir), device="cpu")


@pytest.fixture(scope="module")
def doc(llama):
    return tasks.make("passkey", llama.tokenizer, 400, depth=0.3, seed=1)


def _eager_rows(llama_dir, ids: np.ndarray, rows: tuple[int, int], tau: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, the mean over heads and ``rows`` of each row's Pmax and entropy, from transformers' eager attention
    weights (tau applied as the model's own scaling over tau)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        llama_dir, attn_implementation="eager", dtype=torch.float32
    ).eval()
    for layer in model.model.layers:
        layer.self_attn.scaling = layer.self_attn.scaling / tau
    with torch.no_grad():
        att = model(input_ids=torch.as_tensor(ids)[None], output_attentions=True).attentions
    a, b = rows
    pmax = [float(w[0, :, a:b].amax(-1).mean()) for w in att]
    ent = [float(-(w[0, :, a:b] * torch.log(w[0, :, a:b].clamp_min(1e-30))).sum(-1).mean()) for w in att]
    return np.asarray(pmax), np.asarray(ent)


def test_measure_reads_the_question_rows_as_eager_does(llama, llama_dir, doc):
    enc = engine.encode(llama, doc)
    q = enc.question_rows
    assert enc.question_tokens is not None and q == enc.question_tokens and q[1] - q[0] < enc.n // 4
    meas = calibration.measure(llama, [doc])
    for tau in (1.0, 0.6):
        got = meas(tau)
        pmax, ent = _eager_rows(llama_dir, enc.input_ids, q, tau)
        np.testing.assert_allclose(got.pmax, pmax, rtol=1e-4)
        np.testing.assert_allclose(got.entropy, ent, rtol=1e-4)
    # all rows are not the question's: the mean over every row is another number
    every, _ = _eager_rows(llama_dir, enc.input_ids, (0, enc.n))
    assert not np.allclose(meas(1.0).pmax, every, rtol=1e-3)


def test_reference_is_the_same_question_at_train_length(llama, doc):
    ref = calibration.reference_document(llama, doc)
    enc, ref_enc = engine.encode(llama, doc), engine.encode(llama, ref)
    # the task counts the tokenizer's end token, which a decoder's prompt drops
    assert llama.train_length - 1 <= ref_enc.n <= llama.train_length and 399 <= enc.n <= 400
    a, b = enc.question_rows
    c, d = ref_enc.question_rows
    assert list(enc.input_ids[a:b]) == list(ref_enc.input_ids[c:d])  # the same question's tokens


def test_a_document_without_question_is_read_on_every_row(llama, llama_dir):
    lm = tasks.make("lm", llama.tokenizer, 300, seed=2, continuation=8)
    enc = engine.encode(llama, lm)
    assert enc.question_rows == (0, enc.n)
    (rec,) = calibration.decoder_records(llama, [enc], Choice.of(tau=1.0))
    pmax, _ = _eager_rows(llama_dir, enc.input_ids, (0, enc.n))
    np.testing.assert_allclose(rec.layer_pmax, pmax, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("criterion", ["pmax", "entropy"])
def test_algorithm1_on_a_decoder(llama, doc, criterion):
    meas, reference = calibration.measures(llama, doc)
    cal = calibration.calibrate(llama, doc, criterion, fast=True)
    assert 0 < cal.tau <= 2 and cal.reference == pytest.approx(float(np.mean(getattr(reference, criterion))))
    refined = calibration.calibrate(llama, doc, criterion, fast=True, refined=True)
    assert refined.tau > 0
    both = calibration.both_criteria(meas, reference, fast=True)
    assert both[criterion].tau == pytest.approx(cal.tau)


@pytest.mark.slow
@pytest.mark.parametrize("name", [methods.PER_LAYER, methods.PER_HEAD])
def test_per_layer_and_per_head_on_a_decoder(llama, doc, name):
    tau, info = methods.resolve(llama, doc, name)
    m = tau.matrix(llama.n_layers, llama.n_heads)
    assert m.shape == (llama.n_layers, llama.n_heads) and np.all(m > 0)
    assert info["source"] == "resolved"


def test_prop1_and_prop2_are_refused_in_one_line(llama, doc):
    from core.errors import UserError

    for name in (methods.PROP1, "prop2"):
        with pytest.raises(UserError, match="decoder-only") as err:
            methods.resolve(llama, doc, name)
        assert "\n" not in str(err.value)


def test_a_run_with_question_rows_reads_them_as_eager_does(llama, llama_dir, doc):
    """``ProbeSpec.stats_only(question_rows=True)`` (what a sweep asks of a decoder-only LM): the run's per-layer Pmax
    and H are eager's on the question's rows, the answer is the plain run's, and a left-padded batch reads each
    item's own question (its rows shifted past the padding)."""
    from core.mechanics.probes import ProbeSpec

    enc = engine.encode(llama, doc)
    choice = Choice.of(tau=0.7, targets=("decoder",))
    how = engine.Pass(probes=ProbeSpec.stats_only(question_rows=True), max_new_tokens=4)
    res = engine.run(llama, doc, choice, how, encoded=enc)
    pmax, ent = _eager_rows(llama_dir, enc.input_ids, enc.question_rows, tau=0.7)
    np.testing.assert_allclose(res.probes.layer_pmax, pmax, rtol=1e-4)
    np.testing.assert_allclose(res.probes.layer_entropy, ent, rtol=1e-4)
    every = engine.run(llama, doc, choice, engine.Pass(probes=ProbeSpec.stats_only(), max_new_tokens=4), encoded=enc)
    assert res.answer == every.answer
    assert not np.allclose(res.probes.layer_pmax, every.probes.layer_pmax, rtol=1e-3)
    short = tasks.make("passkey", llama.tokenizer, 250, depth=0.6, seed=4)
    encs = [enc, engine.encode(llama, short)]
    both = engine.run_encoded(llama, [doc, short], encs, choice, how)
    for r, e in zip(both, encs):
        p, h = _eager_rows(llama_dir, e.input_ids, e.question_rows, tau=0.7)
        np.testing.assert_allclose(r.pmax, p.mean(), rtol=1e-4)
        np.testing.assert_allclose(r.entropy, h.mean(), rtol=1e-4)
