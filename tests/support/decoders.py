"""The fields every tiny random decoder-only config of the tests shares (Llama, Mistral, Qwen2/3, Gemma 2, Phi-3,
gpt-oss): small enough for a test, grouped-query heads (4 query heads over 2 key/value heads), weights drawn wide
enough (``initializer_range`` 0.2) that attention has structure and tau visibly moves it. A test passes what it
needs otherwise (its vocabulary, length, layers, a family's own window or soft-cap) as keyword arguments."""

from __future__ import annotations

from typing import Any


def tiny_decoder_fields(**overrides: Any) -> dict[str, Any]:
    """The shared fields, ``overrides`` applied (a field given here replaces the default; a new one is added)."""
    return {
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 256,
        "initializer_range": 0.2,
        "tie_word_embeddings": False,
        **overrides,
    }
