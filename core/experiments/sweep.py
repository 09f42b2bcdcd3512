"""Many ``engine.run``s -> one tidy table, written row by row.

A sweep is the product lengths x depths x seeds x methods for one model and
task. Each finished document is appended to the CSV at once (a killed sweep
keeps what it finished); ``resume=True`` skips rows already there and redoes
a last row cut short by a kill. The whole plan is checked before the CSV is
touched, and one sweep at a time writes a CSV (:class:`core.experiments.csvio.ResultCSV`:
lock, resume checks, spreadsheet-safe cells).

Measured methods (Algorithm 1, Prop. 1/2, per-layer) are calibrated once per
length on *calibration* documents whose seeds are disjoint from the test
seeds (``calib_seed`` onwards), so no method is tuned on the documents it is
scored on. A search's rows say whether that calibration ``reached`` the L_tr
reference and the ``gap`` it left (empty for other methods).

A method's own number (critical scaling's gamma, ``params``) is given once for
the plan and goes to every cell of the methods that take it; their rows name
it in the ``method`` column (``critical:gamma=0.2``,
:func:`core.runs.methods.cell_text`), so sweeps at two gammas never read as
one and a resumed sweep at another gamma runs its own cells instead of taking
the other's as done.
"""

from __future__ import annotations

import contextlib
import csv
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from core.data import tasks
from core.errors import UserError
from core.experiments import csvio
from core.mechanics.probes import ProbeSpec
from core.models import Loaded
from core.runs import engine, methods, timing
from core.runs.methods import method_label
from core.values.choice import Choice
from core.values.positions import PLAIN_SCHEME, SPEC_SEP, Scheme
from core.values.schedule import Schedule
from core.values.validation import Depth, Samples, Seed, Tokens, validate

if TYPE_CHECKING:  # Ray and the pool are imported only when a sweep runs on them
    from core.experiments import cluster

COLUMNS = [
    "model",
    "task",
    "tokens",
    "actual_tokens",
    "depth",
    "seed",
    "method",
    "tau",
    "answer",
    "expected",
    "correct",
    "pmax",
    "entropy",
    "seconds",
    "reached",
    "gap",
]
#: Columns a search fills (Algorithm 1 and its per-layer, per-head and refined kin: did its curve reach the
#: L_tr reference, and S_ex - S_tr at the pick, both from the calibration documents); empty for other methods.
SEARCH_COLUMNS = ("reached", "gap")
KEY = ("model", "task", "tokens", "depth", "seed", "method")
#: The columns a sweep with position schemes adds (after ``method``'s row): a plain sweep's CSV keeps
#: :data:`COLUMNS` exactly, so its rows and the golden outputs stay as they were.
SCHEME_COLUMNS = ["scheme", "scheme_params"]


def columns(plan: SweepPlan) -> list[str]:
    """The CSV's columns for this plan: :data:`COLUMNS`, plus :data:`SCHEME_COLUMNS` when it names a scheme other
    than the plain one."""
    return COLUMNS + SCHEME_COLUMNS if plan.scheme_columns else COLUMNS


