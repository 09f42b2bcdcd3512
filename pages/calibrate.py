"""Calibrate: Algorithm 1 at this document's length, every method's tau, and the export the CLI reads."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # a page may run alone (see ui.sidebar)
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from core import plots, temperature  # noqa: E402
from core.errors import UserError  # noqa: E402
from ui import PAPER, chart, csv_of, page_setup  # noqa: E402
from ui import cache  # noqa: E402
from ui import sidebar as sb  # noqa: E402

EXPORT_MODES = ("fixed tau (used as is)", "method (re-resolved at the run's length)")


def use_tau(method: str, value) -> None:
    """on_click: put a calibrated tau into the sidebar (a number -> fixed + slider; per layer -> that method)."""
    a = np.asarray(value, dtype=float)
    if a.ndim == 0:
        sb.set_state(tau_method="fixed", tau_value=float(np.clip(round(float(a), 2), sb.TAU_MIN, sb.TAU_MAX)))
    else:
        sb.set_state(tau_method=method)
    st.session_state["cal_used"] = f"{sb.METHOD_LABELS.get(method, method)}: tau = {np.round(a, 3).tolist()}"


def main() -> None:
    page_setup("Calibrate")
    st.title("Calibrate: pick tau by matching attention to L_tr")
    st.caption(
        "Algorithm 1 (paper Sec. 5) tries each tau on a grid from 1.0 down to 0.5, measures the mean Pmax (or "
        "entropy) of this document's attention, and keeps the tau whose value matches the same task at the training "
        f"length L_tr with tau = 1. The closed forms (Prop. 1/2, log-length, InfoScale) need no search. Paper: {PAPER}."
    )
    ss = st.session_state
    ctx = sb.sidebar()
    for k, v in (("cal_fast", False), ("cal_samples", 1), ("cal_export", EXPORT_MODES[0])):
        ss.setdefault(k, v)
    st.markdown(f"Document: **{ctx.tokens:,} tokens** ({ctx.ratio:.2f} × L_tr = {ctx.train_length:,}), task `{ctx.document.task}`.")
    c1, c2, c3 = st.columns([1, 1, 2])
    c1.toggle("bisection (fewer passes)", key="cal_fast",
              help="Finds the same grid point as the full grid when the curve is monotone, in about log2(11)+2 passes; "
                   "the curve then has gaps.")
    c2.number_input("documents", min_value=1, max_value=16, step=1, key="cal_samples",
                    help="Average the statistic over this many documents (seeds seed, seed+1, …); pasted text uses itself.")
    args = dict(fast=bool(ss["cal_fast"]), samples=int(ss["cal_samples"]), targets=ctx.targets, cosine_scale=ctx.cosine_scale)
    cals = cache.calibrate_both(ctx.loaded, ctx.request, compute=False, **args)
    if cals is None:
        passes = (5 if args["fast"] else len(temperature.GRID)) * args["samples"]
        st.info(f"Algorithm 1 will run about {passes + args['samples']} encoder passes at {ctx.tokens:,} tokens "
                "(plus the L_tr reference); results are cached.")
        if c3.button("Run Algorithm 1", type="primary", key="cal_run"):
            bar = st.progress(0.0, text="Algorithm 1: forward passes over the tau grid…")
            try:
                cals = cache.calibrate_both(ctx.loaded, ctx.request, progress=lambda f: bar.progress(min(1.0, f)), **args)
            except UserError as err:
                bar.empty()
                st.error(str(err))
                st.stop()
            bar.empty()
            st.rerun()  # redraw from the cache, without the 'will run' note
    if cals is None:
        st.stop()

    # -- curves ---------------------------------------------------------------------
    st.subheader("S_ex(tau) against S_tr(1)")
    st.caption(
        "Each curve is the mean statistic over all layers, heads and rows of this document at each tau; the dashed "
        "line is the same statistic at L_tr with tau = 1. Algorithm 1 picks the grid point closest to the line "
        "(red). Pmax rises and entropy falls as tau shrinks: the attention sharpens (paper Algorithm 1, Fig. 4)."
    )
    panels = {c: {"grid": cal.grid, "curve": cal.curve, "reference": cal.reference, "tau": cal.tau} for c, cal in cals.items()}
    chart(plots.calibration_curves(panels), "cal_curves")
    cols = st.columns(len(cals))
    for col, (crit, cal) in zip(cols, cals.items()):
        col.metric(f"Algorithm 1 ({crit})", f"tau = {cal.tau:.2f}", help=f"{cal.passes} passes; S_tr(1) = {cal.reference:.4f}")
        col.button(f"Use tau = {cal.tau:.2f}", key=f"use_{crit}", on_click=use_tau, args=(crit, cal.tau))

    def curve_df() -> pd.DataFrame:
        d = {"tau": list(temperature.GRID)}
        for crit, cal in cals.items():
            d[f"S_ex_{crit}"] = cal.curve
            d[f"S_tr_{crit}"] = [cal.reference] * len(cal.grid)
        return pd.DataFrame(d)

    st.download_button("curves.csv", csv_of(curve_df), "algorithm1_curves.csv", "text/csv", key="dl_curves", on_click="ignore")

    # -- every method -----------------------------------------------------------------
    st.subheader("Every method's tau for this document")
    st.caption(
        "log-length: log L_tr / log L (paper baseline). InfoScale: keeps attention entropy invariant with d = d_kv. "
        "Prop. 1 / Prop. 2: the paper's closed forms from the spread sigma of layer 0's sorted logits (Sec. 4), "
        "matching Pmax / entropy. Algorithm 1: the measured picks above. 'n/a' means the Gaussian model behind a "
        "formula does not fit these numbers."
    )
    try:
        with st.spinner("Closed forms (two passes for Prop. 1/2)…"):
            taus = cache.closed_forms(ctx.loaded, ctx.request, ctx.targets, ctx.cosine_scale)
    except UserError as err:
        st.error(str(err))
        st.stop()
    taus = {**taus, "pmax": cals["pmax"].tau, "entropy": cals["entropy"].tau}
    per_layer = cache.resolve_tau(ctx.loaded, ctx.request, "per-layer", None, ctx.targets, ctx.cosine_scale, compute=False)
    if per_layer is not None:
        taus["per-layer"] = per_layer[0]
    rows = []
    for m, t in taus.items():
        a = None if isinstance(t, str) else np.asarray(t, dtype=float)
        rows.append({"method": m, "label": sb.METHOD_LABELS.get(m, m),
                     "tau": t if a is None else (round(float(a), 4) if a.ndim == 0 else ", ".join(f"{v:.2f}" for v in a))})
    table = pd.DataFrame(rows)
    st.dataframe(table[["label", "tau"]], hide_index=True, width="stretch")
    if per_layer is None:
        st.caption("Per-layer alignment is not in the table yet: choose it in the sidebar's Method box to compute it "
                   "(about 5 passes per layer).")
    usable = [m for m, t in taus.items() if not isinstance(t, str)]
    ss.setdefault("cal_pick", "pmax")
    if ss["cal_pick"] not in usable:
        ss["cal_pick"] = usable[0]
    u1, u2 = st.columns([2, 1])
    u1.selectbox("Method to use", usable, key="cal_pick", format_func=lambda m: f"{sb.METHOD_LABELS.get(m, m)}: {taus[m] if np.ndim(taus[m]) == 0 else 'per layer'}")
    u2.button("Use this tau", key="use_pick", on_click=use_tau, args=(ss["cal_pick"], taus[ss["cal_pick"]]), type="primary")
    if ss.get("cal_used"):
        st.success(f"Sidebar set to {ss['cal_used']}.")

    # -- export -----------------------------------------------------------------------
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


main()
