"""The app's only uses of Streamlit's private API, each with why no public one does the job.

Checked on Streamlit 1.67.0; ``tests/ui/test_streamlit_private.py`` calls each
function inside a real AppTest run (and a fragment rerun) and fails when its
answer changes, and lists every ``streamlit.*`` import of the program (app.py,
app_pages/, ui/, core/) outside this module (only ``streamlit`` itself and
``streamlit.components.v*`` may be imported elsewhere).

* :func:`in_fragment_rerun`: whether this run reruns only a fragment. The
  scrubber (:mod:`ui.scrubber`) sends the browser only the grid frames it does
  not hold yet in a fragment rerun (a poll, a release), everything in a full
  run (the component may have been mounted anew). Public Streamlit says
  nothing about the kind of run (``st.context`` has no such field).
* :func:`history_navigation`: whether the browser's back or forward button
  started this run. :func:`ui.url.apply` takes a URL it did not write only
  then (or in a session's first run): any other rerun may carry an address
  bar from before the last write (Streamlit folds a fragment's poll into a
  pending full rerun with the poll's query string), and applying that echo
  undid the person's last choice. The browser sends the flag with the rerun
  (``ClientState.is_history_navigation``); ``st.context`` does not show it.
* :func:`session_id` and :func:`session_alive`: the background tau grid
  (:mod:`ui.prefetch`) is shared by every session of the process and drops
  the wishes of a browser tab that has closed. ``st.context`` has no session
  id, and only the runtime knows which sessions are still connected.
* :func:`share_run`: a thread that draws into this run (the progress bar's
  clock, :func:`ui.long_work.layer_progress`, moving the bar while this run's
  thread is inside a layer's kernels). Streamlit's multithreading guide
  (docs.streamlit.io, "Multithreading in Streamlit") does it so; no public
  API attaches a run's context to a thread.

Each answers safely outside a Streamlit run (scripts, benchmarks, plain tests):
not a fragment rerun, no session (""), every session alive.
"""

from __future__ import annotations


def _run_ctx():
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    return get_script_run_ctx(suppress_warning=True)


def in_fragment_rerun() -> bool:
    """Whether this run reruns only a fragment (False in a full run and outside Streamlit)."""
    ctx = _run_ctx()
    return bool(ctx is not None and ctx.fragment_ids_this_run)


def history_navigation() -> bool:
    """Whether the browser's back/forward button started this run (False outside a Streamlit run)."""
    ctx = _run_ctx()
    return bool(ctx is not None and getattr(ctx, "is_history_navigation", False))


def session_id() -> str:
    """This browser session's id ("" outside a Streamlit run: scripts and benchmarks)."""
    ctx = _run_ctx()
    return str(ctx.session_id) if ctx is not None else ""


def session_alive(session: str) -> bool:
    """Whether a browser session is still connected (always True outside a Streamlit server: scripts, tests)."""
    try:
        from streamlit.runtime import Runtime

        if not Runtime.exists():
            return True
        return bool(Runtime.instance().is_active_session(session))
    except Exception:  # an API change must not stop prefetching; at worst a closed tab's grid is finished
        return True


def share_run(thread) -> None:
    """Let ``thread`` (not started yet) draw into this script run (nothing outside a Streamlit run)."""
    from streamlit.runtime.scriptrunner import add_script_run_ctx

    ctx = _run_ctx()
    if ctx is not None:
        add_script_run_ctx(thread, ctx)
