"""Batch runs over your own documents: ``python -m core sweep --data docs.jsonl --out rows.csv``.

Input: JSON Lines, one document per line, either

* ``{"text": "..."}``: the whole encoder input, used as is; or
* ``{"context": "...", "question": "..."}``: built like the app's "your own
  text" with no needle (``context`` + newline + ``question``, exactly what
  ``python -m core run --task text --needle "" --question Q`` does);

plus optional ``"expected"`` (the gold answer: scored with
:func:`core.data.tasks.score` ``("text", ...)``: when it is a whole number the
first integer of the answer must equal it, otherwise the normalised expected
words must appear, in order, in the normalised answer) and optional ``"id"``
(a string or number, unique; it keys ``--resume``, else the line number
does). Other keys are ignored. Bad lines (not JSON, not an object, no or
empty text, a duplicate id, longer than :data:`MAX_LINE_BYTES`, nested deeper
than :data:`MAX_DEPTH`, an id over :data:`MAX_ID_CHARS` or an expected answer
over :data:`MAX_EXPECTED_CHARS` characters) are reported on stderr with their
line number and skipped; the run goes on.

Output: one CSV row per document and setting (:data:`COLUMNS`), appended,
flushed and fsynced as each batch finishes, so a killed run keeps what it
finished; ``--resume`` skips the (id or line, setting) pairs already in the
file (a half-written last line is dropped and redone). One run at a time
writes a file, and text cells are spreadsheet-safe (:mod:`core.experiments.csvio`).

Settings (the "setting" column): ``--methods a,b,...`` (method names and/or
numbers = fixed taus) when given, else the one from ``--settings FILE``,
``--tau X`` or ``--method M`` (explicit options override the file).

How tau is found per document (:func:`core.runs.methods.resolve`): ``none`` and fixed taus
as they are. A length-dependent method (log-length, InfoScale, Algorithm 1
pmax/entropy, Prop. 1/2, per-layer) whose stored schedule was chosen at this
document's token count (the settings' ``chosen_at``) uses the stored schedule;
at any other length it is re-resolved *for that document*
(:func:`core.runs.methods.resolve`: closed forms from its length; measured
methods with forward passes on it, Algorithm 1 in its fast search).

Batching: documents that share a tau (fixed taus, ``none``, or the same
resolved value) run together, sorted by length, right-padded with masks
(:func:`core.runs.engine.run_encoded`, stats-only probes); per-document taus
(measured methods, and closed forms whose tau differs by length) run one by
one. The model runs on CUDA with bf16 when present (:func:`core.models.load`).
"""

from __future__ import annotations

import csv
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from core.data import tasks
from core.errors import UserError
from core.experiments import csvio
from core.mechanics.probes import ProbeSpec
from core.mechanics.run_pass import Pass
from core.models import Loaded
from core.runs import engine, methods, timing
from core.values.choice import Choice
from core.values.schedule import Schedule
from core.values.validation import BatchSize, validate

if TYPE_CHECKING:  # Ray and the pool are imported only when a run uses them
    from core.experiments import cluster

COLUMNS = [
    "line",
    "id",
    "setting",
    "method",
    "tau",
    "tokens",
    "answer",
    "expected",
    "correct",
    "pmax",
    "entropy",
    "seconds",
]

MAX_LINE_BYTES = 16 * 2**20  # far beyond any document a model here can take (tokens <= bytes + 1 for ByT5)
MAX_DEPTH = 64  # JSON nesting: a document needs 1; checked before json.loads, which recurses per level
MAX_ID_CHARS = 1_000  # ids and expected answers are read back on --resume, whose CSV fields
MAX_EXPECTED_CHARS = 10_000  # are limited to csv.field_size_limit() (131,072 characters)


# -- input -----------------------------------------------------------------------


@dataclass
class Item:
    """One valid JSONL line: its document and token ids."""

    line: int  # 1-based
    id: str | None
    doc: tasks.Document
    ids: np.ndarray

    @property
    def key(self) -> tuple[str, str]:
        """What ``--resume`` matches: the id, else the line (kept apart, so an id "#5" is not line 5)."""
        return ("id", self.id) if self.id is not None else ("line", str(self.line))

    @property
    def n(self) -> int:
        return len(self.ids)


