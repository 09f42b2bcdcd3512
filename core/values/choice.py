"""What a run asks of the attention, as one value: :class:`Choice`.

A run's choices are the temperature method, the tau :class:`~core.values.schedule.Schedule`
it resolved to, which attentions the schedule touches (``targets``), the
CosScale value of a cosine-attention model, the position
:class:`~core.values.positions.Scheme` of a rotary model, and the method's own
numbers (``method_params``: critical scaling's gamma). They enter at the edges (a
settings file, the CLI's options, a URL, the app's controls, a
``core.runs.apply`` argument), where :meth:`Choice.of` checks each part once, and
from there the same frozen, hashable object travels unchanged: through
:func:`core.runs.engine.run`, the app's cache keys and page state, to the
attention function's call (:func:`core.mechanics.attention.attention_call`). How
the run goes (probes, block budget, generation, device) is the run's second
value, :class:`core.mechanics.run_pass.Pass`.

Forms on the way: a tau is a float (or list, or row rule) at the edge, a
:class:`Schedule` from :meth:`Choice.of` to the attention, and a tensor inside
it; a scheme is text at the edge and a :class:`Scheme` everywhere after, bound
to a pass's length only inside the attention call.

Why one value: these parts used to live, a few at a time, in six containers
(settings, run settings, attention settings, a method query, two sidebar
records), each copying the others field by field and re-checking the tau and
the scheme; one that passed one check could fail another deep in a pass.
:class:`Choice` refuses a part that was not checked (``tau`` must already be
a :class:`Schedule`, ``scheme`` a :class:`Scheme`), so "validated once" holds
by construction, and :meth:`Choice.with_` is the one way to change a part.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

from core.errors import UserError
from core.kinds import ENCODER, KINDS
from core.values.positions import PLAIN_SCHEME, Scheme
from core.values.schedule import ONE, Schedule

#: What the paper's tau divides: encoder self-attention only.
ENCODER_ONLY: tuple[str, ...] = (ENCODER,)


@dataclass(frozen=True)
class Choice:
    """Method, tau schedule, targets, CosScale and position scheme of one run (see the module docstring).

    ``method``: the registry name the schedule came from (None: a schedule handed over as it is, e.g. by
    ``core.runs.apply``); ``tau``: the resolved :class:`Schedule`; ``targets``: the attentions (``encoder``,
    ``decoder``, ``cross``) the schedule and ``cosine_scale`` touch; ``cosine_scale``: the s of
    ``s * cos(q, k)`` for a cosine-attention model (None: its trained s); ``scheme``: a rotary model's position
    scheme (applied to encoder self-attention, bound per pass to that pass's length); ``method_params``: the
    method's own numbers by name (critical scaling's ``gamma``), as sorted ``(name, value)`` pairs so the choice
    stays hashable (a cache key); :attr:`params` reads them as a dict. Which names a method takes is the method
    registry's to say (:func:`core.runs.methods.check_params`, at the edges that name a method); here they are
    only finite numbers by name."""

    method: str | None = None
    tau: Schedule = ONE
    targets: tuple[str, ...] = ENCODER_ONLY
    cosine_scale: float | None = None
    scheme: Scheme = PLAIN_SCHEME
    method_params: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        # Types only: the values were checked where they entered (Choice.of, Schedule.of, Scheme.of).
        if not isinstance(self.tau, Schedule):
            raise TypeError("Choice.tau must be a Schedule (Schedule.of at the edge, or Choice.of)")
        if not isinstance(self.scheme, Scheme):
            raise TypeError("Choice.scheme must be a Scheme (Scheme.of at the edge, or Choice.of)")
        if not isinstance(self.targets, tuple) or any(t not in KINDS for t in self.targets):
            raise TypeError(f"Choice.targets must be a tuple of {KINDS}")
        if self.cosine_scale is not None and not isinstance(self.cosine_scale, float):
            raise TypeError("Choice.cosine_scale must be a float or None (Choice.of checks it)")
        if not (
            isinstance(self.method_params, tuple)
            and all(
                isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], float)
                for p in self.method_params
            )
        ) or list(self.method_params) != sorted(self.method_params):
            raise TypeError("Choice.method_params must be sorted (name, float) pairs (Choice.of makes them)")

    @property
    def params(self) -> dict[str, float]:
        """The method's own numbers by name (``{"gamma": 0.2}``), what :func:`core.runs.methods.resolve` takes."""
        return dict(self.method_params)

    @classmethod
    def of(
        cls,
        method: str | None = None,
        tau: Any = None,
        targets: Any = None,
        cosine_scale: Any = None,
        scheme: Any = None,
        method_params: Any = None,
    ) -> "Choice":
        """A choice from edge values, each checked once; a :class:`UserError` in one line naming the part.

        ``tau``: anything :meth:`Schedule.of` accepts (None: 1); ``targets``: a kind or a sequence of kinds
        (None: encoder only; an empty sequence: none); ``cosine_scale``: a positive finite number or None; ``scheme``: anything
        :meth:`Scheme.of` accepts (None: plain); ``method_params``: a mapping (or pairs) of names to finite
        numbers (None: none). ``method`` is a name the caller took from the registry (the registry's own parser,
        :func:`core.runs.methods.parse`, reads method texts)."""
        try:
            schedule = ONE if tau is None else Schedule.of(tau)
        except ValueError as err:
            raise UserError(str(err)) from None
        return cls(
            method, schedule, targets_of(targets), _cosine(cosine_scale), Scheme.of(scheme), _params(method_params)
        )

    def acts_plain(self, config: Any, train_length: int, length: int, rows: int | None = None) -> bool:
        """Whether this choice, on a model with ``config`` trained at ``train_length``, computes the model's own
        attention on an input of ``length`` tokens: tau 1 on every one of ``rows`` query rows (default ``length``;
        a decoder's answer adds its new tokens' rows), no CosScale, and a position scheme that is the identity
        there (:meth:`core.values.positions.Bound.is_identity`, bound to ``length`` as a pass binds it). Two such
        choices give the same pass bit for bit, so tables share it (:mod:`core.experiments.perplexity`,
        :mod:`core.experiments.sweep`)."""
        if self.cosine_scale is not None or not self.tau.is_one_over(length if rows is None else rows):
            return False
        return self.scheme.is_plain or self.scheme.bind(train_length, length).is_identity(config)

    def with_(self, **parts: Any) -> "Choice":
        """This choice with some parts changed, each new part checked as :meth:`of` checks it (the one way to
        change a part: a copy, never a mutation)."""
        unknown = sorted(set(parts) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"Choice has no part(s) {unknown}")
        checked = Choice.of(**{**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, **parts})
        return self if checked == self else checked


