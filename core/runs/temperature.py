"""Ways to choose the softmax temperature tau for a length L_ex > L_tr.

All logits (q.k + bias) of the targeted attention are divided by tau; tau < 1
sharpens. The methods, from the cheapest to the most measured:

* ``none``: tau = 1.
* ``fixed``: a number the user chose.
* ``log-length``: tau = log L_tr / log L_ex, the paper's baseline (keeps
  the scale of a log L normaliser constant).
* ``longrope``: LongRoPE's attention factor, tau = 1 / (1 + ln s / ln L_tr)
  (= log-length with s = L / L_tr); ``critical``: critical attention
  scaling, tau = 1 / (gamma ln L), gamma settable; ``log-n-rows``: Qwen's
  log-n by query position (a row schedule, :class:`core.values.schedule.RowTau`).
* ``adaptive``: adaptive temperature, here as maths (:func:`adaptive_beta`);
  its schedule is :data:`core.values.schedule.ADAPTIVE`, and the attention
  runs it per row from each row's own logits
  (:func:`core.mechanics.softmax_block.adaptive_rows`).
* ``infoscale``: InfoScale (Li et al., "Information Entropy Invariance",
  ICML 2025) multiplies logits by lambda = sqrt(1 - n^(-2/d)) / sqrt(1 -
  n_tr^(-2/d)); as a temperature tau = 1 / lambda. We take d = d_kv, the
  per-head query/key dimension, which is the d of their entropy derivation
  (the dimension of the vectors whose dot product forms a logit).
* ``prop1`` / ``prop2``: the paper's closed forms (Prop. 1 matches Pmax,
  Prop. 2 matches entropy) from the measured std sigma of the layer-0 average
  sorted logit vector at L_tr and L_ex, and Pmax at L_tr.
* ``pmax`` / ``entropy``: Algorithm 1, a grid search for the tau whose mean
  Pmax (or H) at L_ex matches the mean at L_tr with tau = 1; plus a bisection
  that finds the same grid point in fewer forward passes, and per-layer
  alignment (the paper's suggested extension).

The search functions take a ``measure`` callable (tau schedule -> per-layer
means) so this module does no model work itself; :mod:`core.runs.calibration`
builds those callables from :mod:`core.runs.engine`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

GRID: tuple[float, ...] = tuple(round(1.0 - 0.05 * i, 2) for i in range(11))  # 1.0, 0.95, ..., 0.5
CRITERIA = ("pmax", "entropy")
#: The lowest tau anything offers: the app's slider, and the refined search going past the grid's end.
TAU_FLOOR = 0.30
# The methods a user can name, their labels and flags: core.runs.methods.REGISTRY (one entry each).


def log_length(train_length: int, length: int) -> float:
    """The paper's baseline tau = log(L_tr) / log(L_ex); 1 when L_ex <= L_tr."""
    if train_length < 2 or length < 2:
        raise ValueError("lengths must be at least 2 tokens")
    return min(1.0, math.log(train_length) / math.log(length))


def yarn(train_length: int, length: int) -> float:
    """YaRN's attention factor as a temperature: logits are multiplied by ``(0.1 ln s + 1)^2`` with
    s = L / L_tr (Peng et al. 2023: the factor sqrt(1/t) = 0.1 ln s + 1 scales q and k each), so
    tau = (0.1 ln s + 1)^-2; 1 when L <= L_tr. At s = 8 that is 0.685."""
    if train_length < 1 or length < 1:
        raise ValueError("lengths must be at least 1 token")
    if length <= train_length:
        return 1.0
    return (0.1 * math.log(length / train_length) + 1.0) ** -2


def infoscale(train_length: int, length: int, d: int) -> float:
    """InfoScale as a temperature: 1 / lambda, lambda = sqrt(1 - n^(-2/d)) / sqrt(1 - n_tr^(-2/d)).

    Only sharpens (returns 1 for n <= n_tr), like the log-length baseline.
    """
    if d < 1:
        raise ValueError("d must be >= 1")
    if length <= train_length:
        return 1.0
    lam = math.sqrt(1 - length ** (-2 / d)) / math.sqrt(1 - train_length ** (-2 / d))
    return 1.0 / lam


