"""Sweeps past one machine: the work cut into jobs, run heavy-first by a pool of Ray actors, one model each.

Why: a results table (many documents, several models, 1x-16x L_tr, every
method) is hours in one process; a cluster runs it in minutes, and Ray is the
established way to fan Python work out over one. The sweeps themselves
(:mod:`core.experiments.sweep`, :mod:`core.experiments.batch`, ``bench/results.py``) cut their work
into :class:`Job` s; this module runs them:

* :func:`run_local` runs jobs in this process, in the order given (a local
  sweep keeps its plan order, so its CSV is what it always was);
* :class:`RayEngine` runs them on a pool of actors. Each actor loads its
  model once and keeps it; one GPU per actor when the cluster has GPUs (CUDA
  and bfloat16, as :func:`core.models.pick_device` picks), otherwise a stated
  number of CPU threads per actor. The driver stays the one writer: results
  come back as jobs finish and the caller's ``on_done`` writes them with the
  same code a local run uses. A job that fails (it raised, its actor died, a
  GPU ran out of memory) is retried once, then handed to ``on_fail`` with its
  label; the run goes on. Ctrl-C (or ``should_stop``) cancels the jobs still
  out, by killing their actors, and keeps every finished row.
* :class:`Queue` is the scheduler both use on a pool: the ready job with the
  highest priority first. A cell's cost grows about with the square of its
  length (:func:`cost`), and a job that unlocks others (a calibration its
  cells wait for) adds their cost to its priority, so the last minutes are
  not one 16x cell running alone. :func:`simulate` runs the same queue on
  a clock instead of a cluster, for the bench's projections.

Ray is imported only by :class:`RayEngine` (``--engine ray``): the CLI stays
fast and the app never imports it.

Every wait on the network is bounded: an ``--address`` is parsed once
(:func:`parse_address`) and must answer a gRPC health check (grpcio's
standard ``grpc.health.v1`` stub, imported only then) within
:data:`PROBE_TIMEOUT` seconds (:func:`check_address`, no Ray import), and
joining it must finish within :data:`JOIN_TIMEOUT` seconds. A new local Ray
gets an object store that fits this process's memory limits
(:func:`object_store_bytes`), or one line saying it cannot.
"""

from __future__ import annotations

import contextlib
import heapq
import ipaddress
import itertools
import logging
import math
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.errors import UserError
from core.models import memory
from core.values.choice import TRAINED

#: Encoder passes (count, tokens): what a job runs, for its cost and its time estimate.
Passes = tuple[tuple[int, int], ...]


# -- jobs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRef:
    """What an actor loads: the model's spec (source and L_tr) and a tokenizer override, if any.

    Why not the loaded model: an actor loads its own copy on its own device
    once and keeps it; a spec is a few strings to ship. The model must be
    reachable from every node (a hub id, or a folder at the same path)."""

    spec: Any  # core.models.ModelSpec (frozen, picklable)
    tokenizer: str | None = None

    @property
    def key(self) -> tuple:
        return (self.spec.source, self.spec.train_length, self.tokenizer or "")


@dataclass
class Job:
    """One piece of a sweep: ``fn(loaded, payload)`` on some worker, its result back to the driver.

    ``fn`` must be a module-level function (Ray ships it by reference).
    ``label`` names the cell(s) in a failure report. ``passes`` and
    ``answers`` are (count, tokens) pairs of encoder passes and answer
    generations: the job's cost and its time estimate. ``unlocks``: the cost
    of the jobs that wait for this one (a calibration and its cells)."""

    fn: Callable[[Any, Any], Any]
    payload: Any
    label: str
    passes: Passes = ()
    answers: Passes = ()
    unlocks: float = 0.0
    model: ModelRef | None = None
    kind: str = "cells"
    tag: Hashable = None  # the caller's own handle (e.g. which cell a result belongs to)

    @property
    def cost(self) -> float:
        """Work in pass-token² units: a pass over n tokens costs n² (attention dominates long inputs)."""
        return cost(self.passes)

    @property
    def priority(self) -> float:
        return self.cost + self.unlocks


def cost(passes: Iterable[tuple[int, int]]) -> float:
    """Relative cost of encoder passes: count x tokens² each (a cell's cost grows about with its length squared)."""
    return float(sum(c * float(n) ** 2 for c, n in passes))


def chunk_size(items: int, workers: int, per_worker: int = 4, cap: int = 32) -> int:
    """Documents per job: about ``per_worker`` jobs per worker over ``items`` documents, 1..``cap``.

    Why: one document per job spends a round trip per document; one job per
    (length, method) leaves workers idle while the last big one runs. Several
    jobs per worker, heaviest first, keep the tail short."""
    if items <= 0:
        return 1
    return max(1, min(cap, math.ceil(items / max(1, workers * per_worker))))


def chunks(seq: list, size: int) -> list[list]:
    """``seq`` in consecutive pieces of at most ``size`` (order kept)."""
    size = max(1, int(size))
    return [seq[i : i + size] for i in range(0, len(seq), size)]


