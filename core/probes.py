"""What one encoder forward pass records about its attention.

A :class:`Recorder` rides along with :func:`core.attention.aligned_attention`:
the attention function hands it each block of query rows (raw logits, scaled
scores, probabilities) and drops the block afterwards, so the recorder keeps
only running sums and small pooled arrays, never an ``L x L`` matrix. That is
what lets a 16k-token pass run in a few GB while still feeding every view.

Recorded, for encoder self-attention only:

* per batch item, layer and head: the sum of each real query row's max
  probability (Pmax) and entropy (H), with padded keys excluded by the mask
  and padded query rows skipped, plus the row count (means = sums / rows);
* one pooled heatmap (a chosen layer, one head or the head mean) of batch
  item 0, at most ``size x size`` cells, mean- and max-pooled, plus the
  question's rows of that map one token per row (keys pooled alike);
* the question -> document profile: attention from the question's token rows
  to every position, per layer, head mean (batch item 0);
* layer 0's *average sorted logit vector* (the paper's Sec. 4: sort each row
  of raw logits q.k + bias, average over heads and rows), its std sigma and
  its max l_max, which Prop. 1 and 2 take as input;
* for cosine-attention models, a histogram of cos(q, k) in layer 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class ProbeSpec:
    """Which probes to run. ``stats`` alone is cheap (batch runs); the rest feed the views."""

    stats: bool = True
    heatmap: bool = True
    heatmap_layer: int = 0
    heatmap_head: int | None = None  # None: the mean over heads
    heatmap_size: int = 512
    profile_rows: tuple[int, int] | None = None  # question token span [start, end) of item 0
    sorted_logits: bool = True
    cosine_hist_bins: int = 60

    @classmethod
    def stats_only(cls) -> "ProbeSpec":
        return cls(heatmap=False, sorted_logits=False, cosine_hist_bins=0)

    @classmethod
    def off(cls) -> "ProbeSpec":
        """Record nothing: the attention then runs torch's fused kernel (accuracy-only sweeps)."""
        return cls(stats=False, heatmap=False, sorted_logits=False, cosine_hist_bins=0)

    @property
    def wanted(self) -> bool:
        return bool(self.stats or self.heatmap or self.profile_rows or self.sorted_logits or self.cosine_hist_bins)


@dataclass
class ProbeRecord:
    """Plain numpy results of one recorded pass (see the module docstring)."""

    pmax: np.ndarray  # [batch, layers, heads] mean over real rows
    entropy: np.ndarray  # [batch, layers, heads]
    rows: np.ndarray  # [batch] real query rows per item
    heatmap_mean: np.ndarray | None = None  # [bins, bins] mean probability per cell
    heatmap_max: np.ndarray | None = None  # [bins, bins] max probability per cell
    heatmap_edges: np.ndarray | None = None  # [bins + 1] token index where each bin starts (last = n)
    heatmap_layer: int | None = None
    heatmap_head: int | None = None
    question_rows: np.ndarray | None = None  # [q] token index of each question row of the heatmap's layer/head
    question_map_mean: np.ndarray | None = None  # [q, bins] those rows, keys pooled like the heatmap (mean)
    question_map_max: np.ndarray | None = None  # [q, bins] (max)
    profile: np.ndarray | None = None  # [layers, n] question -> position attention
    sorted_logits: np.ndarray | None = None  # [n] descending average sorted logit vector
    sigma: float | None = None
    l_max: float | None = None
    cosine_hist: np.ndarray | None = None  # [bins] counts of cos(q, k), layer 0
    cosine_edges: np.ndarray | None = None
    nonfinite_layers: list[int] = field(default_factory=list)

    @property
    def layer_pmax(self) -> np.ndarray:
        """[layers] head mean of item 0's Pmax."""
        return self.pmax[0].mean(-1)

    @property
    def layer_entropy(self) -> np.ndarray:
        return self.entropy[0].mean(-1)


def pool_edges(n: int, bins: int) -> np.ndarray:
    """Bin start indices splitting ``n`` positions into ``min(n, bins)`` near-equal bins."""
    b = max(1, min(n, bins))
    return (np.arange(b + 1) * n) // b


