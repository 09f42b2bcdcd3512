"""Every CSV we write: safe to open in a spreadsheet, one writer per file, no row lost or doubled.

Formula injection (OWASP, https://owasp.org/www-community/attacks/CSV_Injection):
a spreadsheet runs a cell that starts with ``=``, ``+``, ``-``, ``@``, a tab
or a carriage return as a formula, so a document id like ``=HYPERLINK(...)``
or a model's answer could act when someone opens our CSV. Every text cell
that starts with one of those characters (after any leading ``'``) is written
with one more ``'`` in front (``=1+1`` -> ``'=1+1``, ``'=1`` -> ``''=1``).
Numbers stay numbers: only text cells change, and a text cell that is a
plain decimal number (``-5``, ``-0.25``, ``1e-3``) is data, not a formula, so
it is written as is. The rule is reversible (:func:`restore` drops the one
``'`` we added), so resuming a sweep recognises the rows it wrote.

Result files (:class:`ResultCSV`): a sweep appends rows one by one (flush +
fsync), holds an exclusive lock on its CSV for the whole run, and on
``--resume`` checks the file first: the header must be ours, every row must
have all its fields, and a last row cut short by a kill is dropped (the file
is truncated to the end of the last whole row) so the run redoes it exactly
once.

The lock follows the file, not the name the user typed (:class:`_Lock`): a
symlink or a hard link to a running sweep's CSV is the same file, and a
second writer through it would interleave or truncate the first one's rows.
Every command that writes a CSV file takes it: sweeps, batch runs and
perplexity through :class:`ResultCSV`, ``rpe --out`` through
:func:`write_csv` (which replaces the file whole).
"""

from __future__ import annotations

import csv
import io
import os
import re
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from core.errors import UserError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; sweeps there rely on one writer by convention
    fcntl = None

TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
# RFC 4180 line ends, as the csv module writes our result files: with them, a cell holding a lone CR
# is quoted (pandas' default "\n" leaves it bare, and readers then split the row there)
LINE_END = "\r\n"
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


# -- formula injection -------------------------------------------------------------


def neutralise(value: Any) -> Any:
    """A text cell a spreadsheet would run as a formula gets a leading ``'``; anything else is returned as is."""
    if isinstance(value, str) and value.lstrip("'").startswith(TRIGGERS) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def restore(value: Any) -> Any:
    """The value :func:`neutralise` was given (``'=1+1`` -> ``=1+1``), for cells read back from our CSVs."""
    if isinstance(value, str) and value.startswith("'") and value.lstrip("'").startswith(TRIGGERS):
        return value[1:]
    return value


def safe_row(row: dict) -> dict:
    """A row dict with every text cell neutralised."""
    return {k: neutralise(v) for k, v in row.items()}


def _text_like(s: pd.Series | pd.Index) -> bool:
    return pd.api.types.is_object_dtype(s.dtype) or pd.api.types.is_string_dtype(s.dtype)


def _map_text(df: pd.DataFrame, fn) -> pd.DataFrame:
    """A copy of ``df`` with ``fn`` applied to every text cell (numeric columns untouched)."""
    out = df.copy()
    for i in range(out.shape[1]):
        col = out.iloc[:, i]
        if _text_like(col):
            out.isetitem(i, col.map(fn))
    return out


def safe_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``df`` with text cells, column names and index labels neutralised (numeric columns untouched)."""
    out = _map_text(df, neutralise)
    out.columns = out.columns.map(neutralise)
    if _text_like(out.index):
        out.index = out.index.map(neutralise)
    return out


def restore_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A frame read from one of our CSVs with its text cells as they were before :func:`neutralise`."""
    return _map_text(df, restore)


def to_csv_text(df: pd.DataFrame, index: bool = False) -> str:
    """``df`` as CSV text, safe to open in a spreadsheet (e.g. a sweep printed to stdout)."""
    return safe_frame(df).to_csv(index=index, lineterminator=LINE_END)


def to_csv_bytes(df: pd.DataFrame, index: bool = False) -> bytes:
    """``df`` as UTF-8 CSV bytes, safe to open in a spreadsheet (the app's downloads)."""
    return to_csv_text(df, index).encode("utf-8")


# -- the output path and its lock ----------------------------------------------------


def check_out(path: Path) -> None:
    """Refuse, before anything is locked, truncated or deleted, an ``--out`` we could not write."""
    if path.is_dir():
        raise UserError(f"--out {path} is a folder; give a file name")
    parent = path.parent
    if not parent.is_dir():
        raise UserError(f"--out {path}: the folder {parent} does not exist")
    if path.exists() and not path.is_file():
        raise UserError(f"--out {path} is not a regular file")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.R_OK | os.W_OK)):
        raise UserError(f"--out {path} is not writable here")


def real_path(path: str | Path) -> Path:
    """The file ``path`` names once every symlink on the way is followed (it need not exist yet)."""
    return Path(os.path.realpath(path))


