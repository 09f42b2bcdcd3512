"""Calibrate's sections, one function each: the page (pages/calibrate.py) only arranges them."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import streamlit as st

from core import engine, methods, plots, temperature, timing, views
from core.probes import ProbeSpec
from ui import chart, csv_of, user_errors
from ui import cache
from ui import sidebar as sb

EXPORT_MODES = ("fixed tau (used as is)", "method (re-resolved at the run's length)")


def use_tau(method: str, value) -> None:
    """on_click: put a calibrated tau into the sidebar (a number -> fixed + slider; a schedule -> that method)."""
    if isinstance(value, temperature.RowTau):
        sb.set_state(tau_method=method)
        st.session_state["cal_used"] = f"{methods.label(method)}: {views.schedule_text(value)}"
        return
    a = np.asarray(value, dtype=float)
    if a.ndim == 0:
        sb.set_state(tau_method="fixed", tau_value=float(np.clip(round(float(a), 2), sb.TAU_MIN, sb.TAU_MAX)))
    else:
        sb.set_state(tau_method=method)
    st.session_state["cal_used"] = f"{methods.label(method)}: tau = {np.round(a, 3).tolist()}"


def prop1_note(value, stats: dict) -> str:
    """Why Prop. 1 can read above 1 or 'n/a', said beside the table that shows it (docs/library.md, Notes on choices)."""
    odd = isinstance(value, str) or (value is not None and float(value) > 1)
    sig = ""
    if stats.get("sigma_ex") is not None and stats.get("sigma_tr") is not None:
        sig = f" Layer 0's logits have sigma = {stats['sigma_ex']:.2f} here and {stats['sigma_tr']:.2f} at L_tr."
    head = ("**Prop. 1 reads " + ("'n/a' (no root)" if isinstance(value, str) else f"{float(value):.3f}, above 1")
            + " here.** ") if odd else "**About Prop. 1/2.** "
    return (head + "Prop. 1 and 2 rest on a Gaussian model of the logits, which holds while sigma/tau is below about "
            f"1.5.{sig} With a large sigma Prop. 1 can give tau > 1 or no root at all. The value is reported as computed, "
            "not clipped.")


def run(ctx: sb.Context, button_col) -> dict | None:
    """Algorithm 1 for both criteria from the cache, or a plan note and the button that runs it (None until run)."""
    ss = st.session_state
    args = dict(fast=bool(ss["cal_fast"]), samples=int(ss["cal_samples"]), targets=ctx.targets, cosine_scale=ctx.cosine_scale)
    cals = cache.calibrate_both(ctx.loaded, ctx.request, compute=False, **args)
    if cals is None:
        mk = timing.model_key(ctx.loaded)
        per_doc = timing.algorithm1_passes(len(temperature.GRID), args["fast"])
        work = [(per_doc * args["samples"], ctx.tokens), (args["samples"], ctx.train_length)]
        planned = timing.total(mk, work)
        st.info(timing.plan_note("Algorithm 1", mk, work)
                + (" Bisection stops early, so this is an upper bound." if args["fast"] else "")
                + (" The extra pass is the L_tr reference;" if args["samples"] == 1 else
                   " The extra passes are the L_tr references;") + " results are cached.")
        if button_col.button("Run Algorithm 1", type="primary", key="cal_run"):
            label = "Algorithm 1: forward passes over the tau grid…"
            bar = st.progress(0.0, text=timing.progress_text(label, 0.0, 0.0, planned))
            t0 = time.perf_counter()

            def progress(f: float) -> None:
                f = min(1.0, f)
                bar.progress(f, text=timing.progress_text(label, f, time.perf_counter() - t0, planned))

            with user_errors(bar):
                cals = cache.calibrate_both(ctx.loaded, ctx.request, progress=progress, **args)
            bar.empty()
            st.rerun()  # redraw from the cache, without the 'will run' note
    return cals


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
    return (f"{level} bootstrap band {over}: tau in [{float(band['low']):.2f}, {float(band['high']):.2f}]{extra}; "
            "shaded on the curve.")


def curves(cals: dict) -> None:
    """S_ex(tau) per criterion against S_tr(1), the picks, and buttons that put a pick in the sidebar."""
    st.subheader("S_ex(tau) against S_tr(1)")
    st.caption(
        "Each curve is the mean statistic over all layers, heads and rows of this document at each tau; the dashed "
        "line is the same statistic at L_tr with tau = 1. Algorithm 1 picks the grid point closest to the line "
        "(red). Pmax rises and entropy falls as tau shrinks: the attention sharpens (paper Algorithm 1, Fig. 4). "
        "Where a curve ends before it meets the line, the pick is only the grid's end: the card says so."
    )
    bands = {c: cal.band for c, cal in cals.items()}  # None: fewer than 2 calibration documents
    panels = {c: {"grid": cal.grid, "curve": cal.curve, "reference": cal.reference, "tau": cal.tau,
                  **({"band": (bands[c]["low"], bands[c]["high"])} if bands[c] else {})} for c, cal in cals.items()}
    chart(plots.calibration_curves(panels), "cal_curves")
    cols = st.columns(len(cals))
    for col, (crit, cal) in zip(cols, cals.items()):
        at_pick = dict(zip(cal.grid, cal.curve)).get(cal.tau)
        gap = None if at_pick is None else round(float(at_pick) - float(cal.reference), 4) + 0.0  # no -0.0
        # the match left at the pick; no arrow when it is exact at the shown precision (a zero has no direction)
        col.metric(f"Algorithm 1 ({crit})", f"tau = {cal.tau:.2f}",
                   delta=None if gap is None else f"{gap:+.4f} vs S_tr(1)", delta_color="off",
                   delta_arrow="off" if gap == 0 else "auto",
                   help=f"{cal.passes} passes; S_tr(1) = {cal.reference:.4f}; the delta is S_ex(tau) - S_tr(1) at "
                        "the pick.")
        col.caption(band_note(bands[crit], int(st.session_state.get("cal_samples", 1))))
        col.button(f"Use tau = {cal.tau:.2f}", key=f"use_{crit}", on_click=use_tau, args=(crit, cal.tau))
        if not cal.reached:  # the pick is where the grid ended, not a match: say so, and by how much
            col.warning(f"The curve never reached S_tr(1) between tau = {max(cal.grid):g} and {min(cal.grid):g}: "
                        f"tau = {cal.tau:.2f} is the grid's end, short by {cal.gap:+.4f}. "
                        f"'{methods.get(f'{crit}-refined').short}' goes on below the grid.")

    st.download_button("curves.csv", csv_of(lambda: views.calibration_table(cals)), "algorithm1_curves.csv", "text/csv", key="dl_curves", on_click="ignore")


def _stats_settings(ctx: sb.Context, tau) -> engine.RunSettings:
    """The stats-only pass Algorithm 1 makes of this document at tau (the same cache key: a hit after one document)."""
    return engine.RunSettings(tau=tau, targets=tuple(ctx.targets), cosine_scale=ctx.cosine_scale,
                              probes=ProbeSpec.stats_only(), generate=False)


def per_head(ctx: sb.Context, cals: dict) -> None:
    """Each head's Pmax here over its own at L_tr, at tau = 1 and at Algorithm 1's Pmax pick; per-head Algorithm 1
    (its tau matrix and the heads it could not align) when it has been computed."""
    st.subheader("Per head: Pmax here over its value at L_tr")
    pick = float(cals["pmax"].tau)
    ph = cache.resolve_tau(ctx.loaded, ctx.request, "per-head", None, ctx.targets, ctx.cosine_scale, compute=False)
    st.caption(
        "Each cell is one head's mean Pmax on this document over the same head's Pmax at L_tr with tau = 1: 1 "
        "(white) looks as in training. Algorithm 1 matches only the mean over every layer and head, so look for "
        "the heads it hides: **far above 1 (blue)** at its pick are heads the global tau has over-sharpened; "
        "**far below 1 (red)** are heads still dispersed. A head near 1 in both panels is saturated: its Pmax "
        "hardly depends on length or tau, yet it still counts in the mean."
    )
    settings = {"tau = 1": _stats_settings(ctx, 1.0),
                f"Algorithm 1 (Pmax) pick, tau = {pick:.2f}": _stats_settings(ctx, pick)}
    if ph is not None:
        settings["per-head Algorithm 1"] = _stats_settings(ctx, ph[0])
    new = sum(not cache.has_run(ctx.loaded, ctx.request, s) for s in settings.values())
    with user_errors(), st.spinner(f"Per-head statistics ({new} new pass{'es' if new != 1 else ''} at this length)…"
                                     + cache.queue_note()):
        ref = cache.run_reference(ctx.loaded, ctx.request, ctx.targets, ctx.cosine_scale, probes=ProbeSpec.stats_only())
        panels = {name: cache.run(ctx.loaded, ctx.request, s).probes.pmax[0] for name, s in settings.items()}
    chart(cache.figure(plots.head_ratio_maps, panels, ref.probes.pmax[0]), "cal_head_pmax")
    if ph is None:
        st.caption("Per-head Algorithm 1 (one tau per layer and head, each matched to that head's Pmax at L_tr) is "
                   "not computed yet: choose 'per-head' in the sidebar's Method box to compute it "
                   f"({len(temperature.GRID)} passes per layer: the whole grid, all of a layer's heads in each pass); "
                   "its tau matrix and the heads it cannot align then appear here.")
        return
    schedule, info = ph
    tau = np.atleast_2d(np.asarray(schedule, dtype=float))
    unreached = [tuple(int(v) for v in h) for h in info.get("unreached_heads", [])]
    st.markdown("**Per-head Algorithm 1**: tau per layer (rows) and head (columns)")
    st.dataframe(pd.DataFrame(tau.round(3), index=[f"layer {l}" for l in range(tau.shape[0])],
                              columns=[f"h{h}" for h in range(tau.shape[1])]), width="content")
    if unreached:
        st.caption(f"**{len(unreached)} of {tau.size} heads never reached their L_tr Pmax** inside the grid and stay "
                   "at the default tau: " + ", ".join(f"layer {l} head {h}" for l, h in unreached) + ".")
    else:
        st.caption(f"Every one of the {tau.size} heads reached its own L_tr Pmax inside the grid.")


def every_method(ctx: sb.Context, cals: dict) -> dict:
    """Every method's tau for this document (closed forms, Algorithm 1, per-layer and per-head when computed) and a
    'use' box."""
    ss = st.session_state
    st.subheader("Every method's tau for this document")
    st.caption(
        "log-length: log L_tr / log L (paper baseline); log-n (Qwen) and Scalable-Softmax give the same number in an "
        "encoder. YaRN: (0.1 ln s + 1)^-2 with s = L / L_tr. Llama 4: a tau per query row, shown as its mean over the "
        "rows (rows before L_tr keep 1). InfoScale: keeps attention entropy invariant with d = d_kv. "
        "Prop. 1 / Prop. 2: the paper's closed forms from the spread sigma of layer 0's sorted logits (Sec. 4), "
        "matching Pmax / entropy. Algorithm 1: the measured picks above. 'n/a' means the Gaussian model behind a "
        "formula does not fit these numbers."
    )
    est = timing.total(timing.model_key(ctx.loaded), [(1, ctx.tokens), (1, ctx.train_length)])
    with user_errors(), st.spinner("Closed forms (two passes for Prop. 1/2" + ("" if est is None else f", {timing.describe(est)}") + ")…" + cache.queue_note()):
        taus = cache.closed_forms(ctx.loaded, ctx.request, ctx.targets, ctx.cosine_scale)
    taus = {**taus, "pmax": cals["pmax"].tau, "entropy": cals["entropy"].tau}
    taus["llama4"] = cache.resolve_tau(ctx.loaded, ctx.request, "llama4", None, ctx.targets, ctx.cosine_scale)[0]  # no pass
    missing = []
    for name, cost in (("per-layer", "about 5 passes per layer"), ("per-head", f"{len(temperature.GRID)} passes per layer")):
        got = cache.resolve_tau(ctx.loaded, ctx.request, name, None, ctx.targets, ctx.cosine_scale, compute=False)
        if got is not None:
            taus[name] = got[0]
        else:
            missing.append(f"{methods.label(name)}, {cost}")
    # a per-head matrix is shown in short here (the per-head section above has it in full)
    table = views.method_taus_table(taus, methods.label, rows=ctx.tokens)
    st.dataframe(table[["label", "tau"]], hide_index=True, width="stretch")
    st.caption(prop1_note(taus.get("prop1"), cache.logit_stats(ctx.loaded, ctx.request, ctx.targets, ctx.cosine_scale)))
    if missing:
        st.caption("Not in the table yet: " + "; ".join(missing) + ". Choose "
                   + ("it" if len(missing) == 1 else "one") + " in the sidebar's Method box to compute it.")
    usable = [m for m, t in taus.items() if not isinstance(t, str)]
    ss.setdefault("cal_pick", "pmax")
    if ss["cal_pick"] not in usable:
        ss["cal_pick"] = usable[0]
    u1, u2 = st.columns([2, 1])
    u1.selectbox("Method to use", usable, key="cal_pick",
                 format_func=lambda m: f"{methods.label(m)}: {views.schedule_text(taus[m], ctx.tokens)}")
    u2.button("Use this tau", key="use_pick", on_click=use_tau, args=(ss["cal_pick"], taus[ss["cal_pick"]]), type="primary")
    if ss.get("cal_used"):
        st.success(f"Sidebar set to {ss['cal_used']}.")
    return taus


def export(ctx: sb.Context, taus: dict) -> None:
    """The choice as a settings file for the CLI: a fixed tau, or the method re-resolved at the run's length."""
    ss = st.session_state
    st.subheader("Export the choice")
    st.caption("A settings file for the command line: the model, this document request and the chosen tau. "
               "'fixed' runs exactly this tau; 'method' lets the CLI resolve the method again at its document's length.")
    st.radio("Export as", EXPORT_MODES, key="cal_export", horizontal=True)
    pick = ss["cal_pick"]
    crit = "entropy" if pick in ("entropy", "prop2") else "pmax"
    if ss["cal_export"] == EXPORT_MODES[0]:
        settings = ctx.settings(method="fixed", tau=taus[pick], criterion=crit)
    else:
        settings = ctx.settings(method=pick, tau=taus[pick], criterion=crit)
    text = settings.to_json()
    st.download_button("choice.json", text, "choice.json", "application/json", key="dl_choice", on_click="ignore")
    st.code(sb.cli_command("choice.json"), language="bash")
    with st.expander("choice.json"):
        st.code(text, language="json")
