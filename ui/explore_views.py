"""Explore's views, one function each: the page (pages/explore.py) only arranges them.

Each takes the context and the three runs it shows (tau = 1, the chosen tau,
the same task at L_tr) and draws one section; figures come from
:mod:`core.plots` through :func:`ui.cache.figure`, tables from :mod:`core.views`.
"""

from __future__ import annotations

import streamlit as st

from core import plots, views
from core.errors import UserError
from ui import chart, csv_of
from ui import cache
from ui import sidebar as sb


def answer_card(res, title: str, ref, suffix: str = "", key: str | None = None) -> None:
    with st.container(border=True, key=key):
        st.markdown(f"**{title}**")
        if res.perplexity is not None:  # a language-modelling sequence: scored by perplexity, not an answer
            lm_score(res, ref)
        else:
            verdict = {True: ":green[:material/check_circle: **correct**]", False: ":red[:material/cancel: **wrong**]",
                       None: "no expected answer"}[res.correct]
            st.markdown(f"Answer: `{res.answer or '(empty)'}` · expected: `{res.expected or '–'}` · {verdict}")
        c1, c2 = st.columns(2)
        for col, label, value, refv, digits, hint in (
            (c1, f"mean Pmax{suffix}", res.pmax, ref.pmax, 4,
             "Mean over layers, heads and rows of each row's largest attention probability."),
            (c2, f"mean entropy H{suffix}", res.entropy, ref.entropy, 3, "Mean attention entropy (nats); dispersion raises it."),
        ):
            d = round(value - refv, digits)
            col.metric(label, f"{value:.{digits}f}", delta=f"{d:+.{digits}f} vs L_tr" if d else "same as L_tr",
                       delta_color="off", delta_arrow="auto" if d else "off", help=hint)
        st.caption(f"tau = {res.tau_mean:.3f} ({res.method}) · {res.tokens:,} tokens · computed in "
                   f"{res.seconds['total']:.2f} s (encoder {res.seconds.get('encode', 0):.2f} s)")


def lm_score(res, ref) -> None:
    """Perplexity of the continuation (paper Table 3's measure) against the same sequence at L_tr, and what the
    model writes next beside what the text says."""
    ratio = res.perplexity / ref.perplexity if ref.perplexity else None
    st.metric(f"perplexity of the next {res.scored_tokens} tokens", f"{res.perplexity:.1f}",
              delta=None if ratio is None else f"{ratio:.2f}× the same text at L_tr ({ref.perplexity:.1f})",
              delta_color="off", delta_arrow="off",
              help="exp(mean -log p) of the true continuation, teacher-forced. Past L_tr, dispersed attention in "
                   "the encoder blurs the prefix and perplexity climbs; an aligned tau should bring it back near L_tr's.")
    st.markdown(f"Writes: `{res.answer or '(empty)'}` · the text goes on: `{res.expected[:60]}…`")


def page_state(L: int, H: int) -> None:
    ss = st.session_state
    for k, v in (("ex_layer", L - 1), ("ex_head", "mean"), ("ex_pool", "mean"), ("ex_log", False),
                 ("ex_profile_log", False), ("ex_text_layer", "mean of layers"), ("ex_text_window", 150)):
        ss.setdefault(k, v)
    if ss["ex_layer"] not in range(L):
        ss["ex_layer"] = L - 1
    if ss["ex_head"] != "mean" and ss["ex_head"] not in range(H):
        ss["ex_head"] = "mean"
    ss.setdefault("ex_profile_layers", list(range(L)))
    ss["ex_profile_layers"] = [l for l in ss["ex_profile_layers"] if l in range(L)] or list(range(L))



