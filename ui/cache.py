"""The app's cached backend: models, documents, encodings, runs and calibrations.

Two layers:

* the model: ``st.cache_resource`` around :func:`core.models.load` (one copy
  per process, shared by every session; :mod:`core.models` caches too);
* everything computed from it: a small thread-safe LRU per kind, itself held
  in one ``st.cache_resource`` so all sessions share it. Keys are explicit
  tuples of the settings that change a result (model, document request, tau
  schedule, targets, CosScale, probe spec), so moving tau re-runs only the
  forward pass (the document and its tokenisation are cached separately), and
  returning to an earlier tau is a dictionary lookup, no pickling. Values are
  shared between sessions: treat them as read-only.

Every store is bounded in entries (:data:`SIZES`) and bytes (:data:`BYTES`,
each value measured once by :func:`sizeof` when it is stored), least
recently used out first; together they hold at most :data:`TOTAL_BYTES`
(476 MB) whatever the sessions do. :func:`memory_bounds` reports the bounds
and the usage. Models are the one other cache: ``st.cache_resource``, 4 at most.

Why not ``st.cache_data`` for results: long calibrations report progress
through callbacks that update an ``st.progress`` bar created outside the
cached function, which ``st.cache_data`` would try to record and replay; and
a :class:`core.engine.Result` would be unpickled again on every rerun. The
functions here work without a Streamlit runtime too (``bench/app_latency.py``
calls them directly).

User-fixable errors (:class:`core.errors.UserError`) are never cached: they
propagate to the page, which shows them with ``st.error``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import sys
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Callable, Hashable, Iterator

import numpy as np
import streamlit as st

from core import calibration, engine, methods, rpe, tasks, temperature
from core.errors import UserError
from core.models import Loaded, load
from core.probes import ProbeSpec
from core.settings import DocumentRequest

MISSING = object()
Progress = Callable[[float], None] | None


#: Bytes counted for an object's header where only its payload is measured (numpy / torch array headers).
_HEADER = 112


def sizeof(obj: Any) -> int:
    """Bytes a cached value holds, estimated by walking it once (shared parts counted once).

    numpy arrays count their buffer (a view counts the array it keeps
    alive), torch tensors their storage, strings / numbers ``sys.getsizeof``;
    dicts, lists, tuples and sets add their items; dataclasses
    (:class:`core.engine.Result`, :class:`core.probes.ProbeRecord`,
    :class:`core.engine.Encoded`, documents, calibrations, LayerStats) add
    their fields; a plotly figure adds its objects' dicts (the raw trace
    and layout dicts holding the arrays plotly keeps, the trace and layout
    objects, the copies of defaults), not the shared validators; a pandas frame
    its deep ``memory_usage``. Other objects count ``sys.getsizeof`` and,
    when they are this project's (``core.*`` / ``ui.*``), their ``__dict__``:
    a walk never wanders into a model or a module.
    """
    seen: set[int] = set()
    storages: set[tuple[str, int]] = set()
    stack = [obj]
    total = 0
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if o is None or isinstance(o, (bool, int, float, complex, str, bytes, bytearray)):
            total += sys.getsizeof(o)
        elif isinstance(o, np.ndarray):
            root = o
            while isinstance(root.base, np.ndarray):
                root = root.base
            if _is_tensor(root.base):  # ``tensor.numpy()``: the tensor's storage is what stays alive
                stack.append(root.base)
                total += _HEADER
                continue
            if root is not o:
                if id(root) in seen:
                    total += _HEADER
                    continue
                seen.add(id(root))
            total += _HEADER + max(int(root.nbytes), int(o.nbytes))
        elif isinstance(o, np.generic):
            total += sys.getsizeof(o)
        elif isinstance(o, dict):
            total += sys.getsizeof(o)
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            total += sys.getsizeof(o)
            stack.extend(o)
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            total += sys.getsizeof(o)
            stack.extend(getattr(o, f.name, None) for f in dataclasses.fields(o))
        else:
            module = type(o).__module__ or ""
            if _is_tensor(o):
                storage = o.untyped_storage()
                if ("storage", storage.data_ptr()) not in storages:  # views of one tensor share its storage
                    storages.add(("storage", storage.data_ptr()))
                    total += _HEADER + int(storage.nbytes())
            elif module.startswith("plotly") and hasattr(o, "__dict__"):
                # A figure and its trace / layout objects: their dicts (the arrays plotly keeps, the copies it
                # makes of defaults, child objects), not the validators (shared) nor the way back to the parent.
                total += sys.getsizeof(o) + _PLOTLY_OBJECT_BYTES
                stack.extend(v for k, v in vars(o).items() if "validator" not in k and k != "_parent")
            elif module.startswith("pandas") and hasattr(o, "memory_usage"):
                usage = o.memory_usage(deep=True)
                total += int(usage.sum() if hasattr(usage, "sum") else usage)
            else:
                total += sys.getsizeof(o)
                if module.startswith(("core.", "ui.")) and hasattr(o, "__dict__"):
                    stack.append(vars(o))
    return total


def _is_tensor(o: Any) -> bool:
    """A torch tensor (checked without importing torch)."""
    return (type(o).__module__ or "").startswith("torch") and hasattr(o, "untyped_storage")


#: What a plotly object costs beside the dicts it holds (its instance and attribute slots). With it,
#: :func:`sizeof` of Explore's figures comes within 25 % of what tracemalloc counts for them (heatmap +5 %,
#: question profile +18 %, meters -22 %; tests/test_cache_bound.py keeps the heatmap within a factor of 2).
_PLOTLY_OBJECT_BYTES = 512


class LRU:
    """A least-recently-used map with a lock, bounded by entries AND bytes (values computed outside the lock).

    ``maxbytes`` bounds the sum of :func:`sizeof` over the stored values
    (each value is measured once, when it is stored). Storing evicts the
    least recently used entries until both bounds hold; a value larger than
    the whole byte budget is returned to its caller but not stored
    (``oversize`` counts them), so one huge run cannot empty a store.
    """

    def __init__(self, maxsize: int, maxbytes: int | None = None, sizer: Callable[[Any], int] = sizeof):
        self.maxsize = maxsize
        self.maxbytes = maxbytes
        self._sizer = sizer
        self._d: OrderedDict = OrderedDict()
        self._bytes: dict[Hashable, int] = {}
        self._lock = threading.Lock()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.oversize = 0

    def peek(self, key: Hashable) -> Any:
        with self._lock:
            if key in self._d:
                self._d.move_to_end(key)
                return self._d[key]
        return MISSING

    def put(self, key: Hashable, value: Any) -> bool:
        """Store ``value`` (evicting as needed); False when it is larger than the whole byte budget."""
        size = self._sizer(value) if self.maxbytes is not None else 0
        with self._lock:
            if self.maxbytes is not None and size > self.maxbytes:
                self.oversize += 1
                return False
            if key in self._d:
                self.nbytes -= self._bytes.pop(key, 0)
                del self._d[key]
            self._d[key] = value
            self._bytes[key] = size
            self.nbytes += size
            while len(self._d) > self.maxsize or (self.maxbytes is not None and self.nbytes > self.maxbytes):
                old, _ = self._d.popitem(last=False)
                self.nbytes -= self._bytes.pop(old, 0)
                self.evictions += 1
        return True

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        v = self.peek(key)
        if v is not MISSING:
            self.hits += 1
            return v
        self.misses += 1
        v = compute()
        self.put(key, v)
        return v

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._bytes.clear()
            self.nbytes = 0

    def usage(self) -> dict[str, int | None]:
        """Bounds and what is stored now: entries, bytes (as :func:`sizeof` counts them)."""
        with self._lock:
            return {"max_entries": self.maxsize, "max_bytes": self.maxbytes, "entries": len(self._d),
                    "bytes": self.nbytes, "evictions": self.evictions, "oversize": self.oversize}

    def __len__(self) -> int:
        return len(self._d)


MB = 1024 * 1024
#: Entries per store.
SIZES = {"doc": 64, "enc": 24, "run": 96, "tau": 128, "cal": 48, "stats": 96, "rpe": 32, "grid": 4096, "fig": 48}
#: Bytes per store (:func:`sizeof`), measured on this project's 2-core CPU machine (docs/app.md, "Memory"):
#: a run of the default model with Explore's probes holds 0.59 MB at 256 tokens, 0.72 MB at 2,048 and
#: 0.87 MB at 4,096 (two 256 x 256 heatmaps, the question profile per layer, the cross-attention, token
#: offsets); a document's scrubber grid (15 taus) with tau = 1, the L_tr reference and Theory's pass is
#: about 18 runs, 14 MB at 4,096 tokens, so for the default the 96 entries bind first (84 MB at most).
#: The byte bound is for larger models: a 12-layer x 12-head hub T5 at 16k tokens holds about 4 MB a run,
#: and 320 MB keep four of its documents' grids. Figures: a 256 x 256 heatmap 0.33 MB. Bias curves are
#: [heads, length] float32 (0.13 MB for 8 heads at 4,096; 2 MB for 32 heads at 16k).
BYTES = {"doc": 16 * MB, "enc": 16 * MB, "run": 320 * MB, "tau": 4 * MB, "cal": 8 * MB, "stats": 8 * MB,
         "rpe": 32 * MB, "grid": 8 * MB, "fig": 64 * MB}
#: Every store together: the most the app's caches hold in one server process (the models aside).
TOTAL_BYTES = sum(BYTES.values())


def memory_bounds() -> dict[str, Any]:
    """Per-store and total bounds (entries, bytes) and what each store holds now.

    ``{"stores": {name: {"max_entries", "max_bytes", "entries", "bytes", "evictions", "oversize"}},
    "total_max_bytes", "total_bytes"}``: docs and tests read the bounds from here.
    """
    per = {k: v.usage() for k, v in stores().items()}
    return {"stores": per, "total_max_bytes": sum(u["max_bytes"] or 0 for u in per.values()),
            "total_bytes": sum(u["bytes"] for u in per.values())}


class PassGate:
    """One forward pass at a time in this process, and the person waiting goes first.

    Two passes at once on a 2-core machine are each more than twice as slow
    (torch's worker threads fight over the cores) and may together need more
    memory than the free-memory check allowed for one. Foreground work (a
    page a person is waiting on) announces itself with :meth:`foreground`;
    background work (:mod:`ui.prefetch`) takes :meth:`background` only while
    nobody waits, so a slider move waits for at most the one background pass
    already under way.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: a foreground computation may nest passes
        self._cond = threading.Condition()
        self._waiting = 0

    @property
    def busy(self) -> bool:
        """Someone is waiting for (or running) a foreground pass."""
        return self._waiting > 0

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        """Hold the gate for a person's pass (waiting, if need be, for the one background pass under way)."""
        with self._cond:
            self._waiting += 1
        try:
            with self._lock:
                yield
        finally:
            with self._cond:
                self._waiting -= 1
                self._cond.notify_all()

    def background(self, timeout: float = 0.5) -> bool:
        """Take the gate for one background pass; False (try later) while foreground work waits."""
        with self._cond:
            if self._waiting:
                self._cond.wait(timeout)
                return False
        if not self._lock.acquire(timeout=timeout):
            return False
        if self._waiting:  # someone arrived meanwhile: let them go first
            self._lock.release()
            return False
        return True

    def release_background(self) -> None:
        self._lock.release()


@st.cache_resource(show_spinner=False)
def stores() -> dict[str, LRU]:
    """One LRU per kind of value, shared by all sessions of this process (bounds: :data:`SIZES`, :data:`BYTES`)."""
    return {k: LRU(v, BYTES[k]) for k, v in SIZES.items()}


@st.cache_resource(show_spinner=False)
def gate() -> PassGate:
    """The process's one :class:`PassGate` (shared by every session and the prefetcher)."""
    return PassGate()


def queue_note() -> str:
    """A sentence for a spinner when another session's pass holds the machine (empty otherwise).

    Passes run one at a time in the process (:class:`PassGate`): that is the
    app's memory budget, so two sessions that each passed the free-memory
    check never run out of memory together. The cost is a queue, and a
    person in it should know why their pass has not started.
    """
    return " Another session's pass goes first (one pass at a time on this machine)." if gate().busy else ""


def clear() -> None:
    """Forget every cached document, run and calibration, and every background wish (models stay loaded)."""
    prefetcher().forget()
    for s in stores().values():
        s.clear()


# -- figures ------------------------------------------------------------------------

def fingerprint(obj: Any) -> Hashable:
    """A hashable digest of a figure's inputs: arrays by their bytes, containers item by item.

    Anything else raises TypeError: a key that silently ignored an input
    would hand one person's figure to another.
    """
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        return ("nd", a.dtype.str, a.shape, hashlib.blake2b(a.view(np.uint8).reshape(-1), digest_size=16).digest())
    if obj is None or isinstance(obj, (bool, int, str, np.integer, np.bool_)):
        return obj if not isinstance(obj, np.generic) else obj.item()
    if isinstance(obj, (float, np.floating)):
        return ("f", repr(float(obj)))  # NaN-safe: repr("nan") equals itself, the float does not
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(fingerprint(x) for x in obj))
    if isinstance(obj, dict):
        return ("d", tuple((fingerprint(k), fingerprint(v)) for k, v in obj.items()))
    raise TypeError(f"cannot fingerprint a {type(obj).__name__} for the figure cache")


