"""How long a forward pass takes here: measured pass times, and estimates for work not yet started.

:mod:`core.runs.engine` records every encoder pass it runs (seconds per document,
keyed by the model and the document's token count); pages ask
:func:`estimate` before long work ("Algorithm 1 will run 12 passes: about
9 s") and :func:`describe` turns seconds into words.

The record is process-wide and thread-safe: Streamlit runs each session's
script in its own thread, and background work may run passes too.

Before a long pass (:func:`core.runs.engine.estimate_pass`) a model's time is ``a + b n + c n^2``, the encoder's
as the decoder-only LM's: ``c`` is one attention call of the model's shape timed here (:func:`attention_per_pair`:
causal rows for a decoder, all-pairs rows with T5's relative bias for an encoder), ``a`` and ``b`` the line through
two short timed passes once ``c n^2`` is taken off (:func:`quadratic_fit`). Why not a short sample's time scaled by
the square of the length: the linear layers (projections, feed-forward, a T5's decoder reading the encoder) are a
quarter of the default T5's 2,048-token pass and half of SmolLM2's 8k pass, so the square law said 22 s for a
16 s pass at 8k (T5) and "about 3 min" for SmolLM2's 8k; bench/README.md gives how close the fit comes.

Estimates from recorded passes: between and below the measured lengths, the measured length nearest to the
one asked for, scaled by ``(tokens / measured) ** k``, ``k`` read off the two measured lengths nearest the asked
one and kept within [1, 2] (2 with one length measured). Past the longest measured length, ``b n + c n^2``
through the two longest (:func:`_extrapolate`): a power law read off two short lengths keeps their mostly
linear growth, and said 12 s for a 16 s pass at 8k. When :func:`core.runs.engine.estimate_pass` has fitted
``a + b n + c n^2`` for the model (:func:`remember_law`), that law answers past the longest recorded pass.

A progress bar's time left (:class:`Countdown`) never rises: the larger of the plan's and the rate's remainder,
held to a countdown, and "taking longer than estimated" once the countdown is spent (Calibrate's bar said
"18 % - under 1 s left", then "41 % - about 19 s left": its first steps were passes already made).
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
#: model key -> ``(a, b, c)`` of the last ``a + b n + c n^2`` fitted here (:func:`remember_law`).
_laws: dict[Hashable, tuple[float, float, float]] = {}


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
    if tokens > lengths[-1] and kind == ENCODE:
        fitted = law(model_key)
        if fitted is not None:  # measured here for this model: better than scaling short passes up
            a, b, c = fitted
            return a + b * tokens + c * tokens**2
    if len(lengths) >= 2 and tokens > lengths[-1]:
        p, q = lengths[-2], lengths[-1]
        return _extrapolate(p, m[p], q, m[q], tokens)
    exponent = 2.0
    if len(lengths) >= 2:
        # the two measured lengths nearest the asked one (on a log scale), for the local growth
        a, b = sorted(sorted(lengths, key=lambda n: abs(math.log(n / tokens)))[:2])
        if m[a] > 0 and m[b] > 0:
            exponent = min(2.0, max(1.0, math.log(m[b] / m[a]) / math.log(b / a)))
    return m[nearest] * (tokens / nearest) ** exponent


def remember_law(model_key: Hashable, a: float, b: float, c: float) -> None:
    """Keep the ``a + b n + c n^2`` that :func:`core.runs.engine.estimate_pass` fitted for this model: past the
    longest recorded pass, :func:`estimate` answers with it. Why: the pages' estimates otherwise scale the passes
    recorded so far, and a person who goes from 1x to 32x has only 256-token passes recorded, whose time is
    mostly fixed and linear costs; their square said 34 s for a 9 s pass at 8k (135 s at 16k for 35 s)."""
    if all(math.isfinite(x) and x >= 0 for x in (a, b, c)):
        with _lock:
            _laws[model_key] = (float(a), float(b), float(c))


def law(model_key: Hashable) -> tuple[float, float, float] | None:
    """``(a, b, c)`` remembered for this model (:func:`remember_law`), or None."""
    with _lock:
        return _laws.get(model_key)


def _extrapolate(p: int, tp: float, q: int, tq: float, tokens: int) -> float:
    """Seconds at ``tokens`` (past ``q``) of ``b n + c n^2`` through ``(p, tp)`` and ``(q, tq)``, ``p < q``, with
    ``b, c >= 0``: a negative ``c`` (noise, or a longer pass that ran on a quieter machine) keeps the line through
    the longest, a negative ``b`` the square law from it."""
    c = (tq / q - tp / p) / (q - p)
    b = tp / p - c * p
    if c < 0:
        b, c = tq / q, 0.0
    elif b < 0:
        b, c = 0.0, tq / q**2
    return b * tokens + c * tokens**2


def clear(model_key: Hashable | None = None) -> None:
    """Forget the measurements of one model (all kinds), or of every model."""
    with _lock:
        if model_key is None:
            _times.clear()
            _laws.clear()
        else:
            for k in [k for k in _times if k[0] == model_key]:
                del _times[k]
            _laws.pop(model_key, None)


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


class Countdown:
    """A progress bar's time left that never rises (Calibrate's said "under 1 s left", then "about 19 s left").

    Each :meth:`left` takes the larger of two remainders: the plan's (``planned`` seconds, from passes timed
    here, times the share still to do) and the rate's (the time so far over the share done, times the share
    left). The rate alone is wrong when the first steps were free (passes another page already made) and the
    plan alone when this machine is busier than when the passes were timed; the larger errs long, not short.
    Then it is held to a countdown: never more than the last time left less the time since, so it falls with
    the clock and does not jump back up; once it is spent with work left, :meth:`text` says the work is taking
    longer than estimated instead of "under 1 s left"."""

    def __init__(self, planned: float | None = None) -> None:
        self.planned = planned if planned is not None and math.isfinite(planned) and planned > 0 else None
        self._last: tuple[float, float] | None = None  # (elapsed, seconds left) last said

    def left(self, fraction: float, elapsed: float) -> float | None:
        """Seconds left when ``fraction`` of the work is done after ``elapsed`` seconds (None: no way to know)."""
        fraction = max(0.0, min(1.0, fraction))
        if fraction >= 1:
            return 0.0
        candidates = [v for v in (remaining(elapsed, fraction),) if v is not None]
        if self.planned is not None:
            candidates.append(self.planned * (1 - fraction))
        if not candidates:
            return None
        left = max(candidates)
        if self._last is not None:
            left = min(left, max(0.0, self._last[1] - max(0.0, elapsed - self._last[0])))
        self._last = (elapsed, left)
        return left

    def text(self, label: str, fraction: float, elapsed: float) -> str:
        """The bar's text: the label, the share done, and the time left or that it runs past its estimate."""
        left = self.left(fraction, elapsed)
        text = f"{label} {max(0.0, min(1.0, fraction)):.0%}"
        if fraction >= 1 or left is None:
            return text
        if left <= 0:
            return text + f" · taking longer than estimated ({elapsed:.0f} s so far)"
        return text + f" · {describe(left)} left"


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


