"""Sweep: accuracy over length x needle depth x method (needle-in-a-haystack map, paper Table 4)."""

from __future__ import annotations

import streamlit as st

from core.data import tasks
from ui import PAPER, choices, page_setup
from ui import sidebar as sb
from ui import sweep_views as sv


def main() -> None:
    page_setup("Sweep")
    title, what = st.empty(), st.empty()  # filled once the sidebar says which kind of document this is
    ctx = sb.sidebar()
    if choices.masked_lm(
        ctx.loaded
    ):  # a masked-LM encoder: accuracy and perplexity of masked tokens (InfoScale's Table 1)
        title.title("Sweep: masked tokens over length and method")
        what.caption(
            "Scores held-out sequences with 15 % of their tokens masked at several lengths with each method: "
            "the accuracy and perplexity of the masked tokens. Measured methods are calibrated once per length "
            "on separate sequences (never on the scored ones). The metrics of the InfoScale paper's Table 1 "
            "(Li et al. 2025)."
        )
        sv.mlm_results(sv.mlm_run(ctx, sv.mlm_controls(ctx)))
        return
    if ctx.request.task == tasks.LM:  # a language model: perplexity over length x method (Table 3)
        title.title("Sweep: perplexity over length and method")
        what.caption(
            "Scores held-out sequences at several prefix lengths with each method: the perplexity of the "
            "text that follows. Measured methods are calibrated once per length on separate sequences "
            f"(never on the scored ones). The layout of the paper's Table 3. Paper: {PAPER}."
        )
        sv.lm_results(sv.lm_run(ctx, sv.lm_controls(ctx)))
        return
    title.title("Sweep: accuracy over length, depth and method")
    what.caption(
        "Runs the same task many times: lengths × needle depths × seeds × methods. Measured methods are calibrated "
        "once per length on separate calibration documents (never on the scored ones). Two views: the "
        "needle-in-a-haystack map (depth × length) and the paper's Table 4 layout (method × length). "
        f"Paper: {PAPER}."
    )
    plan = sv.controls(ctx)
    path = sv.run(ctx, plan, *sv.cost(ctx, plan))
    sv.results(path)


main()