def parse_line(raw: str) -> tuple[str | None, tasks.Document] | None:
    """One JSONL line -> ``(id, Document)``; None for a blank line; :class:`UserError` saying what is wrong."""
    if len(raw) > MAX_LINE_BYTES:
        raise UserError(f"longer than {MAX_LINE_BYTES // 2**20} MiB")
    s = raw.strip()
    if not s:
        return None
    if _nesting(s) > MAX_DEPTH:
        raise UserError(f"nested deeper than {MAX_DEPTH} levels")
    try:
        obj = json.loads(s)
    except json.JSONDecodeError as err:
        raise UserError(f"not valid JSON ({err.msg} at column {err.colno})") from None
    except (ValueError, RecursionError) as err:  # e.g. an integer of over 4,300 digits
        raise UserError(f"not usable JSON ({str(err)[:80]})") from None
    if not isinstance(obj, dict):
        raise UserError(f"not a JSON object but {type(obj).__name__}")
    if "text" in obj and "context" in obj:
        raise UserError('give either "text" or "context" (+ "question"), not both')
    field = "context" if "context" in obj else "text"
    body = obj.get(field)
    if body is None:
        raise UserError('no "text" (or "context" + "question")')
    if not isinstance(body, str):
        raise UserError(f'"{field}" must be a string')
    if not body.strip():
        raise UserError(f'empty "{field}"')
    _check_text(field, body)
    question = obj.get("question")
    if question is not None and (not isinstance(question, str) or not question.strip()):
        raise UserError('"question" must be a non-empty string')
    if question is not None:
        _check_text("question", question)
    expected = obj.get("expected")
    if expected is not None:
        if isinstance(expected, bool) or not isinstance(expected, (str, int, float)):
            raise UserError('"expected" must be a string or a number')
        if isinstance(expected, float) and expected.is_integer():
            expected = int(expected)
        expected = _check_text("expected", str(expected), MAX_EXPECTED_CHARS)
    ident = obj.get("id")
    if ident is not None:
        if isinstance(ident, bool) or not isinstance(ident, (str, int)) or not str(ident).strip():
            raise UserError('"id" must be a non-empty string or an integer')
        ident = _check_text("id", str(ident), MAX_ID_CHARS)
    if question:
        doc = tasks.from_text(body, needle="", question=question, expected=expected)
    else:
        doc = tasks.Document(
            task="text",
            text=body,
            expected=expected or "",
            needle_span=(0, 0),
            question_span=(len(body), len(body)),
            depth=0.0,
            seed=0,
        )
    return ident, doc


def _check_text(field: str, text: str, limit: int | None = None) -> str:
    """A JSON string we pass on: no lone surrogate (a "\\ud800" escape cannot be written as UTF-8), within ``limit``."""
    if limit is not None and len(text) > limit:
        raise UserError(f'"{field}" is longer than {limit:,} characters')
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise UserError(f'"{field}" holds an unpaired surrogate escape at character {err.start + 1}') from None
    return text


