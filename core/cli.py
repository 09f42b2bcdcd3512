"""``python -m core run | calibrate | sweep | perplexity | mlm | rpe | train``: the headless contract.

Exit status 0 on success; 2 with one line ``error: ...`` on stderr for
anything the user can fix (unknown model, empty text, a bad option or
settings file, a document too long for this machine's memory, NaN attention,
a file that cannot be read or written: disk full, permission). JSON goes to
stdout; progress bars go to stderr, so ``--json`` output can be piped.

Anything else is a bug: exit 1 with one line ``internal error: <Type>:
<message> (set AAE_DEBUG=1 for the traceback)``; with ``AAE_DEBUG=1`` in the
environment the traceback is shown instead.

Order of checks, so that no input can eat the machine: every option is
parsed and bounded (:mod:`core.values.validation`) and the settings are validated
(:func:`prepare`, no model needed); then the model is loaded and every
length is checked against this machine's memory (:func:`core.runs.engine.max_tokens`)
before any document is built; output files are written only after that.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.errors import InputTooLong, UserError
from core.values.schedule import Schedule
from core.data.tasks import CONTINUATION, GENERATED, MAX_ANSWER_TOKENS
from core.models import memory
from core.runs import methods, timing
from core.values.validation import (
    MAX_LENGTH, MAX_TEXT_CHARS, BatchSize, Depth, NewTokens, Position, Positive, RpeLength, Samples, Seed, Sequences,
    Tokens,
    TrainLength, arg_type, validate,
)

if TYPE_CHECKING:  # the scheme's module is imported where a scheme is parsed
    from core.values.positions import Scheme

TASK_CHOICES = GENERATED + ("text",)


class _Parser(argparse.ArgumentParser):
    """argparse whose bad option is a UserError (one line, exit 2 from :func:`main`), not a usage block and exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message} (see {self.prog} --help)")


# -- option types: the bounds of core.values.validation, with the option named by argparse ------

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
    from core.models import check_device

    try:
        return check_device(text)
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _dtype(text: str) -> str:
    from core.models import check_dtype

    try:
        check_dtype(text)
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text.strip().lower()


def _targets(text: str) -> tuple[str, ...]:
    from core.kinds import KINDS

    parts = tuple(t.strip() for t in text.split(","))
    bad = [t for t in parts if t not in KINDS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown target(s) {', '.join(map(repr, bad))[:80]}; choose from {', '.join(KINDS)}")
    return parts


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


def _with_params(schemes: list["Scheme"], given: list[tuple[str, str]] | None) -> list["Scheme"]:
    """``--schemes`` with ``--scheme-params`` given to every listed scheme that takes each (a scheme's own
    ``name:key=value`` wins); a parameter given twice, or that no listed scheme takes, is refused, naming who takes
    what."""
    from core.values import positions
    from core.values.positions import Scheme

    if not given:
        return schemes
    keys = [k for k, _ in given]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise UserError(f"--scheme-params: {', '.join(twice)} given twice; give each parameter once")
    out = []
    used = set()
    for scheme in schemes:
        takes = scheme.entry.params
        extra = {k: v for k, v in given if k in takes and k not in scheme.param_dict}
        used |= {k for k, _ in given if k in takes}
        text = positions.SPEC_SEP.join([scheme.spell(), *(f"{k}={v}" for k, v in extra.items())])
        out.append(Scheme.of(text) if extra else scheme)  # the options' values are text: read as a scheme's text
    unused = [k for k, _ in given if k not in used]
    if unused:
        takes = "; ".join(f"{s.name} takes {', '.join(s.entry.params) or 'nothing'}" for s in schemes)
        raise UserError(f"--scheme-params: no listed scheme takes {', '.join(unused)} ({takes})")
    return out


def _methods(text: str) -> str:
    """``--methods`` checked item by item but kept as the comma string core.experiments.batch reads."""
    return ",".join(_comma_list(_method_item, "--methods")(text))


# -- the parser -------------------------------------------------------------------------

#: The numbers methods take besides the lengths (:class:`core.runs.methods.Param`: critical scaling's gamma), each once,
#: by name: each is an option of ``run``, ``calibrate``, ``sweep``, ``perplexity`` and ``mlm`` (``--gamma``).
METHOD_PARAMS: dict[str, "methods.Param"] = {m.param.name: m.param for m in methods.REGISTRY.values() if m.param}


def _param_type(param: "methods.Param"):
    """A ``type=`` for ``--<param>``: a finite number within the parameter's bounds (one line otherwise)."""
    def parse(text: str) -> float:
        shown = repr(text) if len(text) <= 40 else repr(text[:37] + "...")
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"a number, got {shown}") from None
        if not (np.isfinite(value) and param.low <= value <= param.high):
            raise argparse.ArgumentTypeError(f"a number in {param.low:g} .. {param.high:g}, got {shown}")
        return value

    return parse


def _param_options(t) -> None:
    """``--gamma`` and any other :class:`core.runs.methods.Param`, for the methods that take it."""
    for name, param in METHOD_PARAMS.items():
        takers = ", ".join(methods.takers(name))
        t.add_argument(f"--{name}", type=_param_type(param), default=None, metavar="X",
                       help=f"{takers} only: {param.help} (default: its value from L_tr)")


def _method_params(args, names, option: str = "--method") -> dict[str, float]:
    """The ``--<param>`` values given, ``{name: value}``; one that none of the methods ``names`` (names or ``tau=``
    texts) takes is refused in one line (it would change nothing: exit 2, not a silent run). ``option``: where the
    methods came from, for the message (``--methods`` for a list)."""
    given = {n: getattr(args, n) for n in METHOD_PARAMS if getattr(args, n, None) is not None}
    for name in given:
        why = methods.untaken(name, names, option)
        if why:
            raise UserError(f"--{name}: {why}")
    return given


def _file_params(chosen, names) -> dict[str, float]:
    """The settings file's method parameters (``method_params``: the gamma its ``critical`` was chosen with) that one
    of the methods ``names`` this command runs takes; the others would change nothing here and are left out, not
    refused (the file is valid; ``sweep --methods none,yarn --settings f.json`` reads its document, not its gamma)."""
    if chosen is None:
        return {}
    return {k: v for k, v in chosen.method_params.items() if methods.untaken(k, names) is None}


def _listed_methods(args) -> tuple[list[str], str]:
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


