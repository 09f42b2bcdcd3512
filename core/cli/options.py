"""The CLI's option types: each ``type=`` turns one option's text into a checked value or one line of why not.

Why a module of their own: argparse calls these while it parses, before any command runs, and a bad value must be
answered at once (exit 2, one line) on a machine where importing torch takes seconds. So nothing here imports torch
or transformers, not even lazily: the bounds are :mod:`core.values.validation`'s, the device and dtype names
:mod:`core.models.device`'s text checks, methods :mod:`core.runs.methods` (numpy only), ``--copy``'s kinds
:mod:`core.data.tasks.lm`'s.

The functions keep their leading underscore on purpose: argparse names a ``type=`` function in the message it
prints for a ValueError that escapes one, and these names are the ones the CLI has always printed.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from core.errors import UserError
from core.runs import methods, timing
from core.values.schedule import Schedule
from core.values.validation import (
    MAX_LENGTH,
    BatchSize,
    Depth,
    NewTokens,
    Position,
    Positive,
    RpeLength,
    Samples,
    Seed,
    Sequences,
    Tokens,
    TrainLength,
    arg_type,
)

if TYPE_CHECKING:  # the scheme's module is imported where a scheme is parsed
    from core.values.positions import Scheme

# -- the bounds of core.values.validation, with the option named by argparse ------------------

_tokens = arg_type(Tokens, int, "a whole number of tokens")
_train_length = arg_type(TrainLength, int, "a whole number of tokens")
_depth = arg_type(Depth, float, "a number from 0 to 1")
_seed = arg_type(Seed, int, "a whole number")
_positive = arg_type(Positive, float, "a positive number")
_samples = arg_type(Samples, int, "a whole number")
_batch_size = arg_type(BatchSize, int, "a whole number")
_new_tokens = arg_type(NewTokens, int, "a whole number of tokens")
_sequences = arg_type(Sequences, int, "a whole number")
_rpe_length = arg_type(RpeLength, int, "a whole number of keys")
_position = arg_type(Position, int, "a whole number")


def _device(text: str) -> str:
    from core.models.device import check_device

    try:
        return check_device(text)
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _dtype(text: str) -> str:
    from core.models.device import dtype_name

    try:
        dtype_name(text)
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text.strip().lower()


def _targets(text: str) -> tuple[str, ...]:
    """``--targets``: a comma list checked by the one rule of targets (:func:`core.values.choice.targets_of`)."""
    from core.values.choice import targets_of

    try:
        return targets_of(tuple(t.strip() for t in text.split(",")))
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _comma_list(item, what: str):
    """A ``type=`` for a comma list whose items each go through ``item`` (the first bad one is named)."""

    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",")]
        if not parts or any(not p for p in parts):
            raise argparse.ArgumentTypeError(f"{what}: a comma list with no empty items, got {text[:40]!r}")
        return [item(p) for p in parts]

    return parse


def _length_item(part: str) -> tuple[float, bool]:
    """``"300"`` -> (300, False) tokens; ``"1.5x"`` -> (1.5, True) a multiple of L_tr (resolved after the model loads)."""
    if part.lower().endswith("x"):
        k = _positive(part[:-1])
        if k > MAX_LENGTH / 2:  # L_tr >= 2, so a bigger multiple is past MAX_LENGTH for every model
            raise argparse.ArgumentTypeError(f"{part!r} is more than {MAX_LENGTH:,} tokens for any L_tr")
        return k, True
    return _tokens(part), False


def _method_item(part: str) -> str:
    """A method name, or a fixed tau (``tau=0.8``; a bare number too): :func:`core.runs.methods.parse`'s rule."""
    try:
        methods.parse(part)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)[:200]) from None
    return part


def _tau(text: str) -> float:
    """``--tau``: one number within the bounds every schedule has (:mod:`core.values.schedule`)."""
    try:
        return Schedule.of(float(text.strip())).scalar
    except (ValueError, OverflowError) as err:
        shown = repr(text) if len(repr(text)) <= 40 else repr(text)[:37] + "..."
        raise argparse.ArgumentTypeError(f"--tau takes one number, got {shown}: {err}"[:200]) from None


def _scheme_item(part: str) -> "Scheme":
    """A position scheme as one text (``window``, ``yarn-rope:attention_factor=1``), made into a
    :class:`~core.values.positions.Scheme` by its one parser (unknown names are refused with the list, unavailable ones
    with their reason, parameters given twice or out of bounds with the bound)."""
    from core.values.positions import Scheme

    try:
        return Scheme.of(part)
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err)[:300]) from None


def _scheme_param_item(part: str) -> tuple[str, str]:
    """One ``key=value`` of ``--scheme-params`` (checked against the schemes once they are all known)."""
    key, eq, value = part.partition("=")
    if not eq or not key.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"--scheme-params: write key=value, got {part[:40]!r}")
    return key.strip(), value.strip()


def _methods(text: str) -> str:
    """``--methods`` checked item by item but kept as the comma string core.experiments.batch reads."""
    return ",".join(_comma_list(_method_item, "--methods")(text))


def _param_type(param: "methods.Param"):
    """A ``type=`` for ``--<param>``: a finite number within the parameter's bounds (one line otherwise)."""

    def parse(text: str) -> float:
        shown = repr(text) if len(text) <= 40 else repr(text[:37] + "...")
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"a number, got {shown}") from None
        if not (math.isfinite(value) and param.low <= value <= param.high):
            raise argparse.ArgumentTypeError(f"a number in {param.low:g} .. {param.high:g}, got {shown}")
        return value

    return parse


def _max_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds, got {text[:40]!r}") from None
    if not (math.isfinite(value) and 0 < value <= timing.MAX_BUDGET_S):
        raise argparse.ArgumentTypeError(
            f"a number of seconds above 0 and at most {timing.MAX_BUDGET_S:,.0f}, got {text[:40]!r}"
        )
    return value


def _copy_kinds(text: str) -> tuple[str, ...]:
    """``--copy``: kinds of perplexity sequences (core.data.tasks.lm.COPY_KINDS; ``split`` = with and without)."""
    from core.data.tasks.lm import COPY_KINDS, COPY_WITH, COPY_WITHOUT

    parts = [p.strip() for p in text.split(",")]
    bad = [p for p in parts if p not in (*COPY_KINDS, "split")]
    if bad or not parts:
        raise argparse.ArgumentTypeError(
            f"unknown kind(s) {', '.join(map(repr, bad))[:80]}; choose from {', '.join(COPY_KINDS)}, split"
        )
    kinds = [k for p in parts for k in ((COPY_WITH, COPY_WITHOUT) if p == "split" else (p,))]
    return tuple(dict.fromkeys(kinds))