@dataclass
class SweepPlan:
    model: str
    task: str
    lengths: list[int]
    depths: list[float]
    seeds: list[int]
    methods: list[str]
    calib_samples: int = 4
    calib_seed: int = 100_000
    haystack: str = "default"
    #: the value of a method's :class:`core.runs.methods.Param` by name (``{"gamma": 0.2}``), for the methods that take it
    params: dict[str, float] = field(default_factory=dict)
    #: position schemes (Scheme, or texts ``mlm --schemes`` takes, e.g. ``yarn-rope``): each method runs under each
    schemes: tuple = (PLAIN_SCHEME,)
    #: rows carry ``scheme`` columns although every scheme is plain: a plain plan resumed into a CSV that has them
    #: (one table of methods and schemes, :func:`run_sweep`)
    keep_scheme_columns: bool = False

    @property
    def has_schemes(self) -> bool:
        """Whether a scheme other than the plain one is asked (the rows then carry ``scheme`` columns)."""
        return any(not Scheme.of(s).is_plain for s in self.schemes)

    @property
    def scheme_columns(self) -> bool:
        """Whether the rows carry ``scheme`` and ``scheme_params`` (:data:`SCHEME_COLUMNS`)."""
        return self.has_schemes or self.keep_scheme_columns

    def cells(self) -> Iterable[tuple[int, float, int, str]]:
        """``(length, depth, seed, method)`` per cell; with schemes, ``method`` is ``(scheme, method)`` text
        joined by :data:`SCHEME_JOIN` (:func:`split_cell` reads it back)."""
        for n in self.lengths:
            for d in self.depths:
                for s in self.seeds:
                    for sc in self.schemes:
                        for m in self.methods:
                            yield n, d, s, join_cell(Scheme.of(sc), m) if self.has_schemes else m

    @property
    def total(self) -> int:
        return len(self.lengths) * len(self.depths) * len(self.seeds) * len(self.methods) * len(self.schemes)

    def validated(self) -> SweepPlan:
        """This plan with methods as labels, or a :class:`UserError` naming the first bad option.

        Called first by :func:`run_sweep`, so a bad option never costs the
        rows of an existing CSV.
        """
        try:
            names = [method_label(m) for m in self.methods]
        except ValueError as err:
            raise UserError(f"Bad sweep option: {err}") from None
        where = "Bad sweep option"  # the bounds every entry point uses (core.values.validation)
        return replace(
            self,
            lengths=validate(list[Tokens], self.lengths, f"{where}: lengths"),
            depths=validate(list[Depth], self.depths, f"{where}: depths"),
            seeds=validate(list[Seed], self.seeds, f"{where}: seeds"),
            methods=names,
            calib_samples=validate(Samples, self.calib_samples, f"{where}: calib_samples"),
            calib_seed=validate(Seed, self.calib_seed, f"{where}: calib_seed"),
            params=methods.check_params(self.params, names, where),
            schemes=_schemes(self.schemes, where),
        )


def _schemes(given, where: str) -> tuple[Scheme, ...]:
    """The plan's schemes made into :class:`Scheme` values, at least one, none twice."""
    if not given:
        raise UserError(f"{where}: at least one position scheme")
    schemes = tuple(Scheme.of(s) for s in given)
    if len(set(schemes)) != len(schemes):
        raise UserError(f"{where}: schemes: {', '.join(map(str, schemes))} lists one scheme twice")
    return schemes


#: Between a cell's scheme and its method inside a sweep's job (never written: rows carry them in two columns).
SCHEME_JOIN = "\x1f"


def join_cell(scheme: Scheme, method: str) -> str:
    return f"{scheme.spell()}{SCHEME_JOIN}{method}"


def split_cell(cell: str) -> tuple[Scheme, str]:
    """A cell's ``(scheme, method)``: the plain scheme for a cell without one."""
    if SCHEME_JOIN not in cell:
        return PLAIN_SCHEME, cell
    scheme, method = cell.split(SCHEME_JOIN, 1)
    return Scheme.of(scheme), method


def _done_keys(rows: list[dict[str, str]], path: Path | None, plan: SweepPlan | None = None) -> set[tuple]:
    """Keys of the rows a resumed CSV already holds (cells as written, restored by csvio)."""
    extra = SCHEME_COLUMNS if plan is not None and plan.scheme_columns else []
    try:
        return {tuple(_norm(k, r[k]) for k in (*KEY, *extra)) for r in rows}
    except ValueError as err:
        raise UserError(
            f"{path} holds a row that is not a sweep row ({err}); use another --out or drop --resume"
        ) from None


