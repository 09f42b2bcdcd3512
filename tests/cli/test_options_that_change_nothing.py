"""An option that changes nothing is refused in one line (CLI exit 2), not silently dropped (issue 36, cause 13).

The probe: ``run --task code --haystack corpus-eval`` exited 0 with no
filler column; ``line`` and ``text`` the same. Which task reads which
document field is one table, :func:`core.runs.settings.unused`: DocumentRequest
checks it on every construction (CLI, settings files, the app, core.runs.apply's
``settings=``), and the CLI checks its explicit options against it first so
its message names the option typed. ``--depth`` is checked only where it
was typed, since the app sends a depth for every task; the app's own
requests (what ui/sidebar.py builds for each task) must still pass.
"""

from __future__ import annotations

import json

import pytest

from core import cli
from core.cli import main
from core.data import tasks
from core.errors import UserError
from core.runs.settings import HAYSTACK_TASKS, DocumentRequest, Settings, unused

NOT_HAYSTACK = [t for t in tasks.GENERATED + ("text",) if t not in HAYSTACK_TASKS]


def _refused(argv: list[str], *words: str) -> str:
    with pytest.raises(UserError) as excinfo:
        cli.prepare(argv)
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


@pytest.fixture
def text_file(tmp_path):
    f = tmp_path / "doc.txt"
    f.write_text("The harbour town kept its records in a stone tower. " * 20, encoding="utf-8")
    return str(f)


# -- the haystack (the probe) -------------------------------------------------------------------------


def test_the_table_agrees_with_the_generators():
    """The tasks the table lets take a filler are the ones the generators read it for (passkey/topic/multidoc
    per core.data.tasks, and lm's prefix), so the refusal cannot drift from what a document really uses."""
    assert set(HAYSTACK_TASKS) == set(tasks.HAYSTACK_TASKS) | {tasks.LM}
    assert NOT_HAYSTACK == ["line", "code", "commonwords", "text"]  # a word list is its own document
    for task in HAYSTACK_TASKS:
        assert unused(task, None, ["haystack"]) == []


@pytest.mark.parametrize("task", ["code", "line"])
def test_haystack_with_a_task_without_filler_is_refused(task, tiny_dir, capsys):
    _refused(
        ["run", "--task", task, "--haystack", "corpus-eval"], "--haystack", f"--task {task}", "always uses its own"
    )
    capsys.readouterr()
    assert main(["run", "--model", str(tiny_dir), "--task", task, "--haystack", "corpus-eval", "--json"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and "--haystack" in out.err


def test_haystack_with_your_own_text_is_refused(text_file):
    _refused(["run", "--text-file", text_file, "--haystack", "corpus-eval"], "--haystack", "--task text")
    _refused(["calibrate", "--task", "text", "--text-file", text_file, "--haystack", "corpus-eval"], "--haystack")


@pytest.mark.parametrize("task", HAYSTACK_TASKS)
def test_haystack_with_a_task_that_reads_it_still_works(task):
    args = cli.prepare(["run", "--task", task, "--haystack", "corpus-eval"])
    assert args.settings_.document.haystack == "corpus-eval"


@pytest.mark.parametrize("task", NOT_HAYSTACK)
def test_the_default_haystack_is_fine_everywhere(task, text_file):
    """``--haystack default`` is what every task gets anyway: not an option that changes nothing to refuse."""
    extra = ["--text-file", text_file] if task == "text" else []
    assert (
        cli.prepare(["run", "--task", task, "--haystack", "default", *extra]).settings_.document.haystack == "default"
    )


# -- your own text's options with a generated task ----------------------------------------------------------------


@pytest.mark.parametrize(
    "option,value", [("--needle", "The code is 7."), ("--question", "What is the code?"), ("--expected", "7")]
)
@pytest.mark.parametrize("task", ["passkey", "code", "lm"])
def test_text_options_with_a_generated_task_are_refused(task, option, value):
    _refused(["run", "--task", task, option, value], option, "only task 'text'")


def test_a_text_file_with_a_generated_task_is_refused(text_file):
    _refused(["run", "--task", "passkey", "--text-file", text_file], "--text-file", "--task passkey")


def test_tokens_with_your_own_text_is_refused(text_file):
    _refused(["run", "--text-file", text_file, "--tokens", "300"], "--tokens", "as long as it is")


# -- depth where there is no needle ---------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["topic", "lm"])
def test_depth_with_a_task_without_depth_is_refused(task):
    _refused(["run", "--task", task, "--depth", "0.2"], "--depth", f"--task {task}")
    _refused(["calibrate", "--task", task, "--depth", "0.9"], "--depth")


def test_depth_with_an_empty_needle_is_refused(text_file):
    _refused(
        ["run", "--text-file", text_file, "--needle", "", "--question", "Where?", "--depth", "0.3"],
        "--depth",
        "empty needle",
    )
    got = cli.prepare(["run", "--text-file", text_file, "--needle", "x.", "--question", "Where?", "--depth", "0.3"])
    assert got.settings_.document.depth == 0.3


@pytest.mark.parametrize("task", ["passkey", "line", "multidoc", "code"])
def test_depth_with_a_task_with_a_needle_still_works(task):
    assert cli.prepare(["run", "--task", task, "--depth", "0.2"]).settings_.document.depth == 0.2


# -- sweep: documents of every --lengths x --depths, or --data ------------------------------------------------


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--tokens", "300"], ["--tokens", "--lengths"]),
        (["--depth", "0.3"], ["--depth", "--depths"]),
        (["--task", "text"], ["--task passkey", "--data"]),
        (["--task", "code", "--haystack", "corpus-eval"], ["--haystack"]),
    ],
)
def test_sweep_refuses_single_document_options(argv, words):
    _refused(["sweep", *argv], *words)


