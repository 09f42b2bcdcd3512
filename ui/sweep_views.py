"""The Sweep page's sections, one function each: the page (pages/sweep.py) only arranges them."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pandas as pd
import streamlit as st

from core import csvio, methods, plots, tasks, temperature, timing
from core.errors import UserError
from core.perplexity import PerplexityPlan, perplexity_table, run_perplexity
from core.sweep import COLUMNS, SweepPlan, accuracy_table, run_sweep
from ui import chart, user_errors
from ui import cache
from ui import sidebar as sb

DEPTHS = (0, 10, 25, 50, 75, 90, 100)
SWEEP_METHODS = tuple(m for m in methods.NAMES if m != "fixed")


def _stop() -> None:
    st.session_state["sw_stop"] = True


def _csv_path() -> Path:
    ss = st.session_state
    if not ss.get("sw_csv"):
        # A folder of its own, not mkstemp: mkstemp's open descriptor leaked once per visit.
        ss["sw_csv"] = str(Path(tempfile.mkdtemp(prefix="aae-sweep-")) / "sweep.csv")
    return Path(ss["sw_csv"])


def _fixed_taus(text: str) -> list[str]:
    out = []
    for part in (text or "").replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = float(part)
        except ValueError:
            raise UserError(f"'{part}' is not a number: list fixed taus like 0.8, 0.7") from None
        if not 0 < v <= 2:
            raise UserError(f"fixed tau {v} is outside (0, 2]")
        out.append(f"{v:g}")
    return out


def controls(ctx: sb.Context) -> SweepPlan:
    """The grid (lengths, depths, methods, fixed taus, seeds, calibration documents) as a :class:`SweepPlan`."""
    ss = st.session_state
    lt = ctx.train_length
    task = ctx.request.task if ctx.request.task in tasks.TASKS else "passkey"
    if ctx.request.task == "text":
        st.info("Sweeps use generated documents; your pasted text is not swept. Using the pass key task.")
    for k, v in (("sw_lengths", [1, 2, 4]), ("sw_depths", [0, 50, 100]), ("sw_seeds", 2),
                 ("sw_methods", ["none", "log-length"]), ("sw_fixed", ""), ("sw_samples", 2)):
        ss.setdefault(k, v)

    c1, c2 = st.columns(2)
    c1.multiselect("Lengths (× L_tr)", list(sb.MULTIPLES), key="sw_lengths", format_func=lambda k: f"{k}× = {k * lt:,}")
    c2.multiselect("Needle depths (%)", list(DEPTHS), key="sw_depths")
    st.multiselect("Methods", list(SWEEP_METHODS), key="sw_methods", format_func=lambda m: methods.get(m).short,
                   help="; ".join(f"{methods.get(m).short}: {methods.get(m).help}" for m in SWEEP_METHODS))
    c4, c5, c6 = st.columns(3)
    c4.text_input("Fixed taus", key="sw_fixed", placeholder="0.8, 0.7")
    c5.number_input("Seeds", min_value=1, max_value=100, step=1, key="sw_seeds")
    c6.number_input("Calibration docs", min_value=1, max_value=16, step=1, key="sw_samples",
                    help="Documents per length used to calibrate Algorithm 1 / Prop. 1/2 (disjoint seeds).")
    with user_errors():
        chosen = list(ss["sw_methods"]) + _fixed_taus(ss["sw_fixed"])
    plan = SweepPlan(
        model=ctx.model_ref, task=task, lengths=[k * lt for k in sorted(ss["sw_lengths"])],
        depths=[d / 100 for d in sorted(ss["sw_depths"])], seeds=list(range(int(ss["sw_seeds"]))), methods=chosen,
        calib_samples=int(ss["sw_samples"]), haystack=ctx.request.haystack if task == ctx.request.task else "default",
    )
    st.caption(f"{plan.total} runs of task `{task}` on {ctx.loaded.spec.name}. {documents_note(plan)} Rows are written "
               "as they finish, so a stopped sweep keeps its rows and 'Resume' skips them.")
    return plan


def documents_note(plan: SweepPlan) -> str:
    """How many documents each length x method cell averages, and how different they really are."""
    n, keys = len(plan.seeds) * len(plan.depths), len(plan.seeds)
    note = f"Each cell averages {n} documents ({keys} seeds × {len(plan.depths)} depths)"
    if plan.haystack == "default" and plan.task in tasks.HAYSTACK_TASKS:
        return (note + f": with the task's own filler (sidebar: Filler) a seed changes the {'key' if plan.task == 'passkey' else 'answer'} "
                "and a depth where it sits, not the text around it" + (" (the pass key's filler is one fixed text)"
                if plan.task == "passkey" else "") + "; held-out corpus filler gives every seed its own haystack.")
    return note + "."


def cost(ctx: sb.Context, plan: SweepPlan) -> tuple:
    """The sweep's passes timed from this machine's measured pass times, said before it starts: (key, passes s, generation s)."""
    chosen = plan.methods
    lt = ctx.train_length
    mk = timing.model_key(ctx.loaded)
    work = timing.sweep_passes(plan.lengths, len(plan.depths) * len(plan.seeds) * len(chosen),
                               [m for m in chosen if m in methods.MEASURED], plan.calib_samples, lt,
                               ctx.loaded.n_layers, len(temperature.GRID))
    gen = [(len(plan.depths) * len(plan.seeds) * len(chosen), n) for n in plan.lengths]
    planned, gen_s = timing.total(mk, work), timing.total(mk, gen, timing.GENERATE)
    if plan.total:
        note = timing.plan_note("The sweep", mk, work, name_all=True)
        if planned is not None:
            note += (f" Answer generation adds {timing.describe(gen_s)}: {timing.describe(planned + gen_s)} in all."
                     if gen_s is not None else " Answer generation adds to this (not timed here yet).")
        st.caption(note + " Calibration passes by bisection are an upper bound.")
    return mk, planned, gen_s


def _buttons(path: Path, total: int, prefix: str, label: str, unit: str) -> tuple[bool, bool]:
    """Start / Resume / Stop for a run writing ``path`` (keys ``{prefix}_start`` ...): (start, resume) pressed.
    A stop requested by the last run is reported; a start clears it."""
    ss = st.session_state
    b1, b2, b3 = st.columns(3)
    start = b1.button(label, type="primary", key=f"{prefix}_start", disabled=total == 0)
    resume = b2.button("Resume", key=f"{prefix}_resume", disabled=not path.exists() or total == 0)
    b3.button("Stop", key=f"{prefix}_stop_btn", on_click=_stop, help=f"Stops after the current {unit}; finished rows stay.")
    if ss.pop("sw_stop", False) and not (start or resume):
        st.warning(f"Stopped; the table below holds the {unit}s' rows finished so far.")
    if start or resume:
        ss["sw_stop"] = False
    return start, resume


def run(ctx: sb.Context, plan: SweepPlan, mk, planned, gen_s) -> Path:
    """Start / Resume / Stop, and the sweep itself with progress and time left; the rows' CSV path."""
    path = _csv_path()
    start, resume = _buttons(path, plan.total, "sw", "Start sweep", "document")
    if start or resume:
        full = None if planned is None or gen_s is None else planned + gen_s
        bar = st.progress(0.0, text="starting…" + ("" if full is None else f" ({timing.describe(full)} planned)"))
        # Time left: the time so far, scaled by the planned cost of the rows left over that of the rows run
        # (a row at 4x L_tr costs more than one at 1x), so the load of the machine right now is taken into account.
        weights = [timing.estimate(mk, n) or float(n) ** 2 for n, *_ in plan.cells()]
        t0, ran = time.perf_counter(), [0.0]

        def progress(done: int, total: int, row: dict | None) -> None:
            msg = f"{done}/{total}"
            if row:
                msg += f" · {row['tokens']} tokens, depth {row['depth']:g}, {row['method']}: {row['answer']!r}"
                ran[0] += weights[done - 1]  # rows skipped on resume (row None) do not count
                left = timing.remaining_weighted(time.perf_counter() - t0, ran[0], sum(weights[done:]))
                msg += f" · {timing.describe(left)} left"
            bar.progress(done / max(1, total), text=msg)

        try:
            run_sweep(ctx.loaded, plan, out=path, resume=bool(resume), progress=progress,
                      should_stop=lambda: bool(st.session_state.get("sw_stop")), guard=cache.gate().foreground)
        except (UserError, ValueError) as err:  # ValueError: tasks.make, a length too short for the task, etc.
            st.error(str(err))  # no st.stop: the rows finished so far are shown below
        bar.empty()
    return path


