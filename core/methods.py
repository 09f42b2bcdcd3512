"""The temperature methods, one registry entry each: what the CLI, the app, sweeps and tables offer.

A method turns a document (and the model) into a tau schedule: a number, or
one number per encoder layer. Each :class:`Method` says how to show it
(``label``, ``short``, ``help``), what it costs (``measured``: it needs
forward passes) and whether its tau changes with the input's length
(``length_dependent``: re-resolve it at another length), and carries its
``resolve`` function. Everything that lists or resolves methods reads
:data:`REGISTRY`, so adding a method is one entry here plus its test.

The maths lives in :mod:`core.temperature` (closed forms, Algorithm 1's
searches); the passes they need come from :mod:`core.calibration`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from core import temperature
from core.errors import UserError

if TYPE_CHECKING:  # the registry itself stays light: the CLI checks names before torch is imported
    from core import engine, tasks
    from core.models import Loaded

Schedule = float | list
Progress = Callable[[float], None]


@dataclass(frozen=True)
class Query:
    """What a method may use to resolve: the model, the document and its length, and how hard to try."""

    loaded: "Loaded"
    document: "tasks.Document"
    tokens: int
    samples: int = 1
    base: "engine.RunSettings | None" = None
    progress: Progress | None = None

    @property
    def train_length(self) -> int:
        return self.loaded.train_length


Formula = Callable[[int, int, int, "dict | None"], float]  # (L_tr, L, d_kv, tau = 1 logit statistics) -> tau


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
    resolve: Callable[[Query], tuple[Schedule, dict]] | None  # None: the user gives tau (``fixed``)
    formula: Formula | None = None
    stats: bool = False


def formula(name: str, train_length: int, length: int, d_kv: int, stats: dict | None = None) -> float:
    """A closed-form method's tau; :class:`UserError` (with the reason) where its model has no answer."""
    m = get(name)
    if m.formula is None:
        raise UserError(f"Method '{name}' has no closed form")
    if m.stats and stats is None:
        raise UserError(f"{m.short} needs layer 0's logit statistics at L_tr and at this length")
    try:
        return float(m.formula(train_length, length, d_kv, stats))
    except ValueError as err:
        raise UserError(f"{name}: {err}") from None


def closed_forms(train_length: int, length: int, d_kv: int, stats: dict | None) -> dict[str, float | str]:
    """Every closed-form method's tau at this length; where a form has no answer, ``"n/a (why)"`` (for tables)."""
    out: dict[str, float | str] = {}
    for name in FORMULAS:
        try:
            out[name] = formula(name, train_length, length, d_kv, stats)
        except UserError as err:
            out[name] = f"n/a ({err})"
    return out


def _none(q: Query) -> tuple[Schedule, dict]:
    return 1.0, {}


def _closed(name: str) -> Callable[[Query], tuple[Schedule, dict]]:
    def resolve(q: Query) -> tuple[Schedule, dict]:
        m = REGISTRY[name]
        st = None
        if m.stats:
            from core import calibration

            st = calibration.logit_stats(q.loaded, q.document, q.base)
        tau = formula(name, q.train_length, q.tokens, q.loaded.d_kv, st)
        return tau, (st if st is not None else {"d": q.loaded.d_kv} if name == "infoscale" else {})

    return resolve


def _llama4(q: Query) -> tuple[Schedule, dict]:
    from core.attention import RowTau

    rows = RowTau(floor_scale=q.train_length, attn_scale=LLAMA4_ATTN_SCALE)
    return rows, {"rows": rows.to_dict(), "mean_tau": rows.mean(q.tokens)}


#: Llama 4's ``attn_scale`` (its config's default, 0.1); its ``floor_scale`` here is the model's L_tr.
LLAMA4_ATTN_SCALE = 0.1


def _algorithm1(criterion: str, refined: bool = False) -> Callable[[Query], tuple[Schedule, dict]]:
    def resolve(q: Query) -> tuple[Schedule, dict]:
        from core import calibration

        cal = calibration.calibrate(q.loaded, q.document, criterion, fast=True, samples=q.samples, base=q.base,
                                    progress=q.progress, refined=refined)
        return (cal.schedule if cal.schedule is not None else cal.tau), cal.to_dict()

    return resolve