class Queue:
    """Ready jobs, heaviest priority first (ties: the order they came in). The scheduler of
    :class:`RayEngine` and of :func:`simulate` alike."""

    def __init__(self, jobs: Iterable[Job] = (), heavy_first: bool = True):
        self._heap: list[tuple[float, int, Job]] = []
        self._seq = itertools.count()
        self.heavy_first = heavy_first  # False: first come, first served (to show what heavy-first saves)
        for job in jobs:
            self.push(job)

    def push(self, job: Job) -> None:
        heapq.heappush(self._heap, (-job.priority if self.heavy_first else 0.0, next(self._seq), job))

    def pop(self) -> Job:
        return heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap)


def estimate(jobs: Iterable[Job], model_key: Hashable, workers: int = 1) -> float | None:
    """Seconds the jobs should take on ``workers`` workers like this process, from :mod:`core.runs.timing`'s
    measured pass times (None when this model has none): the total over the workers, at least the longest job."""
    from core.runs import timing

    total, longest = 0.0, 0.0
    for job in jobs:
        enc = timing.total(model_key, list(job.passes))
        gen = timing.total(model_key, list(job.answers), timing.GENERATE) if job.answers else 0.0
        if enc is None or gen is None:
            return None
        total += enc + gen
        longest = max(longest, enc + gen)
    return max(total / max(1, workers), longest)


def time_a_pass(loaded: Any, make_doc: Callable[[], Any]) -> None:
    """Run (and so time, :mod:`core.runs.timing`) one pass over ``make_doc()`` unless this model has a pass timed already.

    Why: the sentence before a sweep says roughly how long it will take, and
    :func:`estimate` scales measured pass times; a fresh process has none.
    One short document costs a fraction of one row. A document that cannot be
    built or run is left to the sweep itself to report."""
    from core.mechanics.probes import ProbeSpec
    from core.runs import engine, timing

    if timing.measured(timing.model_key(loaded)):
        return
    with contextlib.suppress(ValueError, RuntimeError):
        engine.run(loaded, make_doc(), TRAINED, engine.Pass(probes=ProbeSpec.stats_only()))


# -- progress ---------------------------------------------------------------------------


class Tracker(Protocol):
    """What a sweep tells its progress display: the plan once, then each finished (or failed) job."""

    def start(self, jobs: int, rows: int, seconds: float | None, where: str) -> None: ...

    def advance(self, jobs: int = 1, rows: int = 0) -> None: ...

    def add(self, jobs: int) -> None: ...


class Bar:
    """The CLI's progress for a sweep, local or on Ray alike: one sentence before it starts (how many jobs,
    where, about how long), then a bar of jobs done / total with rows per second beside it (stderr).

    Drawn at :meth:`start`, so a sweep refused before it starts prints its one error line and no bar."""

    def __init__(self, desc: str = "sweep", file=None):
        self.desc = desc
        self.file = file
        self.rows = 0
        self.t0 = 0.0
        self._bar = None

    def start(self, jobs: int, rows: int, seconds: float | None, where: str) -> None:
        from tqdm import tqdm

        from core.runs.timing import describe

        out = self.file or sys.stderr
        when = describe(seconds) if seconds is not None else "time unknown until the first jobs finish"
        print(f"{self.desc}: {jobs:,} job{'s' if jobs != 1 else ''} ({rows:,} rows) {where}; {when}", file=out)
        self.t0 = time.perf_counter()
        self._bar = tqdm(total=jobs, desc=self.desc, unit="job", file=out, dynamic_ncols=True)

    def advance(self, jobs: int = 1, rows: int = 0) -> None:
        if self._bar is None:
            return
        self.rows += rows
        rate = self.rows / max(1e-9, time.perf_counter() - self.t0)
        self._bar.set_postfix_str(f"{self.rows:,} rows, {rate:.2f} rows/s", refresh=False)
        self._bar.update(jobs)

    def add(self, jobs: int) -> None:
        if self._bar is not None and jobs:
            self._bar.total += jobs
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class _NoTracker:
    def start(self, jobs: int, rows: int, seconds: float | None, where: str) -> None:
        pass

    def advance(self, jobs: int = 1, rows: int = 0) -> None:
        pass

    def add(self, jobs: int) -> None:
        pass


NO_TRACKER: Tracker = _NoTracker()


# -- running jobs ------------------------------------------------------------------------

OnDone = Callable[[Job, Any], "Iterable[Job] | None"]
OnFail = Callable[[Job, str], None]


def run_local(
    jobs: Iterable[Job],
    loaded: Any,
    on_done: OnDone,
    should_stop: Callable[[], bool] | None = None,
    guard: Callable[[], ContextManager] = contextlib.nullcontext,
) -> bool:
    """Run ``jobs`` here, one after another, in the order given; False when ``should_stop`` ended it early.

    Jobs ``on_done`` returns run next. An exception propagates (a local run
    stops where it failed, as it always did); ``guard()`` is entered around
    each job (the app's pass gate)."""
    pending: list[Iterator[Job]] = [iter(jobs)]
    while pending:
        job = next(pending[-1], None)
        if job is None:
            pending.pop()
            continue
        if should_stop and should_stop():
            return False
        with guard():
            result = job.fn(loaded, job.payload)
        more = on_done(job, result)
        if more:
            pending.append(iter(list(more)))
    return True


