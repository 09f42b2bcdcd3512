"""``main(argv)``: the one entry point, which turns every way a command can end into an exit status and at most one
line on stderr (the contract in :mod:`core.cli`).

Why the commands are imported here, by name, only once their options are read: a command's module imports what
it runs (torch, transformers, pandas), which takes seconds on a busy machine; ``--help`` and a bad option must not
wait for it (``python -X importtime -m core --help`` imports no torch; tests/cli/test_cli_startup.py).
"""

from __future__ import annotations

import importlib
import os
import sys

from core.cli.preflight import prepare
from core.cli.signals import interrupted, out_of_time, quiet_after_first, sigint_taken
from core.errors import UserError
from core.runs.timing import OutOfTime

#: The commands, each a module of this package with ``command(args) -> int`` (``train`` has its own parser:
#: :mod:`core.training.cli`).
COMMANDS = ("run", "calibrate", "sweep", "perplexity", "mlm", "rpe", "doctor", "models")


def _fail(message: str) -> int:
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
    return 2


def _os_message(err: OSError) -> str:
    where = f": {err.filename}" if getattr(err, "filename", None) else ""
    return f"{err.strerror or type(err).__name__}{where}"


def _debug() -> bool:
    return os.environ.get("AAE_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def _command(name: str):
    """The ``command`` function of ``core.cli.<name>``, imported now (only the command that runs pays for its
    imports)."""
    if name not in COMMANDS:  # "train" after an option: as a missing key always was, an internal error
        raise KeyError(name)
    return importlib.import_module(f"core.cli.{name}").command


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. ``argv`` None: the process's own arguments (``python -m core``), and then
    after a first Ctrl-C the process ignores SIGINT until it ends (:func:`~core.cli.signals.quiet_after_first`); a
    caller in-process passes its ``argv`` and keeps its own SIGINT handler."""
    if argv is None:
        quiet_after_first()
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["train"]:  # its options belong to core.training's own parser
            from core.training.cli import main as train_main

            return train_main(argv[1:])
        args = prepare(argv)
        if getattr(args, "max_seconds", None) is not None and getattr(args, "engine", "local") == "ray":
            raise UserError(
                "--max-seconds bounds a run in this process; with --engine ray its jobs run on the "
                "actors (stop it with Ctrl-C: the rows written stay)"
            )
        command = _command(args.cmd)
        from core.mechanics import attention

        with sigint_taken():
            try:
                # every attention call of this thread's passes first asks the budget (an overrun stops at the next
                # layer); without --max-seconds the check is a comparison with None
                with attention.between_layers(args.budget_.check if args.budget_.seconds is not None else None):
                    return command(args)
            except KeyboardInterrupt:
                return interrupted(args)
            except OutOfTime as err:
                return out_of_time(args, err)
    except KeyboardInterrupt:  # before the command started (parsing, imports)
        return interrupted(None)
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
