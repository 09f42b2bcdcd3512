"""The first pass's progress bar (ui/long_work.py ``layer_progress``) moves while a layer computes and keeps to the
layers the pass has reached.

Why: CI's browser test saw 75 % and then 97 % for the rest of a 32x pass. The bar moved only from the per-layer
hook (four times in a pass of the bundled T5), and by the estimate's clock alone, so an estimate too short ran it
to its top with layers still to go.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ui.long_work import CEILING, pass_share

ROOT = Path(__file__).resolve().parents[2]


@given(
    elapsed=st.floats(0, 1e4),
    seconds=st.floats(0.01, 1e4),
    calls=st.integers(0, 50),
    layers=st.integers(1, 40),
)
def test_the_share_keeps_between_the_layers_finished_and_begun(elapsed, seconds, calls, layers):
    share = pass_share(elapsed, seconds, calls, layers)
    begun = min(calls, layers)
    finished = layers if calls > layers else max(0, begun - 1)
    assert 0.0 <= share <= CEILING
    assert finished / layers * CEILING - 1e-12 <= share <= begun / layers * CEILING + 1e-12
    # it never goes back as time passes or layers begin
    assert pass_share(elapsed * 1.5 + 1, seconds, calls, layers) >= share
    assert pass_share(elapsed, seconds, calls + 1, layers) >= share


def test_an_estimate_too_short_or_too_long_gives_way_to_the_layers():
    # 100 s into a pass estimated at 10 s, in its 2nd of 4 layers: half, not the top (what CI saw)
    assert pass_share(100.0, 10.0, 2, 4) == pytest.approx(CEILING * 0.5)
    # 1 s into a pass estimated at 100 s, in its 3rd of 4 layers: the 2 finished, not 1 %
    assert pass_share(1.0, 100.0, 3, 4) == pytest.approx(CEILING * 0.5)
    # an estimate that holds: the time's share
    assert pass_share(30.0, 100.0, 2, 4) == pytest.approx(CEILING * 0.3)
    # past the last layer (a T5 decoder's calls): the top; no estimate: the layers begun, shy of it
    assert pass_share(5.0, 100.0, 9, 4) == pytest.approx(CEILING)
    assert pass_share(5.0, None, 2, 4) == pytest.approx(0.45)


APP = """
import sys, time
sys.path.insert(0, {root!r})
import streamlit as st
from core.mechanics import attention
from ui import long_work

bar = st.progress(0.0, text="starting")
try:
    with long_work.layer_progress(bar, "pass", 1.0, 2):
        attention._BETWEEN.get()()  # the first layer begins, as an attention call announces it
        time.sleep(0.6)  # inside the layer's kernels: no hook runs
        if {fail}:
            raise RuntimeError("the pass failed")
except RuntimeError:
    st.write("failed")
st.session_state["clocks"] = [t.name for t in __import__("threading").enumerate() if t.name == "aae-progress"]
"""


def test_the_bar_moves_inside_a_layer():
    """0.6 s into the first of 2 layers of a pass estimated at 1 s: the bar says about 48 % (the clock's thread drew
    it into this run); moved from the hook alone it said 0 %. After the block no clock thread is left."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_string(APP.format(root=str(ROOT), fail=False), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    (bar,) = at.get("progress")
    assert 40 <= bar.proto.value <= 49, bar.proto
    assert bar.proto.text.startswith("pass ") and "left" in bar.proto.text, bar.proto.text
    assert at.session_state["clocks"] == []


def test_a_failed_pass_stops_the_clock():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_string(APP.format(root=str(ROOT), fail=True), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["clocks"] == []
    assert not [t for t in threading.enumerate() if t.name == "aae-progress"]
