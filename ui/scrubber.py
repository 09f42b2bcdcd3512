"""The scrubber: Explore's tau slider and its views as one ``st.components.v2`` component.

Why: a tau move used to be a Streamlit rerun with a plotly ``newPlot`` per
changed figure (0.65-2.1 s until painted on a 2-core machine). Here the
browser holds every grid tau's views (:func:`core.frames.payload`, sent as
bytes) and repaints them itself on each slider event (``ui/scrubber.js``);
the server is asked only when the slider is released:

* onto a grid tau: one light rerun carries the tau to the URL and the export;
* between grid marks (or a method's schedule): the browser shows the nearest
  grid frame at once, marked as such, and the rerun computes the exact pass
  and sends it (``meta.pending_exact`` while it is under way).

Frames the background grid (:mod:`ui.prefetch`, nearest the slider first)
has not finished yet are "still coming": the component asks for a light
rerun every ``POLL_MS`` until the grid is complete.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import streamlit as st

from core import frames, methods, temperature
from core.errors import UserError
from ui import cache

KEY = "scrubber"
POLL_MS = 600
_FROM_SLIDER, _VERSION, _SIG = "_scrub_from_slider", "_scrub_version", "_scrub_sig"
_HERE = Path(__file__).parent
_component = st.components.v2.component(
    "aae_scrubber",
    html='<div class="aae"></div>',
    css=(_HERE / "scrubber.css").read_text(encoding="utf-8"),
    js=(_HERE / "scrubber.js").read_text(encoding="utf-8"),
)


def _released() -> None:
    """The slider was let go: its tau becomes the session's fixed tau (the URL, the export, the exact frame)."""
    state = st.session_state.get(KEY) or {}
    try:
        v = float(state.get("tau"))
    except (TypeError, ValueError):
        return
    if np.isfinite(v):
        st.session_state["tau_value"] = float(np.clip(round(v, 2), temperature.TAU_FLOOR, 1.0))
        st.session_state[_FROM_SLIDER] = True


def _noop() -> None:
    """A poll: the rerun itself is the point (frames the background grid finished since)."""


def _in_fragment_rerun() -> bool:
    """Whether this run reruns only a fragment (``st.rerun(scope="fragment")`` is refused in a full run)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx(suppress_warning=True)
    return bool(ctx is not None and ctx.fragment_ids_this_run)


def grid_tau(schedule) -> float | None:
    """The grid tau a schedule is, or None (a per-layer / per-row schedule, or a tau between grid marks)."""
    if isinstance(schedule, temperature.RowTau):
        return None
    a = np.asarray(schedule, dtype=float)
    if a.ndim:
        return None
    t = round(float(a), 2)
    return t if abs(t - float(a)) < 1e-9 and t in frames.SCRUB_GRID else None


def shown_tau(ctx) -> float:
    """The tau the slider shows: the person's own for 'fixed', else the method's resolved (mean) tau."""
    if ctx.method == "fixed":
        return round(float(ctx.tau_input), 2)
    return float(np.clip(round(ctx.tau_mean, 2), temperature.TAU_FLOOR, 1.0))


def _tau_version(ctx, tau: float) -> int:
    """A number that changes when tau changed anywhere but on the slider itself (a method, the tour, a link).

    The browser moves its slider to the server's tau only when this changes:
    the echo of its own release must not pull back a slider that has already
    moved on (two quick key presses would otherwise jump back one step).
    """
    ss = st.session_state
    sig = (ctx.method, round(tau, 2))
    if ss.get(_SIG) != sig:
        if not ss.get(_FROM_SLIDER):
            ss[_VERSION] = ss.get(_VERSION, 0) + 1
        ss[_SIG] = sig
    ss[_FROM_SLIDER] = False
    return ss.get(_VERSION, 0)


def _doc_id(ctx, probes, spec: frames.ViewSpec, log: bool) -> str:
    """What changes the payload's structure (the browser rebuilds its views when it changes)."""
    raw = repr((cache.mkey(ctx.loaded), ctx.request, ctx.targets, ctx.cosine_scale, probes, spec, log))
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def scrubber(ctx, probes, spec: frames.ViewSpec, log: bool) -> dict:
    """Draw the component for the context's document and return the runs the rest of the page shows.

    Returns ``{"base", "chosen", "ref"}``: the tau = 1 run (the model as
    trained), the run of the chosen tau (None while its exact pass is still
    to come) and the L_tr reference.
    """
    loaded, req = ctx.loaded, ctx.request
    base_settings = replace(ctx.run_settings(tau=1.0, method="none", probes=probes), cosine_scale=None)
    base = cache.run(loaded, req, base_settings)
    ref = cache.run_reference(loaded, req, ctx.targets, None)
    grid_settings = ctx.run_settings(tau=1.0, method="fixed", probes=probes)
    at = lambda t: replace(grid_settings, tau=t)  # noqa: E731
    grid = {t: cache.run(loaded, req, at(t)) for t in frames.SCRUB_GRID if cache.has_run(loaded, req, at(t))}
    g = grid_tau(ctx.schedule)
    if g is not None and g not in grid:  # the person is waiting on this very frame: compute it now
        grid[g] = cache.run(loaded, req, at(g))
    chosen_settings = ctx.run_settings(probes=probes)
    exact = pending = None
    if g is None:
        if cache.has_run(loaded, req, chosen_settings):
            exact = cache.run(loaded, req, chosen_settings)
        else:
            pending = round(ctx.tau_mean, 4)
    tau = shown_tau(ctx)
    cache.want_grid(loaded, req, grid_settings, around=tau)
    missing = len(frames.SCRUB_GRID) - len(grid)
    cos = ctx.cosine_scale
    base_label = "tau = 1 (no alignment)" if not loaded.cosine else f"as trained: s = {float(loaded.cosine_scale):g}, tau = 1"
    title = f"Chosen: {methods.label(ctx.method)}" + (f", s = {cos:g}" if loaded.cosine and cos is not None else "")
    meta = {
        "doc_id": _doc_id(ctx, probes, spec, log),
        "tau": tau,
        "tau_version": _tau_version(ctx, tau),
        "disabled": ctx.method != "fixed",
        "chosen_title": title,
        "base_label": base_label,
        "log": bool(log),
        "pending_exact": pending,
        "poll_ms": POLL_MS if (missing or pending is not None) else 0,
        "note": "" if ctx.method == "fixed" else f"{methods.label(ctx.method)} resolves to tau = {ctx.tau_text()}",
    }
    data = frames.payload(base, ref, grid, exact, ctx.document.text, spec, meta=meta)
    _component(data=data, key=KEY, on_tau_change=_released, on_poll_change=_noop, width="stretch")
    chosen = grid.get(g) if g is not None else exact
    if pending is not None:
        # Drawn first (the nearest grid frame is on screen, marked "exact frame coming"), then computed,
        # then one more fragment run sends the exact frame.
        try:
            cache.run(loaded, req, chosen_settings)
        except UserError as err:
            st.error(str(err))
            return {"base": base, "chosen": None, "ref": ref}
        if _in_fragment_rerun():
            st.rerun(scope="fragment")
        # In a full run the component's own poll (``poll_ms``) fetches the exact frame a moment later.
    return {"base": base, "chosen": chosen, "ref": ref}
