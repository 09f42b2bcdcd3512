"""The scrubber's payload: every grid tau's views of one document, packed as bytes for the browser.

Why a payload and not figures: the Explore page's slider must repaint its
views within a frame (~16 ms) of a move. A server round trip per move costs
0.65-2 s (one Streamlit rerun, a plotly ``newPlot`` per changed figure), so
the browser receives, once per document, what every tau on the grid shows
(answers, Pmax / H per layer and head, the chosen attention map and the
question's rows, the question profile, the text's shading weights, the
answer's cross-attention) and draws the frame for the slider's tau itself
(``ui/scrubber.js``).

Everything here is plain numpy from :class:`core.runs.engine.Result` objects, like
BertViz: arrays in, no Streamlit, no torch. Maps are quantised to uint8 on
one log scale shared by every frame of the document (the tau = 1 map
included), so colours compare across taus; the layout of the bytes is:

``b"AAEF" | uint32 header length | header JSON (utf-8) | spaces to a multiple of 8 | blobs``

where the header names each array by ``{"off", "shape", "dtype"}`` (offsets
from the start of the blob area, each 8-byte aligned so the browser can view
them as ``Float32Array`` without a copy). ``unpack`` in ``ui/scrubber.js`` reads it
back (the tests hold a Python mirror of that reader: ``tests/conftest.py``).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.kinds import DECODER, ENCODER
from core.runs import temperature
from core.runs.engine import Result
from core.views import tables

MAGIC = b"AAEF"
#: The scrubber's grid: Algorithm 1's 1.00 ... 0.50 by 0.05, extended to the slider's floor (0.30).
SCRUB_GRID: tuple[float, ...] = tuple(
    round(1.0 - 0.05 * i, 2) for i in range(int(round((1.0 - temperature.TAU_FLOOR) / 0.05)) + 1)
)
#: Points of the question-profile polyline per layer (max-pooled: a one-token peak survives).
PROFILE_POINTS = 600
_DTYPES = {"u8": np.uint8, "f32": np.float32}


def grid_order(tau: float, grid: Sequence[float] = SCRUB_GRID) -> list[float]:
    """The grid sorted by distance from ``tau``: what a person scrubbing from ``tau`` reaches first.

    tau = 1 goes first whatever ``tau`` is: it is the left column of every frame.
    """
    rest = sorted((g for g in grid if g != 1.0), key=lambda g: (abs(g - tau), -g))
    return ([1.0] if 1.0 in grid else []) + rest


# -- quantisation ------------------------------------------------------------------------


@dataclass(frozen=True)
class LogScale:
    """uint8 codes for probabilities: 0 is "at most ``lo``", 1..255 spread log-evenly over (lo, hi].

    One scale per document: ``lo`` a hundredth of the uniform weight 1 / n
    (a dispersed row sits near 1 / n; its tail is what log colour shows), ``hi`` = 1.
    About 4.7 % relative steps at 2k tokens, below what a colour map can show.
    """

    lo: float
    hi: float = 1.0

    @classmethod
    def for_length(cls, n: int) -> "LogScale":
        return cls(lo=1.0 / (100.0 * max(1, n)))

    def encode(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=np.float64)
        a, b = math.log(self.lo), math.log(self.hi)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = (np.log(np.clip(p, self.lo, self.hi)) - a) / (b - a)
        codes = 1 + np.rint(x * 254.0)
        codes = np.where(np.isfinite(p) & (p > self.lo), codes, 0)
        return np.clip(codes, 0, 255).astype(np.uint8)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        c = np.asarray(codes, dtype=np.float64)
        a, b = math.log(self.lo), math.log(self.hi)
        return np.where(c > 0, np.exp(a + (c - 1) / 254.0 * (b - a)), 0.0)

    @property
    def step(self) -> float:
        """Largest relative error of a decoded value inside (lo, hi]: half a code."""
        return math.exp(0.5 * (math.log(self.hi) - math.log(self.lo)) / 254.0) - 1.0


# -- packing -----------------------------------------------------------------------------


class Packer:
    """Collects arrays into one aligned blob area and hands back the header entry of each."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    def add(self, a: np.ndarray, dtype: str) -> dict:
        arr = np.ascontiguousarray(a, dtype=_DTYPES[dtype])
        raw = arr.tobytes()
        entry = {"off": self._size, "shape": list(arr.shape), "dtype": dtype}
        pad = (-len(raw)) % 8
        self._parts.append(raw + b"\0" * pad)
        self._size += len(raw) + pad
        return entry

    def finish(self, header: dict) -> bytes:
        head = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("utf-8")
        pad = (-(8 + len(head))) % 8
        return MAGIC + struct.pack("<I", len(head)) + head + b" " * pad + b"".join(self._parts)


