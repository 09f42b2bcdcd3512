"""The tau grid of the document on screen, computed in the background and shared by every session.

Why: a person who opened a document will move the slider, open Calibrate
or ask for Algorithm 1 next, and each of those needs passes of this very
document at the grid's taus. The grid is the scrubber's
(:data:`core.views.frames.SCRUB_GRID`): 1.00, 0.95, ..., 0.30 by 0.05, fifteen
taus down to the slider's floor; Algorithm 1's grid
(:data:`core.runs.temperature.GRID`, 1.00 ... 0.50) is its first eleven. The
passes run in :meth:`Job.passes`' order, not down the grid: tau = 1 first
(the scrubber's left column), then the other taus nearest the tau on screen
first (ties: the larger tau), then Theory's tau = 1 pass. (On the CosScale
axis the grid is the page's values of s instead, nearest the value on
screen first.) Computing them while the person reads means a slider move
onto a grid value, the Algorithm 1 curve and Calibrate are dictionary
look-ups, and no pass is computed twice in the process: the passes land in
:mod:`ui.cache`'s run store (the slider's key) and its statistics store
(Algorithm 1's key).

How: one daemon thread per process. Each session says which document it
shows (:func:`want`); the thread works on the newest wanted document, one
pass at a time, and drops a document as soon as no session shows it any
more (a length change cancels the rest of the old grid). Passes go through
:class:`ui.pass_gate.PassGate` as background work, so a person's own pass
never waits for more than the one background pass already running.

This module builds on :mod:`ui.cache` (its keys, its run store) and the
cache never calls back: the process's one :func:`prefetcher`, the job of a
document (:func:`grid_job`) and :func:`clear_all` (the stores and the
wishes) live here, beside the thread.

Nothing here touches Streamlit elements: the thread only computes.
"""

from __future__ import annotations

import atexit
import threading
import time
from dataclasses import dataclass, replace
from typing import Hashable

import streamlit as st

from core.runs import engine, methods
from core.views import frames
from core.errors import UserError
from core.models import Loaded
from core.runs.settings import DocumentRequest
from ui import cache, pass_gate, stores
from ui.streamlit_private import session_alive

#: The taus computed ahead: the scrubber's grid (Algorithm 1's 1.00 ... 0.50 by 0.05, on to the slider's floor 0.30).
GRID = frames.SCRUB_GRID


@dataclass(frozen=True)
class Job:
    """One document's grid: the model, the request and the run settings every grid pass uses (tau aside)."""

    loaded: Loaded
    request: DocumentRequest
    settings: engine.RunSettings
    extras: tuple[engine.RunSettings, ...] = ()  # after the grid: other passes a page will want (Theory's tau = 1)
    around: float = 1.0  # the value on screen: the grid is computed nearest to it first (not part of the key)
    #: What the grid varies: "tau" (the scrubber's grid) or "s", CosScale over ``values`` at the settings' tau.
    axis: str = "tau"
    values: tuple[float, ...] = ()

    @property
    def key(self) -> Hashable:
        s = self.settings
        fixed = s.tau.key() if self.axis == "s" else s.cosine_scale  # what the grid holds constant
        return (cache.mkey(self.loaded), self.request, s.choice.targets, fixed, s.probes, s.generate, self.extras,
                self.axis, self.values, s.choice.scheme)  # a position scheme change starts a new grid

    def passes(self) -> list[engine.RunSettings]:
        """Every pass of the job, in the order they are computed: the grid nearest the tau on screen first
        (tau = 1, the left column, before all), then the extras."""
        if self.axis == "s":
            order = sorted(self.values, key=lambda v: (abs(v - self.around), v))
            return [replace(self.settings, cosine_scale=v) for v in order] + list(self.extras)
        return [replace(self.settings, tau=t, method=methods.FIXED) for t in frames.grid_order(self.around, GRID)] + list(self.extras)

    def pending(self) -> list[engine.RunSettings]:
        """The job's passes not in the run store yet."""
        return [s for s in self.passes() if not cache.has_run(self.loaded, self.request, s)]


