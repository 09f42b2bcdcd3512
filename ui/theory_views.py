"""The Theory page's sections, one function each: the page (app_pages/theory.py) only arranges them."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pandas as pd
import streamlit as st

from core.data import tasks
from core.errors import UserError
from core.experiments import csvio
from core.runs import methods, temperature, timing
from core.runs.settings import DocumentRequest
from core.views import plots, tables
from ui import cache, chart, choices, csv_of, document_controls, user_errors
from ui.page_state import PageState


def _or_none(name: str, lt: int, n: int, d: int, st: dict | None) -> float | None:
    """A closed form's tau, or a gap in its curve where it has no answer."""
    try:
        return methods.formula(name, lt, n, d, st)
    except UserError:
        return None


def qq(here, ref) -> None:
    """Layer 0's average sorted logits against normal quantiles, here and at L_tr (paper Fig. 2)."""
    st.subheader("Is the average sorted logit vector Gaussian? (Fig. 2)")
    st.caption(
        "Sort each query row's raw logits (q·k + bias) in layer 0, average over rows and heads, and compare the "
        "resulting values with normal quantiles. Points on the dashed line mean Gaussian; the paper's Prop.s assume "
        "this. Look at the top-right tail: the largest logit l_max sets how peaked the softmax can be."
    )
    vectors = {
        f"L_tr = {ref.tokens:,}": ref.probes.sorted_logits,
        f"this document, {here.tokens:,}": here.probes.sorted_logits,
    }
    vectors = {k: v for k, v in vectors.items() if v is not None}
    chart(plots.qq_plot(vectors), "qq")
    st.download_button(
        "sorted_logits.csv",
        csv_of(lambda: tables.sorted_logits_table(vectors)),
        "sorted_logits.csv",
        "text/csv",
        key="dl_qq",
        on_click="ignore",
    )


def across_lengths(ctx: PageState) -> tuple[dict, pd.DataFrame]:
    """l_max and sigma at several lengths (one tau = 1 pass each, on request): (requests by multiple, stats)."""
    ss = st.session_state
    lt = ctx.train_length
    st.subheader("l_max and sigma across lengths (Table 8)")
    st.caption(
        "The same task at several lengths, tau = 1. sigma and l_max of layer 0's average sorted logits barely move "
        "with length, while the number of keys grows: that is why Pmax falls like 1/L and the softmax must be "
        "sharpened by a tau that depends on L."
    )
    ss.setdefault("th_multiples", [1, 2, 4, 8])
    st.multiselect(
        "Lengths (× L_tr)",
        list(document_controls.MULTIPLES),
        key="th_multiples",
        persist_state=choices.KEEP,
        format_func=lambda k: f"{k}× = {k * lt:,}",
    )
    if ctx.request.task in tasks.GENERATED:
        base_req = ctx.request
    else:
        base_req = DocumentRequest(task="passkey", depth=ctx.request.depth, seed=ctx.request.seed)
        st.info("Pasted text has one length; these lengths use the pass key task.")
    reqs = {k: replace(base_req, tokens=k * lt) for k in sorted(ss["th_multiples"])}
    missing = [k for k, r in reqs.items() if cache.length_stats(ctx.loaded, r, compute=False) is None]
    mk = timing.model_key(ctx.loaded)
    if missing:
        work = [(1, k * lt) for k in sorted(missing, reverse=True)]
        st.caption(timing.plan_note("Measuring", mk, work, name_all=True))
    if missing and st.button(f"Measure {', '.join(f'{k}×' for k in missing)}", key="th_measure", type="primary"):
        left = timing.Countdown(timing.total(mk, work))  # a time left that never jumps back up
        bar = st.progress(0.0, text=left.text("Measuring…", 0.0, 0.0))
        t0 = time.perf_counter()
        with user_errors(bar):
            for i, k in enumerate(missing):
                label = f"Measuring {k}× L_tr = {k * lt:,} tokens…"
                bar.progress(
                    i / len(missing),
                    text=left.text(label, i / len(missing), time.perf_counter() - t0),
                )
                cache.length_stats(ctx.loaded, reqs[k])
        st.rerun()  # redraw from the cache, without the button
    rows = [s for s in (cache.length_stats(ctx.loaded, r, compute=False) for r in reqs.values()) if s is not None]
    stats = pd.DataFrame(rows)
    if not stats.empty:
        stats["ratio"] = (stats["tokens"] / lt).round(2)
        chart(plots.lmax_vs_length(stats, lt), "lmax")
        # below the chart, at full width: five short columns stay readable on a laptop screen
        st.dataframe(
            stats[["tokens", "ratio", "l_max", "sigma", "pmax_layer0"]],
            hide_index=True,
            width="content",
            column_config={
                "tokens": st.column_config.NumberColumn("tokens", format="localized"),
                "ratio": st.column_config.NumberColumn("× L_tr", format="%.2f×"),
                "l_max": st.column_config.NumberColumn("l_max", format="%.3f", help="largest average sorted logit"),
                "sigma": st.column_config.NumberColumn("sigma", format="%.3f", help="spread of the sorted logits"),
                "pmax_layer0": st.column_config.NumberColumn(
                    "Pmax, layer 0", format="%.4f", help="mean largest attention probability in layer 0"
                ),
            },
        )
        st.download_button(
            "lengths.csv", csvio.to_csv_bytes(stats), "lengths.csv", "text/csv", key="dl_lengths", on_click="ignore"
        )
    elif missing:
        st.caption("Press Measure to run one tau = 1 pass per length (cached).")
    return reqs, stats