class Cancelled(Exception):
    """Raised inside a job whose run was cancelled (Ctrl-C on the driver): its results are not wanted."""


def cancelled() -> bool:
    """Whether the job running here was cancelled: True only inside a Ray actor task the driver cancelled.

    Why: Ray cannot interrupt a running task of a plain actor; it sets a flag
    (``ray.cancel``) that the task reads. Jobs of several documents check it
    between documents, so a cancelled sweep frees its actors within one
    document and they stay warm (their models loaded) for the next run."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    try:
        return bool(ray.get_runtime_context().is_canceled())
    except Exception:  # noqa: BLE001 - the driver, or a Ray without the flag: nothing to cancel here
        return False


class _Worker:
    """A Ray actor: loads each model it is asked for once, keeps it, and runs jobs on it.

    ``device``: "cuda" for a GPU actor (Ray gives it one GPU: cuda:0 is its
    own), "cpu" otherwise, with ``threads`` torch threads."""

    def __init__(self, device: str, threads: int):
        import torch

        self.device = device
        self.threads = max(1, int(threads))
        if device == "cpu":
            torch.set_num_threads(self.threads)
        self.models: dict[tuple, Any] = {}

    def _model(self, ref: ModelRef | None):
        if ref is None:
            return None
        if ref.key not in self.models:
            from core.models import load

            self.models[ref.key] = load(ref.spec, device=self.device, tokenizer=ref.tokenizer)
        return self.models[ref.key]

    def ready(self, ref: ModelRef | None) -> str:
        """Load the model now (so a node that cannot reach it says so before any row is written); where we are."""
        loaded = self._model(ref)
        where = f"{socket.gethostname()} pid {os.getpid()}"
        return where if loaded is None else f"{where} {loaded.device} {str(loaded.dtype).replace('torch.', '')}"

    def run(self, fn: Callable[[Any, Any], Any], ref: ModelRef | None, payload: Any) -> Any:
        try:
            return fn(self._model(ref), payload)
        except BaseException:
            import torch

            if torch.cuda.is_available():  # a GPU out of memory: free what the failed job held before the retry
                torch.cuda.empty_cache()
            raise


# -- where the cluster is ----------------------------------------------------------------

#: Seconds ``--address`` gets to show that a Ray cluster answers there: the name lookup, the TCP connection and a
#: gRPC health check together (:func:`check_address`). A live GCS answers its health check in milliseconds
#: (measured: 2 ms, Ray 2.60); 10 s leaves room for a loaded head or a slow link. Why at all: ``ray.init`` against
#: a port that accepts and never answers waited over 200 s (measured) and takes no timeout of its own.
PROBE_TIMEOUT = 10.0

#: Seconds ``ray.init`` may take to join a cluster whose GCS passed the probe, before the driver gives up on it
#: and names the address. The backstop for a GCS that answers its health check and then stalls a driver (a
#: joined Ray cannot be told a timeout): a join that works takes seconds, Ray's own connection retries give up
#: after about 20 s (measured, a refused join), so 60 s is a join that will not finish. The join runs in a thread
#: the driver can abandon (:func:`_join`).
JOIN_TIMEOUT = 60.0

_SCHEMES = ("ray",)
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_EXAMPLES = "e.g. 10.0.0.5:6379, ray://10.0.0.5:10001 or auto"


@dataclass(frozen=True)
class Address:
    """A Ray cluster's address, parsed once: ``scheme`` ("" for a GCS, "ray" for Ray Client), host, port.

    Why a type: the text once went to the TCP check as it came, so a port of
    20 digits raised OverflowError and one over 65535 wrapped around (the
    socket layer keeps 16 bits) and passed the check; now a port is
    1..65535 or the address is refused."""

    scheme: str
    host: str
    port: int

    @property
    def netloc(self) -> str:
        """host:port, an IPv6 host in brackets."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.netloc}" if self.scheme else self.netloc


def _shown(text: str, limit: int = 80) -> str:
    """``text`` fit for one line of an error message: ASCII, no control characters, at most ``limit`` characters."""
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text)


