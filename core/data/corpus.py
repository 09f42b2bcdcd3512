"""Offline haystack text: English paragraphs harvested from texts that ship with Python.

Why: the classic passkey filler ("The grass is green. ...") is a handful of
sentences repeated, so a model trained only on it can learn shortcuts. Real
prose makes training haystacks varied, and it must be available offline, with
no download, identical on every machine running Python 3.11.

Where the text comes from (no module is imported for its docstrings, so there
are no import side effects and no platform-dependent members):

1. ``pydoc_data.topics``: the language reference rendered as plain text
   (the data behind ``help("assert")``), a pure data module.
2. Docstrings of the stdlib's own ``.py`` sources, read as text and scanned
   for statement-level triple-quoted strings (a regex, ~10x faster than
   ``ast`` over 10 MB of source).

Both are walked in sorted order, cleaned (ASCII prose, collapsed whitespace,
no code/tables/lists) and deduplicated, so the list is a pure function of the
Python 3.11.x sources (a patch release that edits a docstring can change it).

The list is shipped as a snapshot, ``assets/corpus/paragraphs.json.gz``, and
read from there when present: another Python's stdlib gives another list
(Python 3.12 on a GPU machine drew other pass key haystacks for the same
seeds, and its accuracies differed by up to 21 points), so without the
snapshot a table would only be reproducible on Python 3.11. Without the file
(an install that left ``assets/`` out) the list is harvested as above.
``python -m core.data.corpus --write`` rebuilds the snapshot from this Python.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import inspect
import json
import os
import platform
import re
import sysconfig
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from core.errors import UserError

__all__ = [
    "paragraphs",
    "split_train_eval",
    "pool",
    "stats",
    "SNAPSHOT",
    "write_snapshot",
    "read_snapshot",
    "check_paragraphs",
]

#: The shipped paragraph list (see the module docstring): what every machine draws haystacks from.
SNAPSHOT = Path(__file__).resolve().parents[2] / "assets" / "corpus" / "paragraphs.json.gz"

MIN_WORDS = 20
MAX_WORDS = 120

#: The most bytes a snapshot may hold, as a file and once decompressed. The shipped one is 131 KB of gzip
#: expanding to 432 KB (1,903 paragraphs); 4 MiB leaves room for a harvest nine times larger, and a gzip
#: bomb is refused after 4 MiB of output instead of filling the memory (8 GiB from an 8 MB file).
MAX_SNAPSHOT_BYTES = 4 << 20
#: The fewest paragraphs each pool ("train", "eval") may have. The shipped snapshot has 1,504 and 399; a
#: pool of a handful repeats its few paragraphs through every long haystack, which defeats varied prose.
MIN_POOL_PARAGRAPHS = 100
#: The longest paragraph, in characters: MAX_WORDS words of English prose (the longest shipped: 775).
MAX_PARAGRAPH_CHARS = 2000

# Top-level stdlib names never read: GUI/demo/test code, side-effect modules,
# and packages some distributions split out or replace (Debian ships distutils
# and lib2to3 separately; setuptools hijacks distutils), which would make the
# corpus differ between machines.
_SKIP_TOP = frozenset(
    {
        "antigravity",
        "this",
        "idlelib",
        "tkinter",
        "turtle",
        "turtledemo",
        "test",
        "tests",
        "lib2to3",
        "distutils",
        "ensurepip",
        "site-packages",
        "dist-packages",
        "pydoc_data",  # read separately, as the reference topics
    }
)

# Typographic characters folded to ASCII before the ASCII check.
_FOLD = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u2013": "-",
        "\u2014": "-",
        "\u00a0": " ",
        "\u2026": "...",
    }
)

# Statement-level triple-quoted strings (docstrings, mostly): the quotes open
# at the start of a line, after indentation and an optional prefix.
_DOCSTRING = re.compile(r'^[ \t]*[rRuU]?("""|\'\'\')(.*?)\1', re.DOTALL | re.MULTILINE)
_CODE_LINE = re.compile(
    r"^(>>>|\.\.\.|\.\. |\$ |def |class |import |from \S+ import|@\w|[-+=*_~^#|]{3,}|[-*+] |"
    r"\d+[.)] |\(?[a-z]\) |[\w.]+\s*=\s)"
)
_SYMBOLS = re.compile(r"[(){}\[\]=<>_*`\\#@|%$^~&;/]")
_LONG_NUMBER = re.compile(r"\d{4,}")
_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")