def _formula_curves(ctx: PageState, ref, stats: pd.DataFrame) -> dict[str, tuple]:
    """Every closed form of the registry over length: over L alone, or where sigma was measured."""
    lt = ctx.train_length
    st.subheader("tau over length: formulas and Algorithm 1 (Fig. 3/4)")
    st.caption(
        "Lines: log-length (log L_tr / log L), YaRN, InfoScale, LongRoPE and critical scaling need only L; Prop. 1 "
        "and 2 use sigma measured at each length above (and Pmax, sigma at L_tr). Llama 4 and Qwen's log-n by query "
        "position give each query row its own tau (by its position), so their lines are the mean row tau of an "
        "L-token document. Diamonds: Algorithm 1's measured picks. Where the "
        "formulas follow the diamonds, the Gaussian picture explains the aligned tau."
    )
    dense = sorted(set(np.geomspace(lt, 16 * lt, 25).round().astype(int).tolist()))
    sig_tr, pmax_tr = ref.probes.sigma, float(ref.probes.pmax[0][0].mean())
    rows = (
        []
        if stats.empty or sig_tr is None
        else [
            (int(r["tokens"]), {"sigma_tr": sig_tr, "pmax_tr": pmax_tr, "sigma_ex": r["sigma"]})
            for _, r in stats.sort_values("tokens").iterrows()
        ]
    )
    curves: dict[str, tuple] = {}
    for name in methods.FORMULAS:  # every closed form of the registry: over L, or where sigma was measured
        m = methods.get(name)
        points = rows if m.stats else [(n, None) for n in dense]
        if points:
            curves[m.short] = (
                [n for n, _ in points],
                [_or_none(name, lt, max(n, 2), ctx.loaded.d_kv, s) for n, s in points],
            )
    # a tau per query row (Llama 4, Qwen's log-n by position), no single-number formula: the mean over an L-token
    # document's rows
    for name, per_row in row_schedules(ctx).items():
        curves[f"{methods.get(name).short} (mean row tau)"] = (dense, [per_row.mean(n) for n in dense])
    return curves


def row_schedules(ctx: PageState) -> dict:
    """Every registry method whose schedule is a tau per query row and needs no pass (Llama 4, Qwen's log-n by
    query position), resolved from L_tr alone: ``{name: Schedule}`` in the registry's order."""
    return {
        name: methods.resolve(ctx.loaded, None, name, tokens=ctx.train_length)[0]
        for name, m in methods.REGISTRY.items()
        if m.per == "row" and not m.measured and m.resolve is not None
    }


#: Most points a per-row chart draws (a 16k-token document's rows, evenly picked; the first row past L_tr kept).
ROW_POINTS = 400


def row_tau_frame(schedules: dict, rows: int, train_length: int) -> pd.DataFrame:
    """Each per-row schedule's tau at query rows 0 .. ``rows`` - 1 (at most :data:`ROW_POINTS` of them, evenly
    spread, L_tr - 1 and L_tr among them where they exist), one column per method label: what
    :func:`per_row_chart` draws. The taus are the schedules' own (:meth:`core.values.schedule.Schedule.row_taus`)."""
    picked = np.linspace(0, rows - 1, min(rows, ROW_POINTS)).round().astype(int)
    picked = np.unique(np.concatenate([picked, [p for p in (train_length - 1, train_length) if p < rows]]))
    frame = {"query row": picked}
    for name, s in schedules.items():
        frame[methods.label(name)] = s.rows.taus(picked)
    return pd.DataFrame(frame)