def _header(path: Path | None) -> list[str] | None:
    """The column names of an existing CSV's first line (None: no such file, or unreadable)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return next(csv.reader(f), None)
    except (OSError, TypeError, UnicodeDecodeError, csv.Error):
        return None


def _norm(k: str, v) -> str:
    if k == "tokens" or k == "seed":
        return str(int(float(v)))
    if k == "depth":
        return f"{float(v):g}"
    return str(v)


def run_sweep(
    loaded: Loaded,
    plan: SweepPlan,
    out: str | Path | None = None,
    resume: bool = False,
    progress: Callable[[int, int, dict | None], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    guard: Callable[[], ContextManager] = contextlib.nullcontext,
    pool: "cluster.RayEngine | None" = None,
    tracker: "cluster.Tracker | None" = None,
    report: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Run the plan; append rows to ``out`` (CSV) as they finish; return the table (in plan order).

    ``progress(done, total, row)`` is called after each row (and once at the
    start with ``row=None``); ``should_stop()`` is polled between rows (the
    app's cancel button). ``guard()`` is entered around each row's passes:
    the app passes its pass gate, so a sweep and other sessions' passes take
    turns instead of sharing the memory one of them was checked against.

    ``pool``: None runs here, one cell per job in plan order. A
    :class:`core.experiments.cluster.RayEngine` runs the same cells, cut into jobs of
    one length, one method and a slice of documents, on its actors, heaviest
    first; a measured method's calibration is a job of its own that its
    cells wait for. Either way every row comes from :func:`_cells_job` and is
    written here (the one writer), so the rows are the same. On Ray a job
    that fails twice goes to ``report`` (default: stderr) with its cells and
    the sweep goes on; ``--resume`` reruns the missing rows. ``tracker``
    hears of the plan and of each job (:class:`core.experiments.cluster.Bar`).
    """
    from core.experiments import cluster

    plan = plan.validated()
    if plan.total:
        engine.check_length(loaded, max(plan.lengths))  # before a huge document is built, or the CSV touched
        _check_task(loaded, plan)
    path = Path(out) if out else None
    if resume and not plan.scheme_columns and _header(path) == COLUMNS + SCHEME_COLUMNS:
        plan = replace(plan, keep_scheme_columns=True)  # plain cells beside the schemes' in one table
    model = None
    if pool is not None:
        model = pool.model_ref(loaded)
        pool.prepare(model)  # every actor loads the model before the CSV is touched
    track = tracker or cluster.NO_TRACKER
    say = report or (lambda msg: print(msg, file=sys.stderr))
    with csvio.ResultCSV(path, columns(plan), "sweep", resume=resume) as sink:
        done = _done_keys(sink.rows, path, plan)
        rows: list[dict] = typed_rows(path) if sink.rows else []
        cells = list(enumerate(plan.cells()))
        todo = [(i, c) for i, c in cells if _key(plan, *c) not in done]
        if progress:
            progress(0, plan.total, None)
        workers = pool.workers if pool is not None else 1
        jobs = _jobs(loaded, plan, todo, workers, model)
        same_device = pool is None or (pool.on_cpu and loaded.device.type == "cpu")
        seconds = cluster.estimate(jobs, timing.model_key(loaded), workers) if same_device else None
        where = pool.where if pool is not None else "in this process"
        track.start(len(todo) if pool is None else len(jobs), len(todo), seconds, where)
        written = len(rows)
        new: list[tuple[int, dict]] = []

        def write(index: int, row: dict) -> None:
            """The one writer: every finished row, local or from an actor, goes through here."""
            nonlocal written
            new.append((index, row))
            sink.write(row)
            written += 1
            if progress:
                progress(index + 1 if pool is None else written, plan.total, row)

        if pool is None:
            # (length, method) -> (schedule, search outcome); ("plain", length, depth, seed) -> a pass's fields
            taus: dict[tuple, tuple | dict] = dict(_plain_rows(loaded, plan, rows))

            def local_jobs() -> Iterator[cluster.Job]:
                for i, (n, depth, seed, m) in cells:
                    if _key(plan, n, depth, seed, m) in done:
                        if progress:
                            progress(i + 1, plan.total, None)
                        continue
                    yield cluster.Job(
                        _cells_job, (plan, n, m, [(i, depth, seed)], taus), _label(plan, n, m, [(i, depth, seed)])
                    )

            def on_local(job: cluster.Job, result: list[tuple[int, dict]]) -> None:
                for index, row in result:
                    write(index, row)
                track.advance(1, len(result))

            cluster.run_local(local_jobs(), loaded, on_local, should_stop, guard)
            return pd.DataFrame(rows + [r for _, r in new], columns=columns(plan))

        waiting = {j.tag: j for j in jobs if j.kind == "calibrate"}
        held: dict[tuple[int, str], list[cluster.Job]] = {}
        for j in jobs:
            if j.kind == "cells" and j.tag in waiting:
                held.setdefault(j.tag, []).append(j)
        ready = [j for j in jobs if j.kind == "calibrate" or j.tag not in waiting]

        def on_done(job: cluster.Job, result) -> list[cluster.Job]:
            if job.kind == "calibrate":
                track.advance(1, 0)
                out = held.pop(job.tag, [])
                for j in out:
                    j.payload = (
                        *j.payload[:4],
                        {job.tag: result},
                    )  # (schedule, search outcome), as _resolve_for caches
                return out
            for index, row in result:
                write(index, row)
            track.advance(1, len(result))
            return []

        def on_fail(job: cluster.Job, why: str) -> None:
            track.advance(1, 0)
            say(f"sweep job failed: {job.label}: {why}; its rows are missing (--resume runs them again)")
            for j in held.pop(job.tag, []) if job.kind == "calibrate" else []:
                track.advance(1, 0)
                say(f"sweep job not run: {j.label}: its calibration failed")

        pool.run(ready, on_done, on_fail, should_stop)
    new.sort(key=lambda t: t[0])  # plan order, as a local sweep returns them (the CSV keeps arrival order)
    return pd.DataFrame(rows + [r for _, r in new], columns=columns(plan))


