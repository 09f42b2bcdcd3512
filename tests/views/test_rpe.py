"""T5 buckets against the paper's formula, written out here independently, and bias curves."""

from __future__ import annotations

import math

import numpy as np
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from core.views.rpe import bias_curves, relative_bucket


def paper_bucket(n: int, num_buckets: int = 32, max_distance: int = 128) -> int:
    """Raffel et al.: bidirectional; 16 buckets per side; 8 exact, 8 log-spaced to 128."""
    half = num_buckets // 2
    offset = half if n > 0 else 0
    d = abs(n)
    exact = half // 2
    if d < exact:
        return offset + d
    b = exact + int(math.log(d / exact) / math.log(max_distance / exact) * (half - exact))
    return offset + min(b, half - 1)


def test_bucket_matches_paper_formula():
    rel = np.arange(-3000, 3001)
    got = relative_bucket(rel)
    want = np.array([paper_bucket(int(n)) for n in rel])
    np.testing.assert_array_equal(got, want)
    # and transformers' own implementation
    t5 = T5Attention._relative_position_bucket(torch.from_numpy(rel), True, 32, 128).numpy()
    np.testing.assert_array_equal(got, t5)


def test_bucket_landmarks():
    b = relative_bucket(np.array([0, 1, 7, 8, 127, 128, 5000, -1, -128, -5000]))
    assert list(b[:4]) == [0, 17, 23, 24]
    assert b[5] == b[6] == 31 and b[8] == b[9] == 15


def test_bias_curves(tiny):
    curves = bias_curves(tiny.model, query_position=100, length=400)
    assert curves.shape == (4, 400)
    w = tiny.model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.detach().numpy()
    assert np.allclose(curves[:, 100], w[0])  # distance 0 -> bucket 0
    assert np.allclose(curves[:, 399], w[31]) and np.allclose(curves[:, 300], w[31])  # >= 128 ahead