def longrope(train_length: int, length: int, factor: float | None = None) -> float:
    """LongRoPE's attention factor as a temperature (Ding et al. 2024; transformers'
    ``_compute_longrope_parameters``, used by Phi-3): cos and sin are multiplied by
    ``sqrt(1 + ln s / ln L_tr)``, so q and k each are and the logits by ``1 + ln s / ln L_tr``; tau is its
    inverse, 1 for s <= 1. ``factor``: s, by default L / L_tr (as :func:`yarn` reads it here; a model
    ships one fixed s = max_position_embeddings / L_tr). With s = L / L_tr, ``1 + ln s / ln L_tr = ln L / ln
    L_tr``: exactly the paper's log-length tau."""
    if train_length < 2 or length < 1:
        raise ValueError("L_tr must be at least 2 tokens and L at least 1")
    s = length / train_length if factor is None else float(factor)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"the LongRoPE factor must be a positive number, got {s!r}")
    if s <= 1.0:
        return 1.0
    return 1.0 / (1.0 + math.log(s) / math.log(train_length))


#: The bounds of critical attention scaling's gamma (a tau of 1 / (gamma ln L) for L in 2 .. 4M tokens stays
#: inside the schedule's 0.001 .. 1000 for gamma in this range only where L allows: checked per call).
GAMMA_MIN, GAMMA_MAX = 1e-3, 100.0


def critical_gamma(train_length: int) -> float:
    """The default gamma of :func:`critical`: 1 / ln L_tr, the one gamma that leaves the model as trained at L_tr."""
    if train_length < 2:
        raise ValueError("L_tr must be at least 2 tokens")
    return 1.0 / math.log(train_length)


def critical(length: int, gamma: float) -> float:
    """Critical attention scaling (Chen, Lin, Polyanskiy, Rigollet 2025, "Critical attention scaling in
    long-context transformers", arXiv 2510.05554): the logits multiplied by beta_n = gamma log n, n the keys a
    row sees (L in this bidirectional encoder), so tau = 1 / (gamma ln L). Their model's critical gamma is 1 /
    (1 - rho); a trained model has no rho, so gamma is the user's (default :func:`critical_gamma`). Unlike
    log-length it is not held at 1 below L_tr: a shorter input is softened (tau > 1)."""
    if length < 2:
        raise ValueError("L must be at least 2 tokens (ln 1 = 0)")
    g = float(gamma)
    if not (math.isfinite(g) and GAMMA_MIN <= g <= GAMMA_MAX):
        raise ValueError(f"gamma must be a number in {GAMMA_MIN:g} .. {GAMMA_MAX:g}, got {gamma!r}")
    tau = 1.0 / (g * math.log(length))
    if not 1e-3 <= tau <= 1e3:
        raise ValueError(f"gamma {g:g} at {length:,} tokens gives tau {tau:.3g}, outside 0.001 .. 1000")
    return tau


def prop1(train_length: int, length: int, pmax_tr: float, sigma_tr: float, sigma_ex: float) -> float:
    """Prop. 1: larger root of A tau^2 - B tau + C = 0, matching Pmax.

    A = log L_ex + log Pmax_tr, B = log L_tr + log Pmax_tr + sigma_tr^2 / 2,
    C = sigma_ex^2 / 2. Raises ValueError when the quadratic has no real
    positive root (Pmax_tr so small that A <= 0, or a negative discriminant):
    the Gaussian-logit model behind it does not fit those numbers.
    """
    if not (0 < pmax_tr <= 1):
        raise ValueError("Pmax at L_tr must be in (0, 1]")
    a = math.log(length) + math.log(pmax_tr)
    b = math.log(train_length) + math.log(pmax_tr) + sigma_tr**2 / 2
    c = sigma_ex**2 / 2
    disc = b * b - 4 * a * c
    if a == 0:
        if b == 0:
            raise ValueError("Prop. 1 is degenerate for these numbers (A = B = 0)")
        return c / b
    if disc < 0:
        raise ValueError(f"Prop. 1 has no real root here (discriminant {disc:.3g} < 0)")
    root = (b + math.sqrt(disc)) / (2 * a) if a > 0 else (b - math.sqrt(disc)) / (2 * a)
    if not root > 0:
        raise ValueError("Prop. 1 has no positive root for these numbers")
    return root


def prop2(train_length: int, length: int, sigma_tr: float, sigma_ex: float) -> float:
    """Prop. 2: tau = sigma_ex / sqrt(sigma_tr^2 + 2 log(L_ex / L_tr)), matching entropy."""
    denom = sigma_tr**2 + 2 * math.log(length / train_length)
    if denom <= 0:
        raise ValueError("Prop. 2 is undefined here (sigma_tr^2 + 2 log(L_ex/L_tr) <= 0)")
    return sigma_ex / math.sqrt(denom)