def meters(ctx: sb.Context, base, chosen, ref) -> None:
    """Per-layer Pmax and entropy bars of the chosen tau against the L_tr ticks and the tau = 1 circles."""
    st.subheader("Pmax and entropy per layer against L_tr")
    st.caption(
        "Bars: the chosen tau; black ticks: the same task at L_tr with tau = 1 (what training looked like); grey "
        "circles: this document at tau = 1. Green within 10 % of the tick, orange within 30 %, red beyond. "
        "Alignment means bars on the ticks (paper Sec. 4, Table 2's Pmax/entropy columns)."
    )
    chosen_s, ref_s, base_s = ({"Pmax": r.probes.layer_pmax, "entropy H": r.probes.layer_entropy} for r in (chosen, ref, base))
    chart(cache.figure(plots.meters_pair, chosen_s, ref_s, base_s), "meters")
    with st.expander("Per head: Pmax over its value at L_tr"):
        st.caption("Each cell is one head's mean Pmax here over the same head's at L_tr (tau = 1): 1 (white) looks as "
                   "in training, red has dispersed, blue is sharper than in training. A global tau moves every head "
                   "at once; saturated heads (near 1 at any length) and flat ones pull the mean Algorithm 1 matches, "
                   "which is why per-head alignment (method list) gives each head its own tau.")
        panels = {"tau = 1": base.probes.pmax[0], f"chosen tau = {ctx.tau_text()}": chosen.probes.pmax[0]}
        chart(cache.figure(plots.head_ratio_maps, panels, ref.probes.pmax[0]), "head_pmax")


def maps(ctx: sb.Context, base, chosen, ref) -> None:
    """One layer's attention map at tau = 1 and at the chosen tau on one colour scale, with the question's own rows."""
    ss = st.session_state
    L, H = ctx.loaded.n_layers, ctx.loaded.n_heads
    st.subheader("Attention map")
    st.caption(
        f"Encoder self-attention of one layer (one head or the head mean), pooled to at most {cache.HEATMAP_SIZE} × "
        f"{cache.HEATMAP_SIZE} cells of token ranges; both maps share one colour scale. Red dotted lines: the needle; "
        "blue: the question. Below them, the question's own rows, one token each: at tau = 1 on a long input their "
        "mass spreads over the whole row; a smaller tau brings back a bright cell at the needle column. Log colour "
        "shows the dispersed tail."
    )
    h1, h2, h3, h4 = st.columns(4)
    h1.selectbox("Layer", list(range(L)), key="ex_layer")
    h2.selectbox("Head", ["mean"] + list(range(H)), key="ex_head", format_func=lambda h: "mean of heads" if h == "mean" else f"head {h}")
    h3.radio("Pooling", ("mean", "max"), key="ex_pool", horizontal=True)
    h4.toggle("log colour", key="ex_log")
    pool = ss["ex_pool"]
    pair = ((base, "tau = 1", "heat_base", "qrows_base"), (chosen, f"chosen tau = {ctx.tau_text()}", "heat_chosen", "qrows_chosen"))
    maps = {k: getattr(r.probes, f"heatmap_{pool}") for r, _, k, _ in pair}
    qmaps = {k: getattr(r.probes, f"question_map_{pool}") for r, _, _, k in pair}
    zr = plots.shared_range(*maps.values(), *qmaps.values())
    cols = st.columns(2)
    for col, (res, name, k, qk) in zip(cols, pair):
        with col:
            if maps[k] is None:
                st.info("No heatmap recorded for this run.")
                continue
            chart(cache.figure(plots.heatmap, maps[k], res.probes.heatmap_edges, res.needle_tokens, res.question_tokens,
                                log=ss["ex_log"], title=name, zrange=zr), k)
            if qmaps[qk] is not None:
                chart(cache.figure(plots.heatmap, qmaps[qk], res.probes.heatmap_edges, res.needle_tokens, None, log=ss["ex_log"],
                                    title=f"question rows, {name}", zrange=zr, rows=res.probes.question_rows,
                                    height=150 + 9 * len(res.probes.question_rows)), qk)


