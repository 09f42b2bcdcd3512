"""How long a forward pass takes here: measured pass times, and estimates for work not yet started.

:mod:`core.runs.engine` records every encoder pass it runs (seconds per document,
keyed by the model and the document's token count); pages ask
:func:`estimate` before long work ("Algorithm 1 will run 12 passes: about
9 s") and :func:`describe` turns seconds into words.

The record is process-wide and thread-safe: Streamlit runs each session's
script in its own thread, and background work may run passes too.

Estimates come from the measured length nearest to the one asked for,
scaled by ``(tokens / measured) ** k``. ``k`` is 2 (attention's cost grows
with the square of the length) when one length has been measured; with two
or more, ``k`` is read off the two measured lengths nearest the asked one and
kept within [1, 2], because at short lengths the linear parts of the model
(feed-forward, projections) dominate and a pure square law overshoots.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections import deque
from collections.abc import Hashable

#: Kinds of work recorded: the encoder pass (probes included) and answer generation from its output.
ENCODE, GENERATE = "encode", "generate"
#: Measurements kept per (model, kind, length); the median of these is the length's pass time.
KEEP = 5

_lock = threading.Lock()
_times: dict[tuple[Hashable, str], dict[int, deque]] = {}


def model_key(loaded) -> tuple:
    """What identifies a model's speed: where it came from, its device and dtype (not its L_tr)."""
    spec = getattr(loaded, "spec", None)
    source = getattr(spec, "source", None) or getattr(spec, "name", None) or repr(spec)
    return (str(source), str(getattr(loaded, "device", "")), str(getattr(loaded, "dtype", "")))


def record(model_key: Hashable, tokens: int, seconds: float, kind: str = ENCODE) -> None:
    """Note that one pass of ``kind`` over ``tokens`` tokens took ``seconds`` (per document)."""
    tokens, seconds = int(tokens), float(seconds)
    if tokens <= 0 or not math.isfinite(seconds) or seconds < 0:
        return
    with _lock:
        per_len = _times.setdefault((model_key, kind), {})
        per_len.setdefault(tokens, deque(maxlen=KEEP)).append(seconds)


def measured(model_key: Hashable, kind: str = ENCODE) -> dict[int, float]:
    """length -> median measured seconds per pass (a copy; empty when nothing was measured)."""
    with _lock:
        per_len = _times.get((model_key, kind), {})
        return {n: statistics.median(v) for n, v in sorted(per_len.items()) if v}


def estimate(model_key: Hashable, tokens: int, kind: str = ENCODE) -> float | None:
    """Seconds one pass of ``kind`` over ``tokens`` tokens should take; None when this model has no measurement."""
    m = measured(model_key, kind)
    if not m or tokens <= 0:
        return None
    lengths = sorted(m)
    nearest = min(lengths, key=lambda n: (abs(math.log(n / tokens)), -n))
    if nearest == tokens:
        return m[nearest]
    exponent = 2.0
    if len(lengths) >= 2:
        # the two measured lengths nearest the asked one (on a log scale), for the local growth
        a, b = sorted(sorted(lengths, key=lambda n: abs(math.log(n / tokens)))[:2])
        if m[a] > 0 and m[b] > 0:
            exponent = min(2.0, max(1.0, math.log(m[b] / m[a]) / math.log(b / a)))
    return m[nearest] * (tokens / nearest) ** exponent


def clear(model_key: Hashable | None = None) -> None:
    """Forget the measurements of one model (all kinds), or of every model."""
    with _lock:
        if model_key is None:
            _times.clear()
        else:
            for k in [k for k in _times if k[0] == model_key]:
                del _times[k]


def describe(seconds: float | None) -> str:
    """Seconds in words: 'under 1 s', 'about 8 s', 'about 2 min', 'about 1.5 h'."""
    if seconds is None or not math.isfinite(seconds):
        return "unknown"
    if seconds < 1:
        return "under 1 s"
    if seconds < 90:
        return f"about {round(seconds):d} s"
    if seconds < 90 * 60:
        return f"about {round(seconds / 60):d} min"
    return f"about {seconds / 3600:.1f} h"


