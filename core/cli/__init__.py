"""``python -m core run | calibrate | sweep | perplexity | mlm | rpe | doctor | train``: the headless contract.

Exit status 0 on success; 2 with one line ``error: ...`` on stderr for
anything the user can fix (unknown model, empty text, a bad option or
settings file, a document too long for this machine's memory, NaN attention,
a file that cannot be read or written: disk full, permission). JSON goes to
stdout; progress bars go to stderr, so ``--json`` output can be piped.
Ctrl-C: exit 130; a spent ``--max-seconds``: exit 124 (:mod:`core.cli.signals`).

Anything else is a bug: exit 1 with one line ``internal error: <Type>:
<message> (set AAE_DEBUG=1 for the traceback)``; with ``AAE_DEBUG=1`` in the
environment the traceback is shown instead.

Order of checks, so that no input can eat the machine: every option is
parsed and bounded (:mod:`core.values.validation`) and the settings are validated
(:func:`prepare`, no model needed); then the model is loaded and every
length is checked against this machine's memory (:func:`core.runs.engine.max_tokens`)
before any document is built; output files are written only after that.

The package, one concern a module:

- :mod:`~core.cli.entry`: :func:`main`, every ending turned into an exit status and one line;
- :mod:`~core.cli.parser`: the argparse tree, the option groups several commands share written once;
- :mod:`~core.cli.options`: the option types (``type=``), torch-free;
- :mod:`~core.cli.preflight`: :func:`prepare`, everything checked before a model loads;
- :mod:`~core.cli.settings_merge`: a ``--settings`` file and the options typed, as one Settings;
- :mod:`~core.cli.model`: the model loaded, lengths checked against this machine;
- :mod:`~core.cli.progress`: bars, the layers ticker, the budget's refusal by estimate;
- :mod:`~core.cli.ray_engine`: ``--engine ray``'s options and pool;
- :mod:`~core.cli.signals`: Ctrl-C and ``--max-seconds``, exits 130 and 124;
- one module per command (:mod:`~core.cli.run`, ``calibrate``, ``sweep``, ``perplexity``, ``mlm``, ``rpe``,
  ``doctor``), each with ``command(args) -> int``, imported only when that command runs (``train`` is
  :mod:`core.training.cli`).

Why a package: ``--help`` and a bad option are answered before torch or transformers is imported (they take
seconds; ``python -X importtime -m core --help`` lists neither, tests/cli/test_cli_startup.py), because only the
command that runs imports what it runs.
"""

from core.cli.entry import main
from core.cli.parser import build_parser
from core.cli.preflight import prepare
from core.cli.signals import EXIT_INTERRUPTED, EXIT_OUT_OF_TIME

__all__ = ["EXIT_INTERRUPTED", "EXIT_OUT_OF_TIME", "build_parser", "main", "prepare"]
