"""One forward pass at a time in this process, shared by every session, the background grid and the Sweep page.

Why: two passes at once on a 2-core machine are each more than twice as slow
and may together need more memory than the free-memory check allowed for
one; the gate is the app's memory budget. It knows nothing of what a pass
computes, so :mod:`ui.cache`, :mod:`ui.prefetch` and the views all take it
from here.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import streamlit as st


class PassGate:
    """One forward pass at a time in this process, and the person waiting goes first.

    Two passes at once on a 2-core machine are each more than twice as slow
    (torch's worker threads fight over the cores) and may together need more
    memory than the free-memory check allowed for one. Foreground work (a
    page a person is waiting on) announces itself with :meth:`foreground`;
    background work (:mod:`ui.prefetch`) takes :meth:`background` only while
    nobody waits, so a slider move waits for at most the one background pass
    already under way.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: a foreground computation may nest passes
        self._cond = threading.Condition()
        self._waiting = 0

    @property
    def busy(self) -> bool:
        """Someone is waiting for (or running) a foreground pass."""
        return self._waiting > 0

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        """Hold the gate for a person's pass (waiting, if need be, for the one background pass under way)."""
        with self._cond:
            self._waiting += 1
        try:
            with self._lock:
                yield
        finally:
            with self._cond:
                self._waiting -= 1
                self._cond.notify_all()

    def background(self, timeout: float = 0.5) -> bool:
        """Take the gate for one background pass; False (try later) while foreground work waits."""
        with self._cond:
            if self._waiting:
                self._cond.wait(timeout)
                return False
        if not self._lock.acquire(timeout=timeout):
            return False
        if self._waiting:  # someone arrived meanwhile: let them go first
            self._lock.release()
            return False
        return True

    def release_background(self) -> None:
        self._lock.release()


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
