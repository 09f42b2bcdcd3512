"""What a forward pass records about its attention, asked for by name.

A :class:`Recorder` rides along with :func:`core.mechanics.attention.aligned_attention`:
per attention call, :meth:`Recorder.begin_layer` says what the blocks must carry
(:class:`core.mechanics.softmax_block.Needs`), then the attention function hands it each
block of query rows as one :class:`core.mechanics.softmax_block.Block` (:meth:`Recorder.observe`:
the softmax's un-normalised exp and row sums, or probabilities, plus the raw
logits of the rows a probe sorts), whichever backend computed it, and drops the
block afterwards; :meth:`Recorder.end_layer` closes the call. The recorder keeps
only running sums and small pooled arrays, never an ``L x L`` matrix. That is
what lets a 16k-token pass run in a few GB while still feeding every view. A
new probe is computed here from the block; no backend changes for it.

**Probes by name.** A probe is named ``"{kind}.{layer}.{probe}"`` (as
TransformerLens names its hook points): ``kind`` one of ``encoder``
(self-attention), ``decoder`` (self-attention) and ``cross`` (the decoder's
attention over the document), ``layer`` a number or ``*`` (every layer),
``probe`` one of :data:`PROBES`, e.g. ``"encoder.*.pmax"``, ``"cross.2.map"``,
``"cross.*.logits"``. :class:`ProbeSpec` asks for them (``names``, or its
older switches, which stand for names: :meth:`ProbeSpec.probes`); the
:class:`ProbeRecord` answers ``record["cross.2.map"]`` (a ``*`` name stacks
the layers). The attention function feeds the recorder only the attentions
the spec names, so a pass that asks for nothing of an attention may take a
backend that probes nothing there (:func:`core.mechanics.softmax_block.choose_backend`).

Encoder rows are the document's tokens (batch item ``i``'s real tokens are a
prefix: the engine right-pads, padded rows are skipped and padded keys
masked). Decoder and cross-attention rows are the answer's tokens: during
generation they arrive one row per step (the key/value cache holds the
rest), and the recorder appends them, so a cross map is answer tokens x
document positions. Maps, profiles, sorted logits and histograms are of batch
item 0; Pmax and H are per item (for decoder and cross-attention, over every
row the pass computed: in a batch, also the steps after an item's answer ended).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from core.errors import UserError
from core.kinds import CROSS, DECODER, ENCODER, KINDS
from core.mechanics import fused_softmax
from core.mechanics.softmax_block import Block, Needs, grouped_matmul


@dataclass(frozen=True)
class Probe:
    """One measurement a pass can record, for the attention ``kinds`` it is defined on."""

    name: str
    what: str
    kinds: tuple[str, ...] = KINDS


#: Every probe a name can ask for: the one list (docs, errors and the parser read it).
PROBES: dict[str, Probe] = {
    p.name: p
    for p in (
        Probe("pmax", "each row's largest probability, mean over real rows: [batch, heads]"),
        Probe("entropy", "each row's entropy H in nats, mean over real rows: [batch, heads]"),
        Probe(
            "map",
            "item 0's attention, head mean (or ProbeSpec.heatmap_head), keys pooled into at most "
            "heatmap_size bins of the document (mean): encoder [bins, bins], its rows pooled alike; cross "
            "[answer tokens, bins]; decoder [answer tokens, answer tokens] (keys not pooled)",
        ),
        Probe(
            "profile",
            "item 0's attention to every key position, head mean, averaged over the question's rows "
            "(encoder: ProbeSpec.profile_rows) or over every answer row (decoder, cross): [keys]",
        ),
        Probe(
            "sorted_logits",
            "item 0's average sorted raw-logit vector (q.k + bias before tau, each row sorted, "
            "averaged over heads and rows): [keys]",
            (ENCODER, CROSS),
        ),
        Probe("cosine_hist", "item 0's histogram of cos(q, k) over [-1, 1] (cosine-attention models only): [bins]"),
        Probe(
            "logits",
            "every row's raw logits q.k + bias, no mask, kept whole and with autograd (training taps, "
            "short inputs only): torch [batch, heads, rows, keys]",
        ),
    )
}

#: Probes computed from the blocks of probabilities (``logits`` is taken whole, before the softmax).
_ROW_PROBES = frozenset(PROBES) - {"logits"}
_STATS = ("pmax", "entropy")
#: Probes that read every row of a block's probabilities (a profile reads a few rows, which a backend keeping
#: only row statistics computes on demand: :attr:`Block.probs_rows <core.mechanics.softmax_block.Block>`).
_PROB_VIEWS = frozenset({"map"})
#: What a recorder may ask with only some rows' blocks computed by it (:attr:`Needs.rows`): the two statistics.
_STATS_ONLY = frozenset(_STATS)
COSINE_BINS = 60
#: Most rows of item 0 the sorted-logits probe sorts per layer (see :meth:`Recorder._sorted_rows`).
SORTED_ROWS = 1024  # cosine_hist bins when asked by name with ProbeSpec.cosine_hist_bins = 0


@dataclass(frozen=True, order=True)
class ProbeName:
    """A parsed probe name; ``layer`` None stands for ``*`` (every layer)."""

    kind: str
    layer: int | None
    probe: str

    def __str__(self) -> str:
        return f"{self.kind}.{'*' if self.layer is None else self.layer}.{self.probe}"

    def covers(self, kind: str, layer: int) -> bool:
        return self.kind == kind and (self.layer is None or self.layer == layer)


def parse(name: str | ProbeName) -> ProbeName:
    """``"cross.*.map"`` -> ``ProbeName("cross", None, "map")``; an unknown name raises
    :class:`UserError` listing the choices."""
    if isinstance(name, ProbeName):
        return name
    parts = str(name).strip().split(".")
    ok = len(parts) == 3 and parts[0] in KINDS and parts[2] in PROBES and (parts[1] == "*" or parts[1].isdigit())
    if not ok:
        raise UserError(
            f"unknown probe name {name!r}: write kind.layer.probe with kind one of {', '.join(KINDS)}, "
            f"layer a number or *, probe one of {', '.join(PROBES)} (e.g. cross.*.map)"
        )
    kind, layer, probe = parts
    if kind not in PROBES[probe].kinds:
        raise UserError(f"probe {probe!r} is not defined for {kind} attention (only {', '.join(PROBES[probe].kinds)})")
    return ProbeName(kind, None if layer == "*" else int(layer), probe)


@dataclass(frozen=True)
class ProbeSpec:
    """Which probes to run: ``names`` (see the module docstring) plus the switches, each of which stands
    for names of encoder self-attention (:attr:`probes`). ``stats`` alone is cheap (batch runs); the rest
    feed the views. ``heatmap_head``/``heatmap_size`` shape every map, ``profile_rows`` the encoder's profile.

    ``kind``: the attention whose rows are the document's tokens, which the switches name: ``encoder`` (T5, a
    rotary encoder), or ``decoder`` for a decoder-only LM, whose causal self-attention reads the prompt
    (:func:`core.runs.engine.run` sets it there). With ``kind`` ``decoder`` the recorder takes each decoder layer's
    first call, the prompt's prefill, as the document's rows (Pmax, H, maps, the question's profile, as the
    encoder's are read) and leaves the cached decoding steps after it unrecorded; ``sorted_logits`` names nothing
    there (a causal row's raw logits include the keys it may not see)."""

    stats: bool = True  # encoder.*.pmax, encoder.*.entropy
    heatmap: bool = True  # encoder.{heatmap_layer}.map
    heatmap_layer: int = 0
    heatmap_head: int | None = None  # None: the mean over heads
    heatmap_size: int = 512
    profile_rows: tuple[int, int] | None = None  # question token span [start, end) of item 0: encoder.*.profile
    sorted_logits: bool = True  # encoder.0.sorted_logits
    cosine_hist_bins: int = 60  # encoder.0.cosine_hist when > 0
    names: tuple[str, ...] = ()  # more probes by name, e.g. ("cross.*.map",)
    kind: str = ENCODER  # the document's attention (see above): encoder, or decoder on a decoder-only LM
    # decoder-only LM: Pmax and H weighed on the question's rows alone (as Algorithm 1 reads them there), not on
    # every row; the rows before the question then cost an unprobed prefill (Needs.rows). Stats only.
    question_rows: bool = False

    def __post_init__(self) -> None:
        if self.kind not in (ENCODER, DECODER):
            raise UserError(f"ProbeSpec.kind is the attention that reads the document: {ENCODER} or {DECODER}")
        if self.question_rows and (
            self.heatmap or self.profile_rows or self.sorted_logits or self.cosine_hist_bins or self.names
        ):
            raise UserError("ProbeSpec.question_rows weighs Pmax and H only: ask no map, profile or other probe")
        if isinstance(self.names, str):
            raise UserError(f"ProbeSpec.names takes a list of names, got the string {self.names!r}")
        # canonical and sorted, so two specs asking for the same probes are equal (the app's cache keys)
        object.__setattr__(self, "names", tuple(sorted({str(parse(n)) for n in self.names})))

    @classmethod
    def of(cls, *names: str, **options) -> "ProbeSpec":
        """Exactly these probes (the switches off), e.g. ``ProbeSpec.of("cross.*.logits")``."""
        return cls(stats=False, heatmap=False, sorted_logits=False, cosine_hist_bins=0, names=names, **options)

    @classmethod
    def stats_only(cls, question_rows: bool = False) -> "ProbeSpec":
        """Pmax and H per layer and head, nothing else (``question_rows``: on a decoder's question's rows)."""
        return cls(heatmap=False, sorted_logits=False, cosine_hist_bins=0, question_rows=question_rows)

    @classmethod
    def off(cls) -> "ProbeSpec":
        """Record nothing: the attention then takes a backend that probes nothing (accuracy-only sweeps)."""
        return cls(stats=False, heatmap=False, sorted_logits=False, cosine_hist_bins=0)

    @property
    def probes(self) -> frozenset[ProbeName]:
        """Everything this spec asks for, as names: ``names`` and what the switches stand for."""
        out = {parse(n) for n in self.names}
        doc = self.kind
        if self.stats:
            out |= {ProbeName(doc, None, p) for p in _STATS}
        if self.heatmap:
            out.add(ProbeName(doc, self.heatmap_layer, "map"))
        if self.profile_rows:
            out.add(ProbeName(doc, None, "profile"))
        if self.sorted_logits and doc in PROBES["sorted_logits"].kinds:
            out.add(ProbeName(doc, 0, "sorted_logits"))
        if self.cosine_hist_bins:
            out.add(ProbeName(doc, 0, "cosine_hist"))
        return frozenset(out)

    @property
    def wanted(self) -> bool:
        return bool(self.probes)

    def asks(self, *kinds: str) -> bool:
        """Whether any probe is asked of one of these attention kinds."""
        return any(p.kind in kinds for p in self.probes)


@dataclass
class ProbeRecord:
    """Plain numpy results of one recorded pass (see the module docstring).

    ``named`` holds every probe asked for by its concrete name (``"encoder.3.pmax"``,
    ``"cross.1.map"``); read it as ``record[name]``. The fields below are the
    encoder's, as the views and the CLI have always read them."""

    pmax: np.ndarray  # [batch, layers, heads] mean over real rows
    entropy: np.ndarray  # [batch, layers, heads]
    rows: np.ndarray  # [batch] real query rows per item
    heatmap_mean: np.ndarray | None = None  # [bins, bins] mean probability per cell
    heatmap_max: np.ndarray | None = None  # [bins, bins] max probability per cell
    heatmap_edges: np.ndarray | None = None  # [bins + 1] token where each document bin starts (last = n): all maps
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
    named: dict[str, Any] = field(default_factory=dict)

    @property
    def layer_pmax(self) -> np.ndarray:
        """[layers] head mean of item 0's Pmax."""
        return self.pmax[0].mean(-1)

    @property
    def layer_entropy(self) -> np.ndarray:
        return self.entropy[0].mean(-1)

    def layers(self, kind: str, probe: str) -> dict[int, Any]:
        """One probe's recorded values by layer, in layer order (e.g. ``record.layers("cross", "logits")``)."""
        found = {}
        for key, v in self.named.items():
            k, layer, p = key.split(".")
            if k == kind and p == probe:
                found[int(layer)] = v
        return dict(sorted(found.items()))

    def __getitem__(self, name: str) -> Any:
        """A probe's value by name; a ``*`` layer stacks every recorded layer (numpy or torch alike)."""
        n = parse(name)
        if n.layer is not None:
            if str(n) not in self.named:
                raise KeyError(f"{n} was not recorded; recorded: {', '.join(self.named) or 'nothing'}")
            return self.named[str(n)]
        values = list(self.layers(n.kind, n.probe).values())
        if not values:
            raise KeyError(f"{n} was not recorded; recorded: {', '.join(self.named) or 'nothing'}")
        return torch.stack(values) if isinstance(values[0], torch.Tensor) else np.stack(values)

    def item(self, i: int) -> "ProbeRecord":
        """Batch item ``i``'s record: its own Pmax, H and logits; the views are item 0's, so they stay with item 0."""
        keep = {f.name: getattr(self, f.name) for f in fields(self)} if i == 0 else {}
        keep["nonfinite_layers"] = self.nonfinite_layers
        named = {k: v for k, v in self.named.items() if i == 0 or k.rsplit(".", 1)[1] in (*_STATS, "logits")}
        keep.update(
            pmax=self.pmax[i : i + 1],
            entropy=self.entropy[i : i + 1],
            rows=self.rows[i : i + 1],
            named={k: v[i : i + 1] if k.rsplit(".", 1)[1] in (*_STATS, "logits") else v for k, v in named.items()},
        )
        return ProbeRecord(**keep)


def pool_edges(n: int, bins: int) -> np.ndarray:
    """Bin start indices splitting ``n`` positions into ``min(n, bins)`` near-equal bins."""
    b = max(1, min(n, bins))
    return (np.arange(b + 1) * n) // b


Key = tuple[str, int]  # (attention kind, layer)


class Recorder:
    """Accumulates probe results block by block; see :class:`ProbeSpec`.

    ``token_mask`` is the ``[batch, L]`` boolean mask of the document's real
    tokens (the engine right-pads, so item ``i``'s real tokens are a prefix);
    None: every token is real, sizes taken from the first encoder or
    cross-attention seen (enough for a tap on ``logits``).
    """

    def __init__(self, spec: ProbeSpec, token_mask: torch.Tensor | None = None):
        self.spec = spec
        self.doc = spec.kind  # the attention whose rows are the document's tokens (ProbeSpec.kind)
        self._prefilled: set[int] = set()  # doc kind decoder: layers whose prefill was recorded (steps after: not)
        self._given_mask = token_mask
        self._asked = spec.probes
        self._of: dict[Key, frozenset[str]] = {}
        self.mask = None
        self._read_rows: tuple[int, int] | None = None
        if token_mask is not None:
            self._set_mask(token_mask.bool())
        self._pmax: dict[Key, torch.Tensor] = {}
        self._ent: dict[Key, torch.Tensor] = {}
        self._nrows: dict[Key, int] = {}  # decoder/cross rows seen (encoder rows come from the mask)
        self._bad: dict[Key, torch.Tensor] = {}  # non-finite Pmax/H values seen, per attention (on the pass's device)
        self._tiles: dict[int, list[torch.Tensor]] = {}  # encoder layer -> [sums, maxima] of the pooled map
        self._qrows: dict[
            int, dict[int, tuple[torch.Tensor, torch.Tensor]]
        ] = {}  # encoder layer -> question row -> map row
        self._answer_rows: dict[Key, dict[int, torch.Tensor]] = {}  # decoder/cross map rows by answer position
        self._profile: dict[Key, torch.Tensor] = {}
        self._profile_n: dict[Key, int] = {}
        self._sorted: dict[Key, list] = {}  # [sum of sorted rows, rows]
        self._cos_hist: dict[Key, torch.Tensor] = {}
        self._logits: dict[Key, list[torch.Tensor]] = {}
        self._offset: dict[Key, int] = {}  # decoder/cross: answer position of the current call's first row
        self._seen: dict[Key, int] = {}
        self._layer_qk: tuple[torch.Tensor, torch.Tensor, float] | None = None
        self._sample: torch.Tensor | None = None  # item 0's rows the sorted-logits probe sorts (long inputs)
        self._sample_n = 0

    def _set_mask(self, mask: torch.Tensor) -> None:
        self.mask = mask
        # the rows whose statistics count, as one span (Needs.rows): one document's, when it is not all of them
        where = torch.nonzero(mask[0]).view(-1) if mask.shape[0] == 1 else None
        self._read_rows = (
            (int(where[0]), int(where[-1]) + 1) if where is not None and len(where) and int(where[0]) > 0 else None
        )
        self.n0 = int(mask[0].sum())
        self.batch = mask.shape[0]
        edges = pool_edges(self.n0, self.spec.heatmap_size)
        self._edges = edges
        self._edges_t = torch.from_numpy(edges).long()
        self._sizes = torch.from_numpy(np.diff(edges)).float()
        self._bin = torch.from_numpy(np.repeat(np.arange(len(edges) - 1), np.diff(edges)))

    def asked(self, kind: str, layer: int) -> frozenset[str]:
        """The probes asked of one attention (kind and layer)."""
        key = (kind, layer)
        if key not in self._of:
            self._of[key] = frozenset(p.probe for p in self._asked if p.covers(kind, layer))
        return self._of[key]

    # -- called by the attention function ---------------------------------
    def begin_layer(
        self,
        layer: int,
        query,
        key,
        attention_mask,
        cosine_scale: float | None = None,
        *,
        kind: str = ENCODER,
        position_bias: torch.Tensor | None = None,
    ) -> Needs | None:
        """Start one attention call: what its blocks must carry (:class:`~core.mechanics.softmax_block.Needs`), or None
        when no block is wanted (nothing, or only ``logits``, is asked, and those are taken here): the caller
        may then take a backend that probes nothing."""
        want = self.asked(kind, layer)
        if not want:
            return None
        if kind == self.doc == DECODER:  # a decoder-only LM: its prefill is the document's rows, its steps are not
            if layer in self._prefilled:
                return None
            self._prefilled.add(layer)
        if self.mask is None and (kind != DECODER or kind == self.doc):
            self._set_mask(torch.ones(query.shape[0], key.shape[-2], dtype=torch.bool))
        k = (kind, layer)
        if kind != self.doc:  # answer rows: this call's rows follow the ones already seen (generation step by step)
            self._offset[k] = self._seen.get(k, 0)
            self._seen[k] = self._offset[k] + query.shape[-2]
        if "logits" in want:
            z = grouped_matmul(query, key.transpose(-1, -2))  # grouped K/V read in place
            self._logits.setdefault(k, []).append(z if position_bias is None else z + position_bias)
        self._layer_qk = (query, key, cosine_scale) if (cosine_scale and "cosine_hist" in want) else None
        if want.isdisjoint(_ROW_PROBES):
            return None
        raw_rows = None
        if "sorted_logits" in want:

            def raw_rows(r0: int, r1: int) -> torch.Tensor | None:
                return self._sorted_rows(r0, r1, kind)

        probs = not want.isdisjoint(_PROB_VIEWS)
        # only Pmax and H, weighed on some rows of one document (a decoder's question): the blocks of those rows
        rows = self._read_rows if kind == self.doc and raw_rows is None and not probs and want <= _STATS_ONLY else None
        return Needs(stats=not want.isdisjoint(_STATS), raw_rows=raw_rows, probs=probs, rows=rows)

    def end_layer(self, layer: int, kind: str = ENCODER) -> None:
        self._layer_qk = None

    @torch.no_grad()
    def observe(self, layer: int, block: Block, kind: str = ENCODER) -> None:
        """Take one block of query rows ``[block.r0, block.r1)`` (:class:`~core.mechanics.softmax_block.Block`), whichever
        backend made it: every probe of this attention is computed here from the block.

        From ``exp`` (``exp(x - max)``) and its row ``total``, p = exp / total, so Pmax = 1 / total and
        H = -sum p log p = log total - dot / total with ``dot`` = sum(exp * (x - max)): no probability of
        the block is divided for the statistics, and only the rows a view needs (one layer's map, the
        question's rows) are normalised; the map's pooling reads ``exp`` once through the kernel's
        ``pool_rows`` where it can (item 0's block contiguous, float32, on the CPU). A block without ``dot``
        gets H from exp / total, and one with only ``probs``, Pmax and H by their definitions. ``raw``: the
        raw logits of the rows the sorted-logits probe sorts (:meth:`_sorted_rows`)."""
        r0, r1 = block.r0, block.r1
        stats = not self.asked(kind, layer).isdisjoint(_STATS)
        pooled = None
        if block.exp is not None:
            exp, total = block.exp.detach(), block.total.detach()
            if stats:
                t = total.squeeze(-1)
                if block.dot is not None:
                    self._stats(kind, layer, r0, r1, t.reciprocal(), t.log() - block.dot.reshape(t.shape) / t)
                else:
                    p = exp / total
                    self._stats(kind, layer, r0, r1, t.reciprocal(), -torch.special.xlogy(p, p).sum(-1))
            e0 = exp[0]
            if (
                kind == self.doc
                and e0.device.type == "cpu"
                and e0.dtype == torch.float32
                and e0.is_contiguous()
                and fused_softmax.available()
            ):

                def pooled(a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
                    return fused_softmax.pool_rows(
                        e0, total[0], a - r0, b - r0, self.n0, self._edges_t, self.spec.heatmap_head
                    )

            def probs_of(a: int, b: int, k: int | None) -> torch.Tensor:
                return exp[0, :, a - r0 : b - r0, :k] / total[0, :, a - r0 : b - r0]
        elif block.probs is None:
            # a backend that keeps only each row's statistics (the CUDA kernel), chosen only when no view here
            # needs every row's probabilities (Needs.probs): the few rows a profile reads it computes on demand
            if stats:
                t = block.total.detach().squeeze(-1)
                self._stats(kind, layer, r0, r1, t.reciprocal(), t.log() - block.dot.detach().reshape(t.shape) / t)

            def probs_of(a: int, b: int, k: int | None) -> torch.Tensor:
                if block.probs_rows is None:
                    raise RuntimeError("this block carries no probabilities (Needs.probs was not asked)")
                return block.probs_rows(a, b, k)
        else:
            probs = block.probs.detach()
            if stats:
                self._stats(kind, layer, r0, r1, probs.amax(-1), -torch.special.xlogy(probs, probs).sum(-1))

            def probs_of(a: int, b: int, k: int | None) -> torch.Tensor:
                return probs[0, :, a - r0 : b - r0, :k]

        self._views(kind, layer, r0, r1, probs_of, block.raw, pooled)

    def _sorted_rows(self, r0: int, r1: int, kind: str) -> torch.Tensor | None:
        """The rows of block ``[r0, r1)`` (relative to ``r0``) whose raw logits (q.k + bias before tau) the
        sorted-logits probe sorts (:attr:`Needs.raw_rows <core.mechanics.softmax_block.Needs>`), or None.

        Every answer row, and every document row of item 0 up to :data:`SORTED_ROWS`; past that an evenly
        spaced sample of :data:`SORTED_ROWS` of them (the first and the last included). Why: sorting is
        ``n log n`` per row, and a whole layer of a 16k-token document is 2 G values to sort, more than the
        rest of the pass; the average sorted vector of a sample spread over every position is the same curve
        (docs/library.md gives the measured difference)."""
        if kind != self.doc:
            return torch.arange(r1 - r0)
        q1 = min(r1, self.n0)
        if q1 <= r0:
            return None
        sample = self._sorted_sample()
        if sample is None:
            return torch.arange(q1 - r0)
        inside = sample[(sample >= r0) & (sample < q1)] - r0
        return inside if len(inside) else None

    def _sorted_sample(self) -> torch.Tensor | None:
        """Item 0's rows the sorted-logits probe takes when it has more than :data:`SORTED_ROWS`, else None."""
        if self.n0 <= SORTED_ROWS:
            return None
        if self._sample is None or self._sample_n != self.n0:
            self._sample = torch.linspace(0, self.n0 - 1, SORTED_ROWS).round().long().unique()
            self._sample_n = self.n0
        return self._sample

    def _stats(self, kind: str, layer: int, r0: int, r1: int, pmax: torch.Tensor, ent: torch.Tensor) -> None:
        """Add one block's per-row Pmax and H ``[B, H, c]`` to the running sums (padded encoder rows skipped)."""
        key = (kind, layer)
        if kind == self.doc:
            rowmask = self.mask[:, r0:r1].to(pmax.device, pmax.dtype)[:, None, :]  # [B,1,c]
            pmax, ent = pmax * rowmask, ent * rowmask
        else:
            self._nrows[key] = self._nrows.get(key, 0) + (r1 - r0)
        # Sums stay on the pass's device and non-finite rows are counted, not tested: a Python ``if`` on a
        # GPU tensor, or a ``.cpu()`` per block, would stall the GPU once per block and layer.
        bad = (~torch.isfinite(pmax)).sum() + (~torch.isfinite(ent)).sum()
        self._bad[key] = self._bad.get(key, 0) + bad
        self._pmax[key] = self._pmax.get(key, 0) + torch.nan_to_num(pmax).sum(-1).double()
        self._ent[key] = self._ent.get(key, 0) + torch.nan_to_num(ent).sum(-1).double()

    def _views(
        self,
        kind: str,
        layer: int,
        r0: int,
        r1: int,
        probs_of: Callable,
        raw: torch.Tensor | None,
        pooled: Callable | None = None,
    ) -> None:
        """Maps, profile, sorted logits, cosine histogram from one block of item 0.

        ``probs_of(a, b, k)`` gives item 0's probabilities ``[H, b - a, k]`` of
        rows ``[a, b)`` (inside the block) over the first ``k`` keys, computed
        only when a view needs them.
        """
        want = self.asked(kind, layer)
        if kind != self.doc:
            return self._answer_views(kind, layer, want, r0, r1, probs_of, raw)
        spec = self.spec
        n0 = self.n0
        q1 = min(r1, n0)
        if q1 <= r0:
            return
        rows = spec.profile_rows
        if pooled is None:

            def pooled(a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
                return self._pool_keys(probs_of(a, b, n0))

        if "map" in want:
            self._add_tile(layer, *pooled(r0, q1), r0, q1)
            if rows is not None:
                a, b = max(rows[0], r0), min(rows[1], q1)
                if b > a:
                    self._add_question_rows(layer, *pooled(a, b), a)
        if "profile" in want and rows is not None:
            a, b = max(rows[0], r0), min(rows[1], q1)
            if b > a:
                self._add_profile((kind, layer), probs_of(a, b, n0))
        if "sorted_logits" in want and raw is not None:
            self._add_sorted((kind, layer), raw[0, :, :, :n0])
        if "cosine_hist" in want:
            self._add_cosine((kind, layer), r0, q1, n0)

    def _answer_views(
        self,
        kind: str,
        layer: int,
        want: frozenset[str],
        r0: int,
        r1: int,
        probs_of: Callable,
        raw: torch.Tensor | None,
    ) -> None:
        """The views of decoder self- or cross-attention: rows are answer positions, appended as generation goes."""
        key = (kind, layer)
        keys = self.n0 if kind == CROSS else None  # cross keys are the document's tokens; decoder keys the answer's own
        if "map" in want:
            p0 = probs_of(r0, r1, keys)
            if kind == CROSS:
                ksum, _ = self._pool_keys(p0)
                p = ksum / self._sizes
            else:
                p = self._head(p0)
            rows = self._answer_rows.setdefault(key, {})
            base = self._offset.get(key, 0) + r0
            for i in range(p.shape[0]):
                rows[base + i] = p[i]
        if "profile" in want:
            self._add_profile(key, probs_of(r0, r1, keys))
        if "sorted_logits" in want and raw is not None:
            self._add_sorted(key, raw[0, :, :, :keys])
        if "cosine_hist" in want:
            self._add_cosine(key, r0, r1, keys)

    def _head(self, p0: torch.Tensor) -> torch.Tensor:
        """The spec's head (or the head mean) of item 0's probabilities ``[H, rows, k]`` -> ``[rows, k]`` (float32, CPU)."""
        head = self.spec.heatmap_head
        return (p0[head] if head is not None else p0.mean(0)).float().cpu()

    def _add_profile(self, key: Key, p0: torch.Tensor) -> None:
        """Add rows' head-mean attention to every key (summed over the rows; averaged in :meth:`finish`)."""
        add = p0.mean(0).sum(0).double().cpu()
        old = self._profile.get(key)
        if old is not None and len(old) < len(add):  # decoder keys grow by one each generation step
            old = torch.nn.functional.pad(old, (0, len(add) - len(old)))
        self._profile[key] = add if old is None else old + add
        self._profile_n[key] = self._profile_n.get(key, 0) + p0.shape[1]

    def _add_sorted(self, key: Key, z: torch.Tensor) -> None:
        """Add item 0's raw logit rows ``[H, rows, keys]``, each sorted descending, to the running mean."""
        z = z.detach().float()
        if z.device.type == "cpu" and fused_softmax.available():
            srt = fused_softmax.sorted_sum(
                z.reshape(-1, z.shape[-1]) if z.stride(-1) == 1 else z.contiguous().view(-1, z.shape[-1])
            )
        else:
            srt = torch.sort(z, dim=-1, descending=True).values.double().sum(dim=(0, 1)).cpu()
        acc = self._sorted.setdefault(key, [0, 0])
        acc[0] = acc[0] + srt
        acc[1] += z.shape[0] * z.shape[1]

    def _add_cosine(self, key: Key, r0: int, r1: int, keys: int | None) -> None:
        if self._layer_qk is None:
            return
        q, k, s = self._layer_qk
        cos = torch.matmul(q[0, :, r0:r1].float() / s, k[0, :, :keys].float().transpose(-1, -2))
        bins = self.spec.cosine_hist_bins or COSINE_BINS
        h = torch.histc(cos.clamp(-1, 1), bins=bins, min=-1.0, max=1.0).double().cpu()
        self._cos_hist[key] = h if key not in self._cos_hist else self._cos_hist[key] + h

    def _pool_keys(self, p0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of the map's head (or head mean), keys pooled into the document's bins: (sums, maxima) ``[rows, bins]``."""
        p = self._head(p0)  # [rows, n0]
        nb = len(self._edges) - 1
        rows = p.shape[0]
        ksum = torch.zeros(rows, nb).index_add_(1, self._bin, p)
        kmax = torch.zeros(rows, nb).scatter_reduce_(1, self._bin.expand(rows, -1), p, "amax", include_self=True)
        return ksum, kmax

    def _add_tile(self, layer: int, ksum: torch.Tensor, kmax: torch.Tensor, r0: int, q1: int) -> None:
        """Add rows ``[r0, q1)`` of the map, keys pooled (``ksum``, ``kmax``: ``[rows, bins]``), into its row bins."""
        nb = ksum.shape[1]
        rbin = self._bin[r0:q1]
        if layer not in self._tiles:
            self._tiles[layer] = [torch.zeros(nb, nb, dtype=torch.float64), torch.zeros(nb, nb)]
        tile_sum, tile_max = self._tiles[layer]
        # A block's rows fall in consecutive row bins (bins are runs of positions), so each bin is one segment:
        # segment reductions, not index_add_/scatter_reduce_, which torch's AVX2 build runs 10x slower here
        # (56 ms against 4.5 ms per block of 512 rows; 0.5 s of a 4k pass: bench/README.md, issue 49).
        bins, counts = torch.unique_consecutive(rbin, return_counts=True)
        seg_sum = torch.segment_reduce(ksum.double(), "sum", lengths=counts, axis=0)
        seg_max = torch.segment_reduce(kmax, "max", lengths=counts, axis=0)
        tile_sum[bins] += seg_sum
        tile_max[bins] = torch.maximum(tile_max[bins], seg_max)

    def _add_question_rows(self, layer: int, ksum: torch.Tensor, kmax: torch.Tensor, a: int) -> None:
        """The question's own rows of the map's layer/head, keys pooled like the map, rows kept one by one.

        In the square map a question of 20 tokens in 16k is a fraction of one
        pooled row; here each question token gets a row, so the needle's
        column can be seen lighting up (or not)."""
        rows = self._qrows.setdefault(layer, {})
        for i in range(ksum.shape[0]):
            rows[a + i] = (ksum[i] / self._sizes, kmax[i])

    # -- results -----------------------------------------------------------
    def finish(self) -> ProbeRecord:
        """Turn the running sums into a :class:`ProbeRecord` of numpy arrays (``logits``: torch tensors)."""
        named: dict[str, Any] = {}
        rec = self._encoder_record(named)
        rec.nonfinite_layers = self.nonfinite(self.doc)
        for (kind, layer), n in self._nrows.items():
            named[f"{kind}.{layer}.pmax"] = (self._pmax[(kind, layer)] / n).cpu().numpy()
            named[f"{kind}.{layer}.entropy"] = (self._ent[(kind, layer)] / n).cpu().numpy()
        for (kind, layer), rows in self._answer_rows.items():
            order = sorted(rows)
            width = max(len(rows[r]) for r in order)
            named[f"{kind}.{layer}.map"] = torch.stack(
                [torch.nn.functional.pad(rows[r], (0, width - len(rows[r]))) for r in order]
            ).numpy()
            if kind == CROSS:
                rec.heatmap_edges = self._edges
        for (kind, layer), v in self._profile.items():
            if kind != self.doc:
                named[f"{kind}.{layer}.profile"] = (v / self._profile_n[(kind, layer)]).numpy()
        for (kind, layer), (total, n) in self._sorted.items():
            named[f"{kind}.{layer}.sorted_logits"] = (total / n).numpy()
        for (kind, layer), h in self._cos_hist.items():
            named[f"{kind}.{layer}.cosine_hist"] = h.numpy()
        for (kind, layer), parts in self._logits.items():
            named[f"{kind}.{layer}.logits"] = _cat_rows(parts)
        # keep exactly what was asked (pmax and H are computed together)
        rec.named = {k: named[k] for k in sorted(named) if self._is_asked(k)}
        return rec

    def nonfinite(self, kind: str) -> list[int]:
        """Layers of one attention kind whose Pmax or H came out NaN/inf so far."""
        return sorted(l for (k, l), n in self._bad.items() if k == kind and int(n) > 0)

    def take(self) -> ProbeRecord:
        """:meth:`finish`, then start afresh: a standing recorder (:func:`core.mechanics.attention.listen`) read once a step."""
        rec = self.finish()
        self.__init__(self.spec, self._given_mask)  # (a decoder-only LM's next pass: its prefill is recorded again)
        return rec

    def _is_asked(self, name: str) -> bool:
        n = parse(name)
        return n.probe in self.asked(n.kind, n.layer)

    def _encoder_record(self, named: dict[str, Any]) -> ProbeRecord:
        """The document's attention's results (the encoder's; a decoder-only LM's prefill), as the record's fields
        and as names."""
        spec, doc = self.spec, self.doc
        layers = sorted(l for k, l in self._pmax if k == doc)
        rows = self.mask.sum(-1).double().cpu() if self.mask is not None else torch.zeros(0, dtype=torch.float64)
        if layers:
            pmax = torch.stack([self._pmax[(doc, l)].cpu() for l in layers], 1) / rows[:, None, None]
            ent = torch.stack([self._ent[(doc, l)].cpu() for l in layers], 1) / rows[:, None, None]
        else:
            pmax = ent = torch.zeros(len(rows), 0, 0, dtype=torch.float64)
        rec = ProbeRecord(pmax=pmax.numpy(), entropy=ent.numpy(), rows=rows.numpy().astype(int))
        for i, l in enumerate(layers):
            named[f"{doc}.{l}.pmax"], named[f"{doc}.{l}.entropy"] = rec.pmax[:, i], rec.entropy[:, i]
        for l, (tile_sum, tile_max) in self._tiles.items():
            sizes = self._sizes.double()
            named[f"{doc}.{l}.map"] = mean = (tile_sum / (sizes[:, None] * sizes[None, :])).float().numpy()
            rec.heatmap_edges = self._edges
            if l == spec.heatmap_layer:
                rec.heatmap_mean, rec.heatmap_max = mean, tile_max.numpy()
                rec.heatmap_layer, rec.heatmap_head = spec.heatmap_layer, spec.heatmap_head
        qrows = self._qrows.get(spec.heatmap_layer)
        if qrows:
            order = sorted(qrows)
            rec.question_rows = np.asarray(order)
            rec.question_map_mean = torch.stack([qrows[r][0] for r in order]).numpy()
            rec.question_map_max = torch.stack([qrows[r][1] for r in order]).numpy()
        profile = sorted(l for k, l in self._profile if k == doc)
        if profile:
            a, b = spec.profile_rows
            n_rows = max(1, min(b, self.n0) - a)
            rec.profile = np.stack([(self._profile[(doc, l)] / n_rows).numpy() for l in profile])
            for i, l in enumerate(profile):
                named[f"{doc}.{l}.profile"] = rec.profile[i]
        if (doc, 0) in self._sorted and self._sorted[(doc, 0)][1]:
            total, n = self._sorted[(doc, 0)]
            v = (total / n).numpy()
            rec.sorted_logits, rec.sigma, rec.l_max = v, float(v.std()), float(v.max())
        if (doc, 0) in self._cos_hist:
            rec.cosine_hist = self._cos_hist[(doc, 0)].numpy()
            rec.cosine_edges = np.linspace(-1, 1, len(rec.cosine_hist) + 1)
        return rec


def _cat_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """Logit blocks ``[B, H, rows, keys]`` of successive calls as one; keys a later step added are -inf
    in the earlier rows (decoder self-attention generated step by step: those keys did not exist yet)."""
    if len(parts) == 1:
        return parts[0]
    width = max(p.shape[-1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[-1]), value=float("-inf")) for p in parts], 2)
