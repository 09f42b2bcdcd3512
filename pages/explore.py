"""Explore (landing page): one document, tau = 1 beside the chosen tau, every view from one pass each."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # a page may run alone (see ui.sidebar)
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from core import plots  # noqa: E402
from core.errors import UserError  # noqa: E402
from ui import PAPER, chart, csv_of, page_setup  # noqa: E402
from ui import cache  # noqa: E402
from ui import sidebar as sb  # noqa: E402

TOUR = [
    dict(title="1 · At the training length", mult=1, method="none",
         text="A pass key hidden in filler, exactly L_tr tokens long, tau = 1. This is what the model was trained on: "
              "attention is peaked (high Pmax, the black ticks are this length's own values) and the question's "
              "attention finds the needle."),
    dict(title="2 · Eight times longer, tau = 1", mult=8, method="none",
         text="The same task at 8 × L_tr with no correction. Each query now spreads its probability over 8 × more "
              "keys: Pmax falls and entropy rises far from the L_tr reference (bars turn orange/red), and the needle's "
              "peak in the question profile sinks into the filler. This is attention dispersion (paper Sec. 3)."),
    dict(title="3 · Sharpen with log-length scaling", mult=8, method="log-length",
         text="tau = log L_tr / log L divides every logit so a log-length normaliser stays constant (the paper's "
              "baseline). The meters move back toward the L_tr ticks; compare the answer with step 2."),
    dict(title="4 · Align with Algorithm 1", mult=8, method="pmax",
         text="Algorithm 1 searches the tau whose mean Pmax at this length equals the mean at L_tr with tau = 1 "
              "(the Calibrate page shows the search). The meters now line up with the ticks: the attention is as "
              "sharp as during training, which is the paper's attention alignment."),
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


def answer_card(res, title: str, ref, suffix: str = "", key: str | None = None) -> None:
    with st.container(border=True, key=key):
        st.markdown(f"**{title}**")
        verdict = {True: ":green[:material/check_circle: **correct**]", False: ":red[:material/cancel: **wrong**]",
                   None: "no expected answer"}[res.correct]
        st.markdown(f"Answer: `{res.answer or '(empty)'}` · expected: `{res.expected or '–'}` · {verdict}")
        c1, c2 = st.columns(2)
        c1.metric(f"mean Pmax{suffix}", f"{res.pmax:.4f}", delta=f"{res.pmax - ref.pmax:+.4f} vs L_tr",
                  delta_color="off", help="Mean over layers, heads and rows of each row's largest attention probability.")
        c2.metric(f"mean entropy H{suffix}", f"{res.entropy:.3f}", delta=f"{res.entropy - ref.entropy:+.3f} vs L_tr",
                  delta_color="off", help="Mean attention entropy (nats); dispersion raises it.")
        st.caption(f"tau = {res.tau_mean:.3f} ({res.method}) · {res.tokens:,} tokens · computed in "
                   f"{res.seconds['total']:.2f} s (encoder {res.seconds.get('encode', 0):.2f} s), cached since")


def main() -> None:
    page_setup("Explore")
    st.title("Explore: attention dispersion, live")
    st.caption(
        "One document, read twice: at tau = 1 and at the tau you choose in the sidebar. Longer inputs spread each "
        f"query's attention thin (Pmax down, entropy up); dividing the logits by tau < 1 sharpens it again. Paper: {PAPER}."
    )
    ss = st.session_state
    ctx = sb.sidebar()
    L, H = ctx.loaded.n_layers, ctx.loaded.n_heads
    tour(ctx.train_length)

    for k, v in (("ex_layer", L - 1), ("ex_head", "mean"), ("ex_pool", "mean"), ("ex_log", False),
                 ("ex_profile_log", False), ("ex_text_layer", "mean of layers"), ("ex_text_window", 150)):
        ss.setdefault(k, v)
    if ss["ex_layer"] not in range(L):
        ss["ex_layer"] = L - 1
    if ss["ex_head"] != "mean" and ss["ex_head"] not in range(H):
        ss["ex_head"] = "mean"
    probes = cache.explore_probes(ss["ex_layer"], None if ss["ex_head"] == "mean" else int(ss["ex_head"]))
    try:
        with st.spinner("Running the model…"):
            base = cache.run(ctx.loaded, ctx.request, ctx.run_settings(tau=1.0, method="none", probes=probes))
            chosen = cache.run(ctx.loaded, ctx.request, ctx.run_settings(probes=probes))
            ref = cache.run_reference(ctx.loaded, ctx.request, ctx.targets, ctx.cosine_scale)
    except UserError as err:
        st.error(str(err))
        st.stop()

    # -- answers ------------------------------------------------------------------------
    st.subheader("Answer")
    st.caption(
        f"The document is {ctx.tokens:,} tokens, {ctx.ratio:.2f} × the training length L_tr = {ctx.train_length:,}. "
        "Left: no temperature; right: the sidebar's choice. Deltas compare with the same task at L_tr (tau = 1)."
    )
    c1, c2 = st.columns(2)
    with c1:
        answer_card(base, "tau = 1 (no alignment)", ref, suffix=" at tau = 1", key="base_card")
    with c2:
        answer_card(chosen, f"Chosen: {sb.METHOD_LABELS.get(ctx.method, ctx.method)}, tau = {ctx.tau_text()}", ref,
                    key="answer_card")

    # -- meters -------------------------------------------------------------------------
    st.subheader("Pmax and entropy per layer against L_tr")
    st.caption(
        "Bars: the chosen tau; black ticks: the same task at L_tr with tau = 1 (what training looked like); grey "
        "circles: this document at tau = 1. Green within 10 % of the tick, orange within 30 %, red beyond. "
        "Alignment means bars on the ticks (paper Sec. 4, Table 2's Pmax/entropy columns)."
    )
    m1, m2 = st.columns(2)
    with m1:
        chart(plots.layer_meters(chosen.probes.layer_pmax, ref.probes.layer_pmax, "Pmax", base.probes.layer_pmax), "meter_pmax")
    with m2:
        chart(plots.layer_meters(chosen.probes.layer_entropy, ref.probes.layer_entropy, "entropy H",
                                 base.probes.layer_entropy), "meter_h")

    def meters_df() -> pd.DataFrame:
        return pd.DataFrame({
            "layer": range(L), "pmax": chosen.probes.layer_pmax, "pmax_tau1": base.probes.layer_pmax,
            "pmax_ref_Ltr": ref.probes.layer_pmax, "entropy": chosen.probes.layer_entropy,
            "entropy_tau1": base.probes.layer_entropy, "entropy_ref_Ltr": ref.probes.layer_entropy,
        })

    # -- heatmap ------------------------------------------------------------------------
    st.subheader("Attention map")
    st.caption(
        f"Encoder self-attention of one layer (one head or the head mean), pooled to at most {cache.HEATMAP_SIZE} × "
        f"{cache.HEATMAP_SIZE} cells of token ranges. Red dotted lines: the needle; blue: the question. Look at the "
        "question rows: at tau = 1 on a long input their mass spreads over the whole row; a smaller tau brings "
        "back a bright cell at the needle column. Log colour shows the dispersed tail."
    )
    h1, h2, h3, h4 = st.columns(4)
    h1.selectbox("Layer", list(range(L)), key="ex_layer")
    h2.selectbox("Head", ["mean"] + list(range(H)), key="ex_head", format_func=lambda h: "mean of heads" if h == "mean" else f"head {h}")
    h3.radio("Pooling", ("mean", "max"), key="ex_pool", horizontal=True)
    h4.toggle("log colour", key="ex_log")
    maps = st.columns(2)
    for col, res, name, k in ((maps[0], base, "tau = 1", "heat_base"), (maps[1], chosen, f"chosen tau = {ctx.tau_text()}", "heat_chosen")):
        z = res.probes.heatmap_mean if ss["ex_pool"] == "mean" else res.probes.heatmap_max
        with col:
            if z is None:
                st.info("No heatmap recorded for this run.")
            else:
                chart(plots.heatmap(z, res.probes.heatmap_edges, res.needle_tokens, res.question_tokens,
                                    log=ss["ex_log"], title=name), k)

    def heat_df() -> pd.DataFrame:
        z = chosen.probes.heatmap_mean if ss["ex_pool"] == "mean" else chosen.probes.heatmap_max
        pos = chosen.probes.heatmap_edges[:-1]
        return pd.DataFrame(z, index=pd.Index(pos, name="query_token"), columns=[f"key_{p}" for p in pos])

    # -- question profile ---------------------------------------------------------------
    st.subheader("Where the question looks")
    st.caption(
        "Attention from the question's tokens to every document position (head mean, averaged over the question "
        "rows), one line per layer; the needle is shaded red. Retrieval works when some layer puts a clear peak "
        "inside the red band; dispersion flattens that peak into the filler (paper Fig. 5's intuition)."
    )
    if chosen.probes.profile is None:
        st.info("This document has no question span, so there is no question profile.")
    else:
        ss.setdefault("ex_profile_layers", list(range(L)))
        ss["ex_profile_layers"] = [l for l in ss["ex_profile_layers"] if l in range(L)] or list(range(L))
        p1, p2 = st.columns([3, 1])
        p1.multiselect("Layers", list(range(L)), key="ex_profile_layers")
        p2.toggle("log scale", key="ex_profile_log")
        t1, t2 = st.tabs([f"chosen tau = {ctx.tau_text()}", "tau = 1"])
        for tab, res, k in ((t1, chosen, "prof_c"), (t2, base, "prof_b")):
            with tab:
                chart(plots.question_profile(res.probes.profile, res.needle_tokens, res.question_tokens,
                                             ss["ex_profile_layers"], log_y=ss["ex_profile_log"]), k)

    def profile_df() -> pd.DataFrame:
        d = {"token": np.arange(chosen.probes.profile.shape[1])}
        for l in range(L):
            d[f"layer_{l}"] = chosen.probes.profile[l]
            d[f"layer_{l}_tau1"] = base.probes.profile[l]
        return pd.DataFrame(d)

    # -- text view ----------------------------------------------------------------------
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

    # -- rpe ----------------------------------------------------------------------------
    st.subheader("Relative-position bias b(m, n)")
    st.caption(
        "T5 adds a learned bias per bucket of distance n - m. Buckets are exact up to 8 tokens and log-spaced up to "
        "128 (grey dotted lines); every key farther away shares one value, so past 128 tokens the bias cannot tell "
        "positions apart and long inputs flatten the attention of heads that relied on it (paper Fig. 1)."
    )
    q0 = chosen.question_tokens[0] if chosen.question_tokens else chosen.tokens // 2
    ss.setdefault("ex_rpe_heads", list(range(min(H, 8))))
    ss["ex_rpe_heads"] = [h for h in ss["ex_rpe_heads"] if h in range(H)] or [0]
    if ss.get("ex_rpe_query") is None or ss["ex_rpe_query"] >= chosen.tokens:
        ss["ex_rpe_query"] = int(min(q0, chosen.tokens - 1))
    r1, r2 = st.columns([3, 1])
    r1.multiselect("Heads", list(range(H)), key="ex_rpe_heads")
    r2.number_input("Query position m", min_value=0, max_value=max(0, chosen.tokens - 1), step=1, key="ex_rpe_query",
                    help="Default: the question's first token.")
    try:
        curves = cache.bias_curves(ctx.loaded, int(ss["ex_rpe_query"]), chosen.tokens)
        chart(plots.rpe_curves(curves, ss["ex_rpe_heads"], int(ss["ex_rpe_query"]), ctx.train_length,
                               int(getattr(ctx.loaded.config, "relative_attention_max_distance", 128))), "rpe")
    except UserError as err:
        st.error(str(err))
        curves = None

    def rpe_df() -> pd.DataFrame:
        return pd.DataFrame(curves.T, columns=[f"head_{h}" for h in range(curves.shape[0])]).rename_axis("key_position")

    # -- export -------------------------------------------------------------------------
    st.subheader("Export")
    st.caption("Each figure's toolbar downloads a PNG. Below: the data behind the figures as CSV, and these settings "
               "as a JSON file the command line accepts.")
    e = st.columns(5)
    e[0].download_button("meters.csv", csv_of(meters_df), "meters.csv", "text/csv", key="dl_meters", on_click="ignore")
    if chosen.probes.heatmap_mean is not None:
        e[1].download_button("heatmap.csv", csv_of(heat_df), "heatmap.csv", "text/csv", key="dl_heat", on_click="ignore")
    if chosen.probes.profile is not None:
        e[2].download_button("profile.csv", csv_of(profile_df), "profile.csv", "text/csv", key="dl_prof", on_click="ignore")
    if curves is not None:
        e[3].download_button("rpe.csv", csv_of(rpe_df), "rpe.csv", "text/csv", key="dl_rpe", on_click="ignore")
    settings_json = ctx.settings().to_json()
    e[4].download_button("settings.json", settings_json, "choice.json", "application/json", key="dl_settings", on_click="ignore")
    st.code(sb.cli_command("choice.json"), language="bash")


main()