def _stdlib_sources() -> list[tuple[str, str]]:
    """(relative path, absolute path) of the stdlib .py files we read, sorted.

    Sorting by the path relative to the stdlib folder makes the order
    independent of the file system and of where Python is installed.
    """
    root = sysconfig.get_paths().get("stdlib") or os.path.dirname(os.__file__)
    found: list[tuple[str, str]] = []
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        parts = [] if rel == "." else rel.split(os.sep)
        if parts and (
            parts[0] in _SKIP_TOP
            or parts[0].startswith(("_", "config-", "turtle"))
            or any(p in ("test", "tests", "__pycache__") or p.startswith("idle_test") for p in parts)
        ):
            dirs[:] = []
            continue
        for name in files:
            if not name.endswith(".py"):
                continue
            stem = name[:-3]
            if not parts and (stem in _SKIP_TOP or stem.startswith(("_", "turtle"))):
                continue
            found.append(("/".join(parts + [name]), os.path.join(folder, name)))
    found.sort()
    return found


def _blocks(text: str) -> Iterable[list[str]]:
    """Blank-line separated blocks of a text, as lists of raw lines."""
    block: list[str] = []
    for line in text.splitlines():
        if line.strip():
            block.append(line)
        elif block:
            yield block
            block = []
    if block:
        yield block