def _model_options(g) -> None:
    g.add_argument("--model", help="registry name, hub id or local folder (default: the bundled model)")
    g.add_argument("--tokenizer", help="registry name, hub id or folder whose tokenizer to use (for a model folder without one)")
    g.add_argument("--train-length", type=_train_length, help="override the model's training length L_tr")


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and document")
    _model_options(g)
    g.add_argument("--device", type=_device, help="cpu | cuda | cuda:N | auto (default: CUDA+bf16 when present, else CPU+fp32)")
    g.add_argument("--dtype", type=_dtype, help="float32 | bfloat16 | auto (float32 on a GPU reproduces CPU numbers; "
                                                "float16 is refused: T5 overflows in it)")
    g.add_argument("--settings", help="a settings JSON (the app's export); explicit options override it")
    g.add_argument("--task", choices=TASK_CHOICES)
    g.add_argument("--tokens", type=_tokens, help=f"document length in tokens, 1..{MAX_LENGTH:,} (default: L_tr)")
    g.add_argument("--depth", type=_depth, help="needle depth 0..1 (default 0.5)")
    g.add_argument("--seed", type=_seed)
    g.add_argument("--haystack", choices=("default", "corpus-eval"),
                   help="filler of passkey/topic/multidoc: the task's own (default; the pass key's is the paper's one "
                        "fixed text) or held-out corpus prose (every seed another haystack)")
    g.add_argument("--text-file", help=f"task text: your document (UTF-8, at most {MAX_TEXT_CHARS:,} characters)")
    g.add_argument("--needle", help="task text: sentence to insert (default: a pass key sentence)")
    g.add_argument("--question")
    g.add_argument("--expected")
    t = p.add_argument_group("temperature")
    t.add_argument("--tau", type=_tau, help="a fixed tau for every targeted attention (same as --method tau=X)")
    t.add_argument("--method", type=_method_item, metavar="METHOD",
                   help=f"{{{','.join(n for n, m in methods.REGISTRY.items() if not m.takes_value)}}} or "
                        f"{methods.FIXED_PREFIX}X (a fixed tau)")
    t.add_argument("--targets", type=_targets, default=None, help="comma list of encoder,decoder,cross (default: encoder)")
    t.add_argument("--cosine-scale", type=_positive, help="CosScale s for cosine-attention models")
    t.add_argument("--samples", type=_samples, default=1, help="documents used to calibrate measured methods")


def _ray_options(p: argparse.ArgumentParser) -> None:
    """``--engine``, ``--address``, ``--actors``, ``--cpus-per-actor``: a command that runs on a Ray cluster."""
    r_ = p.add_argument_group("on a Ray cluster (docs/cluster.md)")
    r_.add_argument("--engine", choices=("local", "ray"), default="local",
                    help="local: this process (default); ray: a pool of Ray actors, one model each")
    r_.add_argument("--address", help="--engine ray: the cluster to join (auto, host:port, ray://host:port; "
                                      "default RAY_ADDRESS, else a new local Ray on this machine)")
    r_.add_argument("--actors", type=int, help="--engine ray: how many actors (default: one per GPU, else one per "
                                               "--cpus-per-actor CPUs)")
    r_.add_argument("--cpus-per-actor", type=int, help="--engine ray without GPUs: torch threads per actor (default 1)")


def _max_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds, got {text[:40]!r}") from None
    if not (np.isfinite(value) and 0 < value <= timing.MAX_BUDGET_S):
        raise argparse.ArgumentTypeError(f"a number of seconds above 0 and at most {timing.MAX_BUDGET_S:,.0f}, "
                                         f"got {text[:40]!r}")
    return value


