"""Two app sessions (issue 36, cause 1): one asks for a hub model while the hub accepts and never answers, the
other opens the default model meanwhile. The second is not held up by the first's download, and the first ends
with one message in the app's words within the stated bound, no traceback.

AppTest through Streamlit's own runner, two sessions in two threads as one server runs them
(:func:`conftest.concurrent_sessions`); the hub is a loopback server of tests/models/test_loading_hostile.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from conftest import HANG_S, app_error_text, app_model_of, app_ok, concurrent_sessions
from core import models

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TIMEOUT = 120
WAIT_S = 6.0  # the hub bound for this test (models.HUB_WAIT_S is 20 s): long enough to open a model meanwhile

app_model = app_model_of("stalled-hub-t5")


@pytest.fixture
def stalled(silent_hub, monkeypatch):
    monkeypatch.setattr(models.hub, "HUB_WAIT_S", WAIT_S)
    return silent_hub


@pytest.mark.slow
def test_a_stalled_hub_holds_up_neither_its_session_past_the_bound_nor_another_session(env, stalled, monkeypatch):
    concurrent_sessions(monkeypatch)
    box: dict = {}

    def hub_session() -> None:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.query_params.update(model="someorg/stalled-t5")
        t0 = time.monotonic()
        at.run()
        box["took"], box["at"] = time.monotonic() - t0, at

    first = threading.Thread(target=hub_session, daemon=True)
    first.start()
    end = time.monotonic() + 30
    while stalled.requests < 1 and time.monotonic() < end:  # until the first session waits on the hub
        time.sleep(0.05)
    assert stalled.requests >= 1 and first.is_alive()

    other = AppTest.from_file(APP, default_timeout=TIMEOUT).run()  # the default model (a local folder)
    app_ok(other)
    assert first.is_alive(), "the other session finished only after the stalled one"

    first.join(WAIT_S + HANG_S)
    assert not first.is_alive(), "the stalled session outlived its bound"
    at = box["at"]
    assert not at.exception
    text = app_error_text(at)
    assert "someorg/stalled-t5" in text and f"{WAIT_S:g} s" in text
    assert "Traceback" not in text and str(stalled.port) not in text and "--" not in text  # the app's own words
    assert box["took"] >= WAIT_S - 0.5, box["took"]  # it waited its bound, then gave up (past it: bench/bounds.py)