def results(path: Path) -> None:
    """The finished rows: the depth x length map of one method, the method x length table, the CSV."""
    ss = st.session_state
    if not path.exists() or path.stat().st_size == 0:
        st.info("No results yet: choose the grid and press Start.")
        st.stop()
    df = csvio.restore_frame(pd.read_csv(path, keep_default_na=False))  # cells as written, without the CSV guard
    if df.empty:
        st.info("No finished rows yet.")
        st.stop()
    df = df[[c for c in COLUMNS if c in df.columns]]

    st.subheader("Needle in a haystack: depth × length")
    st.caption("Accuracy (%) of one method for each needle depth (rows) and length (columns). Failures at long "
               "lengths that concentrate at some depths show where dispersed attention loses the needle.")
    present = list(dict.fromkeys(df["method"].astype(str)))
    ss.setdefault("sw_heat_method", present[0])
    if ss["sw_heat_method"] not in present:
        ss["sw_heat_method"] = present[0]
    st.selectbox("Method", present, key="sw_heat_method")
    sub = df[df["method"].astype(str) == ss["sw_heat_method"]].copy()
    sub["depth %"] = (sub["depth"].astype(float) * 100).round().astype(int)
    chart(plots.accuracy_heatmap(accuracy_table(sub, "depth %", "tokens"), y_title="needle depth %"), "sw_depth")

    st.subheader("Method × length (paper Table 4)")
    st.caption("Accuracy (%) averaged over depths and seeds. The paper's finding: at 1× all methods agree; as length "
               "grows, tau = 1 falls off while aligned temperatures hold up.")
    table = accuracy_table(df, "method", "tokens")
    st.dataframe(table, width="stretch")
    chart(plots.accuracy_heatmap(table, y_title="method"), "sw_method")
    st.download_button("sweep.csv", csvio.to_csv_bytes(df), "sweep.csv", "text/csv", key="dl_sweep", on_click="ignore")
    with st.expander(f"All {len(df)} rows"):
        st.dataframe(df, hide_index=True, width="stretch")