def _budget_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--max-seconds", type=_max_seconds, default=None, metavar="N",
                   help=f"a wall-clock budget for the command: {what} (exit 124)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m core", description="Attention Alignment Explorer, headless.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="answer one document and report attention statistics")
    _common(r)
    r.add_argument("--json", action="store_true", help="print one JSON object")
    _param_options(r)
    _budget_option(r, "refused before it starts when its estimate is over, stopped at the next layer past it")
    c = sub.add_parser("calibrate", help="Algorithm 1 (grid) plus every method's tau for one document")
    _common(c)
    c.add_argument("--criterion", choices=("pmax", "entropy"), default="pmax")
    c.add_argument("--fast", action="store_true", help="bisect instead of the full grid")
    c.add_argument("--json", action="store_true")
    _param_options(c)
    _budget_option(c, "refused before it starts when its estimate is over, stopped at the next layer past it")
    s = sub.add_parser("sweep", help="accuracy over lengths x depths x seeds x methods -> CSV")
    _common(s)
    s.add_argument("--lengths", type=_comma_list(_length_item, "--lengths"), default=None,
                   help="comma list of token counts, or multiples like 1x,2x,4x of L_tr")
    s.add_argument("--depths", type=_comma_list(_depth, "--depths"), default=[0.5], help="comma list of depths 0..1")
    s.add_argument("--methods", type=_methods, default=None,
                   help=f"comma list of method names and/or fixed taus, tau=0.8 (default: {','.join(methods.SWEEP_DEFAULT)}; with --data: "
                        "the --settings/--tau/--method choice)")
    s.add_argument("--out", help="CSV written row by row")
    s.add_argument("--resume", action="store_true", help="skip rows already in --out")
    _budget_option(s, "stopped at the next layer past it; the rows written stay (--resume runs the rest)")
    s.add_argument("--data", help="JSONL of your own documents (see docs/cli.md, batch runs)")
    s.add_argument("--batch-size", type=_batch_size, default=8, help="--data: documents per padded batch")
    s.add_argument("--max-new-tokens", type=_new_tokens, default=MAX_ANSWER_TOKENS, help="--data: answer length limit in tokens")
    _param_options(s)
    _ray_options(s)
    pp = sub.add_parser("perplexity", help="language-modelling perplexity over lengths x methods (the paper's Table 3)")
    _model_options(pp)
    pp.add_argument("--device", type=_device, help="cpu | cuda | cuda:N | auto")
    pp.add_argument("--dtype", type=_dtype, help="float32 | bfloat16 | auto (default: bfloat16 on CUDA, float32 on the CPU)")
    pp.add_argument("--lengths", type=_comma_list(_length_item, "--lengths"), default=None,
                    help="comma list of prefix lengths in tokens, or multiples like 1x,2x,4x of L_tr (default 1x..16x)")
    pp.add_argument("--methods", type=_methods, default=None,
                    help=f"comma list of method names and/or fixed taus, tau=0.8 (default: {','.join(methods.PERPLEXITY_DEFAULT)})")
    pp.add_argument("--sequences", type=_sequences, default=200, help="held-out sequences per length (default 200)")
    pp.add_argument("--seed", type=_seed, default=0, help="first sequence seed (seeds seed .. seed + sequences - 1)")
    pp.add_argument("--calib-seed", type=_seed, default=100_000, help="first seed of the calibration sequences")
    pp.add_argument("--samples", type=_samples, default=4, help="calibration sequences for measured methods")
    pp.add_argument("--continuation", type=_new_tokens, default=CONTINUATION, help="tokens scored per sequence")
    pp.add_argument("--batch-size", type=_batch_size, default=8, help="sequences per forward pass")
    pp.add_argument("--targets", type=_targets, default=None, help="comma list of encoder,decoder,cross (default: encoder)")
    pp.add_argument("--copy", type=_copy_kinds, default=None,
                    help="which sequences: comma list of mixed (default: held out as drawn), with (an earlier copy of the "
                         "continuation), without (the same seeds, no copy); split = with,without")
    pp.add_argument("--out", help="CSV written row by row (one row per length x method x copy)")
    pp.add_argument("--resume", action="store_true", help="skip rows already in --out")
    pp.add_argument("--json", action="store_true", help="print one JSON object with the rows")
    _param_options(pp)
    _budget_option(pp, "stopped at the next layer past it; the rows written stay (--resume runs the rest)")
    ml = sub.add_parser("mlm", help="masked-token accuracy and perplexity over lengths x methods (rotary masked-LM "
                                    "models; the InfoScale paper's Table 1)")
    _model_options(ml)
    ml.add_argument("--device", type=_device, help="cpu | cuda | cuda:N | auto")
    ml.add_argument("--dtype", type=_dtype, help="float32 | bfloat16 | auto (default: bfloat16 on CUDA, float32 on the CPU)")
    ml.add_argument("--lengths", type=_comma_list(_length_item, "--lengths"), default=None,
                    help="comma list of lengths in tokens, or multiples like 1x,2x,4x of L_tr (default 1x..64x)")
    ml.add_argument("--methods", type=_methods, default=None,
                    help=f"comma list of method names and/or fixed taus, tau=0.8 (default: {','.join(methods.SWEEP_DEFAULT)})")
    ml.add_argument("--sequences", type=_sequences, default=32, help="held-out sequences per length (default 32)")
    ml.add_argument("--seed", type=_seed, default=0, help="first sequence seed (seeds seed .. seed + sequences - 1); "
                                                          "it also draws each sequence's masked positions")
    ml.add_argument("--calib-seed", type=_seed, default=100_000, help="first seed of the calibration sequences")
    ml.add_argument("--samples", type=_samples, default=1, help="calibration sequences for measured methods")
    ml.add_argument("--batch-size", type=_batch_size, default=8, help="sequences per forward pass")
    ml.add_argument("--cosine-scale", type=_positive, help="CosScale s for cosine-attention models (default: the trained s)")
    ml.add_argument("--schemes", type=_comma_list(_scheme_item, "--schemes"), default=None,
                    help="comma list of position schemes, each a name or name:key=value[:key=value] (e.g. "
                         "none,pi,yarn-rope:attention_factor=1,window; default: none); see docs/positions.md")
    ml.add_argument("--scheme-params", type=_comma_list(_scheme_param_item, "--scheme-params"), default=None,
                    help="comma list of key=value given to every listed scheme that takes the key (e.g. window=32)")
    ml.add_argument("--json", action="store_true", help="print one JSON object with the rows")
    ml.add_argument("--out", help="CSV written row by row (one row per length x scheme x method)")
    ml.add_argument("--resume", action="store_true", help="skip the cells already in --out")
    _param_options(ml)
    _budget_option(ml, "stopped at the next layer past it; the rows written stay (--resume runs the rest)")
    _ray_options(ml)
    rp = sub.add_parser("rpe", help="relative-position-bias curves b(m, n) per head (Figure 1)")
    _model_options(rp)
    rp.add_argument("--query", type=_position, default=None, help="query position m (default: L_tr // 2)")
    rp.add_argument("--length", type=_rpe_length, default=None, help="keys 0..length-1 (default: 4 L_tr)")
    rp.add_argument("--out", required=True)
    sub.add_parser("train", help="train a bundled model: python -m core train --help")
    dr = sub.add_parser("doctor", help="this machine's facts: device, dtype, the attention's backend and why, ISA, "
                                       "threads, compiler, versions")
    dr.add_argument("--json", action="store_true", help="print one JSON object")
    return p


# -- options -> validated Settings (no model needed) -------------------------------------

def _read_text(path: str) -> str:
    """The --text-file, refused by its size before it is read (UTF-8 is at most 4 bytes a character)."""
    try:
        if Path(path).is_dir():
            raise UserError(f"--text-file {path} is a folder, not a file")
        size = os.stat(path).st_size
        if size > 4 * MAX_TEXT_CHARS:
            raise UserError(f"--text-file {path} is {size:,} bytes; at most {MAX_TEXT_CHARS:,} characters are accepted")
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise UserError(f"--text-file {path} is not UTF-8 text") from None
    except OSError as err:
        raise UserError(f"Cannot read --text-file {path}: {err.strerror or err}") from None


#: The document options, by the DocumentRequest field they set.
_DOC_OPTIONS = {"tokens": "--tokens", "depth": "--depth", "haystack": "--haystack", "text": "--text-file",
                "needle": "--needle", "question": "--question", "expected": "--expected"}


