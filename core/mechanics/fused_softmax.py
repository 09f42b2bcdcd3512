"""A fused CPU kernel for one block of attention rows: bias, tau, mask, max, exp, sums in two passes.

Why: on the CPU the probed softmax of a long input was about 2.5x its arithmetic floor
(issue 39): torch runs bias add, divide, mask, row max, subtract, clamp, exp, row sum and
the entropy's dot product as separate passes over each block, each reading and writing
megabytes that live in L3 at best. The kernel (``fused_softmax.cpp`` beside this file) does
them row by row while the row sits in L1/L2, and reads T5's relative bias from its vector
per head in place (:class:`core.mechanics.relative_bias.RelativeBias`), so no bias block is ever
materialised. It leaves ``exp(x - max)`` in the scores' memory and returns each row's sum
and ``sum(exp * (x - max))``: the output is ``(exp @ v) / total``, and the three are the
:class:`core.mechanics.softmax_block.Block` every probe is computed from (:meth:`core.mechanics.probes.Recorder.observe`).
It is the ``cpu-kernel`` backend of :mod:`core.mechanics.softmax_block`, which says when it is chosen.

How it is built: with the machine's ``g++`` (``-O3 -march=native``, or :data:`MARCH_ENV`; a plain C ABI
loaded by :mod:`ctypes`, no torch headers, well under a second), once per source, flags and CPU, into the
user's cache folder (``$XDG_CACHE_HOME/attention-explorer``, else ``~/.cache/...``), written to a temporary
name and renamed, with the sha256 of its bytes written the same way beside it, so two processes building at
once both end with a whole library. The compiler never outlives its build: its process group is killed on a
timeout, on Ctrl-C and when this process dies in any way (:data:`_GUARD`), and the temporary file of a build
whose process is gone is removed by the next build. Before the loader opens a cached library its bytes must match that
digest (a truncated file would kill the process with SIGBUS, a foreign one would run its constructors), the
folder must be writable by this user only (else a private temporary folder serves the process), and once
loaded it must pass a small self-test against torch's arithmetic (a library that fails it is named and removed, so
the next process builds its own). A damaged file is rebuilt; a build that
fails or hangs (:data:`BUILD_TIMEOUT_S`), no compiler, or ``AAE_FUSED_SOFTMAX=0`` in the environment:
:func:`available` is False and the attention takes another backend, which gives the same numbers
(tests/mechanics/test_fused_softmax.py holds the attention with the kernel to the attention without it and to
transformers' eager attention, probes included); one line on stderr says why (``AAE_DEBUG=1``: more).

Threads: the rows of a block are split over :func:`threads` Python threads (ctypes lets go
of the GIL during the call), the same count torch uses for its own work.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("fused_softmax.cpp")
#: ``-march`` the kernel is built for: the machine's own CPU unless ``AAE_KERNEL_MARCH`` names another (e.g.
#: ``haswell``: the AVX2 code path on an AVX-512 machine, what bench/engine.py's ``--isa avx2`` measures).
MARCH_ENV = "AAE_KERNEL_MARCH"
BASE_FLAGS = ("-O3", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno")
#: Set to 0 to keep the kernel off (benchmarks comparing the two paths; a machine without g++ needs nothing).
ENV_SWITCH = "AAE_FUSED_SOFTMAX"
#: Seconds a build may take before it is given up (the attention then takes torch's path). A build takes
#: well under a second here (2-core Xeon, quiet) and about 3 s at load 15; a compiler that hangs must not
#: hold a person's first pass (issue 47: ~97 s before this bound).
BUILD_TIMEOUT_S = 20
#: A half-written library of a build that died (killed, full disk) is removed by the next build: at once when the
#: process that wrote it (its name holds the host and pid) is gone, else once it is this old (a younger one of a
#: live process, or of another host sharing the folder, may be a build under way).
STALE_BUILD_S = 600
_BUILD_PREFIX = "build-"
_BUILD_NAME = re.compile(re.escape(_BUILD_PREFIX) + r"(?P<host>[A-Za-z0-9]*)-(?P<pid>[0-9]+)-")
#: The POSIX shell that runs the compiler (``"$@"``) in the build's process group, beside a watcher that reads the
#: pipe on its stdin until EOF and then kills the whole group. Only this process holds the pipe's write end, so
#: EOF comes when the build is over or when this process ends in any way, SIGKILL included: the compiler and its
#: own children (cc1plus, as) never outlive the process that asked for them. Why not ``PR_SET_PDEATHSIG``: it
#: reaches only the direct child, not cc1plus, is Linux-only, and needs a ``preexec_fn``, which is unsafe in a
#: process with threads (the app builds from a Streamlit thread).
_GUARD = (
    'exec 3<&0 </dev/null; "$@" 3<&- & c=$!; '
    '{ read _ <&3; kill -s KILL 0; } </dev/null >/dev/null 2>&1 & exec 3<&-; wait "$c"'
)

_LOCK = threading.Lock()
_LIB: ctypes.CDLL | None = None
_TRIED = False
_WHY: str | None = None
_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0

_P = ctypes.c_void_p
_I = ctypes.c_int64


def flags() -> tuple[str, ...]:
    """The compiler flags of this process's build (``-march`` from :data:`MARCH_ENV`, else ``native``)."""
    march = os.environ.get(MARCH_ENV, "").strip() or "native"
    if not march.replace("-", "").replace("_", "").isalnum():
        raise OSError(f"{MARCH_ENV}={march[:40]!r} is not a CPU name g++ knows (e.g. native, haswell)")
    return (*BASE_FLAGS[:1], f"-march={march}", *BASE_FLAGS[1:])


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "attention-explorer"