REGISTRY: dict[str, Method] = {m.name: m for m in (
    Method("none", "none (tau = 1)", "tau = 1", "No temperature: the model as trained.",
           measured=False, length_dependent=False, resolve=_none),
    Method("fixed", "fixed tau (slider)", "fixed tau", "A tau you choose, the same at every length.",
           measured=False, length_dependent=False, resolve=None),
    Method("log-length", "log-length: log L_tr / log L", "log-length",
           "The paper's baseline: tau = log L_tr / log L keeps a log-length normaliser constant.",
           measured=False, length_dependent=True, resolve=_closed("log-length"),
           formula=lambda lt, n, d, st: temperature.log_length(lt, n)),
    Method("yarn", "YaRN attention factor", "YaRN",
           "Peng et al. (2023), used by today's RoPE-scaled models: logits x (0.1 ln s + 1)^2 with s = L / L_tr, "
           "i.e. tau = (0.1 ln s + 1)^-2 (0.685 at 8x).",
           measured=False, length_dependent=True, resolve=_closed("yarn"),
           formula=lambda lt, n, d, st: temperature.yarn(lt, n)),
    Method("log-n", "log-n (Qwen), fixed s", "log-n",
           "Qwen's logn attention: queries scaled by log_{L_tr}(n) past L_tr, n the keys a row sees. In this "
           "bidirectional encoder every row sees all L keys, so tau = log L_tr / log L: equal to log-length here "
           "(in a causal decoder row i sees i + 1 keys and the scale grows along the rows).",
           measured=False, length_dependent=True, resolve=_closed("log-n"),
           formula=lambda lt, n, d, st: temperature.log_length(lt, n)),
    Method("ssmax", "Scalable-Softmax, s = 1 / log L_tr", "SSMax",
           "Nakanishi (2025): softmax of s log(n) x logits, n the keys a row sees; with s fixed so that "
           "s log L_tr = 1 (tau = 1 at L_tr), tau = log L_tr / log L in an encoder: equal to log-length here.",
           measured=False, length_dependent=True, resolve=_closed("ssmax"),
           formula=lambda lt, n, d, st: temperature.log_length(lt, n)),
    Method("llama4", "Llama 4 attention temperature tuning", "Llama 4",
           "Meta's Llama 4: row p's logits x (0.1 ln(1 + floor((p + 1) / L_tr)) + 1) (attn_scale 0.1, floor_scale "
           "= L_tr), a tau per query row: rows before L_tr keep tau = 1, the row at 4 L_tr gets 1 / (1 + 0.1 ln 5). "
           "Shown as its mean over the rows.",
           measured=False, length_dependent=False, resolve=_llama4),
    Method("infoscale", "InfoScale", "InfoScale",
           "Li et al. (ICML 2025): tau = 1 / lambda, lambda = sqrt(1 - n^(-2/d)) / sqrt(1 - n_tr^(-2/d)), d = d_kv.",
           measured=False, length_dependent=True, resolve=_closed("infoscale"),
           formula=lambda lt, n, d, st: temperature.infoscale(lt, n, d)),
    Method("pmax", "Algorithm 1, Pmax", "Alg. 1 Pmax",
           "Algorithm 1: the grid tau whose mean Pmax at this length matches the mean at L_tr with tau = 1.",
           measured=True, length_dependent=True, resolve=_algorithm1("pmax")),
    Method("entropy", "Algorithm 1, entropy", "Alg. 1 entropy",
           "Algorithm 1 on the mean attention entropy instead of Pmax.",
           measured=True, length_dependent=True, resolve=_algorithm1("entropy")),
    Method("pmax-refined", "Algorithm 1, Pmax, refined", "Alg. 1 Pmax refined",
           "Algorithm 1's Pmax match at the crossing itself (bisection between grid points), going below the "
           f"grid's 0.5 down to {temperature.TAU_FLOOR:g} when the grid is not enough.",
           measured=True, length_dependent=True, resolve=_algorithm1("pmax", refined=True)),
    Method("entropy-refined", "Algorithm 1, entropy, refined", "Alg. 1 entropy refined",
           "Algorithm 1's entropy match at the crossing itself, below the grid's end when needed.",
           measured=True, length_dependent=True, resolve=_algorithm1("entropy", refined=True)),
    Method("prop1", "Prop. 1 (match Pmax)", "Prop. 1",
           "The paper's closed form matching Pmax, from layer 0's logit spread at L_tr and here.",
           measured=True, length_dependent=True, resolve=_closed("prop1"), stats=True,
           formula=lambda lt, n, d, st: temperature.prop1(lt, n, st["pmax_tr"], st["sigma_tr"], st["sigma_ex"])),
    Method("prop2", "Prop. 2 (match entropy)", "Prop. 2",
           "The paper's closed form matching entropy, from layer 0's logit spread at L_tr and here.",
           measured=True, length_dependent=True, resolve=_closed("prop2"), stats=True,
           formula=lambda lt, n, d, st: temperature.prop2(lt, n, st["sigma_tr"], st["sigma_ex"])),
    Method("per-layer", "per-layer Algorithm 1 (Pmax)", "per-layer Alg. 1",
           "Algorithm 1 for each encoder layer on its own (the paper's suggested extension): one tau per layer.",
           measured=True, length_dependent=True, resolve=_algorithm1("per-layer")),
    Method("per-head", "per-head Algorithm 1 (Pmax)", "per-head Alg. 1",
           "Algorithm 1 for each head on its own, matched to that head's Pmax at L_tr; heads that cannot reach "
           "theirs in the grid stay at tau = 1 and are listed. One tau per layer and head.",
           measured=True, length_dependent=True, resolve=_algorithm1("per-head")),
)}