# -- Algorithm 1 ---------------------------------------------------------------


@dataclass(frozen=True)
class LayerStats:
    """Mean Pmax and entropy per encoder layer (over heads, real rows and documents).

    ``doc_pmax`` / ``doc_entropy`` ([documents, layers], optional): the same
    per document, whose mean over documents is ``pmax`` / ``entropy``; what
    Algorithm 1's bootstrap :attr:`Calibration.band` resamples."""

    pmax: np.ndarray
    entropy: np.ndarray
    head_pmax: np.ndarray | None = None  # [layers, heads], when the measure kept heads apart
    head_entropy: np.ndarray | None = None
    doc_pmax: np.ndarray | None = None  # [documents, layers], when the measure kept documents apart
    doc_entropy: np.ndarray | None = None

    def criterion(self, name: str) -> np.ndarray:
        if name not in CRITERIA:
            raise ValueError(f"unknown criterion '{name}'; choose from {CRITERIA}")
        return self.pmax if name == "pmax" else self.entropy

    def heads(self, name: str) -> np.ndarray:
        """[layers, heads] of a criterion (per-head alignment needs a measure that keeps heads apart)."""
        self.criterion(name)
        out = self.head_pmax if name == "pmax" else self.head_entropy
        if out is None:
            raise ValueError("this measure has no per-head statistics")
        return out

    def documents(self, name: str) -> np.ndarray | None:
        """[documents, layers] of a criterion, or None when the measure did not keep documents apart."""
        self.criterion(name)
        out = self.doc_pmax if name == "pmax" else self.doc_entropy
        return None if out is None else np.asarray(out, dtype=float)


Measure = Callable[[object], LayerStats]  # tau schedule (float or per-layer list) -> stats


@dataclass
class Calibration:
    """Algorithm 1's outcome: the whole curve, not just the pick."""

    criterion: str
    grid: list[float]
    curve: list[float | None]  # S_ex(tau) per grid point; None where not evaluated (fast search)
    reference: float  # S_tr(1)
    tau: float
    passes: int
    schedule: list[float] | None = None  # per-layer alignment only
    layer_curves: list[list[float | None]] = field(default_factory=list)
    layer_references: list[float] = field(default_factory=list)
    # Did the curve reach the reference inside the range searched (else the pick is the end the curve
    # stopped short at), and S_ex(tau) - S_tr(1) at the pick: the honest part of the answer.
    reached: bool = True
    gap: float = 0.0
    refined: list[tuple[float, float]] = field(default_factory=list)  # (tau, S_ex) off the grid (refined search)
    layer_reached: list[bool] = field(default_factory=list)  # per-layer alignment: each layer's ``reached``
    unreached_heads: list[tuple[int, int]] = field(default_factory=list)  # per-head: (layer, head) left at default
    # The spread of the grid pick over the calibration documents (:func:`bootstrap_band`): {"low", "high",
    # "level", "resamples", "documents", "seed"}; None with fewer than 2 documents or no per-document stats.
    band: dict | None = None

    @property
    def per_head(self) -> bool:
        """A schedule of one tau per layer and head (per-head alignment)."""
        return bool(self.schedule) and isinstance(self.schedule[0], list)

    def to_dict(self) -> dict:
        return {
            "criterion": self.criterion,
            "grid": self.grid,
            "curve": self.curve,
            "reference": self.reference,
            "tau": self.tau,
            "passes": self.passes,
            **({"schedule": self.schedule} if self.schedule is not None else {}),
            "reached": self.reached,
            "gap": self.gap,
            "band": self.band,
            **({"refined": [list(p) for p in self.refined]} if self.refined else {}),
            **({"layer_reached": self.layer_reached} if self.layer_reached else {}),
            **({"unreached_heads": [list(h) for h in self.unreached_heads]} if self.per_head else {}),
        }


def _closest(values: dict[int, float], reference: float) -> int:
    """Grid index whose value is closest to the reference; ties go to the larger tau (smaller index)."""
    return min(values, key=lambda i: (abs(values[i] - reference), i))