def _cpu_key() -> str:
    """What ``-march=native`` depends on: the CPU's flags (a shared home seen from two machines builds twice)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags_ = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags_ = ""
    return platform.machine() + flags_


def _say(line: str, detail: str | None = None) -> None:
    """One line on stderr about the kernel (why a file was rebuilt or the kernel is off); ``AAE_DEBUG=1``: more."""
    print(f"attention kernel: {line}", file=sys.stderr)
    if detail and os.environ.get("AAE_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}:
        print(detail, file=sys.stderr)


def _private_folder(folder: Path) -> Path:
    """``folder``, made if need be (mode 0700), if only this user can write it; else a fresh private temporary
    folder (removed at exit), with one line saying why: a library in a folder others can write could be
    swapped for theirs between our check and the loader."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = folder.stat()
        mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
        if mine and not st.st_mode & 0o022 and os.access(folder, os.W_OK):
            return folder
        why = "is not only yours to write" if os.access(folder, os.W_OK) or not mine else "is read-only"
    except OSError as err:
        why = f"cannot be made ({err.strerror or err})"
    tmp = Path(tempfile.mkdtemp(prefix="aae-kernel-"))
    atexit.register(shutil.rmtree, tmp, True)
    _say(f"the cache folder {why}; building in a private temporary folder for this process")
    return tmp


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _host() -> str:
    """This machine's name as a build file holds it (letters and digits): two hosts may share a cache folder."""
    return re.sub(r"[^A-Za-z0-9]", "", platform.node())[:32]


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _clean_leftovers(folder: Path) -> None:
    """Remove half-written libraries of builds that died: at once when their process (named in the file's name) is
    gone from this machine, else once older than :data:`STALE_BUILD_S` (an old-style name, another host's)."""
    now = time.time()
    for old in folder.glob(f"{_BUILD_PREFIX}*"):
        try:
            owner = _BUILD_NAME.match(old.name)
            dead = owner is not None and owner["host"] == _host() and not _alive(int(owner["pid"]))
            if dead or now - old.stat().st_mtime > STALE_BUILD_S:
                old.unlink()
        except OSError:
            pass