class Prefetcher:
    """The background thread and what each session wants of it (see the module docstring)."""

    def __init__(self) -> None:
        self._wanted: dict[str, tuple[float, Job]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0  # computed by this thread (tests and the benchmark read it)
        self.failed: dict[Hashable, str] = {}
        self._stop = threading.Event()
        # A daemon thread still inside torch when the interpreter exits aborts the
        # process ("terminate called without an active exception", exit 134): stop it first.
        atexit.register(self.stop)

    def wanted(self) -> dict[str, Job]:
        """What each session wants now (session id -> job): a copy, for pages that ask whether a grid is coming."""
        with self._lock:
            return {session: job for session, (_, job) in self._wanted.items()}

    def forget(self) -> None:
        """Drop every session's wish (the pass under way finishes; nothing new starts for them)."""
        with self._lock:
            self._wanted.clear()
            self.failed.clear()

    def stop(self, timeout: float = 60.0) -> None:
        """Finish the pass under way, then end the thread (called at exit)."""
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join(timeout)

    def want(self, session: str, job: Job | None) -> None:
        """``session`` now shows ``job``'s document (None: nothing to prefetch for it)."""
        with self._lock:
            if job is None:
                self._wanted.pop(session, None)
            else:
                old = self._wanted.get(session)
                if old is None or old[1].key != job.key:
                    self._wanted[session] = (time.monotonic(), job)
                elif old[1].around != job.around:  # the same document, the slider elsewhere: reorder what is left
                    self._wanted[session] = (old[0], job)
            if self._stop.is_set():
                return
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="aae-prefetch", daemon=True)
                self._thread.start()
        self._wake.set()

    def _next(self) -> tuple[Job, engine.RunSettings] | None:
        """The newest wanted document that still has a pending pass, and that pass."""
        with self._lock:
            for session in [s for s in self._wanted if not session_alive(s)]:
                del self._wanted[session]  # the tab was closed: its document is no longer wanted
            jobs = sorted(self._wanted.values(), key=lambda x: -x[0])
        for _, job in jobs:
            if job.key in self.failed:
                continue
            todo = job.pending()
            if todo:
                return job, todo[0]
        return None

    def _still_wanted(self, job: Job) -> bool:
        with self._lock:
            return any(j.key == job.key for _, j in self._wanted.values())

    def _loop(self) -> None:
        gate = pass_gate.gate()
        while not self._stop.is_set():
            nxt = self._next()
            if nxt is None:
                self._wake.wait(5.0)
                self._wake.clear()
                continue
            job, settings = nxt
            if not gate.background():
                continue  # a person is waiting for a pass: let them go first
            if self._stop.is_set():
                gate.release_background()
                break
            try:
                if self._still_wanted(job):
                    cache.run_unguarded(job.loaded, job.request, settings)
                    self.passes += 1
            except (UserError, ValueError, RuntimeError) as err:  # too long, out of memory: stop this grid
                self.failed[job.key] = str(err)
            finally:
                gate.release_background()


def progress(job: Job) -> tuple[int, int]:
    """(passes ready, passes in all) of a job: the grid and its extras."""
    total = len(job.passes())
    return total - len(job.pending()), total


@st.cache_resource(show_spinner=False)
def prefetcher() -> Prefetcher:
    """The process's one background grid worker, shared by every session."""
    return Prefetcher()


def grid_job(loaded: Loaded, req: DocumentRequest, settings: engine.RunSettings, around: float = 1.0) -> Job:
    """The background job of a document shown with these run settings: its tau grid (nearest ``around`` first),
    then Theory's tau = 1 pass."""
    return Job(loaded, req, replace(settings, tau=1.0, method=methods.FIXED),
               extras=(cache.theory_settings(loaded, settings.choice),),
               around=float(around))


def clear_all() -> None:
    """Forget every background wish, then every cached document, run and calibration (models stay loaded).

    Wishes first: a wish left behind would refill the emptied stores.
    """
    prefetcher().forget()
    stores.clear()
