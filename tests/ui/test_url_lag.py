"""The address bar one write behind: a choice made while a run is under way is kept.

The app writes the view into the URL at the end of each run (``ui.url.sync``) and, at the start of a run, takes a
URL it did not write only in a session's first run (a link) or on back/forward (``ui.url.apply``). A browser sends
its address bar with every rerun; when the person acts, or the scrubber polls, while a run is under way, that
address bar may not have taken the run's write yet. Seen in a real browser (tests/browser/test_class_demo_browser.py, a
busy machine): a model switch made during a length change's run came back as the old model, twice; and the method
went back to the tour's Algorithm 1 after "fixed tau" was chosen, in a full rerun with no choice of its own
(Streamlit folds a fragment's poll into a pending full rerun, with the poll's query string). Here AppTest sends
the same sequences: a run writes the URL, then the next rerun arrives with the address bar of the run before.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import app_ok, browser_requests  # noqa: E402
from support.app import url_params  # noqa: E402

APP = str(Path(__file__).resolve().parents[2] / "app.py")
TIMEOUT = 180


def test_a_choice_made_while_the_address_bar_lags_is_kept(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    app_ok(at)
    before = url_params(at)
    at.sidebar.number_input(key="doc_tokens").set_value(384).run()  # this run writes tokens=384
    assert url_params(at)["tokens"] == "384"
    # the next action reaches the server with the address bar of the run before (it had not taken the write)
    at.query_params.clear()
    at.query_params.update(before)
    at.selectbox(key="tau_method").set_value("log-length").run()
    app_ok(at)
    assert at.selectbox(key="tau_method").value == "log-length"  # the person's choice, not the echo's "fixed"
    assert at.sidebar.number_input(key="doc_tokens").value == 384  # and the length stays what it was
    assert url_params(at)["method"] == "log-length" and url_params(at)["tokens"] == "384"


def test_a_rerun_with_no_choice_of_its_own_does_not_undo_the_last_one(env):
    """A full rerun that changes nothing (a poll folded into it) with the address bar of the run before: the
    view stays as the last run left it."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    app_ok(at)
    before = url_params(at)
    at.selectbox(key="tau_method").set_value("log-length").run()
    assert url_params(at)["method"] == "log-length"
    at.query_params.clear()
    at.query_params.update(before)
    at.run()
    app_ok(at)
    assert at.selectbox(key="tau_method").value == "log-length"
    assert url_params(at)["method"] == "log-length"


def test_back_and_forward_still_reopen_an_earlier_view(env):
    """The same address bar sent by the back button (the browser marks the rerun as history navigation) is
    applied."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    before = url_params(at)
    at.sidebar.number_input(key="doc_tokens").set_value(384).run()
    at.query_params.clear()
    at.query_params.update(before)  # back: the earlier view's query string, nothing else
    with browser_requests(is_history_navigation=True):
        at.run()
    app_ok(at)
    assert at.sidebar.number_input(key="doc_tokens").value == int(before["tokens"])
    assert url_params(at)["tokens"] == before["tokens"]