def figure(build: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``build(*args, **kwargs)``, once per content of its inputs, shared by every session.

    plotly's validating figure objects cost 10-200 ms each to build: Explore's
    figures took ~0.45 s of a rerun, more than the cached passes they show
    (bench/browser_latency.py, profile of a cached tau move). A move back to
    a seen tau, the unchanged tau = 1 column and a second tab reuse the same
    object. Figures are read-only once built (st.plotly_chart only calls
    ``to_dict()``), so sharing one object is safe.
    """
    key = (build.__module__, build.__qualname__, fingerprint(args), fingerprint(kwargs))
    return stores()["fig"].get(key, lambda: build(*args, **kwargs))


# -- models -------------------------------------------------------------------------

@st.cache_resource(show_spinner="Loading the model…", max_entries=4)
def model(ref: str, device: str | None = None, train_length: int | None = None) -> Loaded:
    """A loaded model by registry name, hub id or folder (raises ModelLoadError, never cached)."""
    return load(ref, device=device, train_length=train_length)


def mkey(loaded: Loaded) -> tuple:
    return (loaded.spec.source, loaded.train_length, str(loaded.device), str(loaded.dtype))


def tau_key(tau) -> Hashable:
    """A hashable, rounded form of a tau schedule (number, per layer, or per layer and head; a row schedule)."""
    if isinstance(tau, temperature.RowTau):
        return temperature.schedule_key(tau)
    a = np.asarray(tau, dtype=float)
    if a.ndim == 0:
        return round(float(a), 6)
    return tuple(map(tuple, np.round(np.atleast_2d(a), 6).tolist())) if a.ndim == 2 else tuple(np.round(a, 6).tolist())


# -- documents ----------------------------------------------------------------------

def document(loaded: Loaded, req: DocumentRequest):
    """The document a request builds (raises UserError for empty text, bad depth, too few tokens)."""
    return stores()["doc"].get((mkey(loaded), req), lambda: req.build_for(loaded))  # checked against memory before it is built


def reference_document(loaded: Loaded, req: DocumentRequest):
    """The request's counterpart at L_tr: same task, depth and seed (pasted text: a window around the needle)."""
    doc = document(loaded, req)
    return stores()["doc"].get((mkey(loaded), "ref", req), lambda: calibration.reference_document(loaded, doc))


def token_count(loaded: Loaded, req: DocumentRequest) -> int:
    doc = document(loaded, req)
    n = doc.meta.get("tokens")
    return int(n) if n is not None else len(loaded.tokenizer(doc.text).input_ids)


def encoded(loaded: Loaded, doc_key: Hashable, doc) -> engine.Encoded:
    return stores()["enc"].get((mkey(loaded), doc_key), lambda: engine.encode(loaded, doc))


# -- runs ---------------------------------------------------------------------------

def _run_key(loaded: Loaded, doc_key: Hashable, settings: engine.RunSettings) -> tuple:
    return (mkey(loaded), doc_key, tau_key(settings.tau), tuple(settings.targets), settings.cosine_scale,
            settings.probes, settings.max_new_tokens, settings.generate)


def _run_doc(loaded: Loaded, doc_key: Hashable, doc, settings: engine.RunSettings, guarded: bool = True) -> engine.Result:
    key = _run_key(loaded, doc_key, settings)
    # Refuse a too-long input first, also on a cache hit (free memory changes); the message is the engine's own.
    # Checking before tokenising matters: slow tokenizers need seconds for a long text.
    n = doc.meta.get("tokens") if doc.task in tasks.TASKS else None  # a pasted text's window keeps the full text's meta
    n = n or len(loaded.tokenizer(doc.text).input_ids)
    engine.check_length(loaded, int(n))
    res = stores()["run"].peek(key)
    if res is MISSING:
        def compute() -> engine.Result:
            return engine.run(loaded, doc, settings, encoded=encoded(loaded, doc_key, doc))

        # get() re-checks the store under the gate: the prefetcher may have just made this very pass
        with gate().foreground() if guarded else contextlib.nullcontext():
            res = stores()["run"].get(key, compute)
        _note_stats(loaded, doc_key, settings, res)
    return res if res.method == settings.method else replace(res, method=settings.method)


def has_run(loaded: Loaded, req: DocumentRequest, settings: engine.RunSettings) -> bool:
    """Whether :func:`run` would answer from the store (no pass)."""
    return stores()["run"].peek(_run_key(loaded, req, settings)) is not MISSING


def run_unguarded(loaded: Loaded, req: DocumentRequest, settings: engine.RunSettings) -> engine.Result:
    """:func:`run` for a caller that already holds the pass gate (the prefetcher)."""
    return _run_doc(loaded, req, document(loaded, req), settings, guarded=False)


def session_id() -> str:
    """This browser session's id ("" outside a Streamlit run: scripts and benchmarks)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx(suppress_warning=True)
    return ctx.session_id if ctx is not None else ""


def grid_job(loaded: Loaded, req: DocumentRequest, settings: engine.RunSettings, around: float = 1.0):
    """The background job of a document shown with these run settings: its tau grid (nearest ``around`` first),
    then Theory's tau = 1 pass."""
    from ui.prefetch import Job

    return Job(loaded, req, replace(settings, tau=1.0, method="fixed"),
               extras=(theory_settings(loaded, settings.targets, settings.cosine_scale),), around=float(around))


def want_grid(loaded: Loaded, req: DocumentRequest, settings: engine.RunSettings, around: float = 1.0) -> None:
    """Ask the prefetcher for this document's tau grid with these run settings (this session's document now),
    the grid taus nearest ``around`` (the tau on screen) first."""
    prefetcher().want(session_id(), grid_job(loaded, req, settings, around))


def grid_note(loaded: Loaded, req: DocumentRequest, settings: engine.RunSettings) -> str:
    """One sentence on the background grid: how many of its passes are ready."""
    from ui.prefetch import progress

    done, total = progress(grid_job(loaded, req, settings))
    if done >= total:
        return ("The tau grid (1.0, 0.95, …, 0.5) of this document is computed: moving onto it, Algorithm 1 and "
                "Calibrate need no new pass.")
    return (f"Computing the tau grid 1.0, 0.95, …, 0.5 in the background: {done} of {total} passes ready "
            "(then those moves, Algorithm 1 and Calibrate need no new pass).")


@st.cache_resource(show_spinner=False)
def prefetcher():
    """The process's one background grid worker (:class:`ui.prefetch.Prefetcher`)."""
    from ui.prefetch import Prefetcher

    return Prefetcher()


def grid_key(loaded: Loaded, doc_key: Hashable, tau, targets: tuple, cosine_scale: float | None) -> tuple:
    """Key of one document's statistics at one tau: what Algorithm 1 needs of a pass, whatever else it recorded."""
    return (mkey(loaded), doc_key, tau_key(tau), tuple(targets), cosine_scale)


def _note_stats(loaded: Loaded, doc_key: Hashable, settings: engine.RunSettings, res: engine.Result) -> None:
    """Keep a run's per-layer Pmax/H by (document, tau): any later Algorithm 1 on this document reads it."""
    if res.probes is not None and settings.probes.stats and res.probes.pmax.size:
        stats = temperature.LayerStats(pmax=res.probes.layer_pmax, entropy=res.probes.layer_entropy)
        stores()["grid"].get(grid_key(loaded, doc_key, settings.tau, settings.targets, settings.cosine_scale), lambda: stats)


def known_stats(loaded: Loaded, doc_key: Hashable, tau, targets: tuple, cosine_scale: float | None):
    """The stored :class:`core.temperature.LayerStats` of a document at tau, or None."""
    v = stores()["grid"].peek(grid_key(loaded, doc_key, tau, targets, cosine_scale))
    return None if v is MISSING else v


def run(loaded: Loaded, req: DocumentRequest, settings: engine.RunSettings) -> engine.Result:
    """One run of the request's document (cached by every setting that changes the result; not the method label)."""
    return _run_doc(loaded, req, document(loaded, req), settings)


def run_reference(loaded: Loaded, req: DocumentRequest, targets: tuple = ("encoder",), cosine_scale: float | None = None,
                  probes: ProbeSpec | None = None) -> engine.Result:
    """The L_tr counterpart at tau = 1, no generation: the reference the meters compare with."""
    probes = probes or ProbeSpec(heatmap=False, sorted_logits=True, cosine_hist_bins=0)
    settings = engine.RunSettings(tau=1.0, method="none", targets=targets, cosine_scale=cosine_scale, probes=probes,
                                  generate=False)
    return _run_doc(loaded, ("ref", req), reference_document(loaded, req), settings)


#: Pooled heatmap cells per side on the Explore page (<= 512): enough to see the needle, cheap to pool and to ship.
HEATMAP_SIZE = 256


#: What Explore records of the decoder while it writes the answer: where the answer looks (map and profile).
EXPLORE_NAMES = ("cross.*.map", "cross.*.profile")


def explore_probes(layer: int, head: int | None) -> ProbeSpec:
    """What the Explore page records: stats, one pooled heatmap, the question profile, and the answer's
    cross-attention over the document (:data:`EXPLORE_NAMES`).

    No sorted logits and no cosine histogram: those feed the Theory page
    only, and sorting layer 0's L x L logits costs as much as the rest of
    the probes together.
    """
    return ProbeSpec(heatmap_layer=int(layer), heatmap_head=head, heatmap_size=HEATMAP_SIZE, sorted_logits=False,
                     cosine_hist_bins=0, names=EXPLORE_NAMES)


# -- temperature --------------------------------------------------------------------

def _base(targets: tuple, cosine_scale: float | None) -> engine.RunSettings:
    return engine.RunSettings(targets=tuple(targets), cosine_scale=cosine_scale)


def resolve_tau(loaded: Loaded, req: DocumentRequest, method: str, tau: float | None = None, targets: tuple = ("encoder",),
                cosine_scale: float | None = None, samples: int = 1, progress: Progress = None,
                compute: bool = True) -> tuple[Any, dict] | None:
    """(schedule, info) for a method on this document, via :func:`core.methods.resolve`."""
    if method == "fixed":
        if tau is None:
            raise UserError("Method 'fixed' needs a tau")
        return float(tau), {}
    key = (mkey(loaded), req, method, tuple(targets), cosine_scale, samples)
    if not compute:
        v = stores()["tau"].peek(key)
        return None if v is MISSING else v
    doc = document(loaded, req)
    if method in methods.MEASURED:
        engine.check_length(loaded, token_count(loaded, req))
    if method in temperature.CRITERIA and samples <= 1:
        # Algorithm 1 by bisection on the shared grid (the passes the slider and Calibrate use too).
        def work():
            cal = calibrate_both(loaded, req, fast=True, samples=1, targets=targets, cosine_scale=cosine_scale,
                                 progress=progress)[method]
            return cal.tau, {"source": "resolved", "length": token_count(loaded, req), "train_length": loaded.train_length,
                             **cal.to_dict()}
    else:
        def work():
            with gate().foreground():
                return methods.resolve(loaded, doc, method, None, samples=samples, base=_base(targets, cosine_scale),
                                           progress=progress)
    return stores()["tau"].get(key, work)


def calibrate_both(loaded: Loaded, req: DocumentRequest, fast: bool = False, samples: int = 1, targets: tuple = ("encoder",),
                   cosine_scale: float | None = None, progress: Progress = None,
                   compute: bool = True) -> dict[str, temperature.Calibration] | None:
    """:func:`core.calibration.both_criteria` at the document's length, on the process's shared passes."""
    key = (mkey(loaded), req, fast, samples, tuple(targets), cosine_scale)
    if not compute:
        v = stores()["cal"].peek(key)
        return None if v is MISSING else v

    def work():
        doc = document(loaded, req)
        engine.check_length(loaded, token_count(loaded, req))
        base = _base(targets, cosine_scale)
        if samples <= 1:
            # One document: the passes are the ones the slider and the prefetcher
            # make of this very document (and its L_tr reference), so read and
            # fill the shared grid instead of running them again.
            reference = shared_measure(loaded, req, ("ref", req), reference_document(loaded, req), targets, cosine_scale)(1.0)
            meas = shared_measure(loaded, req, req, doc, targets, cosine_scale)
        else:
            meas, reference = calibration.measures(loaded, doc, samples, base)
        return calibration.both_criteria(meas, reference, fast=fast, progress=progress)

    def guarded():
        with gate().foreground():
            return work()

    return stores()["cal"].get(key, guarded)


def shared_measure(loaded: Loaded, req: DocumentRequest, doc_key: Hashable, doc, targets: tuple,
                   cosine_scale: float | None) -> Callable[[Any], temperature.LayerStats]:
    """``measure(tau)`` for Algorithm 1 on one document, reading the shared grid first.

    A miss runs a stats-only pass (no generation) through the gate and
    stores its statistics, so the slider, the prefetcher and Calibrate never
    compute the same document at the same tau twice in this process.
    """
    base = replace(_base(targets, cosine_scale), probes=ProbeSpec.stats_only(), generate=False)

    def fn(tau) -> temperature.LayerStats:
        hit = known_stats(loaded, doc_key, tau, targets, cosine_scale)
        if hit is not None:
            return hit
        _run_doc(loaded, doc_key, doc, replace(base, tau=tau))
        return known_stats(loaded, doc_key, tau, targets, cosine_scale)

    return fn


def logit_stats(loaded: Loaded, req: DocumentRequest, targets: tuple = ("encoder",), cosine_scale: float | None = None) -> dict:
    """sigma and l_max at this length and at L_tr, and Pmax at L_tr (inputs of Prop. 1 and 2)."""
    key = (mkey(loaded), req, "logit_stats", tuple(targets), cosine_scale)
    def work():
        # The same two passes the Theory page draws (and the prefetcher computes ahead): one per document and length.
        ex = run(loaded, req, theory_settings(loaded, targets, cosine_scale))
        tr = run_reference(loaded, req, targets, cosine_scale)
        return calibration.logit_stats_of(ex, tr, loaded.train_length)

    return stores()["stats"].get(key, work)


def theory_settings(loaded: Loaded, targets: tuple = ("encoder",), cosine_scale: float | None = None) -> engine.RunSettings:
    """The tau = 1 pass with layer 0's sorted logits (and cos(q, k) for cosine models), no generation:
    what the Theory page and Prop. 1/2 read, one key for both."""
    spec = ProbeSpec(heatmap=False, sorted_logits=True, cosine_hist_bins=60 if loaded.cosine else 0)
    return engine.RunSettings(tau=1.0, method="none", targets=tuple(targets), cosine_scale=cosine_scale, probes=spec,
                              generate=False)


def closed_forms(loaded: Loaded, req: DocumentRequest, targets: tuple = ("encoder",), cosine_scale: float | None = None) -> dict:
    """:func:`core.methods.closed_forms` for the request's document (Prop. 1/2 read :func:`logit_stats`' two passes)."""
    return methods.closed_forms(loaded.train_length, token_count(loaded, req), loaded.d_kv,
                                logit_stats(loaded, req, targets, cosine_scale))


def length_stats(loaded: Loaded, req: DocumentRequest, compute: bool = True) -> dict | None:
    """tau = 1 layer-0 logit statistics (sigma, l_max, Pmax) of the request's document, no generation."""
    key = (mkey(loaded), req, "length_stats")
    if not compute:
        v = stores()["stats"].peek(key)
        return None if v is MISSING else v

    def work():
        spec = ProbeSpec(heatmap=False, sorted_logits=True, cosine_hist_bins=0)
        return calibration.length_stats_of(run(loaded, req, engine.RunSettings(tau=1.0, method="none", probes=spec,
                                                                               generate=False)))

    return stores()["stats"].get(key, work)


# -- rpe ----------------------------------------------------------------------------

def bias_curves(loaded: Loaded, query: int, length: int) -> np.ndarray:
    """b(m, n) per head for keys 0..length-1 (raises UserError for models without a relative bias)."""
    def work():
        try:
            return rpe.bias_curves(loaded.model, query, length)
        except ValueError as err:
            raise UserError(str(err)) from None

    return stores()["rpe"].get((mkey(loaded), int(query), int(length)), work)