def _key(plan: SweepPlan, n: int, depth: float, seed: int, m: str) -> tuple:
    scheme, m = split_cell(m)
    row = (plan.model, plan.task, n, depth, seed, methods.cell_text(m, plan.params))  # as its row names it
    key = tuple(_norm(k, v) for k, v in zip(KEY, row))
    return (*key, scheme.name, scheme.params_text()) if plan.scheme_columns else key


def _label(plan: SweepPlan, n: int, m: str, cells: list[tuple[int, float, int]]) -> str:
    """The cells of a job in words, for a failure report."""
    depths = sorted({d for _, d, _ in cells})
    seeds = sorted({s for _, _, s in cells})
    span = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}..{seeds[-1]}"
    return (
        f"{plan.task} at {n:,} tokens, method {_cell_words(plan, m)}, depth{'s' if len(depths) > 1 else ''} "
        f"{','.join(f'{d:g}' for d in depths)}, {span} ({len(cells)} row{'s' if len(cells) != 1 else ''})"
    )


def _cell_words(plan: SweepPlan, cell: str) -> str:
    scheme, m = split_cell(cell)
    text = methods.cell_text(m, plan.params)
    return text if scheme.is_plain else f"{text} under {scheme.spell()}"


def _jobs(
    loaded: Loaded, plan: SweepPlan, todo: list[tuple[int, tuple]], workers: int, model: "cluster.ModelRef | None"
) -> list["cluster.Job"]:
    """The cells still to run as Ray jobs: per (length, method), slices of documents; a measured method's
    calibration at that length is a job its slices wait for (they get its tau, ``tag`` = (length, method)).

    Also the basis of the estimate said before a local sweep (the same work, in other pieces)."""
    from core.experiments import cluster

    groups: dict[tuple[int, str], list[tuple[int, float, int]]] = {}
    for i, (n, depth, seed, m) in todo:
        groups.setdefault((n, m), []).append((i, depth, seed))
    size = cluster.chunk_size(len(todo), workers)
    jobs: list[cluster.Job] = []
    for (n, m), cells in groups.items():
        slices = [
            cluster.Job(
                _cells_job,
                (plan, n, m, part, {}),
                _label(plan, n, m, part),
                passes=((len(part), n),),
                answers=((len(part), n),),
                model=model,
                tag=(n, m),
            )
            for part in cluster.chunks(cells, size)
        ]
        if split_cell(m)[1] in methods.MEASURED:
            passes = tuple(
                timing.sweep_passes(
                    [n],
                    0,
                    methods.costs([split_cell(m)[1]], loaded.n_layers, loaded.n_heads, plan.calib_samples),
                    loaded.train_length,
                )
            )
            jobs.append(
                cluster.Job(
                    _calibrate_job,
                    (plan, n, m),
                    f"calibrating {_cell_words(plan, m)} at {n:,} tokens",
                    passes=passes,
                    unlocks=sum(j.cost for j in slices),
                    model=model,
                    kind="calibrate",
                    tag=(n, m),
                )
            )
        jobs += slices
    return jobs


