"""Types and bounds for everything a user can hand us, and one-line errors for them.

Why one module: the settings JSON, a model's ``card.json`` and the CLI's
options describe the same quantities (a length in tokens, a needle depth, a
tau), so their types and bounds are written once here, as pydantic
``Annotated`` types, and every entry point validates through them. A
pydantic ``ValidationError`` never leaves ``core``: :func:`validate` and
:func:`user_errors` turn it into a :class:`~core.errors.UserError` whose
message is one line naming the field (``document.depth: Input should be a
valid number (got '0.5')``), without pydantic's URL.

The bounds are static ceilings that hold before any model is loaded; the
memory check (:func:`core.runs.engine.max_tokens`) comes on top, once the model
is known, and always before a document is built.
"""

from __future__ import annotations

import json
import numbers
import operator
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer, TypeAdapter, ValidationError

from core.errors import UserError
from core.values.schedule import Schedule

#: Longest document, sweep length or training length anywhere (tokens). The
#: app's length box stops here too; T5's ``[heads, L, L]`` bias at this length
#: would be ~64 TB per head, so a longer request can only be a mistake.
MAX_LENGTH = 4_000_000
#: Longest relative-position-bias curve (``rpe --length``): heads x keys
#: floats plus a CSV row per key; T5's bias is constant past 128 tokens anyway.
MAX_RPE_LENGTH = 1_000_000
#: Longest pasted text / needle / question, in characters (before tokenising).
MAX_TEXT_CHARS = 16_000_000
#: A tokenizer puts at most this many characters of real text into one token
#: on average; a text longer than ``CHARS_PER_TOKEN x`` the token limit is
#: refused without tokenising it.
CHARS_PER_TOKEN = 16
#: Largest JSON file we read (settings, card): a settings file may carry a pasted text.
MAX_JSON_BYTES = 4 * MAX_TEXT_CHARS + 2**20
MAX_SAMPLES = 1_000  # documents per calibration / seeds per sweep cell: each is a full pass
MAX_SEQUENCES = 100_000  # perplexity: sequences per length (each a distinct seed)
MAX_BATCH = 1_024  # documents per padded batch (--batch-size)
MAX_NEW_TOKENS = 4_096  # answer length (--max-new-tokens)
MAX_SEED = 2**63 - 1


# -- scalar types ------------------------------------------------------------------


def _whole(v: Any) -> int:
    """A whole number, never a bool, str or float (JSON ``"512"`` or ``512.5`` is a mistake, not a length)."""
    if isinstance(v, bool):
        raise ValueError("Input should be a whole number, not true/false")
    try:
        return operator.index(v)  # numpy integers too
    except TypeError:
        raise ValueError("Input should be a whole number") from None


