"""The temperature methods, one registry entry each: what the CLI, the app, sweeps and tables offer.

A method turns a document (and the model) into a tau schedule
(:class:`core.values.schedule.Schedule`). Each :class:`Method` says how to show it
(``label``, ``short``, ``help``), what it costs (``measured``: it needs
forward passes; ``cost``: how many, for estimates; ``search``: a search of
several passes that shows progress), whether its tau changes with the
input's length (``length_dependent``: re-resolve it at another length),
whether the user gives the value (``takes_value``: a fixed tau) and carries
its ``resolve`` function. Everything that lists, estimates or resolves
methods reads :data:`REGISTRY`, so adding a method is one entry here plus its
test; a test checks that no other module names one.

A fixed tau is an ordinary method with a value: ``fixed`` plus its schedule
where there is room for both (a settings file: ``method`` and ``tau``; the
app: the method box and the slider), and one text where there is not (a CSV
row, the CLI's ``--methods`` list): ``tau=0.8`` (:func:`spell`,
:func:`parse`; a bare ``0.8`` is still read).

The maths lives in :mod:`core.runs.temperature` (closed forms, Algorithm 1's
searches); the passes they need come from :mod:`core.runs.calibration`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from core.errors import UserError, shown
from core.runs import temperature, timing
from core.values.schedule import ADAPTIVE, ONE, QWEN_LOGN, RowTau, Schedule

if TYPE_CHECKING:  # the registry itself stays light: the CLI checks names before torch is imported
    from core.data import tasks
    from core.models import Loaded
    from core.values.choice import Choice

Progress = Callable[[float], None]
#: ``(n_layers, n_heads, grid_size, samples) -> (passes at the document's length, passes at L_tr)``: what a
#: method's resolve runs on ``samples`` calibration documents (upper bounds where a bisection decides).
Cost = Callable[[int, int, int, int], tuple[int, int]]


#: A method's resolve: ``(loaded, document, tokens, *, samples, base, progress, params) -> (schedule, info)``, given
#: by keyword what it may use: the model, the document and its length in tokens, how many calibration documents
#: (``samples``), the :class:`~core.values.choice.Choice` its passes run under (``base``: scheme, targets, CosScale;
#: None: as trained), a progress callback, and the value of its :class:`Param` by name (``params``). Each takes
#: the ones it needs and ignores the rest (``**_``). Why not one record of them (the old ``Query``): it was a third
#: container of a run's choice beside the settings and the run settings, copied field by field.
Resolve = Callable[..., "tuple[Schedule, dict]"]


#: (L_tr, L, d_kv, tau = 1 logit statistics) -> tau; a method with a :class:`Param` also gets it by keyword
Formula = Callable[..., float]


@dataclass(frozen=True)
class Param:
    """A number a method takes besides the lengths (critical scaling's gamma): its name, what it means, its
    default from L_tr and its bounds. Library callers pass it as ``params={name: value}`` to :func:`resolve`
    and :func:`formula`; where none is given the default is used (and reported in the resolve's info)."""

    name: str
    help: str
    default: Callable[[int], float]
    low: float
    high: float

    def value(self, train_length: int, params: dict | None) -> float:
        """The value to use: the caller's (checked against the bounds) or the default at this L_tr."""
        given = (params or {}).get(self.name)
        if given is None:
            return float(self.default(train_length))
        return self.check(given)

    def check(self, given: object) -> float:
        """``given`` as a float within the bounds, or a :class:`UserError` in one line (NaN and bools too). An int is
        compared as it is (exact in Python), never turned into a float first: ``10**400`` is out of bounds, not an
        OverflowError."""
        if isinstance(given, bool) or not isinstance(given, (int, float)) or not self.low <= given <= self.high:
            raise UserError(f"{self.name} must be a number in {self.low:g} .. {self.high:g}, got {shown(given)}")
        return float(given)


@dataclass(frozen=True)
class Method:
    """One way of choosing tau (see the module docstring).

    ``formula``: a closed form in the lengths (and, when ``stats``, layer 0's
    tau = 1 logit statistics at L_tr and here): the Theory page draws it over
    length and Calibrate lists it without passes of its own.
    """

    name: str
    label: str
    short: str
    help: str
    measured: bool
    length_dependent: bool
    resolve: Resolve | None  # None: a constant, or the user gives tau
    formula: Formula | None = None
    stats: bool = False
    #: passes its resolve runs (None: none at all)
    cost: Cost | None = None
    #: a search over tau of several passes (callers show progress while it runs):
    #: ``search(measure, reference, n_layers, n_heads, progress) -> core.runs.temperature.Calibration`` on the passes
    #: of :func:`core.runs.calibration.measures`; it is the method's resolve, and tables that hold passes call it too
    search: Callable | None = None
    #: what its schedule holds: one tau for the "model", one per "layer", per "head" (layer x head), per "row"
    per: str = "model"
    #: Algorithm 1 on the shared tau grid with this criterion: the app resolves it from the passes its
    #: background grid already holds (by bisection) instead of passes of its own
    grid_criterion: str | None = None
    #: in this bidirectional encoder it gives exactly the tau of that method at every length (tables show one)
    same_as: str | None = None
    #: the statistic it matches to its L_tr value (a criterion of core.runs.temperature), if it matches one
    matches: str | None = None
    #: the user gives the schedule (a fixed tau): nothing to resolve
    takes_value: bool = False
    #: the same schedule for every document (tau = 1; adaptive temperature, whose rows' taus the attention computes
    #: from each row's logits): nothing to resolve
    constant: Schedule | None = None
    #: a number it takes besides the lengths (its default from L_tr is used where the caller gives none)
    param: Param | None = None

    def __post_init__(self) -> None:
        if self.search is not None and self.resolve is None:
            object.__setattr__(self, "resolve", _searched(self.search))

    def ones(self, n_layers: int, n_heads: int) -> Schedule:
        """tau = 1 in this method's shape (what a search gives at L_tr, by definition)."""
        shape = {"layer": (n_layers,), "head": (n_layers, n_heads)}.get(self.per, ())
        return Schedule.of(np.ones(shape))

    def passes(
        self, n_layers: int, n_heads: int, grid_size: int = len(temperature.GRID), samples: int = 1
    ) -> tuple[int, int]:
        """``(at the document's length, at L_tr)`` encoder passes its resolve runs (see :data:`Cost`)."""
        return (0, 0) if self.cost is None else self.cost(n_layers, n_heads, grid_size, samples)


def formula(
    name: str, train_length: int, length: int, d_kv: int, stats: dict | None = None, params: dict | None = None
) -> float:
    """A closed-form method's tau; :class:`UserError` (with the reason) where its model has no answer.
    ``params``: the value of the method's :class:`Param`, by name (its default when not given)."""
    m = get(name)
    if m.formula is None:
        raise UserError(f"Method '{name}' has no closed form")
    if m.stats and stats is None:
        raise UserError(f"{m.short} needs layer 0's logit statistics at L_tr and at this length")
    if m.stats and any(stats.get(k, 0.0) is None for k in ("pmax_tr", "sigma_tr", "sigma_ex")):
        # a causal model's rows see different numbers of keys: no one spread of sorted logits per length
        raise UserError(f"{m.short} needs the spread (sigma) of the sorted logits, which this model's rows do not have")
    extra = {} if m.param is None else {m.param.name: m.param.value(train_length, params)}
    try:
        return float(m.formula(train_length, length, d_kv, stats, **extra))
    except ValueError as err:
        raise UserError(f"{name}: {err}") from None


def closed_forms(
    train_length: int, length: int, d_kv: int, stats: dict | None, params: dict | None = None
) -> dict[str, float | str]:
    """Every closed-form method's tau at this length; where a form has no answer, ``"n/a (why)"`` (for tables).
    ``params``: :class:`Param` values by name, each given to the methods that take it (:func:`own_params`)."""
    out: dict[str, float | str] = {}
    for name in FORMULAS:
        try:
            out[name] = formula(name, train_length, length, d_kv, stats, own_params(name, params))
        except UserError as err:
            out[name] = f"n/a ({err})"
    return out


def _closed(name: str, uses_d: bool = False) -> Resolve:
    """A closed form's resolve; ``uses_d``: its info says which d (d_kv) the form used."""

    def resolve(
        loaded: "Loaded",
        document: "tasks.Document",
        tokens: int,
        *,
        base: "Choice | None" = None,
        params: dict | None = None,
        **_,
    ) -> tuple[Schedule, dict]:
        m = REGISTRY[name]
        stats = None
        if m.stats:
            from core.runs import calibration

            stats = calibration.logit_stats(loaded, document, base)
        tau = formula(name, loaded.train_length, tokens, loaded.d_kv, stats, params)
        if m.param is not None:
            return Schedule.of(tau), {m.param.name: m.param.value(loaded.train_length, params)}
        return Schedule.of(tau), (stats if stats is not None else {"d": loaded.d_kv} if uses_d else {})

    return resolve


def _llama4(loaded: "Loaded", document: "tasks.Document", tokens: int, **_) -> tuple[Schedule, dict]:
    rows = RowTau(floor_scale=loaded.train_length, attn_scale=LLAMA4_ATTN_SCALE)
    return Schedule.of(rows), {"rows": rows.to_dict(), "mean_tau": rows.mean(tokens)}


#: Llama 4's ``attn_scale`` (its config's default, 0.1); its ``floor_scale`` here is the model's L_tr.
LLAMA4_ATTN_SCALE = 0.1


def _qwen_rows(loaded: "Loaded", document: "tasks.Document", tokens: int, **_) -> tuple[Schedule, dict]:
    rows = RowTau(floor_scale=loaded.train_length, scheme=QWEN_LOGN)
    return Schedule.of(rows), {"rows": rows.to_dict(), "mean_tau": rows.mean(tokens)}


def _algorithm1(criterion: str, refined: bool = False) -> Callable:
    """Algorithm 1 (by bisection on the grid; ``refined``: then at the crossing itself) on ``criterion``."""

    def search(meas, reference, n_layers, n_heads, progress=None):
        return temperature.algorithm1(meas, reference, criterion, fast=True, progress=progress, refined=refined)

    return search


def _per_layer(meas, reference, n_layers, n_heads, progress=None):
    return temperature.per_layer(meas, reference, n_layers, "pmax", progress=progress)


def _per_head(meas, reference, n_layers, n_heads, progress=None):
    return temperature.per_head(meas, reference, n_layers, n_heads, "pmax", progress=progress)


def _searched(search: Callable) -> Resolve:
    """A search's resolve: the document's passes and its L_tr reference (:func:`core.runs.calibration.measures`)."""

    def resolve(
        loaded: "Loaded",
        document: "tasks.Document",
        tokens: int,
        *,
        samples: int = 1,
        base: "Choice | None" = None,
        progress: Progress | None = None,
        **_,
    ) -> tuple[Schedule, dict]:
        from core.runs import calibration

        meas, reference = calibration.measures(loaded, document, samples, base)
        cal = search(meas, reference, loaded.n_layers, loaded.n_heads, progress)
        return Schedule.of(cal.schedule if cal.schedule is not None else cal.tau), cal.to_dict()

    return resolve


def _bisection(n_layers: int, n_heads: int, grid: int, samples: int) -> tuple[int, int]:
    """Algorithm 1 by bisection on one criterion (:func:`core.runs.timing.algorithm1_passes`) on every calibration
    document, and each one's L_tr reference at tau = 1."""
    return timing.algorithm1_passes(grid, fast=True, criteria=1) * samples, samples


def _refined(n_layers: int, n_heads: int, grid: int, samples: int) -> tuple[int, int]:
    """The bisection, then 7 bisection steps at the crossing and up to 4 grid steps below the grid."""
    return (timing.algorithm1_passes(grid, fast=True, criteria=1) + 7 + 4) * samples, samples


def _layers(n_layers: int, n_heads: int, grid: int, samples: int) -> tuple[int, int]:
    """A bisection per layer."""
    return timing.algorithm1_passes(grid, fast=True, criteria=1) * n_layers * samples, samples


def _heads(n_layers: int, n_heads: int, grid: int, samples: int) -> tuple[int, int]:
    """The whole grid per layer (every head of a layer read from the same passes), and tau = 1."""
    return (grid * n_layers + 1) * samples, samples


def _stats(n_layers: int, n_heads: int, grid: int, samples: int) -> tuple[int, int]:
    """Layer 0's logit statistics: one pass here, one at L_tr (one document, whatever ``samples`` says)."""
    return 1, 1


REGISTRY: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "none",
            "none (tau = 1)",
            "tau = 1",
            "No temperature: the model as trained.",
            measured=False,
            length_dependent=False,
            resolve=None,
            constant=ONE,
        ),
        Method(
            "fixed",
            "fixed tau (slider)",
            "fixed tau",
            "A tau you choose, the same at every length.",
            measured=False,
            length_dependent=False,
            resolve=None,
            takes_value=True,
        ),
        Method(
            "log-length",
            "log-length: log L_tr / log L",
            "log-length",
            "The paper's baseline: tau = log L_tr / log L keeps a log-length normaliser constant.",
            measured=False,
            length_dependent=True,
            resolve=_closed("log-length"),
            formula=lambda lt, n, d, stats: temperature.log_length(lt, n),
        ),
        Method(
            "yarn",
            "YaRN attention factor",
            "YaRN",
            "Peng et al. (2023), used by today's RoPE-scaled models: logits x (0.1 ln s + 1)^2 with s = L / L_tr, "
            "i.e. tau = (0.1 ln s + 1)^-2 (0.685 at 8x).",
            measured=False,
            length_dependent=True,
            resolve=_closed("yarn"),
            formula=lambda lt, n, d, stats: temperature.yarn(lt, n),
        ),
        Method(
            "log-n",
            "log-n (Qwen), fixed s",
            "log-n",
            "Qwen's logn attention: queries scaled by log_{L_tr}(n) past L_tr, n the keys a row sees. In this "
            "bidirectional encoder every row sees all L keys, so tau = log L_tr / log L: equal to log-length here "
            "(in a causal decoder row i sees i + 1 keys and the scale grows along the rows).",
            measured=False,
            length_dependent=True,
            resolve=_closed("log-n"),
            formula=lambda lt, n, d, stats: temperature.log_length(lt, n),
            same_as="log-length",
        ),
        Method(
            "ssmax",
            "Scalable-Softmax, s = 1 / log L_tr",
            "SSMax",
            "Nakanishi (2025): softmax of s log(n) x logits, n the keys a row sees; with s fixed so that "
            "s log L_tr = 1 (tau = 1 at L_tr), tau = log L_tr / log L in an encoder: equal to log-length here.",
            measured=False,
            length_dependent=True,
            resolve=_closed("ssmax"),
            formula=lambda lt, n, d, stats: temperature.log_length(lt, n),
            same_as="log-length",
        ),
        Method(
            "llama4",
            "Llama 4 attention temperature tuning",
            "Llama 4",
            "Meta's Llama 4: row p's logits x (0.1 ln(1 + floor((p + 1) / L_tr)) + 1) (attn_scale 0.1, floor_scale "
            "= L_tr), a tau per query row: rows before L_tr keep tau = 1, the row at 4 L_tr gets 1 / (1 + 0.1 ln 5). "
            "Shown as its mean over the rows.",
            measured=False,
            length_dependent=False,
            resolve=_llama4,
            per="row",
        ),
        Method(
            "infoscale",
            "InfoScale",
            "InfoScale",
            "Li et al. (ICML 2025): tau = 1 / lambda, lambda = sqrt(1 - n^(-2/d)) / sqrt(1 - n_tr^(-2/d)), d = d_kv.",
            measured=False,
            length_dependent=True,
            resolve=_closed("infoscale", uses_d=True),
            formula=lambda lt, n, d, stats: temperature.infoscale(lt, n, d),
        ),
        Method(
            "log-n-rows",
            "log-n (Qwen) per query position",
            "log-n rows",
            "Qwen's use_logn_attn as its code applies it: the query at position p (0-based) x log_{L_tr}(p + 1) once "
            "p + 1 > L_tr (Qwen-7B's logn_list, seq_length = L_tr), a tau per query row: rows up to L_tr keep "
            "tau = 1, the last row of an 8x input gets log L_tr / log 8 L_tr (0.727 at L_tr = 256). Unlike 'log-n' "
            "(n = the keys a row sees, all L here) it leaves the early rows of a long input as dispersed as at "
            "tau = 1. Shown as its mean over the rows.",
            measured=False,
            length_dependent=False,
            resolve=_qwen_rows,
            per="row",
        ),
        Method(
            "longrope",
            "LongRoPE attention factor",
            "LongRoPE",
            "Ding et al. (2024), Phi-3's rope scaling: cos and sin x sqrt(1 + ln s / ln L_tr), so the logits x "
            "(1 + ln s / ln L_tr); with s = L / L_tr that is ln L / ln L_tr, so tau = log L_tr / log L: equal to "
            "log-length at every length (a shipped model fixes s = max_position_embeddings / L_tr instead).",
            measured=False,
            length_dependent=True,
            resolve=_closed("longrope"),
            formula=lambda lt, n, d, stats: temperature.longrope(lt, n),
            same_as="log-length",
        ),
        Method(
            "critical",
            "critical attention scaling, gamma log n",
            "critical",
            "Chen, Lin, Polyanskiy, Rigollet (2025): logits x beta_n = gamma ln n, n the keys a row sees (all L in "
            "this encoder), tau = 1 / (gamma ln L). gamma defaults to 1 / ln L_tr (tau = 1 at L_tr; then it equals "
            "log-length above L_tr, and softens below it); library callers set it (params={'gamma': ...}).",
            measured=False,
            length_dependent=True,
            resolve=_closed("critical"),
            formula=lambda lt, n, d, stats, gamma=None: temperature.critical(
                n, temperature.critical_gamma(lt) if gamma is None else gamma
            ),
            param=Param(
                "gamma",
                "beta_n = gamma ln n; 1 / ln L_tr keeps tau = 1 at L_tr",
                temperature.critical_gamma,
                temperature.GAMMA_MIN,
                temperature.GAMMA_MAX,
            ),
        ),
        Method(
            "adaptive",
            "adaptive temperature (per row, from its entropy)",
            "adaptive",
            "Velickovic et al. (2024), 'softmax is not enough' (arXiv 2410.01104): each query row's logits x beta = "
            "max(poly(H), 1), H the row's tau = 1 entropy in nats, poly the paper's degree-4 fit (-0.037 H^4 + 0.481 "
            "H^3 - 2.3 H^2 + 4.917 H - 1.791), beta = 1 where H <= 0.5: a tau of 1 / beta per row, computed inside "
            "the pass from the row itself (the same schedule for every document and length; no pass to resolve). "
            "It never softens; a dispersed row past L_tr is sharpened. Runs on the plain torch attention backend.",
            measured=False,
            length_dependent=False,
            resolve=None,
            constant=ADAPTIVE,
        ),
        Method(
            "pmax",
            "Algorithm 1, Pmax",
            "Alg. 1 Pmax",
            "Algorithm 1: the grid tau whose mean Pmax at this length matches the mean at L_tr with tau = 1.",
            measured=True,
            length_dependent=True,
            resolve=None,
            search=_algorithm1("pmax"),
            cost=_bisection,
            grid_criterion="pmax",
            matches="pmax",
        ),
        Method(
            "entropy",
            "Algorithm 1, entropy",
            "Alg. 1 entropy",
            "Algorithm 1 on the mean attention entropy instead of Pmax.",
            measured=True,
            length_dependent=True,
            resolve=None,
            search=_algorithm1("entropy"),
            cost=_bisection,
            grid_criterion="entropy",
            matches="entropy",
        ),
        Method(
            "pmax-refined",
            "Algorithm 1, Pmax, refined",
            "Alg. 1 Pmax refined",
            "Algorithm 1's Pmax match at the crossing itself (bisection between grid points), going below the "
            f"grid's 0.5 down to {temperature.TAU_FLOOR:g} when the grid is not enough.",
            measured=True,
            length_dependent=True,
            resolve=None,
            search=_algorithm1("pmax", refined=True),
            cost=_refined,
            matches="pmax",
        ),
        Method(
            "entropy-refined",
            "Algorithm 1, entropy, refined",
            "Alg. 1 entropy refined",
            "Algorithm 1's entropy match at the crossing itself, below the grid's end when needed.",
            measured=True,
            length_dependent=True,
            resolve=None,
            search=_algorithm1("entropy", refined=True),
            cost=_refined,
            matches="entropy",
        ),
        Method(
            "prop1",
            "Prop. 1 (match Pmax)",
            "Prop. 1",
            "The paper's closed form matching Pmax, from layer 0's logit spread at L_tr and here.",
            measured=True,
            length_dependent=True,
            resolve=_closed("prop1"),
            stats=True,
            cost=_stats,
            matches="pmax",
            formula=lambda lt, n, d, stats: temperature.prop1(
                lt, n, stats["pmax_tr"], stats["sigma_tr"], stats["sigma_ex"]
            ),
        ),
        Method(
            "prop2",
            "Prop. 2 (match entropy)",
            "Prop. 2",
            "The paper's closed form matching entropy, from layer 0's logit spread at L_tr and here.",
            measured=True,
            length_dependent=True,
            resolve=_closed("prop2"),
            stats=True,
            cost=_stats,
            matches="entropy",
            formula=lambda lt, n, d, stats: temperature.prop2(lt, n, stats["sigma_tr"], stats["sigma_ex"]),
        ),
        Method(
            "per-layer",
            "per-layer Algorithm 1 (Pmax)",
            "per-layer Alg. 1",
            "Algorithm 1 for each encoder layer on its own (the paper's suggested extension): one tau per layer.",
            measured=True,
            length_dependent=True,
            resolve=None,
            search=_per_layer,
            cost=_layers,
            per="layer",
            matches="pmax",
        ),
        Method(
            "per-head",
            "per-head Algorithm 1 (Pmax)",
            "per-head Alg. 1",
            "Algorithm 1 for each head on its own, matched to that head's Pmax at L_tr; heads that cannot reach "
            "theirs in the grid stay at tau = 1 and are listed. One tau per layer and head.",
            measured=True,
            length_dependent=True,
            resolve=None,
            search=_per_head,
            cost=_heads,
            per="head",
            matches="pmax",
        ),
    )
}

