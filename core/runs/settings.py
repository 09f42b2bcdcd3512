"""What a run asks for, as one small serialisable object.

:class:`Settings` is the contract between the app's export, the CLI
(``--settings FILE``), sweeps and :func:`core.runs.apply`: the model, the document
request, how tau is chosen (method, criterion) and the schedule it resolved
to at the length it was chosen at. A length-dependent method can be resolved
again at another length (:func:`core.runs.methods.resolve`); a fixed schedule is
used as is. :class:`Settings` is the file's schema only: :meth:`Settings.to_choice` is its one
conversion to the :class:`~core.values.choice.Choice` a run carries (how the run goes, probes and
generation, is the caller's :class:`~core.mechanics.run_pass.Pass`).

Both classes are frozen pydantic dataclasses: constructing one, from the
exported JSON (:meth:`Settings.from_dict`), from CLI options or in the app,
runs the same validator (types, finite numbers, the bounds of
:mod:`core.values.validation`), and a bad value is a one-line
:class:`~core.errors.UserError` naming the field. The memory check needs the
model, so it happens in :meth:`DocumentRequest.build_for`, before the
document is made.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from core.data import tasks
from core.errors import InputTooLong, UserError
from core.kinds import ENCODER
from core.runs import methods
from core.runs.temperature import CRITERIA
from core.values import positions
from core.values.choice import Choice, targets_of
from core.values.schedule import ONE
from core.values.validation import (
    CHARS_PER_TOKEN,
    Depth,
    Name,
    Positive,
    Seed,
    Tau,
    Text,
    Tokens,
    TrainLength,
    one_line,
    read_json,
    user_errors,
)

if TYPE_CHECKING:
    from core.models import Loaded

SCHEMA = "attention-alignment-explorer/settings@1"
_CONFIG = ConfigDict(extra="forbid")

Task = Literal[tasks.GENERATED + ("text",)]  # type: ignore[valid-type]
Haystack = Literal[tasks.HAYSTACKS]  # type: ignore[valid-type]
Method = Literal[methods.NAMES]  # type: ignore[valid-type]
Criterion = Literal[CRITERIA]  # type: ignore[valid-type]
# checked by the one rule of targets (core.values.choice.targets_of: a lone string is one target, never its letters)
Targets = Annotated[tuple[str, ...], BeforeValidator(targets_of)]


#: The tasks whose filler can be a corpus pool (``haystack``): the record tasks with prose, and lm (its prefix).
HAYSTACK_TASKS: tuple[str, ...] = tasks.HAYSTACK_TASKS + (tasks.LM,)
#: The fields only the user's own text reads.
TEXT_FIELDS: tuple[str, ...] = ("text", "needle", "question", "expected")


def unused(task: str, needle: str | None, given: Iterable[str]) -> list[str]:
    """The fields among ``given`` that a request of ``task`` (with this ``needle``) would not read.

    Why: issue 36 found ``--haystack corpus-eval --task code`` running with
    exit 0 and the option silently dropped; an option that changes nothing
    looks like one that worked. Every field here is read by some task: this
    is the one table of which. ``task`` and ``seed`` are read by every task.
    """
    if task == "text":
        reads = {"depth", *TEXT_FIELDS} if needle != "" else set(TEXT_FIELDS)  # needle "": nothing is inserted
    else:
        reads = {"tokens"} | ({"depth"} if task not in ("topic", tasks.LM) else set())
        reads |= {"haystack"} if task in HAYSTACK_TASKS else set()
    return [f for f in given if f not in reads and f not in ("task", "seed")]


def why_unused(task: str, needle: str | None, field_name: str) -> str:
    """Why ``field_name`` does nothing for ``task`` (a few words, for the one-line refusal)."""
    if field_name in TEXT_FIELDS:
        return f"only task 'text' (your own text) reads it; {task} generates its document"
    if field_name == "tokens":
        return "your own text is as long as it is"
    if field_name == "haystack":
        return f"only {', '.join(HAYSTACK_TASKS)} take a filler; " + (
            "your text is its own" if task == "text" else f"{task} always uses its own"
        )
    if field_name == "depth":
        return {
            "topic": "topic always asks about the first conversation",
            tasks.LM: "an lm sequence has no needle",
        }.get(task, "with an empty needle nothing is inserted")
    return "it is not used"


@user_errors
@dataclass(frozen=True, config=_CONFIG)
class DocumentRequest:
    """A document to build: a generated task, or the user's own text with an optional needle."""

    task: Task = "passkey"
    tokens: Tokens | None = None  # None: the model's L_tr
    depth: Depth = 0.5
    seed: Seed = 0
    # the filler of passkey / topic / multidoc: "default" (the task's own; the pass key's is the paper's one
    # fixed text, so its documents differ only in the key) or a corpus pool (every seed another haystack)
    haystack: Haystack = "default"
    text: Text | None = None  # task "text" only
    needle: Text | None = None
    question: Text | None = None
    expected: Text | None = None

    def __post_init__(self) -> None:
        """Refuse a field that is set but that this task does not read (see :func:`unused`).

        Only fields whose default means "not given" are checked here (tokens,
        haystack, text, needle, question, expected): the app sends its depth
        and seed for every task, so a depth is refused only where a person
        gave it explicitly (the CLI's ``--depth``, :func:`unused`).
        """
        given = [f for f in ("tokens", *TEXT_FIELDS) if getattr(self, f) is not None]
        given += ["haystack"] if self.haystack != "default" else []
        bad = unused(self.task, self.needle, given)
        if bad:
            values = ", ".join(f"{f} {getattr(self, f)!r}"[:60] for f in bad)
            raise ValueError(
                f"{values}: not used by task {self.task!r} ({why_unused(self.task, self.needle, bad[0])}); "
                f"leave {'it' if len(bad) == 1 else 'them'} out"
            )

    def for_task(self, task: str) -> "DocumentRequest":
        """A request of ``task`` keeping what of this one the new task reads (the rest at the defaults).

        Why: an explicit ``--task`` overrides a settings file's; the file's
        text or corpus filler, meant for its own task, must not turn into a
        refusal of an option the person never gave.
        """
        keep = {"depth", "tokens", "haystack", *TEXT_FIELDS}
        needle = self.needle if task == "text" else None
        return DocumentRequest(
            task=task, seed=self.seed, **{f: getattr(self, f) for f in keep if f not in unused(task, needle, [f])}
        )

    def length(self, train_length: int) -> int:
        """Tokens a generated document will have (the request, else L_tr)."""
        return int(self.tokens or train_length)

    def chars(self) -> int:
        """Characters of the pasted text and what is inserted into it."""
        return sum(len(s) for s in (self.text, self.needle, self.question) if s)

    def build(self, tokenizer, train_length: int, limit: int | None = None) -> tasks.Document:
        """Make the document (raises UserError on empty text, too few tokens, or more than ``limit`` tokens).

        ``limit`` (tokens) is checked before anything is generated or
        tokenised: a generated document by its requested length, a pasted
        text by its characters (at most :data:`CHARS_PER_TOKEN` per token).
        """
        if limit is not None:
            self._check(train_length, limit)
        try:
            if self.task == "text":
                if not self.text or not self.text.strip():
                    raise UserError("The text is empty: paste some text (or upload a .txt file) first.")
                return tasks.from_text(
                    self.text,
                    tokenizer,
                    needle=self.needle,
                    question=self.question,
                    expected=self.expected,
                    depth=self.depth,
                    seed=self.seed,
                )
            return tasks.make(
                self.task,
                tokenizer,
                self.length(train_length),
                depth=self.depth,
                seed=self.seed,
                haystack=self.haystack,
            )
        except UserError:
            raise
        except ValueError as err:
            raise UserError(str(err)) from None

    def build_for(self, loaded: "Loaded", batch: int = 1) -> tasks.Document:
        """:meth:`build` for a loaded model, refused first if it (``batch`` such documents at once,
        as calibration runs its samples) cannot fit this machine's memory now."""
        from core.runs import engine

        return self.build(loaded.tokenizer, loaded.train_length, limit=engine.max_tokens(loaded, batch))

    def _check(self, train_length: int, limit: int) -> None:
        if self.task == "text":
            if self.chars() > CHARS_PER_TOKEN * limit:
                raise InputTooLong(
                    f"The text has {self.chars():,} characters, more than this machine can run now "
                    f"(about {limit:,} tokens, so at most ~{CHARS_PER_TOKEN * limit:,} characters). Use a shorter text."
                )
        elif self.length(train_length) > limit:
            what = "" if self.tokens else " (the default: the model's training length L_tr)"
            head = (
                f"The document would be {self.length(train_length):,} tokens{what}; this machine can run at most "
                f"about {limit:,} tokens now. Use a shorter document"
            )
            raise InputTooLong(f"{head} (--tokens).", app=f"{head} (the Length in tokens box).")