def _refuse_unused(args, over: dict, file_doc) -> None:
    """An explicit document option the command would not use is refused in one line (exit 2), not dropped.

    Why: issue 36, ``--haystack corpus-eval --task code`` ran with exit 0 and
    no filler column. Which task reads what is core.runs.settings.unused (the same
    table DocumentRequest checks); ``--depth`` is checked only here, because
    the app sends a depth for every task. ``sweep`` makes its own documents
    from --lengths and --depths (or reads --data), so its single-document
    options are refused with the option to use instead.
    """
    from core.runs.settings import unused, why_unused

    task = over.get("task", file_doc.task)
    needle = over.get("needle", file_doc.needle if task == file_doc.task else None)
    given = [f for f in over if f in _DOC_OPTIONS and not (f == "haystack" and over[f] == "default")]
    if args.cmd == "sweep":
        instead = {"tokens": "--lengths", "depth": "--depths"}
        if getattr(args, "data", None):
            given += ["task"] if args.task else []
            bad = [f for f in given if f in _DOC_OPTIONS or f == "task"]
            if bad or args.lengths is not None:
                names = [_DOC_OPTIONS.get(f, "--" + f) for f in bad] + (["--lengths"] if args.lengths is not None else [])
                raise UserError(f"{', '.join(names)}: not used by sweep --data (each JSONL line is its own document); "
                                f"leave {'it' if len(names) == 1 else 'them'} out")
        for f in given:
            if f in instead:
                raise UserError(f"{_DOC_OPTIONS[f]}: not used by sweep, which makes documents of every --lengths x "
                                f"--depths; use {instead[f]}")
        if task == "text" and not getattr(args, "data", None):  # it used to sweep passkey instead, silently
            raise UserError("sweep generates its documents: choose --task passkey, line, topic, multidoc or code "
                            "(the task here is text); for your own texts use sweep --data FILE.jsonl")
    bad = unused(task, needle, given)
    if bad:
        names = ", ".join(_DOC_OPTIONS[f] for f in bad)
        raise UserError(f"{names}: not used by --task {task} ({why_unused(task, needle, bad[0])}); "
                        f"leave {'it' if len(bad) == 1 else 'them'} out")


def _settings(args):
    """Merge a --settings file with explicit options (options win); validated as one Settings."""
    from core.runs.settings import Settings

    base = Settings.load(args.settings) if getattr(args, "settings", None) else Settings()
    text = _read_text(args.text_file) if getattr(args, "text_file", None) else None
    over = {k: v for k, v in {
        "task": args.task or ("text" if text is not None else None), "tokens": args.tokens, "depth": args.depth,
        "seed": args.seed, "haystack": args.haystack, "text": text, "needle": args.needle, "question": args.question,
        "expected": args.expected,
    }.items() if v is not None}
    _refuse_unused(args, over, base.document)
    if over.get("task", base.document.task) != base.document.task:  # the file's text/filler were for its own task
        base = replace(base, document=base.document.for_task(over["task"]))
    doc = replace(base.document, **over) if over else base.document
    method, tau = base.method, base.tau
    if args.tau is not None:
        method, tau = methods.FIXED, args.tau
    elif args.method:
        method, tau = methods.parse(args.method)
    return Settings(
        model=args.model if args.model is not None else base.model,
        train_length=args.train_length if args.train_length is not None else base.train_length,
        method=method, tau=tau, criterion=base.criterion, targets=args.targets or base.targets,
        cosine_scale=args.cosine_scale if args.cosine_scale is not None else base.cosine_scale,
        chosen_at=base.chosen_at, document=doc, scheme=base.scheme, scheme_params=dict(base.scheme_params),
        # the file's gamma belongs to the file's method: kept while that method runs, dropped with --tau/--method
        method_params=dict(base.method_params) if method == base.method else {},
    )


def _has_scheme(chosen) -> bool:
    """Whether settings ask for a position scheme other than the plain one as trained."""
    return not chosen.choice.scheme.is_plain


def _no_scheme(chosen, command: str) -> None:
    """A settings file's position scheme, refused by a command that would not apply it (rather than dropped)."""
    if _has_scheme(chosen):
        raise UserError(f"--settings: scheme '{chosen.choice.scheme}': {command} "
                        "runs the plain scheme only; use `run` with these settings, or `mlm --schemes`")


def _check_out(path: str, option: str = "--out") -> None:
    """An output file's folder must exist and the path must not be a folder (checked before any work)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{option} {path} is a folder; name a file in it")
    if not p.parent.is_dir():
        raise UserError(f"{option} {path}: the folder {p.parent} does not exist")


#: The commands with ``--gamma`` (and any other method :class:`~core.runs.methods.Param`).
_TAKE_PARAMS = ("run", "calibrate", "sweep", "perplexity", "mlm")


def prepare(argv: list[str]) -> argparse.Namespace:
    """Parse and validate everything that needs no model; ``args.settings_`` holds the merged Settings.

    Raises :class:`UserError` on bad input (argparse's errors included; only
    ``--help`` exits); loads nothing, so it is cheap to call on any argument list.
    """
    args = _parser().parse_args(argv)
    args.settings_ = _settings(args) if args.cmd in ("run", "calibrate", "sweep") else None
    # --gamma and friends: for the methods the command runs (calibrate lists every method: any that takes it);
    # a settings file's own (its method's gamma) where a method here takes it, an option over it
    args.given_params_, args.params_ = {}, {}
    if args.cmd in _TAKE_PARAMS:
        names, option = _listed_methods(args)
        args.given_params_ = _method_params(args, names, option)
        args.params_ = {**_file_params(args.settings_, names), **args.given_params_}
    args.budget_ = timing.Budget(getattr(args, "max_seconds", None))  # counted from here: the options are read
    if getattr(args, "out", None):
        _check_out(args.out)
    if args.cmd == "rpe" and args.query is not None and args.length is not None and args.query >= args.length:
        raise UserError(f"--query {args.query} must be below --length {args.length}")
    return args


# -- after the model is loaded: lengths against this machine's memory ----------------------

def _load(model: str | None, train_length: int | None, device: str | None = None, tokenizer: str | None = None,
          dtype: str | None = None):
    from core.errors import ModelLoadError
    from core.models import default_model, load

    from transformers.utils import logging as hf_logging

    from huggingface_hub.utils import disable_progress_bars

    hf_logging.disable_progress_bar()  # "Loading weights" bars would break the one-line error contract on stderr
    disable_progress_bars()  # and so would the hub's download bars
    name = model or default_model()
    if name is None:
        raise ModelLoadError("No model given and no bundled model in assets/models: pass --model NAME|HUB_ID|FOLDER")
    return load(name, device=device, train_length=train_length, tokenizer=tokenizer, dtype=dtype)


def _precision(loaded) -> dict:
    """Where and in what precision the numbers were computed: bfloat16 moves Pmax and accuracies a little."""
    return {"device": str(loaded.device), "dtype": str(loaded.dtype).replace("torch.", "")}


def _check_fits(loaded, tokens: int, what: str, batch: int = 1) -> None:
    """Refuse, before any document is built, ``tokens`` (x ``batch`` documents) this machine cannot run now."""
    from core.runs import engine

    cap = engine.max_tokens(loaded, batch)
    if tokens > cap:
        raise InputTooLong(f"{what} {tokens:,} tokens; this machine can run at most about {cap:,} tokens now"
                           f"{f' for {batch} documents at once' if batch > 1 else ''}. Use a shorter document.")


def _check_reference(loaded, names, samples: int = 1) -> None:
    """Measured methods run documents at L_tr (and ``samples`` of them at once): that length must fit too."""
    measured = sorted({m for m in names if methods.entry(m).measured})
    if measured:
        _check_fits(loaded, loaded.train_length, f"{', '.join(measured)} measure(s) documents at L_tr =", batch=samples)


def _document(loaded, chosen, samples: int = 1):
    """The run's document, refused before it is built when it (or its calibration batch) cannot fit."""
    return chosen.document.build_for(loaded, batch=samples)


