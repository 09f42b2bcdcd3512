"""Position schemes for RoPE models, one registry entry each: the second axis beside the temperature.

A scheme changes how a rotary model sees positions past its training length
L_tr, in one or more of three ways (:data:`FREQUENCIES`, :data:`DISTANCES`,
:data:`MASK`):

* the rotary **frequencies** (PI, NTK-aware, dynamic NTK, YaRN): computed by
  transformers' own rope functions (``ROPE_INIT_FUNCTIONS``) from a copy of
  the model's config with the scheme's ``rope_parameters`` (:func:`configured`);
* the **relative distances** a logit is computed at (ReRoPE, StreamingLLM's
  cache positions, LM-Infinite's cap): :meth:`Bound.capped_positions`, and the
  logits themselves from unrotated q and k (:func:`rectified_logits`);
* an attention **mask** (windowed attention, StreamingLLM, LM-Infinite):
  :meth:`Bound.mask_rows`, made for a block of query rows, never ``[L, L]``.

A :class:`PositionScheme` (the registry entry) owns all of it (label, help, source, what it changes, its
parameters' defaults); :meth:`PositionScheme.bind` fixes them for a model's L_tr and an
input's length L, giving a :class:`Bound`, which is what a forward pass needs.
Schemes that need their own training (ALiBi, PoSE) are entries too, marked
unavailable with the reason, so no list drops them silently.

How a bound scheme reaches a model (docs/positions.md, "How it is applied"; every pass of a rotary model goes
through :func:`core.runs.rope_pass.scheme_pass`, which binds the scheme to the pass's length and puts the
:class:`Bound` in the attention call's context): the model's rotary modules, swapped once for a subclass
(:func:`core.mechanics.patches.rotate_per_call`), read it when they compute cos and sin (the scheme's frequencies, or none at all
for a scheme that rectifies distances, so the attention function receives unrotated q and k); the
attention function ANDs :meth:`Bound.mask_rows` into the padding mask and, for rectified schemes, takes its
logits from :func:`rectified_logits`. Nothing of the shared model changes per pass.

No temperature method is named here (tests/runs/test_method_registry_owner.py): YaRN's
frequencies are the entry ``yarn-rope``; transformers' own ``rope_type`` keys
(:data:`YARN_ROPE` and friends) are data in transformers' vocabulary, checked
against its registry by a test. torch and transformers are imported only where
something is computed, so listing schemes stays light.

A :class:`Scheme` is a *choice* of one (an entry's name and its parameters),
the value that travels from each edge (a settings file, the CLI's
``--schemes``, a URL, the sidebar) to the attention: :meth:`Scheme.of` is the
one parser and validator, :meth:`Scheme.spell` its one text, and
:meth:`Scheme.bind` fixes it for a model's L_tr and an input's length.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core import errors
from core.errors import UserError

if TYPE_CHECKING:  # pragma: no cover
    import torch

FREQUENCIES = "frequencies"
DISTANCES = "distances"
MASK = "mask"

#: transformers' own name for the original rotary (not a key of ROPE_INIT_FUNCTIONS: each model computes it)
DEFAULT_ROPE = "default"
#: YaRN's ramp bounds (Peng et al. 2023, and transformers' defaults): dimensions turning more than beta_fast
#: times over L_tr keep their frequency, fewer than beta_slow times are interpolated
BETA_FAST = 32.0
BETA_SLOW = 1.0


#: transformers' ``rope_type`` keys (``modeling_rope_utils.ROPE_INIT_FUNCTIONS``) the frequency schemes hand to its
#: own rope functions: data in transformers' vocabulary, checked against that registry by tests/values/test_position_schemes.py
LINEAR_ROPE = "linear"
DYNAMIC_ROPE = "dynamic"
YARN_ROPE = "yarn"


def fitted_factor(train_length: int, length: int) -> float:
    """s = L / L_tr, never below 1: the stretch that brings the input's positions inside the trained range."""
    return max(1.0, length / train_length)


def default_inv_freq(theta: float, dim: int) -> "torch.Tensor":
    """Plain RoPE's inverse frequencies ``theta^(-2i/d)``, i = 0 .. d/2 - 1, in float32 as transformers makes them."""
    import torch

    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def ntk_theta(theta: float, dim: int, factor: float) -> float:
    """NTK-aware base: theta * s^(d / (d - 2)), which divides the lowest frequency by exactly s (bloc97, 2023)."""
    return theta * factor ** (dim / (dim - 2))


# ---- layer types and rope parameters of a config -------------------------------------------------------------


def layer_types(config: Any) -> list[str | None]:
    """The layer types whose rope parameters differ (ModernBERT: ``full_attention``, ``sliding_attention``), or
    ``[None]`` for a config with one flat ``rope_parameters`` dict."""
    params = getattr(config, "rope_parameters", None) or {}
    if params and all(isinstance(v, dict) or v is None for v in params.values()):
        return sorted(k for k, v in params.items() if v is not None)
    return [None]


def rope_params(config: Any, layer_type: str | None) -> dict:
    """One layer type's ``rope_parameters`` dict (the flat dict when ``layer_type`` is None)."""
    params = config.rope_parameters
    return dict(params[layer_type] if layer_type is not None else params)


#: ``model_type``s whose attention rotates the whole head (``apply_rotary_pos_emb`` over ``head_dim``) and whose
#: default frequencies ignore ``partial_rotary_factor`` (transformers' ``ModernBertRotaryEmbedding``): a config
#: there that says its rotary covers part of the head still rotates all of it (issue 47, point 3)
WHOLE_HEAD_ROTARY: tuple[str, ...] = ("modernbert",)


