"""``run``'s text output says its tau in words: one value for a tau every layer and head shares, and a list only when
it differs by layer, named as a per-layer mean (issue 59: "tau [1.0, 1.0, ...]" for method none, unexplained)."""

from __future__ import annotations

import numpy as np

from core.cli.run import _tau_text


def test_one_tau_everywhere_is_one_value():
    assert _tau_text(np.ones((30, 9))) == "tau 1 (every layer and head)"
    assert _tau_text(np.full((4, 8), 0.86684)) == "tau 0.8668 (every layer and head)"


def test_a_tau_by_layer_is_said_to_be_one():
    tau = np.array([[0.8, 0.8], [0.7, 0.7]])
    assert _tau_text(tau) == "tau by layer (mean over heads) [0.8, 0.7]"
