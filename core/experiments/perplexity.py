"""Language-modelling perplexity over lengths x methods: the paper's Table 3, for any LM-adapted T5.

The encoder reads a prefix of ``L_ex`` tokens of held-out prose, the decoder
is scored on the ``continuation`` tokens that follow (teacher-forced:
:func:`core.runs.engine.run_encoded` sums their -log p for documents of task
``"lm"``). A cell (one length, one method) is ``sequences`` distinct
sequences, seeds ``seed .. seed + sequences - 1`` (:mod:`core.data.tasks.lm`:
each seed is its own shuffle of the held-out pool, and the same seed asks for
the same continuation at every length), and its perplexity is
``exp(sum of -log p / tokens scored)`` over all of them (the corpus-level
perplexity language-modelling papers report, not a mean of per-sequence
perplexities, which one bad sequence would dominate).

Methods come from :mod:`core.runs.methods`, resolved once per length exactly as a
retrieval sweep does (:func:`core.experiments.sweep.resolve_for`): measured methods
(Algorithm 1, Prop. 1/2, per-layer) calibrate on sequences whose seeds
(``calib_seed`` on) are disjoint from the scored ones. A search's row says,
as a sweep row does, whether its curve ``reached`` the L_tr reference and the
``gap`` left (empty for methods that are not searches).

Sequences with and without an earlier copy are scored apart when asked
(``copies``, the ``copy`` column): the paper's effect lives in the copy,
since a model can only lose by dispersion what it reads from far back
(docs/models.md, "A language model for Table 3"). ``"with"`` is the first
``sequences`` seeds from ``seed`` on whose sequence at this length holds a copy
of its continuation (:mod:`core.data.tasks.lm`, ``repeat=1``); ``"without"`` is the
*same* seeds with no copy (``repeat=0``: the same continuation after the same
kind of past, paired seed by seed, so the two rows differ only in the copy);
``"mixed"`` (the default) is seeds ``seed ..`` as held out, about half with a
copy. A row's ``first_seed`` and ``last_seed`` bound the seeds it scored.

Rows are written as they finish to a CSV through :class:`core.experiments.csvio.ResultCSV`
(lock, ``resume``, spreadsheet-safe cells), one row per length x method. A
method's own number (critical scaling's gamma, ``params``) goes to the methods
that take it and is named in their rows' ``method`` (``critical:gamma=0.2``), as
in a retrieval sweep, so a resumed table at another gamma runs its own rows.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from core.data import tasks
from core.data.tasks.lm import COPY_KINDS, COPY_MIXED, COPY_ROOM, COPY_WITH, COPY_WITHOUT  # the kinds: the CLI's too
from core.errors import UserError
from core.experiments import csvio
from core.experiments.sweep import resolve_for, typed_rows  # a method at a length, resumed rows: as retrieval sweeps do
from core.kinds import ENCODER
from core.mechanics.probes import ProbeSpec
from core.mechanics.run_pass import Pass
from core.models import Loaded
from core.runs import engine, methods
from core.runs.methods import method_label
from core.values.choice import Choice
from core.values.validation import NewTokens, held_out_plan

COLUMNS = [
    "model",
    "task",
    "tokens",
    "actual_tokens",
    "train_length",
    "method",
    "copy",
    "tau",
    "perplexity",
    "nll",
    "scored_tokens",
    "sequences",
    "first_seed",
    "last_seed",
    "seconds",
    "reached",
    "gap",
]
KEY = ("model", "tokens", "method", "copy")
#: The ``copy`` field of ``perplexity --json`` rows: null (mixed), true, false.
COPY_JSON = {COPY_MIXED: None, COPY_WITH: True, COPY_WITHOUT: False}
#: Seeds searched per sequence asked for with a copy (about 3 in 4 held-out seeds have one from ~110 tokens on).
COPY_SEARCH = 4


@dataclass
class PerplexityPlan:
    """What to measure: prefix ``lengths`` x ``methods``, ``sequences`` held-out sequences per cell."""

    model: str
    lengths: list[int]
    methods: list[str]
    sequences: int = 200
    seed: int = 0
    calib_seed: int = 100_000
    calib_samples: int = 4
    continuation: int = tasks.CONTINUATION
    batch_size: int = 8
    targets: tuple[str, ...] = (ENCODER,)
    haystack: str = "corpus-eval"
    task: str = tasks.LM  # what core.experiments.sweep.resolve_for builds calibration documents of
    copies: tuple[str, ...] = (COPY_MIXED,)  # COPY_KINDS: which sequences each length x method scores
    #: the value of a method's :class:`core.runs.methods.Param` by name (``{"gamma": 0.2}``), for the methods that take it
    params: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Sequences to run in all (the progress unit: a 16x cell is many times a 1x one)."""
        return len(self.lengths) * len(self.methods) * self.sequences * len(self.copies)

    def validated(self) -> PerplexityPlan:
        """This plan with methods as labels and every bound checked, or a :class:`UserError` naming the option."""
        bad = [c for c in self.copies if c not in COPY_KINDS]
        if bad or not self.copies:
            raise UserError(
                f"Bad perplexity option: copies wants some of {', '.join(COPY_KINDS)}, got {list(self.copies)!r}"
            )
        plan = held_out_plan(self, "Bad perplexity option", method_label, continuation=NewTokens)
        plan = replace(
            plan,
            copies=tuple(dict.fromkeys(self.copies)),
            params=methods.check_params(self.params, plan.methods, "Bad perplexity option"),
        )
        last = plan.seed + COPY_SEARCH * plan.sequences
        if (
            set(plan.copies) - {COPY_MIXED}
            and plan.seed < plan.calib_seed + plan.calib_samples
            and plan.calib_seed < last
        ):
            raise UserError(
                f"Bad perplexity option: calibration seeds {plan.calib_seed}.. overlap the seeds searched for "
                f"sequences with a copy ({plan.seed}..{last - 1}); no method may be tuned on what it is scored on"
            )
        return plan