def attention_head_dim(config: Any) -> int:
    """The width of one head as the model's attention splits q and k (``hidden_size // num_attention_heads`` for
    ModernBERT, which never reads a ``head_dim`` field; the field otherwise)."""
    if getattr(config, "model_type", None) in WHOLE_HEAD_ROTARY:
        return config.hidden_size // config.num_attention_heads
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotary_dim(config: Any, layer_type: str | None = None) -> int:
    """d: the dimensions the model's rotation turns, the ``d`` of every scheme's formula (NTK's ``d / (d - 2)``,
    YaRN's ramp) and of the frequencies it builds (d / 2 of them).

    transformers' ModernBERT rotates the whole head whatever ``partial_rotary_factor`` says (its default frequencies
    ignore the factor, ``apply_rotary_pos_emb`` turns every dimension), so there it is the head; elsewhere
    ``head_dim x partial_rotary_factor``, as transformers' rope functions compute it."""
    head = attention_head_dim(config)
    if getattr(config, "model_type", None) in WHOLE_HEAD_ROTARY:
        return head
    return int(head * rope_params(config, layer_type).get("partial_rotary_factor", 1.0))


def _rope_config_head(config: Any) -> int:
    """The head width transformers' rope functions read (``config.head_dim`` when set, else hidden / heads)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def check_rotation(config: Any, model_inv_freq: "dict[str | None, int] | None" = None) -> None:
    """Refuse, in one line, a rotary config the model's own attention cannot apply: one whose rotary module holds
    other than ``rotary_dim / 2`` frequencies (a ``partial_rotary_factor`` under a rope type that honours it, such
    as ``linear`` or ``yarn``, on a model that rotates the whole head; a ``head_dim`` narrower than the attention's
    head). transformers' own model ends in "The size of tensor a (16) must match the size of tensor b (8)" on
    them. ``model_inv_freq``: the frequency count each layer type's module holds (default: computed from the
    config as transformers' module does)."""
    for lt in layer_types(config):
        want = rotary_dim(config, lt)
        have = None if model_inv_freq is None else model_inv_freq.get(lt)
        if have is None:
            p = rope_params(config, lt)
            kind = p.get("rope_type", DEFAULT_ROPE)
            factor = (
                1.0
                if (kind == DEFAULT_ROPE and getattr(config, "model_type", None) in WHOLE_HEAD_ROTARY)
                else p.get("partial_rotary_factor", 1.0)
            )
            have = int(_rope_config_head(config) * factor) // 2
        if 2 * have != want:
            where = f" ({lt})" if lt else ""
            p = rope_params(config, lt)
            raise UserError(
                f"this model's rotary embedding{where} gives {have} frequencies (rope_type "
                f"'{p.get('rope_type', DEFAULT_ROPE)}', partial_rotary_factor {p.get('partial_rotary_factor', 1.0):g},"
                f" head_dim {_rope_config_head(config)}) but its attention rotates {want} dimensions of each head: "
                "transformers cannot run this config; give the whole head's rotary (partial_rotary_factor 1) or "
                "rope_type 'default'"
            )


def model_frequencies(config: Any, layer_type: str | None) -> tuple["torch.Tensor", float]:
    """``(inv_freq, attention_scaling)`` the model's own config gives: what its rotary module was built with."""
    p = rope_params(config, layer_type)
    kind = p.get("rope_type", DEFAULT_ROPE)
    if kind == DEFAULT_ROPE:
        return default_inv_freq(float(p["rope_theta"]), rotary_dim(config, layer_type)), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv, scale = ROPE_INIT_FUNCTIONS[kind](copy.deepcopy(config), None, layer_type=layer_type)
    return inv.float(), float(scale)


def _fit_rotary(config: Any, params: dict, layer_type: str | None) -> dict:
    """``params`` with the ``partial_rotary_factor`` that makes transformers' rope functions (which compute
    ``int(head_dim x factor)``) build frequencies for the dimensions the model rotates (:func:`rotary_dim`): a
    scheme's frequencies must fit the model's rotation, not the factor a whole-head model ignores."""
    head = _rope_config_head(config)
    want = rotary_dim(config, layer_type)
    if int(head * params.get("partial_rotary_factor", 1.0)) == want:
        return params
    return {**params, "partial_rotary_factor": want / head}


# ---- masks and distances: plain functions of the query rows ---------------------------------------------------