def lock_path(path: str | Path) -> Path:
    """The lock file of the real file behind ``path`` (``<real>.lock``), whichever name reached it."""
    real = real_path(path)
    return real.with_name(real.name + ".lock")


_BINARY = getattr(os, "O_BINARY", 0)  # Windows: no newline translation under our csv writer


class _Lock:
    """Exclusive, non-blocking locks on the real file behind ``path``; released on :meth:`close`.

    Why two ``flock`` locks, both taken before anything is read or written:

    - ``<real>.lock``, beside the file the path resolves to (every symlink
      followed): a symlink to a running sweep's CSV meets the same lock file,
      and the name stays locked while a replacing writer (``rpe``) renames a
      new file over it, or before the CSV exists at all.
    - the CSV itself (its inode): a hard link is another name for the same
      inode and resolves to another path, so only a lock on the file catches
      it. :attr:`fd` is that file, opened read-write (read-only when
      ``create`` is False), and :class:`ResultCSV` writes through it, so the
      file written is the file locked.

    ``create`` False (a writer that replaces the file whole): a CSV that does
    not exist yet is not created, only its name is locked. The lock file is
    removed while still held; a writer that opened it (or the CSV) just before
    a removal or a rename checks, once it holds its lock, that the file it
    locked is still the one at that path, and retries otherwise. A killed
    writer's locks end with its process.
    """

    def __init__(self, path: str | Path, create: bool = True):
        self.path = Path(path)
        self.real = real_path(path)
        self.file = lock_path(path)
        self._side: int | None = None
        self.fd: int | None = None
        if fcntl is not None:  # without flock (Windows) a lock file would only be left behind
            self._side = self._take(self.file, os.O_RDWR | os.O_CREAT, self._held_by_name)
        try:
            # a file only renamed over (create False) is locked read-only: a read-only CSV can still be replaced
            flags = (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY) | _BINARY
            self.fd = self._take(self.real, flags, self._held_by_link, missing_ok=not create)
        except BaseException:
            self._release_side()
            raise

    def _held_by_name(self) -> UserError:
        via = "" if self.real == self.path else f" (the file {self.real})"
        return UserError(
            f"another sweep is writing {self.path}{via} (lock {self.file} held); wait for it or use another --out"
        )

    def _held_by_link(self) -> UserError:
        return UserError(
            f"another sweep is writing {self.path}: the same file is locked under another name "
            "(a hard link); wait for it or use another --out"
        )

    def _take(self, target: Path, flags: int, held, missing_ok: bool = False) -> int | None:
        """An fd of ``target`` holding its lock (None: ``missing_ok`` and no such file); ``held()`` raised when
        another writer has it."""
        while True:
            try:
                fd = os.open(target, flags, 0o644)
            except FileNotFoundError:
                if missing_ok:
                    return None
                raise UserError(f"cannot open {target} for --out {self.path}: no such folder") from None
            except OSError as err:
                what = "the lock file " if target == self.file else ""
                raise UserError(f"cannot open {what}{target} for --out {self.path}: {err.strerror}") from None
            if fcntl is None:
                return fd
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise held() from None
            if _same_file(fd, target):
                return fd
            os.close(fd)

    def _release_side(self) -> None:
        if self._side is None:
            return
        try:
            self.file.unlink()
        except FileNotFoundError:
            pass
        os.close(self._side)
        self._side = None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self._release_side()