# -- language modelling: perplexity over length x method (the paper's Table 3) ---------------

def lm_controls(ctx: sb.Context) -> PerplexityPlan:
    """The perplexity grid (lengths, methods, fixed taus, sequences, calibration sequences) as a :class:`PerplexityPlan`."""
    ss = st.session_state
    lt = ctx.train_length
    for k, v in (("lm_lengths", [1, 2, 4, 8]), ("lm_methods", ["none", "log-length", "pmax"]), ("lm_fixed", ""),
                 ("lm_sequences", 20), ("sw_samples", 2)):
        ss.setdefault(k, v)
    c1, c2 = st.columns(2)
    c1.multiselect("Prefix lengths (× L_tr)", list(sb.MULTIPLES), key="lm_lengths",
                   format_func=lambda k: f"{k}× = {k * lt:,}")
    c2.multiselect("Methods", list(SWEEP_METHODS), key="lm_methods", format_func=lambda m: methods.get(m).short,
                   help="; ".join(f"{methods.get(m).short}: {methods.get(m).help}" for m in SWEEP_METHODS))
    c4, c5, c6 = st.columns(3)
    c4.text_input("Fixed taus", key="lm_fixed", placeholder="0.8, 0.7")
    c5.number_input("Sequences per length", min_value=1, max_value=2000, step=10, key="lm_sequences",
                    help="Held-out sequences (distinct seeds); the table in docs/results.md uses 200.")
    c6.number_input("Calibration sequences", min_value=1, max_value=16, step=1, key="sw_samples",
                    help="Sequences per length used to calibrate Algorithm 1 / Prop. 1/2 (seeds disjoint from the scored ones).")
    with user_errors():
        chosen = list(ss["lm_methods"]) + _fixed_taus(ss["lm_fixed"])
    plan = PerplexityPlan(model=ctx.model_ref, lengths=[k * lt for k in sorted(ss["lm_lengths"])], methods=chosen,
                          sequences=int(ss["lm_sequences"]), calib_samples=int(ss["sw_samples"]),
                          targets=tuple(ctx.targets))
    st.caption(f"{len(plan.lengths) * len(plan.methods)} cells of {plan.sequences} sequences on "
               f"{ctx.loaded.spec.name}: each a prefix of held-out prose, scored on the next {plan.continuation} "
               "tokens. Rows are written as they finish, so a stopped run keeps its rows and 'Resume' skips them.")
    mk = timing.model_key(ctx.loaded)
    work = timing.sweep_passes(plan.lengths, plan.sequences * len(chosen), [m for m in chosen if m in methods.MEASURED],
                               plan.calib_samples, lt, ctx.loaded.n_layers, len(temperature.GRID))
    if plan.total:
        st.caption(timing.plan_note("The perplexity table", mk, work, name_all=True)
                   + " Calibration passes by bisection are an upper bound.")
    return plan