def test_sweep_refuses_a_text_file(text_file):
    _refused(["sweep", "--text-file", text_file], "--data")


@pytest.mark.parametrize(
    "argv",
    [
        ["--task", "code"],
        ["--tokens", "300"],
        ["--lengths", "1x,2x"],
        ["--haystack", "corpus-eval"],
        ["--needle", "n."],
    ],
)
def test_sweep_data_refuses_document_options(argv, tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"id": "a", "context": "Blue birds sing.", "question": "Who sings?"}) + "\n")
    _refused(["sweep", "--data", str(data), *argv], argv[0], "--data")


def test_sweep_with_its_own_options_still_works():
    args = cli.prepare(
        ["sweep", "--task", "topic", "--haystack", "corpus-eval", "--lengths", "1x,2x", "--depths", "0,1"]
    )
    assert args.settings_.document.task == "topic" and args.settings_.document.haystack == "corpus-eval"


# -- settings files, and an explicit --task over one ----------------------------------------------------------


def test_a_settings_file_with_a_filler_for_a_task_without_one_is_refused(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"document": {"task": "code", "haystack": "corpus-eval"}}))
    msg = _refused(["run", "--settings", str(f)], "document", "haystack", "code")
    assert str(f) in msg


def test_an_explicit_task_drops_what_the_file_held_for_its_own_task(tmp_path):
    """The file's corpus filler (passkey) or pasted text is not an option the person gave for --task code:
    the override starts from what the new task reads, instead of refusing or silently keeping it."""
    f = tmp_path / "s.json"
    f.write_text(
        Settings(document=DocumentRequest(task="passkey", haystack="corpus-eval", tokens=300, depth=0.25)).to_json()
    )
    doc = cli.prepare(["run", "--settings", str(f), "--task", "code"]).settings_.document
    assert (doc.task, doc.haystack, doc.tokens, doc.depth) == ("code", "default", 300, 0.25)
    f.write_text(
        Settings(document=DocumentRequest(task="text", text="Some words here.", needle="", question="What?")).to_json()
    )
    doc = cli.prepare(["run", "--settings", str(f), "--task", "passkey"]).settings_.document
    assert (doc.task, doc.text, doc.needle, doc.question) == ("passkey", None, None, None)
    _refused(["sweep", "--settings", str(f)], "--task passkey")  # it used to sweep passkey, silently
    assert cli.prepare(["sweep", "--settings", str(f), "--task", "passkey"]).settings_.document.task == "passkey"


# -- the request itself (what the app and core.runs.apply build) ---------------------------------------------------


@pytest.mark.parametrize(
    "kw,words",
    [
        (dict(task="code", haystack="corpus-eval"), ["haystack", "'code'"]),
        (dict(task="line", haystack="corpus-train"), ["haystack"]),
        (dict(task="text", text="abc", haystack="corpus-eval"), ["haystack"]),
        (dict(task="passkey", needle="n."), ["needle"]),
        (dict(task="multidoc", text="abc", question="q"), ["text", "question", "leave them out"]),
        (dict(task="text", text="abc", tokens=100), ["tokens"]),
    ],
)
def test_the_request_refuses_a_field_its_task_does_not_read(kw, words):
    with pytest.raises(UserError) as excinfo:
        DocumentRequest(**kw)
    msg = str(excinfo.value)
    assert "\n" not in msg and msg.startswith("DocumentRequest:"), msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("task", tasks.GENERATED)
@pytest.mark.parametrize("filler", ["default", "corpus-eval"])
@pytest.mark.parametrize("depth", [0, 35, 100])
def test_what_the_apps_sidebar_builds_still_passes(task, filler, depth):
    """ui/sidebar.py sends a depth for every task (the slider's value, drawn or not) and the filler only for
    tasks.HAYSTACK_TASKS; a pasted text gets no tokens and no filler. All of that must keep working."""
    haystack = filler if task in tasks.HAYSTACK_TASKS else "default"
    DocumentRequest(task=task, tokens=512, depth=depth / 100, seed=3, haystack=haystack)
    for needle, question, expected in (
        (None, None, None),
        ("The colour is teal.", "What colour?", "teal"),
        ("", "What?", None),
    ):
        DocumentRequest(
            task="text",
            depth=depth / 100,
            seed=3,
            text="Words. " * 10,
            needle=needle,
            question=question,
            expected=expected,
        )