def total(model_key: Hashable, passes: list[tuple[int, int]], kind: str = ENCODE) -> float | None:
    """Estimated seconds for ``passes`` ((count, tokens) pairs); None when any length has no estimate."""
    out = 0.0
    for count, tokens in passes:
        if count <= 0:
            continue
        e = estimate(model_key, tokens, kind)
        if e is None:
            return None
        out += count * e
    return out


def basis(model_key: Hashable, tokens: int, kind: str = ENCODE) -> str:
    """Where an estimate at ``tokens`` comes from: '0.75 s per pass, measured here' or '... scaled from 256 tokens'."""
    m = measured(model_key, kind)
    per = estimate(model_key, tokens, kind)
    if per is None:
        return "no pass timed on this model yet"
    if tokens in m:
        return f"measured {per:.2g} s per pass here"
    near = min(m, key=lambda n: (abs(math.log(n / tokens)), -n))
    return f"{per:.2g} s per pass, scaled from a {near:,}-token pass timed here"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def plan_note(
    what: str, model_key: Hashable, passes: list[tuple[int, int]], kind: str = ENCODE, name_all: bool = False
) -> str:
    """One sentence before long work: '<what> will run 12 encoder passes at 2,045 tokens: about 9 s on this
    machine (measured 0.75 s per pass here).'

    ``passes``: (count, tokens) pairs, e.g. ``[(11, 2045), (1, 256)]`` for a grid and its L_tr reference; the
    first pair is the one named in the sentence (``name_all``: every length is named). Without a measurement
    for this model, only the count is said.
    """
    passes = [(int(c), int(n)) for c, n in passes if c > 0]
    if not passes:
        return f"{what} needs no new encoder pass."
    count, tokens = passes[0]
    extra = sum(c for c, _ in passes[1:])
    if name_all:
        count, extra = count + extra, 0
        lengths = sorted({n for _, n in passes})
        where = f"at {_and([f'{n:,}' for n in lengths])} tokens"
    else:
        where = f"at {tokens:,} tokens"
    head = f"{what} will run {count:,} encoder pass{'es' if count != 1 else ''} {where}"
    if extra:
        head += f" (plus {extra:,} more)"
    secs = total(model_key, passes, kind)
    if secs is None:
        return head + "; no pass has been timed on this model yet, so there is no time estimate."
    return f"{head}: {describe(secs)} on this machine ({basis(model_key, tokens, kind)})."


def remaining(elapsed: float, fraction: float) -> float | None:
    """Seconds left when ``fraction`` of the work took ``elapsed`` seconds (None before any progress)."""
    if fraction <= 0 or fraction > 1:
        return None
    return elapsed * (1 - fraction) / fraction


def remaining_weighted(elapsed: float, done_weight: float, left_weight: float) -> float | None:
    """Seconds left when work of ``done_weight`` took ``elapsed`` and work of ``left_weight`` remains
    (weights: planned costs, e.g. estimated seconds per item; the observed rate rescales them)."""
    if done_weight <= 0:
        return None
    return elapsed * max(0.0, left_weight) / done_weight


def progress_text(label: str, fraction: float, elapsed: float, planned: float | None = None) -> str:
    """A progress bar's text: the label, the share done and the time left (from the rate so far, or the plan)."""
    left = remaining(elapsed, fraction)
    if left is None and planned is not None:
        left = max(0.0, planned - elapsed)
    text = f"{label} {max(0.0, min(1.0, fraction)):.0%}"
    if left is not None and fraction < 1:
        text += f" · {describe(left)} left"
    return text


