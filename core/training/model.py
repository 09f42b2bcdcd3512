"""The model being trained: a fresh T5 of the config's sizes, its tokenizer, and a smaller
source's weights grown into a bigger model (more heads, width or layers) without changing what
it computes."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from core.training.config import TrainConfig


def build_model(cfg: TrainConfig, vocab_size: int):
    """A fresh T5 with the config's sizes (our attention; cosine mode if asked)."""
    from transformers import T5Config, T5ForConditionalGeneration

    from core.mechanics import attention, patches  # importing attention registers "aligned"

    tcfg = T5Config(
        vocab_size=vocab_size,
        d_model=cfg.d_model,
        d_kv=cfg.d_kv,
        d_ff=cfg.d_ff,
        num_layers=cfg.encoder_layers,
        num_decoder_layers=cfg.decoder_layers,
        num_heads=cfg.num_heads,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=float(getattr(cfg, "dropout", 0.0)),
        feed_forward_proj="relu",
        tie_word_embeddings=True,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        n_positions=cfg.train_length,
    )
    if cfg.cosine_scale:
        tcfg.cosine_attention = True
        tcfg.cosine_scale = float(cfg.cosine_scale)
    tcfg._attn_implementation = attention.ATTN_NAME
    torch.manual_seed(cfg.seed)
    model = T5ForConditionalGeneration(tcfg)
    # our attention in every config (should the constructor have left another), and the bias as one vector per
    # head, as at inference (core.mechanics.relative_bias): the load's patches (core.mechanics.patches)
    patches.patch(model, implementation=attention.ATTN_NAME)
    return model


def get_tokenizer(cfg: TrainConfig, reuse: str | Path | None = None):
    """Reuse a saved tokenizer (all bundled models share one), or train the BPE of :mod:`core.models.tokenizer`."""
    from transformers import AutoTokenizer

    if reuse and (Path(reuse) / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(str(reuse))
    from core.models.tokenizer import train_tokenizer, training_texts

    return train_tokenizer(training_texts(), vocab_size=cfg.vocab_size)


# Tensors that write into the residual stream (attention ``o``, feed-forward
# ``wo``) or are it (the tied embedding): where they grow, they start at zero,
# so the grown model computes what its source did. Everything else that grows
# (q, k, v, wi, position biases) takes the target's fresh initialisation there:
# a random reader of zeros adds nothing, and it hands the zero writers a
# gradient (zero on both sides would be a saddle that training never leaves).
_ZERO_WHERE_GROWN = (".o.weight", ".wo.weight", "shared.weight", "embed_tokens.weight", "lm_head.weight")


def grow_state(state: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fit a smaller source state (fewer heads, a narrower ``d_model`` or ``d_ff``)
    into ``target``'s shapes, keeping its function.

    Why: a stage can then add room (heads for a new skill, width for more
    labels to tell apart) without losing what the model learned; retraining
    from scratch costs hours on a CPU. Every source tensor keeps the leading
    block of its grown tensor (old heads keep their slots, old units their
    rows); see ``_ZERO_WHERE_GROWN`` for what fills the rest. A wider
    ``d_model`` pads the residual stream with zeros, which shrinks the mean
    square that T5's RMS norms divide by (by d_src / d_dst): each norm's weight
    is scaled by sqrt(d_src / d_dst) to undo it, except the decoder's final
    norm, whose output the tied head scales by d_model ** -0.5, which moves by
    the inverse factor. Tensors that would shrink, or differ in rank, are left
    alone (loading then fails with a clear size message)."""
    out = dict(state)
    for key, src in state.items():
        dst = target.get(key)
        if (
            dst is None
            or dst.shape == src.shape
            or dst.ndim != src.ndim
            or any(a > b for a, b in zip(src.shape, dst.shape))
        ):
            continue
        grown = torch.zeros_like(dst) if key.endswith(_ZERO_WHERE_GROWN) else dst.clone()
        grown[tuple(slice(0, n) for n in src.shape)] = src
        out[key] = grown.to(src.dtype)
    d_src = state["shared.weight"].shape[1] if "shared.weight" in state else 0
    d_dst = target["shared.weight"].shape[1] if "shared.weight" in target else 0
    if d_src and d_dst > d_src:
        for key in out:
            if key.endswith("layer_norm.weight") and key != "decoder.final_layer_norm.weight":
                out[key] = out[key] * math.sqrt(d_src / d_dst)
    return out


def identity_blocks(model, blocks: set[str]) -> None:
    """Zero the output projections (attention ``o``, feed-forward ``wo``) of ``blocks``.

    Why: a T5 block adds its outputs to the residual stream, so a block whose
    output projections are zero is the identity, and a layer grown this way
    keeps what the source model computes (like ``grow_state`` for heads and width).
    A random fresh layer instead scrambles the stream, and the first steps
    are spent recovering skills the source had. Gradients still reach the
    zero projections (their inputs are not zero), so the layer starts learning
    at once."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if _block(name) in blocks and name.endswith((".o.weight", ".wo.weight")):
                p.zero_()


def _block(key: str) -> str | None:
    """ "encoder.block.2.layer.0..." -> "encoder.block.2"; None for tensors outside the blocks."""
    parts = key.split(".")
    return ".".join(parts[:3]) if len(parts) > 3 and parts[1] == "block" else None
