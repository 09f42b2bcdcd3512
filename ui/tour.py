"""The guided tour: four buttons that set the sidebar for one step each, and the sentence that explains it."""

from __future__ import annotations

import streamlit as st

from ui import sidebar as sb


TOUR = [
    dict(title="1 · At L_tr", mult=1, method="none",
         text="A pass key hidden in filler, exactly L_tr tokens long, tau = 1. This is what the model was trained on: "
              "attention is peaked (high Pmax; the black ticks are this length's own values) and the question's "
              "attention finds the needle."),
    dict(title="2 · 8× longer", mult=8, method="none",
         text="The same task at 8 × L_tr with no correction. Each query now spreads its probability over 8 × more "
              "keys: Pmax falls and entropy rises far from the L_tr ticks (bars orange/red), and the needle's "
              "peak in the question profile sinks into the filler. This is attention dispersion (paper Sec. 3)."),
    dict(title="3 · log-length", mult=8, method="log-length",
         text="tau = log L_tr / log L divides every logit so a log-length normaliser stays constant (the paper's "
              "baseline). The bars move back toward the L_tr ticks, part of the way; compare the answer with step 2."),
    dict(title="4 · Algorithm 1", mult=8, method="pmax",
         text="Algorithm 1 picks the tau whose Pmax, averaged over every layer and head, equals the average at L_tr "
              "(the Calibrate page shows the search). Only that average is matched: look at the meters, where single "
              "layers still miss their ticks in both directions (some too sharp, some too flat), because one tau "
              "cannot fit every layer. The method box's per-layer alignment gives each layer its own tau. "
              "Algorithm 1 also says whether its curve reached the L_tr line inside the grid (reached, or the gap "
              "left at its pick: Calibrate warns under the pick when it was not reached). On the default model "
              "(retrieval-t5) at 8× it is not reached: the grid ends at tau = 0.5 short of the line (mean Pmax "
              "0.3815 against 0.3894 at L_tr, gap −0.0079; pass key, seed 0), so 0.5 is the grid's end, not a match."),
]


def _tour_go(i: int, lt: int) -> None:
    step = TOUR[i]
    sb.set_state(tour_step=i, doc_mode="Generate", doc_task="passkey", doc_tokens=step["mult"] * lt,
                 tau_method=step["method"], tgt_encoder=True)


def tour(lt: int) -> None:
    with st.expander("Guided tour: dispersion and its fix in four steps", expanded=st.session_state.get("tour_step") is not None):
        st.caption("For a class: each button sets the sidebar (pass key task, length, tau method); read the sentence, then the views below.")
        cols = st.columns(len(TOUR))
        for i, (c, step) in enumerate(zip(cols, TOUR)):
            c.button(step["title"], key=f"tour_{i}", on_click=_tour_go, args=(i, lt), width="stretch")
        i = st.session_state.get("tour_step")
        if i is not None:
            st.info(f"**Step {TOUR[i]['title']}.** {TOUR[i]['text']}")
