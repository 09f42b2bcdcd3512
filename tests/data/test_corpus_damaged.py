"""A damaged corpus snapshot is refused in one line naming it, fast and in bounded memory (issue 36, cause 9).

Why: a gzip bomb in ``assets/corpus/paragraphs.json.gz`` (8 MB expanding to
8 GiB) reached 5.4 GB of memory before a misleading "use a shorter document",
and a snapshot whose sha256 matched but whose paragraphs were ``[]``, one
word, one 54 MB paragraph or held a NUL ended in "empty range for
randrange()" inside a task. Every damaged copy here is made in tmp_path from
the real snapshot and read through the real :func:`core.data.corpus.read_snapshot`.
"""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from pathlib import Path

import pytest

from core.data import corpus
from core.errors import UserError

MiB = 1 << 20


def _real() -> list[str]:
    return list(corpus.read_snapshot(corpus.SNAPSHOT))


def _snapshot(path: Path, paras, digest: bool = True) -> Path:
    """A snapshot of ``paras`` whose sha256 matches them (so only the content can be what is refused)."""
    data = {"python": "3.11.7", "paragraphs_count": len(paras), "sha256": corpus._digest(paras) if digest else "0"}
    path.write_bytes(gzip.compress(json.dumps({**data, "paragraphs": paras}).encode("utf-8"), 1))
    return path


def _refused(path: Path) -> UserError:
    with pytest.raises(UserError) as err:
        corpus.read_snapshot(path)
    e = err.value
    cli, app = str(e), e.app_text
    assert "\n" not in cli and "damaged" in cli and str(path) in cli and "python -m core.data.corpus --write" in cli, (
        cli
    )
    assert "\n" not in app and path.name in app and str(path.parent) not in app, app  # its name, no server path
    return e


