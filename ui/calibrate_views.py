"""Calibrate's sections, one function each: the page (app_pages/calibrate.py) only arranges them."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import streamlit as st

from core.errors import UserError
from core.mechanics.probes import ProbeSpec
from core.mechanics.run_pass import Pass
from core.runs import calibration, methods, temperature, timing
from core.values.choice import Choice
from core.values.schedule import Schedule
from core.views import plots, tables
from ui import cache, chart, choices, csv_of, figure_cache, pass_gate, plural, prefetch, theory_views, user_errors
from ui import export as ui_export
from ui.page_state import PageState

EXPORT_MODES = ("fixed tau (used as is)", "method (re-resolved at the run's length)")
GRID = temperature.GRID
#: The closed form Calibrate suggests when Algorithm 1 stops at its range's end (the registry's advice: it and the
#: next one hold up at 8x and 16x L_tr on the bundled model where Algorithm 1 falls behind, docs/results.md).
FALLBACK = methods.ADVISED[0]


def use_tau(method: str, value) -> None:
    """on_click: put a calibrated tau into the sidebar (a number -> fixed + slider; a schedule -> that method).
    A per-row schedule (Llama 4, Qwen's log-n by position, adaptive temperature) is no number, not even adaptive
    temperature's base 1: the sidebar gets its method."""
    value = Schedule.of(value)
    if value.rows is not None or value.adaptive:
        choices.set_state(tau_method=method)
        st.session_state["cal_used"] = f"{methods.label(method)}: {value.describe()}"
        return
    a = np.asarray(value)
    if a.ndim == 0:
        choices.set_state(tau_method=methods.FIXED, tau_value=choices.slider_tau(value, 1))
    else:
        choices.set_state(tau_method=method)
    st.session_state["cal_used"] = f"{methods.label(method)}: tau = {np.round(a, 3).tolist()}"


def use_method(method: str) -> None:
    """on_click: put a method (resolved again at each document's length) into the sidebar's Method box."""
    choices.set_state(tau_method=method)
    st.session_state["cal_used"] = methods.label(method)


def prop1_note(value, stats: dict) -> str:
    """Why Prop. 1 can read above 1 or 'n/a', said beside the table that shows it (docs/library.md, Notes on choices)."""
    odd = isinstance(value, str) or (value is not None and float(value) > 1)
    sig = ""
    if stats.get("sigma_ex") is not None and stats.get("sigma_tr") is not None:
        sig = f" Layer 0's logits have sigma = {stats['sigma_ex']:.2f} here and {stats['sigma_tr']:.2f} at L_tr."
    head = (
        (
            "**Prop. 1 reads "
            + ("'n/a' (no root)" if isinstance(value, str) else f"{float(value):.3f}, above 1")
            + " here.** "
        )
        if odd
        else "**About Prop. 1/2.** "
    )
    return (
        head + "Prop. 1 and 2 rest on a Gaussian model of the logits, which holds while sigma/tau is below about "
        f"1.5.{sig} With a large sigma Prop. 1 can give tau > 1 or no root at all. The value is reported as computed, "
        "not clipped."
    )


#: Why Prop. 1/2 read "n/a" on a decoder-only LM (said beside the table that shows it).
DECODER_PROP_NOTE = (
    "**Prop. 1/2 on a decoder.** Both solve for tau from the spread sigma of layer 0's sorted logits over rows that "
    "see every key (an encoder's). A causal row sees only the keys before it, and its raw logits over the rest are "
    "not attention, so this model has no such sigma: they read 'n/a'. Algorithm 1 measures the question's rows "
    "(the prompt's last, which see nearly every key) and needs no model of the logits."
)


class _NotKnown(Exception):
    """A pass :func:`known` would need is not in the shared stores."""


def _stats(ctx: PageState, doc_key, tau) -> temperature.LayerStats | None:
    return cache.known_stats(ctx.loaded, doc_key, tau, ctx.choice)


def known(ctx: PageState, fast: bool, samples: int) -> dict | None:
    """Algorithm 1 for both criteria without a forward pass, or None when a pass is missing.

    First the calibration store (this very calibration ran before); then, for
    one document, the statistics store that every pass of this document fills
    (:func:`ui.cache.known_stats`): Explore's background grid (:mod:`ui.prefetch`),
    the sidebar's Algorithm 1 and the L_tr reference Explore reads. The numbers
    are those :func:`ui.cache.calibrate_both` gives: the same statistics through
    the same :func:`core.runs.calibration.both_criteria`.
    """
    cals = cache.calibrate_both(ctx.loaded, ctx.request, ctx.choice, fast=fast, samples=samples, compute=False)
    if cals is not None or samples > 1:  # several documents: their passes are not in the shared grid
        return cals
    reference = _stats(ctx, ("ref", ctx.request), 1.0)
    if reference is None:
        return None

    def measure(tau) -> temperature.LayerStats:
        hit = _stats(ctx, ctx.request, tau)
        if hit is None:
            raise _NotKnown
        return hit

    try:
        return calibration.both_criteria(measure, reference, fast=fast)
    except _NotKnown:
        return None


def missing(ctx: PageState) -> tuple[list[float], bool]:
    """The grid taus of this document with no statistics yet, and whether its L_tr reference is missing."""
    return [t for t in GRID if _stats(ctx, ctx.request, t) is None], _stats(ctx, ("ref", ctx.request), 1.0) is None


def _points(cals: dict) -> int:
    """Grid points a calibration evaluated (both criteria share their passes)."""
    return len({i for cal in cals.values() for i, v in enumerate(cal.curve) if v is not None})


def run(ctx: PageState, button_col) -> dict | None:
    """Algorithm 1 for both criteria: at once when its passes are already made (:func:`known`), else a plan note and
    the button that runs what is missing (None until then; the sidebar's bisection meanwhile, when it is there)."""
    ss = st.session_state
    fast, samples = bool(ss["cal_fast"]), int(ss["cal_samples"])
    cals = known(ctx, fast, samples)
    if cals is not None:
        return cals
    # The whole curve is not there, but the bisection the sidebar's Algorithm 1 made may be: show it meanwhile.
    shown = known(ctx, True, 1) if not fast and samples == 1 else None
    mk = timing.model_key(ctx.loaded)
    per_doc = timing.algorithm1_passes(len(GRID), fast)
    ready = 0
    if samples == 1:  # the shared grid: only what is missing runs
        todo, ref_todo = missing(ctx)
        ready = len(GRID) - len(todo)
        work = [(min(len(todo), per_doc), ctx.tokens), (int(ref_todo), ctx.train_length)]
    else:
        work = [(per_doc * samples, ctx.tokens), (samples, ctx.train_length)]
    planned = timing.total(mk, work)
    what = "Algorithm 1" if shown is None else "The whole curve"
    note = timing.plan_note(what, mk, work) + (" Bisection stops early, so this is an upper bound." if fast else "")
    if ready:
        note += (
            f" {ready} of the {len(GRID)} grid passes of this document {'is' if ready == 1 else 'are'} already "
            "made (Explore's background grid, the sidebar's Algorithm 1); the rest are computed once and shared "
            "too."
        )
    elif samples == 1:
        note += " Results are cached (and shared with Explore and the sidebar)."
    else:
        note += " The documents' passes are their own (not Explore's grid); results are cached."
    if shown is not None:
        note = (
            f"Shown below: Algorithm 1 by bisection, from the {plural(_points(shown), 'tau')} the sidebar's "
            "Algorithm 1 already measured, so the curves have gaps. " + note
        )
    st.info(note)
    label = "Run Algorithm 1" if shown is None else "Complete the curves"
    if button_col.button(label, type="primary", key="cal_run"):
        text = "Algorithm 1: forward passes over its range of tau…"
        left = timing.Countdown(planned)  # a time left that never jumps back up (issue 59 point 8)
        bar = st.progress(0.0, text=left.text(text, 0.0, 0.0))
        t0 = time.perf_counter()

        def progress(f: float) -> None:
            f = min(1.0, f)
            bar.progress(f, text=left.text(text, f, time.perf_counter() - t0))

        with user_errors(bar):
            cache.calibrate_both(ctx.loaded, ctx.request, ctx.choice, fast=fast, samples=samples, progress=progress)
        bar.empty()
        st.rerun()  # redraw from the cache, without the 'will run' note
    # The rest is on its way (Explore's background grid of this document): look again shortly.
    if shown is None and samples == 1 and grid_on_its_way(ctx):
        wait_key = (ctx.model_ref, ctx.request, fast, cache.attention_key(ctx.choice.with_(tau=1.0)))
        if ss.get("_cal_stalled") != (wait_key, ready):  # a stalled grid that moved since is looked at again
            wait_for_grid(ctx, fast, wait_key)
    return shown


def grid_on_its_way(ctx: PageState) -> bool:
    """Whether the background prefetcher (:mod:`ui.prefetch`) has a wish for this document, from any session."""
    mk = cache.mkey(ctx.loaded)
    return any(
        job.request == ctx.request and cache.mkey(job.loaded) == mk for job in prefetch.prefetcher().wanted().values()
    )


#: Seconds between looks at the shared grid while the background fills it, and the least time without a new pass
#: before Calibrate stops looking (a grid nobody computes any more: another document on Explore, a failed pass).
WAIT_EVERY, WAIT_PATIENCE = 2.0, 30.0


@st.fragment(run_every=WAIT_EVERY)
def wait_for_grid(ctx: PageState, fast: bool, key) -> None:
    """While Explore's background grid fills in this document's passes, look again every few seconds and draw
    the curves (a whole-page rerun) as soon as they are all there; stop looking when no new pass arrives."""
    ss = st.session_state
    if known(ctx, fast, 1) is not None:
        st.rerun()
    todo, _ = missing(ctx)
    ready, now = len(GRID) - len(todo), time.monotonic()
    last = ss.get("_cal_wait")
    per_pass = timing.estimate(timing.model_key(ctx.loaded), ctx.tokens) or 0.0
    if last is None or last[0] != key or last[1] != ready:
        ss["_cal_wait"] = (key, ready, now)
    elif now - last[2] > max(WAIT_PATIENCE, 3 * per_pass):
        ss["_cal_stalled"] = (key, ready)
        st.rerun()
    st.caption(
        f"The background grid of this document is being computed ({ready} of {len(GRID)} passes ready): the "
        "curves appear here by themselves when it is complete, or press the button for the rest now."
    )


def band_note(band: dict | None, samples: int = 1) -> str:
    """The sentence under a pick's card: its bootstrap band over the calibration documents, or how to get one."""
    if not band:
        if samples >= 2:  # pasted text calibrates on itself, whatever the number asked for
            return "No band for this pick: a band needs 2 or more distinct calibration documents."
        return "Set documents >= 2 for a band of the pick (its spread over the calibration documents)."
    level = f"{100 * float(band['level']):g} %"
    n = band.get("documents")
    over = f"over the {n} documents" if n else "over the calibration documents"
    extra = f" ({band['resamples']} resamples)" if band.get("resamples") else ""
    return (
        f"{level} bootstrap band {over}: tau in [{float(band['low']):.2f}, {float(band['high']):.2f}]{extra}; "
        "shaded on the curve."
    )


def curves(cals: dict) -> None:
    """S_ex(tau) per criterion against S_tr(1), the picks, and buttons that put a pick in the sidebar."""
    st.subheader("S_ex(tau) against S_tr(1)")
    st.caption(
        "Each curve is the mean statistic over all layers, heads and rows of this document at each tau; the dashed "
        "line is the same statistic at L_tr with tau = 1. Algorithm 1 picks the tau of its range closest to the line "
        "(red). Pmax rises and entropy falls as tau shrinks: the attention sharpens (paper Algorithm 1, Fig. 4). "
        "Where a curve ends before it meets the line, the pick is only where the search stopped: the card says so."
    )
    bands = {c: cal.band for c, cal in cals.items()}  # None: fewer than 2 calibration documents
    panels = {
        c: {
            "grid": cal.grid,
            "curve": cal.curve,
            "reference": cal.reference,
            "tau": cal.tau,
            **({"band": (bands[c]["low"], bands[c]["high"])} if bands[c] else {}),
        }
        for c, cal in cals.items()
    }
    chart(plots.calibration_curves(panels), "cal_curves")
    cols = st.columns(len(cals))
    for col, (crit, cal) in zip(cols, cals.items()):
        at_pick = dict(zip(cal.grid, cal.curve)).get(cal.tau)
        gap = None if at_pick is None else round(float(at_pick) - float(cal.reference), 4) + 0.0  # no -0.0
        # the match left at the pick; no arrow when it is exact at the shown precision (a zero has no direction)
        col.metric(
            f"Algorithm 1 ({crit})",
            f"tau = {cal.tau:.2f}",
            delta=None if gap is None else f"{gap:+.4f} vs S_tr(1)",
            delta_color="off",
            delta_arrow="off" if gap == 0 else "auto",
            help=f"{cal.passes} passes; S_tr(1) = {cal.reference:.4f}; the delta is S_ex(tau) - S_tr(1) at the pick.",
        )
        col.caption(band_note(bands[crit], int(st.session_state.get("cal_samples", 1))))
        col.button(f"Use tau = {cal.tau:.2f}", key=f"use_{crit}", on_click=use_tau, args=(crit, cal.tau))
        if not cal.reached:  # the pick is where the search stopped, not a match: say so, and by how much
            col.warning(unreached_text(cal))

    st.download_button(
        "curves.csv",
        csv_of(lambda: tables.calibration_table(cals)),
        "algorithm1_curves.csv",
        "text/csv",
        key="dl_curves",
        on_click="ignore",
    )


def stopped_at_end(cal: temperature.Calibration) -> bool:
    """Algorithm 1 ran out of range: the curve never met the reference and the pick is the smallest tau searched."""
    return not cal.reached and float(cal.tau) <= min(cal.grid) + 1e-9


def unreached_text(cal: temperature.Calibration) -> str:
    """Where the curve stayed and by how much, in words (no signed 'short by'): at the end of the range searched,
    or already past the reference at its start."""
    side = "below" if float(cal.gap) < 0 else "above"
    name = "Pmax" if cal.criterion == "pmax" else "entropy"
    if stopped_at_end(cal):
        return (
            f"The {name} curve stays {abs(float(cal.gap)):.4f} {side} the L_tr reference all the way down to "
            f"tau = {cal.tau:.2f} (the end of the range searched): tau = {cal.tau:.2f} is where the search "
            "stopped, not a match."
        )
    return (
        f"The {name} curve is already {abs(float(cal.gap)):.4f} {side} the L_tr reference at tau = {cal.tau:.2f} "
        "(the start of the range searched), and a smaller tau only moves it further away: by this criterion the "
        "document needs no sharpening, and no tau in the range matches."
    )


def advice(ctx: PageState, cals: dict) -> None:
    """When Algorithm 1 stopped at its range's end without reaching the reference: say that a closed form is the
    better bet there, with a button that puts log-length in the sidebar."""
    ended = [c for c, cal in cals.items() if stopped_at_end(cal)]
    if not ended:
        return
    forms = {}
    for name in methods.ADVISED:
        try:
            forms[name] = methods.formula(name, ctx.train_length, ctx.tokens, ctx.loaded.d_kv)
        except UserError:
            pass
    which = " and ".join("Pmax" if c == "pmax" else "entropy" for c in ended)
    values = " and ".join(f"{methods.get(m).short} (tau = {t:.3f})" for m, t in forms.items())
    box = st.container(border=True, key="cal_advice")
    box.markdown(
        f"**A closed form is the better bet here.** Algorithm 1 ({which}) ran out of range before "
        + ("its curve met" if len(ended) == 1 else "either curve met")
        + " the L_tr reference, so the tau it gives is only the end of the range searched, not a match. "
        + (f"{values} need no search. " if values else "")
        + "Where Algorithm 1 runs out of range, docs/results.md's tables mostly favour them: on the bundled model's "
        "pass key at 16× L_tr, where Algorithm 1 (Pmax) stops at 0.50 without a match, log-length answers 100 % and "
        "YaRN 99 % of the documents against its 75 %."
    )
    if FALLBACK in forms:
        if ctx.choice.method == FALLBACK:
            box.caption(f"Done: the sidebar's Method box says '{methods.label(FALLBACK)}' now.")
        else:
            box.button(
                f"Use {methods.get(FALLBACK).short} (tau = {forms[FALLBACK]:.3f})",
                key="use_fallback",
                type="primary",
                on_click=use_method,
                args=(FALLBACK,),
                help=f"Sets the sidebar's Method box to {methods.label(FALLBACK)}: re-resolved at each "
                "document's length, no pass needed.",
            )


def _stats_settings(ctx: PageState, tau) -> tuple[Choice, Pass]:
    """The stats-only pass Algorithm 1 makes of this document at tau (the same cache key: a hit after one document)."""
    return ctx.choice.with_(tau=tau, method=None), Pass(probes=ProbeSpec.stats_only(), generate=False)


def _head_settings(ctx: PageState, tau) -> tuple[Choice, Pass]:
    """A pass with each head's Pmax at tau, the one already made when there is one: Algorithm 1's own
    stats-only pass, or at tau = 1 the pass Theory and Prop. 1/2 read (the prefetcher makes it ahead)."""
    own = _stats_settings(ctx, tau)
    if cache.has_run(ctx.loaded, ctx.request, *own):
        return own
    if Schedule.of(tau).is_one:
        return cache.theory_pass(ctx.loaded, ctx.choice)
    return own


def per_head(ctx: PageState, cals: dict) -> None:
    """Each head's Pmax here over its own at L_tr, at tau = 1 and at Algorithm 1's Pmax pick; per-head Algorithm 1
    (its tau matrix and the heads it could not align) when it has been computed."""
    st.subheader("Per head: Pmax here over its value at L_tr")
    pick = float(cals["pmax"].tau)
    ph = cache.resolve_tau(ctx.loaded, ctx.request, methods.PER_HEAD, ctx.choice, compute=False)
    st.caption(
        "Each cell is one head's mean Pmax on this document over the same head's Pmax at L_tr with tau = 1: 1 "
        "(white) looks as in training. Algorithm 1 matches only the mean over every layer and head, so look for "
        "the heads it hides: **far above 1 (blue)** at its pick are heads the global tau has over-sharpened; "
        "**far below 1 (red)** are heads still dispersed. A head near 1 in both panels is saturated: its Pmax "
        "hardly depends on length or tau, yet it still counts in the mean."
    )
    settings = {
        "tau = 1": _head_settings(ctx, 1.0),
        f"Algorithm 1 (Pmax) pick, tau = {pick:.2f}": _head_settings(ctx, pick),
    }
    if ph is not None:
        settings["per-head Algorithm 1"] = _head_settings(ctx, ph[0])
    new = sum(not cache.has_run(ctx.loaded, ctx.request, *s) for s in settings.values())
    with (
        user_errors(),
        st.spinner(
            f"Per-head statistics ({plural(new, 'new pass', 'new passes')} at this length)…" + pass_gate.queue_note()
        ),
    ):
        # the L_tr reference Explore, Theory and Prop. 1/2 read: one pass for all of them
        ref = cache.run_reference(ctx.loaded, ctx.request, ctx.choice)
        panels = {name: cache.run(ctx.loaded, ctx.request, *s).probes.pmax[0] for name, s in settings.items()}
    chart(figure_cache.figure(plots.head_ratio_maps, panels, ref.probes.pmax[0]), "cal_head_pmax")
    if ph is None:
        st.caption(
            "Per-head Algorithm 1 (one tau per layer and head, each matched to that head's Pmax at L_tr) is "
            "not computed yet: choose 'per-head' in the sidebar's Method box to compute it "
            f"({len(temperature.GRID)} passes per layer: the whole grid, all of a layer's heads in each pass); "
            "its tau matrix and the heads it cannot align then appear here."
        )
        return
    schedule, info = ph
    tau = np.atleast_2d(np.asarray(schedule, dtype=float))
    unreached = [tuple(int(v) for v in h) for h in info.get("unreached_heads", [])]
    st.markdown("**Per-head Algorithm 1**: tau per layer (rows) and head (columns)")
    st.dataframe(
        pd.DataFrame(
            tau.round(3),
            index=[f"layer {l}" for l in range(tau.shape[0])],
            columns=[f"h{h}" for h in range(tau.shape[1])],
        ),
        width="content",
    )
    if unreached:
        st.caption(
            f"**{len(unreached)} of {tau.size} heads never reached their L_tr Pmax** inside the range searched "
            "(tau 1.0 down to 0.5) and stay "
            "at the default tau: " + ", ".join(f"layer {l} head {h}" for l, h in unreached) + "."
        )
    else:
        st.caption(f"Every one of the {tau.size} heads reached its own L_tr Pmax inside the range searched.")


#: Pixels per character of a table cell, with room to spare (the app's sans-serif at the dataframe's size measured
#: about 6.1 in Chromium), to size columns so that no text is cut; and the widest a note column gets (a longer
#: note is said in full under the table).
PX_PER_CHAR, PAD_PX, NOTE_MAX_PX = 7.0, 28, 480


#: Adaptive temperature's cell and note: a tau per query row that each pass computes from the row itself, so no
#: number stands for it here (:data:`core.values.schedule.ADAPTIVE`).
ADAPTIVE_CELL = "adaptive (per row, from its entropy)"
ADAPTIVE_NOTE = "tau = 1 / beta(H) per row, H its own entropy at tau = 1"


def tau_cell(tau, rows: int, train_length: int | None = None) -> tuple[str, str]:
    """A method's tau as a short cell ('0.7312', 'per head (2 x 4): 0.50 to 1.00, mean 0.712', '0.8861 (mean
    over 2,045 rows)', 'adaptive (per row, from its entropy)', 'n/a') and a note with what the short form leaves
    out (the reason of an 'n/a')."""
    if isinstance(tau, str):  # "n/a (why)"
        why = tau[len("n/a (") : -1] if tau.startswith("n/a (") and tau.endswith(")") else tau
        return "n/a", why
    tau = Schedule.of(tau)
    if tau.adaptive:  # no number before a pass (its base 1 is not its tau): the rule
        return ADAPTIVE_CELL, ADAPTIVE_NOTE
    if tau.rows is not None:
        floor = "L_tr" if train_length == tau.rows.floor_scale else f"{tau.rows.floor_scale:,}"
        return f"{tau.mean(rows):.4f} (mean over {rows:,} rows)", f"a tau per row: 1 before row {floor}, then smaller"
    a = np.asarray(tau)
    if a.ndim == 0:
        return f"{float(a):.4f}", ""
    if a.ndim == 1:
        if a.size <= 6:
            return tables.schedule_text(a), "one tau per encoder layer"
        return (
            f"per layer ({a.size}): {a.min():.2f} to {a.max():.2f}, mean {a.mean():.3f}",
            "layers 0, 1, …: " + tables.schedule_text(a),
        )
    return tables.schedule_text(a), "a tau per layer and head (the matrix: above)"


def taus_table(taus: dict, rows: int, train_length: int | None = None) -> pd.DataFrame:
    """Every method's tau for the page: the registry's label, the short tau and its note (:func:`tau_cell`)."""
    cells = [(m, methods.label(m), *tau_cell(t, rows, train_length)) for m, t in taus.items()]
    return pd.DataFrame(cells, columns=["method", "label", "tau", "note"])


def _px(texts) -> int:
    return int(max(len(str(t)) for t in texts) * PX_PER_CHAR) + PAD_PX


def column_config(table: pd.DataFrame) -> dict:
    """Columns wide enough for their longest text: the label and the tau are never cut; a note longer than
    :data:`NOTE_MAX_PX` is said in full under the table (:func:`long_notes`)."""

    def width(col: str, least: int) -> int:
        return max(least, _px([col, *table[col]]))

    return {
        "label": st.column_config.TextColumn(
            "method", width=width("label", 160), help="The method registry's name (the sidebar's Method box)"
        ),
        "tau": st.column_config.TextColumn(
            "tau", width=width("tau", 90), help="The tau this method gives this document; a schedule in short"
        ),
        "note": st.column_config.TextColumn(
            "note", width=min(NOTE_MAX_PX, width("note", 160)), help="What the short form leaves out"
        ),
    }


def long_notes(table: pd.DataFrame) -> list[str]:
    """Under the table, in full: why a method has no tau ('n/a'), and any note too long for its column."""
    out = []
    why = [f"{label}: {note}" for label, tau, note in zip(table["label"], table["tau"], table["note"]) if tau == "n/a"]
    if why:
        out.append("Why 'n/a': " + "; ".join(why) + ".")
    out += [
        f"{label}, in full: {note}."
        for label, tau, note in zip(table["label"], table["tau"], table["note"])
        if tau != "n/a" and _px([note]) > NOTE_MAX_PX
    ]
    return out


def _the_rest(ctx: PageState, taus: dict) -> tuple[dict, list[str]]:
    """``taus`` (the closed forms and Algorithm 1's grid picks) completed with every other registry method, in the
    registry's order (what the CLI's ``--method`` offers): tau = 1, the slider's fixed tau, every per-row schedule
    (Llama 4, Qwen's log-n by position: no pass), and each search of its own (refined, per layer, per head) when
    its passes are already cached; the searches not yet run, as ``(label, about how many passes)`` texts."""
    taus = dict(taus)
    missing = []
    for name, m in methods.REGISTRY.items():
        if name in taus:
            continue
        if m.constant is not None:
            taus[name] = m.constant
        elif m.takes_value:
            taus[name] = Schedule.of(ctx.tau_input)  # the person's own slider tau
        elif m.per == "row" and not m.measured:  # a tau per query row, from L_tr and the row's position alone
            taus[name] = cache.resolve_tau(ctx.loaded, ctx.request, name, ctx.choice)[0]
        elif m.measured:  # many passes: only once asked for
            got = cache.resolve_tau(ctx.loaded, ctx.request, name, ctx.choice, compute=False)
            if got is not None:
                taus[name] = got[0]
                continue
            n = m.passes(ctx.loaded.n_layers, ctx.loaded.n_heads)[0]
            if m.per in ("layer", "head"):
                missing.append(f"{m.label}, about {n // ctx.loaded.n_layers} passes per layer")
            else:
                missing.append(f"{m.label}, at most {n} passes")
    return {n: taus[n] for n in methods.NAMES if n in taus}, missing


def every_method(ctx: PageState, cals: dict) -> dict:
    """Every registry method's tau for this document, in the registry's order (closed forms, Algorithm 1, the
    per-row schedules with each row's tau drawn, tau = 1 and the slider's; the searches of their own when computed,
    else named) and a 'use' box."""
    ss = st.session_state
    st.subheader("Every method's tau for this document")
    st.caption(
        "log-length: log L_tr / log L (paper baseline); log-n (Qwen) and Scalable-Softmax give the same number in an "
        "encoder, and so do LongRoPE's factor and critical scaling at its default gamma from L_tr up. YaRN: "
        "(0.1 ln s + 1)^-2 with s = L / L_tr. Llama 4 and log-n (Qwen) per query position: a tau per query row, "
        "shown as its mean over the rows (rows before L_tr keep 1; each row's tau: the chart below). InfoScale: keeps attention entropy invariant with d = d_kv. "
        "Prop. 1 / Prop. 2: the paper's closed forms from the spread sigma of layer 0's sorted logits (Sec. 4), "
        "matching Pmax / entropy. Algorithm 1: the measured picks above. 'n/a' means the Gaussian model behind a "
        "formula does not fit these numbers."
    )
    est = timing.total(timing.model_key(ctx.loaded), [(1, ctx.tokens), (1, ctx.train_length)])
    with (
        user_errors(),
        st.spinner(
            "Closed forms (two passes for Prop. 1/2"
            + ("" if est is None else f", {timing.describe(est)}")
            + ")…"
            + pass_gate.queue_note()
        ),
    ):
        taus = (
            # a causal row has no sorted logits of its own (its raw logits include the keys it may not see): Prop. 1/2
            # have no sigma on a decoder and read "n/a"; the forms over L alone need no pass
            methods.closed_forms(ctx.train_length, ctx.tokens, ctx.loaded.d_kv, None, ctx.choice.params)
            if ctx.loaded.decoder_only
            else cache.closed_forms(ctx.loaded, ctx.request, ctx.choice, ctx.choice.params)
        )
    taus = {**taus, **{n: cals[m.grid_criterion].tau for n, m in methods.REGISTRY.items() if m.grid_criterion}}
    taus, missing = _the_rest(ctx, taus)
    table = taus_table(taus, ctx.tokens, ctx.train_length)
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_order=("label", "tau", "note"),
        column_config=column_config(table),
    )
    for line in long_notes(table):  # in full, whatever the width of the table's cells
        st.caption(line)
    theory_views.per_row_chart(
        ctx, {n: t for n, t in taus.items() if not isinstance(t, str) and Schedule.of(t).rows is not None}
    )
    st.caption(
        DECODER_PROP_NOTE
        if ctx.loaded.decoder_only
        else prop1_note(taus.get(methods.PROP1), cache.logit_stats(ctx.loaded, ctx.request, ctx.choice))
    )
    if missing:
        st.caption(
            "Not in the table yet: "
            + "; ".join(missing)
            + ". Choose "
            + ("it" if len(missing) == 1 else "one")
            + " in the sidebar's Method box to compute it."
        )
    usable = [m for m, t in taus.items() if not isinstance(t, str)]
    ss.setdefault("cal_pick", methods.ALGORITHM1["pmax"])
    if ss["cal_pick"] not in usable:
        ss["cal_pick"] = usable[0]
    u1, u2 = st.columns([2, 1])
    u1.selectbox(
        "Method to use",
        usable,
        key="cal_pick",
        persist_state=choices.KEEP,
        format_func=lambda m: f"{methods.label(m)}: {tau_cell(taus[m], ctx.tokens)[0]}",
    )
    u2.button(
        "Use this tau", key="use_pick", on_click=use_tau, args=(ss["cal_pick"], taus[ss["cal_pick"]]), type="primary"
    )
    if ss.get("cal_used"):
        st.success(f"Sidebar set to {ss['cal_used']}.")
    return taus