def _progress(desc: str, leave: bool = False):
    from tqdm import tqdm

    bar = tqdm(total=100, desc=desc, file=sys.stderr, leave=leave, bar_format="{l_bar}{bar}| {elapsed}{postfix}")

    def update(frac: float) -> None:
        bar.n = int(round(100 * frac))
        bar.refresh()

    update.close = bar.close  # type: ignore[attr-defined]
    update.bar = bar  # type: ignore[attr-defined]
    return update


#: Seconds between two redraws of a bar's count of layers run (:func:`_layers_ticker`).
TICK_S = 0.5


def _layers_ticker(prog, budget):
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


def _refuse_over_budget(budget, loaded, doc, enc, settings, measured: list[str], samples: int, what: str) -> float:
    """Refuse (one line, exit 2) work whose estimate is over ``--max-seconds``: the pass over the document
    (:func:`core.runs.engine.estimate_pass`: a timed pass over its first tokens, scaled by the square of the length)
    plus the passes the ``measured`` methods run to resolve (:func:`core.runs.methods.costs`, upper bounds), each
    scaled from the same timing. Returns the pass's estimate (seconds)."""
    from core.mechanics import attention
    from core.runs import engine

    with attention.between_layers(None):  # the timed samples are not what the budget stops; what they took counts
        per = engine.estimate_pass(loaded, doc, enc, settings)
    passes = timing.sweep_passes([enc.n], 1, methods.costs(measured, loaded.n_layers, loaded.n_heads, samples),
                                 loaded.train_length) if measured else [(1, enc.n)]
    seconds = sum(count * per * (tokens / enc.n) ** 2 for count, tokens in passes)
    n_passes = sum(count for count, _ in passes)
    budget.refuse(seconds, f"{what} ({n_passes:,} pass{'es' if n_passes != 1 else ''} of up to {enc.n:,} tokens)")
    return per


def cmd_run(args) -> int:
    from core.runs import engine

    chosen = args.settings_
    loaded = _load(chosen.model, chosen.train_length, args.device, args.tokenizer, args.dtype)
    chosen.check_model(loaded)  # a position scheme this model cannot run: one line, before any document
    _check_reference(loaded, [chosen.method], args.samples)
    entry = methods.get(chosen.method)
    doc = _document(loaded, chosen, args.samples if entry.measured else 1)
    enc = engine.encode(loaded, doc)
    est = None
    if args.budget_.seconds is not None:  # refused before it starts when the estimate is over the budget
        est = _refuse_over_budget(args.budget_, loaded, doc, enc, chosen.run_settings(1.0, probes=None),
                                  [chosen.method] if entry.measured else [], args.samples, "this run")
    prog = _progress("calibrating") if entry.search is not None else None
    from core.mechanics import attention

    # a search shows the layers it has run beside its bar (and still asks the budget); others only the budget
    ticker = _layers_ticker(prog, args.budget_) if prog else (args.budget_.check if args.budget_.seconds else None)
    with attention.between_layers(ticker):
        # a stored schedule is used at the length it was chosen at; any other length re-resolves it
        # an explicit --gamma re-resolves the method whatever tau a settings file stored for it (the file's own
        # gamma re-resolves it at another length than chosen_at, as any stored schedule is)
        tau, info = methods.resolve(loaded, doc, chosen.method, None if args.given_params_ else chosen.tau,
                                    samples=args.samples, progress=prog, params=args.params_ or None,
                                    chosen_at=chosen.chosen_at,  # a measured method runs its passes under the scheme
                                    base=chosen.run_settings(1.0, probes=None) if _has_scheme(chosen) else None)
    if prog:
        prog.close()
    settings = chosen.run_settings(tau)
    if enc.n >= engine.ESTIMATE_FROM:  # long work says first about how long it takes
        if est is None:
            est = engine.estimate_pass(loaded, doc, enc, settings)
        print(f"a {enc.n:,}-token pass: {timing.describe(est)} here (its first {engine.SAMPLE_TOKENS:,} tokens "
              "timed, scaled by the square of the length)", file=sys.stderr, flush=True)
    res = engine.run(loaded, doc, settings, encoded=enc)
    out = res.summary()
    out["model"] = loaded.spec.name
    if entry.param is not None and entry.param.name in info:  # which gamma the tau came from (given or default)
        out[entry.param.name] = info[entry.param.name]
    out.update(_precision(loaded))
    if args.json:
        print(json.dumps(out))
    else:
        mark = {True: "correct", False: "wrong", None: "-"}[res.correct]
        print(f"model {loaded.spec.name}  tokens {res.tokens} ({res.tokens / res.train_length:.1f}x L_tr={res.train_length})  "
              f"method {chosen.method}  tau {np.round(res.tau.mean(1), 3).tolist()}")
        print(f"answer: {res.answer!r}  expected: {res.expected!r}  [{mark}]  {res.seconds['total']:.3f}s  "
              f"peak {memory.peak_bytes(loaded.device) / 2**30:.2f} GiB")
        for layer in res.layers():
            print(f"  layer {layer['layer']}: Pmax {layer['pmax']:.4f}  H {layer['entropy']:.4f}")
    return 0


