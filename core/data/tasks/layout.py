"""The layout every generated task shares, and how it is sized in tokens.

A task describes its document as a ``_Layout`` (head, filler units joined by
a separator, the needle item at a depth, tail with the question); ``_render``
turns a layout, a number of units and a fine adjustment into text and spans;
``_fit_layout`` finds the longest rendering within the token target, with
``_Stream`` (filler units generated lazily, with estimated token costs) and
``_max_feasible`` (a probe-economical search), then closes what is left of
the gap with a trailing partial unit (``_close_gap``), so a document has
exactly the asked number of tokens whenever the tokenizer allows it.
``count_tokens`` is the one way a document's length is counted
(``len(tokenizer(text).input_ids)``).

Why its own module: the sizing is the same for every task (see the package
docstring: a few tokenizer calls a document, never over the target); a task
module only says what its units, needle and question are.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


def _input_ids(tokenizer: Any, texts: str | list[str], add_special_tokens: bool = True) -> Any:
    """input_ids from any HF-like tokenizer (BatchEncoding, dict or object)."""
    try:
        out = tokenizer(texts, add_special_tokens=add_special_tokens)
    except TypeError:  # a bare callable without the keyword
        out = tokenizer(texts)
    return out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out.input_ids


def count_tokens(tokenizer: Any, text: str) -> int:
    """Token count the way the engine sees it: ``len(tokenizer(text).input_ids)``."""
    return len(_input_ids(tokenizer, text))


class _Stream:
    """Filler units generated lazily, in order, with estimated token costs.

    Costs come from one batched tokenizer call per extension, each unit
    tokenized as ``sep + unit`` without special tokens: with a pre-tokenizer
    that splits at whitespace this is exact for the concatenation, and close
    for others; the caller confirms with full-text counts anyway. Repeated
    units (the classic passkey filler) are costed once. Large extensions
    tokenize units in groups (at most ``MAX_STRINGS`` strings per call) and
    share each group's count by character length: per-string overhead, not
    tokens, dominates the cost of thousands of tiny strings, and only the
    running sums need to be accurate.
    """

    MAX_STRINGS = 64

    def __init__(self, units: Iterator[str], tokenizer: Any, sep: str) -> None:
        self._source = units
        self._tokenizer = tokenizer
        self._sep = sep
        self._known: dict[str, float] = {}
        self.units: list[str] = []
        self.costs: list[float] = []
        self.cum: list[float] = [0.0]

    def extend(self, count: int) -> None:
        """Generate (and cost) at least ``count`` more units."""
        batch = list(itertools.islice(self._source, max(8, count)))
        if not batch:
            raise RuntimeError("filler stream exhausted")  # streams are infinite by construction
        fresh = list(dict.fromkeys(u for u in batch if u not in self._known))
        if fresh:
            size = max(1, math.ceil(len(fresh) / self.MAX_STRINGS))
            groups = [fresh[i : i + size] for i in range(0, len(fresh), size)]
            texts = ["".join(self._sep + u for u in group) for group in groups]
            for group, ids in zip(groups, _input_ids(self._tokenizer, texts, add_special_tokens=False)):
                chars = sum(len(self._sep) + len(u) for u in group)
                for u in group:
                    self._known[u] = max(1.0, len(ids) * (len(self._sep) + len(u)) / chars)
        for unit in batch:
            self.units.append(unit)
            self.costs.append(self._known[unit])
            self.cum.append(self.cum[-1] + self.costs[-1])

    def ensure(self, n: int) -> None:
        """Make units[0:n] exist."""
        if n > len(self.units):
            self.extend(n - len(self.units))

    def fit(self, lo: int, budget: float) -> int:
        """Largest x >= lo whose units[lo:x] are estimated to cost <= budget."""
        self.ensure(lo + 1)
        while self.cum[-1] - self.cum[lo] <= budget:
            average = self.cum[-1] / len(self.units)
            remaining = budget - (self.cum[-1] - self.cum[lo])
            self.extend(int(remaining / average * 1.1) + 8)
        return bisect.bisect_right(self.cum, self.cum[lo] + budget) - 1


def _max_feasible(
    g: Callable[[int], int],
    target: int,
    lo: int,
    g_lo: int,
    limit: int,
    guess: Callable[[int, int], int],
    step_cost: Callable[[int], float],
) -> tuple[int, int]:
    """Largest x in [lo, limit] with g(x) <= target, g non-decreasing, g(lo) = g_lo <= target.

    Probes come from ``guess`` (estimated best x from a known feasible point)
    while no infeasible point is known, then from interpolation between the
    feasible and infeasible bracket ends (g is close to linear), and after a
    few probes from bisection, so a badly estimating tokenizer costs a few
    more probes but never a wrong answer. ``step_cost(x)`` is the estimated
    cost of going from x to x+1: when it clearly exceeds the remaining
    budget, x+1 is not probed at all.
    """
    hi: int | None = None  # smallest probed infeasible x
    g_hi = 0
    probes = 0
    while True:
        upper = limit if hi is None else hi - 1
        if lo >= upper:
            return lo, g_lo
        if hi is None and probes < 4:
            x = guess(lo, g_lo)
            if x <= lo:
                if step_cost(lo) > target - g_lo + 1:
                    return lo, g_lo
                x = lo + 1
        elif hi is None:
            x = lo + 2 ** (probes - 2)
        elif probes < 5 and g_hi > g_lo:
            x = lo + int((target - g_lo) * (hi - lo) / (g_hi - g_lo))
        else:
            x = (lo + hi) // 2
        x = max(lo + 1, min(x, upper))
        probes += 1
        gx = g(x)
        if gx <= target:
            lo, g_lo = x, gx
        else:
            hi, g_hi = x, gx


@dataclass
class _Layout:
    """How a task lays out its document; ``_fit_layout`` sizes it.

    text = head + sep.join(items) + tail, where items are the filler units
    (the fine adjustment: the last unit extended by ``extend`` with ``cut``
    words, or ``cut`` units made a little longer by ``lengthen``) with the
    needle item inserted
    after ``round(depth * m)`` of the m units (or at ``fixed_pos``), each item
    passed through ``fmt(index, item)``. The needle span is where
    ``needle_core`` sits inside the needle item; the question span is where
    ``question`` sits inside the tail.
    """

    head: str
    tail: str
    question: str
    sep: str
    needle: str
    needle_core: str
    stream: _Stream
    fixed_pos: int | None = None
    fmt: Callable[[int, str], str] | None = None
    extend: Callable[[str, str, int], str] | None = None  # (last unit, next unit, words) -> last unit + words
    extend_limit: Callable[[str], int] | None = None  # next unit -> most words ``extend`` may add
    lengthen: Callable[[str, int], str] | None = None  # (unit, salt) -> same unit, a few tokens longer
    min_gap: int = 1  # fine adjustment only when at least this many tokens are missing
    # (last unit, next unit) -> text that may follow the last unit, of which the gap closer appends a prefix
    # (``_close_gap``); None: what ``extend`` would add with all the words it may add.
    pad: Callable[[str, str], str] | None = None


@dataclass
class _Draft:
    text: str
    needle_span: tuple[int, int]
    question_span: tuple[int, int]
    depth: float
    position: int  # index of the needle item among all items
    n_items: int  # filler units + needle
    cut_words: int


def _render(layout: _Layout, n: int, cut: int, depth: float, pad: str = "") -> _Draft:
    """n whole units, the fine adjustment ``cut``, and ``pad`` appended to the last unit (the needle item when n = 0)."""
    layout.stream.ensure(n + 1)
    units = layout.stream.units[:n]
    needle = layout.needle
    if cut and layout.extend is not None:
        if n:
            units = units[:-1] + [layout.extend(units[-1], layout.stream.units[n], cut)]
        else:  # no filler unit fits whole: extend the needle item (its core stays intact)
            needle = layout.extend(needle, layout.stream.units[0], cut)
    elif cut and layout.lengthen is not None:
        units = list(units)
        for k in range(cut):  # spread over the record, no positional pattern
            i = (k * n) // cut
            units[i] = layout.lengthen(units[i], i)
    if pad:
        if n:
            units = units[:-1] + [units[-1] + pad]
        else:
            needle = needle + pad
    m = len(units)
    pos = layout.fixed_pos if layout.fixed_pos is not None else int(math.floor(depth * m + 0.5))
    pos = min(pos, m)
    items = units[:pos] + [needle] + units[pos:]
    if layout.fmt is not None:
        items = [layout.fmt(i, item) for i, item in enumerate(items)]
    before = layout.head + "".join(item + layout.sep for item in items[:pos])
    core_at = items[pos].find(layout.needle_core)
    assert core_at >= 0, "needle core must be inside the needle item"
    needle_start = len(before) + core_at
    text = layout.head + layout.sep.join(items) + layout.tail
    q_start = len(text) - len(layout.tail) + layout.tail.rfind(layout.question)
    return _Draft(
        text=text,
        needle_span=(needle_start, needle_start + len(layout.needle_core)),
        question_span=(q_start, q_start + len(layout.question)),
        depth=(pos / m) if m else 0.0,
        position=pos,
        n_items=m + 1,
        cut_words=cut,
    )


def _pad_source(layout: _Layout, n: int) -> str:
    """The text whose prefixes may follow unit n - 1 (the needle item when n = 0) to close a gap."""
    layout.stream.ensure(n + 1)
    last = layout.stream.units[n - 1] if n else layout.needle
    nxt = layout.stream.units[n]
    if layout.pad is not None:
        return layout.pad(last, nxt)
    if layout.extend is not None and layout.extend_limit is not None:
        full = layout.extend(last, nxt, layout.extend_limit(nxt) + 1)  # every word the extension can draw on
        if full.startswith(last):
            return full[len(last) :]
    return ""


def _close_gap(count: Callable[[str], int], source: str, target: int, base: int) -> str | None:
    """The longest prefix of ``source`` whose rendering has exactly ``target`` tokens, or None.

    ``count(prefix)`` counts the document with that prefix appended;
    ``count("") = base < target``. Whole words first (a search over the
    word ends, counts rising with the words), then, when the next word
    jumps over the target, that word cut short character by character
    (never ending on whitespace).
    """
    ends = [i for i in range(1, len(source)) if source[i].isspace() and not source[i - 1].isspace()]
    ends.append(len(source))
    ends = [e for e in ends if source[:e].strip()]
    if not ends:
        return None

    def g(w: int) -> int:
        return base if w == 0 else count(source[: ends[w - 1]])

    w, tokens = _max_feasible(g, target, 0, base, len(ends), lambda lo, g_lo: lo + max(1, target - g_lo), lambda _w: 1)
    if tokens == target and w:
        return source[: ends[w - 1]]
    if w >= len(ends):
        return None
    start = ends[w - 1] if w else 0
    for c in range(ends[w] - 1, start, -1):  # the next word cut short: the longest prefix that fits exactly
        if not source[c - 1].isspace() and source[:c].strip() and count(source[:c]) == target:
            return source[:c]
    # One token past a word end and the next word's first character costs two (bytes: its space and
    # itself): close the sentence there instead.
    if w and source[ends[w - 1] - 1] not in ".!?" and count(source[: ends[w - 1]] + ".") == target:
        return source[: ends[w - 1]] + "."
    return None


def _fit_layout(layout: _Layout, tokenizer: Any, target: int, depth: float, task: str) -> tuple[_Draft, int]:
    """The longest rendering of ``layout`` with at most ``target`` tokens, and its count.

    Three steps: whole filler units (the most that fit), the layout's fine
    adjustment (``extend`` words or ``lengthen`` units), and, if tokens are
    still missing, a prefix of the next unit (``_close_gap``) appended to the
    last one, which makes the count exact for any tokenizer that can spend
    one more token on one more character or word. A document that was exact
    after the first two steps is left as it was.
    """
    counts: dict[tuple[int, int, str], int] = {}

    def g(n: int, cut: int = 0, pad: str = "") -> int:
        if (n, cut, pad) not in counts:
            counts[(n, cut, pad)] = count_tokens(tokenizer, _render(layout, n, cut, depth, pad).text)
        return counts[(n, cut, pad)]

    base = g(0)
    if base > target:
        raise ValueError(
            f"tokens={target} is too small for task {task!r}: the needle and question alone "
            f"take {base} tokens with this tokenizer; ask for at least {base}."
        )
    stream = layout.stream

    def step_cost(x: int) -> float:
        stream.ensure(x + 1)
        return stream.costs[x]

    n, tokens = _max_feasible(
        g,
        target,
        0,
        base,
        limit=target,  # every unit costs >= 1 token
        guess=lambda lo, g_lo: stream.fit(lo, target - g_lo),
        step_cost=step_cost,
    )

    def fine(n: int, tokens: int, min_gap: int) -> tuple[int, int]:
        """The fine adjustment of n whole units: (cut, tokens)."""
        cut, limit = 0, 0
        if target - tokens < min_gap:
            pass
        elif layout.extend is not None and layout.extend_limit is not None:
            stream.ensure(n + 1)
            limit = layout.extend_limit(stream.units[n])
        elif layout.lengthen is not None:
            limit = n
        if limit > 0 and g(n, 1) <= target:  # one step must fit, else stay at whole units
            g1 = g(n, 1)

            def cut_guess(lo: int, g_lo: int) -> int:
                # Tokens per step: measured once two feasible points exist; the
                # first step (w = 1) also pays for the joint, so take half of it.
                slope = (g_lo - g1) / (lo - 1) if lo > 1 else max(1, g1 - tokens) / 2
                return lo + int((target - g_lo) / max(slope, 0.25))

            cut, tokens = _max_feasible(lambda w: g(n, w), target, 1, g1, limit, cut_guess, lambda w: 1)
        return cut, tokens

    cut, tokens = fine(n, tokens, layout.min_gap)
    if tokens < target:
        found = _exact(layout, g, target, n, cut, fine)
        if found is not None:
            n, cut, pad = found
            return _render(layout, n, cut, depth, pad), target
    return _render(layout, n, cut, depth), tokens


def _exact(
    layout: _Layout,
    g: Callable[..., int],
    target: int,
    n: int,
    cut: int,
    fine: Callable[[int, int, int], tuple[int, int]],
) -> tuple[int, int, str] | None:
    """(n, cut, pad) of a rendering with exactly ``target`` tokens near the fitted (n, cut), or None.

    The pad replaces a word extension (its words, without the closing
    period, are the pad's source) and joins a lengthening (or one step
    fewer of it, for the tokens a pad cannot spend alone: a line's pad
    costs its newline and "line" at least). Failing that (lengthening
    layouts), one whole unit fewer, adjusted again.
    """
    # One unit fewer helps a lengthening only: an extension's pad can never make up a whole unit.
    for m in (n, n - 1) if layout.extend is None else (n,):
        if m < 0:
            break
        if m == n:
            c = cut
        else:
            c, _ = fine(m, g(m), 1)
        if layout.extend is not None:
            bases = [0]
        else:
            bases = [c, c - 1] if c > 0 else [0]
        source = _pad_source(layout, m)
        for b in bases:
            start = g(m, b)
            if start == target:
                return m, b, ""
            if start > target:
                continue
            pad = _close_gap(lambda p, m=m, b=b: g(m, b, p), source, target, start)
            if pad is not None:
                return m, b, pad
    return None
