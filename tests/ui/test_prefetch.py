"""The background tau grid (ui.prefetch) and the pass gate (ui.pass_gate.PassGate), without a browser.

The grid must land in the very stores the slider and Algorithm 1 read, so
that after it Calibrate needs no pass; and a person's pass must never wait
behind more than one background pass.
"""

from __future__ import annotations

import threading
import time

import pytest

from conftest import clear_app_caches, wait_until
from core.runs import engine, methods, temperature
from core.runs.settings import DocumentRequest
from core.values.choice import Choice


@pytest.fixture
def cache_mod():
    from ui import cache

    clear_app_caches()
    return cache


def test_grid_fills_the_stores_calibrate_reads(tiny, cache_mod):
    from ui import prefetch
    from ui.prefetch import GRID, progress
    from ui.stores import stores

    cache = cache_mod
    req = DocumentRequest(task="passkey", tokens=512, depth=0.5, seed=4)
    probes = cache.explore_probes(1, None)
    job = prefetch.grid_job(tiny, req, Choice.of(tau=1.0, method="fixed"), engine.Pass(probes=probes))
    assert progress(job) == (0, len(GRID) + 1)  # the grid and Theory's tau = 1 pass
    prefetch.prefetcher().want("test-session", job)
    wait_until(lambda: progress(job)[0] == len(GRID) + 1)
    # the slider's own key: a grid tau is a hit, an off-grid one is not
    assert cache.has_run(tiny, req, Choice.of(tau=0.65, method="fixed"), engine.Pass(probes=probes))
    assert not cache.has_run(tiny, req, Choice.of(tau=0.66, method="fixed"), engine.Pass(probes=probes))
    cache.run_reference(tiny, req)  # the page has its L_tr reference already
    runs = stores()["run"]
    misses = runs.misses
    cals = cache.calibrate_both(tiny, req, fast=False)
    forms = cache.closed_forms(tiny, req)
    assert runs.misses == misses, "Algorithm 1 or Prop. 1/2 ran a pass the background job already had"
    assert set(forms) == set(methods.FORMULAS)  # every closed form of the registry
    # Algorithm 1's grid (1.0 ... 0.5) is part of the scrubber's (1.0 ... 0.3): every pass it needs was there
    assert set(cals) == {"pmax", "entropy"} and all(c.passes == len(temperature.GRID) for c in cals.values())
    # and the numbers are Algorithm 1's own: the same as calibrating from scratch
    from core.runs import calibration

    fresh = calibration.calibrate(tiny, cache.document(tiny, req), "pmax")
    assert cals["pmax"].tau == fresh.tau
    assert cals["pmax"].curve == pytest.approx(fresh.curve, rel=1e-5)
    prefetch.prefetcher().want("test-session", None)


def test_the_grid_is_computed_nearest_the_slider_first(tiny, cache_mod):
    from ui.pass_gate import gate
    from ui.prefetch import GRID, Job, prefetcher

    s = (Choice.of(tau=1.0, method="fixed"), engine.Pass(probes=cache_mod.explore_probes(1, None)))
    req = DocumentRequest(task="passkey", tokens=300, depth=0.5, seed=2)
    taus = [float(c.tau) for c, _ in Job(tiny, req, *s, around=0.52).passes()[: len(GRID)]]
    assert taus[:4] == [1.0, 0.5, 0.55, 0.45] and sorted(taus) == sorted(GRID)  # tau = 1 (the left column) first
    assert GRID[-1] == pytest.approx(0.3) and set(temperature.GRID) <= set(GRID)
    # the same document with the slider elsewhere: the wish is reordered, not restarted
    pf = prefetcher()
    with gate().foreground():
        pf.want("s-order", Job(tiny, req, *s, around=1.0))
        pf.want("s-order", Job(tiny, req, *s, around=0.3))
        job = pf.wanted()["s-order"]
        assert job.around == 0.3
        pf.want("s-order", None)


def test_a_new_document_cancels_the_old_grid(tiny, cache_mod):
    from ui.pass_gate import gate as pass_gate
    from ui.prefetch import GRID, Job, prefetcher, progress

    cache = cache_mod
    probes = cache.explore_probes(1, None)
    s = (Choice.of(tau=1.0, method="fixed"), engine.Pass(probes=probes))
    old = Job(tiny, DocumentRequest(task="passkey", tokens=1024, depth=0.5, seed=1), *s)
    new = Job(tiny, DocumentRequest(task="passkey", tokens=300, depth=0.5, seed=2), *s)
    pf = prefetcher()
    gate = pass_gate()
    with gate.foreground():  # hold the worker back until both wishes are in
        pf.want("s1", old)
        pf.want("s1", new)  # the same session moved on: the old document is no longer wanted
    wait_until(lambda: progress(new)[0] == len(GRID))
    assert progress(old)[0] <= 1  # at most the pass that was under way
    pf.want("s1", None)


def test_foreground_goes_first():
    from ui.pass_gate import PassGate

    gate = PassGate()
    order: list[str] = []
    assert gate.background()  # a background pass is running
    waiting = threading.Event()

    def person():
        waiting.set()
        with gate.foreground():
            order.append("person")

    t = threading.Thread(target=person)
    t.start()
    waiting.wait()
    wait_until(lambda: gate.busy, 5)
    assert not gate.background(timeout=0.01)  # nothing new starts while the person waits
    assert order == []
    gate.release_background()
    t.join(5)
    assert order == ["person"]
    assert gate.background(timeout=1)  # and the background goes on afterwards
    gate.release_background()


def test_a_second_session_queues_behind_the_first_and_is_told(cache_mod):
    """Two sessions' passes never run at once (the app's memory budget), and the one waiting sees why."""
    from ui.pass_gate import gate as pass_gate
    from ui.pass_gate import queue_note

    gate = pass_gate()
    assert queue_note() == ""
    inside, release, done = threading.Event(), threading.Event(), []

    def session(name: str) -> None:
        with gate.foreground():
            done.append(f"{name} in")
            inside.set()
            release.wait(10)
            done.append(f"{name} out")

    a = threading.Thread(target=session, args=("a",))
    a.start()
    inside.wait(5)
    assert "Another session's pass goes first" in queue_note()
    inside.clear()
    b = threading.Thread(target=session, args=("b",))
    b.start()
    time.sleep(0.2)
    assert done == ["a in"]  # b waits while a runs
    release.set()
    a.join(5)
    b.join(5)
    assert done == ["a in", "a out", "b in", "b out"]
    assert queue_note() == ""