def cmd_calibrate(args) -> int:
    from core.runs import calibration

    chosen = args.settings_
    _no_scheme(chosen, "calibrate")
    loaded = _load(chosen.model, chosen.train_length, args.device, args.tokenizer, args.dtype)
    _check_reference(loaded, methods.MEASURED, args.samples)
    doc = _document(loaded, chosen, args.samples)
    if args.budget_.seconds is not None:  # Algorithm 1 and every measured method, estimated before they start
        from core.runs import engine

        _refuse_over_budget(args.budget_, loaded, doc, engine.encode(loaded, doc), chosen.run_settings(1.0, probes=None),
                            list(methods.MEASURED), args.samples, "this calibration")
    from core.mechanics import attention

    # two phases, each with its bar, and inside each the layers run so far (a per-head search at a long length
    # is minutes of passes between two steps of its bar: issue 47 point 4 saw 180 s without a word)
    prog = _progress(f"Algorithm 1 ({args.criterion})", leave=True)
    with attention.between_layers(_layers_ticker(prog, args.budget_)):
        cal = calibration.calibrate(loaded, doc, args.criterion, fast=args.fast, samples=args.samples, progress=prog)
    prog.close()
    prog = _progress("every method's tau", leave=True)
    with attention.between_layers(_layers_ticker(prog, args.budget_)):
        found = methods.all_methods(loaded, doc, samples=args.samples, progress=prog, params=args.params_)
    prog.close()
    taus = {m: t if isinstance(t, str) else t.to_json() for m, t in found.items()}
    taus[args.criterion] = cal.tau
    out = {**cal.to_dict(), "methods": taus, "tokens": len(loaded.tokenizer(doc.text).input_ids),
           "train_length": loaded.train_length, "model": loaded.spec.name, **_precision(loaded)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"Algorithm 1 ({cal.criterion}) at {out['tokens']} tokens: tau = {cal.tau}  (reference S_tr(1) = {cal.reference:.4f}, {cal.passes} passes)")
        for t, v in zip(cal.grid, cal.curve):
            print(f"  tau {t:.2f}: {'-' if v is None else f'{v:.4f}'}")
        for m, t in taus.items():
            print(f"  {m:>10}: {t if isinstance(t, (str, dict)) else np.round(t, 4).tolist()}")
    return 0


def _lengths(spec: list[tuple[float, bool]] | None, train_length: int) -> list[int]:
    """Token counts of a parsed ``--lengths`` (multiples of L_tr resolved now; default 1,2,4,8,16 x L_tr)."""
    spec = spec or [(k, True) for k in (1, 2, 4, 8, 16)]
    out = []
    for value, multiple in spec:
        n = int(round(value * train_length)) if multiple else int(value)
        label = f"{value:g}x of L_tr={train_length:,}" if multiple else str(n)
        out.append(validate(Tokens, n, f"--lengths {label}"))
    return out


def _check_engine(args) -> bool:
    """The Ray options checked before any model loads (one line each); whether the command runs on Ray."""
    from core.experiments import cluster

    on_ray = args.engine == "ray"
    if not on_ray:
        given = [o for o, v in (("--address", args.address), ("--actors", args.actors),
                                ("--cpus-per-actor", args.cpus_per_actor)) if v is not None]
        if given:
            raise UserError(f"{', '.join(given)}: only with --engine ray (add it, or leave "
                            f"{'this option' if len(given) == 1 else 'these options'} out)")
    else:
        for opt, v in (("--actors", args.actors), ("--cpus-per-actor", args.cpus_per_actor)):
            if v is not None and not 1 <= v <= 100_000:
                raise UserError(f"{opt} must be a whole number from 1 to 100,000, got {v}")
        if args.dtype not in (None, "auto"):
            raise UserError("--dtype is for local runs: Ray actors use their device's precision "
                            "(bfloat16 on a GPU, float32 on a CPU)")
        cluster.check_address(args.address or os.environ.get("RAY_ADDRESS") or None)  # before the model loads
    return on_ray


def _pool(args):
    """The pool of Ray actors ``--engine ray`` asks for (not started yet), else None."""
    from core.experiments import cluster

    if args.engine != "ray":
        return None
    return cluster.RayEngine(address=args.address, actors=args.actors, cpus_per_actor=args.cpus_per_actor or 1,
                             device=args.device, tokenizer=args.tokenizer)


#: Commands whose ``--out`` keeps rows as they finish, so ``--resume`` can run the rest.
RESUMABLE = ("sweep", "perplexity", "mlm")
#: Exit status of a command stopped by its ``--max-seconds`` (GNU timeout's).
EXIT_OUT_OF_TIME = 124
#: Exit status after Ctrl-C (SIGINT): 128 + 2.
EXIT_INTERRUPTED = 130


def _kept(args) -> str:
    """What a stopped command leaves: the rows in its --out, or nothing."""
    out = getattr(args, "out", None)
    if getattr(args, "cmd", None) in RESUMABLE:
        return f"the rows written so far stay in {out}; --resume runs the rest" if out else "no --out, nothing kept"
    return "nothing written" if args is not None else "stopped before it finished"