def _index(r0: int, r1: int, k_len: int, device=None, cols=None) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Row positions ``[r1 - r0, 1]`` and key positions ``[1, n]``: every key, or only ``cols`` (ascending int64
    key positions, :meth:`Bound.key_span`'s)."""
    import torch

    if not (0 <= r0 <= r1) or k_len < 0:
        raise ValueError(f"rows [{r0}, {r1}) of {k_len} keys")
    j = torch.arange(k_len, device=device) if cols is None else cols.to(device)
    return torch.arange(r0, r1, device=device)[:, None], j[None, :]


def relative_positions(r0: int, r1: int, k_len: int, device=None, cols=None) -> "torch.Tensor":
    """``i - j`` for query rows ``[r0, r1)`` and every key (or the keys ``cols``): the distance RoPE's logit (q at
    i, k at j) depends on."""
    i, j = _index(r0, r1, k_len, device, cols)
    return i - j


def band_mask(r0: int, r1: int, k_len: int, window: int, sinks: int = 0, device=None, cols=None) -> "torch.Tensor":
    """Rows ``[r0, r1)`` of the bidirectional band ``|i - j| <= window``, plus the first ``sinks`` keys for every
    row (bool ``[r1 - r0, k_len]``, True = attend; ``cols``: only those keys' columns). ``sinks = 0``: windowed
    attention; ``sinks > 0``: StreamingLLM's and LM-Infinite's Lambda shape. Sinks are keys every row sees; the
    sink tokens' own rows keep their band."""
    i, j = _index(r0, r1, k_len, device, cols)
    return ((i - j).abs() <= window) | (j < sinks)


def band_span(r0: int, r1: int, k_len: int, window: int, sinks: int = 0) -> tuple[int, int, int]:
    """The keys rows ``[r0, r1)`` of :func:`band_mask` can see, as ``(s, lo, hi)``: the sinks ``[0, s)`` and the
    band's keys ``[lo, hi)``, with ``s <= lo`` (sinks inside the band are counted there)."""
    lo, hi = max(0, min(k_len, r0 - window)), max(0, min(k_len, r1 + window))
    return min(sinks, lo), lo, max(lo, hi)


def capped_distances(r0: int, r1: int, k_len: int, cap: int, device=None, cols=None) -> "torch.Tensor":
    """ReRoPE's and LM-Infinite's distances: ``clip(i - j, -cap, cap)``: true within the cap, the cap beyond it."""
    return relative_positions(r0, r1, k_len, device, cols).clamp(-cap, cap)


def cache_distances(r0: int, r1: int, k_len: int, window: int, sinks: int, device=None, cols=None) -> "torch.Tensor":
    """StreamingLLM's distances (Xiao et al. 2024, Sec. 3.2: positions within the cache, not the text).

    The cache seen from row i holds the sinks and the band ``i - window .. i + window``, in text order; a
    token's position is its rank there. Sink j outside the band is at rank j and the query at
    ``min(sinks, i - window) + window``, so it is seen at distance ``min(i - j, window + sinks - j)``: the true
    one while the band still overlaps the sinks, ``window + sinks - j`` once it has moved past them. Every
    other key keeps its true distance (keys outside band and sinks are masked anyway)."""
    import torch

    i, j = _index(r0, r1, k_len, device, cols)
    rel = i - j
    far_sink = (j < sinks) & (rel.abs() > window)
    return torch.where(far_sink, rel.sign() * torch.minimum(rel.abs(), window + sinks - j), rel)


# ---- rotation and rectified logits ----------------------------------------------------------------------------


def rotate(
    x: "torch.Tensor", positions: "torch.Tensor", inv_freq: "torch.Tensor", scale: float = 1.0
) -> "torch.Tensor":
    """x rotated to ``positions`` the way transformers does it (``rotate_half``, angles ``pos x inv_freq`` in
    float32, cos and sin times ``scale``): ``x [..., n, d]``, ``positions [n]`` (or a 0-d tensor for one position).

    The same arithmetic as ``apply_rotary_pos_emb`` (tests/values/test_position_schemes.py compares them), so a scheme that
    rotates here gives the logits the model's own rotation would."""
    import torch

    d = x.shape[-1]
    if 2 * inv_freq.numel() != d:
        raise ValueError(f"{inv_freq.numel()} frequencies for a head of {d} (partial rotary is not supported)")
    freqs = positions.to(x.device).float()[..., None] * inv_freq.to(device=x.device, dtype=torch.float32)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * scale, emb.sin() * scale
    xf = x.float()
    half = torch.cat((-xf[..., d // 2 :], xf[..., : d // 2]), dim=-1)
    return (xf * cos + half * sin).to(x.dtype)


def rectified_logits(
    q0: "torch.Tensor",
    k0: "torch.Tensor",
    inv_freq: "torch.Tensor",
    distances: "torch.Tensor",
    r0: int,
    scale: float = 1.0,
    allowed: "torch.Tensor | None" = None,
    k_rotated: "torch.Tensor | None" = None,
    shift: int = 0,
    key_positions: "torch.Tensor | None" = None,
) -> "torch.Tensor":
    """Logits of query rows ``[r0, r0 + distances.shape[0])`` at the given relative ``distances`` (float32).

    ``q0`` ``[b, h, L_q, d]`` and ``k0`` ``[b, h, L_k, d]`` are *unrotated*. Where ``distances`` is the true
    ``i - j`` the logit is plain RoPE's, rot(q_i, i) . rot(k_j, j); elsewhere it is rot(q_i, v) . k_j with
    v = ``distances[i, j]`` (q at v, k at 0: the same relative distance). That costs one matmul for the true
    logits and one per distinct capped value, on the columns where it occurs (ReRoPE: 2, +-w; StreamingLLM: one
    per sink), and only where ``allowed`` (the scheme's mask) is True. ``scale``: the attention factor on cos and
    sin (logits x scale^2). ``k_rotated``: rot(k0, j), when the caller has it for all blocks already.

    ``shift``: where row 0 of ``q0`` sits among the keys (a decoder's cached step: ``k_len - q_len``, its rows at
    the end of the keys); ``distances`` are then those of positions ``[shift + r0, ...)`` (what
    :meth:`Bound.capped_positions` gives for them). 0 for a whole pass.

    ``key_positions``: the positions of ``k0``'s keys (ascending int64; ``k0`` and ``k_rotated`` then hold only
    those keys, and ``distances`` only their columns: a band's, :meth:`Bound.key_span`), None: ``0 .. L_k - 1``.

    Grouped K/V (a decoder-only model's: fewer key heads than query heads) are read in place: each key head's
    query heads are folded into its rows for the matmuls (:func:`_grouped_logits`), never repeated in memory.
    """
    import torch

    rows = distances.shape[0]
    qb = q0[:, :, r0 : r0 + rows]
    k_len = k0.shape[-2]
    device = q0.device
    distances = distances.to(device)
    positions = torch.arange(k_len, device=device) if key_positions is None else key_positions.to(device)
    if k_rotated is None:
        k_rotated = rotate(k0, positions, inv_freq, scale)
    p0 = shift + r0
    q_rot = rotate(qb, torch.arange(p0, p0 + rows, device=device), inv_freq, scale)
    out = _grouped_logits(q_rot, k_rotated).float()
    moved = distances != relative_positions(p0, p0 + rows, k_len, device, key_positions)
    if allowed is not None:
        moved &= allowed.to(device)
    if not bool(moved.any()):
        return out
    # the distinct moved distances, largest first, one max per value: a sort of every moved entry
    # (torch.unique) cost more than all the matmuls of a ReRoPE block
    empty = torch.iinfo(distances.dtype).min
    remaining = moved
    while True:
        v = int(torch.where(remaining, distances, empty).amax())
        if v == empty:
            break
        sel = remaining & (distances == v)
        remaining = remaining & ~sel
        cols = sel.any(0).nonzero().squeeze(1)
        qv = rotate(qb, torch.tensor(v, device=device), inv_freq, scale)  # q at v, k at 0 (k0 times scale)
        if 2 * cols.numel() > k_len:  # most columns (ReRoPE: every key past the window): no gather and scatter
            part = _grouped_logits(qv, k0).float()
            if scale != 1.0:
                part.mul_(scale)
            out = torch.where(sel, part, out)
            continue
        part = _grouped_logits(qv, k0[:, :, cols] * scale).float()
        out[..., cols] = torch.where(sel[:, cols], part, out[..., cols])
    return out


def _grouped_logits(q: "torch.Tensor", k: "torch.Tensor") -> "torch.Tensor":
    """``q @ k.T`` per head, ``q [b, h, r, d]`` and ``k [b, h_kv, K, d]`` with ``h`` a multiple of ``h_kv`` (query head
    ``g x h_kv + i`` reads key head ``g``, as transformers' ``repeat_kv`` pairs them): each key head's query heads
    folded into its rows, so grouped keys are read in place, never repeated."""
    b, h, r, d = q.shape
    hk, k_len = k.shape[1], k.shape[-2]
    if hk == h:
        return q @ k.transpose(-1, -2)
    return (q.reshape(b, hk, (h // hk) * r, d) @ k.transpose(-1, -2)).view(b, h, r, k_len)


# ---- the registry ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PositionScheme:
    """One position scheme's registry entry (see the module docstring); :class:`Scheme` is a choice of one.

    ``changes``: which of :data:`FREQUENCIES`, :data:`DISTANCES`, :data:`MASK` it touches.
    ``params``: the parameters it reads; ``defaults(L_tr)`` fills the ones a user leaves out.
    ``rope``: ``(bound, the model's rope params of one layer type, d) -> (rope params, seq_len)``, the
    parameters of a config copy whose transformers rope function gives its frequencies at this input
    (:meth:`Bound.frequencies`); None: it keeps the model's.
    ``mask``/``distances``: ``(bound, r0, r1, k_len, device, cols) -> tensor`` for rows ``[r0, r1)`` (``cols``: only
    those keys' columns, or None: every key); None: none. ``span``: ``(bound, r0, r1, k_len) -> (s, lo, hi)``, the
    only keys the mask lets rows ``[r0, r1)`` see (the sinks ``[0, s)`` and ``[lo, hi)``), or None: any key.
    ``available``: False for schemes that need their own training, with ``reason``.
    ``same_as``: in this encoder, at its defaults, it gives exactly that scheme's numbers (tables show one).
    """

    name: str
    label: str
    short: str
    help: str
    source: str
    changes: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    defaults: Callable[[int], dict] = lambda train_length: {}
    rope: Callable[["Bound", dict, int], tuple[dict, int | None]] | None = None
    mask: Callable[..., "torch.Tensor"] | None = None
    distances: Callable[..., "torch.Tensor"] | None = None
    span: Callable[..., tuple[int, int, int]] | None = None
    available: bool = True
    reason: str = ""
    same_as: str | None = None

    def bind(self, train_length: int, length: int, **values: Any) -> "Bound":
        """This scheme for a model trained at ``train_length`` on an input of ``length`` tokens; ``values``
        override :attr:`defaults` (only names in :attr:`params`). :class:`UserError` for anything unusable."""
        if not self.available:
            raise UserError(f"Position scheme '{self.name}' is not available: {self.reason}")
        if not (isinstance(train_length, int) and train_length >= 2 and isinstance(length, int) and length >= 1):
            raise UserError(f"train_length must be a whole number >= 2 and length >= 1 (got {train_length}, {length})")
        unknown = sorted(set(values) - set(self.params))
        if unknown:
            raise UserError(
                f"Position scheme '{self.name}' takes {', '.join(self.params) or 'no parameters'}; "
                f"not {', '.join(unknown)}"
            )
        given = {k: v for k, v in values.items() if v is not None}
        return Bound(self, train_length, length, **{**self.defaults(train_length), **given})


@dataclass(frozen=True)
class Bound:
    """A scheme with its parameters fixed for one model (L_tr) and one input length L: what a pass applies.

    ``factor``: s for PI / NTK / YaRN (None: fitted to the input, :func:`fitted_factor`), f for dynamic NTK.
    ``window``: the band ``|i - j| <= window`` (masks) or ReRoPE's cap. ``sinks``: keys every row sees.
    ``cap``: LM-Infinite's distance cap. ``attention_factor``: YaRN's cos/sin factor (None: 0.1 ln s + 1).
    """

    scheme: PositionScheme
    train_length: int
    length: int
    factor: float | None = None
    window: int | None = None
    sinks: int = 0
    cap: int | None = None
    attention_factor: float | None = None
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __repr__(self) -> str:
        keys = ("factor", "window", "sinks", "cap", "attention_factor")
        set_ = ", ".join(f"{k}={getattr(self, k)!r}" for k in keys if k in self.scheme.params)
        return f"Bound({self.name!r}, L_tr={self.train_length}, L={self.length}{', ' + set_ if set_ else ''})"

    def __post_init__(self) -> None:
        name = self.scheme.name
        if self.factor is not None and not (math.isfinite(self.factor) and self.factor >= 1):
            raise UserError(f"{name}: factor must be a number >= 1 (got {self.factor})")
        for key in ("window", "sinks", "cap"):
            v = getattr(self, key)
            if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                raise UserError(f"{name}: {key} must be a whole number >= 0 (got {v!r})")
        if self.cap is not None and self.cap < 1:
            raise UserError(f"{name}: cap must be at least 1")
        a = self.attention_factor
        if a is not None and not (math.isfinite(a) and a > 0):
            raise UserError(f"{name}: attention_factor must be a positive number")

    @property
    def name(self) -> str:
        return self.scheme.name

    @property
    def scale(self) -> float:
        """s: the given factor, else L / L_tr (at least 1)."""
        return self.factor if self.factor is not None else fitted_factor(self.train_length, self.length)

    @property
    def rectified(self) -> bool:
        """Whether some logit is computed at a distance other than the true one (needs unrotated q and k)."""
        return DISTANCES in self.scheme.changes

    # -- frequencies --
    def rope_parameters(self, config: Any, layer_type: str | None) -> tuple[dict, int | None]:
        """``(rope params, seq_len)`` of one layer type for :func:`configured` and transformers' function."""
        base = rope_params(config, layer_type)
        if self.scheme.rope is None:
            return base, None
        return self.scheme.rope(self, base, rotary_dim(config, layer_type))

    def frequencies(self, config: Any, layer_type: str | None) -> tuple["torch.Tensor", float]:
        """``(inv_freq, attention factor)`` this scheme gives one layer type of ``config`` at this input:
        transformers' own rope function on :func:`configured`'s copy (the plain formula for ``default``)."""
        key = (id(config), layer_type)
        if key not in self._cache:
            if self.scheme.rope is None:
                self._cache[key] = model_frequencies(config, layer_type)
            else:
                params, seq_len = self.rope_parameters(config, layer_type)
                cfg = configured(config, self)
                kind = params.get("rope_type", DEFAULT_ROPE)
                if kind == DEFAULT_ROPE:
                    out = default_inv_freq(float(params["rope_theta"]), rotary_dim(cfg, layer_type)), 1.0
                else:
                    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

                    inv, a = ROPE_INIT_FUNCTIONS[kind](cfg, None, seq_len=seq_len, layer_type=layer_type)
                    out = inv.float(), float(a)
                self._cache[key] = out
        return self._cache[key]

    def model_rotation(self, config: Any, layer_type: str | None) -> tuple["torch.Tensor", float] | None:
        """What the model's rotary module should use during the pass: the scheme's frequencies, zeros (no
        rotation: the attention function rotates, :func:`rectified_logits`) for a rectified scheme, or None
        (leave it) when the scheme keeps the model's frequencies."""
        if self.rectified:
            inv, _ = model_frequencies(config, layer_type)
            return inv.new_zeros(inv.shape), 1.0
        if FREQUENCIES in self.scheme.changes:
            return self.frequencies(config, layer_type)
        return None

    def is_identity(self, config: Any) -> bool:
        """Whether this scheme at this input changes nothing of ``config``'s attention: no mask, no capped
        distances, and for every layer type the very frequencies (bit for bit) and an attention factor of 1.

        Why: at or below L_tr, YaRN, PI, NTK and dynamic NTK fitted to the input are the model's own rotary
        (factor 1); a table of methods at 1x L_tr need not run the same pass once per name (a sweep's or
        perplexity's cells then share it). A mask or distance scheme is never called the identity here, even
        where its window covers the input: it computes the logits another way."""
        if self.scheme.mask is not None or self.scheme.distances is not None or self.rectified:
            return False
        if FREQUENCIES not in self.scheme.changes:
            return True
        import torch

        for lt in layer_types(config):
            inv, factor = self.frequencies(config, lt)
            inv0, _ = model_frequencies(config, lt)
            if factor != 1.0 or inv.shape != inv0.shape or not torch.equal(inv.float(), inv0.float()):
                return False
        return True

    # -- masks and distances --
    def mask_rows(self, r0: int, r1: int, k_len: int, device=None, cols=None) -> "torch.Tensor | None":
        """The scheme's mask for query rows ``[r0, r1)`` (bool ``[r1 - r0, k_len]``, True = attend; ``cols``: only
        those keys' columns), or None."""
        return None if self.scheme.mask is None else self.scheme.mask(self, r0, r1, k_len, device, cols)

    def key_span(self, r0: int, r1: int, k_len: int) -> tuple[int, int, int] | None:
        """``(s, lo, hi)``: rows ``[r0, r1)`` see only the keys ``[0, s)`` and ``[lo, hi)`` (a band's and its
        sinks), or None: any key may be seen.

        Why: a band's rows need only its columns. Computed over every key, a StreamingLLM pass of a decoder was
        12x its plain pass (4,096 tokens, a window of 251); over the band's keys it costs what the band holds."""
        return None if self.scheme.span is None else self.scheme.span(self, r0, r1, k_len)

    def mask(self, q_len: int, k_len: int, device=None) -> "torch.Tensor | None":
        """The whole mask ``[q_len, k_len]``: for small inputs and drawings only (a pass uses :meth:`mask_rows`)."""
        return self.mask_rows(0, q_len, k_len, device)

    def capped_positions(self, r0: int, r1: int, k_len: int, device=None, cols=None) -> "torch.Tensor | None":
        """Relative distances ``[r1 - r0, k_len]`` the logits of rows ``[r0, r1)`` use (``cols``: only those keys'
        columns), or None: the true ones."""
        return None if self.scheme.distances is None else self.scheme.distances(self, r0, r1, k_len, device, cols)


def configured(config: Any, bound: Bound) -> Any:
    """A deep copy of ``config`` whose ``rope_parameters`` are the scheme's for every layer type (and, for dynamic
    NTK, ``max_position_embeddings = L_tr``, the length transformers' formula divides by). The model's own config
    is never touched; a model built from this copy has the scheme's frequencies (for a fixed factor). Each layer
    type's ``partial_rotary_factor`` is the one that gives the dimensions the model rotates (:func:`rotary_dim`), so a
    whole-head model whose config names a smaller factor gets frequencies for its whole head (issue 47, point 3)."""
    cfg = copy.deepcopy(config)
    types = layer_types(config)
    new = {lt: _fit_rotary(config, bound.rope_parameters(config, lt)[0], lt) for lt in types}
    cfg.rope_parameters = new[None] if types == [None] else {**cfg.rope_parameters, **new}
    if any(p.get("rope_type") == DYNAMIC_ROPE for p in new.values()):
        cfg.max_position_embeddings = bound.train_length
    return cfg


def _pi(b: Bound, base: dict, dim: int) -> tuple[dict, int | None]:
    return {**base, "rope_type": LINEAR_ROPE, "factor": b.scale}, None


def _ntk(b: Bound, base: dict, dim: int) -> tuple[dict, int | None]:
    return {**base, "rope_type": DEFAULT_ROPE, "rope_theta": ntk_theta(float(base["rope_theta"]), dim, b.scale)}, None


def _dynamic(b: Bound, base: dict, dim: int) -> tuple[dict, int | None]:
    return ({**base, "rope_type": DYNAMIC_ROPE, "factor": float(b.factor or 1.0)}, b.length)


def _yarn(b: Bound, base: dict, dim: int) -> tuple[dict, int | None]:
    params = {
        **base,
        "rope_type": YARN_ROPE,
        "factor": b.scale,
        "original_max_position_embeddings": b.train_length,
        "beta_fast": BETA_FAST,
        "beta_slow": BETA_SLOW,
    }
    if b.attention_factor is not None:
        params["attention_factor"] = b.attention_factor
    return params, None


def _band(b: Bound, r0: int, r1: int, k_len: int, device=None, cols=None) -> "torch.Tensor":
    return band_mask(r0, r1, k_len, b.window, b.sinks, device, cols)


def _band_span(b: Bound, r0: int, r1: int, k_len: int) -> tuple[int, int, int]:
    return band_span(r0, r1, k_len, b.window, b.sinks)


REGISTRY: dict[str, PositionScheme] = {
    s.name: s
    for s in (
        PositionScheme(
            "none",
            "plain RoPE",
            "RoPE",
            "The model as trained: every position rotated by its index, whatever the length.",
            "Su et al. (2021), RoFormer",
        ),
        PositionScheme(
            "pi",
            "position interpolation (PI)",
            "PI",
            "Positions scaled by L_tr / L (angles divided by s = L / L_tr), so every position falls inside the "
            "trained range; distances shrink by s.",
            "Chen et al. (2023), arXiv:2306.15595; transformers' rope_type 'linear'",
            changes=(FREQUENCIES,),
            params=("factor",),
            rope=_pi,
        ),
        PositionScheme(
            "ntk",
            "NTK-aware scaling",
            "NTK",
            "Base theta x s^(d/(d-2)): high frequencies almost unchanged (extrapolated), the lowest divided by s "
            "(interpolated).",
            "bloc97 (2023), 'NTK-Aware Scaled RoPE'; plain RoPE with a larger rope_theta in transformers",
            changes=(FREQUENCIES,),
            params=("factor",),
            rope=_ntk,
        ),
        PositionScheme(
            "dynamic-ntk",
            "dynamic NTK",
            "dyn. NTK",
            "NTK-aware with the base recomputed from the input's length: theta x (f L / L_tr - (f - 1))^(d/(d-2)). "
            "With f = 1 in this encoder it equals NTK fitted to the input.",
            "emozilla (2023); transformers' rope_type 'dynamic'",
            changes=(FREQUENCIES,),
            params=("factor",),
            rope=_dynamic,
            same_as="ntk",
        ),
        PositionScheme(
            "yarn-rope",
            "YaRN frequencies",
            "YaRN RoPE",
            f"NTK-by-parts: a ramp over dimensions between extrapolation (turning more than beta_fast = "
            f"{BETA_FAST:g} times over L_tr) and interpolation by s (under beta_slow = {BETA_SLOW:g}), plus YaRN's "
            "attention factor 0.1 ln s + 1 on cos and sin (logits x its square). The temperature method of the "
            "same paper is the factor alone: set attention_factor=1 to combine the two without counting it twice.",
            "Peng et al. (2023), arXiv:2309.00071; transformers' YaRN rope_type",
            changes=(FREQUENCIES,),
            params=("factor", "attention_factor"),
            rope=_yarn,
        ),
        PositionScheme(
            "rerope",
            "ReRoPE (distances capped at w)",
            "ReRoPE",
            "Logits within the window use the true relative position; beyond it, the window's: "
            "distance clip(i - j, -w, w). Needs two sets of logits (true and capped) from unrotated q and k.",
            "Su (2023), github.com/bojone/rerope (causal; here capped on both sides)",
            changes=(DISTANCES,),
            params=("window",),
            defaults=lambda lt: {"window": lt // 2},
            distances=lambda b, r0, r1, k, dev=None, cols=None: capped_distances(r0, r1, k, b.window, dev, cols),
        ),
        PositionScheme(
            "window",
            "windowed attention",
            "window",
            "Each token attends only to keys within |i - j| <= w (default L_tr - 1: every distance seen in "
            "training and none other).",
            "Su (2023); the paper's 'Windowed Attention' (window = L_tr)",
            changes=(MASK,),
            params=("window",),
            defaults=lambda lt: {"window": lt - 1},
            mask=_band,
            span=_band_span,
        ),
        PositionScheme(
            "streaming-llm",
            "StreamingLLM (sinks + window)",
            "StreamingLLM",
            "The first k tokens (attention sinks, k = 4) are visible to every row, plus the band |i - j| <= w; "
            "positions as in its cache: a sink beyond the band is seen at distance w + k - j (default "
            "w = L_tr - 1 - k, so no distance exceeds L_tr - 1).",
            "Xiao et al. (2024), ICLR, arXiv:2309.17453",
            changes=(MASK, DISTANCES),
            params=("window", "sinks"),
            defaults=lambda lt: {"sinks": 4, "window": max(0, lt - 1 - 4)},
            mask=_band,
            span=_band_span,
            distances=lambda b, r0, r1, k, dev=None, cols=None: cache_distances(
                r0, r1, k, b.window, b.sinks, dev, cols
            ),
        ),
        PositionScheme(
            "lm-infinite",
            "LM-Infinite (Lambda mask + distance cap)",
            "LM-Infinite",
            "A Lambda-shaped mask (the first k = 5 tokens and the band |i - j| <= w) and every distance capped at "
            "L_tr - 1 (clip(i - j, -cap, cap)), so the sinks are seen at the largest distance trained.",
            "Han et al. (2024), NAACL, arXiv:2308.16137",
            changes=(MASK, DISTANCES),
            params=("window", "sinks", "cap"),
            defaults=lambda lt: {"sinks": 5, "window": lt - 1, "cap": lt - 1},
            mask=_band,
            span=_band_span,
            distances=lambda b, r0, r1, k, dev=None, cols=None: capped_distances(r0, r1, k, b.cap, dev, cols),
        ),
        PositionScheme(
            "alibi",
            "ALiBi",
            "ALiBi",
            "Linear distance biases instead of rotations.",
            "Press et al. (2022), ICLR",
            available=False,
            reason="it replaces RoPE with linear biases, so it needs a model trained with ALiBi (the paper trained "
            "one); a RoPE model cannot switch to it at inference",
        ),
        PositionScheme(
            "pose",
            "PoSE",
            "PoSE",
            "Positional skip-wise training: short windows with position ids skipped to cover a long range.",
            "Zhu et al. (2024), ICLR, arXiv:2309.10400",
            available=False,
            reason="it is a training recipe (position ids skipped during fine-tuning), not an inference-time change; "
            "it needs a model fine-tuned with it",
        ),
    )
}

#: Every scheme a user can name, in the order menus show them (unavailable ones included, marked).
NAMES: tuple[str, ...] = tuple(REGISTRY)
#: The schemes a pass can apply.
AVAILABLE: tuple[str, ...] = tuple(n for n, s in REGISTRY.items() if s.available)
#: The model as trained.
PLAIN: str = next(n for n, s in REGISTRY.items() if s.available and not s.changes)


def get(name: str) -> PositionScheme:
    """The registry entry, or a :class:`UserError` listing the names (an unavailable one is returned: ask it)."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise UserError(f"Unknown position scheme {errors.shown(name)}; choose from {', '.join(AVAILABLE)}") from None


#: Between a scheme's name and its parameters in one text (``lm-infinite:window=32:sinks=2``), and between those.
SPEC_SEP = ":"
#: Parameters that count positions: whole numbers, at most :data:`MAX_POSITIONS` (no input is longer).
INT_PARAMS: tuple[str, ...] = ("window", "sinks", "cap")
#: The largest window, sink count or cap a scheme takes: the longest input anything accepts
#: (:data:`core.values.validation.MAX_LENGTH`); a larger one could change nothing.
MAX_POSITIONS = 4_000_000
#: The largest factor (PI, NTK, YaRN) or attention factor: beyond it every frequency rounds to 0 in float32.
MAX_FACTOR = 1e6
#: Digits of a whole number past which a scheme's text is refused before it is read: more than any bound here has
#: (and Python's int() refuses a text of over 4,300).
_MAX_DIGITS = 40


def _param(name: str, key: str, value: Any, text: bool = False) -> int | float:
    """One parameter's value checked and typed: a position count (:data:`INT_PARAMS`) is an int, whether it came
    as ``32``, ``"32"``, ``1e6`` or ``"1e6"`` (a whole number written as a float); any other parameter is a float,
    kept exactly as given (a text goes through ``float``, which reads back what :meth:`Scheme.spell` wrote).
    Never a bool (JSON ``true`` is not 1), NaN or infinity; bounds stated. :class:`UserError` in one line.
    ``text``: the value was written in a scheme's text (``window:window=32``); elsewhere (a JSON file) a string is
    not a number."""
    shown = errors.shown(value) if isinstance(value, int) and not isinstance(value, bool) else str(value)[:40]
    bound = (
        f"a whole number from 0 to {MAX_POSITIONS:,}"
        if key in INT_PARAMS
        else f"a number above 0 and at most {MAX_FACTOR:,.0f}"
    )
    if isinstance(value, str) and text:
        digits = value.strip().lstrip("+-")
        if digits.isdigit() and len(digits.lstrip("0")) > _MAX_DIGITS:  # past every bound (int() refuses >4,300)
            sign = "negative " if value.strip().startswith("-") else ""
            raise UserError(
                f"{name}: {key} must be {bound} (got a {sign}{len(digits.lstrip('0')):,}-digit number"
                f"{'' if sign else ', too large'})"
            )
        try:
            value = (
                float(value.strip())
                if key not in INT_PARAMS or not value.strip().lstrip("+-").isdigit()
                else int(value.strip())
            )
        except ValueError:
            kind = "a whole number" if key in INT_PARAMS else "a number"
            raise UserError(f"{name}: {key} must be {kind} (got '{shown}')") from None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not math.isfinite(value))
    ):
        raise UserError(f"{name}: {key} must be a finite number (got {shown!r})")
    if key in INT_PARAMS:
        if isinstance(value, float):
            if not value.is_integer():
                raise UserError(f"{name}: {key} must be a whole number (got {shown})")
            value = int(value)
        if not 0 <= value <= MAX_POSITIONS:
            raise UserError(f"{name}: {key} must be {bound} (got {shown})")
        return int(value)
    if not 0 < value <= MAX_FACTOR:  # an int of 400 digits too: compared, never turned into a float first
        raise UserError(f"{name}: {key} must be {bound} (got {shown})")
    return float(value)


@dataclass(frozen=True)
class Scheme:
    """A position scheme as chosen: a registry entry's name and the parameters given (the rest: the entry's defaults
    for the model's L_tr, filled in by :meth:`bind`).

    The one value that carries a scheme from each edge to the attention: build it with :meth:`of` (the one parser
    and validator: a text, a dict, a ``(name, params)`` pair, None for the model as trained), write it with
    :meth:`spell` (``window:window=32``, read back by :meth:`of`) or :meth:`to_json`, bind it per pass with
    :meth:`bind`. Frozen and hashable, so it is a cache key as it is. ``params`` keeps the entry's own order.
    """

    name: str = PLAIN
    params: tuple[tuple[str, int | float], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not isinstance(self.params, tuple):
            raise TypeError("Scheme(name, params) holds a name and a tuple of (key, value): build it with Scheme.of")

    @classmethod
    def of(cls, value: Any = None, params: Any = None) -> "Scheme":
        """The scheme ``value`` describes, checked once, or a :class:`UserError` in one line.

        ``value``: a :class:`Scheme` (returned as it is), None (the plain scheme), a text (``window``,
        ``yarn-rope:attention_factor=1``, ``lm-infinite:window=32:sinks=2``), a dict ``{"name": ..., "params":
        {...}}``, or a name with ``params`` (a dict or pairs). Refused: unknown or unavailable names, parameters the
        scheme does not take or given twice, values that are not finite numbers or out of bounds (whole numbers
        for positions), and values the scheme's own rules refuse (checked by binding at a nominal L_tr: the rules
        do not depend on it)."""
        if isinstance(value, Scheme) and params is None:
            return value
        if value is None and params is None:
            return PLAIN_SCHEME
        given: list[tuple[str, Any]]
        if isinstance(value, dict) and params is None:
            unknown = sorted(set(value) - {"name", "params"})
            if unknown or "name" not in value:
                raise UserError(
                    'a position scheme as JSON is {"name": ..., "params": {...}}; got keys '
                    f"{', '.join(map(str, value))[:60]}"
                )
            value, params = value["name"], value.get("params")
        if not isinstance(value, str):
            raise UserError(
                f"a position scheme is a name like '{PLAIN}' or 'window:window=32', got {type(value).__name__}"
            )
        name, *items = value.strip().split(SPEC_SEP)
        entry = get(name)
        if not entry.available:
            raise UserError(f"Position scheme '{name}' is not available: {entry.reason}")
        given = []
        for item in items:
            key, eq, raw = item.partition("=")
            key = key.strip()
            if not eq or key not in entry.params:
                takes = ", ".join(entry.params) or "no parameters"
                raise UserError(
                    f"Position scheme '{name}' takes {takes}; got '{item[:40]}' (write {name}{SPEC_SEP}key=value)"
                )
            given.append((key, _param(name, key, raw, text=True)))
        if params is not None:
            pairs = params.items() if isinstance(params, dict) else params
            try:
                given += [(str(k), v) for k, v in pairs]
            except (TypeError, ValueError):
                raise UserError(f"{name}: its parameters are key=value pairs") from None
        keys = [k for k, _ in given]
        unknown = [k for k in keys if k not in entry.params]
        if unknown:
            raise UserError(
                f"Position scheme '{name}' takes {', '.join(entry.params) or 'no parameters'}; "
                f"not {', '.join(unknown)[:60]}"
            )
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise UserError(f"{name}: {', '.join(twice)} given twice; give each parameter once")
        values = {k: _param(name, k, v) for k, v in given}  # a text's values were read already: unchanged
        scheme = cls(name, tuple((k, values[k]) for k in entry.params if k in values))
        scheme.bind(NOMINAL_TRAIN_LENGTH, NOMINAL_TRAIN_LENGTH)  # the scheme's own rules (factor >= 1, ...)
        return scheme

    @property
    def entry(self) -> PositionScheme:
        """The registry entry (label, help, what it changes)."""
        return REGISTRY[self.name]

    @property
    def is_plain(self) -> bool:
        """The model as trained: the plain scheme with no parameters."""
        return self.name == PLAIN and not self.params

    @property
    def param_dict(self) -> dict[str, int | float]:
        return dict(self.params)

    def spell(self) -> str:
        """The one text of this scheme (:meth:`of` reads it back exactly): ``window:window=32``, ``pi:factor=2``,
        ``pi:factor=1.23456789``; whole values without a decimal point, others as Python writes them (exact)."""
        return SPEC_SEP.join([self.name, *self._items()])

    def params_text(self) -> str:
        """The parameters alone (``window=32:sinks=2``), "" for none: a CSV row's ``scheme_params``."""
        return SPEC_SEP.join(self._items())

    def _items(self) -> list[str]:
        return [f"{k}={int(v) if float(v).is_integer() and abs(v) < 2**53 else repr(v)}" for k, v in self.params]

    def to_json(self) -> dict:
        """``{"name": ..., "params": {...}}`` (:meth:`of` reads it back)."""
        return {"name": self.name, "params": dict(self.params)}

    def bind(self, train_length: int, length: int) -> "Bound":
        """This scheme for a model trained at ``train_length`` on an input of ``length`` tokens (see
        :meth:`PositionScheme.bind`)."""
        return self.entry.bind(train_length, length, **dict(self.params))

    def __str__(self) -> str:
        return self.spell()


#: the L_tr a scheme's values are checked at by :meth:`Scheme.of` (their rules do not depend on it)
NOMINAL_TRAIN_LENGTH = 64
#: The model as trained.
PLAIN_SCHEME = Scheme()


# ---- the scheme's rotation, per call ---------------------------------------------------------------------------


def rotary_modules(model: Any) -> list[Any]:
    """The model's rotary embedding modules (transformers' ``*RotaryEmbedding``, holding ``*inv_freq`` buffers)."""
    return [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding") and hasattr(m, "rope_type")]


def rotary_frequency_counts(model: Any) -> dict[str | None, int]:
    """How many frequencies each layer type's rotary module of ``model`` holds (its ``*inv_freq`` buffers): what
    :func:`check_rotation` compares with the dimensions the attention rotates."""
    config = model.config
    held: dict[str | None, int] = {}
    for module in rotary_modules(model):
        for lt in layer_types(config):
            buf = getattr(module, "inv_freq" if lt is None else f"{lt}_inv_freq", None)
            if buf is not None:
                held[lt] = int(buf.numel())
    return held
