"""Explore's views, one function each: the page (app_pages/explore.py) only arranges them.

The tau-dependent views are drawn in the browser by the scrubber
(:mod:`ui.scrubber`); here are the controls that choose what they show, the
exports of the chosen tau, and the bias curves (which do not depend on tau;
figures from :mod:`core.views.plots` through :func:`ui.figure_cache.figure`, tables from
:mod:`core.views.tables`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import streamlit as st

from core.errors import UserError
from core.mechanics.probes import ProbeSpec
from core.runs import engine
from core.values import positions
from core.views import frames, plots, rope_view, tables
from ui import cache, chart, choices, csv_of, figure_cache, message
from ui import export as ui_export
from ui.page_state import PageState


def check_length(ctx: PageState) -> None:
    """Refuse (InputTooLong, the engine's message) a document too long for this machine's free memory.

    Why before the views: every view of Explore needs a pass or the
    tokenisation of the document, and each would refuse it again; checked
    once here, the page shows one message and stops.
    """
    engine.check_length(ctx.loaded, ctx.tokens)


#: The view controls' defaults (the map layer's is the model's last layer).
VIEW_DEFAULTS = {
    "ex_head": "mean",
    "ex_pool": "mean",
    "ex_colour": None,
    "ex_text_window": 150,
    "ex_cross_layer": "mean",
}


def page_state(L: int, H: int) -> None:
    """Give every view control a valid value for this model, before any of them is drawn.

    Called by the page and again by :func:`view_controls` in every run of Explore's panel (a fragment): a control
    this model does not draw (a masked-LM model has no text window and no decoder layer) may lose its kept value
    in Streamlit's cleanup of the full run, and the panel's next poll or release, which reruns the fragment only,
    must not find it missing (issue 50, defect 1: a KeyError after a switch from a T5 model to a RoPE model).
    """
    ss = st.session_state
    for k, v in (("ex_layer", L - 1), *VIEW_DEFAULTS.items()):
        ss.setdefault(k, COLOURS[0] if k == "ex_colour" else v)
    if ss["ex_layer"] not in range(L):
        ss["ex_layer"] = L - 1
    if ss["ex_head"] != "mean" and ss["ex_head"] not in range(H):
        ss["ex_head"] = "mean"
    if ss["ex_colour"] not in COLOURS:
        ss["ex_colour"] = COLOURS[0]


#: The maps' colour scale. Past L_tr a dispersed map is almost uniformly dark in linear colour (one bright
#: diagonal sets the scale), so "auto" is log colour there and linear at or below L_tr.
COLOURS = ("auto (log past L_tr)", "log", "linear")


def view_controls(ctx: PageState) -> tuple[ProbeSpec, frames.ViewSpec, bool]:
    """What the views show (layer and head of the map, pooling, colour, decoder layer, text window).

    Layer and head choose what the passes record (a new grid); the rest only
    what the browser is sent.
    """
    ss = st.session_state
    L, H = ctx.loaded.n_layers, ctx.loaded.n_heads
    page_state(L, H)
    dec = int(getattr(ctx.loaded.config, "num_decoder_layers", None) or L)
    c = st.columns([1, 1.2, 1.1, 1.5, 1.2, 1.6], vertical_alignment="bottom")
    c[0].selectbox(
        "Map layer",
        list(range(L)),
        key="ex_layer",
        persist_state=choices.KEEP,
        help="The layer of the attention map (the decoder's causal self-attention on a decoder-only LM, else the "
        "encoder's).",
    )
    c[1].selectbox(
        "Map head",
        ["mean"] + list(range(H)),
        key="ex_head",
        persist_state=choices.KEEP,
        format_func=lambda h: "mean" if h == "mean" else f"head {h}",
        help="One head of the map's layer, or the mean of its heads.",
    )
    c[2].selectbox(
        "Pooling",
        ("mean", "max"),
        key="ex_pool",
        persist_state=choices.KEEP,
        help="How each map cell sums up its token ranges.",
    )
    c[3].selectbox(
        "Colour",
        COLOURS,
        key="ex_colour",
        persist_state=choices.KEEP,
        help="Log colour shows a dispersed map's tail (and the needle cell past L_tr); linear the peaks.",
    )
    if ss.get("ex_cross_layer") not in ["mean", *range(dec)]:
        ss["ex_cross_layer"] = "mean"
    if ctx.loaded.seq2seq:  # a masked-LM encoder writes no answer: no cross-attention to choose a layer of
        c[4].selectbox(
            "Decoder layer",
            ["mean", *range(dec)],
            key="ex_cross_layer",
            persist_state=choices.KEEP,
            format_func=lambda l: "mean" if l == "mean" else f"layer {l}",
            help="Where the answer looks: one decoder layer's cross-attention, or their mean.",
        )
    if not choices.masked_lm(ctx.loaded):  # a masked-LM model has no needle to centre a shaded text on
        c[5].slider(
            "Text: tokens either side",
            20,
            2000,
            step=10,
            key="ex_text_window",
            persist_state=choices.KEEP,
            help="How much of the document the shaded text shows around the needle.",
        )
    if ctx.loaded.cosine:  # a cosine model: the slider scrubs tau, or CosScale s at the chosen tau
        from ui.scrubber import AXES, AXIS_KEY

        ss.setdefault(AXIS_KEY, "tau")
        st.radio(
            "The slider below moves",
            list(AXES),
            key=AXIS_KEY,
            horizontal=True,
            format_func=AXES.get,
            help="CosScale s multiplies cos(q, k) before the softmax, as 1/tau divides the logits: either one "
            "sharpens a cosine model's attention. Each has its grid of frames, drawn in your browser.",
        )
    probes = cache.explore_probes(ss["ex_layer"], None if ss["ex_head"] == "mean" else int(ss["ex_head"]))
    if ctx.loaded.decoder_only:  # one attention, its causal self-attention: no cross-attention to record
        probes = replace(probes, names=())
    spec = frames.ViewSpec(
        pool=ss["ex_pool"],
        cross_layer=None if ss["ex_cross_layer"] == "mean" else int(ss["ex_cross_layer"]),
        window=int(ss["ex_text_window"]),
    )
    colour = ss["ex_colour"]
    log = colour == "log" or (colour == COLOURS[0] and ctx.tokens > ctx.train_length)
    return probes, spec, log


def export(ctx: PageState, base, chosen, ref) -> None:
    """CSV of the chosen tau's views and the settings JSON the CLI accepts (the released tau, not a frame in passing)."""
    st.subheader("Export")
    if not choices.masked_lm(ctx.loaded):
        st.caption(
            "The data behind the views at the chosen tau as CSV, and these settings as a JSON file the command "
            "line accepts."
        )
    else:
        st.caption(
            "The data behind the views at the chosen tau as CSV, and the command that scores this document's "
            "masked tokens under the chosen position scheme and method (its accuracy and perplexity are the "
            "right card's)."
        )
    if chosen is None:
        st.caption("The exact pass of this tau is being computed; its files follow.")
        return
    ss = st.session_state
    pool = ss.get("ex_pool", "mean")
    layer = None if ss.get("ex_cross_layer", "mean") == "mean" else int(ss["ex_cross_layer"])
    e = st.columns(5)
    e[0].download_button(
        "meters.csv",
        csv_of(lambda: tables.meters_table(chosen, base, ref)),
        "meters.csv",
        "text/csv",
        key="dl_meters",
        on_click="ignore",
    )
    if chosen.probes.heatmap_mean is not None:
        e[1].download_button(
            "heatmap.csv",
            csv_of(lambda: tables.heatmap_table(chosen, pool)),
            "heatmap.csv",
            "text/csv",
            key="dl_heat",
            on_click="ignore",
        )
    if chosen.probes.profile is not None:
        e[2].download_button(
            "profile.csv",
            csv_of(lambda: tables.profile_table(chosen, base)),
            "profile.csv",
            "text/csv",
            key="dl_prof",
            on_click="ignore",
        )
    if tables.answer_attention(chosen, layer) is not None:
        e[3].download_button(
            "answer_attention.csv",
            csv_of(lambda: tables.answer_attention_table(chosen, layer)),
            "answer_attention.csv",
            "text/csv",
            key="dl_cross",
            on_click="ignore",
        )
    # Inline code, not st.code: st.code makes the browser fetch and parse a 1.6 MB syntax highlighter,
    # which on the landing page cost seconds in a fresh tab (bench/browser_latency.py).
    if choices.masked_lm(ctx.loaded):  # a masked-LM model: the mlm command (the settings JSON has no position scheme)
        st.markdown(f"Then run: `{ui_export.mlm_command(ctx)}`")
        return
    e[4].download_button(
        "settings.json",
        ui_export.settings(ctx).to_json(),
        "settings.json",
        "application/json",
        key="dl_settings",
        on_click="ignore",
    )
    st.markdown(f"Then run: `{ui_export.cli_command('settings.json')}`")


#: Points of a distance curve sent to the browser (the 2L - 1 distances of a long document are thinned evenly).
DISTANCE_POINTS = 2001


def distance_figure(distances: np.ndarray, mean: np.ndarray, heads: list[int], train_length: int, layer: int):
    """The mean logit q.k against relative distance, one line per head, L_tr marked on both sides (plotly)."""
    import plotly.graph_objects as go

    idx = np.arange(len(distances))
    if len(idx) > DISTANCE_POINTS:
        idx = np.unique(np.linspace(0, len(idx) - 1, DISTANCE_POINTS).round().astype(int))
    fig = go.Figure()
    for h in heads:
        fig.add_scatter(
            x=distances[idx],
            y=np.asarray(mean[h], dtype=np.float32)[idx],
            mode="lines",
            name=f"head {h}",
            line=dict(width=1.4),
        )
    span = int(np.max(np.abs(distances))) if len(distances) else 0
    for x in (-train_length, train_length):
        if abs(x) <= span:
            fig.add_vline(x=x, line=dict(color="black", dash="dash", width=1))
    if span >= train_length:
        fig.add_annotation(x=train_length, y=1, yref="paper", text="L_tr", showarrow=False, yanchor="bottom")
    fig.update_xaxes(title="relative distance n - m (key - query), tokens")
    fig.update_yaxes(title=f"mean logit q·k, layer {layer}")
    fig.update_layout(height=360, margin=dict(l=10, r=10, t=24, b=10), legend=dict(orientation="h"))
    return fig


def distance_section(ctx: PageState) -> None:
    """A rotary model's counterpart of T5's bias curves: the mean logit against relative distance per head at this
    length (:func:`core.views.rope_view.distance_curves`); like the bias, it does not depend on tau."""
    ss = st.session_state
    L, H = ctx.loaded.n_layers, ctx.loaded.n_heads
    st.subheader("Mean logit against relative distance")
    st.caption(
        "A rotary model has no position bias to draw: its queries and keys are rotated by their positions, so q·k "
        "itself depends on the distance n - m. Each line is one head's mean logit q·k (as the attention computes it, "
        "before tau) over every query–key pair at that distance on this document; dashed: ±L_tr. Past L_tr the model "
        "meets distances it never saw in training: where a head's curve drifts or oscillates there, its attention "
        "there is untrained. The rotary counterpart of the paper's Fig. 1 (T5's bias)."
    )
    if ctx.loaded.decoder_only:
        st.caption(
            "This model is causal: a row sees only the keys before it (n - m ≤ 0, the left half). The right half is q·k "
            "of pairs the mask hides, drawn for the rotation's symmetry; the question's rows, the prompt's last, read "
            "the whole left half, out to -L."
        )
    if not ctx.choice.scheme.is_plain:
        entry = ctx.choice.scheme.entry
        st.caption(
            f"Under the position scheme **{entry.label}**: "
            + (
                "its frequencies rotate q and k, so the curves are its own."
                if rope_view.shows_scheme(ctx.choice.scheme) and positions.FREQUENCIES in entry.changes
                else "it masks keys but leaves q·k as it is: the curves are plain RoPE's over every pair (the mask is "
                "drawn on the map above)."
                if rope_view.shows_scheme(ctx.choice.scheme)
                else "it computes logits at capped distances from unrotated q and k, which these curves cannot show: "
                "they are plain RoPE's."
            )
        )
    ss.setdefault("ex_show_bias", False)
    if not st.toggle("Show the distance curves", key="ex_show_bias", persist_state=choices.KEEP):
        return
    ss.setdefault("ex_dist_layer", 0)
    if ss["ex_dist_layer"] not in range(L):
        ss["ex_dist_layer"] = 0
    ss.setdefault("ex_rpe_heads", list(range(min(H, 8))))
    ss["ex_rpe_heads"] = [h for h in ss["ex_rpe_heads"] if h in range(H)] or [0]
    r1, r2 = st.columns([3, 1])
    r1.multiselect("Heads", list(range(H)), key="ex_rpe_heads", persist_state=choices.KEEP)
    r2.selectbox("Layer", list(range(L)), key="ex_dist_layer", persist_state=choices.KEEP)
    try:
        curves = cache.distance_curves(ctx.loaded, ctx.request, int(ss["ex_dist_layer"]), scheme=ctx.choice.scheme)
    except UserError as err:
        st.error(message(err))
        return
    chart(
        figure_cache.figure(
            distance_figure, curves.distances, curves.mean, list(ss["ex_rpe_heads"]), ctx.train_length, curves.layer
        ),
        "rope_distance",
    )

    def table() -> pd.DataFrame:
        return pd.DataFrame(
            curves.mean.T,
            index=pd.Index(curves.distances, name="distance"),
            columns=[f"head {h}" for h in range(curves.heads)],
        )

    st.download_button("distance.csv", csv_of(table), "distance.csv", "text/csv", key="dl_distance", on_click="ignore")


def bias_section(ctx: PageState) -> None:
    """The relative-position bias curves: they depend on the model and the document's length, not on tau.
    A rotary model has none: its counterpart is :func:`distance_section`."""
    if not ctx.loaded.seq2seq:
        distance_section(ctx)
        return
    ss = st.session_state
    H = ctx.loaded.n_heads
    st.subheader("Relative-position bias b(m, n)")
    st.caption(
        "T5 adds a learned bias per bucket of distance n - m. Buckets are exact up to 8 tokens and log-spaced up to "
        "128 (grey dotted lines); every key farther away shares one value, so past 128 tokens the bias cannot tell "
        "positions apart and long inputs flatten the attention of heads that relied on it (paper Fig. 1)."
    )
    # Behind a switch: the landing page then draws no plotly chart, and a new tab need not load and parse
    # plotly's 4.7 MB of JavaScript before the scrubber is usable (bench/browser_latency.py, warm landing).
    ss.setdefault("ex_show_bias", False)
    if not st.toggle("Show the bias curves", key="ex_show_bias", persist_state=choices.KEEP):
        return
    try:
        enc = cache.encoded(ctx.loaded, ctx.request, ctx.document)  # refuses a document past free memory
    except UserError as err:
        st.error(message(err))
        return
    q0 = enc.question_tokens[0] if enc.question_tokens else enc.n // 2
    ss.setdefault("ex_rpe_heads", list(range(min(H, 8))))
    ss["ex_rpe_heads"] = [h for h in ss["ex_rpe_heads"] if h in range(H)] or [0]
    # The query follows the document: the question's first token after every document change.
    if ss.get("_rpe_doc") != ctx.request or ss.get("ex_rpe_query") is None or ss["ex_rpe_query"] >= enc.n:
        ss["ex_rpe_query"], ss["_rpe_doc"] = int(min(q0, enc.n - 1)), ctx.request
    r1, r2 = st.columns([3, 1])
    r1.multiselect("Heads", list(range(H)), key="ex_rpe_heads", persist_state=choices.KEEP)
    r2.number_input(
        "Query position m",
        min_value=0,
        max_value=max(0, enc.n - 1),
        step=1,
        key="ex_rpe_query",
        persist_state=choices.KEEP,
        help="Default: the question's first token (reset when the document changes).",
    )
    try:
        curves = cache.bias_curves(ctx.loaded, int(ss["ex_rpe_query"]), enc.n)
    except UserError as err:
        st.error(message(err))
        return
    chart(
        figure_cache.figure(
            plots.rpe_curves,
            curves,
            ss["ex_rpe_heads"],
            int(ss["ex_rpe_query"]),
            ctx.train_length,
            int(getattr(ctx.loaded.config, "relative_attention_max_distance", 128)),
        ),
        "rpe",
    )
    st.download_button(
        "rpe.csv", csv_of(lambda: tables.rpe_table(curves)), "rpe.csv", "text/csv", key="dl_rpe", on_click="ignore"
    )
