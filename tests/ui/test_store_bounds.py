"""Issue 41, point 6: every store of ui.stores is bounded in entries AND bytes.

The LRU evicts by bytes (unit tests), ``sizeof`` counts what a value holds,
and many distinct documents driven through ``ui.cache.run`` and
``ui.figure_cache.figure`` (no Streamlit server needed) keep each store under its
byte bound while the process's resident memory grows by less than the
caches' total bound plus a margin.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from dataclasses import dataclass

import numpy as np
import pytest

from conftest import clear_app_caches, memory_bounds
from core.models import default_model
from core.runs import engine
from core.runs.settings import DocumentRequest
from core.values.choice import Choice
from core.views import plots


@pytest.fixture
def stores_mod():
    from ui import stores

    clear_app_caches()
    yield stores
    clear_app_caches()


def _array(nbytes: int) -> np.ndarray:
    return np.zeros(nbytes, dtype=np.uint8)


# -- the LRU ------------------------------------------------------------------------------


def test_lru_evicts_least_recently_used_until_under_the_byte_bound(stores_mod):
    lru = stores_mod.LRU(maxsize=100, maxbytes=10_000)
    one = stores_mod.sizeof(_array(3000))
    assert 3000 <= one < 3400
    for k in "abc":
        lru.get(k, lambda: _array(3000))
    assert len(lru) == 3 and lru.nbytes == 3 * one <= 10_000
    assert lru.peek("a") is not stores_mod.MISSING  # "a" is now the most recently used: "b" goes first
    lru.get("d", lambda: _array(3000))
    assert lru.peek("b") is stores_mod.MISSING
    assert all(lru.peek(k) is not stores_mod.MISSING for k in "acd")
    assert lru.nbytes <= 10_000 and lru.evictions == 1
    # one large value evicts as many as it takes
    lru.get("big", lambda: _array(7000))
    assert lru.nbytes <= 10_000 and len(lru) == 1 and lru.peek("big") is not stores_mod.MISSING
    # the entry bound still holds on its own
    small = stores_mod.LRU(maxsize=2, maxbytes=10**9)
    for k in range(5):
        small.get(k, lambda: _array(10))
    assert len(small) == 2 and small.peek(4) is not stores_mod.MISSING


def test_a_value_larger_than_the_budget_is_returned_not_stored(stores_mod):
    lru = stores_mod.LRU(maxsize=10, maxbytes=5_000)
    lru.get("kept", lambda: _array(1000))
    huge = lru.get("huge", lambda: _array(20_000))
    assert huge.nbytes == 20_000  # the caller gets it
    assert lru.peek("huge") is stores_mod.MISSING and lru.oversize == 1
    assert lru.peek("kept") is not stores_mod.MISSING  # and nothing else was evicted for it
    assert lru.usage()["bytes"] == stores_mod.sizeof(lru.peek("kept"))


def test_replacing_a_key_does_not_count_it_twice(stores_mod):
    lru = stores_mod.LRU(maxsize=10, maxbytes=100_000)
    lru.put("k", _array(4000))
    lru.put("k", _array(8000))
    assert len(lru) == 1 and lru.nbytes == stores_mod.sizeof(_array(8000))
    lru.clear()
    assert lru.nbytes == 0 and len(lru) == 0


# -- sizeof ---------------------------------------------------------------------------------


@dataclass
class _Holder:
    a: np.ndarray
    b: np.ndarray
    meta: dict


def test_sizeof_walks_arrays_views_dataclasses_and_tensors(stores_mod):
    import torch

    sizeof = stores_mod.sizeof
    base = np.zeros((100, 1000), dtype=np.float64)  # 800 kB
    assert 800_000 <= sizeof(base) < 801_000
    assert sizeof({"x": base, "view": base[:10], "again": base}) < 802_000  # one buffer, counted once
    assert sizeof(base[:10]) >= 800_000  # a view keeps its whole base alive
    held = _Holder(np.ones(1000), np.ones(2000, np.float32), {"text": "x" * 5000, "ids": list(range(100))})
    assert 8000 + 8000 + 5000 < sizeof(held) < 8000 + 8000 + 5000 + 10_000
    t = torch.zeros(1000, 100)  # 400 kB of storage
    assert 400_000 <= sizeof(t) < 401_000
    assert sizeof([t, t[:5], t.numpy()]) < 402_000  # views and numpy views of one storage: once
    assert sizeof(None) < 100 and sizeof("abc") < 100


def test_sizeof_of_a_figure_is_near_what_it_allocates(stores_mod):
    """A 256 x 256 heatmap figure: the estimate within a factor of 2 of tracemalloc's count (arrays dominate)."""
    rng = np.random.default_rng(0)

    def build():
        z = rng.random((256, 256)).astype(np.float32)
        return plots.heatmap(z, np.arange(257) * 8, (3, 5), None, title="t", zrange=(0.0, 1.0))

    build()  # plotly's validators and caches, once
    gc.collect()
    tracemalloc.start()
    figs = [build() for _ in range(4)]
    gc.collect()
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    est = stores_mod.sizeof(figs[0])
    assert traced / 4 / 2 < est < 2 * traced / 4, (est, traced / 4)


