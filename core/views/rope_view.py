"""What Explore shows of a rotary model (a masked-LM encoder, ``Loaded.family`` "rope", or a decoder-only LM), as
plain arrays.

Two views, each in place of a T5 one:

- **The mean logit against relative distance** (the rotary counterpart of the
  paper's Fig. 1, T5's bias b(m, n)): for one layer's queries and keys (after
  the rotary embedding, with the model's own scaling, or ``s * cos(q, k)`` for
  a cosine model), the mean of ``q_i . k_j`` over every pair with ``j - i = d``,
  per head, for every distance ``d`` in ``-(L-1) .. L-1``. A rotary model has no
  bias to draw: its preference for near keys lives in how q . k decays (or
  does not) with distance, which is what this curve shows at this length.
  Computed as a cross-correlation (FFT, ``O(L log L)`` per channel), never
  from an ``L x L`` matrix, so a 64x document costs what its q and k cost.
  :func:`layer_qk` takes q and k from a pass through our attention function
  (a listener that reads the one layer and asks for nothing else, so every
  layer still runs its fastest, output-only backend). On a decoder-only LM the
  curve is the same sum over every pair, also those its causal rows do not see
  (d > 0): q . k exists there, the mask only hides it.
- **The masked tokens' predictions** (instead of T5's retrieval answer): per
  masked position the true token, the model's top prediction, the
  probability of the true token and its -log p; accuracy and perplexity over
  all of them are exactly :func:`core.runs.mlm_pass.score`'s (the same pass: the same
  padded ids, the same head, the same float32 softmax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from core.kinds import DECODER, ENCODER
from core.mechanics.probes import ProbeSpec
from core.runs import rope_pass
from core.runs.mlm_pass import MaskedSequence, head_logits
from core.values import positions
from core.values.choice import Choice

# -- the mean logit by relative distance ---------------------------------------------------


@dataclass(frozen=True)
class DistanceCurves:
    """Mean raw logit per head by relative distance ``d = key - query``: ``distances`` [2L-1], ``mean`` [heads, 2L-1]."""

    distances: np.ndarray
    mean: np.ndarray
    layer: int
    tokens: int

    @property
    def heads(self) -> int:
        return int(self.mean.shape[0])


def mean_logit_by_distance(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(distances, mean)`` for queries ``q`` and keys ``k`` of one layer, ``[heads, L, d]`` each.

    ``mean[h, j]`` is the mean of ``q[h, i] . k[h, i + distances[j]]`` over the
    ``L - |distance|`` pairs at that distance (``distances`` runs from
    ``-(L-1)`` to ``L-1``). Computed as the cross-correlation of q and k per
    channel by FFT, in float64.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    if q.ndim != 3 or q.shape != k.shape:
        raise ValueError(f"q and k must both be [heads, L, d], got {q.shape} and {k.shape}")
    L = q.shape[1]
    size = 1 << max(1, (2 * L - 1).bit_length())  # >= 2L - 1: no wrap-around
    fq = np.fft.rfft(q, n=size, axis=1)
    fk = np.fft.rfft(k, n=size, axis=1)
    # sum_i q[i] k[i + d] = irfft(conj(Fq) * Fk)[d] (d >= 0), at size - |d| for d < 0; summed over channels
    corr = np.fft.irfft((np.conj(fq) * fk).sum(axis=2), n=size, axis=1)
    distances = np.arange(-(L - 1), L)
    sums = corr[:, distances % size]
    return distances, sums / (L - np.abs(distances))[None, :]


class _QKTap:
    """Listens to one encoder layer of a pass through :func:`core.mechanics.attention.aligned_attention`: keeps its q and k
    as the logits are made from them (:func:`core.mechanics.attention.logit_operands`: scaled, or normalised and times s for
    a cosine model) and asks for nothing else, so the attention stays on its fastest, output-only backend."""

    #: What it records (nothing): a decoder-only model's attention checks a listener asks for no attention it lacks.
    spec = ProbeSpec.off()

    def __init__(self, layer: int, kind: str = ENCODER) -> None:
        self.layer = int(layer)
        self.kind = kind  # the attention whose rows are the document's: a decoder-only LM's causal self-attention
        self.q: torch.Tensor | None = None
        self.k: torch.Tensor | None = None

    def begin_layer(self, layer, query, key, attention_mask=None, **kw) -> bool:
        if kw.get("kind", ENCODER) == self.kind and int(layer) == self.layer and self.q is None:
            self.q, self.k = query[0].detach().float().cpu(), key[0].detach().float().cpu()
        return False


@torch.inference_mode()
def layer_qk(loaded, ids: np.ndarray, layer: int, choice: Choice | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One layer's q and k (``[heads, L, d]``, float32, the logits' own operands) in a pass over ``ids`` under
    ``choice`` and its position scheme (:func:`core.runs.rope_pass.scheme_pass`, which takes the scheme from the
    choice alone; None: the model as trained). A scheme
    that rectifies distances hands the attention unrotated q and k: its curve is then not the scheme's logits."""
    if not 0 <= int(layer) < loaded.n_layers:
        raise ValueError(f"layer {layer} is outside 0..{loaded.n_layers - 1}")
    tap = _QKTap(layer, DECODER if loaded.decoder_only else ENCODER)  # a decoder's rows: its causal self-attention
    x = torch.as_tensor(np.asarray(ids, dtype=np.int64))[None].to(loaded.device)
    with rope_pass.scheme_pass(loaded, choice, None, tap, x.shape[1]):  # type: ignore[arg-type]  (a listener)
        loaded.encoder(input_ids=x)
    if tap.q is None:
        raise ValueError(f"layer {layer}'s attention was not seen in the pass")
    q, k = tap.q, tap.k
    if k.shape[0] != q.shape[0]:  # grouped K/V (a decoder's): each query head reads its group's key head
        k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
    return q.numpy(), k.numpy()


