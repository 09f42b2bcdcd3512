"""The shipped corpus snapshot: every machine draws the same haystacks, whatever its Python.

Why it exists: on a GPU machine with Python 3.12 the stdlib gave another
paragraph list, so the varied pass key's documents (same seeds) differed and
so did its accuracies (by up to 21 points).
"""

from __future__ import annotations

import gzip
import json
import platform

import pytest

from core.data import corpus
from core.errors import UserError


def _meta() -> dict:
    with gzip.open(corpus.SNAPSHOT, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def test_the_snapshot_is_shipped_intact_and_is_what_the_pools_use():
    data = _meta()
    paras = corpus.read_snapshot(corpus.SNAPSHOT)
    assert paras is not None and len(paras) == data["paragraphs_count"] > 1000
    assert corpus._paragraphs() == paras  # the pools draw from the file, not from this Python's stdlib
    train, evaluation = corpus.split_train_eval(paras)
    assert corpus.pool("train") == tuple(train) and corpus.pool("eval") == tuple(evaluation)
    for p in paras:
        assert p.isascii() and corpus.MIN_WORDS <= len(p.split()) <= corpus.MAX_WORDS


@pytest.mark.skipif(
    platform.python_version() != _meta()["python"],
    reason="the stdlib of another Python release gives another list (that is why it is shipped)",
)
def test_the_snapshot_equals_this_pythons_harvest():
    """On the Python that wrote it, rebuilding gives the same list, byte for byte."""
    assert corpus._harvest() == corpus.read_snapshot(corpus.SNAPSHOT)


def test_write_then_read_round_trips_and_is_deterministic(tmp_path):
    a, b = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    meta = corpus.write_snapshot(a)
    corpus.write_snapshot(b)
    assert a.read_bytes() == b.read_bytes()  # same list, same bytes (gzip mtime 0)
    assert meta["python"] == platform.python_version() and corpus.read_snapshot(a) == corpus._harvest()


def test_missing_means_harvest_and_damaged_is_one_line(tmp_path):
    assert corpus.read_snapshot(tmp_path / "none.json.gz") is None
    bad = tmp_path / "bad.json.gz"
    cases = [
        b"not gzip at all",
        gzip.compress(b"{not json"),
        gzip.compress(json.dumps({"paragraphs": [1, 2], "sha256": "x"}).encode()),
        gzip.compress(json.dumps({"paragraphs": ["a b c"], "sha256": "0" * 64}).encode()),  # edited after writing
        gzip.compress(json.dumps({"sha256": "0" * 64}).encode()),
    ]
    for raw in cases:
        bad.write_bytes(raw)
        with pytest.raises(UserError) as err:
            corpus.read_snapshot(bad)
        msg = str(err.value)
        assert "\n" not in msg and "damaged" in msg and "python -m core.data.corpus --write" in msg
