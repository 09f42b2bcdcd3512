"""The guided tour: four buttons that set the sidebar for one step each, the sentence that explains it, and,
for the steps with measured detail, a "More on this step" popover (the page keeps the answer metrics in view)."""

from __future__ import annotations

import streamlit as st

from core.mechanics import attention
from core.runs import methods
from ui import choices, url

# The numbers in "more" are the default model's (retrieval-t5), pass key, seed 0, depth 50 %, CPU float32,
# measured with core.runs.engine.run and Explore's probes (tests/app/test_lengths_legend_tour.py checks them).
TOUR = [
    dict(
        title="1 · At L_tr",
        mult=1,
        method=methods.AS_TRAINED,
        text="A pass key hidden in filler, exactly L_tr tokens long, tau = 1. This is what the model was trained on: "
        "attention is peaked (high Pmax; the black ticks are this length's own values) and the question's "
        "attention finds the needle.",
    ),
    dict(
        title="2 · 8× longer",
        mult=8,
        method=methods.AS_TRAINED,
        text="The same task at 8 × L_tr with no correction. Each query now spreads its probability over 8 × more "
        "keys: Pmax falls and entropy rises far from the L_tr ticks (bars orange/red); in the question "
        "profile the needle's peak is still there but lower, while the filler, thin per token, takes a much "
        "larger share of the question's attention in total, and the answer has the key's digits in the "
        "wrong order. This is attention dispersion (paper Sec. 3).",
        more="Measured on the default model (retrieval-t5), pass key, seed 0, depth 50 %, tau = 1, from L_tr "
        "(256 tokens) to 8 × (2,048): the needle's highest point in the question profile falls from 0.156 "
        "to 0.111 in layer 1 and from 0.125 to 0.024 in layer 2, still 9 × and more above any single filler "
        "token, so a peak stays visible. What changes is the total: the filler's share of the question's "
        "attention rises from 20 % to 38 % (layer 1) and from 45 % to 86 % (layer 2), the needle's falls "
        "from 49 % to 36 % and from 36 % to 8 %. The answer is 57153 for the key 51573: the right digits, "
        "in the wrong order. Other seeds and depths differ in the detail.",
    ),
    dict(
        title="3 · log-length",
        mult=8,
        method=methods.BASELINE,
        text="tau = log L_tr / log L divides every logit so a log-length normaliser stays constant (the paper's "
        "baseline). The bars move back toward the L_tr ticks, part of the way; compare the answer with step 2.",
    ),
    dict(
        title="4 · Algorithm 1",
        mult=8,
        method=methods.ALGORITHM1["pmax"],
        text="Algorithm 1 picks the tau whose Pmax, averaged over every layer and head, equals the average at L_tr. "
        "On the default model at 8× its curve never reached the L_tr line: its search range (the paper's, "
        "tau 1.0 down to 0.5) ends short of the line, so 0.5 is where the search stopped, not a match.",
        more="Only the average is matched (the Calibrate page shows the search): in the meters, single layers "
        "still miss their ticks in both directions (some too sharp, some too flat), because one tau cannot "
        "fit every layer; the method box's per-layer alignment gives each layer its own tau. Algorithm 1 "
        "says whether its curve reached the L_tr line inside its range (reached, or the gap left at its "
        "pick; Calibrate warns under the pick when it was not reached). On the default model (retrieval-t5) "
        "at 8× (pass key, seed 0, 2,048 tokens) mean Pmax at tau = 0.5 is 0.3826 against 0.3883 at L_tr, "
        "gap −0.0057; per layer 0.485, 0.609, 0.332, 0.104 against 0.439, 0.684, 0.347, 0.083.",
    ),
]


def _step_state(i: int, lt: int) -> dict:
    """The choices a step sets (and its text describes)."""
    step = TOUR[i]
    return dict(
        doc_mode="Generate",
        doc_task="passkey",
        doc_tokens=step["mult"] * lt,
        tau_method=step["method"],
        tgt_encoder=True,
    )


def _tour_go(i: int, lt: int) -> None:
    choices.set_state(tour_step=i, **_step_state(i, lt))


