"""The Sweep page's sections, one function each: the page (app_pages/sweep.py) only arranges them."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pandas as pd
import streamlit as st

from core.data import tasks
from core.errors import UserError
from core.experiments import csvio
from core.experiments.mlm import MASK_RATE, MIN_TOKENS, MlmPlan, run_mlm
from core.experiments.perplexity import PerplexityPlan, perplexity_table, run_perplexity
from core.experiments.sweep import COLUMNS, SweepPlan, accuracy_table, run_sweep
from core.runs import methods, timing
from core.values import positions
from core.views import plots
from ui import chart, choices, document_controls, message, pass_gate, plural, user_errors
from ui.page_state import PageState

DEPTHS = (0, 10, 25, 50, 75, 90, 100)
SWEEP_METHODS = tuple(n for n, m in methods.REGISTRY.items() if not m.takes_value)  # fixed taus: their own box
#: The tasks a sweep makes documents of: the paper's and the RULER-style ones (issue 48); pasted text and a language
#: model's sequences are not swept here (the page draws perplexity for a language model instead).
SWEEP_TASKS: tuple[str, ...] = tasks.TASKS + tasks.RULER_TASKS
METHODS_HELP = "\n\n".join(f"**{methods.label(m)}**: {methods.get(m).help}" for m in SWEEP_METHODS)


def method_text(m: str) -> str:
    """A sweep row's method as the app names it everywhere: the registry's label; a fixed tau ('tau=0.8', the CSV's
    value) as 'fixed tau = 0.8'; a method with its own number ('critical:gamma=0.2') as its label with the number."""
    m = str(m)
    if m in methods.REGISTRY:
        return methods.label(m)
    name, sep, rest = m.partition(methods.PARAM_SEP)
    if sep and name in methods.REGISTRY:
        return f"{methods.label(name)} ({rest.replace(methods.PARAM_SEP, ', ')})"
    return "fixed tau = " + m[len("tau=") :] if m.startswith("tau=") else m


def _labelled(table: pd.DataFrame) -> pd.DataFrame:
    """A method x length table with the methods by label, in the order they first appear (the plan's)."""
    return table.rename(index=method_text).rename_axis("method")


def length_options(ctx: PageState) -> tuple[list, float | None]:
    """The sweep's length choices (multiples of L_tr) and, when the sidebar's document is generated at a length that
    is not one of them, that length as a multiple too (so it can be swept); the sidebar's multiple or None."""
    lt = ctx.train_length
    if ctx.request.task not in SWEEP_TASKS or not ctx.request.tokens:
        return list(document_controls.MULTIPLES), None
    k = ctx.request.tokens / lt
    if k in document_controls.MULTIPLES:
        return list(document_controls.MULTIPLES), int(k)
    return sorted([*document_controls.MULTIPLES, k]), k


def _length_text(k, lt: int) -> str:
    return f"{k:g}× = {round(k * lt):,}" if float(k).is_integer() else f"{round(k * lt):,} (the sidebar's length)"


def _add_length(key: str, k) -> None:
    choices.set_state(**{key: sorted({*st.session_state.get(key, []), k})})


def _drop_stale_lengths(key: str, options: list) -> None:
    """Forget a length the sidebar offered before (its document's, since changed): the widget refuses unknown values."""
    kept = [k for k in st.session_state[key] if k in options]
    if kept != list(st.session_state[key]):
        choices.set_state(**{key: kept})


def lengths_note(ctx: PageState, key: str, k, what: str, own: str = "documents") -> None:
    """Say which lengths the run uses and why, and offer the sidebar's length when it is not among them."""
    ss = st.session_state
    lt = ctx.train_length
    chosen = sorted(ss[key])
    runs = ", ".join(f"{round(c * lt):,}" for c in chosen) or "none yet"
    kind = f"multiples of L_tr = {lt:,}" if all(float(c).is_integer() for c in chosen) else f"L_tr = {lt:,}"
    if ctx.request.task not in SWEEP_TASKS:
        side = f"your pasted text ({ctx.tokens:,} tokens) is not used"
    elif k is not None and k in chosen:
        side = f"the sidebar's length ({round(k * lt):,}) is among them, though not its document itself"
    else:
        side = f"the sidebar's document ({ctx.tokens:,} tokens) is not used, nor its length"
    row = st.container(horizontal=True, vertical_alignment="center")
    row.caption(
        f"{what} at the lengths chosen here, in tokens: **{runs}** ({kind}). It makes its own {own} at each "
        f"length, many per length; {side}."
    )
    if k is not None and k not in chosen:
        row.button(
            f"Add the sidebar's length ({round(k * lt):,})",
            key=f"{key}_add_sidebar",
            on_click=_add_length,
            args=(key, k),
        )


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


def controls(ctx: PageState) -> SweepPlan:
    """The grid (lengths, depths, methods, fixed taus, seeds, calibration documents) as a :class:`SweepPlan`."""
    ss = st.session_state
    lt = ctx.train_length
    task = ctx.request.task if ctx.request.task in SWEEP_TASKS else "passkey"
    if ctx.request.task == "text":
        st.info("Sweeps use generated documents; your pasted text is not swept. Using the pass key task.")
    # The default lengths reach past where tau = 1 fails on the bundled default (pass key: 57 % of 100 documents
    # right at 4x, 5 % at 8x, 0 % at 16x; docs/results.md), so the first sweep shows the failure and the fix.
    for k, v in (
        ("sw_lengths", [1, 4, 8, 16]),
        ("sw_depths", [0, 50, 100]),
        ("sw_seeds", 2),
        ("sw_methods", list(methods.SWEEP_DEFAULT)),
        ("sw_fixed", ""),
        ("sw_samples", 2),
    ):
        ss.setdefault(k, v)

    options, side = length_options(ctx)
    _drop_stale_lengths("sw_lengths", options)
    c1, c2 = st.columns(2)
    c1.multiselect(
        "Lengths (× L_tr)",
        options,
        key="sw_lengths",
        persist_state=choices.KEEP,
        format_func=lambda k: _length_text(k, lt),
    )
    c2.multiselect("Needle depths (%)", list(DEPTHS), key="sw_depths", persist_state=choices.KEEP)
    lengths_note(ctx, "sw_lengths", side, "The sweep runs")
    st.multiselect(
        "Methods",
        list(SWEEP_METHODS),
        key="sw_methods",
        persist_state=choices.KEEP,
        format_func=methods.label,
        help=METHODS_HELP,
    )
    c4, c5, c6 = st.columns(3)
    c4.text_input("Fixed taus", key="sw_fixed", persist_state=choices.KEEP, placeholder="0.8, 0.7")
    c5.number_input("Seeds", min_value=1, max_value=100, step=1, key="sw_seeds", persist_state=choices.KEEP)
    c6.number_input(
        "Calibration docs",
        min_value=1,
        max_value=16,
        step=1,
        key="sw_samples",
        persist_state=choices.KEEP,
        help="Documents per length used to calibrate Algorithm 1 / Prop. 1/2 (disjoint seeds).",
    )
    with user_errors():
        chosen = list(ss["sw_methods"]) + _fixed_taus(ss["sw_fixed"])
    plan = SweepPlan(
        model=ctx.model_ref,
        task=task,
        lengths=[round(k * lt) for k in sorted(ss["sw_lengths"])],
        depths=[d / 100 for d in sorted(ss["sw_depths"])],
        seeds=list(range(int(ss["sw_seeds"]))),
        methods=chosen,
        calib_samples=int(ss["sw_samples"]),
        haystack=ctx.request.haystack if task == ctx.request.task else "default",
        params=plan_params(ctx, chosen),
    )
    st.caption(
        f"{plural(plan.total, 'run')} of task `{task}` on {ctx.loaded.spec.name}. {documents_note(plan)} Rows "
        "are written as they finish, so a stopped sweep keeps its rows and 'Resume' runs only the rest."
    )
    return plan


def plan_params(ctx: PageState, chosen: list[str]) -> dict[str, float]:
    """The sidebar's gamma (set where its Method box holds critical scaling) for a plan's methods that take it, so
    the sweep runs the critical scaling the sidebar shows; nothing when none of them takes it (a plan refuses a
    number it would not use)."""
    return {k: v for k, v in ctx.choice.params.items() if any(methods.own_params(m, {k: v}) for m in chosen)}


def documents_note(plan: SweepPlan) -> str:
    """How many documents each length x method cell averages, and how different they really are."""
    n, keys = len(plan.seeds) * len(plan.depths), len(plan.seeds)
    note = f"Each cell averages {plural(n, 'document')} ({plural(keys, 'seed')} × {plural(len(plan.depths), 'depth')})"
    if plan.haystack == "default" and plan.task in tasks.HAYSTACK_TASKS:
        return (
            note
            + f": with the task's own filler (sidebar: Filler) a seed changes the {'key' if plan.task == 'passkey' else 'answer'} "
            "and a depth where it sits, not the text around it"
            + (" (the pass key's filler is one fixed text)" if plan.task == "passkey" else "")
            + "; held-out corpus filler gives every seed its own haystack."
        )
    return note + "."


def cost(ctx: PageState, plan: SweepPlan) -> tuple:
    """The sweep's passes timed from this machine's measured pass times, said before it starts: (key, passes s, generation s)."""
    chosen = plan.methods
    lt = ctx.train_length
    mk = timing.model_key(ctx.loaded)
    work = timing.sweep_passes(
        plan.lengths,
        len(plan.depths) * len(plan.seeds) * len(chosen),
        methods.costs(chosen, ctx.loaded.n_layers, ctx.loaded.n_heads, plan.calib_samples),
        lt,
    )
    gen = [(len(plan.depths) * len(plan.seeds) * len(chosen), n) for n in plan.lengths]
    planned, gen_s = timing.total(mk, work), timing.total(mk, gen, timing.GENERATE)
    if plan.total:
        note = timing.plan_note("The sweep", mk, work, name_all=True)
        if planned is not None:
            note += (
                f" Answer generation adds {timing.describe(gen_s)}: {timing.describe(planned + gen_s)} in all."
                if gen_s is not None
                else " Answer generation adds to this (not timed here yet)."
            )
        st.caption(note + " Calibration passes by bisection are an upper bound.")
    return mk, planned, gen_s


def _buttons(path: Path, plan, total: int, prefix: str, label: str, unit: str) -> tuple[bool, bool]:
    """Start / Resume / Stop for a run writing ``path`` (keys ``{prefix}_start`` ...): (start, resume) pressed.

    The states: Resume only while a stopped, unfinished run of this very plan
    has rows in ``path``; after a finished run Start reads 'Run again'; Stop
    only while a run is under way. A run cut short (Stop, or another click
    while it ran: Streamlit ends the script run then) still says 'running'
    in the session and counts as stopped.
    """
    ss = st.session_state
    sig = (str(path), repr(plan))
    last = ss.get(f"{prefix}_last")
    cut = last is not None and last["state"] == "running"
    if cut:
        last = ss[f"{prefix}_last"] = {**last, "state": "stopped"}
    rows = path.exists() and path.stat().st_size > 0
    mine = rows and last is not None and last["plan"] == sig
    unfinished = mine and last["state"] == "stopped"
    finished = mine and last["state"] == "finished"
    b1, b2, b3 = st.columns(3)
    start = b1.button(
        "Run again" if finished else label,
        type="secondary" if unfinished else "primary",
        key=f"{prefix}_start",
        disabled=total == 0,
        help=("Runs every row again from the start: the table below is replaced." if finished or unfinished else None),
    )
    resume = b2.button(
        "Resume",
        key=f"{prefix}_resume",
        disabled=not unfinished or total == 0,
        type="primary" if unfinished else "secondary",
        help="Runs only the rows the stopped run did not finish."
        if unfinished
        else "For a stopped run that has not finished (none now).",
    )
    running = start or resume
    b3.button(
        "Stop",
        key=f"{prefix}_stop_btn",
        on_click=_stop,
        disabled=not running,
        help=f"Stops after the current {unit}; finished rows stay.",
    )
    stopped = ss.pop("sw_stop", False)
    if ss.get(f"{prefix}_error"):
        st.error(ss.pop(f"{prefix}_error"))
    if not running and unfinished and (stopped or cut):
        st.warning(
            f"Stopped before the end; the table below holds the {unit}s' rows finished so far, and "
            "Resume runs the rest."
            if stopped
            else "The last run was cut short (a click while it ran ends it); the table below holds the rows "
            "finished so far, and Resume runs the rest."
        )
    if running:
        ss["sw_stop"] = False
        ss[f"{prefix}_last"] = {"plan": sig, "state": "running"}
    return start, resume


def _ended(prefix: str, complete: bool, err: Exception | None = None) -> None:
    """After a run: remember whether it finished (for the buttons' states), keep its error for the page, redraw."""
    ss = st.session_state
    last = ss.get(f"{prefix}_last") or {}
    ss[f"{prefix}_last"] = {**last, "state": "finished" if complete and err is None else "stopped"}
    if err is not None:
        ss[f"{prefix}_error"] = message(err)
    st.rerun()  # the buttons drawn before the run show its outcome


def run(ctx: PageState, plan: SweepPlan, mk, planned, gen_s) -> Path:
    """Start / Resume / Stop, and the sweep itself with progress and time left; the rows' CSV path."""
    path = _csv_path()
    start, resume = _buttons(path, plan, plan.total, "sw", "Start sweep", "document")
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
            df = run_sweep(
                ctx.loaded,
                plan,
                out=path,
                resume=bool(resume),
                progress=progress,
                should_stop=lambda: bool(st.session_state.get("sw_stop")),
                guard=pass_gate.gate().foreground,
            )
        except (UserError, ValueError) as err:  # ValueError: tasks.make, a length too short for the task, etc.
            bar.empty()
            _ended("sw", False, err)  # the rows finished so far are shown below, with the error above them
        bar.empty()
        _ended("sw", len(df) >= plan.total)
    return path


def results(path: Path) -> None:
    """The finished rows: the depth x length map of one method, the method x length table, the CSV."""
    ss = st.session_state
    if not path.exists() or path.stat().st_size == 0:
        st.info("No results yet: choose what to sweep and press Start.")
        st.stop()
    df = csvio.restore_frame(pd.read_csv(path, keep_default_na=False))  # cells as written, without the CSV guard
    if df.empty:
        st.info("No finished rows yet.")
        st.stop()
    df = df[[c for c in COLUMNS if c in df.columns]]

    st.subheader("Needle in a haystack: depth × length")
    st.caption(
        "Accuracy (%) of one method for each needle depth (rows) and length (columns). Failures at long "
        "lengths that concentrate at some depths show where dispersed attention loses the needle."
    )
    present = list(dict.fromkeys(df["method"].astype(str)))
    ss.setdefault("sw_heat_method", present[0])
    if ss["sw_heat_method"] not in present:
        ss["sw_heat_method"] = present[0]
    st.selectbox("Method", present, key="sw_heat_method", persist_state=choices.KEEP, format_func=method_text)
    sub = df[df["method"].astype(str) == ss["sw_heat_method"]].copy()
    sub["depth %"] = (sub["depth"].astype(float) * 100).round().astype(int)
    chart(plots.accuracy_heatmap(accuracy_table(sub, "depth %", "tokens"), y_title="needle depth %"), "sw_depth")

    st.subheader("Method × length (paper Table 4)")
    st.caption(
        "Accuracy (%) averaged over depths and seeds. The paper's finding: at 1× all methods agree; as length "
        "grows, tau = 1 falls off while aligned temperatures hold up."
    )
    table = _labelled(accuracy_table(df, "method", "tokens").reindex(present))  # the plan's order, by label
    st.dataframe(table, width="stretch")
    chart(plots.accuracy_heatmap(table, y_title="method"), "sw_method")
    st.download_button(
        "sweep.csv",
        csvio.to_csv_bytes(df),
        "sweep.csv",
        "text/csv",
        key="dl_sweep",
        on_click="ignore",
        help="The rows as the command line writes them (methods by their registry names: none, pmax, …).",
    )
    with st.expander(f"All {plural(len(df), 'row')}"):
        st.dataframe(df.assign(method=df["method"].map(method_text)), hide_index=True, width="stretch")


# -- language modelling: perplexity over length x method (the paper's Table 3) ---------------


def lm_controls(ctx: PageState) -> PerplexityPlan:
    """The perplexity grid (lengths, methods, fixed taus, sequences, calibration sequences) as a :class:`PerplexityPlan`."""
    ss = st.session_state
    lt = ctx.train_length
    for k, v in (
        ("lm_lengths", [1, 2, 4, 8]),
        ("lm_methods", [*methods.SWEEP_DEFAULT, methods.ALGORITHM1["pmax"]]),
        ("lm_fixed", ""),
        ("lm_sequences", 20),
        ("sw_samples", 2),
    ):
        ss.setdefault(k, v)
    options, side = length_options(ctx)
    _drop_stale_lengths("lm_lengths", options)
    c1, c2 = st.columns(2)
    c1.multiselect(
        "Prefix lengths (× L_tr)",
        options,
        key="lm_lengths",
        persist_state=choices.KEEP,
        format_func=lambda k: _length_text(k, lt),
    )
    c2.multiselect(
        "Methods",
        list(SWEEP_METHODS),
        key="lm_methods",
        persist_state=choices.KEEP,
        format_func=methods.label,
        help=METHODS_HELP,
    )
    lengths_note(ctx, "lm_lengths", side, "The table scores prefixes", "held-out sequences")
    c4, c5, c6 = st.columns(3)
    c4.text_input("Fixed taus", key="lm_fixed", persist_state=choices.KEEP, placeholder="0.8, 0.7")
    c5.number_input(
        "Sequences per length",
        min_value=1,
        max_value=2000,
        step=10,
        key="lm_sequences",
        persist_state=choices.KEEP,
        help="Held-out sequences (distinct seeds); the table in docs/results.md uses 200.",
    )
    c6.number_input(
        "Calibration sequences",
        min_value=1,
        max_value=16,
        step=1,
        key="sw_samples",
        persist_state=choices.KEEP,
        help="Sequences per length used to calibrate Algorithm 1 / Prop. 1/2 (seeds disjoint from the scored ones).",
    )
    with user_errors():
        chosen = list(ss["lm_methods"]) + _fixed_taus(ss["lm_fixed"])
    plan = PerplexityPlan(
        model=ctx.model_ref,
        lengths=[round(k * lt) for k in sorted(ss["lm_lengths"])],
        methods=chosen,
        sequences=int(ss["lm_sequences"]),
        calib_samples=int(ss["sw_samples"]),
        targets=tuple(ctx.choice.targets),
        params=plan_params(ctx, chosen),
    )
    st.caption(
        f"{plural(len(plan.lengths) * len(plan.methods), 'cell')} of {plural(plan.sequences, 'sequence')} on "
        f"{ctx.loaded.spec.name}: each a prefix of held-out prose, scored on the next "
        f"{plural(plan.continuation, 'token')}. Rows are written as they finish, so a stopped run keeps its "
        "rows and 'Resume' runs only the rest."
    )
    mk = timing.model_key(ctx.loaded)
    work = timing.sweep_passes(
        plan.lengths,
        plan.sequences * len(chosen),
        methods.costs(chosen, ctx.loaded.n_layers, ctx.loaded.n_heads, plan.calib_samples),
        lt,
    )
    if plan.total:
        st.caption(
            timing.plan_note("The perplexity table", mk, work, name_all=True)
            + " Calibration passes by bisection are an upper bound."
        )
    return plan


def lm_run(ctx: PageState, plan: PerplexityPlan) -> Path:
    """Start / Resume / Stop, and the perplexity runs with progress (sequences done / total); the CSV path."""
    path = _csv_path().with_name("perplexity.csv")
    start, resume = _buttons(path, plan, plan.total, "lm", "Start", "cell")
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
            df = run_perplexity(
                ctx.loaded,
                plan,
                out=path,
                resume=bool(resume),
                progress=progress,
                should_stop=lambda: bool(st.session_state.get("sw_stop")),
                guard=pass_gate.gate().foreground,
            )
        except (UserError, ValueError) as err:
            bar.empty()
            _ended("lm", False, err)  # the rows finished so far are shown below, with the error above them
        bar.empty()
        _ended("lm", len(df) >= len(plan.lengths) * len(plan.methods))  # one row per length x method
    return path


def lm_results(path: Path) -> None:
    """The finished cells: perplexity over length per method (Table 3's layout), the table, the CSV."""
    if not path.exists() or path.stat().st_size == 0:
        st.info("No results yet: choose what to sweep and press Start.")
        st.stop()
    df = csvio.restore_frame(pd.read_csv(path, keep_default_na=False))
    if df.empty:
        st.info("No finished rows yet.")
        st.stop()
    st.subheader("Perplexity over length (paper Table 3)")
    st.caption(
        "Perplexity of the continuation after a prefix of each length. The paper's finding: with tau = 1 it "
        "explodes past L_tr (attention disperses over the longer prefix); aligned temperatures bring it back."
    )
    table = _labelled(perplexity_table(df))
    chart(plots.perplexity_over_length(table, train_length=int(df["train_length"].iloc[0])), "lm_lines")
    st.dataframe(table, width="stretch")
    st.download_button(
        "perplexity.csv", csvio.to_csv_bytes(df), "perplexity.csv", "text/csv", key="dl_lm", on_click="ignore"
    )


# -- a masked-LM model (the rotary family): accuracy and perplexity of the masked tokens ------------------------


def mlm_controls(ctx: PageState) -> MlmPlan:
    """The masked-token grid (lengths, position schemes, methods, fixed taus, sequences) as a :class:`core.experiments.mlm.MlmPlan`."""
    ss = st.session_state
    lt = ctx.train_length
    for k, v in (
        ("lm_lengths", [1, 2, 4, 8]),
        ("lm_methods", [*methods.SWEEP_DEFAULT, methods.ALGORITHM1["pmax"]]),
        ("lm_fixed", ""),
        ("lm_sequences", 20),
        ("lm_schemes", [ctx.choice.scheme.spell()]),
    ):
        ss.setdefault(k, v)
    own = ctx.choice.scheme.spell()  # the sidebar's scheme with its parameters, then every scheme at its defaults
    scheme_options = [own, *(n for n in positions.AVAILABLE if n != own and positions.get(n).same_as is None)]
    ss["lm_schemes"] = [s for s in ss["lm_schemes"] if s in scheme_options]
    options, side = length_options(ctx)
    _drop_stale_lengths("lm_lengths", options)
    c1, c2 = st.columns(2)
    c1.multiselect(
        "Lengths (× L_tr)",
        options,
        key="lm_lengths",
        persist_state=choices.KEEP,
        format_func=lambda k: _length_text(k, lt),
    )
    c2.multiselect(
        "Methods",
        list(SWEEP_METHODS),
        key="lm_methods",
        persist_state=choices.KEEP,
        format_func=methods.label,
        help=METHODS_HELP,
    )
    lengths_note(ctx, "lm_lengths", side, "The table scores masked tokens", "held-out sequences")
    st.multiselect(
        "Position schemes",
        scheme_options,
        key="lm_schemes",
        format_func=lambda s: (
            positions.Scheme.of(s).entry.label + ("" if s != own or ":" not in s else f" ({s.split(':', 1)[1]})")
        ),
        help="Each scheme is a row block of the table (the sidebar's own first, with its parameters); "
        "every method runs under each (docs/positions.md).",
    )
    c4, c5 = st.columns(2)
    c4.text_input("Fixed taus", key="lm_fixed", persist_state=choices.KEEP, placeholder="0.8, 0.7")
    c5.number_input(
        "Sequences per length",
        min_value=1,
        max_value=2000,
        step=10,
        key="lm_sequences",
        persist_state=choices.KEEP,
        help=f"Held-out sequences (seeds 0, 1, …), {round(100 * MASK_RATE)} % of each one's tokens masked.",
    )
    with user_errors():
        chosen = list(ss["lm_methods"]) + _fixed_taus(ss["lm_fixed"])
        plan = MlmPlan(
            lengths=[max(MIN_TOKENS, round(k * lt)) for k in sorted(ss["lm_lengths"])],
            methods=chosen,
            sequences=int(ss["lm_sequences"]),
            cosine_scale=ctx.choice.cosine_scale,
            schemes=list(ss["lm_schemes"]) or [positions.PLAIN],
        ).validated()
    st.caption(
        f"{plural(len(plan.lengths) * len(plan.methods) * len(plan.schemes), 'cell')} of {plural(plan.sequences, 'sequence')} on "
        f"{ctx.loaded.spec.name}: each held-out sequence with {round(100 * MASK_RATE)} % of its tokens masked "
        "(positions by seed), the masked tokens scored: accuracy and perplexity (the InfoScale paper's Table 1 "
        "metrics; `python -m core mlm` gives the same rows)."
    )
    return plan


def mlm_run(ctx: PageState, plan: MlmPlan) -> Path:
    """Start, and the masked-token runs with progress (sequences done / total); the CSV path."""
    path = _csv_path().with_name("mlm.csv")
    if st.button("Start", type="primary", key="mlm_start", disabled=not plan.lengths or not plan.methods):
        bar = st.progress(0.0, text="starting…")
        t0 = time.perf_counter()

        def progress(done: int, total: int) -> None:
            left = timing.remaining_weighted(time.perf_counter() - t0, done, total - done) if done else None
            bar.progress(
                done / max(1, total),
                text=f"{done}/{total} sequences" + (f" · {timing.describe(left)} left" if left is not None else ""),
            )

        with user_errors(bar):
            rows = run_mlm(ctx.loaded, plan, progress=progress)
        bar.empty()
        path.write_bytes(csvio.to_csv_bytes(pd.DataFrame(rows)))
    return path


def mlm_results(path: Path) -> None:
    """The finished cells: perplexity over length per method, accuracy and perplexity tables, the CSV."""
    if not path.exists() or path.stat().st_size == 0:
        st.info("No results yet: choose what to sweep and press Start.")
        return
    df = csvio.restore_frame(pd.read_csv(path, keep_default_na=False))
    if df.empty:
        st.info("No finished rows yet.")
        return
    if "scheme" in df and df["scheme"].nunique() > 1:  # one row per scheme and method, the paper's Table 1 layout
        df["method"] = [f"{method_text(m)} · {positions.get(s).label}" for m, s in zip(df["method"], df["scheme"])]
    st.subheader("Masked tokens over length (InfoScale paper, Table 1)")
    st.caption(
        "Perplexity and accuracy of the masked tokens at each length. With tau = 1 a rotary model trained at "
        "L_tr degrades past it; the paper's InfoScale and CosScale are meant to hold it."
    )
    table = _labelled(perplexity_table(df))
    chart(plots.perplexity_over_length(table, train_length=int(df["train_length"].iloc[0])), "mlm_lines")
    acc = df.copy()
    acc["accuracy"] = pd.to_numeric(acc["accuracy"])
    accuracy = _labelled(
        acc.pivot_table(index="method", columns="tokens", values="accuracy", aggfunc="mean")
        .reindex(list(dict.fromkeys(acc["method"])))
        .round(4)
    )
    c1, c2 = st.columns(2)
    c1.markdown("**Perplexity**")
    c1.dataframe(table, width="stretch")
    c2.markdown("**Accuracy**")
    c2.dataframe(accuracy, width="stretch")
    st.download_button("mlm.csv", csvio.to_csv_bytes(df), "mlm.csv", "text/csv", key="dl_mlm", on_click="ignore")