# -- a decoder's pass: a + b n + c n^2 ----------------------------------------------------------------------------

#: Tokens of the two short passes a decoder-only LM's estimate fits its ``a + b n`` to (after one untimed pass at
#: the first length): its linear layers dominate a short pass, so these see them and little else.
DECODER_SAMPLES = (512, 1024)
#: Rows (and keys) of the one causal attention call timed for a decoder's ``c n^2`` (see :func:`attention_per_pair`).
ATTENTION_SAMPLE = 2048


def decoder_shape(config) -> tuple[int, int, int, int]:
    """``(query heads, key/value heads, head dim, layers)`` of a decoder-only LM's config."""
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return heads, kv, dim, int(config.num_hidden_layers)


#: Tokens of the two short passes an encoder's (or a T5's) estimate fits its ``a + b n`` to (after one untimed pass
#: at the first length): long enough that the attention's share is measured in them, not only guessed.
ENCODER_SAMPLES = (1024, 2048)


def encoder_shape(config) -> tuple[int, int, int, int]:
    """``(heads, heads, head dim, encoder layers)`` of an encoder's or a T5's config (T5's head dim is ``d_kv``,
    not ``d_model / heads``)."""
    heads = int(config.num_attention_heads)
    dim = int(getattr(config, "d_kv", None) or getattr(config, "head_dim", None) or config.hidden_size // heads)
    return heads, heads, dim, int(config.num_hidden_layers)


def attention_per_pair(
    config, probed: bool, tokens: int = ATTENTION_SAMPLE, device: str = "cpu", causal: bool = True
) -> float:
    """Seconds per (row, key) pair squared of a pass's attention: ``c`` of ``a + b n + c n^2``.

    One call of the model's shape over ``tokens`` rows (``causal``: a decoder-only LM's causal rows with its
    query and grouped key/value heads, :func:`decoder_shape`; otherwise an encoder's all-pairs rows,
    :func:`encoder_shape`, with a relative position bias read in place when the model has one, as T5's), through
    the backend the pass's attention takes for it (:func:`core.mechanics.softmax_block.choose_backend`: ``sdpa``
    for a causal prefill nobody probes, else the C++ kernel on the CPU; with ``probed``, the row statistics asked
    as a probed pass asks them, on every row: a pass reading only its question's rows costs less), timed the second
    time it runs, times the layers, over ``tokens ** 2``. Why measured apart: in a decoder's short pass the
    attention is a small share of the time (a fifth at 1,024 tokens on SmolLM2), so two short passes cannot tell
    its growth from their noise, while at 8k it is half of the pass and at 32k most of it."""
    import torch

    from core.mechanics import softmax_block as sb

    heads, kv, dim, layers = decoder_shape(config) if causal else encoder_shape(config)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, tokens, dim, generator=g).to(device)
    k = torch.randn(1, kv, tokens, dim, generator=g).to(device)
    v = torch.randn(1, kv, tokens, dim, generator=g).to(device)
    bias = None
    if not causal and getattr(config, "relative_attention_num_buckets", None):
        from core.mechanics.relative_bias import RelativeBias

        bias = RelativeBias(torch.randn(heads, 2 * tokens - 1, generator=g).to(device), tokens, tokens)
    needs = sb.Needs(stats=True) if probed else None
    x = sb.Inputs(q, k, v, bias=bias, tau=torch.full((heads, 1, 1), 0.7, device=device), causal=causal, needs=needs)
    name = sb.choose_backend(x)
    step = sb.rows_per_block(name, x, None)
    seconds = []
    with torch.inference_mode():
        for _ in range(2):
            t0 = _now()
            rows = sb.open_backend(name, x, step)
            for r0 in range(0, tokens, step):
                rows(r0, min(tokens, r0 + step))
            if device != "cpu":
                torch.cuda.synchronize()
            seconds.append(_now() - t0)
    return layers * seconds[-1] / tokens**2


