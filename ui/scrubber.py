"""The scrubber: Explore's tau slider and its views as one ``st.components.v2`` component.

Why: a tau move used to be a Streamlit rerun with a plotly ``newPlot`` per
changed figure (0.65-2.1 s until painted on a 2-core machine). Here the
browser holds every grid tau's views (:func:`core.views.frames.payload`, sent as
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
import html
from pathlib import Path

import numpy as np
import streamlit as st

from core.errors import UserError
from core.mechanics.run_pass import Pass
from core.runs import methods, temperature, timing
from core.values.choice import Choice
from core.values.schedule import Schedule
from core.views import frames
from ui import cache, choices, long_work, message, prefetch, url
from ui.streamlit_private import in_fragment_rerun, session_id

KEY = "scrubber"
POLL_MS = 900
_FROM_SLIDER, _VERSION, _SIG = "_scrub_from_slider", "_scrub_version", "_scrub_sig"
_SENT = "_scrub_sent"  # the document and grid frames this session's browser was last sent
_HERE = Path(__file__).parent
_component = st.components.v2.component(
    "aae_scrubber",
    html='<div class="aae"></div>',
    css=(_HERE / "scrubber.css").read_text(encoding="utf-8"),
    js=(_HERE / "scrubber.js").read_text(encoding="utf-8"),
)


def _released() -> None:
    """The slider was let go: its value becomes the session's fixed tau, or its CosScale on the s axis
    (the URL, the export, the exact frame)."""
    ss = st.session_state
    state = ss.get(KEY) or {}
    try:
        v = float(state.get("value"))
    except (TypeError, ValueError):
        return
    if not np.isfinite(v):
        return
    if ss.get(AXIS_KEY) == "s" and ss.get("_scrub_s_range"):
        lo, hi = ss["_scrub_s_range"]
        choices.put("cos_scale", float(np.clip(round(v * 2) / 2, lo, hi)))
    else:
        choices.put("tau_value", float(np.clip(round(v, 2), temperature.TAU_FLOOR, 1.0)))
    ss[_FROM_SLIDER] = True


AXIS_KEY = "ex_axis"
AXES = {"tau": "tau", "s": "CosScale s"}


def s_grid(loaded) -> tuple[float, ...]:
    """15 scales, log-spaced over the slider's range, the trained s among them, on the slider's 0.5 steps."""
    lo, hi = choices.cos_range(loaded)
    s0 = float(loaded.cosine_scale)
    vals = {round(float(v) * 2) / 2 for v in np.geomspace(max(lo, s0 / 8), hi, 14)} | {round(s0 * 2) / 2}
    return tuple(sorted(vals))


def _polled() -> None:
    """A poll: the rerun itself is the point (frames the background grid finished since). A browser that got a
    delta for a document it does not hold (its component was mounted anew) asks for everything ("full")."""
    if (st.session_state.get(KEY) or {}).get("poll") == "full":
        st.session_state[_SENT] = None


def _delta(doc_id: str, grid: dict, exact) -> list[float] | None:
    """The grid frames to send: only those new since this session's last payload of the same document, in a
    fragment rerun (a poll, a release); None (everything) otherwise.

    What was sent is recorded only once the payload is handed to Streamlit (:func:`_handed`): a run interrupted
    before (a newer rerun stops it at its next element) sent nothing. Even a handed payload can be dropped (a new
    run clears the messages still queued), so the browser checks each delta's ``held`` list and asks for
    everything when it lacks a frame (``ui/scrubber.js``)."""
    sent = st.session_state.get(_SENT)
    if not (in_fragment_rerun() and sent and sent["doc"] == doc_id):
        return None
    return [t for t in grid if f"{t:.2f}" not in sent["keys"]]


def _handed(doc_id: str, grid: dict) -> None:
    """Record the payload just given to Streamlit (what :func:`_delta` sends the next one relative to)."""
    st.session_state[_SENT] = {"doc": doc_id, "keys": {f"{t:.2f}" for t in grid}}


def grid_tau(schedule) -> float | None:
    """The grid tau a schedule is, or None (a per-layer / per-row schedule, or a tau between grid marks)."""
    value = Schedule.of(schedule).scalar
    if value is None:
        return None
    t = round(value, 2)
    return t if abs(t - value) < 1e-9 and t in frames.SCRUB_GRID else None


def shown_tau(ctx) -> float:
    """The tau the slider shows: the person's own for a fixed tau, else the method's resolved (mean) tau, as
    every slider shows one (:func:`ui.choices.slider_tau`)."""
    own = methods.get(ctx.choice.method).takes_value
    return choices.slider_tau(ctx.tau_input if own else ctx.choice.tau, ctx.tokens)


def _tau_version(ctx, tau: float, axis: str = "tau") -> int:
    """A number that changes when tau changed anywhere but on the slider itself (a method, the tour, a link).

    The browser moves its slider to the server's tau only when this changes:
    the echo of its own release must not pull back a slider that has already
    moved on (two quick key presses would otherwise jump back one step).
    """
    ss = st.session_state
    sig = (axis, ctx.choice.method, round(tau, 2))
    if ss.get(_SIG) != sig:
        if not ss.get(_FROM_SLIDER):
            ss[_VERSION] = ss.get(_VERSION, 0) + 1
        ss[_SIG] = sig
    ss[_FROM_SLIDER] = False
    return ss.get(_VERSION, 0)


def _doc_id(ctx, probes, spec: frames.ViewSpec, log: bool, axis: str) -> str:
    """What changes the payload's structure (the browser rebuilds its views when it changes)."""
    fixed = Schedule.of(ctx.choice.tau).key() if axis == "s" else ctx.choice.cosine_scale
    raw = repr(
        (cache.mkey(ctx.loaded), ctx.request, ctx.choice.targets, fixed, probes, spec, log, axis, ctx.choice.scheme)
    )
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def map_note(ctx) -> str:
    """The maps' caption for a rotary masked-LM model (no needle, no question): what the rows and columns are, and
    the chosen position scheme's mask drawn over the chosen map."""
    note = (
        "Rows are queries, columns keys, every token of the masked text (its masked positions read the mask "
        "token). The left map is the model as trained (plain RoPE, tau = 1); the right one the chosen setting."
    )
    entry = ctx.choice.scheme.entry
    if entry.mask is not None:
        note += (
            f" Grey veil on the right map: the pairs {entry.short} masks out (a cell's veil is the share of its "
            "query-key pairs that no query sees), so the band and any sink columns stand out."
        )
    elif not ctx.choice.scheme.is_plain:
        note += f" {entry.short} masks no keys: every pair is seen."
    return note


