"""How a command stops early: Ctrl-C (exit 130) and a spent ``--max-seconds`` (exit 124), each in one line that
says what stays.

Why a module: :func:`core.cli.entry.main` wraps every command in :func:`sigint_taken` and words both stops the same
way for all of them, after their progress bars are closed; the exit statuses are the shell's conventions (128 +
SIGINT, GNU timeout's 124).
"""

from __future__ import annotations

import contextlib
import sys

#: Commands whose ``--out`` keeps rows as they finish, so ``--resume`` can run the rest.
RESUMABLE = ("sweep", "perplexity", "mlm")
#: Exit status of a command stopped by its ``--max-seconds`` (GNU timeout's).
EXIT_OUT_OF_TIME = 124
#: Exit status after Ctrl-C (SIGINT): 128 + 2.
EXIT_INTERRUPTED = 130


def kept(args) -> str:
    """What a stopped command leaves: the rows in its --out, or nothing."""
    out = getattr(args, "out", None)
    if getattr(args, "cmd", None) in RESUMABLE:
        return f"the rows written so far stay in {out}; --resume runs the rest" if out else "no --out, nothing kept"
    return "nothing written" if args is not None else "stopped before it finished"


def interrupted(args) -> int:
    """Ctrl-C: the jobs still out were cancelled; one line saying what stays, exit 130 (128 + SIGINT)."""
    print(f"interrupted: {kept(args)}", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def out_of_time(args, err: BaseException) -> int:
    """``--max-seconds`` spent: one line saying where it stopped and what stays, exit 124."""
    print(f"out of time: {' '.join(str(err).split())}; {kept(args)}", file=sys.stderr, flush=True)
    return EXIT_OUT_OF_TIME


def _once(signum, frame) -> None:
    """The process's SIGINT handler: the first raises KeyboardInterrupt, and from then on SIGINT is ignored."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def quiet_after_first() -> None:
    """For ``python -m core`` (the process's own entry): the first Ctrl-C stops the command, later ones are ignored.

    Why: a second Ctrl-C 20-200 ms after the first (issue 58, point 5) ended the process by SIGINT (exit -2, after
    the "interrupted:" line) instead of exit 130: the command was already stopping, but the interpreter's shutdown
    resets a Python SIGINT handler to the default, which kills the process. A SIGINT set to ignored stays so
    through the shutdown. The handler ignores SIGINT itself before raising, so no second KeyboardInterrupt can
    land in the handler that reports the first. Installed whatever SIGINT was before (a background job's ignored
    SIGINT too: see :func:`sigint_taken`). Only the main thread can set it."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _once)


@contextlib.contextmanager
def sigint_taken():
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
