"""A model whose attention does not run through ours is refused at load, never run with tau doing nothing.

Issue 49: on a GPU with transformers 5.17, sdpa and "ours" took the same time and memory: tau was not in
effect and nothing said so. ``core.models.load`` now runs a 4-token pass and counts the calls our attention
function serves (:func:`core.mechanics.attention.served_by_us`); none is a one-line ModelLoadError.
"""

from __future__ import annotations

import pytest
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from conftest import build_tiny_t5
from core import models
from core.errors import ModelLoadError
from core.kinds import ATTN_NAME
from core.mechanics import attention


def test_a_loaded_model_runs_our_attention_and_sdpa_does_not(tmp_path):
    loaded = models.load(str(build_tiny_t5(tmp_path)))  # its own model: the loader's cache keeps what it loads
    assert attention.served_by_us(loaded.model)
    attention.set_implementation(loaded.model, "sdpa")
    assert not attention.served_by_us(loaded.model)
    attention.set_implementation(loaded.model, ATTN_NAME)
    assert attention.served_by_us(loaded.model)


def test_a_model_built_with_sdpa_and_switched_runs_ours_in_every_layer():
    """The cause of issue 49's GPU run with transformers 5.17: its ``set_attn_implementation`` left T5's
    encoder and decoder stacks on sdpa. ``set_implementation`` reaches every config, on any release."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from engine import tiny_t5

    model = tiny_t5(attn="sdpa")
    attention.set_implementation(model, ATTN_NAME)
    assert {c._attn_implementation for c in attention.configs(model)} == {ATTN_NAME}
    assert attention.served_by_us(model)


def test_a_transformers_that_dispatches_elsewhere_is_refused_at_load(tmp_path, monkeypatch):
    """Our name bound to transformers' own eager T5 attention, as a release that does not call the registered
    function would behave: the load stops with one line naming transformers' version."""
    from transformers.models.t5.modeling_t5 import eager_attention_forward

    from core.mechanics.relative_bias import RelativeBias

    def elsewhere(module, query, key, value, mask, position_bias=None, **kwargs):
        if isinstance(position_bias, RelativeBias):
            position_bias = position_bias.full()
        return eager_attention_forward(module, query, key, value, mask, position_bias=position_bias, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, ATTN_NAME, elsewhere)
    with pytest.raises(ModelLoadError) as err:
        models.load(str(build_tiny_t5(tmp_path)))
    text = str(err.value)
    assert "tau would change nothing" in text and "transformers" in text and "\n" not in text
