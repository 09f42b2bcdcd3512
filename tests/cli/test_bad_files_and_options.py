"""No settings file, model card or option list crashes the CLI: each is a value or one line naming the field.

Property tests (hypothesis) feed arbitrary JSON and arbitrary option values to
the validators; explicit tests pin each failure the hostile-user probes of
issue 25 found. Nothing here loads a model: the parsing layer
(:func:`core.cli.prepare`) validates everything before a model is needed.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from core import cli
from core.errors import ModelLoadError, UserError
from core.kinds import KINDS
from core.models.catalog import _folder_train_length, read_card
from core.runs.methods import NAMES as METHODS
from core.runs.settings import DocumentRequest, Settings
from core.runs.temperature import CRITERIA
from core.values.schedule import TAU_MAX, TAU_MIN, Schedule
from core.values.validation import MAX_LENGTH, MAX_TEXT_CHARS

FAST = hsettings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# huge whole numbers (no float holds 10**400: an OverflowError used to escape) and subnormal floats (a tau of
# 5e-324 is 0 in float32) beside the ordinary ones (issue 36)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([10**400, -(10**400), 10**309, 5e-324, -5e-324, 1e-310, 1e-46])
    | st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)

# -- valid settings, built from the documented ranges ----------------------------------

positive = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)
taus = (
    positive
    | st.lists(positive, min_size=1, max_size=4)
    | st.integers(1, 4).flatmap(lambda h: st.lists(st.lists(positive, min_size=h, max_size=h), min_size=1, max_size=3))
)


def _request(task, tokens, depth, seed, text, needle):
    """A request as its task reads it: the pasted-text fields only for ``text``, tokens only for a generated task
    (DocumentRequest refuses a field its task ignores, issue 36)."""
    if task == "text":
        return DocumentRequest(task=task, depth=depth, seed=seed, text=text, needle=needle)
    return DocumentRequest(task=task, tokens=tokens, depth=depth, seed=seed)


documents = st.builds(
    _request,
    task=st.sampled_from(("passkey", "line", "topic", "multidoc", "code", "text")),
    tokens=st.none() | st.integers(1, MAX_LENGTH),
    depth=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**63 - 1),
    text=st.none() | st.text(max_size=50),
    needle=st.none() | st.text(max_size=20),
)
valid_settings = st.builds(
    Settings,
    model=st.none() | st.text(min_size=1, max_size=20),
    train_length=st.none() | st.integers(2, MAX_LENGTH),
    method=st.sampled_from([m for m in METHODS if m != "fixed"]),
    tau=st.none() | taus,
    criterion=st.sampled_from(CRITERIA),
    targets=st.lists(st.sampled_from(KINDS), max_size=3).map(tuple),
    cosine_scale=st.none() | positive,
    chosen_at=st.none() | st.integers(1, MAX_LENGTH),
    document=documents,
)


def _is_valid(s: Settings) -> None:
    """What every Settings must satisfy, however it was made (the guarantees the rest of core relies on)."""
    assert s.method in METHODS and s.criterion in CRITERIA and set(s.targets) <= set(KINDS)
    assert s.train_length is None or (type(s.train_length) is int and 2 <= s.train_length <= MAX_LENGTH)
    assert s.cosine_scale is None or (math.isfinite(s.cosine_scale) and s.cosine_scale > 0)
    if s.tau is not None:  # one Schedule, within the stated bounds, whatever shape
        assert isinstance(s.tau, Schedule) and Schedule.of(s.tau.to_json()) == s.tau
        flat = np.ravel(s.tau.to_json()) if s.tau.rows is None else []
        assert all(math.isfinite(x) and TAU_MIN <= x <= TAU_MAX for x in flat)
    assert s.method != "fixed" or s.tau is not None
    d = s.document
    assert 0.0 <= d.depth <= 1.0
    assert d.tokens is None or (type(d.tokens) is int and 1 <= d.tokens <= MAX_LENGTH)
    assert all(
        v is None or (isinstance(v, str) and len(v) <= MAX_TEXT_CHARS)
        for v in (d.text, d.needle, d.question, d.expected)
    )


@FAST
@given(json_values)
def test_any_json_is_settings_or_one_line_user_error(value):
    try:
        s = Settings.from_dict(value, where="Settings file x.json")
    except UserError as err:
        msg = str(err)
        assert "\n" not in msg and msg.startswith("Settings file x.json") and "pydantic" not in msg
        return
    _is_valid(s)


@FAST
@given(valid_settings, st.data())
def test_mutated_valid_settings_are_settings_or_one_line_user_error(s, data):
    d = s.to_dict()
    doc_field = data.draw(st.booleans())
    target = d["document"] if doc_field else d
    key = data.draw(st.sampled_from(sorted(target)) | st.text(max_size=8))
    target[key] = data.draw(json_values)
    try:
        out = Settings.from_dict(d)
    except UserError as err:
        assert "\n" not in str(err)
        return
    _is_valid(out)


@FAST
@given(valid_settings)
def test_valid_settings_round_trip_through_the_file(s):
    _is_valid(s)
    assert Settings.from_dict(s.to_dict()) == s
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "s.json"
        f.write_text(s.to_json())
        assert Settings.load(f) == s


@FAST
@given(json_values)
def test_any_card_json_is_a_card_or_one_line_model_load_error(value):
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "card.json").write_text(json.dumps(value))
        try:
            card = read_card(Path(tmp))
            lt = _folder_train_length(Path(tmp))
        except ModelLoadError as err:
            assert "\n" not in str(err) and "card.json" in str(err)
            return
    assert lt is None or (type(lt) is int and 2 <= lt <= MAX_LENGTH)
    assert card is None or lt == card.train_length


# -- the CLI's parsing layer --------------------------------------------------------------

numbers = (
    st.integers(-(10**12), 10**12).map(str)
    | st.floats(allow_nan=True, allow_infinity=True).map(repr)
    | st.sampled_from(
        [
            "0",
            "1",
            "2",
            "-1",
            "nan",
            "inf",
            "-inf",
            "1e30",
            "1e30x",
            "infx",
            "nanx",
            "0x",
            "-2x",
            "1.5x",
            "",
            " ",
            ",",
            "3,",
            "1,2",
            "encoder",
            "encoder,cross",
            "bogus",
            "cuda:0",
            "cpu",
            "auto",
            "x",
        ]
    )
)
values = numbers | st.text(max_size=12).filter(lambda t: not t.startswith("-"))
OPTIONS = {
    "run": [
        "--tokens",
        "--train-length",
        "--depth",
        "--seed",
        "--tau",
        "--method",
        "--targets",
        "--device",
        "--cosine-scale",
        "--samples",
        "--task",
        "--model",
    ],
    "sweep": [
        "--tokens",
        "--train-length",
        "--depth",
        "--lengths",
        "--depths",
        "--methods",
        "--batch-size",
        "--max-new-tokens",
        "--samples",
        "--tau",
        "--targets",
        "--device",
    ],
    "rpe": ["--train-length", "--length", "--query", "--model"],
}


def _argv(cmd: str, pairs: list[tuple[str, str]]) -> list[str]:
    argv = [cmd] + [x for pair in pairs for x in pair]
    return argv + ["--out", "rows.csv"] if cmd == "rpe" else argv


@FAST
@given(
    st.sampled_from(sorted(OPTIONS)).flatmap(
        lambda cmd: st.tuples(st.just(cmd), st.lists(st.tuples(st.sampled_from(OPTIONS[cmd]), values), max_size=4))
    )
)
def test_any_option_values_parse_or_are_one_line_user_errors(case):
    cmd, pairs = case
    argv = _argv(cmd, pairs)
    try:
        args = cli.prepare(argv)
    except UserError as err:
        assert "\n" not in str(err)
        return
    st_ = args.settings_
    if cmd == "rpe":
        assert args.length is None or 1 <= args.length
        assert args.query is None or args.length is None or args.query < args.length
        return
    _is_valid(st_)
    assert args.samples >= 1
    if args.tokens is not None:
        assert st_.document.tokens == args.tokens
    if args.tau is not None:
        assert st_.method == "fixed" and float(st_.tau) == args.tau
    if cmd == "sweep":
        for value, multiple in args.lengths or []:
            assert math.isfinite(value) and value > 0 and (multiple or 1 <= value <= MAX_LENGTH)
        assert all(0.0 <= d <= 1.0 for d in args.depths)
        assert args.batch_size >= 1 and args.max_new_tokens >= 1


@hsettings(max_examples=40, deadline=None)
@given(
    st.sampled_from(sorted(OPTIONS)).flatmap(
        lambda cmd: st.tuples(
            st.just(cmd), st.lists(st.tuples(st.sampled_from(OPTIONS[cmd]), numbers), min_size=1, max_size=3)
        )
    )
)
def test_refused_options_make_main_exit_2_with_one_line(case):
    """Where the parsing layer refuses, ``main`` exits 2 with one line (and loads nothing: it stops there)."""
    cmd, pairs = case
    argv = _argv(cmd, pairs)
    try:
        cli.prepare(argv)
    except UserError:
        pass
    else:
        assume(False)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli.main(argv) == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")


# -- explicit cases from the probes ------------------------------------------------------------


def _main(capsys, argv) -> str:
    """Run the CLI; it must exit 2 with exactly one line on stderr, which is returned."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize(
    "content,needle",
    [
        ("[1, 2]", "top level must be a JSON object, got list"),
        ("null", "got null"),
        ('"a string"', "got str"),
        ('{"tau": "0.7", "method": "fixed"}', "tau:"),
        ('{"tau": {"a": 1}}', "tau:"),
        ('{"tau": NaN, "method": "fixed"}', "tau:"),
        ('{"tau": [0.5, -1]}', "tau:"),
        ('{"train_length": "512"}', "train_length:"),
        ('{"cosine_scale": "16"}', "cosine_scale:"),
        ('{"document": {"depth": "0.5"}}', "document.depth:"),
        ('{"document": {"depth": Infinity}}', "document.depth:"),
        ('{"document": {"text": 42}}', "document.text:"),
        ('{"document": {"tokens": 0}}', "document.tokens:"),
        ('{"targets": "enc"}', "targets: targets must be some of encoder, decoder, cross (got enc)"),  # Choice's rule
        ('{"model": 5}', "model:"),
        ('{"surprise": 1}', "surprise: unknown key"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_settings_file_is_one_line_naming_the_field(tmp_path, capsys, content, needle):
    f = tmp_path / "x.json"
    f.write_text(content)
    line = _main(capsys, ["run", "--settings", str(f)])
    assert needle in line and f"Settings file {f}" in line and "errors.pydantic" not in line


def test_settings_file_that_is_a_folder_is_one_line(tmp_path, capsys):
    assert "is a folder" in _main(capsys, ["run", "--settings", str(tmp_path)])


def test_a_string_target_is_one_target_not_its_letters():
    assert Settings.from_dict({"targets": "encoder"}).targets == ("encoder",)
    assert Settings.from_dict({"targets": "cross"}).targets == ("cross",)


@pytest.mark.parametrize(
    "argv,option",
    [
        (["run", "--tokens", "0"], "--tokens"),
        (["run", "--tokens", "1000000000"], "--tokens"),
        (["run", "--train-length", "0"], "--train-length"),
        (["run", "--device", "bogus"], "--device"),
        (["run", "--tau", "nan"], "--tau"),
        (["run", "--tau", "-1"], "--tau"),
        (["run", "--depth", "inf"], "--depth"),
        (["run", "--samples", "-3"], "--samples"),
        (["run", "--targets", "encoder,enc"], "--targets"),
        (["sweep", "--lengths", "infx"], "--lengths"),
        (["sweep", "--lengths", "nan"], "--lengths"),
        (["sweep", "--lengths", "300,-5"], "--lengths"),
        (["sweep", "--lengths", "0"], "--lengths"),
        (["sweep", "--lengths", "1e30x"], "--lengths"),
        (["sweep", "--batch-size", "0"], "--batch-size"),
        (["sweep", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["sweep", "--methods", "none,inf"], "--methods"),
        (["sweep", "--depths", "0.5,nan"], "--depths"),
        (["rpe", "--length", "0", "--out", "x.csv"], "--length"),
        (["rpe", "--length", "2000000", "--out", "x.csv"], "--length"),
    ],
)
def test_meaningless_option_is_refused_naming_it(capsys, argv, option):
    assert option in _main(capsys, argv)


def test_train_length_zero_is_not_taken_as_missing(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(Settings(train_length=300).to_json())
    assert cli.prepare(["run", "--settings", str(f)]).settings_.train_length == 300
    assert cli.prepare(["run", "--settings", str(f), "--train-length", "400"]).settings_.train_length == 400
    with pytest.raises(UserError, match="--train-length"):
        cli.prepare(["run", "--settings", str(f), "--train-length", "0"])


@pytest.mark.parametrize(
    "make,needle",
    [
        (lambda d: d / "missing" / "out.csv", "does not exist"),
        (lambda d: d, "is a folder"),
    ],
)
def test_rpe_out_is_checked_before_any_work(tmp_path, capsys, make, needle):
    assert needle in _main(capsys, ["rpe", "--model", "no-such-model", "--out", str(make(tmp_path))])


def test_text_file_problems_are_one_line(tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    assert "not UTF-8" in _main(capsys, ["run", "--text-file", str(bad)])
    assert "is a folder" in _main(capsys, ["run", "--text-file", str(tmp_path)])
    assert "Cannot read --text-file" in _main(capsys, ["run", "--text-file", str(tmp_path / "nope.txt")])


def test_document_request_filler(tiny):
    from core.errors import UserError
    from core.runs.settings import DocumentRequest

    fixed = [DocumentRequest(task="passkey", tokens=300, seed=s).build(tiny.tokenizer, 256) for s in (1, 2)]
    varied = [
        DocumentRequest(task="passkey", tokens=300, seed=s, haystack="corpus-eval").build(tiny.tokenizer, 256)
        for s in (1, 2)
    ]
    strip = lambda d: d.text.replace(d.expected, "")  # noqa: E731 - the documents without their keys
    assert strip(fixed[0]) == strip(fixed[1])  # the paper's filler: only the key differs
    assert strip(varied[0]) != strip(varied[1]) and varied[0].meta["haystack"] == "corpus-eval"
    with pytest.raises(UserError, match="haystack"):
        DocumentRequest(task="passkey", haystack="elsewhere")