def _calibrate_job(loaded: Loaded, payload: tuple) -> tuple[float | list, dict]:
    """A measured method's tau at one length and its search outcome (``reached``, ``gap``): a job of its own on
    Ray, whose result its cells wait for (it becomes their cache entry, so their rows equal local ones)."""
    plan, n, cell = payload
    scheme, m = split_cell(cell)
    return resolve_for(loaded, plan, n, m, None, {}, None if scheme.is_plain else Choice.of(scheme=scheme))


def _cells_job(loaded: Loaded, payload: tuple) -> list[tuple[int, dict]]:
    """Rows of some cells of one length and one method: ``[(plan index, row)]``.

    What every sweep row comes from, locally (one cell, the sweep's tau
    cache) and on an actor (a slice; the calibration job's (tau, outcome) in the cache)."""
    from core.experiments.cluster import Cancelled, cancelled

    plan, n, cell, cells, cache = payload
    scheme, m = split_cell(cell)
    base = None if scheme.is_plain else Choice.of(scheme=scheme)
    out = []
    for index, depth, seed in cells:
        if cancelled():  # the driver was stopped: free this actor for its next run
            raise Cancelled
        doc = tasks.make(plan.task, loaded.tokenizer, n, depth=depth, seed=seed, haystack=plan.haystack)
        tau, outcome = resolve_for(loaded, plan, n, m, doc, cache, base)
        choice = Choice.of(tau=tau, method=m, scheme=scheme)
        plain_key = ("plain", n, float(depth), int(seed))
        enc = engine.encode(loaded, doc)  # once: the pass binds its scheme to the prompt's length, and runs on it
        plain = choice.acts_plain(loaded.config, loaded.train_length, enc.n, enc.n + answer_rows(loaded))
        if plain and plain_key in cache:  # the model's own attention, already run on this document: the same pass
            made, seconds = cache[plain_key], 0.0
        else:
            how = engine.Pass(probes=ProbeSpec.stats_only(question_rows=loaded.decoder_only))
            res = engine.run(loaded, doc, choice, how, encoded=enc)
            made = {
                "actual_tokens": res.tokens,
                "answer": res.answer,
                "expected": res.expected,
                "correct": bool(res.correct),
                "pmax": round(res.pmax, 5),
                "entropy": round(res.entropy, 5),
            }
            seconds = round(res.seconds["total"], 4)
            if plain:
                cache[plain_key] = made
        out.append(
            (
                index,
                {
                    "model": plan.model,
                    "task": plan.task,
                    "tokens": n,
                    "actual_tokens": made["actual_tokens"],
                    "depth": depth,
                    "seed": seed,
                    "method": methods.cell_text(m, plan.params),
                    "tau": tau.mean(made["actual_tokens"]),
                    "answer": made["answer"],
                    "expected": made["expected"],
                    "correct": bool(made["correct"]),
                    "pmax": made["pmax"],
                    "entropy": made["entropy"],
                    "seconds": seconds,
                    **outcome,
                    **({"scheme": scheme.name, "scheme_params": scheme.params_text()} if plan.scheme_columns else {}),
                },
            )
        )
    return out


def _check_task(loaded: Loaded, plan: SweepPlan) -> None:
    """Build the shortest document once, so an unknown task or haystack, or a length too short for the task,
    is refused before the CSV is touched (a longer document only has more filler)."""
    try:
        tasks.make(
            plan.task,
            loaded.tokenizer,
            min(plan.lengths),
            depth=plan.depths[0],
            seed=plan.seeds[0],
            haystack=plan.haystack,
        )
    except ValueError as err:
        raise UserError(f"Bad sweep option: {err}") from None