def sequences(loaded: Loaded, tokens: int, plan: PerplexityPlan, copy: str = COPY_MIXED) -> list[tasks.Document]:
    """The cell's held-out sequences at ``tokens``: seeds ``plan.seed`` on, all of them (``copy`` mixed), or
    the first ``plan.sequences`` with an earlier copy, with it (``"with"``) or without it (``"without"``);
    a :class:`UserError` when too few seeds have a copy at this length (a prefix too short to hold one)."""

    def make(seed: int, **kw) -> tasks.Document:
        return tasks.make(
            tasks.LM, loaded.tokenizer, tokens, seed=seed, haystack=plan.haystack, continuation=plan.continuation, **kw
        )

    if copy == COPY_MIXED:
        return [make(plan.seed + i) for i in range(plan.sequences)]
    found: list[tasks.Document] = []
    for seed in range(plan.seed, plan.seed + COPY_SEARCH * plan.sequences):
        d = make(seed, repeat=1.0)
        if d.meta["repeat"]:
            found.append(d)
            if len(found) == plan.sequences:
                break
    else:
        raise UserError(
            f"only {len(found)} of seeds {plan.seed}..{plan.seed + COPY_SEARCH * plan.sequences - 1} hold an "
            f"earlier copy at {tokens} tokens, fewer than the {plan.sequences} sequences asked for "
            f"(a copy needs about {COPY_ROOM + 8} prefix tokens)"
        )
    return found if copy == COPY_WITH else [make(d.seed, repeat=0.0) for d in found]


def score(
    loaded: Loaded,
    docs: list[tasks.Document],
    choice: Choice,
    batch_size: int = 8,
    encoded: list[engine.Encoded] | None = None,
    step: Callable[[int], None] | None = None,
) -> dict:
    """Perplexity of ``docs`` under ``choice`` (no probes, no generation: the teacher-forced continuation only):
    ``{"perplexity", "nll", "scored_tokens", "actual_tokens", "seconds"}``.

    ``nll`` is the summed -log p over every scored token; perplexity is
    ``exp(nll / scored_tokens)``. ``step(k)`` is called after each batch of
    ``k`` sequences (progress)."""
    how = Pass(generate=False, probes=ProbeSpec.off())
    encs = encoded or [engine.encode(loaded, d) for d in docs]
    t0 = time.perf_counter()
    nll, count = 0.0, 0
    for b in range(0, len(docs), batch_size):
        for r in engine.run_encoded(loaded, docs[b : b + batch_size], encs[b : b + batch_size], choice, how):
            nll += r.nll
            count += r.scored_tokens
        if step:
            step(len(docs[b : b + batch_size]))
    if not count:
        raise UserError("no continuation tokens were scored")
    return {
        "perplexity": math.exp(nll / count),
        "nll": nll,
        "scored_tokens": count,
        "actual_tokens": int(round(np.mean([e.n for e in encs]))),
        "seconds": time.perf_counter() - t0,
    }


