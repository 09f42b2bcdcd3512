"""L_tr of a decoder-only folder without a card: the context it was trained at, read from its config, so that a
user's own Llama opens at its own L_tr (not the 512 assumed for a folder that says nothing)."""

from __future__ import annotations

import json

import pytest

from core.errors import UserError
from core.models.catalog import resolve


def _folder(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return str(tmp_path)


def test_max_position_embeddings_is_the_training_length(tmp_path):
    assert resolve(_folder(tmp_path, max_position_embeddings=8192)).train_length == 8192


@pytest.mark.parametrize("key", ["rope_parameters", "rope_scaling"])
def test_a_stretched_context_reads_its_original_length(tmp_path, key):
    """Llama 3.1 ships rope scaling that stretches 8,192 to 131,072: L_tr is the 8,192 it was trained at."""
    scaling = {"rope_type": "llama3", "factor": 16.0, "original_max_position_embeddings": 8192}
    spec = resolve(_folder(tmp_path, max_position_embeddings=131072, **{key: scaling}))
    assert spec.train_length == 8192


def test_a_card_wins_and_silence_means_512(tmp_path):
    folder = _folder(tmp_path, max_position_embeddings=4096)
    (tmp_path / "card.json").write_text(json.dumps({"train_length": 1000}))
    assert resolve(folder).train_length == 1000
    (tmp_path / "card.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert resolve(folder).train_length == 512


def test_a_nonsense_length_is_one_line(tmp_path):
    with pytest.raises(UserError, match="max_position_embeddings"):
        resolve(_folder(tmp_path, max_position_embeddings=-3))