def _nesting(s: str) -> int:
    """How deep ``[``/``{`` nest outside JSON strings: linear array ops, no recursion.

    Exact for valid JSON (a quote after an odd run of backslashes is escaped);
    for invalid JSON it may be off, and ``json.loads`` refuses that line anyway.
    """
    if s.count("[") + s.count("{") <= MAX_DEPTH:
        return 0
    b = np.frombuffer(s.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    idx = np.arange(len(b), dtype=np.int32)
    last_plain = np.maximum.accumulate(np.where(b == ord("\\"), np.int32(-1), idx))
    quotes = np.flatnonzero(b == ord('"'))
    prev = np.maximum(quotes - 1, 0)
    escapes = np.where(quotes > 0, prev - last_plain[prev], 0)  # backslashes right before each quote
    toggle = np.zeros(len(b), dtype=np.int8)
    toggle[quotes[escapes % 2 == 0]] = 1
    outside = np.cumsum(toggle, dtype=np.int32) % 2 == 0
    step = (np.isin(b, (ord("["), ord("{"))).astype(np.int8) - np.isin(b, (ord("]"), ord("}")))) * outside
    return int(np.cumsum(step, dtype=np.int32).max(initial=0))


def _lines(f: BinaryIO) -> Iterator[tuple[int, bytes | None]]:
    """``(line number, bytes)``; None for a line over :data:`MAX_LINE_BYTES`, skipped without holding it in memory."""
    lineno = 0
    while raw := f.readline(MAX_LINE_BYTES + 1):
        lineno += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = f.readline(2**20)
            yield lineno, None
        else:
            yield lineno, raw


def read_jsonl(path: str | Path, tokenizer, report: Callable[[str], None]) -> list[Item]:
    """Valid documents of a JSONL file; each bad line goes to ``report`` as ``"line N: why; skipped"``."""
    try:
        f = open(path, "rb")
    except OSError as err:
        raise UserError(f"Cannot read --data file: {err}") from None
    items: list[Item] = []
    first: dict[str, int] = {}
    with f:
        for lineno, raw in _lines(f):
            try:
                if raw is None:
                    raise UserError(f"longer than {MAX_LINE_BYTES // 2**20} MiB")
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise UserError(f"not UTF-8 text (byte {err.start + 1})") from None
                if lineno == 1:
                    text = text.lstrip("\ufeff")  # a byte-order mark some editors write
                parsed = parse_line(text)
                if parsed is None:
                    continue
                ident, doc = parsed
                if ident is not None and ident in first:
                    raise UserError(f"duplicate id {ident!r} (first on line {first[ident]})")
            except (UserError, ValueError) as err:
                report(f"line {lineno}: {err}; skipped")
                continue
            if ident is not None:
                first[ident] = lineno
            items.append(Item(lineno, ident, doc, np.asarray(tokenizer(doc.text).input_ids, dtype=np.int64)))
    return items


# -- settings --------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One setting of a batch run: a label for the CSV and how to get tau (named apart from
    :class:`core.values.choice.Choice`, the run's value it resolves into: a setting becomes a Choice per document,
    or per padded batch sharing one tau)."""

    label: str
    method: str
    tau: Schedule | None = None  # stored / fixed schedule
    chosen_at: int | None = None  # tokens the stored schedule was resolved at
    #: the method's own number (``(("gamma", 0.2),)``: the CLI's --gamma), as pairs so the choice stays hashable
    params: tuple[tuple[str, float], ...] = ()

    def resolve(self, loaded: Loaded, it: "Item", samples: int) -> tuple[Schedule, dict]:
        """This choice's schedule for one document (:func:`core.runs.methods.resolve`, with its own number)."""
        return methods.resolve(
            loaded,
            it.doc,
            self.method,
            self.tau,
            samples,
            chosen_at=self.chosen_at,
            tokens=it.n,
            params=dict(self.params) or None,
        )


def _label(method: str, tau: Schedule | None) -> str:
    """A choice's text in the CSV: the method's one spelling (:func:`core.runs.methods.spell`); a fixed schedule of
    more than one number has no such text."""
    if methods.get(method).takes_value and Schedule.of(tau).scalar is None:
        return "fixed-schedule"
    return methods.spell(method, tau)


def choices(args, settings) -> list[Setting]:
    """The settings to run: ``--methods`` when given, else the merged ``--settings``/``--tau``/``--method``. A
    ``--gamma`` (``args.params_``) goes to the methods that take it, named in their label (``critical:gamma=0.2``)
    and re-resolving the method even where the settings file stored a tau (as ``run --gamma`` does)."""
    spec = getattr(args, "methods", None)
    given = getattr(args, "params_", None) or {}

    def choice(name: str, value: Schedule | None, label: str, chosen_at: int | None = None) -> Setting:
        own = methods.own_params(name, given)
        if own:
            return Setting(methods.cell_text(label, given), name, None, None, tuple(own.items()))
        return Setting(label, name, value, chosen_at)

    if spec:
        out = []
        for m in (p.strip() for p in spec.split(",")):
            if not m:
                continue
            try:
                name, value = methods.parse(m)
            except ValueError as err:
                raise UserError(str(err)) from None
            out.append(choice(name, value, methods.spell(name, value)))
        if not out:
            raise UserError("--methods is empty")
        return out
    if methods.get(settings.method).takes_value and settings.tau is None:
        raise UserError(f"Method '{settings.method}' needs a tau (--tau)")
    return [choice(settings.method, settings.tau, _label(settings.method, settings.tau), settings.chosen_at)]


def _needs_passes(item: Item, c: Setting) -> bool:
    stored = c.tau is not None and c.chosen_at == item.n  # chosen at this very length: used as it is
    return methods.get(c.method).measured and not stored


def _tau_key(tau) -> tuple:
    s = Schedule.of(tau)
    return (s.ndim,) + s.key()


