"""The app's bounded stores: one thread-safe LRU per kind of value, shared by every session of the process.

Why a store of our own and not ``st.cache_data``: long calibrations report
progress through callbacks that update an ``st.progress`` bar created outside
the cached function, which ``st.cache_data`` would try to record and replay;
and a :class:`core.runs.engine.Result` would be unpickled again on every rerun.
Here returning to an earlier tau is a dictionary lookup, no pickling. Values
are shared between sessions: treat them as read-only.

Every store is bounded in entries (:data:`SIZES`) and bytes (:data:`BYTES`,
each value measured once by :func:`sizeof` when it is stored), least
recently used out first; together they hold at most :data:`TOTAL_BYTES`
(476 MB) whatever the sessions do. Each store's ``usage()`` reports its bounds
and what it holds. What goes in them, under which keys, is :mod:`ui.cache`'s
business (and :mod:`ui.figure_cache`'s for figures); this module knows
nothing of models or documents, so everything else may import it.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import streamlit as st

#: What :meth:`LRU.peek` returns for a key it does not hold (None is a value a store may hold).
MISSING = object()

#: Bytes counted for an object's header where only its payload is measured (numpy / torch array headers).
_HEADER = 112


def sizeof(obj: Any) -> int:
    """Bytes a cached value holds, estimated by walking it once (shared parts counted once).

    numpy arrays count their buffer (a view counts the array it keeps
    alive), torch tensors their storage, strings / numbers ``sys.getsizeof``;
    dicts, lists, tuples and sets add their items; dataclasses
    (:class:`core.runs.engine.Result`, :class:`core.mechanics.probes.ProbeRecord`,
    :class:`core.runs.engine.Encoded`, documents, calibrations, LayerStats) add
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
#: question profile +18 %, meters -22 %; tests/ui/test_store_bounds.py keeps the heatmap within a factor of 2).
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
            return {
                "max_entries": self.maxsize,
                "max_bytes": self.maxbytes,
                "entries": len(self._d),
                "bytes": self.nbytes,
                "evictions": self.evictions,
                "oversize": self.oversize,
            }

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
BYTES = {
    "doc": 16 * MB,
    "enc": 16 * MB,
    "run": 320 * MB,
    "tau": 4 * MB,
    "cal": 8 * MB,
    "stats": 8 * MB,
    "rpe": 32 * MB,
    "grid": 8 * MB,
    "fig": 64 * MB,
}
#: Every store together: the most the app's caches hold in one server process (the models aside).
TOTAL_BYTES = sum(BYTES.values())


@st.cache_resource(show_spinner=False)
def stores() -> dict[str, LRU]:
    """One LRU per kind of value, shared by all sessions of this process (bounds: :data:`SIZES`, :data:`BYTES`)."""
    return {k: LRU(v, BYTES[k]) for k, v in SIZES.items()}


def clear() -> None:
    """Empty every store (models stay loaded; the prefetcher's ``forget`` drops the background wishes)."""
    for s in stores().values():
        s.clear()
