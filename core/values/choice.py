"""What a run asks of the attention, as one value: :class:`Choice`.

A run's choices are the temperature method, the tau :class:`~core.values.schedule.Schedule`
it resolved to, which attentions the schedule touches (``targets``), the
CosScale value of a cosine-attention model, and the position
:class:`~core.values.positions.Scheme` of a rotary model. They enter at the edges (a
settings file, the CLI's options, a URL, the app's controls, a
``core.runs.apply`` argument), where :meth:`Choice.of` checks each part once, and
from there the same frozen, hashable object travels unchanged: in
:class:`core.runs.settings.Settings`, :class:`core.runs.engine.RunSettings`, the app's
context and cache keys, to the attention function.

Why one value: these five used to live, a few at a time, in six containers
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
    scheme (applied to encoder self-attention, bound per pass to that pass's length)."""

    method: str | None = None
    tau: Schedule = ONE
    targets: tuple[str, ...] = ENCODER_ONLY
    cosine_scale: float | None = None
    scheme: Scheme = PLAIN_SCHEME

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

    @classmethod
    def of(cls, method: str | None = None, tau: Any = None, targets: Any = None, cosine_scale: Any = None,
           scheme: Any = None) -> "Choice":
        """A choice from edge values, each checked once; a :class:`UserError` in one line naming the part.

        ``tau``: anything :meth:`Schedule.of` accepts (None: 1); ``targets``: a kind or a sequence of kinds
        (None: encoder only; an empty sequence: none); ``cosine_scale``: a positive finite number or None; ``scheme``: anything
        :meth:`Scheme.of` accepts (None: plain). ``method`` is a name the caller took from the registry (the
        registry's own parser, :func:`core.runs.methods.parse`, reads method texts)."""
        try:
            schedule = ONE if tau is None else Schedule.of(tau)
        except ValueError as err:
            raise UserError(str(err)) from None
        return cls(method, schedule, _targets(targets), _cosine(cosine_scale), Scheme.of(scheme))

    def with_(self, **parts: Any) -> "Choice":
        """This choice with some parts changed, each new part checked as :meth:`of` checks it (the one way to
        change a part: a copy, never a mutation)."""
        unknown = sorted(set(parts) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"Choice has no part(s) {unknown}")
        checked = Choice.of(**{**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, **parts})
        return self if checked == self else checked


def given(choice: "Choice | None", parts: dict[str, Any], owner: str) -> Choice:
    """The Choice a settings object holds: ``choice`` (None: the model as trained) with ``parts`` given by name
    changed through :meth:`Choice.with_` (the short form ``RunSettings(tau=0.7)``); a part ``Choice`` does not
    have, or a ``choice`` that is not one, is a TypeError naming ``owner``. One rule for
    :class:`core.runs.engine.RunSettings` and :class:`core.mechanics.attention.AttentionSettings`."""
    unknown = sorted(set(parts) - {f.name for f in dataclasses.fields(Choice)})
    if unknown:
        raise TypeError(f"{owner} got unexpected argument(s) {unknown}")
    choice = Choice() if choice is None else choice
    if not isinstance(choice, Choice):
        raise TypeError(f"{owner}.choice must be a core.values.choice.Choice")
    return choice.with_(**parts) if parts else choice


def _targets(value: Any) -> tuple[str, ...]:
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
