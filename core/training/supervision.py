"""Attention supervision: which tokens are the needle, a tap on the decoder's cross-attention
logits (:class:`CrossAttentionTap`), and the loss that asks the lookup heads to look at the
needle while the answer is written (:func:`needle_attention_loss`).

The needle is one span per document (``[B, S]``: the asked line, the pass key), or one target per
answer token (``[B, T, S]``): a language-modelling sequence with an earlier copy of its
continuation asks continuation token t to look at its own copy in the prefix
(:func:`copy_needle`), the one place a model that reads far back can read it from."""

from __future__ import annotations

import numpy as np
import torch

from core.data import tasks
from core.data.tasks.lm import copy_positions
from core.kinds import CROSS
from core.mechanics.attention import listen
from core.mechanics.probes import ProbeSpec, Recorder


def needle_token_mask(offsets: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """``[batch, tokens]``: True where a token's characters overlap its document's
    needle span. ``offsets`` is the fast tokenizer's ``offset_mapping``; special
    tokens and padding have empty offsets and are never part of a needle."""
    a, b = offsets[..., 0], offsets[..., 1]
    start = np.array([s for s, _ in spans])[:, None]
    end = np.array([e for _, e in spans])[:, None]
    return (b > a) & (b > start) & (a < end)


def copy_needle(
    offsets: np.ndarray, docs: list[tasks.Document], answer_tokens: int, spans: np.ndarray | None = None
) -> np.ndarray:
    """``[batch, answer_tokens, tokens]``: per answer token, where it should look.

    A language-modelling document with an earlier copy (``meta["copy_span"]``)
    marks, in row t, the prefix token that is the copy of continuation token t
    (:func:`core.data.tasks.lm.copy_positions`): one token, not the whole copy,
    because a model that copies must know *which* of the copied tokens comes
    next, and the copy's other tokens are exactly the wrong answers. Rows past
    the copy, and documents without one, are all False (no target: the loss
    leaves them out). Any other document's row is its needle span
    (``spans``, :func:`needle_token_mask`), the same for every answer token."""
    out = np.zeros((len(docs), answer_tokens, offsets.shape[1]), dtype=bool)
    for i, d in enumerate(docs):
        if d.task == tasks.LM:
            pos = copy_positions(d, offsets[i])[:answer_tokens]
            out[i, np.arange(len(pos)), pos] = True
        elif spans is not None:
            out[i] = spans[i][None, :]
    return out


class CrossAttentionTap:
    """The decoder's cross-attention logits, with their gradient, of the forward passes since the last read.

    A standing :class:`core.mechanics.probes.Recorder` asking for ``cross.*.logits``
    (:func:`core.mechanics.attention.listen`): the one way a pass is tapped. The
    attention function hands it each cross-attention's q.k (answer tokens x
    document tokens, cheap) and still runs its fused softmax, so the model
    trains exactly as it would untapped."""

    def __init__(self, model) -> None:
        self._recorder = Recorder(ProbeSpec.of("cross.*.logits"))
        self._stop = listen(model, self._recorder)

    def logits(self) -> list[torch.Tensor]:
        """Per decoder layer, ``[batch, heads, answer tokens, document tokens]`` (no mask applied); read once
        per forward (the training step's), which also forgets them."""
        return list(self._recorder.take().layers(CROSS, "logits").values())

    def remove(self) -> None:
        self._stop()


def needle_log_shares(logits: list[torch.Tensor], enc_mask: torch.Tensor, needle: torch.Tensor) -> torch.Tensor:
    """``[B, heads of all layers, T]``: log of the attention share each head gives the needle.

    ``logits`` per layer ``[B, H, T, S]`` (:meth:`CrossAttentionTap.logits`);
    ``enc_mask`` ``[B, S]`` bool; ``needle`` ``[B, S]`` bool (one span per
    document) or ``[B, T, S]`` (a target per answer token, :func:`copy_needle`).
    A document (or answer token) with no needle token gets ``-inf``."""
    if needle.dim() not in (2, 3):
        raise ValueError(f"needle must be [batch, tokens] or [batch, answer tokens, tokens], got {tuple(needle.shape)}")
    where = needle[:, None, None, :] if needle.dim() == 2 else needle[:, None, :, :]
    shares = []
    for lg in logits:
        logp = lg.float().masked_fill(~enc_mask[:, None, None, :], float("-inf")).log_softmax(-1)
        shares.append(logp.masked_fill(~where[:, :, : lg.shape[2]], float("-inf")).logsumexp(-1))
    return torch.cat(shares, 1)


LOOKUP_SHARE = 0.5  # a head that gives the needle at least this share on a batch is a lookup head


def needle_attention_loss(
    logits: list[torch.Tensor], enc_mask: torch.Tensor, needle: torch.Tensor, weight: torch.Tensor, answer: torch.Tensor
) -> torch.Tensor:
    """Minus the log of the share of attention the lookup heads give the needle,
    averaged over the answer's tokens and the lookup heads, weighted per document.

    Why: the bundled model's line misses are lookups gone soft. Its decoder
    already has heads that find the asked line (about 0.8 of their mass on it
    when the answer is right, about 0.3 when it is wrong: docs/line-retrieval.md, "Attention
    supervision"); the LM loss sharpens them only through the right digits.
    This loss asks for the lookup itself, at training time only.

    The lookup heads are found on each batch, not named: those whose mean
    share on the needle (detached) is at least ``LOOKUP_SHARE``; if none is,
    the best one. The others (one must read the question first) are left free.
    A max over heads would not do: on almost every document some head (one that
    always looks at a fixed place, say) happens to sit on the needle.

    With a target per answer token (``needle`` ``[B, T, S]``, the copy of a
    language-modelling continuation) the same holds token by token: an answer
    token without a target is left out, as a document of weight 0 is.

    ``logits``: per layer ``[B, H, T, S]``; ``enc_mask`` ``[B, S]`` bool;
    ``needle`` ``[B, S]`` or ``[B, T, S]`` bool; ``weight`` ``[B]``; ``answer``
    ``[B, T]`` bool (the label tokens)."""
    if needle.dim() == 3:
        has = needle.any(-1)  # [B, T]: answer tokens with a target
        answer = answer & has[:, : answer.shape[1]]
        needle = needle | ~has[..., None]  # a finite dummy where there is none
    else:
        needle = needle | ~needle.any(1, keepdim=True)  # no needle (weight 0): a finite dummy
    log_share = needle_log_shares(logits, enc_mask, needle)
    tokens = answer[:, None, :].float()
    per_head = -(log_share * tokens).sum(2) / tokens.sum(2).clamp(min=1)  # [B, heads]
    used = weight > 0
    with torch.no_grad():
        mean_share = (log_share.exp() * tokens).sum(2) / tokens.sum(2).clamp(min=1)
        mean_share = mean_share[used].mean(0) if used.any() else mean_share.mean(0)
        lookup = mean_share >= LOOKUP_SHARE
        if not lookup.any():
            lookup = mean_share == mean_share.max()
    per_doc = per_head[:, lookup].mean(1)
    return (per_doc * weight).sum() / used.sum().clamp(min=1)
