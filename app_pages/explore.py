"""Explore (landing page): one document, tau = 1 beside the chosen tau, every view from one pass each."""

from __future__ import annotations

import streamlit as st

from core.errors import UserError
from ui import PAPER, message, model_box, page_setup, tau_controls, url, user_errors
from ui import explore_views as views
from ui import sidebar as sb
from ui.page_state import PageState
from ui.scrubber import AXIS_KEY, scrubber
from ui.tour import land, still_on_step, tour


def main() -> None:
    page_setup("Explore")
    st.title("Explore: attention dispersion, live")
    st.caption(
        "One document, read twice: as trained (tau = 1) and at the setting on the slider (tau, or CosScale s on a "
        "cosine model). Longer inputs spread each query's "
        "attention thin (Pmax down, entropy up); dividing the logits by tau < 1 sharpens it again. The slider "
        f"redraws every view below in your browser. Paper: {PAPER}."
    )
    land()  # a new session without a link: the tour's first step open (before the sidebar draws its widgets)
    ctx = sb.sidebar(temperature=False)
    tour(ctx.train_length, ctx.loaded.family)
    with user_errors():  # a document this machine cannot hold: one message, and none of the views that need it
        views.check_length(ctx)
    views.page_state(ctx.loaded.n_layers, ctx.loaded.n_heads)
    # What did not change stays as it is while the panel reruns (a release, a poll for grid frames): no grey-out.
    # The scrubber marks the card that will change itself ("updating").
    st.html(
        "<style>.st-key-temperature_panel [data-stale='true'], .st-key-explore_export [data-stale='true']"
        " { opacity: 1 !important; transition: none !important; }"
        # less empty space above the title: with a tour step open the answer cards stay above the fold (1400 x 1000)
        " [data-testid='stMainBlockContainer'] { padding-top: 2.5rem; }</style>"
    )
    live(ctx)
    views.bias_section(ctx)


@st.fragment
def live(ctx: PageState) -> None:
    """The temperature panel and every view that depends on tau: a method or view change reruns only this.

    A slider move does not rerun anything: the scrubber component
    (:mod:`ui.scrubber`) repaints from the grid frames it holds; its release
    reruns this fragment once (URL, export, the exact frame off the grid).
    """
    if model_box.chosen_model_ref() != ctx.model_ref:
        # The Model box changed, but only this fragment reruns: its views would be the old model's under a box that
        # names the new one (seen once in a class walkthrough, the page left on the old model). The whole page runs.
        st.rerun(scope="app")
    with st.container(border=True, key="temperature_panel"):
        # One control for CosScale s: the scrubber's slider while it moves s, else the panel's own slider.
        s_on_scrubber = ctx.loaded.cosine and st.session_state.get(AXIS_KEY) == "s"
        ctx = ctx.with_choice(
            *tau_controls.temperature_controls(
                st.container(), ctx.loaded, ctx.request, slider=False, s_slider=not s_on_scrubber
            )
        )
        if not still_on_step(ctx.train_length):  # a method changed here left the tour's step: its text goes too
            st.rerun(scope="app")
        probes, spec, log = views.view_controls(ctx)
        try:
            runs = scrubber(ctx, probes, spec, log)
        except UserError as err:
            st.error(message(err))
            return
    url.sync(ctx)
    if runs["base"] is None:  # the document waits for the person's go-ahead (its estimate is over the limit)
        return
    with st.container(key="explore_export"):
        views.export(ctx, runs["base"], runs["chosen"], runs["ref"])


main()
