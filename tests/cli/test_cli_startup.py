"""``python -m core --help`` and a bad option are answered before torch or transformers is imported.

Why: importing them takes seconds (14 s at load 3, 38 s at load 8 when ``core.cli`` imported ``core.models``), and
a person who mistyped an option waited that long for one line. The CLI is a package whose commands are imported
only when one runs (:mod:`core.cli.entry`); the option types and the parser import neither
(:mod:`core.cli.options`, :mod:`core.cli.parser`). Each case runs ``python -X importtime`` in a fresh process and
reads the modules it imported from stderr. No wall-clock bound here (a busy machine would make it flaky):
``bench/cli_startup.py`` measures the time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The heavy libraries a parse must not import (the top package or any of its modules).
HEAVY = ("torch", "transformers")
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)\s*$")


def _run(*argv: str) -> tuple[int, list[str], list[str]]:
    """Exit status, the modules imported and the other lines of stderr of ``python -X importtime -m core ARGV``."""
    env = {**os.environ, "AAE_DEBUG": ""}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "core", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    modules, other = [], []
    for line in done.stderr.splitlines():
        m = _IMPORTED.match(line)
        if m:
            modules.append(m.group(1))
        elif not line.startswith("import time:"):
            other.append(line)
    return done.returncode, modules, other


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in HEAVY]


@pytest.mark.slow
def test_the_import_list_is_read():
    """The check itself: a command that runs a model's code imports torch, and the reader sees it (so the
    tests below cannot pass by reading nothing)."""
    rc, modules, _ = _run("doctor", "--json")
    assert rc == 0 and "core.cli" in modules and "torch" in modules and _heavy(modules)


def test_help_imports_no_torch():
    rc, modules, other = _run("--help")
    assert rc == 0 and other == []
    assert "core.cli" in modules and "core.cli.parser" in modules
    assert _heavy(modules) == []


@pytest.mark.parametrize(
    "argv, says",
    [
        (("run", "--bogus"), "error: unrecognized arguments: --bogus (see python -m core --help)"),
        (("bogus",), "error: argument cmd: invalid choice: 'bogus'"),
        (("run", "--tokens", "0"), "error: argument --tokens: Input should be greater than or equal to 1 (got 0)"),
        (("run", "--device", "tpu"), "error: argument --device: Unknown device 'tpu'"),
        (("run", "--dtype", "float16"), "error: argument --dtype: float16 is refused"),
        (("sweep", "--lengths", "infx"), "error: argument --lengths: Input should be a finite number"),
        (("mlm", "--schemes", "bogus"), "error: argument --schemes: Unknown position scheme 'bogus'"),
        (("perplexity", "--copy", "with,bogus", "--sequences", "0"), "error: argument --copy: unknown kind(s) 'bogus'"),
        (("run", "--task", "code", "--haystack", "corpus-eval"), "error: --haystack: not used by --task code"),
    ],
)
def test_a_bad_option_is_one_line_exit_2_without_torch(argv, says):
    rc, modules, other = _run(*argv)
    assert rc == 2
    assert len(other) == 1 and other[0].startswith(says), other
    assert _heavy(modules) == []


def test_a_command_s_help_and_train_s_bad_option_import_no_torch():
    rc, modules, other = _run("sweep", "--help")
    assert rc == 0 and _heavy(modules) == [] and other == []
    rc, modules, other = _run("train", "--steps", "x")  # train's own argparse: its usage block, exit 2
    assert rc == 2 and _heavy(modules) == [] and other[-1].endswith("argument --steps: invalid int value: 'x'")
