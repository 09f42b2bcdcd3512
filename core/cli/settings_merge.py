"""A ``--settings`` file merged with the options typed (the options win), validated as one Settings, no model needed.

Why here and not in :mod:`core.runs.settings`: which option overrides which field, and which typed option a command
would not read (refused, not dropped), are the command line's rules; the Settings type and its table of which task
reads which document field (:func:`core.runs.settings.unused`) are the library's, shared with the app and
``core.apply``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from core.errors import UserError
from core.runs import methods
from core.values.validation import MAX_TEXT_CHARS


def read_text(path: str) -> str:
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
DOC_OPTIONS = {
    "tokens": "--tokens",
    "depth": "--depth",
    "haystack": "--haystack",
    "text": "--text-file",
    "needle": "--needle",
    "question": "--question",
    "expected": "--expected",
}


def refuse_unused(args, over: dict, file_doc) -> None:
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
    given = [f for f in over if f in DOC_OPTIONS and not (f == "haystack" and over[f] == "default")]
    if args.cmd == "sweep":
        instead = {"tokens": "--lengths", "depth": "--depths"}
        if getattr(args, "data", None):
            given += ["task"] if args.task else []
            bad = [f for f in given if f in DOC_OPTIONS or f == "task"]
            if bad or args.lengths is not None:
                names = [DOC_OPTIONS.get(f, "--" + f) for f in bad] + (
                    ["--lengths"] if args.lengths is not None else []
                )
                raise UserError(
                    f"{', '.join(names)}: not used by sweep --data (each JSONL line is its own document); "
                    f"leave {'it' if len(names) == 1 else 'them'} out"
                )
        for f in given:
            if f in instead:
                raise UserError(
                    f"{DOC_OPTIONS[f]}: not used by sweep, which makes documents of every --lengths x "
                    f"--depths; use {instead[f]}"
                )
        if task == "text" and not getattr(args, "data", None):  # it used to sweep passkey instead, silently
            raise UserError(
                "sweep generates its documents: choose --task passkey, line, topic, multidoc or code "
                "(the task here is text); for your own texts use sweep --data FILE.jsonl"
            )
    bad = unused(task, needle, given)
    if bad:
        names = ", ".join(DOC_OPTIONS[f] for f in bad)
        raise UserError(
            f"{names}: not used by --task {task} ({why_unused(task, needle, bad[0])}); "
            f"leave {'it' if len(bad) == 1 else 'them'} out"
        )


def merge_settings(args):
    """Merge a --settings file with explicit options (options win); validated as one Settings."""
    from core.runs.settings import Settings

    base = Settings.load(args.settings) if getattr(args, "settings", None) else Settings()
    text = read_text(args.text_file) if getattr(args, "text_file", None) else None
    over = {
        k: v
        for k, v in {
            "task": args.task or ("text" if text is not None else None),
            "tokens": args.tokens,
            "depth": args.depth,
            "seed": args.seed,
            "haystack": args.haystack,
            "text": text,
            "needle": args.needle,
            "question": args.question,
            "expected": args.expected,
        }.items()
        if v is not None
    }
    refuse_unused(args, over, base.document)
    if over.get("task", base.document.task) != base.document.task:  # the file's text/filler were for its own task
        base = replace(base, document=base.document.for_task(over["task"]))
    doc = replace(base.document, **over) if over else base.document
    method, tau = base.method, base.tau
    scheme = getattr(args, "scheme", None)
    if args.tau is not None:
        method, tau = methods.FIXED, args.tau
    elif args.method:
        method, tau = methods.parse(args.method)
    return Settings(
        model=args.model if args.model is not None else base.model,
        train_length=args.train_length if args.train_length is not None else base.train_length,
        method=method,
        tau=tau,
        criterion=base.criterion,
        targets=args.targets or base.targets,
        cosine_scale=args.cosine_scale if args.cosine_scale is not None else base.cosine_scale,
        chosen_at=base.chosen_at,
        document=doc,
        # --scheme (run's; a Scheme its one parser made) replaces the file's scheme and its parameters whole
        scheme=scheme.name if scheme is not None else base.scheme,
        scheme_params=scheme.param_dict if scheme is not None else dict(base.scheme_params),
        # the file's gamma belongs to the file's method: kept while that method runs, dropped with --tau/--method
        method_params=dict(base.method_params) if method == base.method else {},
    )


def has_scheme(chosen) -> bool:
    """Whether settings ask for a position scheme other than the plain one as trained (the file's field, checked
    when the settings were made; the plain scheme takes no parameters)."""
    from core.values import positions

    return chosen.scheme.strip() != positions.PLAIN


def no_scheme(chosen, command: str) -> None:
    """A settings file's position scheme, refused by a command that would not apply it (rather than dropped)."""
    if has_scheme(chosen):
        raise UserError(
            f"--settings: scheme '{chosen.to_choice(1.0).scheme}': {command} "
            "runs the plain scheme only; use `run` with these settings, or `mlm --schemes`"
        )
