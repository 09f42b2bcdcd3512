"""Long work the app is about to start on its own: say so at once, with an estimate and progress, and ask first
when the estimate is over a stated limit (issue 50 point 2, issue 47 point 5).

Why: a length change on Explore (32x, 64x L_tr) runs its first passes before any view can be drawn, and on a
busy 2-core machine that took from 98 s to 14 minutes while the old document's views stayed on screen as if
current. Now:

* :func:`hide_stale` hides, for the rest of the run, every element Streamlit has not redrawn yet (the old
  document's scrubber, export and bias curves): only what belongs to the new run shows.
* :func:`ask` stops before work estimated over :data:`CONFIRM_OVER_S` (from :mod:`core.runs.timing`, passes
  timed on this machine) until the person presses the button it draws; the answer is kept for that document.
  A guided-tour step counts as the go-ahead (its set-ups are 8x L_tr of the bundled models: bounded work).
* :func:`layer_progress` moves a progress bar while the pass runs, every quarter second, held to the layers the
  pass has reached (:func:`core.mechanics.attention.between_layers`), with the time left from the estimate.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Hashable, Iterator

import streamlit as st

from core.mechanics import attention
from core.runs import timing
from ui import pass_gate
from ui.streamlit_private import session_alive, session_id, share_run

#: The app asks before it starts work on its own (Explore's first passes of a document, the passes that resolve
#: a measured method there) whose estimate is over this many seconds (docs/app.md).
CONFIRM_OVER_S = 30.0
_CONFIRMED = "_aae_confirmed"  # what the person chose to compute despite its estimate
#: Every element Streamlit has not redrawn in this run yet is hidden: it belongs to the last run (the old document).
#: Only while this very element is fresh (its marker's element container not stale): in the next run, until
#: Streamlit replaces it, it must not hide anything (a poll's rerun would blank the views it has not reached).
HIDE_STALE = (
    "<span class='aae-hide-stale'></span><style>body:has([data-testid='stElementContainer']"
    ":not([data-stale='true']) .aae-hide-stale) [data-stale='true'] { display: none !important; }</style>"
)


def hide_stale(where=st) -> None:
    """Hide, until this run ends, what the last run drew and this one has not redrawn yet."""
    where.html(HIDE_STALE)


def confirmed(key: Hashable) -> bool:
    return key in st.session_state.get(_CONFIRMED, ())


def _confirm(key: Hashable) -> None:
    st.session_state.setdefault(_CONFIRMED, set()).add(key)


def ask(key: Hashable, seconds: float | None, what: str, where=st) -> bool:
    """True when the work may start: its estimate is unknown or within :data:`CONFIRM_OVER_S`, or the person
    confirmed ``key`` before. Otherwise draw the estimate and a button in ``where`` and return False (the caller
    draws nothing that needs the work). ``what``: the sentence that says what would run and how long."""
    if seconds is None or seconds <= CONFIRM_OVER_S or confirmed(key):
        return True
    if st.session_state.get("tour_step") is not None:  # a tour step is the person's go-ahead (8x L_tr: bounded work)
        return True
    hide_stale(where)
    where.warning(
        f"{what} The app asks before it starts work estimated over {CONFIRM_OVER_S:.0f} s on this "
        "machine: press the button to start, or choose a shorter length."
    )
    where.button(
        f"Compute it ({timing.describe(seconds)})",
        key=f"confirm_{abs(hash(key)) % 10**8}",
        type="primary",
        on_click=_confirm,
        args=(key,),
    )
    return False


def stop_if_gone(session: str) -> None:
    """End this script run when its browser tab has closed (:func:`ui.streamlit_private.session_alive`).

    Called between two layers of a person's pass (:func:`layer_progress`), so a closed tab's long pass stops at
    its next layer, as ``--max-seconds`` stops a command's (:meth:`core.runs.timing.Budget.check` through the same
    hook, :func:`core.mechanics.attention.between_layers`); its partial results are dropped (issue 59 point 9:
    the server computed on for minutes after a 64x tab was closed, slowing the next person)."""
    if session and not session_alive(session):
        st.stop()  # raises Streamlit's StopException: the run ends quietly, nothing is stored


#: The bar's top until the pass returns: what follows the last layer (a T5 decoder's answer, the probes' reduction)
#: reaches no per-layer hook.
CEILING = 0.97
#: Seconds between two moves of the bar while a pass runs (a person's own pass reaches its per-layer hook once a
#: layer, and a 32x document's layer on the bundled T5 takes 15-20 s on the 2-core machine).
TICK_S = 0.25


def pass_share(elapsed: float, seconds: float | None, calls: int, layers: int) -> float:
    """The share of a pass to show after ``elapsed`` seconds with ``calls`` attention calls made (call k begins
    layer k) of ``layers``, for an estimate of ``seconds`` for the whole pass (None: none).

    The estimate's share of time spent, held between the layers finished and the layers begun: an estimate too
    long (a quieter machine than the one timed) does not hold the bar behind the layers done, and one too short
    (a busier machine) does not run the bar to its top with layers still to go and leave it there (CI saw
    75 % and then 97 % for the rest of a pass). Without an estimate: the layers begun, shy of the top."""
    layers = max(1, layers)
    begun = min(max(0, calls), layers)
    finished = layers if calls > layers else max(0, begun - 1)
    if not seconds or seconds <= 0:
        return min(CEILING, begun / layers * 0.9)
    return CEILING * min(max(elapsed / seconds, finished / layers), begun / layers)


@contextlib.contextmanager
def layer_progress(bar, label: str, seconds: float | None, layers: int) -> Iterator[None]:
    """Move ``bar`` (an ``st.progress``) while the enclosed passes run, every :data:`TICK_S`: the share
    :func:`pass_share` gives and the time left (without an estimate: the time so far). Past the estimate it says
    so. The layers reached come from each attention call of the pass in this thread (once per layer) or, while it
    waits for the background grid's identical pass (:func:`ui.pass_gate.while_waiting`), from that pass's count.
    A closed tab's pass stops at its next layer (:func:`stop_if_gone`).

    Why a thread: between two layer hooks this thread is inside the layer's kernels, so a bar moved only from the
    hooks moved four times in a 70 s pass of the bundled T5. The clock thread only draws (in this run, through
    :func:`ui.streamlit_private.share_run`); stopping the run stays in this thread."""
    t0 = time.perf_counter()
    state = {"calls": 0, "shown": -1.0}
    lock = threading.Lock()
    session = session_id()
    left = timing.Countdown(seconds)
    over = threading.Event()

    def show(force: bool = False) -> None:
        with lock:
            now = time.perf_counter()
            if not force and now - state["shown"] < TICK_S * 0.8:
                return
            state["shown"] = now
            elapsed = now - t0
            frac = pass_share(elapsed, seconds, state["calls"], layers)
            text = left.text(label, frac, elapsed) if seconds else f"{label} {elapsed:.0f} s so far"
            bar.progress(frac, text=text)

    def tick() -> None:
        stop_if_gone(session)
        state["calls"] += 1
        show(force=True)

    def waiting(background_calls: int) -> None:
        stop_if_gone(session)
        state["calls"] = max(state["calls"], background_calls)
        show()

    def clock() -> None:
        while not over.wait(TICK_S):
            show()

    mover = threading.Thread(target=clock, name="aae-progress", daemon=True)
    share_run(mover)
    mover.start()
    try:
        with attention.between_layers(tick), pass_gate.while_waiting(waiting):
            yield
    finally:
        over.set()
        mover.join()
