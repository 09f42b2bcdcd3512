"""The background grid's thread (ui.prefetch) when a pass raises what nobody expected.

Before: ``Prefetcher._loop`` caught only UserError, ValueError and RuntimeError, so any other exception (a KeyError
from a model's forward, say) ended the thread without a word, and a grid that did fail was never told to the page:
the scrubber polled every POLL_MS for frames that would never come, and a page that polls never settles (a browser
test ran into its 900 s deadline). Now the thread logs it, marks that grid failed (``failure``) and goes on with the
next document.
"""

from __future__ import annotations

import pytest

from conftest import clear_app_caches, wait_until
from core.runs import engine
from core.runs.settings import DocumentRequest
from core.values.choice import Choice


@pytest.fixture
def cache_mod():
    from ui import cache

    clear_app_caches()
    return cache


def test_an_unexpected_error_fails_that_grid_and_the_thread_goes_on(tiny, cache_mod, caplog):
    from ui.prefetch import GRID, Job, prefetcher, progress

    s = (Choice.of(tau=1.0, method="fixed"), engine.Pass(probes=cache_mod.explore_probes(1, None)))
    broken = Job(tiny, DocumentRequest(task="passkey", tokens=300, depth=0.5, seed=41), *s)
    fine = Job(tiny, DocumentRequest(task="passkey", tokens=300, depth=0.5, seed=42), *s)
    pf = prefetcher()

    def boom(module, args):
        raise KeyError("a key the model lacks")

    hook = tiny.model.register_forward_pre_hook(boom)  # the model itself fails: no code of ours is replaced
    try:
        pf.want("s-broken", broken)
        wait_until(lambda: pf.failure(broken) is not None)
    finally:
        hook.remove()
    assert "a key the model lacks" in pf.failure(broken)
    assert pf._thread is not None and pf._thread.is_alive(), "the thread died with the pass"
    assert any("grid pass failed" in r.getMessage() for r in caplog.records), "the error was not logged"
    # the same thread serves the next document (no new request restarted it)
    thread = pf._thread
    pf.want("s-broken", None)
    pf.want("s-fine", fine)
    wait_until(lambda: progress(fine)[0] >= len(GRID))
    assert pf._thread is thread
    assert pf.failure(fine) is None
    pf.want("s-fine", None)