#: Every method a user can name, in the order menus show them.
NAMES: tuple[str, ...] = tuple(REGISTRY)
#: Methods that need forward passes to resolve.
MEASURED: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.measured)
#: Methods whose tau depends on the document length (re-resolve them at a new length).
LENGTH_DEPENDENT: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.length_dependent)
#: Methods with a closed form (:func:`formula`).
FORMULAS: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.formula is not None)


#: What a sweep compares when not told (the model as trained, the paper's baseline), and a perplexity table
#: (Table 3's rows: adding Algorithm 1 on both criteria).
SWEEP_DEFAULT: tuple[str, ...] = ("none", "log-length")
#: The paper's baseline (what the tour shows and sweeps compare against).
BASELINE = "log-length"
#: The closed forms Calibrate suggests when Algorithm 1 runs out of its range (docs/results.md: they hold up at 8x
#: and 16x L_tr where Algorithm 1 falls behind), the paper's baseline first.
ADVISED: tuple[str, ...] = (BASELINE, "yarn")
PERPLEXITY_DEFAULT: tuple[str, ...] = ("none", "log-length", "pmax", "entropy")
#: The model as trained (tau = 1): what a table's dispersion rows and a comparison's base are.
AS_TRAINED: str = next(n for n, m in REGISTRY.items() if m.constant is not None and m.constant.is_one)
#: The method whose value the user gives (a fixed tau), and its one text in CSV rows and method lists.
FIXED: str = next(n for n, m in REGISTRY.items() if m.takes_value)
FIXED_PREFIX = "tau="
#: Methods other modules point at by role, named here once (the registry owns every name; a test checks that no
#: other module spells one): Algorithm 1 on each criterion, its per-layer and per-head searches, the closed form
#: matching Pmax (Prop. 1), the per-row schedule (Llama 4) and YaRN's attention factor.
ALGORITHM1: dict[str, str] = {"pmax": "pmax", "entropy": "entropy"}
PER_LAYER, PER_HEAD, PER_ROW = "per-layer", "per-head", "llama4"
PROP1 = "prop1"
YARN = "yarn"
assert all(n in REGISTRY for n in (*ALGORITHM1.values(), PER_LAYER, PER_HEAD, PER_ROW, PROP1, YARN))
assert REGISTRY[PER_LAYER].per == "layer" and REGISTRY[PER_HEAD].per == "head" and REGISTRY[PER_ROW].per == "row"
assert all(REGISTRY[n].grid_criterion == c for c, n in ALGORITHM1.items())


