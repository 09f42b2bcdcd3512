"""The three attentions of an encoder-decoder Transformer, by the names settings, probes and the CLI use.

A module of its own because everything speaks of them (a temperature's
``targets``, a probe's name ``"encoder.0.pmax"``, the attention function that
finds out which one it serves) and none of those should import another just
for three strings.
"""

#: A decoder-only LLM's causal self-attention (Llama, Mistral, Qwen, ...) is ``DECODER`` too: causal rows, cached
#: decoding steps at the end of the keys, as T5's decoder self-attention (:func:`core.mechanics.attention.attention_kind`).
ENCODER, DECODER, CROSS = "encoder", "decoder", "cross"
#: The attention kinds a temperature can be applied to, and probes named by.
KINDS = (ENCODER, DECODER, CROSS)

#: The ``attn_implementation`` name our attention function is registered under (:mod:`core.mechanics.attention`); here
#: because the lazy relative bias (:mod:`core.mechanics.relative_bias`) hands out its vector only to that function.
ATTN_NAME = "aligned"


def is_aligned(implementation: object) -> bool:
    """Whether a config's ``attn_implementation`` is our function: ``aligned``, or one of the names
    :func:`core.mechanics.attention.standing` registers it under with a model's standing settings (``aligned@3``)."""
    return isinstance(implementation, str) and (
        implementation == ATTN_NAME or implementation.startswith(ATTN_NAME + "@")
    )