def _stop(proc: subprocess.Popen) -> None:
    """Kill the build's whole process group (the guard, the compiler, cc1plus) and reap the guard."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError, ValueError):
        proc.communicate()


def _compile(compiler: str, out: Path, build_flags: tuple[str, ...]) -> None:
    """Compile the source to ``out`` with its digest beside it (``out.sha256``), each written under a temporary
    name and renamed, so a reader sees either nothing or a whole library with its digest. The compiler runs in
    its own process group (under :data:`_GUARD`), killed whole (cc1plus too) past :data:`BUILD_TIMEOUT_S`, on
    any exception here (Ctrl-C's KeyboardInterrupt) and when this process ends, SIGKILL included."""
    folder = out.parent
    _clean_leftovers(folder)
    watch, hold = os.pipe()  # the guard's watcher reads ``watch``; ``hold`` stays here until the build is over
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{_BUILD_PREFIX}{_host()}-{os.getpid()}-", suffix=".so", dir=folder)
    except OSError:
        os.close(watch)
        os.close(hold)
        raise
    os.close(fd)
    tmp_digest = tmp + ".sha256"
    try:
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", _GUARD, "build-guard", compiler, *build_flags, str(SOURCE), "-o", tmp],
                stdin=watch,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        finally:
            os.close(watch)
        try:
            _, err = proc.communicate(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise OSError(f"the build took over {BUILD_TIMEOUT_S} s and was stopped") from None
        except BaseException:  # Ctrl-C (KeyboardInterrupt), SystemExit, anything: the compiler goes with the build
            _stop(proc)
            raise
        if proc.returncode != 0:
            raise OSError("g++ failed: " + ((err or "").strip().splitlines() or ["no message"])[0][:200])
        Path(tmp_digest).write_text(_sha256(Path(tmp)) + "\n")
        os.replace(tmp, out)
        os.replace(tmp_digest, str(out) + ".sha256")
    finally:
        os.close(hold)  # the watcher reads EOF and ends (with whatever is left of the group)
        for left in (tmp, tmp_digest):
            with contextlib.suppress(OSError):
                os.unlink(left)


def _verified(out: Path) -> str | None:
    """None when ``out`` is the library a build here wrote (its bytes match the digest written beside it), else
    what is wrong with it. Checked before the loader opens it: a truncated library makes the loader die with
    SIGBUS, and a foreign one's constructors would run."""
    digest = Path(str(out) + ".sha256")
    if not out.exists():
        return "missing"
    try:
        want = digest.read_text().strip()
    except OSError:
        return "has no digest beside it (not a library this code built)"
    try:
        got = _sha256(out)
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    return None if got == want else "does not match its digest (truncated, damaged or replaced)"


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    fn = lib.aae_softmax_rows
    fn.restype = None
    fn.argtypes = [_P, _I, _P, _I, _I, _I, _I, _I, _I, _P, _I, _I, _I, _P, ctypes.c_int32, _P, _I, _I, _P, _P]
    lib.aae_pool_rows.restype = None
    lib.aae_pool_rows.argtypes = [_P, _I, _I, _I, _P, _I, ctypes.c_int32, _P, _I, _I, _I, _P, _P, _P]
    lib.aae_isa.restype = ctypes.c_char_p
    lib.aae_isa.argtypes = []
    lib.aae_sorted_sum.restype = None
    lib.aae_sorted_sum.argtypes = [_P, _I, _I, _I, _I, _P, _P]
    return lib


def _self_test(lib: ctypes.CDLL) -> None:
    """One small block through the library against the same arithmetic in torch: a library that loads but
    computes something else (a stale or planted build) is refused, never trusted with a person's numbers."""
    g = torch.Generator().manual_seed(0)
    s = torch.randn(1, 2, 3, 37, generator=g) * 4
    tau = torch.tensor([0.7, 1.3])
    x = s / tau.view(1, 2, 1, 1)
    d = x - x.amax(-1, keepdim=True)
    e = torch.exp(d)
    got = s.clone()
    total = torch.empty(1, 2, 3, 1)
    dot = torch.empty(1, 2, 3, 1)
    p = got.data_ptr()
    lib.aae_softmax_rows(
        p, 37, p, 37, 1, 2, 3, 37, -1, None, 0, 0, 0, tau.data_ptr(), 1, None, 0, 6, total.data_ptr(), dot.data_ptr()
    )
    ok = (
        torch.allclose(got, e, rtol=1e-5, atol=1e-7)
        and torch.allclose(total, e.sum(-1, keepdim=True), rtol=1e-5)
        and torch.allclose(dot, (e * d).sum(-1, keepdim=True), rtol=1e-4, atol=1e-5)
    )
    if not ok:
        raise OSError("failed its self-test (its arithmetic is wrong)")


def library_name() -> str:
    """The cached library's file name: one per source, flags and CPU."""
    key = SOURCE.read_bytes() + " ".join(flags()).encode() + _cpu_key().encode()
    return f"fused_softmax-{hashlib.sha256(key).hexdigest()[:16]}.so"


def _build() -> ctypes.CDLL:
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise OSError("no C++ compiler (g++) on this machine")
    build_flags = flags()
    out = _private_folder(_cache_dir()) / library_name()
    problem = _verified(out)
    if problem is not None and problem != "missing":
        _say(f"the cached library {problem}; rebuilding it")
    if problem is not None:
        _compile(compiler, out, build_flags)
        if _verified(out) is not None:  # another process replaced it meanwhile, or the disk lied
            raise OSError("the library just built does not match its digest")
    try:
        want: str | None = Path(str(out) + ".sha256").read_text().strip()
    except OSError:
        want = None
    try:
        try:
            lib = _bind(ctypes.CDLL(str(out)))
        except (OSError, AttributeError) as err:
            raise OSError(f"does not load ({str(err).split(':')[-1].strip()[:120]})") from err
        _self_test(lib)
    except OSError as err:
        _discard(out, want)
        raise OSError(f"the library {out} {err}; it was removed, the next process builds it again") from err
    return lib


def _discard(out: Path, want: str | None) -> None:
    """Remove a library that failed to load or its self-test (planted with a matching digest, or a build that
    computes wrongly), with its digest, unless another process has replaced it meanwhile: kept, it would keep the
    kernel off in every later process. This process stays off: its loader has it open already (planted code ran,
    and loading the same path again would hand back the same library)."""
    with contextlib.suppress(OSError):
        if want is not None and _sha256(out) == want:
            out.unlink()
            Path(str(out) + ".sha256").unlink()


def available() -> bool:
    """Whether the kernel can run here (built on first call; False without a compiler or when switched off).

    A build or load that fails says why in one line on stderr (once per process) and leaves the attention on
    torch's path, which gives the same numbers, slower."""
    global _LIB, _TRIED, _WHY
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    if _TRIED:
        return _LIB is not None
    with _LOCK:
        if not _TRIED:
            try:
                _LIB = _build()
            except (OSError, subprocess.SubprocessError) as err:
                _LIB, _WHY = None, str(err)
                if "no C++ compiler" not in _WHY:
                    _say(f"off ({_WHY}); attention takes torch's path (same numbers, slower)", traceback.format_exc())
            _TRIED = True
    return _LIB is not None


def why_not() -> str | None:
    """Why the kernel is not in use (None when it is, or was never asked for)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"switched off ({ENV_SWITCH}=0)"
    return None if _LIB is not None else _WHY


def built_isa() -> str | None:
    """The vector instructions the loaded kernel was compiled for (``avx512``, ``avx2``, ``neon``...), None
    when no kernel is loaded."""
    return None if not available() else _LIB.aae_isa().decode()


def threads() -> int:
    """How many threads share a block's rows: torch's own intra-op count."""
    return max(1, torch.get_num_threads())


def _pool(n: int) -> ThreadPoolExecutor:
    global _POOL, _POOL_SIZE
    with _LOCK:
        if _POOL is None or _POOL_SIZE != n:
            old, _POOL, _POOL_SIZE = _POOL, ThreadPoolExecutor(n, thread_name_prefix="fused-softmax"), n
            if old is not None:
                old.shutdown(wait=False)
        return _POOL


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _need() -> None:
    """Build (or load) the library now; a clear error where it cannot run (callers check :func:`available`)."""
    if not available():
        raise RuntimeError(f"the fused softmax kernel is not available here: {why_not()}")


def _split(fn, rows: int, per_thread: Callable[[int, int, int], tuple]) -> None:
    """Run ``fn(*per_thread(k, lo, hi))`` over ``[0, rows)`` cut into :func:`threads` parts, in parallel."""
    n = min(threads(), max(1, rows // 4))
    cuts = [rows * k // n for k in range(n + 1)]
    if n == 1:
        fn(*per_thread(0, 0, rows))
        return
    jobs = [_pool(n).submit(fn, *per_thread(k, cuts[k], cuts[k + 1])) for k in range(n)]
    for j in jobs:
        j.result()


def pool_rows(
    exp: torch.Tensor, total: torch.Tensor, a: int, b: int, n0: int, edges: torch.Tensor, head: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[a, b)`` of one item's probabilities ``exp / total`` (``exp`` ``[H, c, K]`` contiguous, ``total``
    ``[H, c, 1]``), the head mean (``head`` None) or one head, keys ``[0, n0)`` pooled into the bins between
    ``edges`` (int64, ``nb + 1`` values from 0 to ``n0``): ``(sums, maxima)``, each ``[b - a, nb]`` float32.

    Equal to :meth:`core.mechanics.probes.Recorder` pooling the normalised rows (tests/mechanics/test_fused_softmax.py)."""
    _need()
    H, c, K = exp.shape
    if not exp.is_contiguous() or exp.dtype != torch.float32:
        raise ValueError("exp must be a contiguous float32 [H, c, K] tensor")
    inv = total.reshape(H, c).reciprocal().contiguous()
    edges = edges.to(torch.int64).contiguous()
    nb = edges.numel() - 1
    rows = b - a
    sums = torch.empty(rows, nb, dtype=torch.float32)
    maxes = torch.empty(rows, nb, dtype=torch.float32)
    n = min(threads(), max(1, rows // 4))
    temp = torch.empty(n, max(1, n0), dtype=torch.float32)
    shift = a * nb * 4  # the C side writes row r at out + r * nb: point the outputs a rows back

    def part(k: int, lo: int, hi: int) -> tuple:
        return (
            exp.data_ptr(),
            H,
            K,
            n0,
            inv.data_ptr(),
            c,
            -1 if head is None else int(head),
            edges.data_ptr(),
            nb,
            a + lo,
            a + hi,
            temp[k].data_ptr(),
            sums.data_ptr() - shift,
            maxes.data_ptr() - shift,
        )

    _split(_LIB.aae_pool_rows, rows, part)
    return sums, maxes


def sorted_sum(x: torch.Tensor) -> torch.Tensor:
    """Each row of ``x`` (``[R, n]`` float32, rows contiguous) sorted descending, summed: ``[n]`` float64.

    What the sorted-logits probe accumulates; the same as ``torch.sort(x, descending=True).values.sum(0)``."""
    _need()
    if x.dim() != 2 or x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError("x must be a float32 [rows, n] tensor with contiguous rows")
    R, n = x.shape
    k = min(threads(), max(1, R // 4))
    accs = torch.zeros(k, n, dtype=torch.float64)
    scratch = torch.empty(k, 2 * n, dtype=torch.int32)

    def part(j: int, lo: int, hi: int) -> tuple:
        return (x.data_ptr(), x.stride(0), n, lo, hi, scratch[j].data_ptr(), accs[j].data_ptr())

    _split(_LIB.aae_sorted_sum, R, part)
    return accs.sum(0)


def softmax_rows(
    scores: torch.Tensor,
    bias: torch.Tensor | None = None,
    bias_strides: tuple[int, int, int] = (0, 0, 0),
    tau: torch.Tensor | None = None,
    tau_per: str = "head",
    keymask: torch.Tensor | None = None,
    *,
    diagonal: int | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn ``scores`` (``[B, H, c, K]`` float32 q.k, contiguous, CPU) into ``exp(x - max)``, in place or in ``out``.

    ``bias``: a float32 tensor whose element ``bias_strides = (per head, per row, base)`` away
    from its start begins a row's keys (contiguous keys): for a
    :class:`~core.mechanics.relative_bias.RelativeBias` vector ``(len, -1, start of the block's first row)``.
    ``tau``: ``[H]`` (``tau_per="head"``) or ``[c]`` (``tau_per="row"``: the block's rows), or None.
    ``keymask``: bool or uint8 ``[B, K]`` (True: attend), or None.
    ``diagonal``: causal rows: row ``i`` of the block sees keys ``0 .. diagonal + i`` only (a causal prefill's
    block of rows ``[r0, r1)`` with ``K = start + r1`` keys: ``diagonal = start + r0``); the keys past a row's
    place are never read nor computed and get exp 0 (no mask tensor). None: every key.
    ``out``: where exp goes instead of ``scores``, a contiguous float32 ``[B, H, c, K']`` with ``K' >= K`` (rows
    of all the call's keys while ``scores`` holds only those the block sees): its first ``K`` values of each row are
    written, the rest left as they are (zero, as the caller made them). None: in place.
    Returns ``(total, dot)``, each ``[B, H, c, 1]`` float32.
    """
    _need()
    B, H, c, K = scores.shape
    if scores.dtype != torch.float32 or not scores.is_contiguous() or scores.device.type != "cpu":
        raise ValueError("scores must be a contiguous float32 CPU tensor [B, H, c, K]")
    if out is None:
        out = scores
    elif (
        out.dtype != torch.float32
        or not out.is_contiguous()
        or out.device.type != "cpu"
        or tuple(out.shape[:3]) != (B, H, c)
        or out.shape[-1] < K
    ):
        raise ValueError(f"out must be a contiguous float32 CPU tensor [{B}, {H}, {c}, >= {K}]")
    mode = 0
    if tau is not None:
        tau = tau.to(torch.float32).contiguous().view(-1)
        mode, want = {"head": (1, H), "row": (2, c)}.get(tau_per, (0, -1))
        if tau.numel() != want:
            raise ValueError(
                f"tau_per must be 'head' ([{H}] values) or 'row' ([{c}] values); got {tau_per!r} "
                f"with {tau.numel()} values"
            )
    if bias is not None and (bias.dtype != torch.float32 or bias.device.type != "cpu"):
        raise ValueError("bias must be a float32 CPU tensor")
    if keymask is not None:
        keymask = keymask.to(torch.uint8).contiguous()
        if tuple(keymask.shape) != (B, K):
            raise ValueError(f"keymask must be [batch, keys] = [{B}, {K}], got {tuple(keymask.shape)}")
    if diagonal is not None and diagonal < 0:
        raise ValueError(f"diagonal must be at least 0 (a row sees its own key), got {diagonal}")
    total = torch.empty(B, H, c, 1, dtype=torch.float32)
    dot = torch.empty(B, H, c, 1, dtype=torch.float32)
    hs, rs, base = bias_strides
    fn = _LIB.aae_softmax_rows
    rows = B * H * c
    args = (scores.data_ptr(), K, out.data_ptr(), out.shape[-1], B, H, c, K, -1 if diagonal is None else diagonal)
    args = (*args, _ptr(bias), hs, rs, base, _ptr(tau), mode, _ptr(keymask))
    _split(fn, rows, lambda k, lo, hi: (*args, lo, hi, total.data_ptr(), dot.data_ptr()))
    return total, dot
