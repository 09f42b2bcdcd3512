"""T5's relative position buckets and the bias curves they produce (the paper's Figure 1).

T5 gives each head a learned scalar per bucket of relative distance: 16 buckets
per direction (bidirectional encoder), the first 8 exact distances 0..7, the
next 8 log-spaced up to ``max_distance`` (128), everything farther sharing the
last bucket. So past 128 tokens a head sees no position difference at all,
which is why long inputs flatten ("disperse") the attention of heads that
relied on the bias to stay local.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def relative_bucket(
    relative_position: np.ndarray | torch.Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> np.ndarray:
    """Bucket of ``key_position - query_position`` as in Raffel et al. (T5), Sec. 2.1.

    bidirectional: half the buckets for n > 0 (keys after the query). Of each
    half, distances below ``max_exact = buckets/2`` get a bucket each; larger
    ones ``max_exact + floor(log(n/max_exact) / log(max_distance/max_exact) *
    (buckets - max_exact))``, capped at the last bucket.
    """
    n = np.asarray(relative_position.cpu() if isinstance(relative_position, torch.Tensor) else relative_position)
    n = n.astype(np.int64)
    buckets = num_buckets
    out = np.zeros_like(n)
    if bidirectional:
        buckets //= 2
        out += (n > 0) * buckets
        n = np.abs(n)
    else:
        n = -np.minimum(n, 0)
    max_exact = buckets // 2
    small = n < max_exact
    with np.errstate(divide="ignore"):
        large = max_exact + (
            np.log(np.maximum(n, 1) / max_exact) / math.log(max_distance / max_exact) * (buckets - max_exact)
        ).astype(np.int64)
    large = np.minimum(large, buckets - 1)
    return out + np.where(small, n, large)


def bias_table(model: torch.nn.Module) -> tuple[np.ndarray, dict]:
    """Layer-0 encoder bias weights ``[buckets, heads]`` and the bucket settings."""
    attn = model.get_encoder().block[0].layer[0].SelfAttention
    if not getattr(attn, "has_relative_attention_bias", False):
        raise ValueError("this model's encoder has no relative attention bias")
    cfg = model.config
    weights = attn.relative_attention_bias.weight.detach().float().cpu().numpy()
    return weights, {
        "num_buckets": int(cfg.relative_attention_num_buckets),
        "max_distance": int(cfg.relative_attention_max_distance),
    }


def bias_curves(model: torch.nn.Module, query_position: int, length: int) -> np.ndarray:
    """b(m, n) for the fixed query position ``m`` and keys n = 0..length-1: ``[heads, length]``.

    The encoder bias is shared by every layer (T5 computes it in layer 0), so
    one curve per head describes the whole encoder.
    """
    if not 0 <= query_position < max(1, length):
        raise ValueError(f"query position {query_position} outside 0..{length - 1}")
    weights, cfg = bias_table(model)
    rel = np.arange(length) - query_position
    return weights[relative_bucket(rel, True, cfg["num_buckets"], cfg["max_distance"])].T