def label(name: str) -> str:
    """The method's label for menus and cards (the name itself for anything unknown, e.g. a fixed tau)."""
    m = REGISTRY.get(name)
    return m.label if m is not None else str(name)


def parse(text: str | float) -> tuple[str, Schedule | None]:
    """A method as text -> ``(name, value)``: ``"tau=0.8"`` (or a bare number, as older CSVs and ``--methods``
    wrote it) is the fixed method with that tau; a registry name has no value. ValueError for anything else."""
    raw = text.removeprefix(FIXED_PREFIX) if isinstance(text, str) else text
    try:
        tau = float(raw)
    except (TypeError, ValueError, OverflowError):
        if text not in NAMES or REGISTRY[text].takes_value:
            shown = repr(text) if len(repr(text)) <= 40 else repr(text)[:37] + "..."  # one line, whatever it holds
            raise ValueError(
                f"Unknown method {shown}; use {FIXED_PREFIX}0.8 (a fixed tau) or one of "
                f"{', '.join(n for n in NAMES if n != FIXED)}"
            ) from None
        return str(text), None
    try:
        return FIXED, Schedule.of(tau)
    except ValueError as err:
        raise ValueError(f"a fixed {err}") from None


def spell(name: str, tau: "Schedule | float | None" = None) -> str:
    """The one text of a method choice (:func:`parse` reads it back): the name, or ``tau=0.8`` for a fixed tau."""
    if not get(name).takes_value:
        return name
    if tau is None:
        raise UserError(f"Method '{name}' needs a tau")
    s = Schedule.of(tau)
    if s.scalar is None:
        raise UserError("a fixed tau in a method list is one number")
    return f"{FIXED_PREFIX}{s.scalar:g}"