def algorithm1_passes(grid_size: int, fast: bool, criteria: int = 2) -> int:
    """Encoder passes (per document) Algorithm 1 runs over a grid for ``criteria`` criteria sharing their passes.

    The full grid evaluates every point once for all criteria. Bisection
    evaluates both ends (shared) and at most ceil(log2(n - 1)) midpoints per
    criterion: an upper bound, as criteria often share midpoints too.
    """
    if grid_size <= 0:
        return 0
    if not fast:
        return grid_size
    if grid_size <= 2:
        return grid_size
    return 2 + criteria * math.ceil(math.log2(grid_size - 1))


def sweep_passes(
    lengths: list[int],
    cells_per_length: int,
    costs: list[tuple[int, int]],
    train_length: int,
) -> list[tuple[int, int]]:
    """(count, tokens) encoder passes a sweep runs: one per cell, plus calibrating its measured methods once per
    length. ``costs``: each measured method's passes ``(at the length, at L_tr)``, as the method registry
    states them for the calibration documents (:func:`core.runs.methods.costs`; upper bounds where a bisection
    decides)."""
    out: dict[int, int] = {}

    def add(n: int, c: int) -> None:
        if c > 0:
            out[int(n)] = out.get(int(n), 0) + int(c)

    for n in lengths:
        add(n, cells_per_length)
        for here, at_train in costs:
            add(n, here)
            add(train_length, at_train)
    # the longest length first: the sentence names it
    return sorted(((c, n) for n, c in out.items()), key=lambda t: -t[1])


# -- a time budget: refused before it starts, stopped at the next layer when it runs over ------------------------

#: The largest ``--max-seconds``: a week (a larger budget bounds nothing).
MAX_BUDGET_S = 7 * 24 * 3600.0


class OutOfTime(Exception):
    """A pass went past its time budget and was stopped at the next layer (:meth:`Budget.check`)."""


class Budget:
    """A wall-clock budget of ``seconds`` for one command, counted from its making (``None``: no bound).

    :meth:`refuse` turns an estimate over the budget into a :class:`~core.errors.UserError` before work starts;
    :meth:`check` (what :func:`core.mechanics.attention.between_layers` calls before each attention call) raises
    :class:`OutOfTime` once the budget is spent, so a pass that overruns stops at the next layer, its partial
    results dropped. ``clock``: a monotonic clock (tests pass their own)."""

    def __init__(self, seconds: float | None, option: str = "--max-seconds", clock=None):
        import time

        if seconds is not None and not (math.isfinite(seconds) and 0 < seconds <= MAX_BUDGET_S):
            from core.errors import UserError

            raise UserError(
                f"{option} must be a number of seconds above 0 and at most {MAX_BUDGET_S:,.0f} (got {seconds!r})"
            )
        self.seconds = seconds
        self.option = option
        self._clock = clock or time.monotonic
        self.t0 = self._clock()

    def elapsed(self) -> float:
        return self._clock() - self.t0

    def left(self) -> float | None:
        """Seconds still to spend (None: no bound)."""
        return None if self.seconds is None else self.seconds - self.elapsed()

    def refuse(self, estimate: float | None, what: str) -> None:
        """A :class:`~core.errors.UserError` when ``estimate`` seconds of ``what`` do not fit what is left."""
        left = self.left()
        if left is None or estimate is None or estimate <= left:
            return
        from core.errors import UserError

        raise UserError(
            f"{what} would take {describe(estimate)} here ({estimate:.0f} s), over {self.option} "
            f"{self.seconds:g} ({max(0.0, left):.0f} s left); raise {self.option} or ask for less"
        )

    def check(self) -> None:
        """Raise :class:`OutOfTime` once the budget is spent (nothing without a bound)."""
        if self.seconds is not None and self.elapsed() > self.seconds:
            raise OutOfTime(
                f"{self.option} {self.seconds:g} reached after {self.elapsed():.1f} s; "
                "the pass under way was stopped at its next layer"
            )