def typed_rows(path: Path) -> list[dict]:
    """The rows a resumed CSV holds, typed as pandas reads them, text as it was before neutralising."""
    return csvio.restore_frame(pd.read_csv(path, keep_default_na=False)).to_dict("records")


def resolve_for(
    loaded: Loaded,
    plan,
    n: int,
    method: str,
    doc: tasks.Document | None,
    cache: dict,
    base: Choice | None = None,
    progress: methods.Progress | None = None,
) -> tuple[Schedule, dict]:
    """``(schedule, {"reached", "gap"})`` of a method at length n; a measured one resolved once per length on
    calibration documents (seeds disjoint from the test seeds) and cached as that pair. ``reached`` / ``gap``
    are those of its search (:meth:`core.runs.temperature.Calibration.to_dict`), empty strings for a method that
    is not a search (none, a fixed tau, closed forms, Prop. 1/2). ``plan.params``: a method's own number (gamma),
    given to the methods that take it. ``base``: the choice a measured method's passes run under (a position
    scheme: its tau is then matched under that scheme, and cached apart). ``progress(fraction)``: told 0.0 when a
    calibration's passes start (not when the pair is cached or needs none), then the search's own steps."""
    name, value = methods.parse(method)
    if not methods.get(name).measured:
        tau, info = methods.resolve(loaded, doc, name, value, params=methods.own_params(name, plan.params))
        return tau, _outcome(info)
    key = (n, method) if base is None else (n, method, base.scheme)
    if key not in cache:
        calib_doc = tasks.make(
            plan.task, loaded.tokenizer, n, depth=0.5, seed=plan.calib_seed + n, haystack=plan.haystack
        )
        if _own_reference(loaded, calib_doc, plan.calib_samples, base):
            cache[key] = (Schedule.of(1.0), {"reached": True, "gap": 0.0})
            return cache[key]
        if progress:
            progress(0.0)
        tau, info = methods.resolve(
            loaded,
            calib_doc,
            method,
            samples=plan.calib_samples,
            base=base,
            progress=progress,
            params=methods.own_params(name, plan.params),
        )
        cache[key] = (tau, _outcome(info))
    return cache[key]


def acts_plain_cell(loaded: Loaded, plan, lengths: Iterable[int], scheme: Scheme, method: str, new: int = 0) -> bool:
    """Whether a done row's cell (``scheme``, ``method`` as its CSV spells it) was the model's own attention on
    inputs of each of ``lengths`` tokens (:meth:`Choice.acts_plain`; ``new``: rows an answer adds past the
    prompt), answered without a pass: only a method that needs none (not a search, no logit statistics); any
    other is taken as not plain (its row is then never shared)."""
    name, value = methods.parse(method)
    m = methods.get(name)
    if m.measured or m.stats:
        return False
    params = methods.own_params(name, plan.params)
    for n in set(lengths):
        tau, _ = methods.resolve(loaded, None, name, value, tokens=n, params=params)
        if not Choice.of(tau=tau, scheme=scheme).acts_plain(loaded.config, loaded.train_length, n, n + new):
            return False
    return True


def row_scheme(row: dict) -> Scheme:
    """The position scheme a CSV row names in its ``scheme`` and ``scheme_params`` columns (plain without them)."""
    params = str(row.get("scheme_params") or "")
    return Scheme.of(str(row.get("scheme") or PLAIN_SCHEME.name) + (SPEC_SEP + params if params else ""))


def answer_rows(loaded: Loaded) -> int:
    """Query rows a sweep's answer adds after the prompt: a decoder-only LM's new tokens attend as rows of the same
    attention (an encoder-decoder's are the decoder's, which no tau of the encoder touches)."""
    return engine.Pass().max_new_tokens if loaded.decoder_only else 0


#: A row's fields that its pass made (what a cell that acts plain copies from the first such cell's row).
PASS_FIELDS = ("actual_tokens", "answer", "expected", "correct", "pmax", "entropy")


