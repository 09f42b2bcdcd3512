"""Issue 28 in the app: Algorithm 1's band on the Calibrate curve, the per-head view, the tour's 'reached'
statement, and the Theory chart's equal curves (pure figure tests first, then AppTest).

The app's model is the tiny random T5 of tests/app/test_pages.py (ByT5 bytes, L_tr = 256).
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import app_model_of, app_ok  # noqa: E402
from core.runs import methods
from core.values.schedule import RowTau
from core.views import plots  # noqa: E402
from support.app import nav_click  # noqa: E402 (a page change as the browser's navigation sends it)

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
TIMEOUT = 180
GRID = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]


def _rects(fig):
    return [s for s in fig.layout.shapes if s.type == "rect"]


def _panels(band=None):
    pmax = {"grid": GRID, "curve": [0.2, 0.25, 0.3, 0.33, 0.36, 0.38], "reference": 0.34, "tau": 0.7}
    entropy = {"grid": GRID, "curve": [4.8, 4.5, 4.2, 3.9, 3.5, 3.2], "reference": 4.0, "tau": 0.8}
    if band is not None:
        pmax["band"] = band
    return {"pmax": pmax, "entropy": entropy}


# -- pure figures ------------------------------------------------------------------------


def test_calibration_curves_without_band_has_no_shaded_rect():
    fig = plots.calibration_curves(_panels())
    assert _rects(fig) == []
    fig = plots.calibration_curves({**_panels(), "entropy": {**_panels()["entropy"], "band": None}})
    assert _rects(fig) == []  # an explicit None is no band either


def test_calibration_curves_band_is_a_shaded_rect_in_its_own_panel():
    fig = plots.calibration_curves(_panels(band=(0.75, 0.6)))  # low/high in either order
    (rect,) = _rects(fig)
    assert (rect.x0, rect.x1) == (0.6, 0.75)
    assert rect.xref == "x" and rect.yref == "y domain" and (rect.y0, rect.y1) == (0, 1)  # first panel, full height
    assert rect.layer == "below" and 0 < rect.opacity < 0.5  # behind the curve, the curve stays readable
    # a band in the second panel sits on the second panel's axes
    p = _panels()
    p["entropy"]["band"] = (0.7, 0.9)
    (rect,) = _rects(plots.calibration_curves(p))
    assert rect.xref == "x2" and rect.yref == "y2 domain" and (rect.x0, rect.x1) == (0.7, 0.9)
    # a band of one grid point (all resamples picked 0.7) still shows beside the pick's dotted line:
    # a quarter grid step (0.1 here) either side
    (rect,) = _rects(plots.calibration_curves(_panels(band=(0.7, 0.7))))
    assert (rect.x0, rect.x1) == (pytest.approx(0.675), pytest.approx(0.725))


def test_equal_curves_stay_visible_and_say_so():
    xs = [256, 512, 1024]
    log_length = [1.0, 8 / 9, 0.8]
    fig = plots.temperature_curves(
        {
            "log-length": (xs, log_length),
            "log-n": (xs, list(log_length)),
            "SSMax": (xs, list(log_length)),
            "YaRN": (xs, [1.0, 0.87, 0.77]),
        },
        None,
        256,
    )
    names = [d.name for d in fig.data]
    assert names == ["log-length", "log-n (= log-length)", "SSMax (= log-length)", "YaRN"]
    dashes = [d.line.dash for d in fig.data]
    assert dashes[0] is None and dashes[3] is None
    assert dashes[1] != dashes[2] and None not in dashes[1:3]  # each copy its own dash, drawn over the solid line
    assert fig.data[0].line.width > fig.data[1].line.width and fig.data[0].opacity < 1  # wide, pale: copies show on it
    assert fig.data[3].opacity in (None, 1)  # a line without copies is drawn as any other
    # curves with gaps where a formula has no answer are not 'equal' to each other
    fig = plots.temperature_curves({"a": (xs, [None, None, None]), "b": (xs, [None, None, None])})
    assert [d.name for d in fig.data] == ["a", "b"]


def test_theory_llama4_line_is_the_mean_row_tau():
    rows = RowTau(floor_scale=256)
    brute = np.mean([1 / (math.log1p((p + 1) // 256) * 0.1 + 1) for p in range(2048)])  # Llama 4's factor, inverted
    assert rows.mean(2048) == pytest.approx(brute)
    assert rows.mean(255) == 1.0  # every row before L_tr keeps tau = 1


# -- the app -----------------------------------------------------------------------------

app_model = app_model_of("app28-t5")


def _calibrate(samples: int = 1) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    nav_click(at, "app_pages/calibrate.py")
    app_ok(at)
    if samples != 1:
        at.number_input(key="cal_samples").set_value(samples).run()
    if any(b.key == "cal_run" for b in at.button):  # else an earlier test of this process has cached it
        at.button(key="cal_run").click().run()
        app_ok(at)
    assert any(m.label == "Algorithm 1 (pmax)" for m in at.metric)
    return at


def _array(v) -> np.ndarray:
    """A figure array from the browser's JSON: a plain list, or plotly's typed {"dtype", "bdata", "shape"}."""
    if isinstance(v, dict):
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"])
        shape = v.get("shape")
        return a.reshape([int(n) for n in str(shape).split(",")]) if shape else a
    return np.array(v, dtype=float)


def _captions(at: AppTest) -> str:
    return "\n".join(c.value for c in at.caption)


def _chart(at: AppTest, key: str) -> dict:
    """The plotly figure of the chart with this key, as the JSON the browser gets."""
    for c in at.get("plotly_chart"):
        if c.proto.id and key in c.proto.id:
            return json.loads(c.proto.spec)
    raise AssertionError(f"no chart with key {key}")


def test_calibrate_with_two_documents_shows_the_band(env):
    at = _calibrate(samples=2)
    text = _captions(at)
    assert "bootstrap band over the 2 documents: tau in [" in text, text
    assert "Set documents >= 2" not in text
    fig = _chart(at, "cal_curves")
    rects = [s for s in fig["layout"].get("shapes", []) if s["type"] == "rect"]
    assert len(rects) == 2  # one band per criterion panel
    for r in rects:
        assert 0.45 <= r["x0"] < r["x1"] <= 1.05  # inside the grid, give or take the quarter step of a 1-point band


def test_calibrate_with_one_document_says_how_to_get_a_band(env):
    at = _calibrate()
    assert _captions(at).count("Set documents >= 2 for a band of the pick") == 2  # under each card
    fig = _chart(at, "cal_curves")
    assert not [s for s in fig["layout"].get("shapes", []) if s["type"] == "rect"]


def test_calibrate_per_head_view_and_per_head_algorithm1(env):
    at = _calibrate()
    assert any(h.value == "Per head: Pmax here over its value at L_tr" for h in at.subheader)
    fig = _chart(at, "cal_head_pmax")
    maps = [d for d in fig["data"] if d["type"] == "heatmap"]
    assert len(maps) == 2  # tau = 1 and Algorithm 1's pick
    titles = [a["text"] for a in fig["layout"]["annotations"]]
    assert titles[0] == "tau = 1" and titles[1].startswith("Algorithm 1 (Pmax) pick, tau = ")
    for m in maps:
        z = _array(m["z"])
        assert z.shape == (2, 4) and np.isfinite(z).all() and (z > 0).all()  # 2 layers x 4 heads, ratios
    # Algorithm 1 sharpens: at its pick, the heads' Pmax ratios are not below those at tau = 1
    assert _array(maps[1]["z"]).mean() >= _array(maps[0]["z"]).mean()
    text = _captions(at)
    assert "choose 'per-head' in the sidebar's Method box" in text
    per_layer = methods.get("per-head").passes(2, 4)[0] // 2  # the registry's own count: the grid per layer
    assert (
        "Not in the table yet: " in text and f"per-head Algorithm 1 (Pmax), about {per_layer} passes per layer" in text
    )

    # compute per-head Algorithm 1 through the sidebar: its tau matrix, its unreached heads, a row in the table
    at.selectbox(key="tau_method").set_value("per-head").run()
    app_ok(at)
    text = _captions(at)
    assert "choose 'per-head' in the sidebar's Method box" not in text
    assert ("never reached their L_tr Pmax" in text) or ("Every one of the 8 heads reached" in text), text
    fig = _chart(at, "cal_head_pmax")
    assert len([d for d in fig["data"] if d["type"] == "heatmap"]) == 3
    tables = [df.value for df in at.dataframe]
    (matrix,) = [t for t in tables if list(t.columns) == ["h0", "h1", "h2", "h3"]]
    assert list(matrix.index) == ["layer 0", "layer 1"]
    assert ((matrix.to_numpy() >= 0.5 - 1e-9) & (matrix.to_numpy() <= 1.0 + 1e-9)).all()
    (every,) = [t for t in tables if "label" in t.columns]
    row = every[every["label"] == "per-head Algorithm 1 (Pmax)"]
    assert len(row) == 1 and str(row["tau"].iloc[0]).startswith("per head (2 x 4)")


def test_tour_step_4_says_whether_algorithm1_reached_the_line(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.button(key="tour_3").click().run()
    app_ok(at)
    (step,) = [i.value for i in at.info if "Step 4" in i.value]
    assert "reached the L_tr line" in step
    assert "ends short of the line" in step and "grid" not in step  # one meaning of "the grid" (issue 50)
    assert at.session_state["tau_method"] == "pmax" and at.session_state["doc_tokens"] == 8 * 256


def test_theory_chart_says_which_schemes_equal_log_length(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    nav_click(at, "app_pages/theory.py")
    app_ok(at)
    assert "every row sees all L keys, so n = L for every row" in _captions(at)
    names = [d["name"] for d in _chart(at, "taus")["data"]]
    assert "log-n (= log-length)" in names and "SSMax (= log-length)" in names
    assert "Llama 4 (mean row tau)" in names
