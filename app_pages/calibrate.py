"""Calibrate: Algorithm 1 at this document's length, its band and per-head view, every method's tau, and the export
the CLI reads."""

from __future__ import annotations

import streamlit as st

from ui import PAPER, choices, page_setup
from ui import calibrate_views as cv
from ui import sidebar as sb


def main() -> None:
    page_setup("Calibrate")
    st.title("Calibrate: pick tau by matching attention to L_tr")
    st.caption(
        "Algorithm 1 (paper Sec. 5) tries each tau from 1.0 down to 0.5 in steps of 0.05 (the paper's range; Explore's "
        "slider and its grid of frames go on to 0.30), measures the mean Pmax (or "
        "entropy) of this document's attention, and keeps the tau whose value matches the same task at the training "
        f"length L_tr with tau = 1. The closed forms (Prop. 1/2, log-length, InfoScale) need no search. Paper: {PAPER}."
    )
    ss = st.session_state
    ctx = sb.sidebar()
    for k, v in (("cal_fast", False), ("cal_samples", 1), ("cal_export", cv.EXPORT_MODES[0])):
        ss.setdefault(k, v)
    st.markdown(
        f"Document: **{ctx.tokens:,} tokens** ({ctx.ratio:.2f} × L_tr = {ctx.train_length:,}), task `{ctx.document.task}`."
    )
    c1, c2, c3 = st.columns([1, 1, 2])
    c1.toggle(
        "bisection (fewer passes)",
        key="cal_fast",
        persist_state=choices.KEEP,
        help="Finds the same tau as trying every one when the curve is monotone, in about log2(11)+2 passes; "
        "the curve then has gaps.",
    )
    c2.number_input(
        "documents",
        min_value=1,
        max_value=16,
        step=1,
        key="cal_samples",
        persist_state=choices.KEEP,
        help="Average the statistic over this many documents (seeds seed, seed+1, …); pasted text uses itself. "
        "With 2 or more, a bootstrap over the documents gives a band of the pick.",
    )
    cals = cv.run(ctx, c3)
    if cals is None:
        st.stop()
    cv.curves(cals)
    cv.advice(ctx, cals)
    cv.per_head(ctx, cals)
    taus = cv.every_method(ctx, cals)
    cv.export(ctx, taus)


main()