def per_row_chart(ctx: PageState, schedules: dict | None = None) -> None:
    """The per-row methods' tau on each query row of this document (its length: the sidebar's): where the
    rows past L_tr are sharpened and by how much, which a table's one mean hides."""
    schedules = row_schedules(ctx) if schedules is None else schedules
    if not schedules:
        return
    frame = row_tau_frame(schedules, ctx.tokens, ctx.train_length)
    st.markdown(f"**tau per query row** ({ctx.tokens:,} rows, L_tr = {ctx.train_length:,})")
    st.altair_chart(plots.row_taus(frame, ctx.train_length), width="stretch", key="row_taus")
    st.caption(
        "Methods with a tau per query row, by the row's position: rows up to L_tr keep tau = 1, later rows get "
        "smaller taus (Llama 4 in steps of L_tr, Qwen's log-n by position smoothly). "
        + (
            "In this causal decoder row n sees n keys, so these schedules follow each row's own length: the rows "
            "past L_tr, the question's among them (the prompt's last), are the ones sharpened, which is what they "
            "were made for."
            if ctx.loaded.decoder_only
            else "In this encoder every row sees all keys, so the early rows of a long input stay as dispersed as at "
            "tau = 1."
        )
    )


def method_list(ctx: PageState) -> pd.DataFrame:
    """Every registry method (what the CLI's ``--method`` offers) and where this page shows it."""

    def where(name: str) -> str:
        m = methods.get(name)
        if m.constant is not None and m.constant.adaptive:  # no tau before a pass: each row's comes from the row
            return (
                "not drawn: a tau per query row from that row's own entropy, computed inside each pass "
                "(Explore, Calibrate)"
            )
        if m.constant is not None:
            return "tau = 1 at every length (the top of the chart)"
        if m.takes_value:
            return "the slider's tau, the same at every length"
        if m.per == "row" and not m.measured:
            return "a tau per query row: its mean over the rows (line) and each row's tau (chart below)"
        if m.formula is not None:
            same = f" (equal to {methods.get(m.same_as).short} when a row sees every key)" if m.same_as else ""
            return ("a line where sigma was measured (Lengths above)" if m.stats else "a line over L") + same
        if m.grid_criterion is not None:
            return "diamonds: Algorithm 1's grid picks at the measured lengths"
        return "measured on one document (Calibrate; the sidebar's Method box)"

    return pd.DataFrame(
        [(methods.label(n), f"`{n}`", where(n)) for n in methods.NAMES], columns=["method", "name", "on this page"]
    )


_EQUAL_NOTE = (
    "**Why some lines lie on log-length.** Qwen's log-n scaling multiplies a query row's logits by log_{L_tr} n, "
    "and Scalable-Softmax by s log n with s fixed so that tau = 1 at L_tr; n is the number of keys the row sees. "
    "In a bidirectional encoder (T5 here) every row sees all L keys, so n = L for every row and both are exactly "
    "log-length's tau = log L_tr / log L: their lines are drawn dashed on top of it (the legend says '= log-length'). "
    "They differ only in a causal decoder, where row i sees i + 1 keys and the early rows get tau = 1. LongRoPE's "
    "attention factor with s = L / L_tr is log-length too, and so is critical scaling at its default gamma from L_tr "
    "up. Llama 4's line is a mean: its rows before L_tr keep tau = 1 and later rows get 1 / (0.1 ln(1 + floor((pos + 1) / L_tr)) "
    "+ 1), so the document's mean row tau stays closer to 1 than log-length's."
)


_CAUSAL_NOTE = (
    " **This model is such a causal decoder.** Its lines above are a row's tau when it sees all L keys: the "
    "question's rows (the prompt's last, where the answer is read) see nearly L, so the lines are theirs; log-n and "
    "Scalable-Softmax give the earlier rows taus nearer 1."
)