def _plain_rows(loaded: Loaded, plan: SweepPlan, rows: list[dict]) -> dict[tuple, dict]:
    """The done rows whose cell was the model's own attention at its length, by ``("plain", n, depth, seed)``:
    what later cells that act plain on the same document share (:func:`_cells_job`), across a resume too."""
    out: dict[tuple, dict] = {}
    for r in rows:
        if str(r.get("model")) != plan.model or str(r.get("task")) != plan.task:
            continue
        key = ("plain", int(r["tokens"]), float(r["depth"]), int(r["seed"]))
        if key in out:
            continue
        try:
            tokens = [int(r["actual_tokens"])]
            plain = acts_plain_cell(loaded, plan, tokens, row_scheme(r), str(r["method"]), answer_rows(loaded))
        except (UserError, ValueError):
            plain = False
        if plain:
            out[key] = {f: r[f] for f in PASS_FIELDS}
    return out


def _own_reference(loaded: Loaded, document: tasks.Document, samples: int, base: Choice | None) -> bool:
    """Whether a search's calibration documents are their own L_tr references (a table's cell at L_tr) under the
    model's own attention: its answer is then tau = 1 with no gap, with no pass run (the statistics at tau = 1 are
    the reference's, bit for bit; a search over the grid finds the same, tests/experiments/test_shared_plain_cells.py).
    At 1x L_tr that saves a bisection of passes per measured method."""
    from core.runs import calibration

    docs = calibration.siblings(document, loaded, samples)
    lengths = {len(engine.encode(loaded, d).input_ids) for d in docs}
    if base is not None and not all(base.acts_plain(loaded.config, loaded.train_length, k) for k in lengths):
        return False
    try:
        return all(calibration.reference_document(loaded, d).text == d.text for d in docs)
    except UserError:
        return False


def _outcome(info: dict) -> dict:
    """A search's ``reached`` (bool) and ``gap`` (float, 6 decimals) from its info; empty strings otherwise."""
    if "reached" not in info or "gap" not in info:
        return dict.fromkeys(SEARCH_COLUMNS, "")
    return {"reached": bool(info["reached"]), "gap": round(float(info["gap"]), 6)}


def _labelled(df: pd.DataFrame) -> pd.DataFrame:
    """The rows with a scheme's name before their method (``yarn-rope + none``) when they carry one."""
    d = df.copy()
    if "scheme" in d:
        d["method"] = [
            m if (not sc or sc == PLAIN_SCHEME.name) and not sp else f"{sc}{':' + sp if sp else ''} + {m}"
            for sc, sp, m in zip(d["scheme"].astype(str), d["scheme_params"].fillna("").astype(str), d["method"])
        ]
    return d


def accuracy_table(df: pd.DataFrame, rows: str = "method", cols: str = "tokens") -> pd.DataFrame:
    """Accuracy (%) pivot, e.g. method x length (the paper's Table 4) or depth x length (needle heatmap)."""
    d = _labelled(df)
    d["correct"] = d["correct"].astype(str).str.lower().isin(["true", "1"])
    return (d.pivot_table(index=rows, columns=cols, values="correct", aggfunc="mean") * 100).round(1)


def accuracy_se_table(df: pd.DataFrame, rows: str = "method", cols: str = "tokens") -> pd.DataFrame:
    """Accuracy (%) ± its binomial standard error in points (sqrt(p (1 - p) / n)) and the count of documents, as
    text cells ``62.5 ± 17.1 (8)``: the pass-key table with its error bars."""
    d = _labelled(df)
    d["correct"] = d["correct"].astype(str).str.lower().isin(["true", "1"])
    g = d.groupby([rows, cols], sort=False)["correct"].agg(["mean", "count"]).reset_index()
    g["cell"] = [f"{100 * p:.1f} ± {100 * (p * (1 - p) / k) ** 0.5:.1f} ({k})" for p, k in zip(g["mean"], g["count"])]
    table = g.pivot(index=rows, columns=cols, values="cell")
    return table.reindex(list(dict.fromkeys(d[rows])))