def parse_address(text: str) -> str | Address:
    """``--address`` checked as text (no network): ``auto`` and ``local`` (Ray's own words) as they are, else an
    :class:`Address` (``[ray://]host:port``, port 1..65535), else a :class:`UserError` in one line."""
    text = text.strip()
    if not text:
        raise UserError("--address is empty: give host:port of the Ray head, or auto")
    if text in ("auto", "local"):
        return text
    bad = f"--address {_shown(text)}"
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    elif scheme.lower() not in _SCHEMES:
        raise UserError(f"{bad}: the scheme must be ray:// or none ({_EXAMPLES})")
    else:
        scheme = scheme.lower()
    rest = rest[:-1] if rest.endswith("/") else rest
    if rest.startswith("["):  # [IPv6]:port
        host, close, port = rest[1:].partition("]")
        if not close or not port.startswith(":"):
            raise UserError(f"{bad}: not host:port ({_EXAMPLES}; an IPv6 host in brackets, [::1]:6379)")
        port = port[1:]
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise UserError(f"{bad}: {_shown(host, 40)} is not an IPv6 address") from None
    else:
        host, colon, port = rest.rpartition(":")
        if not colon or not host:
            raise UserError(f"{bad}: not host:port ({_EXAMPLES})")
        if ":" in host:
            raise UserError(f"{bad}: not host:port (an IPv6 host goes in brackets: [::1]:6379)")
        name = host[:-1] if host.endswith(".") else host
        if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
            raise UserError(f"{bad}: {_shown(host, 40)} is not a host name or IP address ({_EXAMPLES})")
    if not re.fullmatch(r"[0-9]+", port):
        raise UserError(f"{bad}: not host:port, the port must be a number ({_EXAMPLES})")
    number = (
        int(port) if len(port) <= 6 else 0
    )  # a longer one is out of range anyway (and int() of 5,000 digits raises)
    if not 1 <= number <= 65535:
        raise UserError(f"{bad}: the port must be 1 to 65535, got {_shown(port, 24)}")
    return Address(scheme, host, number)


