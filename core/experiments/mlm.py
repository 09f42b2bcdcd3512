"""Masked-token evaluation of a rotary masked-LM encoder: the InfoScale paper's accuracy and perplexity.

Li et al. (2025, Section 4 and Appendix A.3) train a bidirectional RoPE
encoder with masked-token prediction at L_tr = 64 tokens (15 % of the tokens
masked) and report, at 1x ... 64x L_tr, the accuracy of the masked tokens'
predictions and the perplexity exp(cross-entropy) over them. This module
measures the same on a loaded ``"rope"`` model (:mod:`core.models`):

- a sequence of seed ``s`` at ``tokens`` tokens is the held-out prose of
  :func:`core.data.tasks.make` ``("lm", ...)`` (specials included in the count, as
  every document is counted), so the texts are the ones perplexity tables
  use and never the training pool;
- its masked positions are drawn by seed from the tokens that are not special
  (``[CLS]``/``</s>``, padding and the mask token itself are never masked):
  ``round(rate x candidates)`` of them, at least one, each replaced by the
  mask token (no 80/10/10 at evaluation: every masked token is one to predict);
- one forward pass per batch of sequences under one
  :class:`~core.values.choice.Choice` (tau, CosScale s, position scheme), no probes, so
  the attention takes its fastest backend (output only: core.mechanics.softmax_block);
- a cell's accuracy is correct / masked and its perplexity
  ``exp(sum of -log p(true token) / masked)`` over every masked position of
  every sequence (corpus-level, as :mod:`core.experiments.perplexity` reports: a mean of
  per-sequence perplexities would let one bad sequence dominate).

Position schemes (:mod:`core.values.positions`, the second axis beside the
temperature) are the plan's ``schemes``: each pass runs under one through
:func:`core.runs.rope_pass.scheme_pass`, bound to the pass's length. A scheme is
one text, its name and any parameters (``yarn-rope:attention_factor=1``,
``window:window=32``; :meth:`core.values.positions.Scheme.of`).

A method is resolved once per length and scheme through :mod:`core.runs.methods`;
measured ones calibrate on sequences whose seeds (``calib_seed`` on) are
disjoint from the scored ones, under the same CosScale s and the same position
scheme as the scored pass (a tau matched under other settings would answer
another question). The rows are plain dicts (:data:`ROW_KEYS`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.data import tasks
from core.errors import UserError
from core.mechanics.attention import ROPE as ROPE_FAMILY
from core.models import Loaded
from core.runs import engine, methods, rope_pass
from core.runs.mlm_pass import MASK_RATE, MIN_TOKENS, MaskedSequence, Scored, head_logits, mask_tokens, score, sequence  # noqa: F401  the one pass's names, also read as this evaluation's
from core.values import positions
from core.values.choice import Choice
from core.values.positions import PLAIN_SCHEME, Scheme
from core.values.schedule import Schedule
from core.values.validation import Positive, held_out_plan

if TYPE_CHECKING:  # Ray and the pool are imported only when a sweep runs on them
    from core.experiments import cluster

#: The position scheme a plan uses when not told: plain RoPE as trained.
PLAIN = positions.PLAIN


@dataclass(frozen=True)
class MlmPlan:
    """What to measure: ``lengths`` x ``schemes`` x ``methods``, ``sequences`` held-out sequences per cell.

    ``schemes``: position schemes (:class:`core.values.positions.Scheme`, or texts such as ``window:window=32`` that
    :meth:`validated` makes into them), the plain scheme when not told.

    ``task``, ``haystack``, ``calib_seed`` and ``calib_samples`` are what measured methods calibrate on
    (held-out prose of the same pool, seeds disjoint from the scored ones)."""

    lengths: list[int]
    methods: list[str]
    sequences: int = 32
    seed: int = 0
    calib_seed: int = 100_000
    calib_samples: int = 1
    batch_size: int = 8
    cosine_scale: float | None = None
    rate: float = MASK_RATE
    haystack: str = "corpus-eval"
    task: str = tasks.LM
    schemes: tuple[Scheme | str, ...] = (PLAIN_SCHEME,)
    #: a method's own number by name (critical scaling's gamma), given to the methods that take it; its cells' rows
    #: name it (``critical:gamma=0.2``, :func:`core.runs.methods.cell_text`), as sweeps and perplexity tables do
    params: dict[str, float] = field(default_factory=dict)

    def validated(self) -> "MlmPlan":
        """This plan with methods in their one spelling and every bound checked, or a :class:`UserError`."""
        where = "Bad mlm option"
        if not self.lengths or not self.methods:
            raise UserError(f"{where}: at least one length and one method")
        plan = held_out_plan(self, where, methods.method_label, cosine_scale=Positive)
        short = [n for n in plan.lengths if n < MIN_TOKENS]
        if short:
            raise UserError(f"{where}: lengths: a sequence needs at least {MIN_TOKENS} tokens, got {short[0]}")
        if not plan.schemes:
            raise UserError(f"{where}: at least one position scheme")
        schemes = tuple(Scheme.of(t) for t in plan.schemes)
        if len(set(schemes)) != len(schemes):
            raise UserError(f"{where}: schemes: {', '.join(map(str, schemes))} lists one scheme twice")
        return replace(plan, schemes=schemes, params=methods.check_params(plan.params, plan.methods, where))


def check_model(loaded: Loaded, plan: MlmPlan) -> None:
    """Refuse, before any pass, a model this evaluation cannot read (one line each)."""
    if loaded.seq2seq:
        raise UserError(
            f"Model '{loaded.spec.name}' is a {loaded.family} model: mlm evaluates masked-LM encoders "
            "(a rotary model such as ModernBERT); T5 models have `perplexity` and `sweep`"
        )
    if plan.cosine_scale is not None and not loaded.cosine:
        raise UserError(
            f"--cosine-scale: model '{loaded.spec.name}' has dot-product attention; CosScale s applies to "
            "models trained with cosine attention"
        )
    for scheme in plan.schemes:
        rope_pass.check(loaded, Scheme.of(scheme))
    if loaded.family == ROPE_FAMILY:
        rope_pass.check_rotation(loaded)  # a rotary config its own attention cannot apply: before any pass


def resolve(
    loaded: Loaded, plan: MlmPlan, n: int, method: str, doc: tasks.Document, cache: dict, scheme: Scheme = PLAIN_SCHEME
) -> tuple[Schedule, dict]:
    """``(schedule, outcome)`` of ``method`` at length ``n`` under the position scheme ``scheme``. A measured one is resolved once per length and scheme on calibration
    sequences (seeds ``calib_seed + n`` on) under the plan's CosScale s and that scheme (its passes at L and at
    L_tr each bind it at their own length), and cached; ``outcome`` holds a search's ``reached`` and ``gap``
    (empty strings for anything else)."""
    name, value = methods.parse(method)
    own = methods.own_params(name, plan.params)
    if not methods.get(name).measured:
        tau, info = methods.resolve(loaded, doc, name, value, params=own)
        return tau, _outcome(info)
    if (n, scheme, method) not in cache:
        calib = tasks.make(plan.task, loaded.tokenizer, n, seed=plan.calib_seed + n, haystack=plan.haystack)
        base = Choice.of(cosine_scale=plan.cosine_scale, scheme=scheme)
        tau, info = methods.resolve(loaded, calib, name, samples=plan.calib_samples, base=base, params=own)
        cache[(n, scheme, method)] = (tau, _outcome(info))
    return cache[(n, scheme, method)]


def _outcome(info: dict) -> dict:
    """A search's ``reached`` and ``gap`` (as sweep rows give them); empty strings for a method that is no search."""
    if "reached" not in info or "gap" not in info:
        return {"reached": "", "gap": ""}
    return {"reached": bool(info["reached"]), "gap": round(float(info["gap"]), 6)}


