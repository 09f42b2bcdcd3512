"""Everything checked before a model loads: :func:`prepare` parses the options and validates them, loading nothing.

Why a step of its own: it is what makes a bad input cheap (one line, exit 2, before torch is imported or a model
read), and what the tests call on any argument list. After it, each command (:mod:`core.cli.run`, ...) loads its
model and checks lengths against this machine (:mod:`core.cli.model`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from core.cli.parser import METHOD_PARAMS, TAKE_PARAMS, build_parser
from core.cli.settings_merge import merge_settings
from core.errors import UserError
from core.runs import methods, timing


def method_params(args, names, option: str = "--method") -> dict[str, float]:
    """The ``--<param>`` values given, ``{name: value}``; one that none of the methods ``names`` (names or ``tau=``
    texts) takes is refused in one line (it would change nothing: exit 2, not a silent run). ``option``: where the
    methods came from, for the message (``--methods`` for a list)."""
    given = {n: getattr(args, n) for n in METHOD_PARAMS if getattr(args, n, None) is not None}
    for name in given:
        why = methods.untaken(name, names, option)
        if why:
            raise UserError(f"--{name}: {why}")
    return given


def file_params(chosen, names) -> dict[str, float]:
    """The settings file's method parameters (``method_params``: the gamma its ``critical`` was chosen with) that one
    of the methods ``names`` this command runs takes; the others would change nothing here and are left out, not
    refused (the file is valid; ``sweep --methods none,yarn --settings f.json`` reads its document, not its gamma)."""
    if chosen is None:
        return {}
    return {k: v for k, v in chosen.method_params.items() if methods.untaken(k, names) is None}


def listed_methods(args) -> tuple[list[str], str]:
    """The methods a command runs (names or ``tau=`` texts, before any model loads) and the option they came from:
    what ``--gamma`` is checked against. ``calibrate`` lists every method; ``sweep --data`` without ``--methods``
    runs the ``--settings``/``--tau``/``--method`` choice."""
    if args.cmd == "run":
        return [args.settings_.method], "--method"
    if args.cmd == "calibrate":
        return list(methods.NAMES), "--method"
    if args.methods:
        return args.methods.split(","), "--methods"
    if args.cmd == "sweep" and args.data:
        return [args.settings_.method], "--method"
    return list(methods.SWEEP_DEFAULT if args.cmd in ("sweep", "mlm") else methods.PERPLEXITY_DEFAULT), "--methods"


def check_out(path: str, option: str = "--out") -> None:
    """An output file's folder must exist and the path must not be a folder (checked before any work)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{option} {path} is a folder; name a file in it")
    if not p.parent.is_dir():
        raise UserError(f"{option} {path}: the folder {p.parent} does not exist")


def prepare(argv: list[str]) -> argparse.Namespace:
    """Parse and validate everything that needs no model; ``args.settings_`` holds the merged Settings.

    Raises :class:`UserError` on bad input (argparse's errors included; only
    ``--help`` exits); loads nothing, so it is cheap to call on any argument list.
    """
    args = build_parser().parse_args(argv)
    args.settings_ = merge_settings(args) if args.cmd in ("run", "calibrate", "sweep") else None
    # --gamma and friends: for the methods the command runs (calibrate lists every method: any that takes it);
    # a settings file's own (its method's gamma) where a method here takes it, an option over it
    args.given_params_, args.params_ = {}, {}
    if args.cmd in TAKE_PARAMS:
        names, option = listed_methods(args)
        args.given_params_ = method_params(args, names, option)
        args.params_ = {**file_params(args.settings_, names), **args.given_params_}
    args.budget_ = timing.Budget(getattr(args, "max_seconds", None))  # counted from here: the options are read
    if getattr(args, "out", None):
        check_out(args.out)
    if args.cmd == "rpe" and args.query is not None and args.length is not None and args.query >= args.length:
        raise UserError(f"--query {args.query} must be below --length {args.length}")
    return args