_BULLET = re.compile(r"^([*+-]|\d+\.|\([a-z0-9]\)) +")
_MARKUP = re.compile(r"\*\*|(?<![\w*])\*(?=\w)|(?<=\w)\*(?![\w*])|:[a-z]+:`|`")
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def _clean_block(lines: list[str]) -> str | None:
    """One block -> clean prose (any length), or None when it is not prose.

    Code, tables, doctests and indented examples are dropped (an indented first
    line, or any line that looks like code, kills the block); a bullet item
    keeps its text. Emphasis markup is stripped, a trailing "For example:"
    sentence (it introduces code we dropped) is cut, and runs of 4+ digits are
    refused so that the 5-digit needles are the only long numbers in a
    document.
    """
    first = lines[0]
    if first[:1] in (" ", "\t"):
        return None
    bullet = _BULLET.match(first)
    if bullet:
        lines = [first[bullet.end() :]] + lines[1:]
    for i, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if (
            (i > 0 and indent > (4 if bullet else 0))
            or _CODE_LINE.match(stripped)
            or stripped.endswith("::")
            or stripped.count("|") >= 2
        ):
            return None
    text = " ".join(line.strip() for line in lines).translate(_FOLD)
    text = _MARKUP.sub("", text)
    text = re.sub(r"\s+", " ", text).strip()
    if text.endswith(":"):
        ends = [m.end() for m in _SENTENCE_END.finditer(text)]
        text = text[: ends[-1]] if ends else ""
    if not text.isascii() or not text[:1].isupper() or text[-1:] not in ".!?":
        return None
    if _LONG_NUMBER.search(text) or "pass key" in text.lower():
        return None
    words = text.split()
    # Prose has few code symbols and most of its tokens are plain words.
    if len(_SYMBOLS.findall(text)) > max(2, len(text) // 80):
        return None
    plain = sum(1 for w in words if _WORD.fullmatch(w.strip("\"',.;:!?()")))
    if plain < 0.8 * len(words):
        return None
    return text


def _split_long(text: str) -> list[str]:
    """Cut prose longer than MAX_WORDS at sentence ends into <= MAX_WORDS pieces."""
    if len(text.split()) <= MAX_WORDS:
        return [text]
    pieces: list[str] = []
    current: list[str] = []
    start = 0
    for m in _SENTENCE_END.finditer(text):
        sentence = text[start : m.end()].strip()
        start = m.end()
        if current and len(" ".join(current + [sentence]).split()) > MAX_WORDS:
            pieces.append(" ".join(current))
            current = []
        current.append(sentence)
    if current:
        pieces.append(" ".join(current))
    return [p for p in pieces if MIN_WORDS <= len(p.split()) <= MAX_WORDS]


def _text_paragraphs(text: str) -> Iterable[str]:
    """Paragraphs of one source text: consecutive short prose blocks are merged
    (docstring summaries are often one line), long ones split at sentences."""
    pending = ""
    for block in _blocks(text):
        prose = _clean_block(block)
        if prose is None:
            pending = ""  # never merge across dropped code: the prose would jump
            continue
        pending = f"{pending} {prose}" if pending else prose
        if len(pending.split()) >= MIN_WORDS:
            yield from _split_long(pending)
            pending = ""


def _reference_texts() -> list[str]:
    """The language reference topics (help() texts), sorted by topic name."""
    try:
        from pydoc_data.topics import topics  # pure data module, no side effects
    except Exception:  # stripped-down installs
        return []
    return [topics[key] for key in sorted(topics)]


def _docstring_texts() -> Iterable[str]:
    """Docstrings (dedented) of the stdlib sources, in sorted path order."""
    for _rel, path in _stdlib_sources():
        try:
            with open(path, encoding="utf-8") as fh:
                source = fh.read()
        except (OSError, UnicodeDecodeError):
            continue
        for match in _DOCSTRING.finditer(source):
            yield inspect.cleandoc(match.group(2))


@functools.lru_cache(maxsize=1)
def _paragraphs() -> tuple[str, ...]:
    """The snapshot's paragraphs (checked by :func:`read_snapshot`), else this Python's harvest, checked the same
    way: a stripped-down stdlib could give too little prose, and a task would fail far from the cause."""
    shipped = read_snapshot(SNAPSHOT)
    if shipped is not None:
        return shipped
    harvested = _harvest()
    try:
        check_paragraphs(harvested)
    except ValueError as err:
        raise UserError(
            f"No corpus snapshot at {SNAPSHOT}, and this Python's stdlib gives too little prose to "
            f"replace it ({err}): restore the snapshot (git checkout -- {SNAPSHOT})",
            app=f"The corpus snapshot {SNAPSHOT.name} is missing and this server's Python cannot "
            "replace it, so no text can be drawn from the corpus (its haystacks, the perplexity "
            "sequences); whoever runs this app can restore the file.",
        ) from None
    return harvested


def _digest(paragraphs: Sequence[str]) -> str:
    return hashlib.sha256("\n\n".join(paragraphs).encode("utf-8")).hexdigest()


def read_snapshot(path: Path) -> tuple[str, ...] | None:
    """The paragraphs stored at ``path``; None when there is no file; a one-line UserError when it is damaged.

    Damaged: larger than :data:`MAX_SNAPSHOT_BYTES` as a file or once
    decompressed (read as a stream with that cap, so a gzip bomb costs 4 MiB,
    not the memory of the machine), not gzip/JSON, not a list of strings, no
    longer matching the sha256 it was written with, or matching it but not a
    pool a haystack can be drawn from (:func:`check_paragraphs`: an empty or
    tiny list, one word, a huge paragraph, a control character), which used
    to surface as "empty range for randrange()" deep inside a task.
    """
    if not path.is_file():
        return None
    try:
        size = path.stat().st_size
        if size > MAX_SNAPSHOT_BYTES:
            raise ValueError(f"{size:,} bytes, more than the {MAX_SNAPSHOT_BYTES >> 20} MiB a snapshot may have")
        with gzip.open(path, "rb") as fh:
            raw = fh.read(MAX_SNAPSHOT_BYTES + 1)  # decompressed in bounded steps: never more than the cap
        if len(raw) > MAX_SNAPSHOT_BYTES:
            raise ValueError(f"it expands past the {MAX_SNAPSHOT_BYTES >> 20} MiB a snapshot may have")
        data = json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError("its JSON is not an object with paragraphs and a sha256")
        paras = data["paragraphs"]
        if not isinstance(paras, list) or not all(isinstance(x, str) for x in paras):
            raise ValueError("'paragraphs' is not a list of strings")
        if _digest(paras) != data["sha256"]:
            raise ValueError("its paragraphs do not match its sha256")
        check_paragraphs(paras)
    except (OSError, EOFError, ValueError, KeyError, TypeError, RecursionError, zlib.error) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err).splitlines()[0][:120]
        if isinstance(err, KeyError):
            reason = f"no {reason} field"
        elif isinstance(err, RecursionError):
            reason = "its JSON is nested too deeply"
        raise UserError(
            f"The corpus snapshot {path} is damaged ({reason}): restore it "
            f"(git checkout -- {path}) or rebuild it with python -m core.data.corpus --write",
            app=f"The corpus snapshot {path.name} is damaged ({reason}), so no text can be drawn "
            "from the corpus (its haystacks, the perplexity sequences); whoever runs this app "
            "can restore the file.",
        ) from None
    return tuple(paras)