def distance_curves(
    loaded,
    ids: np.ndarray,
    layer: int,
    cosine_scale: float | None = None,
    scheme: positions.Scheme = positions.PLAIN_SCHEME,
) -> DistanceCurves:
    """:func:`mean_logit_by_distance` of ``layer`` on ``ids`` at tau = 1 (the logits do not depend on tau), under
    the position scheme ``scheme``. A frequency scheme (PI, NTK, YaRN) changes the curve; a mask does not change
    q . k (the curve is over every pair, seen or not); a scheme that rectifies distances (ReRoPE, StreamingLLM,
    LM-Infinite) computes its logits from unrotated q and k, which this curve cannot show: for those the curve is
    plain RoPE's (:func:`shows_scheme` says which)."""
    if not shows_scheme(scheme):
        scheme = positions.PLAIN_SCHEME
    q, k = layer_qk(loaded, ids, layer, Choice.of(cosine_scale=cosine_scale, scheme=scheme))
    d, mean = mean_logit_by_distance(q, k)
    return DistanceCurves(distances=d, mean=mean.astype(np.float32), layer=int(layer), tokens=int(q.shape[1]))


def shows_scheme(scheme: positions.Scheme | str) -> bool:
    """Whether :func:`distance_curves` draws ``scheme``'s own logits (False for a scheme that rectifies distances:
    its curve is plain RoPE's)."""
    return positions.DISTANCES not in positions.Scheme.of(scheme).entry.changes


# -- the masked tokens' predictions --------------------------------------------------------


@dataclass(frozen=True)
class MaskedPredictions:
    """Per masked position (sorted): ``labels`` (true ids), ``predicted`` (top-1 ids), ``p_true``, ``nll``
    (-log p of the true id, float64); accuracy and perplexity over all of them."""

    positions: np.ndarray
    labels: np.ndarray
    predicted: np.ndarray
    p_true: np.ndarray
    nll: np.ndarray

    @property
    def masked(self) -> int:
        return int(len(self.labels))

    @property
    def correct(self) -> int:
        return int((self.predicted == self.labels).sum())

    @property
    def accuracy(self) -> float:
        return self.correct / self.masked

    @property
    def perplexity(self) -> float:
        mean = float(self.nll.sum()) / self.masked
        return math.exp(mean) if mean < 709.0 else math.inf  # past float64's exp