def targets_of(value: Any) -> tuple[str, ...]:
    """The one check of a run's targets (the attentions a schedule touches): a kind or a sequence of kinds, each
    once in the order given (None: encoder only; an empty sequence: none), or a :class:`UserError` in one line.
    :meth:`Choice.of` calls it, and so do the edges that read targets before a Choice exists (the settings file's
    schema, the CLI's ``--targets`` type), so no edge has a rule of its own."""
    if value is None:
        return ENCODER_ONLY
    items = (value,) if isinstance(value, str) else value
    try:
        out = tuple(items)
    except TypeError:
        raise UserError(f"targets must be some of {', '.join(KINDS)}") from None
    bad = [t for t in out if t not in KINDS]
    if bad:  # none at all is a choice too: tau then touches nothing (the app's three boxes unticked)
        raise UserError(f"targets must be some of {', '.join(KINDS)} (got {', '.join(map(str, bad))[:60]})")
    return tuple(dict.fromkeys(out))  # each once, in the order given


def _params(value: Any) -> tuple[tuple[str, float], ...]:
    if value is None:
        return ()
    try:
        items = list(value.items()) if hasattr(value, "items") else [tuple(p) for p in value]
    except TypeError:
        raise UserError('method parameters must be numbers by name (e.g. {"gamma": 0.2})') from None
    out = {}
    for item in items:
        if len(item) != 2 or not isinstance(item[0], str):
            raise UserError('method parameters must be numbers by name (e.g. {"gamma": 0.2})')
        name, v = item
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
            raise UserError(f"method parameter {name} must be a finite number (got {str(v)[:40]!r})")
        out[name] = float(v)
    return tuple(sorted(out.items()))


def _cosine(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UserError(f"the CosScale s must be a positive number (got {str(value)[:40]!r})")
    try:
        v = float(value)
    except OverflowError:
        raise UserError(f"the CosScale s must be a positive finite number (got {str(value)[:40]})") from None
    if not (math.isfinite(v) and v > 0):
        raise UserError(f"the CosScale s must be a positive finite number (got {v:g})")
    return v


#: tau = 1, encoder targets, the trained s, the plain scheme: the numbers of the model as trained (with no method
#: named: the registry's name for it is ``core.runs.methods.AS_TRAINED``).
TRAINED = Choice()
