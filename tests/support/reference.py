"""A reference attention written out here in float64, nothing of ours: T5's attention with the adaptive-temperature
softmax of Velickovic et al. 2024, to register with transformers under :data:`REF` and compare a pass against."""

from __future__ import annotations

import math

import torch

REF = "adaptive-reference-test"


def adaptive_reference(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_bias=None, **kwargs
):
    """T5's attention with the paper's adaptive softmax, written out here in float64 (nothing of ours)."""
    z = query.double() @ key.double().transpose(-1, -2) * (1.0 if scaling is None else scaling)
    if position_bias is not None:
        z = z + position_bias.double()
    if attention_mask is not None:
        z = z.masked_fill(~attention_mask, -math.inf) if attention_mask.dtype == torch.bool else z + attention_mask
    p = torch.softmax(z, -1)
    ent = -(p * torch.log(p + 1e-9)).sum(-1, keepdim=True)
    beta = torch.where(
        ent > 0.5,
        torch.clamp(sum(c * ent ** (4 - i) for i, c in enumerate((-0.037, 0.481, -2.3, 4.917, -1.791))), min=1.0),
        torch.ones_like(ent),
    )
    w = torch.softmax(z * beta, -1)
    return (w @ value.double()).to(value.dtype).transpose(1, 2).contiguous(), w.to(value.dtype)