# -- the stores together ---------------------------------------------------------------------------


def test_every_store_has_both_bounds_and_the_total_is_their_sum(stores_mod):
    b = memory_bounds()
    assert set(b["stores"]) == set(stores_mod.SIZES) == set(stores_mod.BYTES)
    for name, u in b["stores"].items():
        assert u["max_entries"] == stores_mod.SIZES[name] and u["max_bytes"] == stores_mod.BYTES[name] > 0
        assert u["bytes"] <= u["max_bytes"] and u["entries"] <= u["max_entries"]
    assert b["total_max_bytes"] == sum(stores_mod.BYTES.values()) == stores_mod.TOTAL_BYTES
    assert stores_mod.TOTAL_BYTES <= 512 * stores_mod.MB  # the bound docs/app.md states


def _rss() -> int:
    """This process's resident memory in bytes (psutil if installed, else /proc/self/statm)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(default_model() is None, reason="no bundled model in assets/models")
@pytest.mark.usefixtures("one_thread")
@pytest.mark.slow
def test_many_documents_stay_under_every_bound(stores_mod, monkeypatch):
    """40 distinct pass key documents of the default model, each run with Explore's probes and drawn as two
    figures, under byte budgets small enough that both stores must evict: every store stays under its
    bound after every step, its count is what its values hold, and resident memory grows by less than the
    budgets' total plus a margin (allocator and torch buffers)."""
    from ui import cache, figure_cache

    S = stores_mod
    MB = S.MB
    monkeypatch.setitem(S.BYTES, "run", 4 * MB)  # about 6 runs of 256-640 tokens
    monkeypatch.setitem(S.BYTES, "fig", 2 * MB)  # about 6 figures
    S.stores.clear()  # rebuilt with these budgets
    try:
        loaded = cache.model(default_model())
        probes = cache.explore_probes(loaded.n_layers - 1, None)
        settings = (Choice.of(tau=1.0, method="fixed"), engine.Pass(probes=probes))
        lengths = (256, 384, 512, 640)
        for n in lengths:  # warm: torch's buffers for each length, plotly's validators
            res = cache.run(loaded, DocumentRequest(task="passkey", tokens=n, depth=0.5, seed=10_000 + n), *settings)
            figure_cache.figure(
                plots.heatmap,
                res.probes.heatmap_mean,
                res.probes.heatmap_edges,
                res.needle_tokens,
                res.question_tokens,
                title="warm",
                zrange=(0.0, 1.0),
            )
        gc.collect()
        before = _rss()
        stores = S.stores()
        peak = {k: 0 for k in stores}
        for i in range(40):
            req = DocumentRequest(task="passkey", tokens=lengths[i % len(lengths)], depth=(i % 11) / 10, seed=i)
            res = cache.run(loaded, req, *settings)
            assert res.tokens == req.tokens
            figure_cache.figure(
                plots.heatmap,
                res.probes.heatmap_mean,
                res.probes.heatmap_edges,
                res.needle_tokens,
                res.question_tokens,
                title=f"run {i}",
                zrange=(0.0, 1.0),
            )
            figure_cache.figure(plots.question_profile, res.probes.profile, res.needle_tokens, res.question_tokens)
            for name, store in stores.items():
                u = store.usage()
                assert u["bytes"] <= u["max_bytes"], (i, name, u)
                assert u["entries"] <= u["max_entries"], (i, name, u)
                peak[name] = max(peak[name], u["bytes"])
        gc.collect()
        grown = _rss() - before
        for name in ("run", "fig"):
            store = stores[name]
            assert store.evictions > 0, f"{name}: 40 documents fit under {S.BYTES[name]} bytes?"
            # the count is what the stored values hold now, measured afresh
            assert store.nbytes == sum(S.sizeof(v) for v in list(store._d.values()))
        bounds = memory_bounds()
        assert bounds["total_bytes"] <= bounds["total_max_bytes"]
        margin = 150 * MB
        assert grown < bounds["total_max_bytes"] + margin, (grown / MB, bounds["total_max_bytes"] / MB)
        assert peak["run"] > S.BYTES["run"] / 2  # the store was really used up to its bound
    finally:
        clear_app_caches()
        S.stores.clear()