def grid_search(
    score: Callable[[float], float],
    reference: float,
    grid: Sequence[float] = GRID,
    progress: Callable[[float], None] | None = None,
) -> tuple[int, dict[int, float]]:
    """Evaluate every grid point; return the pick and all values."""
    values = {}
    for i, t in enumerate(grid):
        values[i] = score(t)
        if progress:
            progress((i + 1) / len(grid))
    return _closest(values, reference), values


def bisect_search(
    score: Callable[[float], float],
    reference: float,
    grid: Sequence[float] = GRID,
    progress: Callable[[float], None] | None = None,
) -> tuple[int, dict[int, float]]:
    """Same pick as :func:`grid_search` when the score is monotone in tau, in ~log2(n)+2 passes.

    Pmax rises and entropy falls as tau drops, so along the grid the score
    crosses the reference at most once. We bisect for the first index past the
    crossing and compare it with its neighbour.
    """
    n = len(grid)
    values: dict[int, float] = {}

    def at(i: int) -> float:
        if i not in values:
            values[i] = score(grid[i])
            if progress:
                progress(min(1.0, len(values) / (math.log2(n) + 2)))
        return values[i]

    first, last = at(0), at(n - 1)
    sign = 1.0 if last >= first else -1.0  # orient so the score increases along the grid
    if sign * (first - reference) >= 0:
        return 0, values
    if sign * (last - reference) <= 0:
        return n - 1, values
    lo, hi = 0, n - 1  # sign*(at(lo)-ref) < 0 < sign*(at(hi)-ref)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if sign * (at(mid) - reference) < 0:
            lo = mid
        else:
            hi = mid
    return _closest({lo: at(lo), hi: at(hi)}, reference), values


def algorithm1(
    measure: Measure,
    reference: LayerStats,
    criterion: str = "pmax",
    grid: Sequence[float] = GRID,
    fast: bool = False,
    progress: Callable[[float], None] | None = None,
    refined: bool = False,
) -> Calibration:
    """Algorithm 1: the tau of ``grid`` whose mean criterion at L_ex matches L_tr's at tau = 1.

    ``refined``: then find the crossing itself (:func:`refine`), past the
    grid's end down to :data:`TAU_FLOOR` when the grid is not enough. Either
    way the result says whether the reference was ``reached`` and the
    ``gap`` left at the pick.

    ``measure(tau)`` runs the L_ex documents; ``reference`` is the stats of the
    L_tr documents at tau = 1. The mean is over all layers (each layer has the
    same heads and rows, so this equals the mean over layers, heads and rows).

    ``band``: when ``measure`` and ``reference`` keep documents apart
    (``doc_pmax`` / ``doc_entropy``, at least 2 documents, the i-th reference
    document being the i-th document's L_tr counterpart), the spread of the
    pick over resamples of the documents (:func:`bootstrap_band`) on the grid
    points evaluated; no extra passes. A refined search keeps this grid band
    (its off-grid points are not resampled).
    """
    ref = float(np.mean(reference.criterion(criterion)))
    seen: dict[float, LayerStats] = {}

    def score(t: float) -> float:
        stats = seen[float(t)] = measure(t)
        return float(np.mean(stats.criterion(criterion)))

    pick, values = (bisect_search if fast else grid_search)(score, ref, grid, progress)
    cal = Calibration(
        criterion=criterion,
        grid=list(grid),
        curve=[values.get(i) for i in range(len(grid))],
        reference=ref,
        tau=float(grid[pick]),
        passes=len(values),
        reached=_brackets(values.values(), ref),
        gap=values[pick] - ref,
    )
    idx = sorted(values)
    docs = [seen[float(grid[i])].documents(criterion) for i in idx]
    ref_docs = reference.documents(criterion)
    if ref_docs is not None and all(d is not None and len(d) == len(ref_docs) for d in docs):
        cal.band = bootstrap_band(
            [float(grid[i]) for i in idx], np.stack([d.mean(axis=1) for d in docs]), ref_docs.mean(axis=1), grid=grid
        )
    if refined:
        tau, value, reached, points = refine(score, ref, values, grid)
        cal.tau, cal.gap, cal.reached, cal.refined = tau, value - ref, reached, points
        cal.passes += len(points)
    return cal


BAND_LEVEL = 0.9
BAND_RESAMPLES = 200