def still_on_step(lt: int) -> bool:
    """Whether the session still shows what the open step set up; if not, the step closes (its text would
    describe another set-up: issue 50, stale tour text). True when no step is open."""
    ss = st.session_state
    i = ss.get("tour_step")
    if i is None:
        return True
    want = _step_state(i, lt)
    if TOUR[i]["method"] == methods.AS_TRAINED and ss.get("tau_method") == methods.FIXED and ss.get("tau_value") == 1.0:
        want.pop("tau_method")  # tau = 1 typed as a fixed tau is the same view as "as trained"
    if all(ss.get(k) == v for k, v in want.items()):
        return True
    ss["tour_step"] = None
    ss["_tour_left"] = TOUR[i]["title"]
    return False


_LANDED = "_tour_landed"  # this session's first Explore run has been read (a link's or the landing's)

#: What the tour says on a model it is not for, by family (:data:`core.mechanics.attention.FAMILIES`): a masked-LM
#: encoder has no pass key to find; a decoder-only LLM does, but the steps' 8 x L_tr is 65,536 tokens on SmolLM2,
#: many minutes a pass on a CPU (a 4,096-token pass took 110 s on the project's 2-core machine).
NOT_FOR = {
    attention.ROPE: (
        "The guided tour is for the T5 pass-key models (a bundled `retrieval-t5`, say): it hides a pass key in "
        "filler and asks for it back. This model is a masked-LM encoder, so it reads held-out prose with masked "
        "tokens instead. The same lesson here: open the document at 1× L_tr, then 8× with no correction (the "
        "cards' accuracy falls, Pmax falls and entropy rises against the L_tr ticks), then choose log-length or "
        "InfoScale in the Method box."
    ),
    attention.CAUSAL_LM: (
        "The guided tour's steps run at 8× L_tr, which on this decoder-only LLM is many times its L_tr in tokens: "
        "minutes to hours a pass on a CPU. The same lesson at a size a CPU can show: the Document box's pass key at "
        "1× L_tr, then 2× with no correction (Pmax falls and entropy rises against the L_tr ticks in the meters; "
        "watch the answer), then log-length or a position scheme (YaRN) in the Method box. On a GPU the tour's "
        "lengths are a few seconds a pass."
    ),
}


def land() -> None:
    """A new session opened on Explore without a link lands with step 1 open: the first page then says what to look
    at and where to click next (issue 59: the landing showed 1x with nothing to read, where both cards agree). Step 1
    is the default view (a pass key at L_tr, tau = 1), so nothing on the page changes but the open step. Called
    by the Explore page before the sidebar draws its widgets; once per session, never over a link's own view."""
    ss = st.session_state
    if ss.get(_LANDED):
        return
    ss[_LANDED] = True
    if not st.query_params and ss.get(url.WRITTEN) is None:
        choices.set_state(tour_step=0)  # the default view is step 1's (still_on_step reads tau = 1 either way)


def tour(lt: int, family: str = attention.T5) -> None:
    """The tour's expander; for a model that is not T5 (``family`` another of
    :data:`core.mechanics.attention.FAMILIES`) one paragraph saying what it is for and how to see the same lesson."""
    if family != attention.T5:
        with st.expander("Guided tour: dispersion and its fix in four steps"):
            st.info(NOT_FOR.get(family, NOT_FOR[attention.ROPE]))
        return
    still_on_step(lt)
    ss = st.session_state
    with st.expander(
        "Guided tour: dispersion and its fix in four steps",
        expanded=ss.get("tour_step") is not None or ss.get("_tour_left") is not None,
    ):
        # Compact, so that the answer cards stay above the fold at 1400 x 1000 with a step open: the buttons in one
        # row beside "More on this step", the step's sentence below.
        cols = st.columns([1] * len(TOUR) + [0.9], vertical_alignment="center")
        for i, (c, step) in enumerate(zip(cols, TOUR)):
            c.button(
                step["title"],
                key=f"tour_{i}",
                on_click=_tour_go,
                args=(i, lt),
                width="stretch",
                type="primary" if ss.get("tour_step") == i else "secondary",
            )
        i = ss.get("tour_step")
        if i is not None:
            if TOUR[i].get("more"):
                with cols[-1].popover("More on this step"):
                    st.markdown(TOUR[i]["more"])
            st.info(f"**Step {TOUR[i]['title']}.** {TOUR[i]['text']}")
        elif ss.get("_tour_left") is not None:
            st.caption(
                f"Step {ss.pop('_tour_left')} closed: you changed the set-up it describes. Press a step to "
                "set it up again."
            )
        else:
            st.caption(
                "For a class: each button sets the sidebar (pass key task, length, tau method); read the "
                "sentence, then the views below."
            )
