"""The optimiser and learning-rate schedule every trainer here uses (T5 retrieval models, RoPE masked LMs).

One place, so the two families' recipes differ only where their configs say so: AdamW with weight decay on
matrices only (biases and norms are not shrunk), a linear warm-up over ``cfg.warmup`` steps, then a cosine
decay to 10 % of ``cfg.lr`` at ``cfg.steps``.
"""

from __future__ import annotations

import math

import torch


def optimizer(model: torch.nn.Module, cfg) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """``(optimizer, scheduler)`` for ``model`` under a training config (``lr``, ``weight_decay``, ``warmup``,
    ``steps``); step the scheduler once per optimiser step."""
    decay = [p for _, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr
    )

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        f = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * f))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
