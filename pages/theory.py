"""Theory: why dispersion happens and where the closed-form temperatures come from (paper Sec. 4)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # a page may run alone (see ui.sidebar)
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from core import plots, tasks, temperature  # noqa: E402
from core.errors import UserError  # noqa: E402
from core.probes import ProbeSpec  # noqa: E402
from core.settings import DocumentRequest  # noqa: E402
from ui import PAPER, chart, csv_of, page_setup  # noqa: E402
from ui import cache  # noqa: E402
from ui import sidebar as sb  # noqa: E402


def main() -> None:
    page_setup("Theory")
    st.title("Theory: sorted logits, l_max and the temperature formulas")
    st.caption(
        "The paper models each attention row's logits as roughly Gaussian with spread sigma. Then the largest "
        "probability and the entropy depend on sigma and the length L only, so one can solve for the tau that keeps "
        f"them at their L_tr values (Prop. 1 for Pmax, Prop. 2 for entropy). Paper: {PAPER}."
    )
    ss = st.session_state
    ctx = sb.sidebar()
    lt = ctx.train_length
    spec = ProbeSpec(heatmap=False, sorted_logits=True, cosine_hist_bins=60 if ctx.loaded.cosine else 0)
    try:
        with st.spinner("Layer-0 logits at this length and at L_tr…"):
            here = cache.run(ctx.loaded, ctx.request, ctx.run_settings(tau=1.0, method="none", probes=spec, generate=False))
            ref = cache.run_reference(ctx.loaded, ctx.request, ctx.targets, ctx.cosine_scale)
    except UserError as err:
        st.error(str(err))
        st.stop()

    # -- QQ -------------------------------------------------------------------------------
    st.subheader("Is the average sorted logit vector Gaussian? (Fig. 2)")
    st.caption(
        "Sort each query row's raw logits (q·k + bias) in layer 0, average over rows and heads, and compare the "
        "resulting values with normal quantiles. Points on the dashed line mean Gaussian; the paper's Prop.s assume "
        "this. Look at the top-right tail: the largest logit l_max sets how peaked the softmax can be."
    )
    vectors = {f"L_tr = {ref.tokens:,}": ref.probes.sorted_logits, f"this document, {here.tokens:,}": here.probes.sorted_logits}
    vectors = {k: v for k, v in vectors.items() if v is not None}
    chart(plots.qq_plot(vectors), "qq")
    st.download_button("sorted_logits.csv", csv_of(lambda: pd.DataFrame(
        {k: pd.Series(v) for k, v in vectors.items()}).rename_axis("rank")), "sorted_logits.csv", "text/csv",
        key="dl_qq", on_click="ignore")

    # -- across lengths -------------------------------------------------------------------
    st.subheader("l_max and sigma across lengths (Table 8)")
    st.caption(
        "The same task at several lengths, tau = 1. sigma and l_max of layer 0's average sorted logits barely move "
        "with length, while the number of keys grows: that is why Pmax falls like 1/L and the softmax must be "
        "sharpened by a tau that depends on L."
    )
    ss.setdefault("th_multiples", [1, 2, 4, 8])
    st.multiselect("Lengths (× L_tr)", list(sb.MULTIPLES), key="th_multiples", format_func=lambda k: f"{k}× = {k * lt:,}")
    if ctx.request.task in tasks.TASKS:
        base_req = ctx.request
    else:
        base_req = DocumentRequest(task="passkey", depth=ctx.request.depth, seed=ctx.request.seed)
        st.info("Pasted text has one length; these lengths use the pass key task.")
    reqs = {k: replace(base_req, tokens=k * lt) for k in sorted(ss["th_multiples"])}
    missing = [k for k, r in reqs.items() if cache.length_stats(ctx.loaded, r, compute=False) is None]
    if missing and st.button(f"Measure {', '.join(f'{k}×' for k in missing)}", key="th_measure", type="primary"):
        bar = st.progress(0.0)
        try:
            for i, k in enumerate(missing):
                bar.progress(i / len(missing), text=f"{k}× L_tr = {k * lt:,} tokens")
                cache.length_stats(ctx.loaded, reqs[k])
        except UserError as err:
            bar.empty()
            st.error(str(err))
            st.stop()
        st.rerun()  # redraw from the cache, without the button
    rows = [s for s in (cache.length_stats(ctx.loaded, r, compute=False) for r in reqs.values()) if s is not None]
    stats = pd.DataFrame(rows)
    if not stats.empty:
        stats["ratio"] = (stats["tokens"] / lt).round(2)
        c1, c2 = st.columns([2, 1])
        with c1:
            chart(plots.lmax_vs_length(stats, lt), "lmax")
        with c2:
            st.dataframe(stats[["tokens", "ratio", "l_max", "sigma", "pmax_layer0"]].round(4), hide_index=True, width="stretch")
            st.download_button("lengths.csv", stats.to_csv(index=False).encode(), "lengths.csv", "text/csv",
                               key="dl_lengths", on_click="ignore")
    elif missing:
        st.caption("Press Measure to run one tau = 1 pass per length (cached).")

    # -- temperature curves ---------------------------------------------------------------
    st.subheader("tau over length: formulas and Algorithm 1 (Fig. 3/4)")
    st.caption(
        "Lines: log-length (log L_tr / log L) and InfoScale need only L; Prop. 1 and 2 use sigma measured at each "
        "length above (and Pmax, sigma at L_tr). Diamonds: Algorithm 1's measured picks. Where the formulas follow "
        "the diamonds, the Gaussian picture explains the aligned tau."
    )
    dense = sorted(set(np.geomspace(lt, 16 * lt, 25).round().astype(int).tolist()))
    curves: dict[str, tuple] = {
        "log-length": (dense, [temperature.log_length(lt, n) for n in dense]),
        "InfoScale": (dense, [temperature.infoscale(lt, n, ctx.loaded.d_kv) for n in dense]),
    }
    sig_tr, pmax_tr = ref.probes.sigma, float(ref.probes.pmax[0][0].mean())
    if not stats.empty and sig_tr is not None:
        xs, p1, p2 = [], [], []
        for _, r in stats.sort_values("tokens").iterrows():
            n = int(r["tokens"])
            xs.append(n)
            for out, fn in ((p1, lambda: temperature.prop1(lt, max(n, 2), pmax_tr, sig_tr, r["sigma"])),
                            (p2, lambda: temperature.prop2(lt, max(n, 2), sig_tr, r["sigma"]))):
                try:
                    out.append(float(fn()))
                except ValueError:
                    out.append(None)
        curves["Prop. 1"] = (xs, p1)
        curves["Prop. 2"] = (xs, p2)
    dots: dict[str, tuple] = {}
    cal_reqs = dict(reqs)
    have = {k: cache.calibrate_both(ctx.loaded, r, fast=True, compute=False) for k, r in cal_reqs.items()}
    need = [k for k, v in have.items() if v is None]
    if need and st.button("Add Algorithm 1 dots (bisection, ~5 passes per length)", key="th_alg1"):
        bar = st.progress(0.0)
        try:
            for i, k in enumerate(need):
                bar.progress(i / len(need), text=f"Algorithm 1 at {k}× L_tr")
                have[k] = cache.calibrate_both(ctx.loaded, cal_reqs[k], fast=True)
        except UserError as err:
            bar.empty()
            st.error(str(err))
            st.stop()
        st.rerun()
    done = {k: v for k, v in have.items() if v is not None}
    if done:
        for crit in temperature.CRITERIA:
            dots[f"Algorithm 1 ({crit})"] = ([k * lt for k in done], [v[crit].tau for v in done.values()])
    chart(plots.temperature_curves(curves, dots, lt), "taus")

    def tau_df() -> pd.DataFrame:
        frames = [pd.DataFrame({"method": name, "tokens": xs, "tau": ys}) for name, (xs, ys) in {**curves, **dots}.items()]
        return pd.concat(frames, ignore_index=True)

    st.download_button("tau_curves.csv", csv_of(tau_df), "tau_curves.csv", "text/csv", key="dl_taus", on_click="ignore")

    # -- cosine ---------------------------------------------------------------------------
    if ctx.loaded.cosine:
        st.subheader("cos(q, k) in layer 0 (cosine attention)")
        st.caption(
            "A cosine-attention model's logits are s·cos(q, k) + bias, so they are bounded by ±s whatever the length; "
            "CosScale s plays the role of 1/tau. The histogram shows how much of the [-1, 1] range the model uses."
        )
        if here.probes.cosine_hist is not None:
            chart(plots.cosine_hist(here.probes.cosine_hist, here.probes.cosine_edges), "cos")
        else:
            st.info("No cosine histogram was recorded.")


main()