def bootstrap_band(
    taus: Sequence[float],
    doc_curve: np.ndarray,
    doc_reference: np.ndarray,
    grid: Sequence[float] | None = None,
    level: float = BAND_LEVEL,
    resamples: int = BAND_RESAMPLES,
    seed: int = 0,
) -> dict | None:
    """The spread of Algorithm 1's pick over the calibration documents, by bootstrap.

    ``taus``: the grid points evaluated; ``doc_curve[j, d]``: document d's
    criterion (mean over layers) at ``taus[j]``; ``doc_reference[d]``: its L_tr
    counterpart's at tau = 1. Each of ``resamples`` resamples draws the
    documents with replacement (a document and its reference together, the
    same indices), averages the curve and the reference over them and picks
    the tau as Algorithm 1 does (:func:`_closest`: ties go to the earlier
    point of ``grid``, the larger tau). Returns ``{"low", "high", "level",
    "resamples", "documents", "seed"}``: the ``(1 - level) / 2`` and ``(1 +
    level) / 2`` quantiles of the picked taus, taken on the picks themselves
    (so both ends are grid points); deterministic (``numpy`` ``default_rng(seed)``).
    None with fewer than 2 documents."""
    curve = np.asarray(doc_curve, dtype=float)
    refs = np.asarray(doc_reference, dtype=float)
    k = refs.shape[0]
    if k < 2 or curve.ndim != 2 or curve.shape != (len(taus), k):
        return None
    order = list(grid) if grid is not None else list(taus)
    pos = [order.index(t) if t in order else i for i, t in enumerate(taus)]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, k, size=(resamples, k))
    means = curve[:, idx].mean(axis=2)  # [points, resamples]
    ref = refs[idx].mean(axis=1)  # [resamples]
    picks = np.array([taus[pos.index(_closest(dict(zip(pos, means[:, r])), ref[r]))] for r in range(resamples)])
    lo_q, hi_q = (1 - level) / 2, (1 + level) / 2
    return {
        "low": float(np.quantile(picks, lo_q, method="lower")),
        "high": float(np.quantile(picks, hi_q, method="higher")),
        "level": float(level),
        "resamples": int(resamples),
        "documents": int(k),
        "seed": int(seed),
    }


def _brackets(values, reference: float) -> bool:
    """The reference lies within the values seen: the curve crossed it inside the range searched."""
    vals = list(values)
    return min(vals) <= reference <= max(vals)


def refine(
    score: Callable[[float], float],
    reference: float,
    values: dict[int, float],
    grid: Sequence[float] = GRID,
    floor: float = TAU_FLOOR,
    steps: int = 7,
) -> tuple[float, float, bool, list[tuple[float, float]]]:
    """The crossing itself, not the nearest grid point: ``(tau, S_ex(tau), reached, off-grid points)``.

    Between the two grid points that bracket the reference, bisection on tau
    (``steps`` passes: 0.05 / 2^7, about 0.0004). When the grid's end is not
    enough (the curve has not reached S_tr(1) at its smallest tau), it goes on
    below in grid-sized steps down to ``floor`` and bisects where it crosses;
    if even the floor does not reach, the floor is returned with
    ``reached=False``. A curve already past the reference at tau = 1 returns
    1 (nothing softens here). Assumes the criterion is monotone in tau, as
    Pmax (rising) and entropy (falling) are when tau sharpens."""
    pts: dict[float, float] = {float(grid[i]): v for i, v in values.items()}
    extra: list[tuple[float, float]] = []

    def at(t: float) -> float:
        t = round(float(t), 6)
        if t not in pts:
            pts[t] = score(t)
            extra.append((t, pts[t]))
        return pts[t]

    hi_t, lo_t = float(grid[0]), float(grid[-1])
    up = at(lo_t) >= at(hi_t)  # the criterion grows as tau falls (Pmax) or shrinks (entropy)

    def short(t: float) -> bool:  # tau t has not yet sharpened enough to reach the reference
        return (at(t) < reference) if up else (at(t) > reference)

    if not short(hi_t):
        return hi_t, at(hi_t), at(hi_t) == reference, extra
    step = abs(float(grid[0]) - float(grid[1])) if len(grid) > 1 else 0.05
    t = lo_t
    while short(t) and t - step >= floor - 1e-9:
        t = round(t - step, 6)
    if short(t):
        return t, at(t), False, extra
    # Bisect between the largest tau seen that reaches and the smallest above it that does not.
    b = max(x for x in pts if not short(x))
    a = min(x for x in pts if x > b and short(x))  # short at a, reaching at b
    for _ in range(steps):
        mid = round((a + b) / 2, 6)
        if short(mid):
            a = mid
        else:
            b = mid
    best = min((a, b), key=lambda x: abs(at(x) - reference))
    return best, at(best), True, extra