def method_label(m: str | float) -> str:
    """A method list's item in its one spelling (``0.8`` -> ``"tau=0.8"``); ValueError for anything else.

    The column value of sweeps and batch runs, and the check of the CLI's
    ``--methods`` items: one place decides what a method list may hold.
    """
    return spell(*parse(m))


def costs(
    names, n_layers: int, n_heads: int, samples: int = 1, grid_size: int = len(temperature.GRID)
) -> list[tuple[int, int]]:
    """The passes each method in ``names`` (names or ``tau=`` texts) that measures runs to resolve on ``samples``
    calibration documents, for :func:`core.runs.timing.sweep_passes`."""
    return [m.passes(n_layers, n_heads, grid_size, samples) for m in map(entry, names) if m.measured]


def entry(text: str) -> Method:
    """The registry entry of a method name or a method text (``tau=0.8``): what a list of either is asked."""
    return REGISTRY[text] if text in REGISTRY else get(parse(text)[0])


def get(name: str) -> Method:
    """The registry entry, or a :class:`UserError` listing the names."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise UserError(f"Unknown method {shown(name)}; choose from {', '.join(NAMES)}") from None


def resolve(
    loaded: "Loaded",
    document: "tasks.Document",
    method: str,
    tau: Schedule | None = None,
    samples: int = 1,
    base: "Choice | None" = None,
    progress: Progress | None = None,
    chosen_at: int | None = None,
    tokens: int | None = None,
    params: dict | None = None,
) -> tuple[Schedule, dict]:
    """The schedule a method gives for this document, and what it was computed from.

    Returns ``(schedule, info)``. A stored ``tau`` (from a settings file) is
    used as is for the fixed method, and for a length-dependent method only when it
    was chosen at exactly this document's length (``chosen_at``); any other
    length re-resolves the method here. ``info["source"]`` says which
    happened (the method's name for ``none`` and a fixed tau, ``stored`` or ``resolved``).
    ``params``: the value of the method's :class:`Param` by name (critical scaling's ``gamma``); refused for a
    method that takes none.
    """
    m = get(method)
    if params and (m.param is None or set(params) - {m.param.name}):
        takes = "none" if m.param is None else m.param.name
        raise UserError(f"Method '{m.name}' takes no {', '.join(sorted(set(params) - {takes}))} (it takes {takes})")
    if m.constant is not None:
        return m.constant, {"source": m.name}
    if m.takes_value:
        if tau is None:
            raise UserError(
                f"Method '{m.name}' needs a tau (--tau)", app=f"Method '{m.label}' needs a tau: move the tau slider."
            )
        return Schedule.of(tau), {"source": m.name}
    n = tokens if tokens is not None else len(loaded.tokenizer(document.text).input_ids)
    if tau is not None and chosen_at == n:
        return Schedule.of(tau), {"source": "stored", "chosen_at": chosen_at, "length": n}
    schedule, extra = m.resolve(loaded, document, n, samples=samples, base=base, progress=progress, params=params)
    return Schedule.of(schedule), {
        "source": "resolved",
        "chosen_at": chosen_at,
        "length": n,
        "train_length": loaded.train_length,
        **extra,
    }


def all_methods(
    loaded: "Loaded",
    document: "tasks.Document",
    samples: int = 1,
    progress: Progress | None = None,
    params: dict | None = None,
) -> dict[str, Schedule | str]:
    """Every method's tau for this document (errors become a short string), for tables. ``params``: values of
    :class:`Param` by name (``{"gamma": 0.2}``), each given to the methods that take it."""
    out: dict[str, Schedule | str] = {}
    names = [n for n, m in REGISTRY.items() if m.resolve is not None]
    for i, name in enumerate(names):
        try:
            out[name] = resolve(loaded, document, name, samples=samples, params=own_params(name, params))[0]
        except UserError as err:
            out[name] = f"n/a ({err})"
        if progress:
            progress((i + 1) / len(names))
    return out


# -- a method's own numbers (critical scaling's gamma) in lists of methods ---------------------------------------

#: Between a method's name and its parameter in a results row's method text (``critical:gamma=0.2``), as between a
#: position scheme's name and its parameters (:data:`core.values.positions.SPEC_SEP`).
PARAM_SEP = ":"


def takers(param: str) -> list[str]:
    """The methods whose :class:`Param` is called ``param`` (``gamma``: ``critical``)."""
    return [n for n, m in REGISTRY.items() if m.param is not None and m.param.name == param]


def own_params(text: str, params: dict | None) -> dict | None:
    """The part of ``params`` (``{name: value}``, given once for a whole list of methods) that the method ``text``
    (a name or a ``tau=`` text) takes; None when it takes none of them. Why: a sweep, a perplexity table or
    Calibrate's table gives one gamma to the methods that take it and nothing to the others, which refuse any."""
    m = entry(text)
    if m.param is None or m.param.name not in (params or {}):
        return None
    return {m.param.name: params[m.param.name]}  # type: ignore[index]


