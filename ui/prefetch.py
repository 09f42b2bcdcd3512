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
more (a length change cancels the rest of the old grid, and the pass under
way stops at its next layer). Passes go through
:class:`ui.pass_gate.PassGate` as background work, and between two layers
(:func:`core.mechanics.attention.between_layers`) a background pass gives
way to a person's pass: it pauses, the person's pass runs, and it resumes
where it stopped. So a person's own pass (a page, Calibrate, a paste, an
off-grid frame) waits for at most the layer under way, not a whole
background pass (issue 49: at 16,384 tokens a pass takes ~20 s here, one
of the default model's four encoder layers ~4 s). A person who wants the
very pass under way (a grid frame still coming) waits for its rest instead
(:meth:`ui.pass_gate.PassGate.wait_for_background`, from :mod:`ui.cache`):
pausing it would only run the same pass twice.

Pause, not abandon, because abandoning throws away the part of the pass
already done (on average half a pass, ~10 s at 16k, per request) and a
person who keeps asking could starve the grid; a paused pass loses
nothing. The price is memory: a paused pass keeps its state between layers
(hidden states, probes so far, a decoder's key/value cache; measured on the
default model at 16,384 tokens: up to 0.12 GB live, against a pass's
0.21 GB peak growth), and that sits beside the person's pass. So the pass
pauses only while that state is at most :data:`PAUSE_SHARE` of free memory
(measured when the person arrives: :func:`live_bytes` since the pass
began); otherwise, or where the allocator cannot say, it is abandoned at the
layer and redone later, and "one pass at a time" holds exactly. A pause
lasts at most :data:`PAUSE_MOST_S`.

This module builds on :mod:`ui.cache` (its keys, its run store) and the
cache never calls back: the process's one :func:`prefetcher` and the job
of a document (:func:`grid_job`) live here, beside the thread.

Nothing here touches Streamlit elements: the thread only computes.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass

import streamlit as st
import torch

from core.errors import UserError
from core.mechanics import attention
from core.mechanics.run_pass import DEFAULT_PASS, Pass
from core.models import Loaded, memory
from core.runs import methods
from core.runs.settings import DocumentRequest
from core.values.choice import Choice
from core.views import frames
from ui import cache, pass_gate
from ui.streamlit_private import session_alive

_log = logging.getLogger(__name__)

#: The taus computed ahead: the scrubber's grid (Algorithm 1's 1.00 ... 0.50 by 0.05, on to the slider's floor 0.30).
GRID = frames.SCRUB_GRID
#: A background pass pauses for a person (rather than being abandoned at the layer) while what it holds is at most
#: this share of the memory still free: the person's pass then has at least 3/4 of what it would have had.
PAUSE_SHARE = 0.25
#: Seconds a background pass stays paused at most (then it is abandoned, its memory freed, and redone later).
PAUSE_MOST_S = 300.0


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2  # glibc 2.33+
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def live_bytes(device: torch.device) -> int | None:
    """Bytes the allocator of ``device`` holds in use now: CUDA's allocated memory, or on the CPU glibc's heap in
    use plus its mmapped blocks (``mallinfo2``: torch's CPU tensors come from malloc); None where neither is known.

    Not the resident size: glibc keeps freed heap resident, so the RSS after a
    pass's peak says nothing about what a paused pass still holds."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    if device.type != "cpu" or _MALLINFO2 is None:
        return None
    m = _MALLINFO2()
    return int(m.uordblks + m.hblkhd)


@dataclass(frozen=True)
class Job:
    """One document's grid: the model, the request, and the choice and pass every grid pass uses (tau aside).
    A pass of the job is a ``(choice, how)`` pair, the two values :func:`ui.cache.run` takes."""

    loaded: Loaded
    request: DocumentRequest
    choice: Choice
    how: Pass
    extras: tuple[tuple[Choice, Pass], ...] = ()  # after the grid: other passes a page will want (Theory's tau = 1)
    around: float = 1.0  # the value on screen: the grid is computed nearest to it first (not part of the key)
    #: What the grid varies: "tau" (the scrubber's grid) or "s", CosScale over ``values`` at the settings' tau.
    axis: str = "tau"
    values: tuple[float, ...] = ()

    @property
    def key(self) -> Hashable:
        c, how = self.choice, self.how
        fixed = c.tau.key() if self.axis == "s" else c.cosine_scale  # what the grid holds constant
        return (
            cache.mkey(self.loaded),
            self.request,
            c.targets,
            fixed,
            how.probes,
            how.generate,
            self.extras,
            self.axis,
            self.values,
            c.scheme,
        )  # a position scheme change starts a new grid

    def passes(self) -> list[tuple[Choice, Pass]]:
        """Every pass of the job, in the order they are computed: the grid nearest the tau on screen first
        (tau = 1, the left column, before all), then the extras."""
        if self.axis == "s":
            order = sorted(self.values, key=lambda v: (abs(v - self.around), v))
            return [(self.choice.with_(cosine_scale=v), self.how) for v in order] + list(self.extras)
        return [
            (self.choice.with_(tau=t, method=methods.FIXED), self.how) for t in frames.grid_order(self.around, GRID)
        ] + list(self.extras)

    def pending(self) -> list[tuple[Choice, Pass]]:
        """The job's passes not in the run store yet."""
        return [s for s in self.passes() if not cache.has_run(self.loaded, self.request, *s)]


class Prefetcher:
    """The background thread and what each session wants of it (see the module docstring)."""

    def __init__(self, pause_share: float = PAUSE_SHARE, pause_most_s: float = PAUSE_MOST_S) -> None:
        self.pause_share = float(pause_share)  # 0: never pause, abandon the pass at the layer instead
        self.pause_most_s = float(pause_most_s)
        self._wanted: dict[str, tuple[float, Job]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0  # computed by this thread (tests and the benchmark read it)
        self.gave_way = 0  # passes abandoned at a layer (a person went first without a pause, a pass no longer wanted)
        self.held: int | None = None  # bytes the last pass that gave way held when it did (None: not known)
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
        """Stop the pass under way at its next layer, then end the thread (called at exit)."""
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

    def _next(self) -> tuple[Job, tuple[Choice, Pass]] | None:
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
        """Whether a session still connected wants ``job``. Asked between two layers of every background pass, so a
        closed tab's grid stops at the next layer (issue 59 point 9: a 64x tab's grid ran on ~2.5 min after it
        closed, when only the next pass's :meth:`_next` looked at which sessions were still there)."""
        with self._lock:
            for session in [s for s in self._wanted if not session_alive(s)]:
                del self._wanted[session]
            return any(j.key == job.key for _, j in self._wanted.values())

    def failure(self, job: Job) -> str | None:
        """Why ``job``'s grid stopped (its pass raised), or None: the scrubber stops asking for its frames then."""
        return self.failed.get(job.key)

    def _loop(self) -> None:
        """The thread: :meth:`_work` until stopped. An error it did not expect is logged with its traceback and the
        thread goes on: before, any exception but a UserError, ValueError or RuntimeError ended the thread without a
        word, and a document's grid stalled until some session's next request started a new thread."""
        while not self._stop.is_set():
            try:
                self._work()
            except Exception:  # noqa: BLE001 (this thread serves every session: it must outlive one bad pass)
                _log.exception("the background grid's thread hit an unexpected error; it goes on")
                self._stop.wait(1.0)  # not a hot loop when the same error comes back at once

    def _work(self) -> None:
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
                    with (
                        gate.making(cache.run_key(job.loaded, job.request, *settings)),
                        attention.between_layers(self._between_layers(gate, job, settings)),
                    ):
                        cache.run_unguarded(job.loaded, job.request, *settings)
                    self.passes += 1
            except pass_gate.GaveWay:
                self.gave_way += 1  # stopped at a layer: pending again (if still wanted), redone later
            except Exception as err:  # noqa: BLE001 (too long, out of memory, or a bug): stop this grid, say why
                # The scrubber reads it (failure) and stops polling for frames that will not come: before, a grid
                # that failed left the page polling every POLL_MS for good (a browser test never settled).
                # Logged before the failure is published: whoever reads ``failure`` finds the log's record too
                # (tests/ui/test_prefetch_errors.py read it between the two once on CI).
                if not isinstance(err, (UserError, ValueError, RuntimeError)):
                    _log.exception("a background grid pass failed; that document's grid stops here")
                self.failed[job.key] = str(err) or type(err).__name__
            finally:
                gate.release_background()

    def _between_layers(self, gate: pass_gate.PassGate, job: Job, settings: tuple[Choice, Pass]):
        """What the pass of ``settings`` (its choice and pass) runs before each attention call: stop when nobody wants it any more,
        give way to a person (pause, or abandon when its state would not fit beside theirs), and after a pause
        stop if the person's own pass was this very one."""
        device = job.loaded.device
        start = live_bytes(device)

        def alive() -> bool:
            return not self._stop.is_set() and self._still_wanted(job)

        def between() -> None:
            gate.layer_done()  # a person waiting on this very pass sees its progress (ui.long_work.layer_progress)
            if not alive():
                raise pass_gate.GaveWay("the pass is no longer wanted")
            if not gate.busy:
                return
            now = live_bytes(device)
            held = None if now is None or start is None else max(0, now - start)
            self.held = held
            pause = held is not None and held <= self.pause_share * memory.free_bytes(device)
            gate.give_way(pause, alive, self.pause_most_s)
            if cache.has_run(job.loaded, job.request, *settings):
                raise pass_gate.GaveWay("the person's pass was this very one")

        return between


def progress(job: Job) -> tuple[int, int]:
    """(passes ready, passes in all) of a job: the grid and its extras."""
    total = len(job.passes())
    return total - len(job.pending()), total


@st.cache_resource(show_spinner=False)
def prefetcher() -> Prefetcher:
    """The process's one background grid worker, shared by every session."""
    return Prefetcher()


def grid_job(
    loaded: Loaded, req: DocumentRequest, choice: Choice, how: Pass = DEFAULT_PASS, around: float = 1.0
) -> Job:
    """The background job of a document shown under ``choice`` and ``how``: its tau grid (nearest ``around``
    first), then Theory's tau = 1 pass."""
    return Job(
        loaded,
        req,
        choice.with_(tau=1.0, method=methods.FIXED),
        how,
        extras=(cache.theory_pass(loaded, choice),),
        around=float(around),
    )
