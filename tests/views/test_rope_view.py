"""core.views.rope_view: the mean logit by relative distance against a hand computation and against the raw logits our
attention's own probe records, and the masked tokens' predictions against core.experiments.mlm.score."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import build_tiny_rope
from core.experiments import mlm
from core.mechanics.attention import attention_call
from core.mechanics.probes import ProbeSpec, Recorder
from core.models import load
from core.values.choice import TRAINED, Choice
from core.views import rope_view


@pytest.fixture(scope="module")
def rope(tmp_path_factory):
    return load(str(build_tiny_rope(tmp_path_factory.mktemp("rope-view"), train_length=64)), device="cpu")


def test_mean_logit_by_distance_by_hand():
    # one head, L = 3, d = 1: q = 1, 2, 3 and k = 4, 5, 6, so q_i . k_j = q_i * k_j
    q = np.array([[[1.0], [2.0], [3.0]]])
    k = np.array([[[4.0], [5.0], [6.0]]])
    d, mean = rope_view.mean_logit_by_distance(q, k)
    assert d.tolist() == [-2, -1, 0, 1, 2]
    # d = key - query: d = -2 is (query 2, key 0); d = 1 is (0, 1) and (1, 2)
    expected = [3 * 4, (2 * 4 + 3 * 5) / 2, (1 * 4 + 2 * 5 + 3 * 6) / 3, (1 * 5 + 2 * 6) / 2, 1 * 6]
    np.testing.assert_allclose(mean[0], expected, rtol=1e-12)


def test_mean_logit_by_distance_equals_a_loop():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(3, 7, 4)), rng.normal(size=(3, 7, 4))
    d, mean = rope_view.mean_logit_by_distance(q, k)
    for h in range(3):
        for j, dist in enumerate(d):
            pairs = [q[h, i] @ k[h, i + dist] for i in range(7) if 0 <= i + dist < 7]
            assert mean[h, j] == pytest.approx(np.mean(pairs), abs=1e-12)
    with pytest.raises(ValueError):
        rope_view.mean_logit_by_distance(q, k[:, :5])


@pytest.mark.parametrize("layer", [0, 1])
def test_curves_equal_the_diagonals_of_the_logits_probe(rope, layer):
    """The q and k the view reads are the ones the attention makes its logits from: the mean of each diagonal of
    the raw logits our attention's ``logits`` probe records (q.k x 1/sqrt(d), after the rotary embedding)."""
    ids = rope.tokenizer("The river runs past the old mill and into the quiet town below the hill.").input_ids
    curves = rope_view.distance_curves(rope, np.asarray(ids), layer)
    rec = Recorder(ProbeSpec.of(f"encoder.{layer}.logits"), torch.ones(1, len(ids), dtype=torch.bool))
    with torch.inference_mode(), attention_call(TRAINED, None, rec):
        rope.encoder(input_ids=torch.tensor([ids]))
    z = rec.finish()[f"encoder.{layer}.logits"][0].double().numpy()  # [heads, L, L]
    n = len(ids)
    assert curves.tokens == n and curves.distances.tolist() == list(range(-(n - 1), n))
    for j, dist in enumerate(curves.distances):
        want = np.array([np.diagonal(z[h], offset=int(dist)).mean() for h in range(rope.n_heads)])
        np.testing.assert_allclose(curves.mean[:, j], want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("tau", [1.0, 0.6])
def test_masked_predictions_equal_mlm_score(rope, tau):
    _, seq = mlm.sequence(rope, 128, seed=3)
    choice = Choice.of(tau=tau)
    pred = rope_view.masked_predictions(rope, seq, choice)
    scored = mlm.score(rope, [seq], choice)
    assert pred.masked == scored.masked and pred.correct == scored.correct
    assert float(pred.nll.sum()) == pytest.approx(scored.nll, rel=1e-6)
    assert pred.positions.tolist() == seq.positions.tolist() and pred.labels.tolist() == seq.labels.tolist()
    np.testing.assert_allclose(pred.p_true, np.exp(-pred.nll))
    c = rope_view.card(pred, rope.tokenizer, shown=3)
    assert c["accuracy"] == scored.correct / scored.masked and len(c["rows"]) == 3
    assert c["rows"][0][1] == rope.tokenizer.decode([int(seq.labels[0])])


@pytest.mark.parametrize("spec", ["window:window=2", "streaming-llm:window=1:sinks=2", "lm-infinite:window=3:sinks=1"])
def test_mask_cells_pool_the_schemes_mask(spec):
    """The overlay's cells are the masked share of Bound.mask over each cell, pooled on uneven edges; a scheme
    without a mask has none."""
    from core.values import positions

    bound = positions.Scheme.of(spec).bind(8, 11)
    edges = np.array([0, 3, 4, 8, 11])
    got = rope_view.mask_cells(bound, edges)
    full = bound.mask(11, 11).numpy()
    want = np.array(
        [[1.0 - full[edges[a] : edges[a + 1], edges[b] : edges[b + 1]].mean() for b in range(4)] for a in range(4)]
    )
    np.testing.assert_allclose(got, want, atol=1e-7)
    assert got.shape == (4, 4) and 0 < got.max() <= 1 and got.min() == 0  # something masked, the diagonal seen


def test_mask_cells_by_hand_and_in_blocks(monkeypatch):
    # window w = 1 on 4 tokens, one token per cell: masked where |i - j| > 1
    bound = positions_bind("window", 4, 4, window=1)
    got = rope_view.mask_cells(bound, np.arange(5))
    assert got.tolist() == [[0, 0, 1, 1], [0, 0, 0, 1], [1, 0, 0, 0], [1, 1, 0, 0]]
    # two cells of two tokens: cell (0, 1) holds pairs (0,2) (0,3) (1,2) (1,3) of which (0,2) (0,3) (1,3) are masked
    assert rope_view.mask_cells(bound, np.array([0, 2, 4])).tolist() == [[0, 0.75], [0.75, 0]]
    # blocks of rows that cut through a cell give the same cells
    long = positions_bind("streaming-llm", 16, 50, window=4, sinks=2)
    edges = np.array([0, 7, 19, 20, 33, 50])
    whole = rope_view.mask_cells(long, edges)
    monkeypatch.setattr(rope_view, "MASK_BLOCK_ROWS", 5)
    np.testing.assert_allclose(rope_view.mask_cells(long, edges), whole, atol=1e-7)
    assert rope_view.mask_cells(positions_bind("pi", 4, 8), edges) is None
    assert rope_view.mask_cells(None, edges) is None


def positions_bind(name, train_length, length, **params):
    from core.values import positions

    return positions.get(name).bind(train_length, length, **params)