def profile(ctx: sb.Context, base, chosen, ref) -> None:
    """Where the question looks: its attention to every position, per layer, chosen tau over tau = 1."""
    ss = st.session_state
    L = ctx.loaded.n_layers
    st.subheader("Where the question looks")
    st.caption(
        "Attention from the question's tokens to every document position (head mean, averaged over the question "
        "rows), one line per layer at the chosen tau, grey lines at tau = 1; the needle is shaded red. Retrieval works when some layer puts a clear peak "
        "inside the red band; dispersion flattens that peak into the filler (paper Fig. 5's intuition)."
    )
    if chosen.probes.profile is None:
        st.info("This document has no question span, so there is no question profile.")
    else:
        p1, p2 = st.columns([3, 1])
        p1.multiselect("Layers", list(range(L)), key="ex_profile_layers")
        p2.toggle("log scale", key="ex_profile_log")
        chart(cache.figure(plots.question_profile, chosen.probes.profile, chosen.needle_tokens, chosen.question_tokens,
                                     ss["ex_profile_layers"], log_y=ss["ex_profile_log"], baseline=base.probes.profile,
                                     title=f"chosen tau = {ctx.tau_text()} (colours) and tau = 1 (grey)"), "profile")


def text_view(ctx: sb.Context, base, chosen, ref) -> None:
    """The document shaded by the question's attention, zoomed around the needle."""
    ss = st.session_state
    L = ctx.loaded.n_layers
    if chosen.probes.profile is not None and chosen.offsets is not None:
        st.subheader("The text, shaded by the question's attention")
        st.caption(
            "Each token's background is the attention the question gives it (chosen tau), relative to the largest "
            "in view; the needle is underlined. Zoomed around the needle (or the question when there is no needle)."
        )
        v1, v2 = st.columns(2)
        v1.selectbox("Attention of", ["mean of layers"] + [f"layer {l}" for l in range(L)], key="ex_text_layer")
        v2.slider("Tokens shown either side", 20, 2000, step=10, key="ex_text_window")
        prof = chosen.probes.profile
        w = prof.mean(0) if ss["ex_text_layer"] == "mean of layers" else prof[int(ss["ex_text_layer"].split()[1])]
        centre = chosen.needle_tokens or chosen.question_tokens
        with st.container(height=300, border=True):
            st.markdown(plots.token_shading_html(ctx.document.text, chosen.offsets, w, centre, int(ss["ex_text_window"]),
                                                 chosen.needle_tokens), unsafe_allow_html=True)


def answer_attention(ctx: sb.Context, base, chosen, ref) -> None:
    """Where the answer looks: the decoder's cross-attention over the document as it writes, tau = 1 beside the chosen tau."""
    ss = st.session_state
    st.subheader("Where the answer looks")
    st.caption(
        "The decoder's cross-attention while it writes the answer: one row per token it wrote, the document's "
        f"positions pooled into at most {cache.HEATMAP_SIZE} columns like the maps above (the head chosen there, or "
        "the head mean); the red bar marks the needle, the titles give the share of attention on it. To copy the "
        "answer, the rows must light up the needle's columns. tau divides the encoder only, so the two sides tell "
        "where a wrong answer comes from: the answer looking elsewhere (the share falls), or reading a needle whose "
        "encoder states dispersion has blurred (the share holds, the tokens come out wrong)."
    )
    pair = ((base, "tau = 1", "cross_base"), (chosen, f"chosen tau = {ctx.tau_text()}", "cross_chosen"))
    if any(views.answer_attention(res) is None for res, _, _ in pair):
        st.info("No cross-attention was recorded for this run.")
        return
    layers = list(chosen.probes.layers("cross", "map"))
    if ss.get("ex_cross_layer") not in ["mean", *layers]:
        ss["ex_cross_layer"] = "mean"
    st.selectbox("Decoder layer", ["mean", *layers], key="ex_cross_layer",
                 format_func=lambda l: "mean of layers" if l == "mean" else f"layer {l}")
    layer = None if ss["ex_cross_layer"] == "mean" else int(ss["ex_cross_layer"])
    shown = [views.answer_attention(res, layer) for res, _, _ in pair]
    zr = plots.shared_range(*(z for z, _ in shown))
    for col, (res, name, key), (z, tokens) in zip(st.columns(2), pair, shown):
        share = views.needle_share(res, layer)
        title = name + ("" if share is None else f": {share:.0%} of it on the needle (all heads)")
        with col:
            chart(cache.figure(plots.answer_attention, z, res.probes.heatmap_edges, res.needle_tokens, tokens,
                               log=ss["ex_log"], title=title, zrange=zr), key)
    st.download_button("answer_attention.csv", csv_of(lambda: views.answer_attention_table(chosen, layer)),
                       "answer_attention.csv", "text/csv", key="dl_cross", on_click="ignore")