def _algorithm1_dots(ctx: PageState, reqs: dict) -> dict[str, tuple]:
    """Algorithm 1's picks at the measured lengths, from the cache or (on request) by bisection."""
    lt = ctx.train_length
    mk = timing.model_key(ctx.loaded)
    dots: dict[str, tuple] = {}
    cal_reqs = dict(reqs)
    have = {k: cache.calibrate_both(ctx.loaded, r, fast=True, compute=False) for k, r in cal_reqs.items()}
    need = [k for k, v in have.items() if v is None]
    if need:
        per = timing.algorithm1_passes(len(temperature.GRID), fast=True)
        dots_work = [(per, k * lt) for k in sorted(need, reverse=True)] + [(len(need), lt)]
        st.caption(
            timing.plan_note("Adding the Algorithm 1 dots", mk, dots_work, name_all=True)
            + f" Bisection: at most {per} passes per length plus one at L_tr for the reference, often fewer."
        )
    if need and st.button("Add Algorithm 1 dots (bisection)", key="th_alg1"):
        left = timing.Countdown(timing.total(mk, dots_work))  # a time left that never jumps back up
        bar = st.progress(0.0, text=left.text("Algorithm 1…", 0.0, 0.0))
        t0 = time.perf_counter()
        with user_errors(bar):
            for i, k in enumerate(need):

                def step(f: float, i: int = i, k: int = k) -> None:
                    done = (i + min(1.0, f)) / len(need)
                    bar.progress(
                        done,
                        text=left.text(f"Algorithm 1 at {k}× L_tr…", done, time.perf_counter() - t0),
                    )

                step(0.0)
                have[k] = cache.calibrate_both(ctx.loaded, cal_reqs[k], fast=True, progress=step)
        st.rerun()
    done = {k: v for k, v in have.items() if v is not None}
    if done:
        for crit in temperature.CRITERIA:
            dots[f"Algorithm 1 ({crit})"] = ([k * lt for k in done], [v[crit].tau for v in done.values()])
    return dots


def _prop1_note(curves: dict, stats: pd.DataFrame, sig_tr) -> None:
    """Where Prop. 1 reads above 1 or has no root, and why, beside the curve that shows it."""
    if "Prop. 1" in curves:
        p1 = curves["Prop. 1"][1]
        above = [f"{n:,}" for n, v in zip(curves["Prop. 1"][0], p1) if v is not None and v > 1]
        no_root = [f"{n:,}" for n, v in zip(curves["Prop. 1"][0], p1) if v is None]
        sigmas = ", ".join(
            f"{float(r['sigma']):.2f} at {int(r['tokens']):,}" for _, r in stats.sort_values("tokens").iterrows()
        )
        odd = " ".join(
            ([f"Prop. 1 is above 1 at {', '.join(above)} tokens."] if above else [])
            + ([f"Prop. 1 has no root (a gap in its line) at {', '.join(no_root)} tokens."] if no_root else [])
        )
        st.caption(
            (f"**{odd}** " if odd else "**About Prop. 1/2.** ")
            + "Prop. 1 and 2 rest on a Gaussian model of the logits, which holds while sigma/tau is below about 1.5. "
            f"Layer 0's sigma here: {sigmas} (L_tr: {float(sig_tr):.2f}). When layer 0's logits have a large sigma, "
            "Prop. 1 can give tau > 1 or no root; its values are drawn as computed, not clipped."
        )


def tau_curves(ctx: PageState, ref, reqs: dict, stats: pd.DataFrame) -> None:
    """tau over length: the registry's closed forms and Algorithm 1's dots (paper Fig. 3/4), with its CSV."""
    curves = _formula_curves(ctx, ref, stats)
    dots = _algorithm1_dots(ctx, reqs)
    fig = plots.temperature_curves(curves, dots, ctx.train_length)
    if "Prop. 1" in curves:
        plots.mark_above_one(fig, *curves["Prop. 1"], "Prop. 1", "its Gaussian model does not fit (the note below)")
    chart(fig, "taus")
    _prop1_note(curves, stats, ref.probes.sigma)  # right below the chart whose line it explains
    st.caption(_EQUAL_NOTE + (_CAUSAL_NOTE if ctx.loaded.decoder_only else ""))
    per_row_chart(ctx)
    with st.expander("Every method, and where this page shows it"):
        st.dataframe(method_list(ctx), hide_index=True, width="stretch")
    st.download_button(
        "tau_curves.csv",
        csv_of(lambda: tables.tau_curves_table({**curves, **dots})),
        "tau_curves.csv",
        "text/csv",
        key="dl_taus",
        on_click="ignore",
    )


def cosine(ctx: PageState, here) -> None:
    """The cos(q, k) histogram of layer 0, for cosine-attention models only."""
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
