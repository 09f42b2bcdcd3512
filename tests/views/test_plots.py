"""core.views.plots: pure figure builders; check the numbers and marks they carry, not the look."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from core.views import plots


def _shapes(fig: go.Figure, kind: str | None = None) -> list:
    return [s for s in fig.layout.shapes if kind is None or s.type == kind]


def test_pool_max_keeps_peaks_and_bounds_points():
    v = np.zeros(10_000)
    v[7_777] = 5.0
    x, y = plots.pool_max(v, 500)
    assert len(x) == len(y) == 500
    assert y.max() == 5.0 and x[np.argmax(y)] <= 7_777 < x[np.argmax(y)] + 20
    x2, y2 = plots.pool_max(np.arange(5.0), 500)  # short: untouched
    assert list(y2) == [0, 1, 2, 3, 4] and list(x2) == [0, 1, 2, 3, 4]


def test_heatmap_float32_log_and_needle_lines():
    z = np.full((4, 4), 0.25)
    z[3, 1] = 1.0
    fig = plots.heatmap(z, np.array([0, 10, 20, 30, 40]), needle=(10, 20), question=(30, 40), log=True)
    hm = fig.data[0]
    assert isinstance(hm, go.Heatmap)
    zz = np.asarray(hm.z)
    assert zz.dtype == np.float32
    assert zz[3, 1] == pytest.approx(0.0) and zz[0, 0] == pytest.approx(np.log10(0.25), rel=1e-6)
    # uniform cells at the bins' starts, painted as one image (see plots.heatmap)
    assert (hm.x0, hm.dx, hm.y0, hm.dy, hm.zsmooth) == (0, 10, 0, 10, "fast")
    lines = _shapes(fig, "line")
    assert len(lines) == 8  # two spans x (start, end) x (row, column)
    assert {s.x0 for s in lines if s.xref == "x"} >= {10, 20, 30, 40}
    assert fig.layout.yaxis.autorange == "reversed"


def test_heatmap_rejects_unpooled():
    with pytest.raises(ValueError, match="pool"):
        plots.heatmap(np.zeros((600, 600)))
    with pytest.raises(ValueError):
        plots.heatmap(np.zeros(5))


def test_layer_meters_colours_by_distance():
    ref = [0.5, 0.5, 0.5]
    fig = plots.layer_meters([0.52, 0.6, 0.2], ref, "Pmax", baseline=[0.1, 0.1, 0.1])
    bar, refs, base = fig.data
    assert list(bar.marker.color) == [plots.COLORS["near"], plots.COLORS["mid"], plots.COLORS["far"]]
    assert list(refs.y) == ref and list(base.y) == [0.1, 0.1, 0.1]
    assert np.allclose(bar.customdata, [4.0, 20.0, -60.0])
    with pytest.raises(ValueError):
        plots.layer_meters([1, 2], [1, 2, 3])


def test_deviation_handles_zero_reference():
    assert list(plots.deviation([1.0, 2.0], [0.0, 1.0])) == [0.0, 1.0]


def test_question_profile_pools_and_shades_needle():
    prof = np.random.default_rng(0).random((3, 5000))
    fig = plots.question_profile(prof, needle=(100, 140), question=(4900, 5000), layers=[0, 2], max_points=1000)
    assert [t.name for t in fig.data] == ["layer 0", "layer 2"]
    assert all(len(t.x) == 1000 for t in fig.data)
    assert np.asarray(fig.data[1].y).max() == pytest.approx(prof[2].max())
    rects = _shapes(fig, "rect")
    assert (rects[0].x0, rects[0].x1) == (100, 140)
    with pytest.raises(ValueError):
        plots.question_profile(np.zeros(10))


def test_rpe_curves_mark_train_length():
    curves = np.vstack([np.linspace(0, 1, 300), np.linspace(1, 0, 300)])
    fig = plots.rpe_curves(curves, heads=[1], query=100, train_length=256, max_distance=128)
    assert len(fig.data) == 1 and fig.data[0].name == "head 1"
    assert list(fig.data[0].y) == list(curves[1])
    xs = sorted(s.x0 for s in _shapes(fig, "line"))
    assert xs == [-28, 100, 228, 256]


def test_token_shading_html_escapes_zooms_and_shades():
    text = "a<b> needle z"
    offsets = np.array([[0, 1], [1, 4], [5, 11], [12, 13], [0, 0]])
    w = np.array([0.0, 0.1, 1.0, 0.5, 0.0])
    out = plots.token_shading_html(text, offsets, w, center=(2, 3), window=1, highlight=(2, 3))
    assert "&lt;b&gt;" in out and "<b>" not in out
    assert "rgba(255, 80, 0, 1.000)" in out and "underline" in out
    assert "a</span>" not in out  # token 0 is outside the window
    assert out.count("<span") == 3


def test_calibration_curves_two_panels_with_gaps():
    grid = [1.0, 0.9, 0.8]
    fig = plots.calibration_curves(
        {
            "pmax": {"grid": grid, "curve": [0.2, None, 0.4], "reference": 0.35, "tau": 0.8},
            "entropy": {"grid": grid, "curve": [3.0, 2.5, 2.0], "reference": 2.6, "tau": 0.9},
        }
    )
    assert len(fig.data) == 2
    assert list(fig.data[0].x) == [1.0, 0.8]  # the unevaluated point is skipped
    hlines = [s for s in _shapes(fig, "line") if s.y0 == s.y1 and s.xref.endswith("domain")]
    assert sorted(s.y0 for s in hlines) == [0.35, 2.6]
    with pytest.raises(ValueError):
        plots.calibration_curves({})


def test_qq_plot_gaussian_lies_on_line():
    v = np.sort(np.random.default_rng(1).normal(2.0, 3.0, 4000))[::-1]
    fig = plots.qq_plot({"L": v}, max_points=200)
    pts, line = fig.data
    assert len(pts.x) <= 200
    slope = np.polyfit(pts.x, pts.y, 1)[0]
    assert slope == pytest.approx(3.0, rel=0.05)
    assert line.y[0] == pytest.approx(v.mean() + v.std() * line.x[0])
    # every point drawn (n <= max_points): the x are the normal quantiles at (i + 0.5) / n, ascending, symmetric
    z = np.asarray(plots.qq_plot({"L": np.arange(101.0)}, max_points=200).data[0].x)
    assert len(z) == 101 and z[50] == pytest.approx(0.0, abs=1e-12)
    assert z[0] == pytest.approx(-z[-1]) and np.all(np.diff(z) > 0)
    assert z[-1] == pytest.approx(2.5793, abs=1e-4)  # Phi^-1(100.5 / 101) = Phi^-1(0.99505)


def test_lmax_and_temperature_curves():
    df = pd.DataFrame({"tokens": [1024, 256, 512], "l_max": [3.0, 1.0, 2.0], "sigma": [1.0, 1.0, 1.0]})
    fig = plots.lmax_vs_length(df, 256)
    assert list(fig.data[0].x) == [256, 512, 1024] and list(fig.data[0].y) == [1.0, 2.0, 3.0]
    (vline,) = _shapes(fig, "line")
    assert vline.x0 == 256  # log axis: shapes in data units, annotations in log10 units
    assert fig.layout.annotations[-1].x == pytest.approx(np.log10(256))
    with pytest.raises(ValueError):
        plots.lmax_vs_length(pd.DataFrame({"tokens": [1]}))
    fig = plots.temperature_curves({"a": ([256, 512], [1.0, None])}, {"Alg": ([512], [0.8])}, 256)
    assert np.isnan(fig.data[0].y[1]) and fig.data[1].marker.symbol == "diamond"
    assert _shapes(fig, "line")[0].x0 == 256 and fig.layout.annotations[-1].x == pytest.approx(np.log10(256))
    with pytest.raises(ValueError):
        plots.temperature_curves({"a": ([1, 2], [1.0])})


def test_cosine_hist_normalises():
    fig = plots.cosine_hist(np.array([1.0, 3.0]), np.array([-1.0, 0.0, 1.0]))
    assert list(fig.data[0].y) == [0.25, 0.75] and list(fig.data[0].x) == [-0.5, 0.5]
    with pytest.raises(ValueError):
        plots.cosine_hist(np.ones(3), np.ones(3))


def test_accuracy_heatmap_from_table():
    from core.experiments.sweep import accuracy_table

    df = pd.DataFrame(
        {
            "method": ["none", "none", "pmax", "pmax"],
            "tokens": [256, 512, 256, 512],
            "correct": [True, False, True, True],
        }
    )
    table = accuracy_table(df, "method", "tokens")
    fig = plots.accuracy_heatmap(table)
    hm = fig.data[0]
    assert np.asarray(hm.z).tolist() == [[100.0, 0.0], [100.0, 100.0]]
    assert list(hm.y) == ["none", "pmax"] and list(hm.x) == ["256", "512"]
    assert hm.text[0][1] == "0"
    with pytest.raises(ValueError):
        plots.accuracy_heatmap(pd.DataFrame())


# -- labels that never sit on each other (issue 24) ------------------------------------------


def test_calibration_curves_labels_apart():
    grid = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]
    fig = plots.calibration_curves(
        {
            "pmax": {"grid": grid, "curve": [0.2, 0.25, 0.3, 0.33, 0.36, 0.38], "reference": 0.39, "tau": 0.5},
            "entropy": {"grid": grid, "curve": [4.8, 4.5, 4.2, 3.9, 3.5, 3.2], "reference": 2.6, "tau": 0.5},
        }
    )
    texts = [a.text for a in fig.layout.annotations]
    # the pick is named in each panel's title, not beside the dotted line where S_tr(1)'s label can be
    assert texts[:2] == ["pmax: Algorithm 1 picks tau = 0.50", "entropy: Algorithm 1 picks tau = 0.50"]
    refs = [a for a in fig.layout.annotations if a.text == "S_tr(1)"]
    assert len(refs) == 2
    for a in refs:  # just right of the panel, at the line's height: outside the data, away from the pick
        assert a.x == 1 and a.xref.endswith("domain") and a.xanchor == "left"
    assert sorted(a.y for a in refs) == [0.39, 2.6]
    assert not any(t.startswith("tau =") for t in texts)


def _overlaps(notes, width_px=700.0):
    """Pairs of labels on the same row whose estimated extents touch (what _stacked_labels must avoid)."""
    xs = [n["x"] for n in notes]
    lo, hi = min(xs + [0]), max(xs)
    out = []
    for i, a in enumerate(notes):
        for b in notes[i + 1 :]:
            if a["yshift"] != b["yshift"]:
                continue
            half = lambda n: (len(n["text"]) * 6.5 + 8) / 2 / width_px * (hi - lo)  # noqa: E731
            if abs(a["x"] - b["x"]) < half(a) + half(b):
                out.append((a["text"], b["text"]))
    return out


def test_rpe_labels_stack_when_close():
    curves = np.zeros((2, 256))
    # query just before L_tr (a 1x document): the two labels would be drawn on each other
    fig = plots.rpe_curves(curves, query=243, train_length=256, max_distance=128)
    notes = [a.to_plotly_json() for a in fig.layout.annotations]
    assert {n["text"] for n in notes} == {"L_tr", "query m", "m−128", "m+128"}
    assert not _overlaps(notes)
    assert {n["yshift"] for n in notes if n["text"] in ("L_tr", "query m")} == {0, 15}
    assert all(n["y"] == 1 and n["yanchor"] == "bottom" for n in notes)  # above the plot, not on the tick labels
    assert fig.layout.margin.t >= 6 + 16 * 2
    # far apart: one row
    fig = plots.rpe_curves(np.zeros((2, 2048)), query=2034, train_length=256, max_distance=128)
    notes = [a.to_plotly_json() for a in fig.layout.annotations]
    assert {n["yshift"] for n in notes if n["text"] == "L_tr"} == {0}
    assert not _overlaps(notes)


def test_length_axes_have_readable_ticks():
    df = pd.DataFrame({"tokens": [254, 509, 1022, 2045], "l_max": [1.0, 2.0, 3.0, 4.0], "sigma": [1.0] * 4})
    fig = plots.lmax_vs_length(df, 256)
    assert list(fig.layout.xaxis.tickvals) == [256, 512, 1024, 2048]
    assert list(fig.layout.xaxis.ticktext) == ["256", "512", "1,024", "2,048"]
    fig = plots.temperature_curves({"a": ([256, 4096], [1.0, 0.7])}, None, 256)
    assert list(fig.layout.xaxis.ticktext) == ["256", "512", "1,024", "2,048", "4,096"]


def test_heatmaps_share_a_given_scale_and_question_rows_keep_their_tokens():
    a = np.full((4, 4), 0.01, dtype=np.float32)
    b = a.copy()
    b[3, 1] = 0.3
    lo, hi = 0.01, 0.5
    f1 = plots.heatmap(a, np.array([0, 10, 20, 30, 40]), zrange=(lo, hi))
    f2 = plots.heatmap(b, np.array([0, 10, 20, 30, 40]), zrange=(lo, hi))
    assert (f1.data[0].zmin, f1.data[0].zmax) == (f2.data[0].zmin, f2.data[0].zmax) == (0.0, pytest.approx(0.5))
    q = plots.heatmap(np.ones((3, 4), dtype=np.float32), np.array([0, 10, 20, 30, 40]), rows=np.array([31, 32, 33]))
    assert (q.data[0].y0, q.data[0].dy) == (31, 1)
    assert q.layout.yaxis.title.text == "question token"


def test_profile_draws_tau_one_under_the_chosen_lines():
    prof = np.random.default_rng(0).random((3, 500))
    fig = plots.question_profile(prof, layers=[0, 2], baseline=prof * 0.5)
    grey = [t for t in fig.data if t.name == "tau = 1"]
    assert len(grey) == 2 and fig.data[0].name == "tau = 1"  # drawn first: under the coloured lines
    assert np.allclose(np.asarray(grey[1].y), prof[2] * 0.5, rtol=1e-6)


def test_perplexity_over_length_draws_one_line_per_method():
    import pandas as pd

    table = pd.DataFrame({128: [30.0, 31.0], 1024: [400.0, 45.0]}, index=pd.Index(["none", "pmax"], name="method"))
    fig = plots.perplexity_over_length(table, train_length=128)
    assert [t.name for t in fig.data] == ["none", "pmax"]
    assert list(fig.data[0].y) == [30.0, 400.0] and fig.layout.yaxis.type == "log"
    with pytest.raises(ValueError):
        plots.perplexity_over_length(table.iloc[0:0])


def test_head_ratio_maps_are_value_over_reference():
    ref = np.array([[0.5, 0.2], [0.4, 0.1]])
    fig = plots.head_ratio_maps({"tau = 1": ref * 0.5, "chosen": ref}, ref)
    assert len(fig.data) == 2
    assert np.allclose(fig.data[0].z, 0.5) and np.allclose(fig.data[1].z, 1.0)
    with pytest.raises(ValueError):
        plots.head_ratio_maps({"bad": ref[:1]}, ref)