# -- views of one document ---------------------------------------------------------------


@dataclass(frozen=True)
class ViewSpec:
    """What the person chose to look at (Explore's widgets): it selects which recorded arrays a frame carries."""

    pool: str = "mean"  # "mean" or "max" pooling of the map cells
    cross_layer: int | None = None  # None: mean of the decoder layers
    window: int = 150  # tokens shown either side of the needle in the shaded text
    profile_points: int = PROFILE_POINTS


def _pool_max(profile: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """``[layers, n]`` -> ``[layers, <= points]`` by the max of each bin, and each bin's first token."""
    n = profile.shape[1]
    b = max(1, min(n, points))
    edges = (np.arange(b + 1) * n) // b
    return np.maximum.reduceat(profile, edges[:-1], axis=1), edges[:-1]


def text_window(
    text: str, offsets: np.ndarray, centre: tuple[int, int] | None, window: int
) -> tuple[int, int, list[list]]:
    """The tokens the shaded text shows: ``(first, last, pieces)``, a piece ``[gap before, token text]`` per token.

    The same window as :func:`core.views.plots.token_shading_html`: ``window`` tokens
    either side of ``centre`` (the needle), the characters no token covers kept
    as the gap before the next token.
    """
    offsets = np.asarray(offsets)
    n = len(offsets)
    lo, hi = (0, n) if centre is None else (max(0, centre[0] - window), min(n, centre[1] + window))
    pieces: list[list] = []
    prev = int(offsets[lo][0]) if lo < n else 0
    for i in range(lo, hi):
        a, b = int(offsets[i][0]), int(offsets[i][1])
        if b <= a:
            pieces.append(["", ""])
            continue
        pieces.append([text[prev:a] if a > prev else "", text[a:b]])
        prev = b
    return lo, hi, pieces


def causal(res: Result) -> bool:
    """Whether the run's document rows are a decoder-only LM's causal self-attention (its probes are named
    ``decoder.*`` and no encoder read the document): each row sees itself and the tokens before it only."""
    p = res.probes
    return p is not None and bool(p.layers(DECODER, "pmax")) and not p.layers(ENCODER, "pmax")


def causal_cells(edges: Sequence[int]) -> np.ndarray:
    """The share of each map cell's (query, key) pairs a causal row cannot see (key after query): ``[bins, bins]``
    in 0..1 on the maps' own cells (``edges``: the token where each bin starts, the last = n). 1 above the diagonal,
    about one half on it, 0 below. The browser veils these so the empty upper triangle does not read as "no
    attention there": nothing is there to attend (issue 56, item 3)."""
    e = np.asarray(edges, dtype=np.int64)
    n, bins = int(e[-1]), len(e) - 1
    starts, ends = e[:-1], e[1:]
    i = np.arange(n)[:, None]  # one query row each
    unseen = np.clip(ends[None, :] - np.maximum(starts[None, :], i + 1), 0, None)  # keys of each bin after row i
    per_row_bin = np.add.reduceat(unseen, starts, axis=0)[:bins] if n else np.zeros((bins, bins))
    size = (ends - starts)[:, None] * (ends - starts)[None, :]
    return np.where(size > 0, per_row_bin / np.maximum(size, 1), 0.0)


#: The maps' caption for a decoder-only LM (what the rows are, why the upper triangle is empty).
CAUSAL_MAP_NOTE = (
    "Rows are queries, columns keys, every token of the prompt (the document, then the question last). The model "
    "is causal: each row sees itself and the tokens before it only, so the upper triangle (veiled grey) is not weak "
    "attention but nothing to attend. {marks} Below each map, the question's rows (the prompt's last, where the "
    "answer is read from) one token each: dispersed, their mass spreads over the whole row{sharper}."
)
#: The maps' caption when nothing is marked as the needle (pasted text, "no needle, my question").
NO_NEEDLE_MAP_NOTE = (
    "Rows are queries, columns keys. Blue dotted lines: your question (no needle is marked in this text). Below "
    "each map, the question's own rows, one token each: dispersed, their mass spreads over the whole row; a sharper "
    "tau gathers it on fewer keys again."
)


def map_note(res: Result) -> str | None:
    """The maps' caption for a run whose maps the default caption (a T5 pass key: needle red, question blue) does
    not describe: a decoder-only LM's causal maps, or a text with no needle marked; None otherwise."""
    needle = bool(res.needle_tokens)
    if causal(res):
        return CAUSAL_MAP_NOTE.format(
            marks="Red dotted lines: the needle; blue: the question."
            if needle
            else "Blue dotted lines: the question (no needle is marked in this text).",
            sharper="; a sharper tau brings back a bright cell at the needle column" if needle else "",
        )
    return None if needle else NO_NEEDLE_MAP_NOTE


def _num(x: Any, digits: int = 6) -> float | None:
    if x is None:
        return None
    x = float(x)
    return round(x, digits) if math.isfinite(x) else None


def frame(
    res: Result,
    packer: Packer,
    scale: LogScale,
    spec: ViewSpec,
    window: tuple[int, int] | None,
    card: dict | None = None,
) -> dict:
    """One tau's views of a run, its arrays added to ``packer``: the header entry of the frame.

    ``card``: a masked-LM model's masked-token card at this frame's setting (:func:`core.views.rope_view.card`: accuracy,
    perplexity, the first masked tokens beside their predictions), shown in place of the answer; None for T5."""
    p = res.probes
    out: dict[str, Any] = {
        "tau": _num(res.tau_mean, 4),
        "uniform": bool(np.all(res.tau == res.tau.flat[0])),
        "cosine_scale": _num(res.cosine_scale, 4),
        "answer": res.answer,
        "correct": res.correct,
        "perplexity": _num(res.perplexity, 4),
        "pmax": _num(res.pmax),
        "entropy": _num(res.entropy),
        "layer_pmax": [_num(v) for v in p.layer_pmax],
        "layer_entropy": [_num(v) for v in p.layer_entropy],
        "head_pmax": [[_num(v) for v in row] for row in p.pmax[0]],
        "head_entropy": [[_num(v) for v in row] for row in p.entropy[0]],
        "seconds": _num(res.seconds.get("total"), 3),
    }
    if card is not None:
        out["masked"] = {**card, "accuracy": _num(card["accuracy"]), "perplexity": _num(card["perplexity"], 4)}
    heat = getattr(p, f"heatmap_{spec.pool}")
    if heat is not None:
        out["map"] = packer.add(scale.encode(heat), "u8")
    qmap = getattr(p, f"question_map_{spec.pool}")
    if qmap is not None and len(qmap):
        out["qrows"] = packer.add(scale.encode(qmap), "u8")
    if p.profile is not None:
        pooled, _ = _pool_max(np.asarray(p.profile, dtype=np.float32), spec.profile_points)
        out["profile"] = packer.add(pooled, "f32")
        if window is not None:
            out["text_weights"] = packer.add(np.asarray(p.profile[:, window[0] : window[1]], dtype=np.float32), "f32")
    cross = tables.answer_attention(res, spec.cross_layer)
    if cross is not None:
        z, tokens = cross
        out["cross"] = packer.add(scale.encode(z), "u8")
        out["cross_tokens"] = tokens
        out["needle_share"] = _num(tables.needle_share(res, spec.cross_layer), 4)
    return out


def payload(
    base: Result,
    ref: Result,
    grid: dict[float, Result],
    exact: Result | None,
    text: str,
    spec: ViewSpec = ViewSpec(),
    *,
    grid_taus: Iterable[float] = SCRUB_GRID,
    meta: dict | None = None,
    only: Iterable[float] | None = None,
    cards: dict[str, dict] | None = None,
    mask: np.ndarray | None = None,
) -> bytes:
    """The bytes the scrubber draws from.

    ``base``: the left column (the model as trained: tau = 1, its own
    CosScale); ``ref``: the same task at L_tr (the meters' ticks); ``grid``:
    the runs of the grid taus computed so far (tau -> Result; the rest are
    "still coming"); ``exact``: the run of the chosen tau when it is not a
    grid value (a typed tau, a method's schedule), else None. ``meta`` goes
    into the header as it is (labels, the chosen tau, what is pending).

    ``only``: a delta for a browser that already holds this document's
    payload: just these grid frames, the exact frame and ``meta`` (no tau = 1
    column, reference, text or axes), marked ``"delta": true``. While a grid
    fills, each poll then sends the frames that are new, not all of them again.
    A delta also lists as ``"held"`` every grid frame computed so far: the
    server cannot know that an earlier payload arrived, so the browser checks.

    ``cards``: for a masked-LM model (the rotary family), the masked-token card of each frame
    (:func:`core.views.rope_view.card`) by ``"base"``, ``"ref"`` (the L_tr reference), ``"exact"`` and the grid value
    as ``f"{t:.2f}"``; a frame without one shows no card. None for T5, whose frames carry the answer instead.

    A decoder-only LM's run (:func:`causal`) adds ``causal``: the share of each map cell no causal row can see
    (:func:`causal_cells`, uint8 0..255, with the document), for the browser to veil on both maps, and the maps'
    caption (:func:`map_note`, also for a text without a needle) as ``meta["map_note"]`` unless ``meta`` has one.

    ``mask``: the masked share of each map cell under the chosen position scheme (:func:`core.views.rope_view.mask_cells`,
    ``[bins, bins]`` in 0..1 on the maps' own cells), drawn over the chosen map; sent as uint8 (0..255) with the
    document (it does not depend on tau). None: no scheme mask.
    """
    cards = cards or {}
    note = map_note(base)
    if note is not None:  # a decoder-only LM's causal maps, or no needle: their own caption unless the caller gave one
        meta = {"map_note": note, **(meta or {})}
    n = base.tokens
    scale = LogScale.for_length(n)
    packer = Packer()
    p = base.probes
    centre = base.needle_tokens or base.question_tokens
    window = None
    doc: dict[str, Any] = {
        "tokens": n,
        "train_length": base.train_length,
        "layers": int(p.pmax.shape[1]),
        "heads": int(p.pmax.shape[2]),
        "needle": list(base.needle_tokens) if base.needle_tokens else None,
        "question": list(base.question_tokens) if base.question_tokens else None,
        "edges": [int(e) for e in p.heatmap_edges] if p.heatmap_edges is not None else None,
        "question_rows": [int(r) for r in p.question_rows] if p.question_rows is not None else None,
        "heatmap_layer": p.heatmap_layer,
        "heatmap_head": p.heatmap_head,
        "expected": base.expected,
        "scale": {"lo": scale.lo, "hi": scale.hi},
    }
    if p.profile is not None:
        _, starts = _pool_max(np.asarray(p.profile[:1], dtype=np.float32), spec.profile_points)
        doc["profile_x"] = [int(s) for s in starts]
        if base.offsets is not None:
            lo, hi, pieces = text_window(text, base.offsets, centre, spec.window)
            window = (lo, hi)
            doc["text"] = {"first": lo, "pieces": pieces, "before": lo > 0, "after": hi < len(base.offsets)}
    doc["ref"] = {
        "pmax": _num(ref.pmax),
        "entropy": _num(ref.entropy),
        "perplexity": _num(ref.perplexity, 4),
        "layer_pmax": [_num(v) for v in ref.probes.layer_pmax],
        "layer_entropy": [_num(v) for v in ref.probes.layer_entropy],
        "head_pmax": [[_num(v) for v in row] for row in ref.probes.pmax[0]],
    }
    taus = [round(float(t), 2) for t in grid_taus]
    if only is not None:
        keep = {round(float(t), 2) for t in only}
        return packer.finish(
            {
                "delta": True,
                "grid": taus,
                # Every grid frame the browser must hold once this delta is merged: a payload can be lost on its way
                # (Streamlit drops queued messages when a new run starts), and a browser that lacks one asks for all.
                "held": [f"{t:.2f}" for t in taus if t in grid],
                "frames": {
                    f"{t:.2f}": frame(grid[t], packer, scale, spec, window, cards.get(f"{t:.2f}"))
                    for t in taus
                    if t in grid and t in keep
                },
                "exact": frame(exact, packer, scale, spec, window, cards.get("exact")) if exact is not None else None,
                "meta": meta or {},
            }
        )
    if causal(base) and doc["edges"] is not None:
        doc["causal"] = packer.add(np.rint(causal_cells(doc["edges"]) * 255.0), "u8")
    if mask is not None:
        doc["mask"] = packer.add(np.rint(np.clip(np.asarray(mask, dtype=np.float64), 0.0, 1.0) * 255.0), "u8")
    if cards.get("ref") is not None:
        doc["ref"]["masked"] = {k: cards["ref"][k] for k in ("accuracy", "perplexity", "masked", "correct")}
    doc["base"] = frame(base, packer, scale, spec, window, cards.get("base"))
    doc["grid"] = taus
    doc["frames"] = {
        f"{t:.2f}": frame(grid[t], packer, scale, spec, window, cards.get(f"{t:.2f}")) for t in taus if t in grid
    }
    doc["exact"] = frame(exact, packer, scale, spec, window, cards.get("exact")) if exact is not None else None
    doc["meta"] = meta or {}
    return packer.finish(doc)