def lm_run(ctx: sb.Context, plan: PerplexityPlan) -> Path:
    """Start / Resume / Stop, and the perplexity runs with progress (sequences done / total); the CSV path."""
    path = _csv_path().with_name("perplexity.csv")
    start, resume = _buttons(path, plan.total, "lm", "Start", "cell")
    if start or resume:
        bar = st.progress(0.0, text="starting…")
        t0 = time.perf_counter()

        def progress(done: int, total: int, row: dict | None) -> None:
            left = timing.remaining_weighted(time.perf_counter() - t0, done, total - done) if done else None
            msg = f"{done}/{total} sequences" + (f" · {timing.describe(left)} left" if left is not None else "")
            if row:
                msg += f" · {row['tokens']} tokens, {row['method']}: perplexity {row['perplexity']:.1f}"
            bar.progress(done / max(1, total), text=msg)

        try:
            run_perplexity(ctx.loaded, plan, out=path, resume=bool(resume), progress=progress,
                           should_stop=lambda: bool(st.session_state.get("sw_stop")), guard=cache.gate().foreground)
        except (UserError, ValueError) as err:
            st.error(str(err))  # no st.stop: the rows finished so far are shown below
        bar.empty()
    return path


def lm_results(path: Path) -> None:
    """The finished cells: perplexity over length per method (Table 3's layout), the table, the CSV."""
    if not path.exists() or path.stat().st_size == 0:
        st.info("No results yet: choose the grid and press Start.")
        st.stop()
    df = csvio.restore_frame(pd.read_csv(path, keep_default_na=False))
    if df.empty:
        st.info("No finished rows yet.")
        st.stop()
    st.subheader("Perplexity over length (paper Table 3)")
    st.caption("Perplexity of the continuation after a prefix of each length. The paper's finding: with tau = 1 it "
               "explodes past L_tr (attention disperses over the longer prefix); aligned temperatures bring it back.")
    table = perplexity_table(df)
    chart(plots.perplexity_over_length(table, train_length=int(df["train_length"].iloc[0])), "lm_lines")
    st.dataframe(table, width="stretch")
    st.download_button("perplexity.csv", csvio.to_csv_bytes(df), "perplexity.csv", "text/csv", key="dl_lm",
                       on_click="ignore")