def _resolve(host: str, port: int, seconds: float) -> list:
    """``getaddrinfo`` within ``seconds`` (a stalled DNS server is a network wait too): the addresses, or OSError.

    Why here and not in grpc: grpc's call deadline does cover its own lookup (measured, grpcio 1.85: a DNS server
    that never answers ends the call at its deadline), but as a bare DEADLINE_EXCEEDED, the same words as a port
    that never answers; resolved here, a name that does not resolve is named as such, and grpc is handed the
    address getaddrinfo gave (no second lookup, through c-ares, that could disagree with the system's)."""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)  # a literal address: no lookup
    except ValueError:
        pass
    box: dict[str, Any] = {}

    def look() -> None:
        try:
            box["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as err:
            box["err"] = err

    worker = threading.Thread(target=look, name="aae-resolve", daemon=True)  # abandoned if the lookup stalls
    worker.start()
    worker.join(max(0.0, seconds))
    if "infos" in box:
        return box["infos"]
    err = box.get("err")
    if isinstance(err, OSError):
        raise err
    if err is not None:
        raise OSError(f"not a valid host name ({type(err).__name__})")
    raise TimeoutError(f"the name lookup did not finish within {seconds:g} s")


def _tls() -> bool:
    """Whether Ray speaks TLS (``RAY_USE_TLS``): its handshake and certificates are Ray's, so the probe stops at TCP."""
    return os.environ.get("RAY_USE_TLS", "").strip().lower() in ("1", "true", "yes")


def _probe(addr: Address, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Why no Ray cluster answers at ``addr`` within ``timeout`` seconds in all (None: a gRPC server answered).

    A TCP connection alone proved little: a port that accepts and never
    answers passed, and ``ray.init`` then hung for minutes. So, within one
    deadline: the name is resolved (:func:`_resolve`), the first of its
    addresses that accepts a TCP connection is found (so a refused ::1 falls
    through to 127.0.0.1, and a refusal or a silent host is named as such),
    and grpc's standard health stub calls ``grpc.health.v1.Health/Check``
    there (:func:`_health`). A cluster with TLS (``RAY_USE_TLS``) gets the
    TCP check only."""
    deadline = time.monotonic() + timeout
    left = lambda: max(0.001, deadline - time.monotonic())  # noqa: E731
    try:
        infos = _resolve(addr.host, addr.port, left())
    except OSError as err:
        return f"the name {_shown(addr.host, 40)} was not resolved: {_shown(str(err.strerror or err), 80)}"
    reached, why = None, "no address to connect to"
    for family, kind, proto, _, sockaddr in infos:
        if time.monotonic() >= deadline:
            break
        try:
            sock = socket.socket(family, kind, proto)
        except OSError as err:  # an address family this machine lacks (IPv6 switched off)
            why = err.strerror or type(err).__name__
            continue
        with sock:
            try:
                sock.settimeout(left())
                sock.connect(sockaddr)
                reached = (family, sockaddr)
                break
            except OSError as err:
                why = (
                    f"no TCP connection within {timeout:g} s"
                    if isinstance(err, TimeoutError)
                    else err.strerror or type(err).__name__
                )
    if reached is None:
        return why if time.monotonic() < deadline else f"no TCP connection within {timeout:g} s"
    if _tls():
        return None
    return _health(*reached, seconds=left(), timeout=timeout)


def _health(family: int, sockaddr: tuple, seconds: float, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Call the standard gRPC health check at ``sockaddr`` (an address that accepted TCP) within ``seconds``:
    None when a gRPC server answered, else why not in words (``timeout``: the bound the words name).

    Why grpcio: Ray's GCS and Ray Client's server speak gRPC, and a maintained
    client speaks HTTP/2 correctly where the hand-made frames this replaces
    (issue 46) covered only the happy path. Any gRPC answer shows a live
    server: the GCS answers SERVING (measured), and a server without the
    health service answers UNIMPLEMENTED. No server: UNAVAILABLE (the
    connection failed, or what answered is not gRPC: an HTTP/1 server),
    DEADLINE_EXCEEDED (nothing answered in time), and an HTTP status other
    than 200 (an HTTP/2 server that is not gRPC). grpc is imported here,
    not at the top, so the CLI's start stays light; this connection is a
    second one (the TCP check's is closed), as grpc takes an address, not a
    socket."""
    try:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
    except ImportError:
        raise UserError(
            "--address host:port needs grpcio to check the cluster: "
            "pip install grpcio grpcio-health-checking (requirements.txt has both)"
        ) from None

    host, port = sockaddr[0], sockaddr[1]
    target = f"ipv6:[{host.replace('%', '%25')}]:{port}" if family == socket.AF_INET6 else f"ipv4:{host}:{port}"
    # one call, straight to the cluster: grpc would otherwise retry, and honour http_proxy / grpc_proxy
    options = [("grpc.enable_retries", 0), ("grpc.enable_http_proxy", 0)]
    with grpc.insecure_channel(target, options=options) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=seconds)
            return None
        except grpc.RpcError as err:
            code, details = err.code(), " ".join(str(err.details() or "").split())
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"a TCP connection opened, but no answer to a gRPC health check within {timeout:g} s"
    if code != grpc.StatusCode.UNAVAILABLE:
        if details.startswith("Received http2 header with status"):
            # grpc's words for an HTTP/2 answer whose :status is not 200: a gRPC server always answers 200 (its
            # status goes in the trailers), so this is a web server or proxy, though grpc calls it UNIMPLEMENTED
            said = _shown(details.rpartition(" ")[2], 8)
            return f"something answered there, but not gRPC (an HTTP/2 server that said {said})"
        return None  # UNIMPLEMENTED, NOT_SERVING and the rest: a gRPC server answered
    cause = details.rpartition(f":{port}: ")[2] or details  # grpc's last error, without the address it repeats
    if "http1" in cause.lower():
        return "something answered there, but not gRPC (an HTTP/1 server, not a Ray GCS or Ray Client server)"
    return f"a TCP connection opened, but no gRPC server answered ({_shown(cause, 100)})"


def check_address(address: str | None) -> str | None:
    """An ``--address`` a Ray driver can use (canonical text), or a :class:`UserError` in one line (no Ray import).

    ``auto`` (the cluster ``ray start`` made on this node) and ``local`` (a new
    local Ray) are Ray's own words; anything else must be ``host:port`` (or
    ``ray://host:port``) whose server answers a gRPC health check within
    :data:`PROBE_TIMEOUT` seconds."""
    if address is None:
        return None
    parsed = parse_address(address)
    if isinstance(parsed, str):
        return parsed
    why = _probe(parsed)
    if why is not None:
        raise UserError(
            f"--address {parsed}: cannot reach a Ray cluster there ({why}); start one with "
            "`ray start --head` on the head node, or leave --address out for a local Ray"
        )
    return str(parsed)


# -- memory for a local Ray ------------------------------------------------------------------

#: What one of our Ray processes maps beyond this driver before ``ray.init``: Ray's core worker, its threads and
#: their malloc arenas (and torch's in an actor). Measured on a 2-core Linux machine, Ray 2.60, the tiny model:
#: the driver grew by 0.9 GiB in ``ray.init``, an actor stood 1.0 GiB above the driver. Beside it each process
#: maps the whole object store.
RAY_PROCESS_BYTES = 2**30

#: The object store's share of the address space left under ``ulimit -v`` after :data:`RAY_PROCESS_BYTES`: the
#: rest is the actor's, for its passes. Our jobs put little in the store (payloads and rows travel inline).
STORE_SHARE = 0.5

#: The object store's share of the memory left (machine or cgroup): Ray's own default proportion.
STORE_MEMORY_SHARE = 0.3

#: The smallest object store Ray starts with (``ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES``, 75 MiB).
STORE_MIN_BYTES = 75 * 2**20


def object_store_bytes() -> int | None:
    """The object store a new local Ray can have under this process's limits; None: no limit, Ray's default.

    Why: Ray sizes the store from the machine's memory (6.6 GiB here) and
    maps all of it into the raylet, the driver and every actor, each of
    which inherits ``ulimit -v``: under 4 GiB the raylet could not start
    (exit 1 after 35 s), under 8 GiB the driver hung. Sized from what is
    left (:data:`RAY_PROCESS_BYTES`, :data:`STORE_SHARE`), a tiny-model
    sweep runs under 2.5, 4 and 8 GiB caps (measured); under 2 GiB, where
    the store would be under Ray's minimum, one line before Ray starts."""
    room, group = memory.address_space_room(), memory.cgroup_room()
    if room is None and group is None:
        return None
    fits: list[float] = []
    if room is not None:
        fits.append(STORE_SHARE * (room - RAY_PROCESS_BYTES))
    if group is not None:
        fits.append(STORE_MEMORY_SHARE * group)
    available = memory.meminfo_kib("/proc/meminfo", "MemAvailable")
    if available is not None:
        fits.append(STORE_MEMORY_SHARE * available)
    store = int(min(fits))
    if store >= STORE_MIN_BYTES:
        return store
    gib = lambda n: f"{max(0, n) / 2**30:.1f} GiB"  # noqa: E731
    if room is not None and STORE_SHARE * (room - RAY_PROCESS_BYTES) < STORE_MIN_BYTES:
        import resource

        cap = resource.getrlimit(resource.RLIMIT_AS)[0]
        raise UserError(
            f"--engine ray: this process may map {gib(cap)} (ulimit -v) and has {gib(room)} of it left; "
            f"a local Ray needs about {gib(RAY_PROCESS_BYTES + 2 * STORE_MIN_BYTES)} more in each of "
            "its processes (its object store is mapped into every one): raise ulimit -v, or leave "
            "--engine ray out"
        )
    raise UserError(
        f"--engine ray: {gib(min(x for x in (group, available) if x is not None))} of memory left "
        f"(cgroup limit or machine), too little for a local Ray's object store (at least "
        f"{STORE_MIN_BYTES // 2**20} MiB): free memory, or leave --engine ray out"
    )


def _join(ray: Any, address: str, kwargs: dict, seconds: float | None = None) -> None:
    """``ray.init(address)`` within ``seconds`` (:data:`JOIN_TIMEOUT`), or a :class:`UserError` naming the address.

    Why a thread: a joining ``ray.init`` takes no timeout and was seen to
    wait for minutes; a thread can be abandoned (a daemon: the CLI exits 2
    at once, measured). Only a join: a new local Ray started from a thread
    dies when the thread ends (its GCS shares the starting thread's fate,
    measured), so :meth:`RayEngine.start` starts that one itself."""
    seconds = JOIN_TIMEOUT if seconds is None else seconds
    box: dict[str, BaseException | bool] = {}

    def init() -> None:
        try:
            ray.init(address=address, **kwargs)
            box["ok"] = True
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            box["err"] = err

    worker = threading.Thread(target=init, name="aae-ray-join", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        hint = ""
        if memory.address_space_room() is not None:
            hint = (
                "; this process has an address-space limit (ulimit -v), and a driver maps the cluster's "
                "whole object store"
            )
        raise UserError(f"cannot join the Ray cluster at {address}: no answer within {seconds:g} s{hint}")
    err = box.get("err")
    if isinstance(err, Exception):
        raise UserError(
            f"cannot join the Ray cluster at {address}: {_shown(' '.join(str(err).split()), 200)}"
        ) from None
    if isinstance(err, BaseException):
        raise err


@dataclass
class RayEngine:
    """A pool of Ray actors that runs jobs heavy-first (see the module docstring); a context manager.

    ``address``: a running cluster (``auto``, ``host:port``, ``ray://...``),
    else ``RAY_ADDRESS``, else a new local Ray on this machine (or the Ray
    this process already started, as the tests do). ``actors``: how many
    (default: one per GPU, else one per ``cpus_per_actor`` CPUs). ``device``:
    None/"auto" uses GPUs when the cluster has any, "cpu" never does.
    ``tokenizer``: the override the model needs, as ``--tokenizer``.
    Actors start on the first :meth:`prepare` and are kept for later runs
    (each keeps its models loaded) until :meth:`close`."""

    address: str | None = None
    actors: int | None = None
    cpus_per_actor: int = 1
    device: str | None = None
    tokenizer: str | None = None
    init_kwargs: dict = field(default_factory=dict)
    _pool: list = field(default_factory=list, init=False, repr=False)
    _started_ray: bool = field(default=False, init=False, repr=False)
    _gpu: bool = field(default=False, init=False, repr=False)
    _size: int = field(default=0, init=False, repr=False)
    _cls: Any = field(default=None, init=False, repr=False)

    # -- connecting --

    def __enter__(self) -> RayEngine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> RayEngine:
        """Join (or start) Ray and size the pool; a :class:`UserError` in one line when that cannot be done."""
        try:
            import ray
        except ImportError:
            raise UserError("--engine ray needs Ray: pip install 'ray>=2.40'") from None
        if self.cpus_per_actor < 1:
            raise UserError("--cpus-per-actor must be at least 1")
        if self.actors is not None and self.actors < 1:
            raise UserError("--actors must be at least 1")
        if not ray.is_initialized():
            address = check_address(self.address or os.environ.get("RAY_ADDRESS") or None)
            kwargs = {"log_to_driver": False, "logging_level": logging.ERROR, **self.init_kwargs}
            if address in (None, "local"):
                kwargs.setdefault("include_dashboard", False)
                if "object_store_memory" not in kwargs:
                    store = object_store_bytes()  # a UserError here when a local Ray cannot fit
                    if store is not None:
                        kwargs["object_store_memory"] = store
                try:  # here, not in a thread: the new Ray's processes die with the thread that starts them
                    ray.init(address="local", **kwargs)
                except Exception as err:  # noqa: BLE001 - Ray raises bare Exception for a node that did not start
                    raise UserError(f"cannot start a local Ray: {_shown(' '.join(str(err).split()), 200)}") from None
            else:
                _join(ray, address, kwargs)
            self._started_ray = True
        try:
            self._size_pool(ray.cluster_resources())
        except UserError:
            self.close()  # a Ray this call started stops again: nothing is left running
            raise
        return self

    def _size_pool(self, res: dict) -> None:
        gpus, cpus = int(res.get("GPU", 0)), int(res.get("CPU", 0))
        # any cuda device means GPU actors: Ray gives each one GPU, which it sees as cuda:0
        self._gpu = gpus > 0 and self.device != "cpu"
        if self.device and self.device.startswith("cuda") and gpus == 0:
            raise UserError(f"--device {self.device} with --engine ray: the Ray cluster has no GPU")
        if self._gpu:
            size, need, have, unit = self.actors or gpus, self.actors or gpus, gpus, "GPU"
        else:
            size = self.actors or max(1, cpus // self.cpus_per_actor)
            need, have, unit = size * self.cpus_per_actor, cpus, "CPU"
        if need > have:
            raise UserError(
                f"{size} actors need {need} {unit}s; the Ray cluster has {have}. "
                "Ask for fewer --actors (or fewer --cpus-per-actor)"
            )
        self._size = size

    @property
    def workers(self) -> int:
        """How many actors run jobs side by side."""
        return self._size

    @property
    def where(self) -> str:
        """The pool in words, for the sentence before a sweep."""
        each = (
            "one GPU each"
            if self._gpu
            else f"{self.cpus_per_actor} CPU thread{'s' if self.cpus_per_actor > 1 else ''} each"
        )
        return f"on {self._size} Ray actor{'s' if self._size != 1 else ''} ({each})"

    @property
    def on_cpu(self) -> bool:
        return not self._gpu

    def model_ref(self, loaded: Any) -> ModelRef:
        """What the actors load for ``loaded`` (its spec, this engine's tokenizer override)."""
        return ModelRef(loaded.spec, self.tokenizer)

    # -- the pool --

    def _new_actor(self):
        import ray

        if self._cls is None:
            self._cls = ray.remote(_Worker)
        cls = self._cls
        if self._gpu:
            opts = {"num_gpus": 1, "num_cpus": 1}
        else:
            opts = {"num_cpus": self.cpus_per_actor}
        return cls.options(**opts, max_restarts=0).remote("cuda" if self._gpu else "cpu", self.cpus_per_actor)

    def prepare(self, model: ModelRef | None) -> list[str]:
        """Start the pool (if not yet) and load ``model`` on every actor; where each runs.

        Called before a sweep touches its CSV: a node that cannot load the
        model (a folder it does not have, a hub it cannot reach) ends it with
        one :class:`UserError` instead of a CSV of failures."""
        import ray

        if self._size == 0:
            self.start()
        while len(self._pool) < self._size:
            self._pool.append(self._new_actor())
        try:
            return ray.get([a.ready.remote(model) for a in self._pool])
        except ray.exceptions.RayTaskError as err:
            cause = getattr(err, "cause", None) or err
            src = model.spec.source if model is not None else "?"
            raise UserError(
                f"a Ray actor could not load the model {src}: {' '.join(str(cause).split())[:300]}. "
                "Every node needs the model: a hub id it can download (or has cached), or a folder at "
                "the same path on every node (a shared file system)"
            ) from None
        except ray.exceptions.RayActorError as err:
            self._kill_pool()
            raise UserError(f"a Ray actor died while loading the model: {' '.join(str(err).split())[:200]}") from None

    def _kill_pool(self) -> None:
        import ray

        for actor in self._pool:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self._pool = []

    def release(self) -> None:
        """Stop the actors (their models and resources go back to the cluster); the next run starts new ones."""
        self._kill_pool()

    def close(self) -> None:
        """Stop the actors; shut Ray down only if :meth:`start` started it."""
        if self._pool:
            with contextlib.suppress(Exception):
                self._kill_pool()
        if self._started_ray:
            import ray

            with contextlib.suppress(Exception):
                ray.shutdown()
            self._started_ray = False
        self._size = 0

    # -- running --

    def run(
        self,
        jobs: Iterable[Job],
        on_done: OnDone,
        on_fail: OnFail,
        should_stop: Callable[[], bool] | None = None,
        retries: int = 1,
    ) -> bool:
        """Run ``jobs`` (and what ``on_done`` returns) on the pool, heaviest first; False when stopped early.

        ``on_done(job, result)`` runs here, in the driver, as each job
        finishes: the one writer. A failed job goes back into the queue
        ``retries`` times (an actor that died is replaced first), then to
        ``on_fail(job, why)``. Ctrl-C or ``should_stop()`` kill the actors,
        cancelling every job still out; finished results stay delivered."""
        import ray
        from ray.exceptions import RayActorError, RayError, RayTaskError

        while self._pool and len(self._pool) < self._size:  # actors killed by an earlier cancel
            self._pool.append(self._new_actor())
        if not self._pool:
            self.prepare(None)
        queue = Queue(jobs)
        tries: dict[int, int] = {}
        idle = list(self._pool)
        out: dict[Any, tuple[Job, Any]] = {}
        try:
            while queue or out:
                while idle and queue:
                    job = queue.pop()
                    actor = idle.pop()
                    out[actor.run.remote(job.fn, job.model, job.payload)] = (job, actor)
                ready, _ = ray.wait(list(out), num_returns=1, timeout=0.5)
                if should_stop and should_stop():
                    self._cancel(out)
                    return False
                for ref in ready:
                    job, actor = out.pop(ref)
                    try:
                        result = ray.get(ref)
                    except RayTaskError as err:  # the job raised; its actor lives on
                        idle.append(actor)
                        why = _why(err)
                    except (RayActorError, RayError) as err:  # the actor (or its node) died: replace it
                        with contextlib.suppress(Exception):
                            ray.kill(actor, no_restart=True)
                        self._pool = [a for a in self._pool if a is not actor]
                        fresh = self._new_actor()
                        self._pool.append(fresh)
                        idle.append(fresh)
                        why = f"its Ray actor died ({type(err).__name__}: {' '.join(str(err).split())[:160]})"
                    else:
                        idle.append(actor)
                        for more in on_done(job, result) or ():
                            queue.push(more)
                        continue
                    n = tries.get(id(job), 0)
                    if n < retries:
                        tries[id(job)] = n + 1
                        queue.push(job)
                    else:
                        on_fail(job, f"{why} (tried {n + 1} times)")
        except BaseException:  # Ctrl-C (or a writer that failed): cancel what is still out, keep what is written
            self._cancel(out)
            raise
        return True

    def _cancel(self, out: dict, grace: float = 5.0) -> None:
        """Cancel the jobs still out and drop their results; an actor whose job has not stopped within
        ``grace`` seconds (one long document) is killed instead, so nothing of this run goes on running."""
        if not out:
            return
        import ray

        refs = list(out)
        for ref in refs:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
        with contextlib.suppress(Exception):
            _, refs = ray.wait(refs, num_returns=len(refs), timeout=grace)
        stuck = {id(out[r][1]): out[r][1] for r in refs}
        for actor in stuck.values():
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self._pool = [a for a in self._pool if id(a) not in stuck]
        out.clear()


def _why(err: BaseException) -> str:
    """A failed job's cause in one line: the exception the job raised, not Ray's wrapper and traceback."""
    cause = getattr(err, "cause", None)
    if cause is not None:
        return f"{type(cause).__name__}: {' '.join(str(cause).split())[:200]}"
    return " ".join(str(err).split())[:200]


# -- the scheduler on a clock --------------------------------------------------------------


@dataclass
class Simulation:
    """What :func:`simulate` found: the time to the last job on ``workers`` workers, and the work done."""

    workers: int
    makespan: float
    work: float
    jobs: int
    longest: float

    @property
    def busy(self) -> float:
        """Share of worker time spent on jobs (1.0: no worker ever waited)."""
        return self.work / max(1e-12, self.workers * self.makespan)


def simulate(
    jobs: Iterable[Job],
    workers: int,
    seconds: Callable[[Job], float],
    follow: Callable[[Job], Iterable[Job]] | None = None,
    overhead: float = 0.0,
    heavy_first: bool = True,
) -> Simulation:
    """The :class:`RayEngine` schedule, run on a clock: ``workers`` workers, each job taking ``seconds(job)``
    plus ``overhead``; a worker that frees takes the ready job of highest priority (:class:`Queue`), and the
    jobs ``follow(job)`` returns become ready when ``job`` ends (a calibration's cells). A simulation, not a
    measurement: no contention, no failures, no start-up. ``heavy_first=False``: in the order given."""
    queue = Queue(jobs, heavy_first)
    running: list[tuple[float, int, Job]] = []
    seq = itertools.count()
    t = work = longest = 0.0
    free, count = max(1, int(workers)), 0
    while queue or running:
        while free and queue:
            job = queue.pop()
            s = float(seconds(job)) + overhead
            work += s
            longest = max(longest, s)
            count += 1
            heapq.heappush(running, (t + s, next(seq), job))
            free -= 1
        t, _, job = heapq.heappop(running)
        free += 1
        for more in (follow(job) if follow else None) or ():
            queue.push(more)
    return Simulation(max(1, int(workers)), t, work, count, longest)
