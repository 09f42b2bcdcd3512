"""Calibrate, Theory and Sweep say how long long work takes before it starts, and explain odd Prop. 1 values.

AppTest with a tiny T5 (L_tr = 256) of this module's own, so core.runs.timing's process-wide
record holds nothing for it until these tests run passes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import app_model_of, app_ok  # noqa: E402
from core.runs import timing  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
TIMEOUT = 120


# no timing.clear() between tests: ui's stores outlive a test too, and a cached pass is not timed again
app_model = app_model_of("est-t5")


@pytest.fixture
def model_dir(app_model):
    return app_model


_ok = app_ok


def _loaded(model_dir):
    from ui import cache

    return cache.model(str(model_dir))


def _texts(at: AppTest) -> str:
    return " ".join([i.value for i in at.info] + [c.value for c in at.caption])


def test_calibrate_says_passes_then_time(env):
    at = AppTest.from_file(str(ROOT / "app_pages/calibrate.py"), default_timeout=TIMEOUT).run()
    _ok(at)
    info = " ".join(i.value for i in at.info)
    assert "Algorithm 1 will run 11 encoder passes at" in info
    if not timing.measured(timing.model_key(_loaded(env))):  # a background pass may have been timed already
        assert "no time estimate" in info  # nothing timed on this model yet: the count only
    at.button(key="cal_run").click().run()
    _ok(at)
    # every-method table: Prop. 1's caveat is said right there
    assert any("Gaussian model" in c.value and "not clipped" in c.value for c in at.caption)
    # the picks' deltas: no arrow where the match is exact at the shown precision, an arrow otherwise
    from streamlit.proto.Metric_pb2 import Metric

    picks = [m for m in at.metric if m.label.startswith("Algorithm 1")]
    assert len(picks) == 2
    for m in picks:
        gap = float(m.proto.delta.split()[0])
        assert (m.proto.direction == Metric.MetricDirection.NONE) == (gap == 0), (m.proto.delta, m.proto.direction)
    # the passes above were timed: a new setting's note now says how long
    at.number_input(key="cal_samples").set_value(2).run()  # (bisection alone needs no pass: the grid is stored)
    info = " ".join(i.value for i in at.info)
    assert "Algorithm 1 will run 22 encoder passes at" in info
    assert "on this machine" in info and "per pass here" in info, info


def test_theory_and_sweep_say_time_before_start(env):
    at = AppTest.from_file(str(ROOT / "app_pages/theory.py"), default_timeout=TIMEOUT).run()  # runs L_tr: timed
    _ok(at)
    at.multiselect(key="th_multiples").set_value([1, 2]).run()
    text = _texts(at)
    assert "Measuring will run" in text and "on this machine" in text
    at.button(key="th_measure").click().run()
    _ok(at)
    text = _texts(at)
    assert "Adding the Algorithm 1 dots will run" in text
    assert "Prop. 1 and 2 rest on a Gaussian model" in text
    sw = AppTest.from_file(str(ROOT / "app_pages/sweep.py"), default_timeout=TIMEOUT).run()  # same process: same record
    _ok(sw)
    text = _texts(sw)
    assert "The sweep will run" in text and "on this machine" in text, text