def _tau_cell(tau) -> str:
    s = Schedule.of(tau)
    if s.ndim < 0:  # a tau per query row (a position's, or adaptive temperature's): its JSON dict
        return json.dumps(s.to_json())
    a = np.asarray(s.to_json(), dtype=float)
    if a.ndim == 0 or np.all(a == a.flat[0]):
        return f"{float(a.flat[0]):.6g}"
    return json.dumps(np.round(a, 6).tolist())


# -- output ----------------------------------------------------------------------


def _row_key(row: dict[str, str]) -> tuple[tuple[str, str], str]:
    """The (item key, setting) a written row stands for (cells restored by :mod:`core.experiments.csvio`)."""
    item = ("id", row["id"]) if row["id"] else ("line", row["line"])
    return item, row["setting"]


# -- running ---------------------------------------------------------------------


def _batches(items: list[Item], batch_size: int) -> list[list[Item]]:
    """Length-sorted runs of at most ``batch_size`` items, split where the longest would exceed twice the shortest."""
    out: list[list[Item]] = []
    for it in sorted(items, key=lambda i: i.n):
        if out and len(out[-1]) < batch_size and (it.n <= 2 * out[-1][0].n or it.n <= 256):
            out[-1].append(it)
        else:
            out.append([it])
    return out


def run_items(
    loaded: Loaded,
    items: list[Item],
    settings_list: list[Setting],
    out: str | Path | None = None,
    resume: bool = False,
    batch_size: int = 8,
    max_new_tokens: int = tasks.MAX_ANSWER_TOKENS,
    targets: tuple[str, ...] = ("encoder",),
    cosine_scale: float | None = None,
    samples: int = 1,
    report: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
    progress: Callable[[int], None] | None = None,
    pool: "cluster.RayEngine | None" = None,
    tracker: "cluster.Tracker | None" = None,
) -> dict:
    """Run every (item, setting) not yet in ``out``; write each row as it finishes.

    Returns counts: ``written``, ``skipped`` (already done), ``failed``.
    ``progress(k)`` is called with the number of rows just handled.

    The work is cut into jobs (:func:`_jobs`: a padded batch sharing one tau,
    or one document whose tau is its own) that run here in the order built, or
    on ``pool`` (a :class:`core.experiments.cluster.RayEngine`) heaviest first; each job
    is :func:`_run_job` either way and every row is written here, so the rows
    are the same. On Ray a job that fails twice is reported per document
    (counted ``failed``) and the run goes on.
    """
    from core.experiments import cluster

    _check_batch_size(batch_size)
    path = Path(out) if out else None
    if resume and path is None:
        raise UserError("--resume needs --out FILE")
    model = None
    if pool is not None:
        model = pool.model_ref(loaded)
        pool.prepare(model)  # every actor loads the model before the CSV is touched
    track = tracker or cluster.NO_TRACKER
    with csvio.ResultCSV(path, COLUMNS, "batch-run", resume=resume, stream=None if path else sys.stdout) as sink:
        done = {_row_key(r) for r in sink.rows}
        counts = {"written": 0, "skipped": 0, "failed": 0}
        base = (
            Choice.of(targets=tuple(targets), cosine_scale=cosine_scale),  # a run's two values, tau aside
            Pass(probes=ProbeSpec.stats_only(), max_new_tokens=max_new_tokens),
        )
        tick = progress or (lambda k: None)

        def fail(its: list[tuple[int, str | None]], label: str, err: str) -> None:
            for line, ident in its:
                report(f"line {line}{f' (id {ident})' if ident else ''}, setting {label}: {err}; skipped")
            counts["failed"] += len(its)
            tick(len(its))

        def outcome(job: cluster.Job, result: list[tuple]) -> None:
            """The one writer: each job's rows (and per-document failures), local or from an actor."""
            rows = 0
            for kind, what, *rest in result:
                if kind == "row":
                    sink.write(what)
                    counts["written"] += 1
                    rows += 1
                    tick(1)
                else:
                    fail([what], job.payload[1].label, rest[0])
            track.advance(1, rows)

        jobs = _jobs(loaded, items, settings_list, done, batch_size, samples, base, model, counts, tick, fail)
        workers = pool.workers if pool is not None else 1
        same_device = pool is None or (pool.on_cpu and loaded.device.type == "cpu")
        seconds = cluster.estimate(jobs, timing.model_key(loaded), workers) if same_device else None
        track.start(
            len(jobs),
            sum(len(j.payload[3]) for j in jobs),
            seconds,
            pool.where if pool is not None else "in this process",
        )
        if pool is None:
            cluster.run_local(jobs, loaded, outcome)
        else:

            def on_fail(job: cluster.Job, why: str) -> None:
                fail([(it.line, it.id) for it in job.payload[3]], job.payload[1].label, why)
                track.advance(1, 0)

            pool.run(jobs, outcome, on_fail)
        return counts