def _interrupted(args) -> int:
    """Ctrl-C: the jobs still out were cancelled; one line saying what stays, exit 130 (128 + SIGINT)."""
    print(f"interrupted: {_kept(args)}", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def _out_of_time(args, err: BaseException) -> int:
    """``--max-seconds`` spent: one line saying where it stopped and what stays, exit 124."""
    print(f"out of time: {' '.join(str(err).split())}; {_kept(args)}", file=sys.stderr, flush=True)
    return EXIT_OUT_OF_TIME


@contextlib.contextmanager
def _sigint_taken():
    """SIGINT raises KeyboardInterrupt for the command, even where it was started with SIGINT ignored.

    Why: a non-interactive shell starts a background job (``python -m core sweep ... &`` in a script) with SIGINT
    ignored, and Python keeps an ignored SIGINT ignored, so ``kill -INT`` (twice) did nothing and the sweep ran on
    to its end (issue 47, point 4). A stop asked for by name is honoured: the rows written stay, exit 130. The
    previous handler is put back afterwards (``main`` called in-process). Only the main thread can set it."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    if before in (signal.SIG_IGN, signal.SIG_DFL, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if before in (signal.SIG_IGN, signal.SIG_DFL):
            signal.signal(signal.SIGINT, before)


def cmd_sweep(args) -> int:
    import contextlib

    from core.experiments import cluster

    chosen = args.settings_
    _no_scheme(chosen, "sweep")
    on_ray = _check_engine(args)
    # under Ray this process only tokenises, checks and writes: its copy of the model stays on the CPU
    loaded = _load(chosen.model, chosen.train_length, "cpu" if on_ray else args.device, args.tokenizer,
                   None if on_ray else args.dtype)
    pool = _pool(args)
    if args.data:
        from core.experiments.batch import run_jsonl

        _check_reference(loaded, args.methods.split(",") if args.methods else [chosen.method])
        with pool or contextlib.nullcontext():
            return run_jsonl(loaded, args, chosen, pool=pool)
    from tqdm import tqdm

    from core.data import tasks
    from core.experiments.sweep import SweepPlan, run_sweep

    names = args.methods.split(",") if args.methods else list(methods.SWEEP_DEFAULT)
    lengths = _lengths(args.lengths, loaded.train_length)
    _check_fits(loaded, max(lengths), "--lengths asks for documents of")
    _check_reference(loaded, names, 1)
    task = chosen.document.task if chosen.document.task != "text" else "passkey"
    try:
        plan = SweepPlan(
            model=loaded.spec.name, task=task, lengths=lengths, depths=list(args.depths),
            seeds=[(chosen.document.seed or 0) + i for i in range(args.samples)], methods=names,
            haystack=chosen.document.haystack, params=args.params_,
        )
    except ValueError as err:
        raise UserError(f"Bad sweep option: {err}") from None
    bar = cluster.Bar("sweep")  # drawn when the sweep starts: a refused sweep prints its one line and no bar
    failed: list[str] = []

    def report(msg: str) -> None:
        failed.append(msg)
        tqdm.write(msg, file=sys.stderr)

    try:
        with pool or contextlib.nullcontext():
            if pool is None or pool.on_cpu:  # one timed pass, so the sentence before the sweep can say how long
                cluster.time_a_pass(loaded, lambda: tasks.make(task, loaded.tokenizer, min(lengths), depth=0.5,
                                                               seed=plan.seeds[0] if plan.seeds else 0))
            df = run_sweep(loaded, plan, out=args.out, resume=args.resume, pool=pool, tracker=bar, report=report)
    finally:  # Ctrl-C and an overrun are worded by main(), after the bar is closed
        bar.close()
    if failed:
        print(f"{len(failed)} sweep job(s) failed (listed above); --resume runs their rows again", file=sys.stderr)
    if not args.out:
        from core.experiments import csvio

        print(csvio.to_csv_text(df), end="")
    else:
        from core.experiments.sweep import accuracy_table

        print(accuracy_table(df).to_string() if len(df) else "nothing new to run")
    return 0


def _copy_kinds(text: str) -> tuple[str, ...]:
    """``--copy``: kinds of perplexity sequences (core.experiments.perplexity.COPY_KINDS; ``split`` = with and without)."""
    from core.experiments.perplexity import COPY_KINDS, COPY_WITH, COPY_WITHOUT

    parts = [p.strip() for p in text.split(",")]
    bad = [p for p in parts if p not in (*COPY_KINDS, "split")]
    if bad or not parts:
        raise argparse.ArgumentTypeError(f"unknown kind(s) {', '.join(map(repr, bad))[:80]}; "
                                         f"choose from {', '.join(COPY_KINDS)}, split")
    kinds = [k for p in parts for k in ((COPY_WITH, COPY_WITHOUT) if p == "split" else (p,))]
    return tuple(dict.fromkeys(kinds))


def cmd_perplexity(args) -> int:
    from tqdm import tqdm

    from core.experiments.perplexity import PerplexityPlan, run_perplexity, summary

    loaded = _load(args.model, args.train_length, args.device, args.tokenizer, args.dtype)
    names = args.methods.split(",") if args.methods else list(methods.PERPLEXITY_DEFAULT)
    lengths = _lengths(args.lengths, loaded.train_length)
    _check_fits(loaded, max(lengths), "--lengths asks for sequences of", batch=args.batch_size)
    _check_reference(loaded, names, args.samples)
    plan = PerplexityPlan(
        model=loaded.spec.name, lengths=lengths, methods=names, sequences=args.sequences, seed=args.seed,
        calib_seed=args.calib_seed, calib_samples=args.samples, continuation=args.continuation,
        batch_size=args.batch_size, targets=args.targets or ("encoder",), params=args.params_,
        **({"copies": args.copy} if args.copy else {}),
    )
    bars: list = []

    def progress(done: int, total: int, row) -> None:
        if not bars:
            bars.append(tqdm(total=total, desc="perplexity (sequences)", file=sys.stderr))
        bars[0].n = done
        bars[0].refresh()

    try:
        df = run_perplexity(loaded, plan, out=args.out, resume=args.resume, progress=progress)
    finally:
        for bar in bars:
            bar.close()
    if args.json:
        print(json.dumps(summary(loaded, df), indent=2))
    elif not args.out:
        from core.experiments import csvio

        print(csvio.to_csv_text(df), end="")
    else:
        from core.experiments.perplexity import perplexity_table

        print(perplexity_table(df).to_string() if len(df) else "nothing new to run")
    return 0


#: ``mlm``'s default lengths: the paper's 1x .. 64x L_tr.
MLM_LENGTHS = (1, 2, 4, 8, 16, 32, 64)


def cmd_mlm(args) -> int:
    import contextlib

    from tqdm import tqdm

    from core.experiments import mlm

    if args.resume and not args.out:
        raise UserError("--resume needs --out (the CSV to resume)")
    on_ray = _check_engine(args)
    # under Ray this process only tokenises, checks and writes: its copy of the model stays on the CPU
    loaded = _load(args.model, args.train_length, "cpu" if on_ray else args.device, args.tokenizer,
                   None if on_ray else args.dtype)
    names = args.methods.split(",") if args.methods else list(methods.SWEEP_DEFAULT)
    lengths = _lengths(args.lengths or [(k, True) for k in MLM_LENGTHS], loaded.train_length)
    schemes = _with_params(args.schemes or [mlm.PLAIN_SCHEME], args.scheme_params)
    plan = mlm.MlmPlan(lengths=lengths, methods=names, sequences=args.sequences, seed=args.seed,
                       calib_seed=args.calib_seed, calib_samples=args.samples, batch_size=args.batch_size,
                       cosine_scale=args.cosine_scale, schemes=tuple(schemes), params=args.params_).validated()
    mlm.check_model(loaded, plan)
    _check_fits(loaded, max(lengths), "--lengths asks for sequences of", batch=min(args.batch_size, args.sequences))
    _check_reference(loaded, names, args.samples)
    pool = _pool(args)
    bars: list = []

    def progress(done: int, total: int) -> None:
        if not bars:
            bars.append(tqdm(total=total, desc="mlm (sequences)", file=sys.stderr))
        bars[0].n = done
        bars[0].refresh()

    failed: list[str] = []

    def report(msg: str) -> None:
        failed.append(msg)
        tqdm.write(msg, file=sys.stderr)

    try:
        with pool or contextlib.nullcontext():
            rows = mlm.run_mlm_sweep(loaded, plan, out=args.out, resume=args.resume, progress=progress, pool=pool,
                                     report=report)
    finally:  # Ctrl-C and an overrun are worded by main(), after the bars are closed
        for bar in bars:
            bar.close()
    if failed:
        print(f"{len(failed)} mlm job(s) failed (listed above); --resume runs their rows again", file=sys.stderr)
    rows = [{k: r[k] for k in mlm.ROW_KEYS} for r in rows]
    if args.json:
        print(json.dumps(mlm.summary(loaded, plan, rows)))
    else:
        for r in rows:
            scheme = r["scheme"] + (f" ({r['scheme_params']})" if r["scheme_params"] else "")
            print(f"{r['tokens']:>7,} tokens  {scheme:>14}  {r['method']:>16}  tau {r['tau']:.4f}  accuracy {r['accuracy']:.4f}  "
                  f"perplexity {r['perplexity']:.3f}  ({r['masked']} masked)")
    return 0


def cmd_rpe(args) -> int:
    import pandas as pd

    from core.views.rpe import bias_curves

    loaded = _load(args.model, args.train_length, tokenizer=args.tokenizer)
    lt = loaded.train_length
    length = args.length if args.length is not None else 4 * lt
    validate(RpeLength, length, f"rpe length (default 4 x L_tr = {length:,}; pass --length)")
    m = args.query if args.query is not None else min(lt // 2, length - 1)
    if m >= length:
        raise UserError(f"--query {m} must be below the length {length:,}")
    try:
        curves = bias_curves(loaded.model, m, length)
    except ValueError as err:
        raise UserError(f"rpe: {err}") from None
    df = pd.DataFrame({"n": np.arange(length), "distance": np.arange(length) - m})
    for h, c in enumerate(curves):
        df[f"head{h}"] = c
    from core.experiments import csvio

    csvio.write_csv(df, args.out)  # replaced whole, under the lock sweeps hold on the real file
    print(f"wrote {args.out}: {curves.shape[0]} heads x {length} keys, query m={m}, L_tr={lt}")
    return 0


#: What a C++ compiler buys, in one sentence (``doctor``): measured with :data:`COMPILER_MEASURED`.
COMPILER_BUYS = ("a C++ compiler (g++) lets the CPU build the fused softmax kernel once (about a second) and take "
                 "it for every long float32 pass, the same numbers as torch's path, which runs without one (or with "
                 "AAE_FUSED_SOFTMAX=0): a {tokens:,}-token passkey pass took {with_s:g} s with it and {without_s:g} s "
                 "without on {where}")
#: The figures in :data:`COMPILER_BUYS`: ``python -m core run --tokens 8192 --json``'s ``seconds``, best of two
#: runs each way, 2026-11-28 03:47-03:55 UTC at load 4-9 (other sessions running): 12.5 / 23.1 s with the kernel,
#: 122.8 / 186.9 s without.
COMPILER_MEASURED = {"with_s": 12.5, "without_s": 123, "tokens": 8192,
                     "where": "this project's 2-core AVX-512 Xeon (2026-11-28, busy)"}


def cmd_doctor(args) -> int:
    """The machine's facts (:func:`core.mechanics.machine.describe`), what a compiler buys, nothing loaded."""
    from core.mechanics import machine

    facts = machine.describe()
    buys = COMPILER_BUYS.format(**COMPILER_MEASURED)
    if args.json:
        print(json.dumps({**facts, "summary": machine.one_line(facts), "compiler_buys": buys}, default=str))
        return 0
    print(machine.one_line(facts))
    width = max(map(len, facts))
    for key, value in facts.items():
        print(f"  {key:<{width}}  {'-' if value is None else value}")
    print(buys[0].upper() + buys[1:] + ".")
    return 0


# -- the entry point ------------------------------------------------------------------------

def _fail(message: str) -> int:
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
    return 2


def _os_message(err: OSError) -> str:
    where = f": {err.filename}" if getattr(err, "filename", None) else ""
    return f"{err.strerror or type(err).__name__}{where}"


def _debug() -> bool:
    return os.environ.get("AAE_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["train"]:  # its options belong to core.training's own parser
            from core.training import main as train_main

            return train_main(argv[1:])
        args = prepare(argv)
        if getattr(args, "max_seconds", None) is not None and getattr(args, "engine", "local") == "ray":
            raise UserError("--max-seconds bounds a run in this process; with --engine ray its jobs run on the "
                            "actors (stop it with Ctrl-C: the rows written stay)")
        commands = {"run": cmd_run, "calibrate": cmd_calibrate, "sweep": cmd_sweep, "perplexity": cmd_perplexity,
                    "mlm": cmd_mlm, "rpe": cmd_rpe, "doctor": cmd_doctor}
        from core.mechanics import attention

        with _sigint_taken():
            try:
                # every attention call of this thread's passes first asks the budget (an overrun stops at the next
                # layer); without --max-seconds the check is a comparison with None
                with attention.between_layers(args.budget_.check if args.budget_.seconds is not None else None):
                    return commands[args.cmd](args)
            except KeyboardInterrupt:
                return _interrupted(args)
            except timing.OutOfTime as err:
                return _out_of_time(args, err)
    except KeyboardInterrupt:  # before the command started (parsing, imports)
        return _interrupted(None)
    except (UserError, ValueError) as err:
        return _fail(str(err))
    except OSError as err:  # disk full, permission, a vanished file
        return _fail(_os_message(err))
    except MemoryError:
        return _fail("out of memory: use a shorter document")
    except Exception as err:  # noqa: BLE001 - the last line of defence: one line unless debugging
        if type(err).__name__ == "OutOfMemoryError":  # torch's (a RuntimeError), without importing torch here
            return _fail("out of memory on the device: use a shorter document or --device cpu")
        if _debug():
            raise
        first = (str(err).splitlines() or [""])[0][:300]
        print(f"internal error: {type(err).__name__}: {first} (set AAE_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1