def untaken(param: str, names: list[str], option: str = "") -> str | None:
    """Why ``param``, given for the methods ``names`` (names or ``tau=`` texts), would change nothing: none of them
    takes it (``"only critical takes it (the methods here are none, yarn)"``; ``option`` names where such a method
    is chosen, ``--methods``); None when one takes it. The one check behind the CLI's ``--gamma`` and
    :func:`check_params`."""
    owners = takers(param)
    if any(entry(n).name in owners for n in names):
        return None
    here = "the method here is" if len(names) == 1 else "the methods here are"
    return (
        f"only {option + ' ' if option else ''}{' or '.join(owners)} takes it "
        f"({here} {', '.join(map(str, names)) or 'none'})"
    )


def check_params(params: dict | None, names: list[str], where: str) -> dict[str, float]:
    """``params`` for a list of methods, checked once at a plan's edge: each a known :class:`Param` within its bounds,
    taken by at least one of ``names`` (else it would change nothing); a :class:`UserError` ``"{where}: ..."``
    otherwise. Returns them as floats."""
    out: dict[str, float] = {}
    for key, value in (params or {}).items():
        owners = takers(key)
        if not owners:
            raise UserError(f"{where}: no method takes a parameter {str(key)[:40]!r}")
        why = untaken(key, names)
        if why:
            raise UserError(f"{where}: {key}: {why}")
        try:
            out[key] = get(owners[0]).param.check(value)  # type: ignore[union-attr]
        except UserError as err:
            raise UserError(f"{where}: {err}") from None
    return out


def cell_text(text: str, params: dict | None) -> str:
    """A method list's item as a results row names it: the item, with the value of its :class:`Param` when one was
    given (``critical:gamma=0.2``; without one the default from L_tr, which the model fixes: ``critical``). Why: two
    sweeps or perplexity tables at different gammas must not read as one, nor a resumed one take the other's rows
    as done (the row key holds this text). 12 significant digits: two gammas that differ are two texts."""
    own = own_params(text, params)
    if not own:
        return text
    return text + "".join(f"{PARAM_SEP}{k}={float(v):.12g}" for k, v in own.items())


def exported(name: str, schedule: "Schedule | None") -> str:
    """The method a settings file should name for ``schedule`` exported as ``name``: ``name``, except that a
    schedule that is a method's own constant of a kind no fixed tau has (adaptive temperature: each row's tau set
    inside the pass from the row itself) is exported as that method. Why: Calibrate's "Export as fixed tau" of
    adaptive temperature wrote ``method: fixed`` beside the adaptive schedule, a file that says fixed and runs
    adaptive."""
    if schedule is None or not get(name).takes_value or not Schedule.of(schedule).adaptive:
        return name
    return next(n for n, m in REGISTRY.items() if m.constant is not None and m.constant == Schedule.of(schedule))