def quadratic_fit(samples: list[tuple[int, float]], c: float) -> tuple[float, float, float]:
    """``(a, b, c)`` of ``seconds = a + b n + c n^2`` through ``samples`` ((tokens, seconds) pairs), ``c`` given:
    the least-squares line through ``seconds - c n^2`` (``a`` kept at 0 or above, ``b`` above 0: a fixed cost
    cannot be negative, nor a token's)."""
    if not samples:
        raise ValueError("quadratic_fit needs at least one (tokens, seconds) sample")
    xs = [float(n) for n, _ in samples]
    ys = [float(t) - c * float(n) ** 2 for n, t in samples]
    if len(set(xs)) < 2:
        return 0.0, max(0.0, statistics.fmean(ys) / xs[0]), c
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    a = my - b * mx
    if a < 0 or b <= 0:  # noise made the line cross zero: through the origin instead
        a, b = 0.0, max(1e-12, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs))
    return a, b, c


def quadratic_estimate(samples: list[tuple[int, float]], c: float, tokens: int) -> float:
    """Seconds of a pass over ``tokens`` tokens: :func:`quadratic_fit` through ``samples`` with ``c``, at ``tokens``."""
    a, b, c = quadratic_fit(samples, c)
    return a + b * tokens + c * tokens**2


def _now() -> float:
    import time

    return time.perf_counter()
