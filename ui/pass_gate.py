"""One forward pass at a time in this process, shared by every session, the background grid and the Sweep page.

Why: two passes at once on a 2-core machine are each more than twice as slow
and may together need more memory than the free-memory check allowed for
one; the gate is the app's memory budget. It knows nothing of what a pass
computes, so :mod:`ui.cache`, :mod:`ui.prefetch` and the views all take it
from here.

A person goes first: foreground work waits for at most the layer under way of
a background pass, which gives way between two layers (:meth:`PassGate.give_way`,
called from :func:`core.mechanics.attention.between_layers` by
:mod:`ui.prefetch`). A paused background pass keeps its state between layers
beside the person's pass; :mod:`ui.prefetch` pauses only while that state is
small next to free memory, and abandons the pass at the layer otherwise.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Hashable, Iterator

import streamlit as st


class GaveWay(Exception):
    """A background pass stopped between two layers, its partial results dropped; the pass is redone later.

    Raised by :meth:`PassGate.give_way` (no room to keep the pass paused, a pause past its bound, a pass nobody
    wants any more) from inside the pass (:func:`core.mechanics.attention.between_layers`), so it unwinds
    through the model and the run store stores nothing.
    """


#: Seconds the background waits after the last foreground work ended before it takes the gate again (so a page
#: that runs several passes in a row gets them all first). Off (0): with 0.5, tests/browser/test_scrubber_browser.py's scrubbing
#: test failed now and then; the cause was found later (grid frames lost on their way to the browser, fixed in
#: ui/scrubber.py), and the option was not measured again.
RESUME_AFTER_S = 0.0

#: What a person's pass calls while it waits for the background pass that makes the very same pass
#: (:meth:`PassGate.wait_for_background`), every :data:`WAIT_TICK_S`: the app's progress bar
#: (:func:`ui.long_work.layer_progress`). Why: the person's first pass of a new document is usually the background
#: grid's own tau = 1 pass, already under way; its layers run in the background thread, where the person's
#: per-layer hook never runs, so the bar stayed at "starting..." for the whole pass (issue 59 point 2).
_WAITING: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar("aae_waiting", default=None)
WAIT_TICK_S = 0.25


@contextlib.contextmanager
def while_waiting(fn: Callable[[int], None] | None) -> Iterator[None]:
    """Call ``fn(layers)`` every :data:`WAIT_TICK_S` while a pass in this block waits for the background pass that
    makes it (``layers``: the attention calls that pass has made so far)."""
    token = _WAITING.set(fn)
    try:
        yield
    finally:
        _WAITING.reset(token)


class PassGate:
    """One forward pass at a time in this process, and the person waiting goes first.

    Two passes at once on a 2-core machine are each more than twice as slow
    (torch's worker threads fight over the cores) and may together need more
    memory than the free-memory check allowed for one. Foreground work (a
    page a person is waiting on) announces itself with :meth:`foreground`;
    background work (:mod:`ui.prefetch`) takes :meth:`background` only while
    nobody waits, and between two of its layers calls :meth:`give_way`, so a
    person's pass waits for at most the layer under way, not the whole
    background pass (issue 49).

    A paused background pass keeps what it holds between two layers (its
    hidden states, the probes recorded so far, a decoder's key/value cache);
    its attention blocks, a pass's peak, are gone by then. So while a
    person's pass runs beside a paused one, memory holds one pass's working
    memory plus that state: :meth:`give_way` pauses only when the caller
    says the state is small next to free memory (:mod:`ui.prefetch` measures
    it), and otherwise abandons the background pass at the layer (it is redone
    later), which keeps "one pass at a time" exact.
    """

    def __init__(self, resume_after: float = RESUME_AFTER_S) -> None:
        self._lock = threading.RLock()  # re-entrant: a foreground computation may nest passes
        self._cond = threading.Condition()
        self._waiting = 0
        self._holder: int | None = None  # the thread holding the gate for background work, if any
        self._quiet_since = float("-inf")  # when the last foreground work ended (time.monotonic)
        self.resume_after = float(resume_after)
        self.pauses = 0  # background passes paused for a person (tests and benchmarks read these)
        self.paused_s = 0.0
        self.last_wait_s = 0.0  # how long the last foreground work (outermost) waited for the gate
        self._depth = threading.local()
        self._making: Hashable | None = None  # what the background pass under way makes (its run store key)
        self.layers = 0  # attention calls of the background pass under way (its progress, for a person waiting on it)

    @property
    def busy(self) -> bool:
        """Someone is waiting for (or running) a foreground pass."""
        return self._waiting > 0

    @property
    def background_running(self) -> bool:
        """A background pass holds the gate now (not while it is paused)."""
        return self._holder is not None

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        """Hold the gate for a person's pass (waiting, if need be, for the layer under way of a background pass)."""
        with self._cond:
            self._waiting += 1
        depth = getattr(self._depth, "n", 0)
        t0 = time.monotonic()
        try:
            with self._lock:
                if not depth:
                    self.last_wait_s = time.monotonic() - t0
                self._depth.n = depth + 1
                try:
                    yield
                finally:
                    self._depth.n = depth
        finally:
            with self._cond:
                self._waiting -= 1
                if not self._waiting:
                    self._quiet_since = time.monotonic()
                self._cond.notify_all()

    def background(self, timeout: float = 0.5) -> bool:
        """Take the gate for one background pass; False (try later) while foreground work waits, or ended less
        than :attr:`resume_after` seconds ago and does not stay away for the rest of ``timeout``."""
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._waiting:
                    self._cond.wait(max(0.0, end - time.monotonic()))
                    return False
                quiet = self._quiet_since + self.resume_after - time.monotonic()
                if quiet <= 0:
                    break
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(quiet, left))
        if not self._lock.acquire(timeout=max(0.0, end - time.monotonic())):
            return False
        if self._waiting:  # someone arrived meanwhile: let them go first
            self._lock.release()
            return False
        self._holder = threading.get_ident()
        return True

    @contextlib.contextmanager
    def making(self, key: Hashable) -> Iterator[None]:
        """The background pass in this block makes ``key`` (what :meth:`wait_for_background` waits on)."""
        with self._cond:
            self._making = key
            self.layers = 0
        try:
            yield
        finally:
            with self._cond:
                self._making = None
                self._cond.notify_all()

    def wait_for_background(self, key: Hashable, timeout: float) -> bool:
        """If the background pass under way makes ``key``, wait (at most ``timeout`` s) until it is over, without
        asking it to give way; True if it was making it. Why: a person who scrubs onto the grid frame being computed
        needs the rest of that pass, not a pause and a whole new pass of the same thing."""
        if getattr(self._depth, "n", 0):
            return False  # this thread holds the gate: the background pass is paused for it, and would never end
        end = time.monotonic() + timeout
        tick = _WAITING.get()
        with self._cond:
            if self._making != key:
                return False
            while self._making == key:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, WAIT_TICK_S) if tick is not None else left)
                if tick is not None and self._making == key:
                    layers = self.layers
                    self._cond.release()  # the tick draws (and may stop the run): never while holding the condition
                    try:
                        tick(layers)
                    finally:
                        self._cond.acquire()
        return True

    def layer_done(self) -> None:
        """The background pass under way reached its next attention call (:mod:`ui.prefetch` calls it per layer)."""
        self.layers += 1

    def release_background(self) -> None:
        """Give back the gate taken with :meth:`background` (nothing if :meth:`give_way` left it released)."""
        if self._holder == threading.get_ident():
            self._holder = None
            self._lock.release()

    def give_way(
        self, pause: bool, alive: Callable[[], bool] = lambda: True, most_s: float = 600.0, step: float = 0.5
    ) -> float:
        """Called by the background pass holding the gate, between two of its layers: let a waiting person go first.

        Returns 0 at once when nobody waits. Otherwise, with ``pause``, gives the
        gate to the person, waits (in steps of ``step`` s) until no foreground
        work is left, takes the gate back and returns the seconds paused; without
        ``pause`` (its state would not fit beside the person's pass) raises
        :class:`GaveWay`. Also raises it, the gate not held, when ``alive()``
        turns false during the pause (the pass is no longer wanted) or the pause
        passes ``most_s`` seconds (a bound: a pass never waits forever holding
        its memory; it is redone later).
        """
        if not self._waiting:
            return 0.0
        if self._holder != threading.get_ident():
            raise RuntimeError("give_way() is for the thread holding the gate for background work")
        if not pause:
            raise GaveWay("a person's pass goes first, and this pass's state is too large to keep while it runs")
        self.release_background()
        self.pauses += 1
        t0 = time.monotonic()
        try:
            while True:
                if not alive():
                    raise GaveWay("the paused pass is no longer wanted")
                if time.monotonic() - t0 > most_s:
                    raise GaveWay(f"paused for more than {most_s:g} s")
                if self.background(timeout=step):
                    return time.monotonic() - t0
        finally:
            self.paused_s += time.monotonic() - t0


@st.cache_resource(show_spinner=False)
def gate() -> PassGate:
    """The process's one :class:`PassGate` (shared by every session and the prefetcher)."""
    return PassGate()


def queue_note() -> str:
    """A sentence for a spinner when another session's pass holds the machine (empty otherwise).

    Passes run one at a time in the process (:class:`PassGate`): that is the
    app's memory budget, so two sessions that each passed the free-memory
    check never run out of memory together. The cost is a queue, and a
    person in it should know why their pass has not started.
    """
    return " Another session's pass goes first (one pass at a time on this machine)." if gate().busy else ""