def _real(v: Any) -> float:
    """A real number (int or float, numpy's too), never a bool or a string."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError("Input should be a number")
    try:
        return float(v)
    except OverflowError:  # a whole number of 400 digits: no float holds it
        raise ValueError(f"Input should be a finite number, got {_short(v)}") from None


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError("Input should be a string")
    return v


Whole = Annotated[int, BeforeValidator(_whole)]
Real = Annotated[float, BeforeValidator(_real), Field(allow_inf_nan=False)]
Str = Annotated[str, BeforeValidator(_text)]
Text = Annotated[Str, Field(max_length=MAX_TEXT_CHARS)]
Name = Annotated[Str, Field(min_length=1, max_length=4096)]

Tokens = Annotated[Whole, Field(ge=1, le=MAX_LENGTH)]
TrainLength = Annotated[Whole, Field(ge=2, le=MAX_LENGTH)]
RpeLength = Annotated[Whole, Field(ge=1, le=MAX_RPE_LENGTH)]
Position = Annotated[Whole, Field(ge=0, le=MAX_RPE_LENGTH)]
Seed = Annotated[Whole, Field(ge=0, le=MAX_SEED)]
Samples = Annotated[Whole, Field(ge=1, le=MAX_SAMPLES)]
Sequences = Annotated[Whole, Field(ge=1, le=MAX_SEQUENCES)]  # held-out sequences per length (perplexity)
BatchSize = Annotated[Whole, Field(ge=1, le=MAX_BATCH)]
NewTokens = Annotated[Whole, Field(ge=1, le=MAX_NEW_TOKENS)]
Depth = Annotated[Real, Field(ge=0.0, le=1.0)]
Positive = Annotated[Real, Field(gt=0.0)]  # a tau, a CosScale s, a length multiple
Bytes = Annotated[Whole, Field(ge=1)]  # a memory budget, e.g. the attention's block size


#: A tau schedule in a settings file or an option: :meth:`core.values.schedule.Schedule.of` is its one check
#: (bounds :data:`core.values.schedule.TAU_MIN` .. ``TAU_MAX``); JSON gets it back as :meth:`Schedule.to_json` writes it.
Tau = Annotated[Any, AfterValidator(Schedule.of), PlainSerializer(lambda s: s.to_json())]


# -- evaluation plans ------------------------------------------------------------------------


def held_out_plan(plan: Any, where: str, method_text: Callable[[Any], str], **more: Any) -> Any:
    """A held-out evaluation plan (perplexity, masked tokens) checked once: its methods in their one spelling
    (``method_text``: :func:`core.runs.methods.method_label`), lengths, sequences, seeds, calibration samples and
    batch size within their bounds, ``more`` (field -> type) too, and calibration seeds disjoint from the
    scored ones (no method may be tuned on what it is scored on). Returns the plan with the checked values,
    or raises a :class:`UserError` naming the option."""
    from dataclasses import replace

    try:
        names = [method_text(m) for m in plan.methods]
    except ValueError as err:
        raise UserError(f"{where}: {err}") from None
    checked = {
        name: validate(tp, getattr(plan, name), f"{where}: {name}")
        for name, tp in {
            "lengths": list[Tokens],
            "sequences": Sequences,
            "seed": Seed,
            "calib_seed": Seed,
            "calib_samples": Samples,
            "batch_size": BatchSize,
            **more,
        }.items()
        if getattr(plan, name) is not None
    }
    plan = replace(plan, methods=names, **checked)
    if plan.calib_seed < plan.seed + plan.sequences and plan.seed < plan.calib_seed + plan.calib_samples:
        raise UserError(
            f"{where}: calibration seeds {plan.calib_seed}.. overlap the scored seeds "
            f"{plan.seed}..{plan.seed + plan.sequences - 1}; no method may be tuned on what it is scored on"
        )
    return plan


# -- errors as one line ------------------------------------------------------------------


def _short(value: Any, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def one_line(err: ValidationError) -> str:
    """The first problem as ``field.path: reason (got value)``; ``(+N more)`` when there are others."""
    first = err.errors(include_url=False)[0]
    kind, got = first["type"], first.get("input")
    where = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind in ("dataclass_type", "model_type", "dict_type"):
        msg = f"Input should be a JSON object, got {'null' if got is None else type(got).__name__}"
    elif kind in ("unexpected_keyword_argument", "extra_forbidden"):
        msg = "unknown key"
    elif "got " not in msg and kind != "missing" and isinstance(got, (str, int, float)):
        msg += f" (got {_short(got)})"
    extra = err.error_count() - 1
    text = f"{where}: {msg}" if where else msg
    return " ".join((text + (f" (+{extra} more)" if extra else "")).split())  # one line, whatever the message held


T = TypeVar("T")
_ADAPTERS: dict[Any, TypeAdapter] = {}


def adapter(tp: Any) -> TypeAdapter:
    """One cached TypeAdapter per type (building one costs ~a millisecond)."""
    key = repr(tp) if not isinstance(tp, type) else tp
    if key not in _ADAPTERS:
        _ADAPTERS[key] = TypeAdapter(tp)
    return _ADAPTERS[key]


def validate(tp: Any, value: Any, where: str) -> Any:
    """``value`` as type ``tp``, or a UserError ``"<where>: <field>: <reason>"``."""
    try:
        return adapter(tp).validate_python(value)
    except ValidationError as err:
        raise UserError(f"{where}: {one_line(err)}") from None


def user_errors(cls: type[T]) -> type[T]:
    """Make a pydantic dataclass raise :class:`UserError` (one line) instead of ValidationError.

    Why: the app, the CLI and core.runs.apply build these objects directly and all
    of them show a UserError's message as it is; a multi-line ValidationError
    with a URL would reach them as an unexpected exception.
    """
    init = cls.__init__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except ValidationError as err:
            raise UserError(f"{cls.__name__}: {one_line(err)}") from None

    __init__.__doc__ = init.__doc__
    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


# -- files -------------------------------------------------------------------------------


class _HugeInt:
    """Where a JSON file held a whole number of more digits than Python reads (:func:`read_json` names its field)."""

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-").lstrip("0"))
        self.negative = text.startswith("-")


class _Twice(dict):
    """A JSON object that gave a key more than once (:func:`read_json` names it)."""

    twice: str = ""


def _parse_int(text: str) -> int | _HugeInt:
    """``int(text)``, or a marker for a whole number Python refuses to read (over ``sys.get_int_max_str_digits()``
    digits: 4,300 by default), whose own message names neither the file nor the field."""
    try:
        return int(text)
    except ValueError:
        return _HugeInt(text)


def _unique(pairs: list[tuple[str, Any]]) -> dict:
    """An object's pairs as a dict; a key given twice makes a :class:`_Twice` that names it (``json`` would keep the
    last value silently)."""
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    seen: set[str] = set()
    twice = next(k for k, _ in pairs if k in seen or seen.add(k))
    marked = _Twice(out)
    marked.twice = twice
    return marked


def _first_marker(value: Any) -> tuple[str, Any] | None:
    """The first :class:`_HugeInt` or :class:`_Twice` in a parsed JSON value, with its field path
    (``scheme_params.window``, ``tau[3]``); None when there is none. Iterative: a file may nest deeply."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, (_HugeInt, _Twice)):
            return where, v
        if isinstance(v, dict):
            stack.extend((f"{where}.{k}" if where else str(k), x) for k, x in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", x) for i, x in reversed(list(enumerate(v))))
    return None


def read_json(path: str | Path, what: str, max_bytes: int = MAX_JSON_BYTES, unique_keys: bool = False) -> Any:
    """Parse a JSON file the user named, with every failure as one line naming ``what`` and the path.

    The size is checked before reading, so a huge file cannot fill memory. A whole number of more digits than
    Python reads is refused naming its field; ``unique_keys``: so is a key given twice in one object (a file a
    person writes, where the CLI and the link refuse an option given twice; ``json`` would keep the last).
    """
    p = Path(path)
    try:
        if p.is_dir():
            raise UserError(f"{what} {path} is a folder, not a file")
        size = p.stat().st_size
        if size > max_bytes:
            raise UserError(f"{what} {path} is {size:,} bytes; at most {max_bytes:,} are read")
        raw = p.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}") from None
    except OSError as err:
        raise UserError(f"{what} {path} cannot be read: {err.strerror or err}") from None
    try:
        marks: list[bool] = []

        def parse_int(text: str) -> int | _HugeInt:
            got = _parse_int(text)
            if isinstance(got, _HugeInt):
                marks.append(True)
            return got

        def pairs(items: list[tuple[str, Any]]) -> dict:
            got = _unique(items)
            if isinstance(got, _Twice):
                marks.append(True)
            return got

        value = json.loads(raw.decode("utf-8"), parse_int=parse_int, object_pairs_hook=pairs if unique_keys else None)
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not UTF-8 text") from None
    except (json.JSONDecodeError, RecursionError) as err:
        reason = (
            f"{err.msg} at line {err.lineno} column {err.colno}"
            if isinstance(err, json.JSONDecodeError)
            else "nested too deeply"
        )
        raise UserError(f"{what} {path} is not valid JSON: {reason}") from None
    found = _first_marker(value) if marks else None
    if found is not None:
        where, marker = found
        if isinstance(marker, _Twice):
            inside = f" (in {where})" if where else ""
            raise UserError(f"{what} {path}: key {_short(marker.twice)} is given twice{inside}; give each key once")
        sign = "negative " if marker.negative else ""
        raise UserError(
            f"{what} {path}: {where or 'the value'} is a {sign}{marker.digits:,}-digit number, "
            f"{'below' if sign else 'past'} any bound"
        )
    return value


def arg_type(tp: Any, convert: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """An argparse ``type=``: ``convert`` the text, then check it against ``tp`` (the same bounds the files use)."""
    import argparse

    def parse(text: str) -> Any:
        try:
            value = convert(text.strip())
        except (TypeError, ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"{what}, got {_short(text)}") from None
        try:
            return adapter(tp).validate_python(value)
        except ValidationError as err:
            raise argparse.ArgumentTypeError(f"{one_line(err)}") from None

    parse.__name__ = what  # argparse names the type in some messages
    return parse
