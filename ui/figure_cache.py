"""Figures built once per content of their inputs, shared by every session (the store ``fig`` of :mod:`ui.stores`).

Why: plotly's validating figure objects cost 10-200 ms each to build, more
than the cached passes they show; see :func:`figure`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from ui.stores import stores


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