def export(ctx: PageState, taus: dict) -> None:
    """The choice as a settings file for the CLI: a fixed tau, or the method re-resolved at the run's length."""
    ss = st.session_state
    st.subheader("Export the choice")
    st.caption(
        "A settings file for the command line: the model, this document request and the chosen tau. "
        "'fixed' runs exactly this tau; 'method' lets the CLI resolve the method again at its document's length."
    )
    st.radio("Export as", EXPORT_MODES, key="cal_export", persist_state=choices.KEEP, horizontal=True)
    pick = ss["cal_pick"]
    crit = methods.get(pick).matches or "pmax"
    if ss["cal_export"] == EXPORT_MODES[0]:
        settings = ui_export.settings(ctx, method=methods.FIXED, tau=taus[pick], criterion=crit)
        if settings.method != methods.FIXED:  # adaptive temperature: no fixed tau holds it, so the file names it
            st.info(
                f"{methods.label(pick)} has no fixed tau (each row's is set inside the pass from the row "
                f"itself): the file says method '{settings.method}', which is what runs."
            )
    else:
        settings = ui_export.settings(ctx, method=pick, tau=taus[pick], criterion=crit)
    text = settings.to_json()
    st.download_button("choice.json", text, "choice.json", "application/json", key="dl_choice", on_click="ignore")
    st.code(ui_export.cli_command("choice.json"), language="bash")
    with st.expander("choice.json"):
        st.code(text, language="json")
