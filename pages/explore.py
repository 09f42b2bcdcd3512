"""Explore (landing page): one document, tau = 1 beside the chosen tau, every view from one pass each."""

from __future__ import annotations

import streamlit as st

from core import methods
from core.errors import UserError
from ui import PAPER, page_setup
from ui import cache, url
from ui import explore_views as views
from ui import sidebar as sb
from ui.tour import tour


def main() -> None:
    page_setup("Explore")
    st.title("Explore: attention dispersion, live")
    st.caption(
        "One document, read twice: at tau = 1 and at the tau you choose below. Longer inputs spread each "
        f"query's attention thin (Pmax down, entropy up); dividing the logits by tau < 1 sharpens it again. Paper: {PAPER}."
    )
    ctx = sb.sidebar(temperature=False)
    tour(ctx.train_length)
    views.page_state(ctx.loaded.n_layers, ctx.loaded.n_heads)
    live(ctx)
    views.bias_section(ctx)


@st.fragment
def live(ctx: sb.Context) -> None:
    """Everything that depends on tau, with the temperature controls on top: a tau move reruns only this.

    The sidebar (model, document) and the bias curves stay as they are, and
    the tau = 1 column is a cache hit whose unchanged figures Streamlit does
    not send again, so a move costs one pass and the chosen column's figures.
    """
    ss = st.session_state
    with st.container(border=True, key="temperature_panel"):
        ctx = ctx.with_temperature(sb.temperature_controls(st.container(), ctx.loaded, ctx.request))
    url.sync(ctx)
    probes = cache.explore_probes(ss["ex_layer"], None if ss["ex_head"] == "mean" else int(ss["ex_head"]))
    try:
        with st.spinner("Running the model…" + cache.queue_note()):
            base = cache.run(ctx.loaded, ctx.request, ctx.run_settings(tau=1.0, method="none", probes=probes))
            chosen = cache.run(ctx.loaded, ctx.request, ctx.run_settings(probes=probes))
            ref = cache.run_reference(ctx.loaded, ctx.request, ctx.targets, ctx.cosine_scale)
    except UserError as err:
        st.error(str(err))
        return
    grid_settings = ctx.run_settings(tau=1.0, method="fixed", probes=probes)
    cache.want_grid(ctx.loaded, ctx.request, grid_settings)

    # -- answers ------------------------------------------------------------------------
    c1, c2 = st.columns(2)
    with c1:
        views.answer_card(base, "tau = 1 (no alignment)", ref, suffix=" at tau = 1", key="base_card")
    with c2:
        views.answer_card(chosen, f"Chosen: {methods.label(ctx.method)}, tau = {ctx.tau_text()}", ref, key="answer_card")
    st.caption(
        f"The document is {ctx.tokens:,} tokens, {ctx.ratio:.2f} × the training length L_tr = {ctx.train_length:,}. "
        "Left: no temperature; right: the temperature above. Deltas compare with the same task at L_tr (tau = 1). "
        + cache.grid_note(ctx.loaded, ctx.request, grid_settings)
    )
    views.meters(ctx, base, chosen, ref)
    views.maps(ctx, base, chosen, ref)
    views.profile(ctx, base, chosen, ref)
    views.text_view(ctx, base, chosen, ref)
    views.answer_attention(ctx, base, chosen, ref)
    views.export(ctx, base, chosen, ref)


main()
