"""Properties of the JSONL reader: any line gives a document, None (blank) or a UserError, never anything else."""

from __future__ import annotations

import json
import os
import re
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.cli import main
from core.data import tasks
from core.errors import UserError
from core.experiments import batch

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BRACKETY = st.text(alphabet=st.sampled_from('[]{}"\\ab:,\u00e9\ud800'), max_size=12) | st.text(max_size=12)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | BRACKETY
JSON = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(BRACKETY, inner, max_size=3), max_leaves=12
)
FIELDS = st.sampled_from(["text", "context", "question", "expected", "id", "other"])


def _outcome(raw: str):
    """parse_line's result, or the UserError it raised (any other exception fails the test)."""
    try:
        got = batch.parse_line(raw)
    except UserError as err:
        return err
    assert got is None or (isinstance(got, tuple) and isinstance(got[1], tasks.Document)), got
    if got is not None:
        ident, doc = got
        assert ident is None or (isinstance(ident, str) and ident.strip())
        assert doc.text.strip()
        for text in (doc.text, doc.expected, ident or ""):
            text.encode("utf-8")  # it can be tokenised and written to the CSV
    return got


def _depth(v) -> int:
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    return 0


@FAST
@given(st.text(max_size=200))
def test_any_text_line(raw):
    _outcome(raw)


@FAST
@given(JSON)
def test_any_json_value(value):
    _outcome(json.dumps(value))


@FAST
@given(st.dictionaries(FIELDS, JSON | BRACKETY, max_size=5))
def test_any_object_with_our_fields(obj):
    got = _outcome(json.dumps(obj))
    if isinstance(got, tuple) and "text" in obj and "question" not in obj:
        assert got[1].text == obj["text"]  # a "text" alone is the whole encoder input, as it is


@FAST
@given(
    JSON, st.integers(0, 130).flatmap(lambda n: st.lists(st.sampled_from("[{"), min_size=n, max_size=n)), st.booleans()
)
def test_nesting_bound_matches_the_true_depth(inner, wrappers, as_field):
    """Brackets and escaped quotes inside strings do not count; the bound is exact on real JSON."""
    value = inner
    for w in reversed(wrappers):
        value = [value] if w == "[" else {'k\\"[': value}
    if as_field:
        value = {"text": "doc", "meta": value}
    got = _outcome(json.dumps(value))
    too_deep = isinstance(got, UserError) and "nested deeper" in str(got)
    assert too_deep == (_depth(value) > batch.MAX_DEPTH), (_depth(value), got)


@FAST
@given(st.lists(st.binary(max_size=60) | JSON.map(lambda v: json.dumps(v).encode()), max_size=8))
def test_read_jsonl_reports_each_bad_line_once(tiny, lines):
    data = b"\n".join(lines) + b"\n"
    reports: list[str] = []
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        items = batch.read_jsonl(path, tiny.tokenizer, reports.append)
    finally:
        os.unlink(path)
    physical = data.split(b"\n")[:-1]
    bad = [int(re.fullmatch(r"line (\d+): .+; skipped", m, re.S).group(1)) for m in reports]
    good = [it.line for it in items]
    assert len(set(bad)) == len(bad) and not set(bad) & set(good)
    for n, raw in enumerate(physical, 1):
        try:
            blank = not raw.decode("utf-8").lstrip("\ufeff" if n == 1 else "").strip()
        except UnicodeDecodeError:
            blank = False
        assert (n in bad or n in good) != blank, (n, raw, reports)
    assert all(len(it.ids) > 0 for it in items)


def test_a_100000_deep_line_is_one_bad_line_and_the_rest_runs(tiny_dir, tmp_path, capsys):
    data = tmp_path / "docs.jsonl"
    deep = '{"text": "x", "meta": ' + "[" * 100_000 + "]" * 100_000 + "}"
    data.write_text(
        "\n".join(
            [
                json.dumps({"id": "a", "text": "First document."}),
                deep,
                "[" * 100_000,
                json.dumps({"id": "b", "text": "Last document."}),
            ]
        )
        + "\n"
    )
    out = tmp_path / "rows.csv"
    capsys.readouterr()
    assert main(["sweep", "--model", str(tiny_dir), "--data", str(data), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    for n in (2, 3):
        assert f"line {n}: nested deeper than {batch.MAX_DEPTH} levels; skipped" in err
    assert out.read_text().count("\n") == 3  # header + the two good documents
    assert "Traceback" not in err


def test_an_overlong_line_is_one_bad_line(tiny, tmp_path):
    data = tmp_path / "docs.jsonl"
    with open(data, "wb") as f:
        f.write(json.dumps({"text": "first"}).encode() + b"\n")
        f.write(b'{"text": "' + b"a" * (batch.MAX_LINE_BYTES + 10) + b'"}\n')
        f.write(json.dumps({"text": "third"}).encode() + b"\n")
    reports: list[str] = []
    items = batch.read_jsonl(data, tiny.tokenizer, reports.append)
    assert [it.line for it in items] == [1, 3]
    assert reports == [f"line 2: longer than {batch.MAX_LINE_BYTES // 2**20} MiB; skipped"]