#: Every method a user can name, in the order menus show them.
NAMES: tuple[str, ...] = tuple(REGISTRY)
#: Methods that need forward passes to resolve.
MEASURED: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.measured)
#: Methods whose tau depends on the document length (re-resolve them at a new length).
LENGTH_DEPENDENT: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.length_dependent)
#: Methods with a closed form (:func:`formula`).
FORMULAS: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.formula is not None)


def label(name: str) -> str:
    """The method's label for menus and cards (the name itself for anything unknown, e.g. a fixed tau)."""
    m = REGISTRY.get(name)
    return m.label if m is not None else str(name)


def method_label(m: str | float) -> str:
    """A method name, or a number meaning a fixed tau (``0.8`` -> ``"tau=0.8"``); ValueError for anything else.

    The column value of sweeps and batch runs, and the check of the CLI's
    ``--methods`` items: one place decides what a method list may hold.
    """
    try:
        tau = float(m)
    except (TypeError, ValueError):
        if m not in NAMES or m == "fixed":
            raise ValueError(f"Unknown method '{m}'; use a number (fixed tau) or one of {', '.join(NAMES)}") from None
        return str(m)
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"a fixed tau must be finite and > 0, got {m!r}")
    return f"tau={tau:g}"


def get(name: str) -> Method:
    """The registry entry, or a :class:`UserError` listing the names."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise UserError(f"Unknown method '{name}'; choose from {', '.join(NAMES)}") from None


def resolve(
    loaded: "Loaded",
    document: "tasks.Document",
    method: str,
    tau: Schedule | None = None,
    samples: int = 1,
    base: "engine.RunSettings | None" = None,
    progress: Progress | None = None,
    chosen_at: int | None = None,
    tokens: int | None = None,
) -> tuple[Schedule, dict]:
    """The schedule a method gives for this document, and what it was computed from.

    Returns ``(schedule, info)``. A stored ``tau`` (from a settings file) is
    used as is for ``fixed``, and for a length-dependent method only when it
    was chosen at exactly this document's length (``chosen_at``); any other
    length re-resolves the method here. ``info["source"]`` says which
    happened (``none``, ``fixed``, ``stored`` or ``resolved``).
    """
    m = get(method)
    if m.name == "none":
        return 1.0, {"source": "none"}
    if m.resolve is None:
        if tau is None:
            raise UserError(f"Method '{m.name}' needs a tau (--tau)", app=f"Method '{m.label}' needs a tau: move the tau slider.")
        return tau, {"source": "fixed"}
    n = tokens if tokens is not None else len(loaded.tokenizer(document.text).input_ids)
    if tau is not None and chosen_at == n:
        return tau, {"source": "stored", "chosen_at": chosen_at, "length": n}
    schedule, extra = m.resolve(Query(loaded, document, n, samples, base, progress))
    return schedule, {"source": "resolved", "chosen_at": chosen_at, "length": n, "train_length": loaded.train_length,
                      **extra}


def all_methods(loaded: "Loaded", document: "tasks.Document", samples: int = 1,
                progress: Progress | None = None) -> dict[str, Schedule | str]:
    """Every method's tau for this document (errors become a short string), for tables."""
    out: dict[str, Schedule | str] = {}
    names = [n for n, m in REGISTRY.items() if m.resolve is not None and n != "none"]
    for i, name in enumerate(names):
        try:
            out[name] = resolve(loaded, document, name, samples=samples)[0]
        except UserError as err:
            out[name] = f"n/a ({err})"
        if progress:
            progress((i + 1) / len(names))
    return out