def _read_all(fd: int) -> bytes:
    """The whole content of the file open at ``fd``, read from its start."""
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def write_csv(df: pd.DataFrame, path: str | Path, index: bool = False) -> None:
    """``df`` to a CSV file, safe to open in a spreadsheet, replacing the file whole (``python -m core rpe --out``).

    Why whole and locked: the new text goes to a temporary file beside the
    real file and is renamed over it, so an existing file is replaced only by
    a complete new one (a failed write leaves it as it was), and a symlink
    keeps pointing where it did. The lock is the one sweeps hold
    (:class:`_Lock`): ``--out`` naming a running sweep's CSV, by any name, is
    refused instead of replacing its rows. A path that is not a regular file
    (``/dev/stdout``, a pipe) is written to directly, with nothing to lock.
    """
    text = to_csv_text(df, index)
    target = Path(path)
    if target.exists() and not target.is_file():
        with open(target, "w", newline="", encoding="utf-8") as f:
            f.write(text)
        return
    lock = _Lock(target, create=False)
    try:
        tmp = lock.real.with_name(f".{lock.real.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, lock.real)
        finally:
            tmp.unlink(missing_ok=True)
    finally:
        lock.close()


# -- reading back a result file ----------------------------------------------------


def _records(text: str) -> tuple[list[list[str]], list[int], bool]:
    """CSV records of ``text``, the character offset where each ends, and whether the text ran out inside one."""
    pos = 0

    def lines():
        nonlocal pos
        for line in io.StringIO(text, newline=""):
            pos += len(line)
            yield line

    rows: list[list[str]] = []
    ends: list[int] = []
    reader = csv.reader(lines(), strict=True)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return rows, ends, False
        except csv.Error:
            if pos < len(text):
                raise UserError(f"record {len(rows) + 1} is not valid CSV") from None
            return rows, ends, True
        rows.append(row)
        ends.append(pos)


def _whole_rows(path: Path, columns: list[str], what: str, data: bytes | None = None) -> tuple[list[list[str]], int]:
    """The complete data rows of a result CSV (``data``, else read from ``path``) and the byte length they take;
    refuses a file that is not ours."""
    if data is None:
        data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a {what} CSV (not UTF-8 text); use another --out or drop --resume") from None
    header = ",".join(columns)
    try:
        rows, ends, torn = _records(text)
    except UserError as err:
        raise UserError(f"{path}: {err}; fix or remove it, or use another --out") from None
    # a record cut inside quotes never made it into rows; else the last is whole only if the text ends
    # with its newline and it has every field
    if rows and not torn and (not text.endswith("\n") or len(rows[-1]) != len(columns)):
        rows.pop(), ends.pop()
    if not rows:
        if header.startswith(text.rstrip("\r\n")):  # empty, or a header cut short
            return [], 0
        raise UserError(f"{path} is not a {what} CSV; use another --out or drop --resume")
    if rows[0] != columns:
        raise UserError(
            f"{path} is not a {what} CSV (its header is {','.join(rows[0])[:80]!r}); use another --out or drop --resume"
        )
    for i, r in enumerate(rows[1:], 2):
        if r and len(r) != len(columns):
            raise UserError(
                f"{path} record {i} has {len(r)} fields, not {len(columns)}; fix or remove it, or use another --out"
            )
    return [r for r in rows[1:] if r], len(text[: ends[-1]].encode("utf-8"))


# -- writing a result file ------------------------------------------------------------


class ResultCSV:
    """The CSV one sweep appends its rows to, as a context manager.

    ``path`` None: rows go to ``stream`` (with a header) when given, else
    nowhere. With a path: checks it (:func:`check_out`), takes the lock, and
    either starts the file afresh or, with ``resume``, keeps its whole rows
    (:attr:`rows`, text cells restored) and drops a torn last one. Each row is
    neutralised, written, flushed and fsynced.
    """

    def __init__(
        self,
        path: str | Path | None,
        columns: list[str],
        what: str = "sweep",
        resume: bool = False,
        stream: TextIO | None = None,
    ):
        self.path = Path(path) if path else None
        self.columns = list(columns)
        self.what = what
        self.resume = resume
        self.stream = stream
        self.rows: list[dict[str, str]] = []
        self._lock: _Lock | None = None
        self._f: TextIO | None = None
        self._w: csv.DictWriter | None = None

    def __enter__(self) -> ResultCSV:
        if self.path is None:
            if self.stream is not None:
                self._f = self.stream
                self._start()
            return self
        check_out(self.path)
        self._lock = _Lock(self.path)
        try:
            self._open()
        except BaseException:
            self._close()
            raise
        return self

    def _open(self) -> None:
        """Read (``resume``) and cut the locked file through the locked fd, so the file written is the one locked."""
        path, fd = self.path, self._lock.fd
        keep = 0
        if self.resume:
            rows, keep = _whole_rows(path, self.columns, self.what, data=_read_all(fd))
            self.rows = [{c: restore(v) for c, v in zip(self.columns, r)} for r in rows]
        try:
            os.ftruncate(fd, keep)  # a fresh file, or a torn last row dropped: it is redone
            os.lseek(fd, keep, os.SEEK_SET)
            self._f = open(fd, "a", newline="", encoding="utf-8", closefd=False)
        except OSError as err:
            raise UserError(f"cannot write --out {path}: {err.strerror}") from None
        if keep:
            self._w = csv.DictWriter(self._f, fieldnames=self.columns)
        else:
            self._start()

    def _start(self) -> None:
        self._w = csv.DictWriter(self._f, fieldnames=self.columns)
        self._w.writeheader()
        self._sync()

    def _sync(self) -> None:
        self._f.flush()
        if self.path is not None:
            os.fsync(self._f.fileno())

    def write(self, row: dict) -> None:
        """Append one row (text cells neutralised), durably when writing a file."""
        if self._w is not None:
            self._w.writerow(safe_row(row))
            self._sync()

    def __exit__(self, *exc) -> None:
        self._close()

    def _close(self) -> None:
        """Close the file, then release the lock, even when the last flush fails (disk full)."""
        try:
            if self._f is not None and self._f is not self.stream:
                self._f.close()
        finally:
            self._f = None
            if self._lock is not None:
                self._lock.close()
                self._lock = None