class Recorder:
    """Accumulates probe results block by block; see :class:`ProbeSpec`.

    ``token_mask`` is the ``[batch, L]`` boolean mask of real tokens (the
    engine right-pads, so item ``i``'s real tokens are a prefix).
    """

    def __init__(self, spec: ProbeSpec, token_mask: torch.Tensor):
        self.spec = spec
        self.mask = token_mask.bool()
        self.n0 = int(self.mask[0].sum())
        self.batch = self.mask.shape[0]
        self._pmax: dict[int, torch.Tensor] = {}
        self._ent: dict[int, torch.Tensor] = {}
        self._nonfinite: set[int] = set()
        edges = pool_edges(self.n0, spec.heatmap_size)
        self._edges = edges
        self._bin = torch.from_numpy(np.repeat(np.arange(len(edges) - 1), np.diff(edges)))
        self._tile_sum: torch.Tensor | None = None
        self._tile_max: torch.Tensor | None = None
        self._profile: dict[int, torch.Tensor] = {}
        self._sorted: torch.Tensor | None = None
        self._sorted_rows = 0
        self._cos_hist: torch.Tensor | None = None
        self._layer_qk: tuple[torch.Tensor, torch.Tensor, float] | None = None
        self._qrows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    # -- called by the attention function ---------------------------------
    def begin_layer(self, layer: int, query, key, attention_mask, cosine_scale: float | None = None) -> None:
        self._layer_qk = (query, key, cosine_scale) if (cosine_scale and layer == 0) else None

    def end_layer(self, layer: int) -> None:
        self._layer_qk = None

    def wants_raw(self, layer: int) -> bool:
        """Whether :meth:`observe_exp` needs this layer's raw logits (q.k + bias before tau): layer 0's sorted logits."""
        return layer == 0 and self.spec.sorted_logits

    @torch.no_grad()
    def observe(self, layer: int, r0: int, r1: int, raw: torch.Tensor, scores: torch.Tensor, probs: torch.Tensor,
                norm: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Take one block of rows ``[r0, r1)``: raw logits, scaled+masked scores, probabilities.

        ``norm`` = (row max of ``scores``, sum of exp(scores - max)) when the
        caller has them: then Pmax and H cost one multiply-reduce instead of a
        max pass and a log over every probability. The attention function
        itself uses the cheaper :meth:`observe_exp`; this form is the
        definition the tests check that one against.
        """
        probs = probs.detach()
        if self.spec.stats:
            if norm is None:
                pmax = probs.amax(-1)
                ent = -torch.special.xlogy(probs, probs).sum(-1)
            else:
                top, total = norm
                pmax = total.reciprocal()
                # masked scores are finfo.min where p == 0 exactly: 0 * min = 0
                ent = top + total.log() - (probs * scores).sum(-1)
            self._stats(layer, r0, r1, pmax, ent)
        self._views(layer, r0, r1, lambda a, b: probs[0, :, a - r0 : b - r0, : self.n0], raw)

    @torch.no_grad()
    def observe_exp(self, layer: int, r0: int, r1: int, raw: torch.Tensor | None, shifted: torch.Tensor,
                    exp: torch.Tensor, total: torch.Tensor) -> None:
        """The same as :meth:`observe`, from the softmax's unnormalised pieces, so nobody divides the whole block.

        ``shifted`` = scores - row max, ``exp`` = exp(shifted), ``total`` = its
        row sums ``[B, H, c, 1]``. With p = exp / total: Pmax = 1 / total and
        H = -sum p log p = log total - sum(exp * shifted) / total. Only the
        rows a view needs (one layer's heatmap, the question's rows) are
        normalised. ``raw`` (logits before tau) is needed only where
        :meth:`wants_raw` says so.
        """
        if self.spec.stats:
            t = total.squeeze(-1)
            dot = torch.einsum("bhck,bhck->bhc", exp, shifted)
            self._stats(layer, r0, r1, t.reciprocal(), t.log() - dot / t)
        self._views(layer, r0, r1, lambda a, b: exp[0, :, a - r0 : b - r0, : self.n0] / total[0, :, a - r0 : b - r0], raw)

    def _stats(self, layer: int, r0: int, r1: int, pmax: torch.Tensor, ent: torch.Tensor) -> None:
        """Add one block's per-row Pmax and H ``[B, H, c]`` to the running sums (padded query rows skipped)."""
        rowmask = self.mask[:, r0:r1].to(pmax.device, pmax.dtype)[:, None, :]  # [B,1,c]
        if not (torch.isfinite(pmax).all() and torch.isfinite(ent).all()):
            self._nonfinite.add(layer)
            pmax, ent = torch.nan_to_num(pmax), torch.nan_to_num(ent)
        add_p = (pmax * rowmask).sum(-1).double().cpu()
        add_e = (ent * rowmask).sum(-1).double().cpu()
        self._pmax[layer] = self._pmax.get(layer, 0) + add_p
        self._ent[layer] = self._ent.get(layer, 0) + add_e

    def _views(self, layer: int, r0: int, r1: int, probs_of, raw: torch.Tensor | None) -> None:
        """Heatmap, question profile, sorted logits, cosine histogram from one block of item 0.

        ``probs_of(a, b)`` gives item 0's probabilities ``[H, b - a, n0]`` of
        rows ``[a, b)`` (inside the block), computed only when a view needs them.
        """
        spec = self.spec
        n0 = self.n0
        q1 = min(r1, n0)
        if q1 <= r0:
            return
        if spec.heatmap and layer == spec.heatmap_layer:
            self._add_tile(probs_of(r0, q1), r0, q1)
            if spec.profile_rows is not None:
                a, b = max(spec.profile_rows[0], r0), min(spec.profile_rows[1], q1)
                if b > a:
                    self._add_question_rows(probs_of(a, b), a)
        if spec.profile_rows is not None:
            a, b = spec.profile_rows
            a, b = max(a, r0), min(b, q1)
            if b > a:
                rows = probs_of(a, b).mean(0).sum(0).double().cpu()
                self._profile[layer] = self._profile.get(layer, 0) + rows
        if layer == 0 and spec.sorted_logits and raw is not None:
            z = raw[0, :, : q1 - r0, :n0].detach().float()
            srt = torch.sort(z, dim=-1, descending=True).values.sum(dim=(0, 1)).double().cpu()
            self._sorted = srt if self._sorted is None else self._sorted + srt
            self._sorted_rows += z.shape[0] * z.shape[1]
        if self._layer_qk is not None and spec.cosine_hist_bins:
            q, k, s = self._layer_qk
            cos = torch.matmul(q[0, :, r0:q1].float() / s, k[0, :, :n0].float().transpose(-1, -2))
            h = torch.histc(cos.clamp(-1, 1), bins=spec.cosine_hist_bins, min=-1.0, max=1.0).double().cpu()
            self._cos_hist = h if self._cos_hist is None else self._cos_hist + h

    def _pool_keys(self, p0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of the heatmap's head (or head mean) with keys pooled into the map's bins: (sums, maxima) ``[rows, bins]``."""
        spec = self.spec
        p = (p0[spec.heatmap_head] if spec.heatmap_head is not None else p0.mean(0)).float().cpu()  # [rows, n0]
        nb = len(self._edges) - 1
        rows = p.shape[0]
        ksum = torch.zeros(rows, nb).index_add_(1, self._bin, p)
        kmax = torch.zeros(rows, nb).scatter_reduce_(1, self._bin.expand(rows, -1), p, "amax", include_self=True)
        return ksum, kmax

    def _add_tile(self, p0: torch.Tensor, r0: int, q1: int) -> None:
        ksum, kmax = self._pool_keys(p0)
        nb = ksum.shape[1]
        rbin = self._bin[r0:q1]
        if self._tile_sum is None:
            self._tile_sum = torch.zeros(nb, nb, dtype=torch.float64)
            self._tile_max = torch.zeros(nb, nb)
        self._tile_sum.index_add_(0, rbin, ksum.double())
        self._tile_max.scatter_reduce_(0, rbin[:, None].expand(-1, nb), kmax, "amax", include_self=True)

    def _add_question_rows(self, p0: torch.Tensor, a: int) -> None:
        """The question's own rows of the heatmap's layer/head, keys pooled like the heatmap, rows kept one by one.

        In the square map a question of 20 tokens in 16k is a fraction of one
        pooled row; here each question token gets a row, so the needle's
        column can be seen lighting up (or not)."""
        ksum, kmax = self._pool_keys(p0)
        sizes = torch.from_numpy(np.diff(self._edges)).float()
        for i in range(ksum.shape[0]):
            self._qrows[a + i] = (ksum[i] / sizes, kmax[i])

    # -- results -----------------------------------------------------------
    def finish(self) -> ProbeRecord:
        """Turn the running sums into a :class:`ProbeRecord` of numpy arrays."""
        layers = sorted(self._pmax)
        rows = self.mask.sum(-1).double()
        if layers:
            pmax = torch.stack([self._pmax[l] for l in layers], 1) / rows[:, None, None]
            ent = torch.stack([self._ent[l] for l in layers], 1) / rows[:, None, None]
        else:
            pmax = ent = torch.zeros(self.batch, 0, 0, dtype=torch.float64)
        rec = ProbeRecord(pmax=pmax.numpy(), entropy=ent.numpy(), rows=rows.numpy().astype(int))
        rec.nonfinite_layers = sorted(self._nonfinite)
        if self._tile_sum is not None:
            sizes = torch.from_numpy(np.diff(self._edges)).double()
            rec.heatmap_mean = (self._tile_sum / (sizes[:, None] * sizes[None, :])).float().numpy()
            rec.heatmap_max = self._tile_max.numpy()
            rec.heatmap_edges = self._edges
            rec.heatmap_layer, rec.heatmap_head = self.spec.heatmap_layer, self.spec.heatmap_head
        if self._qrows:
            order = sorted(self._qrows)
            rec.question_rows = np.asarray(order)
            rec.question_map_mean = torch.stack([self._qrows[r][0] for r in order]).numpy()
            rec.question_map_max = torch.stack([self._qrows[r][1] for r in order]).numpy()
        if self._profile:
            a, b = self.spec.profile_rows
            n_rows = max(1, min(b, self.n0) - a)
            rec.profile = np.stack([(self._profile[l] / n_rows).numpy() for l in sorted(self._profile)])
        if self._sorted is not None and self._sorted_rows:
            v = (self._sorted / self._sorted_rows).numpy()
            rec.sorted_logits, rec.sigma, rec.l_max = v, float(v.std()), float(v.max())
        if self._cos_hist is not None:
            rec.cosine_hist = self._cos_hist.numpy()
            rec.cosine_edges = np.linspace(-1, 1, self.spec.cosine_hist_bins + 1)
        return rec