def check_paragraphs(paras: Sequence[str]) -> None:
    """Refuse (ValueError, one line) a paragraph list no haystack can be drawn from.

    Why: a snapshot whose checksum matches can still hold ``[]``, one word, a
    paragraph of megabytes or a NUL (written by hand, or by a broken
    harvest). Each paragraph must be what :func:`_harvest` makes: printable
    ASCII with single spaces, ``MIN_WORDS``..``MAX_WORDS`` words, at most
    :data:`MAX_PARAGRAPH_CHARS` characters, none repeated; and each pool of
    :func:`split_train_eval` needs :data:`MIN_POOL_PARAGRAPHS`.
    """
    if not paras:
        raise ValueError("it holds no paragraphs")
    seen: set[str] = set()
    for i, p in enumerate(paras, 1):
        if not (p.isascii() and p.isprintable()):
            bad = next(c for c in p if not (c.isascii() and c.isprintable()))
            raise ValueError(f"paragraph {i} holds the character {bad!r}; paragraphs are printable ASCII")
        if len(p) > MAX_PARAGRAPH_CHARS:
            raise ValueError(f"paragraph {i} has {len(p):,} characters, more than {MAX_PARAGRAPH_CHARS:,}")
        words = len(p.split())
        if not MIN_WORDS <= words <= MAX_WORDS:
            raise ValueError(f"paragraph {i} has {words} words, not {MIN_WORDS} to {MAX_WORDS}")
        if p in seen:
            raise ValueError(f"paragraph {i} repeats an earlier one")
        seen.add(p)
    for name, part in zip(("train", "eval"), split_train_eval(paras)):
        if len(part) < MIN_POOL_PARAGRAPHS:
            raise ValueError(f"its {name} pool has {len(part)} paragraphs, fewer than {MIN_POOL_PARAGRAPHS}")