def _jobs(
    loaded: Loaded,
    items: list[Item],
    settings_list: list[Setting],
    done: set,
    batch_size: int,
    samples: int,
    base: tuple[Choice, Pass],
    model,
    counts: dict,
    tick: Callable[[int], None],
    fail: Callable[[list[tuple[int, str | None]], str, str], None],
) -> list["cluster.Job"]:
    """The (item, setting) pairs not in ``done`` as jobs, in the order a local run takes them.

    Per setting: documents that share a tau (resolved here: ``none``, fixed
    taus and closed forms need no pass) in padded batches (:func:`_batches`);
    then documents whose tau is their own (measured methods), one job each,
    shortest first. Skipped pairs are counted here, and so are documents
    whose tau cannot be resolved."""
    from core.experiments import cluster

    jobs: list[cluster.Job] = []
    for c in settings_list:
        todo = []
        for it in items:
            if (it.key, c.label) in done:
                counts["skipped"] += 1
                tick(1)
            else:
                todo.append(it)
        shared: dict[tuple, tuple[object, list[Item]]] = {}
        single: list[Item] = []
        for it in todo:
            if _needs_passes(it, c):
                single.append(it)
                continue
            try:
                tau, _ = c.resolve(loaded, it, samples)
            except UserError as err:
                fail([(it.line, it.id)], c.label, str(err))
                continue
            shared.setdefault(_tau_key(tau), (tau, []))[1].append(it)
        for tau, group in shared.values():
            for batch in _batches(group, batch_size):
                jobs.append(
                    cluster.Job(
                        _run_job,
                        (base, c, tau, batch, samples),
                        _job_label(c, batch),
                        passes=tuple((1, it.n) for it in batch),
                        answers=tuple((1, it.n) for it in batch),
                        model=model,
                    )
                )
        for it in sorted(single, key=lambda i: i.n):
            passes = timing.sweep_passes(
                [it.n], 1, methods.costs([c.method], loaded.n_layers, loaded.n_heads, samples), loaded.train_length
            )  # its own calibration (an upper bound), then its run
            jobs.append(
                cluster.Job(
                    _run_job,
                    (base, c, None, [it], samples),
                    _job_label(c, [it]),
                    passes=tuple(passes),
                    answers=((1, it.n),),
                    model=model,
                )
            )
    return jobs


def _job_label(c: Setting, batch: list[Item]) -> str:
    lines = [it.line for it in batch]
    where = (
        f"line {lines[0]}"
        if len(lines) == 1
        else f"lines {', '.join(map(str, lines[:4]))}{', ...' if len(lines) > 4 else ''}"
    )
    return f"{where}, setting {c.label}"


def _run_job(loaded: Loaded, payload: tuple) -> list[tuple]:
    """One job of a batch run: ``[("row", row) | ("fail", (line, id), why)]``.

    ``tau`` None: the document's own tau is resolved first (its seconds
    are added to its row). A batch too long for memory as a whole (or with
    NaN) is retried one document at a time; a document that still fails is a
    ``"fail"`` entry, so the rest of the batch is kept."""
    base, c, tau, batch, samples = payload
    extra_s = 0.0
    if tau is None:
        (it,) = batch
        t0 = time.perf_counter()
        try:
            tau, _ = c.resolve(loaded, it, samples)
        except UserError as err:
            return [("fail", (it.line, it.id), str(err))]
        extra_s = time.perf_counter() - t0
    return _run_batch(loaded, base, c, tau, batch, extra_s)