def export(ctx: sb.Context, base, chosen, ref) -> None:
    """CSV of every figure's data and the settings JSON the CLI accepts."""
    st.subheader("Export")
    st.caption("Each figure's toolbar downloads a PNG. Below: the data behind the figures as CSV, and these settings "
               "as a JSON file the command line accepts.")
    pool = st.session_state["ex_pool"]
    e = st.columns(4)
    e[0].download_button("meters.csv", csv_of(lambda: views.meters_table(chosen, base, ref)), "meters.csv", "text/csv",
                         key="dl_meters", on_click="ignore")
    if chosen.probes.heatmap_mean is not None:
        e[1].download_button("heatmap.csv", csv_of(lambda: views.heatmap_table(chosen, pool)), "heatmap.csv", "text/csv",
                             key="dl_heat", on_click="ignore")
    if chosen.probes.profile is not None:
        e[2].download_button("profile.csv", csv_of(lambda: views.profile_table(chosen, base)), "profile.csv", "text/csv",
                             key="dl_prof", on_click="ignore")
    e[3].download_button("settings.json", ctx.settings().to_json(), "choice.json", "application/json", key="dl_settings",
                         on_click="ignore")
    # Inline code, not st.code: st.code makes the browser fetch and parse a 1.6 MB syntax highlighter,
    # which on the landing page cost seconds in a fresh tab (bench/browser_latency.py).
    st.markdown(f"Then run: `{sb.cli_command('choice.json')}`")


def bias_section(ctx: sb.Context) -> None:
    """The relative-position bias curves: they depend on the model and the document's length, not on tau."""
    ss = st.session_state
    H = ctx.loaded.n_heads
    st.subheader("Relative-position bias b(m, n)")
    st.caption(
        "T5 adds a learned bias per bucket of distance n - m. Buckets are exact up to 8 tokens and log-spaced up to "
        "128 (grey dotted lines); every key farther away shares one value, so past 128 tokens the bias cannot tell "
        "positions apart and long inputs flatten the attention of heads that relied on it (paper Fig. 1)."
    )
    enc = cache.encoded(ctx.loaded, ctx.request, ctx.document)
    q0 = enc.question_tokens[0] if enc.question_tokens else enc.n // 2
    ss.setdefault("ex_rpe_heads", list(range(min(H, 8))))
    ss["ex_rpe_heads"] = [h for h in ss["ex_rpe_heads"] if h in range(H)] or [0]
    # The query follows the document: the question's first token after every document change.
    if ss.get("_rpe_doc") != ctx.request or ss.get("ex_rpe_query") is None or ss["ex_rpe_query"] >= enc.n:
        ss["ex_rpe_query"], ss["_rpe_doc"] = int(min(q0, enc.n - 1)), ctx.request
    r1, r2 = st.columns([3, 1])
    r1.multiselect("Heads", list(range(H)), key="ex_rpe_heads")
    r2.number_input("Query position m", min_value=0, max_value=max(0, enc.n - 1), step=1, key="ex_rpe_query",
                    help="Default: the question's first token (reset when the document changes).")
    try:
        curves = cache.bias_curves(ctx.loaded, int(ss["ex_rpe_query"]), enc.n)
    except UserError as err:
        st.error(str(err))
        return
    chart(cache.figure(plots.rpe_curves, curves, ss["ex_rpe_heads"], int(ss["ex_rpe_query"]), ctx.train_length,
                           int(getattr(ctx.loaded.config, "relative_attention_max_distance", 128))), "rpe")
    st.download_button("rpe.csv", csv_of(lambda: views.rpe_table(curves)), "rpe.csv", "text/csv", key="dl_rpe",
                       on_click="ignore")