def write_snapshot(path: Path = SNAPSHOT) -> dict:
    """Harvest the paragraphs from this Python's stdlib and store them at ``path`` (gzip JSON, with the Python
    version and a sha256 of the content); returns what was written, minus the paragraphs."""
    paras = list(_harvest())
    meta = {"python": platform.python_version(), "paragraphs_count": len(paras), "sha256": _digest(paras)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as fh:
        # no name and mtime 0 in the header: the same list gives the same bytes
        fh.write(json.dumps({**meta, "paragraphs": paras}, indent=0).encode("utf-8"))
    tmp.replace(path)
    return meta


def _harvest() -> tuple[str, ...]:
    """The paragraphs of this Python's own reference topics and stdlib docstrings (see the module docstring)."""
    seen: set[str] = set()
    out: list[str] = []
    for source in (_reference_texts(), _docstring_texts()):
        for text in source:
            for para in _text_paragraphs(text):
                if para not in seen:
                    seen.add(para)
                    out.append(para)
    return tuple(out)


def paragraphs() -> list[str]:
    """All haystack paragraphs (20-120 words each), deterministic order.

    Built once per process (cached); a fresh list is returned so callers may
    mutate it without poisoning the cache.
    """
    return list(_paragraphs())


def _eval_bucket(text: str, eval_fraction: float) -> bool:
    # sha1, not hash(): Python's str hash is salted per process.
    digest = hashlib.sha1(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction


def split_train_eval(paragraphs: Sequence[str], eval_fraction: float = 0.2) -> tuple[list[str], list[str]]:
    """Split paragraphs into disjoint (train, eval) pools by a hash of each text.

    Why a hash and not a shuffle: membership of a paragraph depends only on its
    own text, so adding or removing other paragraphs (another Python patch
    release) never moves a paragraph from eval into train. Order is kept.
    """
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    train: list[str] = []
    evaluation: list[str] = []
    for text in paragraphs:
        (evaluation if _eval_bucket(text, eval_fraction) else train).append(text)
    return train, evaluation


@functools.lru_cache(maxsize=4)
def _pool(name: str) -> tuple[str, ...]:
    train, evaluation = split_train_eval(_paragraphs())
    return tuple(train if name == "train" else evaluation)


def pool(name: str) -> tuple[str, ...]:
    """The cached "train" or "eval" pool (immutable), as used by core.data.tasks."""
    if name not in ("train", "eval"):
        raise ValueError(f"unknown corpus pool {name!r}; use 'train' or 'eval'")
    return _pool(name)


#: Installed packages whose docstrings widen the language model's training text (``lm_train_pool``).
LM_PACKAGES = (
    "numpy",
    "pandas",
    "transformers",
    "torch",
    "scipy",
    "sympy",
    "streamlit",
    "plotly",
    "ray",
    "pydantic",
    "hypothesis",
)


@functools.lru_cache(maxsize=1)
def lm_train_pool() -> tuple[str, ...]:
    """The "train" pool plus the prose paragraphs of :data:`LM_PACKAGES`' docstrings (those installed),
    minus every paragraph whose hash puts it in the eval bucket, deduplicated.

    Why: the 56k words of the train pool are few enough for a 1.5M-parameter
    model to memorise in a few thousand steps (held-out perplexity 730 against
    13 on its own text), so the language model trains on ~0.7M words of
    docstrings of the installed packages as well. The hash split still holds:
    no paragraph that could be in the eval pool is trained on. Depends on the
    installed versions (requirements.txt pins them); about a minute to build."""
    import importlib.util

    seen, out = set(), []
    for text in _pool("train"):
        seen.add(text)
        out.append(text)
    for pkg in LM_PACKAGES:
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = sorted(spec.submodule_search_locations)[0]
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in ("tests", "test", "__pycache__"))
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                try:
                    with open(os.path.join(folder, name), encoding="utf-8") as fh:
                        source = fh.read()
                except (OSError, UnicodeDecodeError):
                    continue
                for match in _DOCSTRING.finditer(source):
                    for para in _text_paragraphs(inspect.cleandoc(match.group(2))):
                        if para not in seen and not _eval_bucket(para, 0.2):
                            seen.add(para)
                            out.append(para)
    return tuple(out)


def stats() -> dict[str, int]:
    """Sizes, for reports and the UI: paragraphs and words per pool."""
    train, evaluation = pool("train"), pool("eval")
    return {
        "paragraphs": len(train) + len(evaluation),
        "words": sum(len(p.split()) for p in _paragraphs()),
        "train_paragraphs": len(train),
        "eval_paragraphs": len(evaluation),
    }


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="The offline haystack corpus: its size, or rebuild its snapshot.")
    ap.add_argument("--write", action="store_true", help=f"rebuild {SNAPSHOT} from this Python's stdlib")
    if ap.parse_args().write:
        print(json.dumps(write_snapshot()))
    else:
        print(json.dumps({"snapshot": str(SNAPSHOT), "shipped": SNAPSHOT.is_file(), **stats()}))
