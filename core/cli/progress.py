"""What a long command shows on stderr while it works, and what it asks between two layers of a pass.

Why: a calibration or a search at a long length is minutes of passes between two steps of its bar (issue 47 point 4
saw 180 s without a word); each phase gets a bar that says how many layers it has run, and every attention call
first asks the command's ``--max-seconds`` budget, so an overrun stops at the next layer. Before any work starts,
:func:`refuse_over_budget` refuses work whose estimate is already over that budget.
"""

from __future__ import annotations

import sys

from core.runs import methods, timing

#: Seconds between two redraws of a bar's count of layers run (:func:`layers_ticker`).
TICK_S = 0.5


def progress(desc: str, leave: bool = False):
    """A bar on stderr from 0 to 1 (``update(frac)``), with ``.close`` and the tqdm ``.bar`` beside it."""
    from tqdm import tqdm

    bar = tqdm(total=100, desc=desc, file=sys.stderr, leave=leave, bar_format="{l_bar}{bar}| {elapsed}{postfix}")

    def update(frac: float) -> None:
        bar.n = int(round(100 * frac))
        bar.refresh()

    update.close = bar.close  # type: ignore[attr-defined]
    update.bar = bar  # type: ignore[attr-defined]
    return update


def layers_ticker(prog, budget):
    """What runs before every attention call of a phase (:func:`core.mechanics.attention.between_layers`): the
    command's ``--max-seconds`` check, and a count of the layers run so far on ``prog``'s bar, redrawn at most
    every :data:`TICK_S` s, so a long phase shows that it moves between two steps of its bar."""
    import time

    bar = prog.bar
    state = {"layers": 0, "shown": 0.0}

    def tick() -> None:
        budget.check()
        state["layers"] += 1
        now = time.monotonic()
        if now - state["shown"] >= TICK_S:
            state["shown"] = now
            bar.set_postfix_str(f"{state['layers']:,} layers run", refresh=True)

    return tick


def refuse_over_budget(budget, loaded, doc, enc, choice, measured: list[str], samples: int, what: str) -> float:
    """Refuse (one line, exit 2) work whose estimate is over ``--max-seconds``: the pass over the document
    (:func:`core.runs.engine.estimate_pass`: a + b n + c n^2 from two short passes and one attention call timed here)
    plus the passes the ``measured`` methods run to resolve (:func:`core.runs.methods.costs`, upper bounds), each
    scaled from the same timing. Returns the pass's estimate (seconds)."""
    from core.mechanics import attention
    from core.runs import engine

    with attention.between_layers(None):  # the timed samples are not what the budget stops; what they took counts
        per = engine.estimate_pass(loaded, doc, enc, choice)
    passes = (
        timing.sweep_passes(
            [enc.n], 1, methods.costs(measured, loaded.n_layers, loaded.n_heads, samples), loaded.train_length
        )
        if measured
        else [(1, enc.n)]
    )
    seconds = sum(count * per * (tokens / enc.n) ** 2 for count, tokens in passes)
    n_passes = sum(count for count, _ in passes)
    budget.refuse(seconds, f"{what} ({n_passes:,} pass{'es' if n_passes != 1 else ''} of up to {enc.n:,} tokens)")
    return per
