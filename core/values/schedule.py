"""One tau schedule, validated once where it enters and carried unchanged to the attention.

A temperature method yields a *schedule*: the tau that divides the logits of
each encoder layer and head (or, for Llama 4's scheme, of each query row).
It enters the program at the edges (a settings file, a CLI option, a URL, the
app's slider, a method's resolve, a ``core.runs.apply`` argument); each of them
calls :meth:`Schedule.of`, which refuses a bad value in one line (wrong type,
wrong shape, not finite, outside :data:`TAU_MIN` .. :data:`TAU_MAX`), and from
there the same object travels through settings, the engine and the attention
without being looked at again. Its ``[layers, heads]`` matrix is computed once
per model shape and kept (:meth:`Schedule.matrix`); the attention reads one
layer's row (:meth:`Schedule.heads`) or the rows' taus (:meth:`Schedule.row_taus`).

Four shapes, the ones the papers and their extensions need, and one kind whose taus exist only inside a pass:

* one number: every layer and head (the paper's tau);
* one number per layer (per-layer Algorithm 1);
* one number per layer and head (per-head Algorithm 1);
* one number per query row, a function of the row's position
  (:class:`RowTau`: Llama 4's temperature tuning, Qwen's log-n by query position);
* :data:`ADAPTIVE`: adaptive temperature (Velickovic et al. 2024), a tau per query row that is a function of the
  row's own logits (1 / beta(H), H the row's tau = 1 entropy), so the attention computes it
  (:func:`core.mechanics.softmax_block.adaptive_rows`). Its JSON form is ``{"scheme": "adaptive"}``.

Why adaptive temperature is a schedule and not a flag beside one: what reaches the attention is the run's
:class:`~core.values.choice.Choice`, whose tau is this one value; caches of passes are keyed by it (not by the
method's name: a fixed 0.5 and a method that resolved to 0.5 are one pass), and a reference pass is the same
choice with ``tau`` replaced by :data:`ONE`. As a schedule, an adaptive pass has its own key everywhere a pass is
keyed, and a reference pass drops it by construction. Before a pass it holds the base tau 1 (what
:meth:`Schedule.matrix`, :meth:`Schedule.heads`, :meth:`Schedule.mean` and a result's tau report; each row's beta
multiplies that row's logits inside the pass); it is not one number (:attr:`Schedule.scalar` is None: no view
may take it for tau = 1) and not the model as trained (:attr:`Schedule.is_one` is False).

Why a value object rather than ``float | list``: five containers used to
repeat ``{tau, ...}`` and five places validated it, each a little
differently; a schedule that passed one check could fail another deep in a
pass. Now there is one check, and its bounds are stated here.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The smallest tau any schedule may hold. Below it nothing visible changes
#: (logits that differ by 0.01 already differ by 10 after the division, so the
#: softmax is one-hot to float32's precision), while a tau that rounds to 0 in
#: float32 (1e-46) would divide by zero: a bound, stated, rather than an error
#: deep in a pass.
TAU_MIN = 1e-3
#: The largest tau: above it every row is uniform to float32's precision.
TAU_MAX = 1e3

#: A row schedule's ``floor_scale`` is a length in tokens: at most the longest input anything accepts.
MAX_FLOOR_SCALE = 4_000_000
#: Llama 4 ships 0.1. Ten times past L_tr ... 4M tokens this keeps every row's tau above 0.006 (a huge value
#: would divide the logits by ~0 and overflow: refused here, in one line, before any pass).
MAX_ATTN_SCALE = 10.0
#: The row schemes :class:`RowTau` knows: Llama 4's attention temperature tuning and Qwen's log-n by query position.
LLAMA4, QWEN_LOGN = "llama4", "qwen-logn"
ROW_SCHEMES: tuple[str, ...] = (LLAMA4, QWEN_LOGN)
#: The scheme name of :data:`ADAPTIVE` in JSON (``{"scheme": "adaptive"}``).
ADAPTIVE_SCHEME = "adaptive"
#: Adaptive temperature's polynomial in a row's entropy H (Velickovic et al. 2024, "softmax is not enough (for
#: sharp out-of-distribution)", arXiv 2410.01104, its Figure 5 fit), highest power first: beta = poly(H),
#: where H is the row's entropy at tau = 1; the attention applies it (:func:`core.mechanics.softmax_block.adaptive_rows`).
ADAPTIVE_POLY: tuple[float, ...] = (-0.037, 0.481, -2.3, 4.917, -1.791)
#: Rows whose entropy (nats) is at or below this keep beta = 1 (the paper: "don't overcorrect low-entropy heads").
ADAPTIVE_MIN_ENTROPY = 0.5


@dataclass(frozen=True)
class RowTau:
    """A tau per query row, a function of the row's 0-based position: Llama 4's attention temperature tuning.

    Why a schedule of its own: every other method gives one tau per layer (or
    head) for all rows; Llama 4 (transformers' ``attn_temperature_tuning``)
    multiplies the query at position p by ``log1p(floor((p + 1) / floor_scale))
    * attn_scale + 1`` (transformers' ``Llama4TextAttention``), so row p's tau
    is its inverse and rows before ``floor_scale - 1`` keep tau = 1. With
    ``floor_scale`` = L_tr it sharpens only the rows past the training length.
    In a causal decoder row p sees p + 1 keys, so a scale growing with p tracks
    the number of keys; in a bidirectional encoder every row sees all L keys,
    so the early rows of a long input stay as dispersed as with tau = 1 (the
    scheme is a decoder's idea; docs/library.md says what that means here).
    Here the row's tau divides the whole logit row (q.k + bias), as every tau
    in this module does.

    ``scheme="qwen-logn"``: Qwen's ``use_logn_attn`` (Qwen-7B's
    ``QWenAttention``: ``logn_list = [math.log(i, seq_length) if i >
    seq_length else 1 for i in range(1, 32768)]``, the query at position p
    multiplied by entry p), with ``floor_scale`` = its ``seq_length`` (here
    L_tr): row p's tau is ``1 / log_{L_tr}(p + 1)`` once ``p + 1 > L_tr``, 1
    before. It has no ``attn_scale`` (it must stay at the default and is not
    written out). Qwen scales the query only (q.k); here the tau divides q.k
    + bias, as for every schedule.
    """

    floor_scale: int
    attn_scale: float = 0.1
    scheme: str = "llama4"

    def __post_init__(self) -> None:
        if self.scheme not in ROW_SCHEMES:
            raise ValueError(f"unknown row scheme {_short(self.scheme)}; the known ones are {', '.join(ROW_SCHEMES)}")
        if self.scheme == QWEN_LOGN and self.attn_scale != 0.1:
            raise ValueError(f"the {QWEN_LOGN} row scheme has no attn_scale (got {_short(self.attn_scale)})")
        if self.scheme == QWEN_LOGN and self.floor_scale == 1:
            raise ValueError(f"the {QWEN_LOGN} row scheme's floor_scale is a log base: at least 2")
        if (
            isinstance(self.floor_scale, bool)
            or not isinstance(self.floor_scale, numbers.Integral)
            or not 1 <= self.floor_scale <= MAX_FLOOR_SCALE
        ):
            raise ValueError(
                f"floor_scale must be a whole number in 1 .. {MAX_FLOOR_SCALE:,}, got {_short(self.floor_scale)}"
            )
        if (
            isinstance(self.attn_scale, bool)
            or not isinstance(self.attn_scale, numbers.Real)
            or not (math.isfinite(self.attn_scale) and 0 <= self.attn_scale <= MAX_ATTN_SCALE)
        ):
            raise ValueError(f"attn_scale must be a number in 0 .. {MAX_ATTN_SCALE:g}, got {_short(self.attn_scale)}")

    def taus(self, positions: np.ndarray) -> np.ndarray:
        """float64 tau of each query row at these 0-based positions (the inverse of the scheme's query factor)."""
        p = np.asarray(positions, dtype=np.float64)
        if self.scheme == QWEN_LOGN:
            n = p + 1
            return np.where(n > self.floor_scale, np.log(self.floor_scale) / np.log(np.maximum(n, 2.0)), 1.0)
        return 1.0 / (np.log1p(np.floor((p + 1) / self.floor_scale)) * self.attn_scale + 1.0)

    def mean(self, rows: int) -> float:
        """The mean tau over the rows of an input of ``rows`` tokens (what one number can say of it)."""
        return float(self.taus(np.arange(max(1, int(rows)))).mean())

    def to_dict(self) -> dict:
        if self.scheme == QWEN_LOGN:
            return {"scheme": self.scheme, "floor_scale": int(self.floor_scale)}
        return {"scheme": self.scheme, "floor_scale": int(self.floor_scale), "attn_scale": float(self.attn_scale)}

    @classmethod
    def from_dict(cls, d: dict) -> "RowTau":
        extra = set(d) - {"scheme", "floor_scale", "attn_scale"}
        if extra:
            raise ValueError(f"a row schedule has keys scheme, floor_scale, attn_scale; got also {sorted(extra)}")
        return cls(
            floor_scale=d.get("floor_scale"), attn_scale=d.get("attn_scale", 0.1), scheme=d.get("scheme", "llama4")
        )


_WHY = (
    f"tau must be a number in [{TAU_MIN:g}, {TAU_MAX:g}], a list of them (one per layer) "
    "or a list of lists (layer x head)"
)


def _short(value: Any, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _leaves(value: Any) -> np.ndarray:
    """``value`` as a float64 array of 0, 1 or 2 dimensions, or ValueError saying what is wrong.

    Leaves must be real numbers: ``torch.as_tensor`` would take ``True`` as 1.0
    (a silent wrong answer) and a string would fail deep in torch.
    """
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, without importing torch here
        if value.is_meta:
            raise ValueError(f"{_WHY}, got a tensor on the meta device (it holds no values)")
        if value.dtype.is_complex or str(value.dtype) == "torch.bool":
            raise ValueError(f"{_WHY}, got a tensor of {value.dtype}")
        value = value.detach().cpu().double().numpy()
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iuf":
            raise ValueError(f"{_WHY}, got an array of {value.dtype}")
        arr = value.astype(np.float64)
    elif isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{_WHY}, got an empty list")
        if all(isinstance(row, (list, tuple, np.ndarray)) for row in value):
            rows = [_leaves(row) for row in value]
            if any(r.ndim != 1 for r in rows):
                raise ValueError(f"{_WHY}; a list of lists is layer x head, nothing deeper")
            if len({r.shape[0] for r in rows}) != 1:
                raise ValueError("a per-head tau needs one non-empty row of equal length per layer")
            arr = np.stack(rows)
        else:
            arr = np.array([_number(x) for x in value], dtype=np.float64)
    else:
        arr = np.array(_number(value), dtype=np.float64)
    if arr.ndim > 2:
        raise ValueError(f"{_WHY}; got {arr.ndim} dimensions")
    if arr.size == 0:
        raise ValueError(f"{_WHY}, got an empty list")
    return arr


def _number(x: Any) -> float:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise ValueError(f"{_WHY}, got {type(x).__name__} {_short(x)}")
    try:
        return float(x)
    except OverflowError:  # an int of 400 digits
        raise ValueError(f"{_WHY}, got {_short(x)}") from None


class Schedule:
    """An immutable tau schedule (see the module docstring); build it with :meth:`of`."""

    __slots__ = ("_values", "_rows", "_adaptive", "_matrices")

    def __init__(self, values: np.ndarray | None, rows: RowTau | None, adaptive: bool = False) -> None:
        self._values = values
        self._rows = rows
        self._adaptive = adaptive
        self._matrices: dict[tuple, np.ndarray] = {}

    # -- entering ----------------------------------------------------------------------------

    @classmethod
    def of(cls, value: Any) -> "Schedule":
        """The schedule ``value`` describes, or ValueError (one line) saying why it is not one.

        Accepts a :class:`Schedule` (returned as it is: validated once), a
        number, a list per layer, a list of lists per layer and head (lists,
        tuples, numpy arrays, torch tensors), a :class:`RowTau` or its JSON
        dict (``{"scheme": "llama4", "floor_scale": ..., "attn_scale": ...}``),
        or adaptive temperature's ``{"scheme": "adaptive"}`` (:data:`ADAPTIVE`).
        """
        if isinstance(value, Schedule):
            return value
        if isinstance(value, RowTau):
            return cls(None, value)
        if isinstance(value, dict) and value.get("scheme") == ADAPTIVE_SCHEME:
            if set(value) != {"scheme"}:
                raise ValueError(
                    f"the {ADAPTIVE_SCHEME} schedule has no parameters "
                    f"(got also {sorted(map(str, set(value) - {'scheme'}))})"[:200]
                )
            return ADAPTIVE
        if isinstance(value, dict):
            try:
                return cls(None, RowTau.from_dict(value))
            except (TypeError, OverflowError) as err:
                raise ValueError(f"a row schedule: {err}") from None
        arr = _leaves(value)
        bad = arr[~(np.isfinite(arr) & (arr >= TAU_MIN) & (arr <= TAU_MAX))]
        if bad.size:
            raise ValueError(f"{_WHY}, got {float(bad.flat[0]):g}")
        arr.setflags(write=False)
        return cls(arr, None)

    # -- what it is ----------------------------------------------------------------------------

    @property
    def rows(self) -> RowTau | None:
        """The row scheme of a per-row schedule, else None."""
        return self._rows

    @property
    def adaptive(self) -> bool:
        """True for :data:`ADAPTIVE`: the attention multiplies each targeted row's logits by its own beta."""
        return self._adaptive

    @property
    def ndim(self) -> int:
        """0 (one number), 1 (per layer), 2 (per layer and head); -1 for a per-row schedule (position or adaptive)."""
        return -1 if self._values is None or self._adaptive else self._values.ndim

    @property
    def scalar(self) -> float | None:
        """The one number of a scalar schedule, else None (adaptive temperature too: each row has its own)."""
        return float(self._values) if self.ndim == 0 else None

    @property
    def is_one(self) -> bool:
        """True when it divides nothing (tau = 1 everywhere): the model as trained (not adaptive temperature)."""
        return self._values is not None and not self._adaptive and bool((self._values == 1.0).all())

    def is_one_over(self, rows: int) -> bool:
        """True when an input of ``rows`` tokens sees tau = 1 on every row: :attr:`is_one`, or a row schedule whose
        first ``rows`` rows keep 1 (Qwen's log-n at or below its base; not Llama 4 at L_tr, whose last row moves)."""
        if self.is_one:
            return True
        return self._rows is not None and self.row_taus(0, max(1, int(rows))) is None

    def matrix(self, n_layers: int, n_heads: int, rows: int | None = None) -> np.ndarray:
        """The float64 ``[layers, heads]`` matrix for a model of this shape (read-only, computed once per shape).

        ValueError when the schedule does not fit the model (a per-layer list of
        the wrong length, a per-head table of the wrong shape). A per-row
        schedule is the same for every layer and head: its matrix holds its
        mean over ``rows`` query rows (what a result reports).
        """
        key = (int(n_layers), int(n_heads), None if self._rows is None else int(rows or 0))  # adaptive: its base, 1
        m = self._matrices.get(key)
        if m is None:
            m = self._build(*key)
            m.setflags(write=False)
            self._matrices[key] = m
        return m

    def _build(self, n_layers: int, n_heads: int, rows: int | None) -> np.ndarray:
        if self._rows is not None:
            if not rows:
                raise ValueError("a row schedule's matrix needs the input's length (rows)")
            return np.full((n_layers, n_heads), self._rows.mean(rows))
        v = self._values
        if v.ndim == 0:
            return np.full((n_layers, n_heads), float(v))
        if v.ndim == 1:
            if v.shape[0] != n_layers:
                raise ValueError(f"a per-layer tau needs {n_layers} values, got {v.shape[0]}")
            return np.repeat(v[:, None], n_heads, axis=1)
        if v.shape != (n_layers, n_heads):
            raise ValueError(f"a per-head tau needs shape ({n_layers}, {n_heads}), got {v.shape}")
        return v.copy()

    def heads(self, layer: int, n_heads: int) -> np.ndarray | None:
        """Layer ``layer``'s tau per head (float64 ``[heads]``), or None when it is 1 for every head.

        What the attention asks for each layer; no matrix is built (the
        attention does not know the model's layer count, the engine checked it).
        Adaptive temperature: None (its base tau is 1; the attention reads :attr:`adaptive` for each row's beta).
        """
        if self._adaptive:
            return None
        v = self._values
        if v is None:
            raise ValueError("a row schedule has one tau per query row, not per head (use row_taus)")
        if v.ndim == 0:
            row = np.full(n_heads, float(v))
        else:
            if layer >= v.shape[0]:
                raise ValueError(f"the tau schedule has {v.shape[0]} layers but the model has more")
            row = v[layer] if v.ndim == 2 else np.full(n_heads, float(v[layer]))
            if row.shape[0] != n_heads:
                raise ValueError(f"a per-head tau needs {n_heads} heads per layer, got {row.shape[0]}")
        return None if bool((row == 1.0).all()) else row

    def row_taus(self, start: int, count: int) -> np.ndarray | None:
        """The taus of query rows ``start .. start + count - 1`` (a per-row schedule), None when all are 1."""
        if self._rows is None:
            raise ValueError("only a row schedule has a tau per query row")
        t = self._rows.taus(np.arange(start, start + count))
        return None if bool((t == 1.0).all()) else t

    def mean(self, rows: int | None = None) -> float:
        """One number for any schedule: the mean over layers and heads, or over the ``rows`` of the input for a
        row schedule (a CSV's ``tau`` column, a card's caption)."""
        if self._rows is not None:
            if rows is None:
                raise ValueError("a row schedule's mean needs the input's length (rows)")
            return self._rows.mean(rows)
        return float(np.mean(self._values))

    # -- leaving -------------------------------------------------------------------------------

    def describe(self, rows: int | None = None) -> str:
        """The schedule in one table cell: a number (4 decimals), a per-layer list, a per-head matrix's range and
        mean, a row schedule's mean over ``rows`` query rows (Llama 4), or adaptive temperature's rule."""
        if self._adaptive:
            return "per query row, adaptive: tau = 1 / beta(H), H the row's own tau = 1 entropy"
        if self._rows is not None:
            r = self._rows
            mean = "" if rows is None else f": mean {r.mean(rows):.4f} over {rows:,} rows"
            if r.scheme == QWEN_LOGN:
                return f"per query row (Qwen log-n, base {r.floor_scale}){mean}"
            return f"per query row (floor_scale {r.floor_scale}, attn_scale {r.attn_scale:g}){mean}"
        a = self._values
        if a.ndim == 0:
            return f"{float(a):.4f}"
        if a.ndim == 1:
            return ", ".join(f"{v:.2f}" for v in a)
        return f"per head ({a.shape[0]} x {a.shape[1]}): {a.min():.2f} to {a.max():.2f}, mean {a.mean():.3f}"

    def to_json(self) -> float | list | dict:
        """A number, nested lists, or a row schedule's dict (adaptive: ``{"scheme": "adaptive"}``): what settings
        files and ``--json`` hold."""
        if self._adaptive:
            return {"scheme": ADAPTIVE_SCHEME}
        if self._rows is not None:
            return self._rows.to_dict()
        return float(self._values) if self._values.ndim == 0 else self._values.tolist()

    def key(self) -> tuple:
        """A hashable key (equal schedules, equal keys; numbers to 6 decimals): what caches of passes and
        accuracy runs are keyed by. A row schedule is keyed by its parameters, adaptive temperature by its name
        (so an adaptive pass never shares a key with tau = 1, whose key is ``(1.0,)``)."""
        if self._adaptive:
            return (ADAPTIVE_SCHEME,)
        if self._rows is not None:
            r = self._rows
            return ("rows", r.scheme, int(r.floor_scale), round(float(r.attn_scale), 6))
        return tuple(float(x) for x in np.atleast_1d(self._values).ravel().round(6))

    def __float__(self) -> float:
        """The one number of a scalar schedule (TypeError for any other: a list is not one number, nor is adaptive
        temperature's tau)."""
        if self.ndim != 0:
            raise TypeError(f"a {self.describe()} schedule is not one number; use mean()")
        return float(self._values)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The values as numpy sees them (0, 1 or 2 dimensions); a row schedule has none without a length; adaptive
        temperature gives its base, 1 (each row's beta exists only inside a pass)."""
        if self._values is None:
            raise TypeError("a row schedule has no values without the input's length; use matrix(..., rows=n)")
        return np.array(self._values, dtype=dtype)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        if self._adaptive or other._adaptive:
            return self._adaptive == other._adaptive
        if (self._rows is None) != (other._rows is None):
            return False
        if self._rows is not None:
            return self._rows == other._rows
        return self._values.shape == other._values.shape and bool((self._values == other._values).all())

    def __hash__(self) -> int:
        return hash((self.ndim, self.key()))

    def __repr__(self) -> str:
        return f"Schedule({self.to_json()!r})"

    def __reduce__(self):  # copies and Ray's transport rebuild it through of(): never an unchecked value
        return (_rebuilt, (self.to_json(),))


def _rebuilt(value) -> Schedule:
    """A pickled schedule, rebuilt through :meth:`Schedule.of`. A module-level function, so cloudpickle (Ray) pickles
    it by reference: the bound classmethod was pickled by value, with its globals, and ``of``'s global
    :data:`ADAPTIVE` (itself pickled through ``of``) made a cycle that unpickled ``of`` before its globals were set
    ("name 'Schedule' is not defined" in every Ray actor)."""
    return Schedule.of(value)


ONE = Schedule.of(1.0)
"""The model as trained."""

_BASE = np.array(1.0)
_BASE.setflags(write=False)
ADAPTIVE = Schedule(_BASE, None, adaptive=True)
"""Adaptive temperature (Velickovic et al. 2024, "softmax is not enough"): tau = 1, then each targeted query row's
logits multiplied by beta = max(poly(H), 1) where its entropy H > 0.5 nats, in the attention itself
(:func:`core.mechanics.softmax_block.adaptive_rows`; the fit: :data:`ADAPTIVE_POLY`). The
one adaptive schedule: ``Schedule.of({"scheme": "adaptive"})`` returns it."""