def run_perplexity(
    loaded: Loaded,
    plan: PerplexityPlan,
    out: str | Path | None = None,
    resume: bool = False,
    progress: Callable[[int, int, dict | None], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    guard: Callable[[], ContextManager] = contextlib.nullcontext,
) -> pd.DataFrame:
    """Run the plan; append one row per length x method to ``out`` (CSV) as it finishes; return the table.

    ``progress(done, total, row)`` counts sequences (called after each batch,
    ``row`` set when a cell ends); ``should_stop()`` is polled between cells;
    ``guard()`` wraps each cell's passes (the app's pass gate)."""

    plan = plan.validated()
    if plan.lengths and plan.methods:
        engine.check_length(loaded, max(plan.lengths), plan.batch_size)
    path = Path(out) if out else None
    with csvio.ResultCSV(path, COLUMNS, "perplexity", resume=resume) as sink:
        done_keys = {
            (r["model"], str(int(float(r["tokens"]))), r["method"], r.get("copy") or COPY_MIXED) for r in sink.rows
        }
        rows: list[dict] = typed_rows(path) if sink.rows else []
        taus: dict = {}
        done = 0
        if progress:
            progress(0, plan.total, None)
        for n, copy in ((n, c) for n in plan.lengths for c in plan.copies):
            todo = [
                m
                for m in plan.methods
                if (plan.model, str(n), methods.cell_text(m, plan.params), copy) not in done_keys
            ]
            done += (len(plan.methods) - len(todo)) * plan.sequences
            if not todo:
                continue
            docs = sequences(loaded, n, plan, copy)
            encs = [engine.encode(loaded, d) for d in docs]
            for m in todo:
                if should_stop and should_stop():
                    return pd.DataFrame(rows, columns=COLUMNS)

                def step(k: int) -> None:
                    nonlocal done
                    done += k
                    if progress:
                        progress(done, plan.total, None)

                with guard():
                    tau, outcome = resolve_for(loaded, plan, n, m, docs[0], taus)
                    cell = score(
                        loaded, docs, Choice.of(tau=tau, method=m, targets=plan.targets), plan.batch_size, encs, step
                    )
                row = {
                    "model": plan.model,
                    "task": tasks.LM,
                    "tokens": n,
                    "actual_tokens": cell["actual_tokens"],
                    "train_length": loaded.train_length,
                    "method": methods.cell_text(m, plan.params),
                    "copy": copy,
                    "tau": round(tau.mean(n), 6),
                    "perplexity": round(cell["perplexity"], 4),
                    "nll": round(cell["nll"], 4),
                    "scored_tokens": cell["scored_tokens"],
                    "sequences": len(docs),
                    "first_seed": docs[0].seed,
                    "last_seed": docs[-1].seed,
                    "seconds": round(cell["seconds"], 3),
                    **outcome,
                }
                rows.append(row)
                sink.write(row)
                if progress:
                    progress(done, plan.total, row)
    return pd.DataFrame(rows, columns=COLUMNS)


def perplexity_table(df: pd.DataFrame, rows: str = "method", cols: str = "tokens") -> pd.DataFrame:
    """Perplexity pivot, method x length: the layout of the paper's Table 3. Rows of more than one kind of
    sequence (the ``copy`` column) are indexed by (copy, method), never averaged together."""
    d = df.copy()
    d["perplexity"] = pd.to_numeric(d["perplexity"])
    index: str | list[str] = rows
    if "copy" in d and d["copy"].nunique() > 1 and rows != "copy":
        index = ["copy", rows]
    table = d.pivot_table(index=index, columns=cols, values="perplexity", aggfunc="mean").round(2)
    order = list(dict.fromkeys(zip(d["copy"], d[rows]) if isinstance(index, list) else d[rows]))
    return table.reindex(order)  # the plan's order, not the alphabet's


def summary(loaded: Loaded, df: pd.DataFrame) -> dict:
    """The CLI's ``perplexity --json`` object (a stable contract): the model, L_tr and the rows; each row's
    ``copy`` says which sequences it scored (true: with an earlier copy, false: the same seeds without, null:
    the held-out mix)."""
    keep = [
        "tokens",
        "actual_tokens",
        "train_length",
        "method",
        "tau",
        "perplexity",
        "nll",
        "scored_tokens",
        "sequences",
        "first_seed",
        "last_seed",
        "seconds",
        "reached",
        "gap",
    ]
    out = []
    for r in df.to_dict("records"):
        row = {k: (r[k].item() if hasattr(r[k], "item") else r[k]) for k in keep}
        row["copy"] = COPY_JSON[r.get("copy") or COPY_MIXED]  # true / false; null: the held-out mix
        out.append(row)
    return {"model": loaded.spec.name, "train_length": loaded.train_length, "rows": out}