@torch.inference_mode()
def masked_predictions(loaded, seq: MaskedSequence, choice: Choice | None = None) -> MaskedPredictions:
    """The pass :func:`core.runs.mlm_pass.score` makes of one sequence (under ``choice`` and its position scheme), kept per
    masked position."""
    ids = torch.as_tensor(seq.ids, dtype=torch.long)[None].to(loaded.device)
    with rope_pass.scheme_pass(loaded, choice, None, None, ids.shape[1]):
        hidden = loaded.encoder(input_ids=ids).last_hidden_state
    cols = torch.as_tensor(seq.positions, dtype=torch.long, device=hidden.device)
    logits = head_logits(loaded.model, hidden[0, cols]).float()
    logp = torch.log_softmax(logits, dim=-1)
    labels = torch.as_tensor(seq.labels, dtype=torch.long, device=logits.device)
    nll = -logp.gather(-1, labels[:, None]).squeeze(-1)
    return MaskedPredictions(
        positions=np.asarray(seq.positions),
        labels=np.asarray(seq.labels),
        predicted=logits.argmax(-1).cpu().numpy(),
        p_true=torch.exp(-nll).double().cpu().numpy(),
        nll=nll.double().cpu().numpy(),
    )


def card(pred: MaskedPredictions, tokenizer, shown: int = 8) -> dict:
    """What the scrubber's card shows (plain JSON): accuracy, perplexity, counts and the first ``shown`` masked
    tokens as ``[position, true text, predicted text, p(true), right]``."""
    rows = []
    for i in range(min(shown, pred.masked)):
        rows.append(
            [
                int(pred.positions[i]),
                tokenizer.decode([int(pred.labels[i])]),
                tokenizer.decode([int(pred.predicted[i])]),
                round(float(pred.p_true[i]), 4),
                bool(pred.predicted[i] == pred.labels[i]),
            ]
        )
    return {
        "accuracy": pred.accuracy,
        "perplexity": pred.perplexity,
        "masked": pred.masked,
        "correct": pred.correct,
        "rows": rows,
    }


# -- the scheme's mask, pooled like the attention map -----------------------------------------

#: Query rows per block when pooling a mask: a block of the boolean mask is ``rows x L`` (never ``L x L``).
MASK_BLOCK_ROWS = 256


def mask_cells(bound: positions.Bound | None, edges: np.ndarray) -> np.ndarray | None:
    """The share of each map cell a position scheme masks out, pooled on the map's own cells (``edges``: the
    ``[bins + 1]`` token boundaries of :attr:`core.mechanics.probes.Probes.heatmap_edges`, rows and columns alike):
    ``out[a, b]`` is the fraction of (query in bin a, key in bin b) pairs with ``bound.mask`` False (1 = every
    pair masked, 0 = every pair seen). None when the scheme has no mask (plain RoPE, PI, NTK, YaRN, ReRoPE).
    Built from :meth:`core.values.positions.Bound.mask_rows` a block of rows at a time, float64 sums, never ``L x L``."""
    if bound is None or bound.scheme.mask is None:
        return None
    edges = np.asarray(edges, dtype=np.int64)
    n, bins = int(edges[-1]), len(edges) - 1
    if bins < 1 or n < 1 or np.any(np.diff(edges) < 1):
        raise ValueError("edges must rise by at least one token per cell")
    seen = np.zeros((bins, bins), dtype=np.float64)
    row_bin = np.repeat(np.arange(bins), np.diff(edges))
    for r0 in range(0, n, MASK_BLOCK_ROWS):
        r1 = min(n, r0 + MASK_BLOCK_ROWS)
        allowed = bound.mask_rows(r0, r1, n).cpu().numpy().astype(np.float64)  # [rows, n]
        cols = np.add.reduceat(allowed, edges[:-1], axis=1)  # [rows, bins]: keys seen per column cell
        np.add.at(seen, row_bin[r0:r1], cols)
    sizes = np.diff(edges).astype(np.float64)
    return (1.0 - seen / np.outer(sizes, sizes)).astype(np.float32)