def _bomb_one_member(path: Path, expands_to: int) -> Path:
    """One gzip member of ``expands_to`` zero bytes (64 MiB -> ~65 KB)."""
    c = zlib.compressobj(1, zlib.DEFLATED, 31)  # wbits 31: a gzip header and trailer
    zeros = bytes(MiB)
    path.write_bytes(b"".join([c.compress(zeros) for _ in range(expands_to // MiB)] + [c.flush()]))
    return path


def _bomb_many_members(path: Path, expands_to: int) -> Path:
    """The issue's bomb: gzip members of 1 MiB of zeros each, concatenated (8 GiB from ~8.6 MB); cheap to make."""
    member = gzip.compress(bytes(MiB), 9)
    path.write_bytes(member * (expands_to // MiB))
    return path


@pytest.mark.parametrize(
    "make, expands_to, reason",
    [
        (_bomb_one_member, 64 * MiB, "expands past"),  # small file: stopped by the decompressed cap
        (_bomb_many_members, 8 << 30, "more than the"),  # 8 MB file: stopped before decompressing at all
        (_bomb_many_members, 5 * MiB, "expands past"),  # 5 KB of members: the cap holds across members
    ],
    ids=["64MiB-one-member", "8GiB-8MB-file", "5MiB-members"],
)
def test_a_gzip_bomb_is_refused_in_bounded_memory_and_time(tmp_path, make, expands_to, reason):
    bomb = make(tmp_path / "paragraphs.json.gz", expands_to)
    tracemalloc.start()
    try:
        err = _refused(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reason in str(err)
    assert peak < 4 * corpus.MAX_SNAPSHOT_BYTES, f"{peak / MiB:.0f} MiB held while refusing"  # never inflated whole


def test_the_cap_leaves_room_for_the_real_snapshot_and_long_prose():
    raw = gzip.decompress(corpus.SNAPSHOT.read_bytes())
    assert corpus.SNAPSHOT.stat().st_size < len(raw) < corpus.MAX_SNAPSHOT_BYTES / 4
    real = _real()
    corpus.check_paragraphs(real)  # the shipped list passes its own checks
    assert max(len(p) for p in real) < corpus.MAX_PARAGRAPH_CHARS / 2
    longest = " ".join(["Incomparably"] * corpus.MAX_WORDS) + "."  # 120 long English words: still prose
    corpus.check_paragraphs(_changed(real, 0, longest))


def _changed(paras: list[str], i: int, text: str) -> list[str]:
    return paras[:i] + [text] + paras[i + 1 :]


def _huge_paragraph_snapshot(path: Path, words: int) -> Path:
    """One paragraph of ``words`` words (5 bytes each: 11M words is the issue's 54 MB paragraph), its sha256
    matching, written as a stream so the test itself never holds it."""
    import hashlib

    chunk, n = "word " * 100_000, words // 100_000
    digest = hashlib.sha256()
    c = zlib.compressobj(1, zlib.DEFLATED, 31)
    parts = [c.compress(b'{"paragraphs": ["')]
    for _ in range(n):
        digest.update(chunk.encode())
        parts.append(c.compress(chunk.encode()))
    parts += [c.compress(f'"], "sha256": "{digest.hexdigest()}"}}'.encode()), c.flush()]
    path.write_bytes(b"".join(parts))
    return path


DEGENERATE = {  # name: (the paragraphs, made from the real ones; what the refusal says)
    "empty": (lambda r: [], "no paragraphs"),
    "one-word": (lambda r: ["word"], "paragraph 1 has 1 words"),
    "4MB-paragraph": (lambda r: ["a " * 1_900_000], "paragraph 1 has 3,800,000 characters"),  # under the byte cap
    "long-words": (lambda r: _changed(r, 0, " ".join(["x" * 30] * 100)), "paragraph 1 has 3,099 characters"),
    "NUL": (lambda r: _changed(r, 7, r[7][:40] + "\x00" + r[7][40:]), "paragraph 8 holds the character '\\x00'"),
    "ESC": (lambda r: _changed(r, 8, "\x1b[2J" + r[8]), "paragraph 9 holds the character '\\x1b'"),
    "newline": (lambda r: _changed(r, 9, r[9].replace(" ", "\n", 1)), "paragraph 10 holds the character '\\n'"),
    "RLO": (lambda r: _changed(r, 10, r[10] + " \u202e"), "paragraph 11 holds the character '\\u202e'"),
    "repeated": (lambda r: r + [r[0]], "paragraph 1904 repeats an earlier one"),
    "one-repeated": (lambda r: [r[0]] * len(r), "paragraph 2 repeats"),
    "tiny-pools": (lambda r: r[:300], "pool has"),
}


@pytest.mark.parametrize("name", DEGENERATE)
def test_a_degenerate_pool_with_a_matching_checksum_is_refused(tmp_path, name):
    build, reason = DEGENERATE[name]
    err = _refused(_snapshot(tmp_path / "paragraphs.json.gz", build(_real())))
    assert reason in str(err) and reason in err.app_text, str(err)


def test_the_issues_54MB_paragraph_is_refused_by_the_cap(tmp_path):
    err = _refused(_huge_paragraph_snapshot(tmp_path / "paragraphs.json.gz", 11_000_000))
    assert "expands past" in str(err)


@pytest.mark.parametrize(
    "raw, reason",
    [
        (gzip.compress(b"[" * 200_000), "nested too deeply"),
        (gzip.compress(b"[]"), "not an object"),  # JSON, but a list
        (gzip.compress(b'{"sha256": "x"}'), "no 'paragraphs' field"),
        (gzip.compress(json.dumps({"paragraphs": ["a"]}).encode()), "no 'sha256' field"),
        (gzip.compress(b"\xff\xfe not utf-8"), "utf-8"),
        (gzip.compress(b'{"paragraphs": []}')[:12] + b"\x00" * 20, "CRC check failed"),  # cut and zeroed
        (b"\x1f\x8b\x08\x00" + b"\xff" * 30, "decompressing"),  # a gzip header, no deflate stream
        (gzip.compress(b'{"paragraphs": []}')[:-3], "ended before"),  # cut short
    ],
    ids=["deep-json", "json-list", "no-paragraphs", "no-sha256", "not-utf8", "zeroed-deflate", "bad-deflate", "cut"],
)
def test_other_damage_is_one_line(tmp_path, raw, reason):
    path = tmp_path / "paragraphs.json.gz"
    path.write_bytes(raw)
    err = _refused(path)
    assert reason in str(err), str(err)


@pytest.fixture
def damaged_snapshot(tmp_path, monkeypatch):
    """The process's corpus read from a damaged copy (the digest matches; the pool is empty); caches cleared."""
    from core.data.tasks import filler

    def clear():
        corpus._paragraphs.cache_clear()
        corpus._pool.cache_clear()
        filler._pool_sentences.cache_clear()

    path = _snapshot(tmp_path / "paragraphs.json.gz", [])
    clear()
    monkeypatch.setattr(corpus, "SNAPSHOT", path)
    yield path
    monkeypatch.undo()
    clear()


def test_a_task_and_the_cli_name_the_snapshot_not_randrange(damaged_snapshot, tiny_dir, capsys):
    from transformers import ByT5Tokenizer

    from core.cli import main
    from core.data import tasks

    with pytest.raises(UserError) as err:
        tasks.make("passkey", ByT5Tokenizer(), tokens=300, depth=0.5, seed=0, haystack="corpus-eval")
    assert "no paragraphs" in str(err.value) and damaged_snapshot.name in err.value.app_text
    assert main(["run", "--model", str(tiny_dir), "--tokens", "300", "--haystack", "corpus-eval"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "corpus snapshot" in lines[0] and "randrange" not in lines[0], lines