def per_layer(
    measure: Measure,
    reference: LayerStats,
    n_layers: int,
    criterion: str = "pmax",
    grid: Sequence[float] = GRID,
    fast: bool = True,
    progress: Callable[[float], None] | None = None,
) -> Calibration:
    """Algorithm 1 layer by layer: layer l's tau is chosen with layers < l already aligned.

    Layer l's statistics depend only on layers <= l, so layers above stay at
    tau = 1 while l is searched. Returns a per-layer schedule.
    """
    schedule = [1.0] * n_layers
    passes = 0
    curves, refs = [], []
    reached: list[bool] = []
    for layer in range(n_layers):
        ref = float(reference.criterion(criterion)[layer])

        def score(t: float, layer: int = layer) -> float:
            trial = schedule.copy()
            trial[layer] = t
            return float(measure(trial).criterion(criterion)[layer])

        sub = None if progress is None else (lambda f, layer=layer: progress((layer + f) / n_layers))
        pick, values = (bisect_search if fast else grid_search)(score, ref, grid, sub)
        schedule[layer] = float(grid[pick])
        passes += len(values)
        reached.append(_brackets(values.values(), ref))
        curves.append([values.get(i) for i in range(len(grid))])
        refs.append(ref)
    mean_ref = float(np.mean(refs))
    return Calibration(
        criterion=criterion,
        grid=list(grid),
        curve=[None] * len(grid),
        reference=mean_ref,
        tau=float(np.mean(schedule)),
        passes=passes,
        schedule=schedule,
        layer_curves=curves,
        layer_references=refs,
        reached=all(reached),
        gap=float(np.mean([float(measure(schedule).criterion(criterion)[i]) - refs[i] for i in range(n_layers)])),
        layer_reached=reached,
    )


def per_head(
    measure: Measure,
    reference: LayerStats,
    n_layers: int,
    n_heads: int,
    criterion: str = "pmax",
    grid: Sequence[float] = GRID,
    default: float = 1.0,
    progress: Callable[[float], None] | None = None,
) -> Calibration:
    """Algorithm 1 head by head: each head's tau matches its own statistic at L_tr (tau = 1).

    Why it costs no more passes than per-layer: a head's attention depends on
    its own tau and on the layers below, never on the other heads of its
    layer, so one pass with all of layer l's heads at tau t gives every head's
    curve point at t. Layers go bottom-up (layer l is searched with the heads
    below already aligned), over the whole grid. A head whose curve never
    reaches its reference inside the grid (a saturated head already sharper
    than at L_tr, or a flat one tau cannot move) is left at ``default`` and
    listed in ``unreached_heads``: the global mean hides exactly these."""
    schedule = [[1.0] * n_heads for _ in range(n_layers)]
    unreached: list[tuple[int, int]] = []
    refs = reference.heads(criterion)
    passes = 0
    curves: list[list[float | None]] = []
    for layer in range(n_layers):
        values = []  # [grid point][head]
        for i, t in enumerate(grid):
            trial = [row.copy() for row in schedule]
            trial[layer] = [float(t)] * n_heads
            values.append(np.asarray(measure(trial).heads(criterion)[layer], dtype=float))
            passes += 1
            if progress:
                progress((layer + (i + 1) / len(grid)) / n_layers)
        values_arr = np.stack(values)  # [grid, heads]
        for h in range(n_heads):
            col = values_arr[:, h]
            ref = float(refs[layer][h])
            if _brackets(col, ref):
                schedule[layer][h] = float(grid[_closest(dict(enumerate(col)), ref)])
            else:
                schedule[layer][h] = float(default)
                unreached.append((layer, h))
        curves.append([float(v) for v in values_arr.mean(axis=1)])
    final = measure(schedule).heads(criterion)
    gap = float(np.mean(final - refs))
    return Calibration(
        criterion=criterion,
        grid=list(grid),
        curve=[None] * len(grid),
        reference=float(np.mean(refs)),
        tau=float(np.mean(schedule)),
        passes=passes + 1,
        schedule=schedule,
        layer_curves=curves,
        layer_references=[float(np.mean(r)) for r in refs],
        reached=not unreached,
        gap=gap,
        unreached_heads=unreached,
    )