def run_mlm(loaded: Loaded, plan: MlmPlan, progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Every length x scheme x method cell of ``plan`` as one plain row (see :data:`ROW_KEYS`), lengths outermost,
    then schemes, then methods: :func:`run_mlm_sweep` without a CSV, run here.

    The sequences of a length are built and masked once and scored under every scheme and method.
    ``attention_factor`` is the factor the scheme put on cos and sin as it acted on this model (logits x its
    square: YaRN's 0.1 ln s + 1 under ``yarn-rope``, 1 for any other scheme and for a cosine model, whose
    normalisation cancels it); a temperature method's tau divides the logits on top of it, so ``yarn-rope``
    with the method of the same paper counts YaRN's factor twice unless bound with ``attention_factor=1``
    (docs/positions.md)."""
    return [{k: r[k] for k in ROW_KEYS} for r in run_mlm_sweep(loaded, plan, progress=progress)]


def cell(
    loaded: Loaded,
    plan: MlmPlan,
    n: int,
    scheme: Scheme,
    method: str,
    cache: dict,
    step: Callable[[int], None] | None = None,
) -> dict:
    """One cell's row (:data:`COLUMNS`): the plan's sequences at ``n`` tokens scored under the scheme ``scheme``
    and ``method``. What every row comes from, here and on a Ray actor.

    ``cache`` keeps what cells of one process share: a length's masked sequences (built and masked once, scored
    under every scheme and method) and the taus measured methods resolved (per length, scheme and method, as
    :func:`resolve` caches them). ``step(k)`` is called after each batch of ``k`` sequences."""
    from core.experiments.cluster import Cancelled, cancelled

    if ("sequences", n) not in cache:
        pairs = [sequence(loaded, n, plan.seed + i, plan.rate, plan.haystack) for i in range(plan.sequences)]
        cache[("sequences", n)] = (pairs[0][0], [m for _, m in pairs])
    first, masked = cache[("sequences", n)]
    factor = rope_pass.attention_factor(loaded, rope_pass.bound(loaded, scheme, max(m.n for m in masked)))
    tau, outcome = resolve(loaded, plan, n, method, first, cache, scheme)
    choice = Choice(
        tau=tau, cosine_scale=None if plan.cosine_scale is None else float(plan.cosine_scale), scheme=scheme
    )
    t0 = time.perf_counter()
    count, correct, nll = 0, 0, 0.0
    for b in range(0, len(masked), plan.batch_size):
        if cancelled():  # the driver was stopped: free this actor for its next run
            raise Cancelled
        s = score(loaded, masked[b : b + plan.batch_size], choice)
        count, correct, nll = count + s.masked, correct + s.correct, nll + s.nll
        if step:
            step(len(masked[b : b + plan.batch_size]))
    return {
        "model": loaded.spec.name,
        "tokens": n,
        "actual_tokens": int(round(np.mean([m.n for m in masked]))),
        "train_length": loaded.train_length,
        "scheme": scheme.name,
        "scheme_params": scheme.params_text(),
        "attention_factor": round(factor, 6),
        "method": methods.cell_text(method, plan.params),
        "tau": round(tau.mean(n), 6),
        "cosine_scale": _cosine(loaded, plan),
        "accuracy": correct / count,
        "perplexity": math.exp(nll / count),
        "nll": nll,
        "masked": count,
        "sequences": len(masked),
        "first_seed": plan.seed,
        "seconds": round(time.perf_counter() - t0, 3),
        **outcome,
    }


def _cell_job(loaded: Loaded, payload: tuple) -> tuple[int, dict]:
    """A cell as a :class:`core.experiments.cluster.Job`'s function: ``(plan index, row)``. Module-level, so Ray ships it by
    reference; on an actor the cache is its own (the payload's fresh dict)."""
    plan, index, n, spec, method, cache = payload
    return index, cell(loaded, plan, n, spec, method, cache)


def cells(plan: MlmPlan) -> list[tuple[int, str, str]]:
    """The plan's cells ``(tokens, scheme text, method)`` in row order: lengths, then schemes, then methods."""
    return [(n, spec, m) for n in plan.lengths for spec in plan.schemes for m in plan.methods]


def cell_key(model: str, n: int, scheme: Scheme, method: str, plan: MlmPlan, cosine: float | None) -> tuple:
    """A cell's resume key (:data:`KEY`), as :func:`row_key` reads it from a written row."""
    return row_key(
        {
            "model": model,
            "tokens": n,
            "scheme": scheme.name,
            "scheme_params": scheme.params_text(),
            "method": methods.cell_text(method, plan.params),
            "cosine_scale": cosine,
            "sequences": plan.sequences,
            "first_seed": plan.seed,
        }
    )


def row_key(row: dict) -> tuple:
    """The :data:`KEY` of a row, from the run (typed) or from the CSV (text, restored by :mod:`core.experiments.csvio`)."""

    def norm(k: str, v) -> str:
        if k in ("tokens", "sequences", "first_seed"):
            return str(int(float(v)))
        if k == "cosine_scale":
            return "" if v is None or v == "" else f"{float(v):g}"
        if k == "scheme_params":  # in the one spelling, whichever spelling wrote it (older rows: "factor=2")
            params = str(v or "")
            return Scheme.of(
                f"{row['scheme']}{positions.SPEC_SEP}{params}" if params else str(row["scheme"])
            ).params_text()
        return str(v)

    try:
        return tuple(norm(k, row[k]) for k in KEY)
    except (KeyError, ValueError) as err:
        raise UserError(
            f"the --out file holds a row that is not an mlm row ({err}); use another --out or drop --resume"
        ) from None


def run_mlm_sweep(
    loaded: Loaded,
    plan: MlmPlan,
    out: str | Path | None = None,
    resume: bool = False,
    progress: Callable[[int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    pool: "cluster.RayEngine | None" = None,
    tracker: "cluster.Tracker | None" = None,
    report: Callable[[str], None] | None = None,
) -> list[dict]:
    """Run ``plan``; append one row per length x scheme x method (:data:`COLUMNS`) to ``out`` (CSV) as each cell
    finishes; return every row of the table, the file's earlier ones first, new ones in plan order.

    The CSV goes through :class:`core.experiments.csvio.ResultCSV` (the lock on the real file, a torn last row dropped and
    redone, spreadsheet-safe cells); ``resume`` skips the cells it holds (:data:`KEY`). Everything is checked
    before the file is touched. ``pool``: None runs the cells here in plan order; a
    :class:`core.experiments.cluster.RayEngine` runs each as a job on its actors, heaviest first (its rows come from
    :func:`cell`, as here, and are written here: the one writer). A job that fails twice goes to ``report``
    (default stderr) and the run goes on; ``--resume`` runs its cell again. ``progress(done, total)`` counts
    sequences (per batch here, per cell from a pool); ``should_stop()`` is polled between cells."""
    from core.experiments import cluster, csvio
    from core.experiments.sweep import typed_rows  # a resumed CSV's rows typed as pandas reads them, as sweeps resume

    plan = plan.validated()
    check_model(loaded, plan)
    engine.check_length(loaded, max(plan.lengths), min(plan.batch_size, plan.sequences))
    model = None
    if pool is not None:
        model = pool.model_ref(loaded)
        pool.prepare(model)  # every actor loads the model before the CSV is touched
    track = tracker or cluster.NO_TRACKER
    say = report or (lambda msg: print(msg, file=sys.stderr))
    cosine = _cosine(loaded, plan)
    path = Path(out) if out else None
    total = len(cells(plan)) * plan.sequences
    with csvio.ResultCSV(path, list(COLUMNS), "mlm", resume=resume) as sink:
        done_keys = {row_key(r) for r in sink.rows}
        rows: list[dict] = typed_rows(path) if sink.rows else []
        todo = [
            (i, c) for i, c in enumerate(cells(plan)) if cell_key(loaded.spec.name, *c, plan, cosine) not in done_keys
        ]
        count = (len(cells(plan)) - len(todo)) * plan.sequences
        if progress:
            progress(count, total)
        new: list[tuple[int, dict]] = []

        def write(index: int, row: dict) -> None:
            new.append((index, row))
            sink.write(row)

        def step(k: int) -> None:
            nonlocal count
            count += k
            if progress:
                progress(count, total)

        jobs = [
            cluster.Job(
                _cell_job,
                (plan, i, n, spec, m, {}),
                f"mlm at {n:,} tokens, scheme {spec}, method {m}",
                passes=((plan.sequences, n),),
                model=model,
                tag=i,
            )
            for i, (n, spec, m) in todo
        ]
        track.start(len(jobs), len(jobs), None, pool.where if pool is not None else "in this process")
        if pool is None:
            shared: dict = {}  # one cache for every local cell: a length's sequences and the resolved taus

            def here(ld: Loaded, payload: tuple) -> tuple[int, dict]:
                index, n, spec, m = payload
                return index, cell(ld, plan, n, spec, m, shared, step)

            def on_local(job: cluster.Job, result: tuple[int, dict]) -> None:
                write(*result)
                track.advance(1, 1)

            cluster.run_local(
                (replace(j, fn=here, payload=(j.tag, *j.payload[2:5])) for j in jobs), loaded, on_local, should_stop
            )
        else:

            def on_done(job: cluster.Job, result: tuple[int, dict]) -> list:
                write(*result)
                step(plan.sequences)
                track.advance(1, 1)
                return []

            def on_fail(job: cluster.Job, why: str) -> None:
                track.advance(1, 0)
                say(f"mlm job failed: {job.label}: {why}; its row is missing (--resume runs it again)")

            pool.run(jobs, on_done, on_fail, should_stop)
    new.sort(key=lambda t: t[0])  # plan order, as a local run gives them (the CSV keeps arrival order)
    return rows + [r for _, r in new]


def _cosine(loaded: Loaded, plan: MlmPlan) -> float | None:
    """The CosScale s a row ran with: the plan's, else the trained one (None for a dot-product model)."""
    return plan.cosine_scale if plan.cosine_scale is not None else loaded.cosine_scale


#: The keys of every row :func:`run_mlm` returns (the CLI's ``mlm --json`` contract).
ROW_KEYS = (
    "tokens",
    "actual_tokens",
    "train_length",
    "scheme",
    "scheme_params",
    "attention_factor",
    "method",
    "tau",
    "cosine_scale",
    "accuracy",
    "perplexity",
    "nll",
    "masked",
    "sequences",
    "first_seed",
    "seconds",
    "reached",
    "gap",
)
#: The columns of an ``mlm --out`` CSV: the model, then a row's keys.
COLUMNS = ("model",) + ROW_KEYS
#: What makes a row one cell (``--resume`` skips the cells a CSV holds): the model, the length, the scheme and its
#: parameters, the method, and what would make the same cell another measurement (s, the sequences and their seeds).
KEY = ("model", "tokens", "scheme", "scheme_params", "method", "cosine_scale", "sequences", "first_seed")


def summary(loaded: Loaded, plan: MlmPlan, rows: list[dict]) -> dict:
    """The CLI's ``mlm --json`` object: the model, its L_tr, the masking rate and the rows."""
    return {
        "model": loaded.spec.name,
        "family": loaded.family,
        "train_length": loaded.train_length,
        "mask_rate": plan.rate,
        "rows": rows,
    }
