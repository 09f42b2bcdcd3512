"""Theory: sorted logits, l_max and sigma over length, and the temperature formulas against Algorithm 1."""

from __future__ import annotations

import streamlit as st

from ui import PAPER, cache, page_setup, pass_gate, user_errors
from ui import sidebar as sb
from ui import theory_views as tv


def main() -> None:
    page_setup("Theory")
    st.title("Theory: sorted logits, l_max and the temperature formulas")
    st.caption(
        "The paper models each attention row's logits as roughly Gaussian with spread sigma. Then the largest "
        "probability and the entropy depend on sigma and the length L only, so one can solve for the tau that keeps "
        f"them at their L_tr values (Prop. 1 for Pmax, Prop. 2 for entropy). Paper: {PAPER}."
    )
    ctx = sb.sidebar()
    with user_errors(), st.spinner("Layer-0 logits at this length and at L_tr…" + pass_gate.queue_note()):
        # the same pass Prop. 1/2 read, which the background job computes after the tau grid
        here = cache.run(ctx.loaded, ctx.request, *cache.theory_pass(ctx.loaded, ctx.choice))
        ref = cache.run_reference(ctx.loaded, ctx.request, ctx.choice)

    tv.qq(here, ref)
    reqs, stats = tv.across_lengths(ctx)
    tv.tau_curves(ctx, ref, reqs, stats)
    tv.cosine(ctx, here)


main()