def _run_batch(
    loaded: Loaded, base: tuple[Choice, Pass], c: Setting, tau, batch: list[Item], extra_s: float
) -> list[tuple]:
    encs = [engine.Encoded(it.ids, np.zeros((it.n, 2), dtype=np.int64), None, None) for it in batch]
    try:
        results = engine.run_encoded(
            loaded, [it.doc for it in batch], encs, base[0].with_(tau=tau, method=c.method), base[1]
        )
    except UserError as err:  # too long for memory as a batch, NaN, ...: retry one by one
        if len(batch) == 1:
            return [("fail", (batch[0].line, batch[0].id), str(err))]
        return [r for it in batch for r in _run_batch(loaded, base, c, tau, [it], 0.0)]
    return [
        (
            "row",
            {
                "line": it.line,
                "id": it.id or "",
                "setting": c.label,
                "method": c.method,
                "tau": _tau_cell(tau),
                "tokens": res.tokens,
                "answer": res.answer,
                "expected": res.expected,
                "correct": "" if res.correct is None else bool(res.correct),
                "pmax": round(res.pmax, 5),
                "entropy": round(res.entropy, 5),
                "seconds": round(res.seconds["total"] + extra_s, 4),
            },
        )
        for it, res in zip(batch, results)
    ]


def _check_batch_size(batch_size) -> int:
    return validate(BatchSize, batch_size, "--batch-size")  # the CLI's bound (core.values.validation)


def summary(path: Path) -> str:
    """Rows and accuracy per setting of a batch CSV, as a few lines of text."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    lines = [f"{path}: {len(rows)} rows"]
    by: dict[str, list] = {}
    for r in rows:
        by.setdefault(r["setting"], []).append(r)
    for label, rs in by.items():
        scored = [r["correct"] == "True" for r in rs if r["correct"] != ""]
        acc = f"accuracy {100 * np.mean(scored):.1f}% of {len(scored)} scored" if scored else "no expected answers"
        taus = [_mean_tau(r["tau"], r["tokens"]) for r in rs]
        lines.append(f"  {label}: {len(rs)} documents, {acc}, mean tau {np.mean(taus):.4g}")
    return "\n".join(lines)


def _mean_tau(cell: str, tokens: str) -> float:
    """A row's tau cell as one number; a per-row schedule's (a JSON dict) is its mean over the row's tokens."""
    if cell.startswith("{"):
        return Schedule.of(json.loads(cell)).mean(int(tokens))
    return float(np.mean(json.loads(cell))) if cell.startswith("[") else float(cell)


def run_jsonl(loaded: Loaded, args, settings, pool: "cluster.RayEngine | None" = None) -> int:
    """``python -m core sweep --data FILE.jsonl ...``: see the module docstring. Returns the exit status.

    ``pool``: run the jobs on these Ray actors (``--engine ray``) instead of here."""
    from tqdm import tqdm

    from core.experiments import cluster

    batch_size = _check_batch_size(8 if getattr(args, "batch_size", None) is None else args.batch_size)
    if args.out:
        csvio.check_out(Path(args.out))  # before reading (and tokenising) the whole --data file
    bad: list[str] = []

    def report(msg: str) -> None:
        bad.append(msg)
        tqdm.write(msg, file=sys.stderr)

    items = read_jsonl(args.data, loaded.tokenizer, report)
    n_bad = len(bad)
    if not items:
        raise UserError(f"No usable documents in {args.data} ({len(bad)} bad line(s))")
    settings_list = choices(args, settings)
    if pool is None or pool.on_cpu:  # one timed pass, so the sentence before the run can say how long
        shortest = min(items, key=lambda it: it.n)
        cluster.time_a_pass(loaded, lambda: shortest.doc)
    bar = cluster.Bar("batch")  # drawn when the run starts, so a refused --out (e.g. locked) prints one line only
    try:
        counts = run_items(
            loaded,
            items,
            settings_list,
            out=args.out,
            resume=bool(getattr(args, "resume", False)),
            batch_size=batch_size,
            max_new_tokens=int(getattr(args, "max_new_tokens", None) or tasks.MAX_ANSWER_TOKENS),
            targets=settings.targets,
            cosine_scale=settings.cosine_scale,
            samples=max(1, int(getattr(args, "samples", 1) or 1)),
            report=report,
            pool=pool,
            tracker=bar,
        )
    finally:
        bar.close()
    msg = (
        f"{counts['written']} rows written, {counts['skipped']} already done, {counts['failed']} failed, "
        f"{n_bad} bad line(s) skipped"
    )
    if args.out:
        print(summary(Path(args.out)))
        print(msg)
    else:
        print(msg, file=sys.stderr)
    return 0