@user_errors
@dataclass(frozen=True, config=_CONFIG)
class Settings:
    """A chosen temperature and where it was chosen (the exported JSON)."""

    model: Name | None = None
    train_length: TrainLength | None = None
    method: Method = methods.AS_TRAINED
    tau: Tau | None = (
        None  # the schedule (core.values.schedule.Schedule): number, per layer, per layer and head, per row
    )
    criterion: Criterion = "pmax"
    targets: Targets = (ENCODER,)
    cosine_scale: Positive | None = None
    chosen_at: Tokens | None = None  # tokens of the document tau was resolved on
    document: DocumentRequest = field(default_factory=DocumentRequest)
    # the position scheme of a rotary model (core.values.positions: a name) and its parameters (numbers, by name);
    # bound per pass to that pass's length. Files from before schemes carry neither: the plain scheme.
    scheme: str = positions.PLAIN
    scheme_params: dict[str, Any] = field(default_factory=dict)  # checked by core.values.positions.Scheme.of
    # the method's own numbers by name (core.runs.methods.Param: critical scaling's gamma), checked by
    # methods.check_params: what the method is resolved with again at another length than chosen_at (or when the
    # file stores no tau). Files from before carry none: the default from L_tr.
    method_params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if methods.REGISTRY[self.method].takes_value and self.tau is None:
            raise ValueError(f"Method '{self.method}' needs a tau")
        try:  # a number the method does not take would change nothing: refused, as the CLI refuses --gamma
            object.__setattr__(
                self, "method_params", methods.check_params(self.method_params, [self.method], "method_params")
            )
        except UserError as err:
            raise ValueError(str(err)) from None
        try:  # parsed once (the one parser, Scheme.of); a refusal names the field at fault
            scheme = positions.Scheme.of(self.scheme, self.scheme_params)
        except UserError as err:
            try:
                positions.Scheme.of(self.scheme)  # the name alone: is it the name or its parameters?
            except UserError as name_err:
                raise ValueError(f"scheme: {name_err}") from None
            raise ValueError(f"scheme_params: {err}") from None
        if self.train_length is not None:  # the scheme's defaults at this L_tr must be usable too
            try:
                scheme.bind(self.train_length, self.train_length)
            except UserError as err:
                raise ValueError(f"scheme_params: {err}") from None
        constant = methods.REGISTRY[self.method].constant
        # the one value a pass carries (see core.values.choice), made here once: Settings is frozen, so it cannot go stale
        object.__setattr__(
            self,
            "_choice",
            Choice(
                self.method,
                self.tau or constant or ONE,
                tuple(self.targets),
                None if self.cosine_scale is None else float(self.cosine_scale),
                scheme,
                tuple(sorted((k, float(v)) for k, v in self.method_params.items())),
            ),
        )

    def to_choice(self, schedule: Any = None) -> Choice:
        """What these settings ask of the attention, as the one :class:`~core.values.choice.Choice` a run carries:
        the one conversion from the file's schema that the CLI, the app and ``core.runs.apply`` use.

        ``schedule``: the tau the method resolved to for the document at hand
        (:func:`core.runs.methods.resolve`); by default the stored one (1 for
        ``none``). The choice was made once, when these settings were (they are frozen, so it cannot go stale),
        and is handed on as that same object whenever the tau is the stored one."""
        constant = methods.REGISTRY[self.method].constant
        tau = schedule if schedule is not None else constant if constant is not None else self.tau
        if tau is None:
            raise UserError(
                f"The settings hold method '{self.method}' but no resolved tau: resolve it in the app (or with "
                "`python -m core calibrate`) before exporting, or give tau/schedule."
            )
        return self._choice.with_(tau=tau)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["targets"] = list(self.targets)
        d["tau"] = None if self.tau is None else self.tau.to_json()
        d["scheme"], d["scheme_params"] = self._choice.scheme.name, self._choice.scheme.param_dict  # the typed values
        return {"schema": SCHEMA, **d}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: Any, where: str = "Settings") -> "Settings":
        """Validate a parsed settings JSON (any JSON value) into Settings, or a one-line UserError."""
        if not isinstance(d, dict):
            kind = "null" if d is None else type(d).__name__
            raise UserError(f"{where}: the top level must be a JSON object, got {kind}")
        d = dict(d)
        schema = d.pop("schema", SCHEMA)
        if schema != SCHEMA:
            raise UserError(f"{where}: schema {str(schema)[:80]!r} is not '{SCHEMA}'")
        if d.get("document") is None:
            d.pop("document", None)  # null: the default document
        method = d.get("method")
        if isinstance(method, str) and method.startswith(methods.FIXED_PREFIX):  # "tau=0.8": a fixed tau in one text
            try:
                d["method"], tau = methods.parse(method)
            except ValueError as err:
                raise UserError(f"{where}: method: {err}") from None
            if d.setdefault("tau", tau.to_json()) != tau.to_json():
                raise UserError(f"{where}: method {method!r} and tau {d['tau']!r} disagree")
        try:
            return _ADAPTER.validate_python(d)
        except ValidationError as err:
            raise UserError(f"{where}: {one_line(err)}") from None

    @classmethod
    def load(cls, path: str | Path) -> "Settings":
        return cls.from_dict(read_json(path, "Settings file", unique_keys=True), where=f"Settings file {path}")


_ADAPTER = TypeAdapter(Settings)  # validates a dict (the JSON) into Settings, nested DocumentRequest included