def masked_cards(ctx, base_settings, grid_settings: dict, exact_settings) -> dict[str, dict]:
    """The masked-token cards of a masked-LM model's frames (:func:`ui.cache.mlm_card`, one fused pass each, kept):
    the model as trained, the L_tr reference, every grid value shown and the exact setting."""
    loaded, req = ctx.loaded, ctx.request
    out = {
        "base": cache.mlm_card(loaded, req, base_settings[0]),
        "ref": cache.mlm_card(loaded, req, base_settings[0].with_(targets=ctx.choice.targets), reference=True),
    }
    out.update({k: cache.mlm_card(loaded, req, s[0]) for k, s in grid_settings.items()})
    if exact_settings is not None:
        out["exact"] = cache.mlm_card(loaded, req, exact_settings[0])
    return out


def scrubber(ctx, probes, spec: frames.ViewSpec, log: bool) -> dict:
    """Draw the component for the context's document and return the runs the rest of the page shows.

    Returns ``{"base", "chosen", "ref"}``: the tau = 1 run (the model as
    trained), the run of the chosen tau (None while its exact pass is still
    to come) and the L_tr reference.
    """
    loaded, req = ctx.loaded, ctx.request
    ss = st.session_state
    chosen_settings = ctx.pair(probes=probes)  # (choice, how): a pass's two values
    tau = shown_tau(ctx)
    axis = ss.get(AXIS_KEY, "tau") if loaded.cosine else "tau"
    cos = ctx.choice.cosine_scale
    if axis == "s":  # CosScale over its grid, at the chosen tau
        values = s_grid(loaded)
        at = lambda v: (chosen_settings[0].with_(cosine_scale=v), chosen_settings[1])  # noqa: E731
        g = round(float(cos) * 2) / 2 if cos is not None and round(float(cos) * 2) / 2 in values else None
        here = float(cos if cos is not None else loaded.cosine_scale)
        lo, hi = ss["_scrub_s_range"] = choices.cos_range(loaded)
        axis_meta = {"name": "s", "label": AXES["s"], "min": lo, "max": hi, "step": 0.5}
        job = prefetch.Job(loaded, req, *chosen_settings, around=here, axis="s", values=values)
    else:
        values = frames.SCRUB_GRID
        grid_settings = ctx.pair(tau=1.0, method=methods.FIXED, probes=probes)
        at = lambda t: (grid_settings[0].with_(tau=t), grid_settings[1])  # noqa: E731
        g = grid_tau(ctx.choice.tau)
        here = tau
        axis_meta = {"name": "tau", "label": AXES["tau"], "min": temperature.TAU_FLOOR, "max": 1.0, "step": 0.01}
        job = prefetch.grid_job(loaded, req, *grid_settings, around=tau)
    # the left column is the model as trained: tau = 1, its own CosScale, plain RoPE (no position scheme)
    base_settings = (Choice(methods.AS_TRAINED, targets=ctx.choice.targets), Pass(probes=probes))  # trained s, plain
    # Above the component: while a new document's first passes run, what they are and how far (empty otherwise).
    # One container per run at most: a second .container() of the same placeholder would remount the component.
    slot = st.empty()
    # A new document (its tau = 1 pass not made yet): its first passes run here, the old views hidden meanwhile.
    # A grid frame still coming on a known document is not a new document: the views stay (and keep the slider's
    # keyboard focus: hiding them mid-grid sent a clicker's PageDown to the page body, issue 59 point 1); the
    # browser shows the nearest frame marked "still being computed" until the pass below is over.
    new_document = not cache.has_run(loaded, req, *base_settings)
    first = [
        s
        for s in (base_settings, None if g is None or not new_document else at(g))
        if s is not None and not cache.has_run(loaded, req, *s)
    ]
    first = [
        s
        for i, s in enumerate(first)
        if all(cache.attention_key(s[0]) != cache.attention_key(o[0]) or s[1].probes != o[1].probes for o in first[:i])
    ]
    if first:
        per = cache.pass_estimate(loaded, req)
        total = None if per is None else per * len(first)
        n_pass = f"{len(first)} pass{'es' if len(first) > 1 else ''}"
        what = (
            f"This document is {ctx.tokens:,} tokens ({ctx.ratio:.2f}× L_tr). Its views need {n_pass} first: "
            f"{timing.describe(total)} on this machine ({timing.basis(timing.model_key(loaded), ctx.tokens)}); its "
            f"{len(values)} grid frames follow in the background, "
            f"{timing.describe(None if per is None else per * len(values))} more."
        )
        if not long_work.ask((cache.mkey(loaded), req), total, what, slot.container()):
            prefetch.prefetcher().want(session_id(), None)  # nothing starts in the background either
            return {"base": None, "chosen": None, "ref": None}
    prefetch.prefetcher().want(session_id(), job)  # a new document's grid starts now, beside its first passes
    if first:
        with slot.container():
            long_work.hide_stale()  # the old document's views are not this one's: hidden until this run ends
            st.info(f"**Computing the new document.** {what}")
            bar = st.progress(0.0, text="starting…")
        for i, s in enumerate(first):
            label = f"pass {i + 1} of {len(first)} ({'tau = 1' if s is base_settings else 'the chosen ' + AXES[axis]}):"
            with long_work.layer_progress(bar, label, per, loaded.n_layers):
                cache.run(loaded, req, *s)
        slot.empty()
    base = cache.run(loaded, req, *base_settings)
    ref = cache.run_reference(loaded, req, Choice(targets=ctx.choice.targets))
    grid = {v: cache.run(loaded, req, *at(v)) for v in values if cache.has_run(loaded, req, *at(v))}
    if g is not None and g not in grid:  # the person is waiting on this very frame: compute it now (the component
        grid[g] = cache.run(loaded, req, *at(g))  # stays on screen meanwhile, and the slider keeps its focus)
    later = None
    exact = pending = None
    if g is None:
        if cache.has_run(loaded, req, *chosen_settings):
            exact = cache.run(loaded, req, *chosen_settings)
        else:
            # A release between grid marks or a method's schedule: the browser shows the nearest grid frame, marked
            # "exact frame coming", and the URL already names the choice (issue 59 point 7: it waited for the pass).
            pending = round(here if axis == "s" else ctx.tau_mean, 4)
            later = chosen_settings
    missing = len(values) - len(grid)
    # A grid whose background pass failed (too long, out of memory) brings no more frames: stop polling for them
    # and say why (each poll is a rerun; a page that polls for good never settles). A release onto a missing grid
    # value still computes its frame above.
    stalled = prefetch.prefetcher().failure(job) if missing else None
    base_label = (
        "tau = 1 (no alignment)" if not loaded.cosine else f"as trained: s = {float(loaded.cosine_scale):g}, tau = 1"
    )
    title = f"Chosen: {methods.label(ctx.choice.method)}"
    scheme = ctx.choice.scheme.entry
    if not loaded.seq2seq:  # a rotary model: the left column is plain RoPE as trained, the right under the scheme
        base_label = "as trained: plain RoPE, tau = 1" + (
            f", s = {float(loaded.cosine_scale):g}" if loaded.cosine else ""
        )
        if not ctx.choice.scheme.is_plain:
            title += f" + {scheme.short}" + (
                f" ({ctx.choice.scheme.params_text()})" if ctx.choice.scheme.params else ""
            )
    if loaded.cosine:
        title += (
            f", tau = {ctx.tau_text()}"
            if axis == "s"
            else f", s = {float(cos if cos is not None else loaded.cosine_scale):g}"
        )
    meta = {
        "doc_id": _doc_id(ctx, probes, spec, log, axis),
        "tau": tau,
        "value": here,
        "axis": axis_meta,
        "tau_version": _tau_version(ctx, here if axis == "s" else tau, axis),
        "disabled": axis == "tau" and not methods.get(ctx.choice.method).takes_value,
        "chosen_title": title,
        "base_label": base_label,
        "log": bool(log),
        "pending_exact": pending,
        "poll_ms": POLL_MS if ((missing and stalled is None) or pending is not None) else 0,
        "note": "; ".join(
            n
            for n in (
                ""
                if methods.get(ctx.choice.method).takes_value
                else f"{methods.label(ctx.choice.method)} resolves to tau = {ctx.tau_text()}",
                ""
                if stalled is None
                else f"the background grid stopped ({html.escape(stalled)}): release the slider on a grid value to "
                "compute it",
            )
            if n
        ),
    }
    mask = None
    if not loaded.seq2seq:
        if choices.masked_lm(loaded):
            meta["map_note"] = map_note(ctx)
        edges = base.probes.heatmap_edges
        if edges is not None:
            mask = cache.scheme_mask(loaded, ctx.choice.scheme, int(base.tokens), edges)
    only = _delta(meta["doc_id"], grid, exact)
    cards = None
    if choices.masked_lm(loaded):  # a masked-LM model: each frame's masked-token card in place of an answer
        cards = masked_cards(
            ctx, base_settings, {f"{v:.2f}": at(v) for v in grid}, chosen_settings if exact is not None else None
        )
    data = frames.payload(
        base, ref, grid, exact, ctx.document.text, spec, grid_taus=values, meta=meta, only=only, cards=cards, mask=mask
    )
    _component(data=data, key=KEY, on_value_change=_released, on_poll_change=_polled, width="stretch")
    _handed(meta["doc_id"], grid)
    chosen = grid.get(g) if g is not None else exact
    if later is not None:
        # The page is drawn first, the nearest grid frame marked "exact frame coming"; the component's poll fetches
        # the frame this pass makes.
        url.sync(ctx)  # the address bar names the choice now, not once the pass is over
        try:
            cache.run(loaded, req, *later)
        except UserError as err:
            st.error(message(err))
    return {"base": base, "chosen": chosen, "ref": ref}
