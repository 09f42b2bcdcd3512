"""Before a long document's first passes the app says about how long they take: far past every pass the model has
made, it measures the law first (two short passes and one attention call) instead of squaring a 256-token pass's
time, which said "about 2 min" for a 68 s pass at 32x (issue 59 point 8)."""

from __future__ import annotations

import pytest

from core.runs import engine, timing
from core.runs.settings import DocumentRequest
from core.values.choice import TRAINED


@pytest.mark.slow
def test_a_far_longer_document_measures_its_law_first(tiny):
    from ui import cache

    key = timing.model_key(tiny)
    timing.clear(key)
    short = DocumentRequest(task="passkey", tokens=256, depth=0.5, seed=0)
    cache.run(tiny, short, TRAINED)  # what the app has made: one pass at L_tr
    assert timing.law(key) is None
    req = DocumentRequest(task="passkey", tokens=4096, depth=0.5, seed=0)
    said = cache.pass_estimate(tiny, req)
    assert timing.law(key) is not None, "the law was measured before the estimate"
    doc = cache.document(tiny, req)
    took = engine.run(tiny, doc, TRAINED, engine.Pass(generate=False)).seconds["encode"]  # the pass (tokens cached)
    assert said is not None and 0.4 < said / took < 2.5, (said, took)  # a bound for a loaded 2-core machine
    # near what was made, no new measurement: the passes' own times serve
    timing.clear(key)
    cache.run(tiny, short, TRAINED)
    cache.pass_estimate(tiny, DocumentRequest(task="passkey", tokens=512, depth=0.5, seed=0))
    assert timing.law(key) is None
    timing.clear(key)  # a short first document (the landing) never pays for a measurement
    cache.pass_estimate(tiny, DocumentRequest(task="passkey", tokens=1024, depth=0.5, seed=0))
    assert timing.law(key) is None
