"""Pure functions: arrays / results / tables -> plotly figures (and one HTML view).

Nothing here imports Streamlit or touches a model; the app's pages call these
with numbers that :mod:`core` computed, so every figure can be unit-tested
and reused from a notebook. Figures keep plotly's toolbar (PNG download in
the browser); the pages offer the data behind each as CSV.

Sizes are bounded on purpose: heatmaps arrive pooled (at most 512 x 512,
float32, see :mod:`core.mechanics.probes`), and long per-position curves are max-pooled
to at most ``max_points`` points, so a 16k-token document never ships
megabytes of JSON to the browser.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

MAX_HEATMAP = 512
NEEDLE_COLOR = "rgba(214, 39, 40, 0.9)"
QUESTION_COLOR = "rgba(31, 119, 180, 0.9)"
#: Relative deviation from the L_tr reference below which a meter is "on target", and the "far off" bound.
NEAR, FAR = 0.10, 0.30
COLORS = {"near": "#2ca02c", "mid": "#ff7f0e", "far": "#d62728"}


def _layout(fig: go.Figure, title: str | None = None, height: int = 360) -> go.Figure:
    fig.update_layout(title=title, height=height, margin=dict(l=50, r=20, t=50 if title else 20, b=45))
    return fig


def _vline(x: float, color: str = "black", dash: str = "dash", width: float = 1) -> dict:
    """A vertical line across the plot as a plain shape dict (fig.add_vline re-validates every shape: slow)."""
    return dict(
        type="line", xref="x", yref="paper", x0=x, x1=x, y0=0, y1=1, line=dict(color=color, dash=dash, width=width)
    )


def _hline(y: float, color: str = "black", dash: str = "dash", width: float = 1) -> dict:
    return dict(
        type="line", xref="paper", yref="y", x0=0, x1=1, y0=y, y1=y, line=dict(color=color, dash=dash, width=width)
    )


def _vrect(x0: float, x1: float, color: str, opacity: float) -> dict:
    return dict(
        type="rect",
        xref="x",
        yref="paper",
        x0=x0,
        x1=x1,
        y0=0,
        y1=1,
        fillcolor=color,
        opacity=opacity,
        line=dict(width=0),
        layer="below",
    )


def _label(
    x: float, text: str, y: float = 1.0, color: str = "black", yanchor: str = "bottom", xanchor: str = "center"
) -> dict:
    return dict(
        x=x,
        xref="x",
        y=y,
        yref="paper",
        text=text,
        showarrow=False,
        font=dict(color=color, size=11),
        yanchor=yanchor,
        xanchor=xanchor,
    )


# -- pooling helpers --------------------------------------------------------------


def pool_max(values: np.ndarray, max_points: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Max-pool a 1-D array to at most ``max_points`` bins: returns (bin start positions, maxima).

    Peaks survive pooling (a needle one token wide still shows), which mean
    pooling would wash out.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    n = len(v)
    if n <= max_points:
        return np.arange(n), v
    edges = (np.arange(max_points + 1) * n) // max_points
    return edges[:-1], np.maximum.reduceat(v, edges[:-1])


def deviation(values: Sequence[float], reference: Sequence[float]) -> np.ndarray:
    """Relative deviation (v - ref) / |ref| per layer (0 where the reference is 0)."""
    v, r = np.asarray(values, dtype=float), np.asarray(reference, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(np.abs(r) > 0, (v - r) / np.abs(r), 0.0)
    return d


def deviation_colors(values: Sequence[float], reference: Sequence[float]) -> list[str]:
    """Green within NEAR (10 %) of the reference, orange within FAR (30 %), red beyond."""
    out = []
    for d in np.abs(deviation(values, reference)):
        out.append(COLORS["near"] if d < NEAR else COLORS["mid"] if d < FAR else COLORS["far"])
    return out


# -- Explore ------------------------------------------------------------------------


def heatmap(
    z: np.ndarray,
    edges: np.ndarray | None = None,
    needle: tuple[int, int] | None = None,
    question: tuple[int, int] | None = None,
    log: bool = False,
    title: str | None = None,
    zrange: tuple[float, float] | None = None,
    rows: np.ndarray | None = None,
    height: int = 480,
) -> go.Figure:
    """Pooled attention map: rows are query positions, columns key positions (token index of each bin's start).

    ``log`` shows log10(p) (the tail of a dispersed attention becomes visible).
    ``zrange`` = (low, high) in p fixes the colour scale, so two maps drawn
    side by side (tau = 1 and the chosen tau) compare colour for colour.
    ``rows``: the token index of each row when the rows are not the pooled
    bins (the question's own rows, one token each).
    Needle keys and queries are marked by red lines, the question rows by blue ones.
    """
    z = np.asarray(z, dtype=np.float32)
    if z.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D array, got shape {z.shape}")
    if max(z.shape) > MAX_HEATMAP:
        raise ValueError(f"heatmap is {z.shape}; pool it to at most {MAX_HEATMAP} x {MAX_HEATMAP} first")
    if edges is None:
        edges = np.arange(z.shape[1] + 1)
    pos = np.asarray(edges[:-1])
    ys = pos if rows is None else np.asarray(rows)
    lo = hi = None
    if zrange is not None:
        lo, hi = (float(np.log10(max(v, 1e-8))) for v in zrange) if log else (0.0, float(zrange[1]))
    if log:
        z = np.log10(np.maximum(z, np.float32(1e-8))).astype(np.float32)
    # Uniform cells (x0/dx, y0/dy) with zsmooth="fast": plotly.js then paints the map as one image
    # with crisp ("pixelated") cells. With explicit x/y arrays it draws every cell with its own
    # fillRect and re-encodes the canvas: 65,536 cells cost about 0.4 s of the browser's CPU per map.
    n_cols = z.shape[1]
    dx = float(edges[-1] - edges[0]) / max(n_cols, 1)
    if rows is None:
        y_axis = dict(y0=float(edges[0]), dy=dx)
    else:
        y_axis = dict(y0=float(ys[0]), dy=1.0)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x0=float(edges[0]),
            dx=dx,
            **y_axis,
            zsmooth="fast",
            colorscale="Viridis",
            zmin=lo,
            zmax=hi,
            colorbar=dict(title="log10 p" if log else "p", thickness=12),
            hovertemplate="query %{y:.0f}<br>key %{x:.0f}<br>"
            + ("log10 p" if log else "p")
            + " %{z:.3g}<extra></extra>",
        )
    )
    shapes, notes = [], []
    y_lo, y_hi = float(ys[0]), float(ys[-1]) + (1 if rows is not None else float(edges[-1] - ys[-1]))
    for span, color, name in ((needle, NEEDLE_COLOR, "needle"), (question, QUESTION_COLOR, "question")):
        if span is None:
            continue
        for v in span:
            shapes.append(_vline(v, color, "dot"))
            if y_lo <= v <= y_hi and rows is None:
                shapes.append(_hline(v, color, "dot"))
        notes.append(_label(span[0], name, y=0, color=color, yanchor="top"))
    fig.update_layout(shapes=shapes, annotations=notes)
    fig.update_yaxes(autorange="reversed", title="query token" if rows is None else "question token")
    fig.update_xaxes(title="key token")
    return _layout(fig, title, height=height)


def answer_attention(
    z: np.ndarray,
    edges: np.ndarray | None,
    needle: tuple[int, int] | None,
    tokens: Sequence[str],
    log: bool = False,
    title: str | None = None,
    zrange: tuple[float, float] | None = None,
) -> go.Figure:
    """The answer's attention over the document: one row per answer token (labelled by the token it wrote),
    key columns pooled like the encoder maps (``edges``), the needle marked by a bar above its columns.

    ``z`` is ``[answer tokens, bins]`` (:func:`core.views.tables.answer_attention`); ``log`` and ``zrange`` as in
    :func:`heatmap`, so the tau = 1 map and the chosen one share a colour scale."""
    if len(tokens) != np.shape(z)[0]:
        raise ValueError(f"{len(tokens)} token labels for {np.shape(z)[0]} rows")
    fig = heatmap(
        z,
        edges,
        None,
        None,
        log=log,
        title=title,
        zrange=zrange,
        rows=np.arange(len(tokens)),
        height=190 + 20 * len(tokens),
    )
    if needle is not None:
        # A bar above the map, not lines through it: a needle of a few tokens is one bright column
        # that lines would cover. At least 1 % of the axis wide, so it shows on a 16k-token document.
        n = float(edges[-1]) if edges is not None else float(np.shape(z)[1])
        mid, half = (needle[0] + needle[1]) / 2, max(needle[1] - needle[0], 0.01 * n) / 2
        fig.update_layout(
            shapes=[
                dict(
                    type="rect",
                    xref="x",
                    yref="paper",
                    x0=mid - half,
                    x1=mid + half,
                    y0=1.01,
                    y1=1.05,
                    fillcolor=NEEDLE_COLOR,
                    line=dict(width=0),
                )
            ],
            annotations=[_label(mid - half, "needle", y=1.05, color=NEEDLE_COLOR, xanchor="right")],
        )
    # plotly reads < and > in tick text as markup: "</s>" would vanish
    labels = [html.escape(f"{i}: {t.strip() or repr(t)}") for i, t in enumerate(tokens)]
    fig.update_yaxes(title="answer token", tickmode="array", tickvals=list(range(len(tokens))), ticktext=labels)
    return fig


def layer_meters(
    values: Sequence[float],
    reference: Sequence[float],
    name: str = "Pmax",
    baseline: Sequence[float] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Per-layer bars of a statistic, coloured by distance to the L_tr reference (black ticks).

    ``baseline`` (the same document at tau = 1) is drawn as grey hollow
    markers, so one sees how far the chosen tau moved each layer.
    """
    values = np.asarray(values, dtype=float)
    reference = np.asarray(reference, dtype=float)
    if values.shape != reference.shape:
        raise ValueError(f"values {values.shape} and reference {reference.shape} differ")
    layers = np.arange(len(values))
    dev = deviation(values, reference)
    fig = go.Figure()
    fig.add_bar(
        x=layers,
        y=values,
        name=f"{name} (chosen tau)",
        marker_color=deviation_colors(values, reference),
        customdata=dev * 100,
        hovertemplate="layer %{x}<br>" + name + " %{y:.4f}<br>%{customdata:+.1f} % vs L_tr<extra></extra>",
    )
    fig.add_scatter(
        x=layers,
        y=reference,
        mode="markers",
        name=f"{name} at L_tr (tau = 1)",
        marker=dict(symbol="line-ew", size=28, line=dict(width=3, color="black")),
    )
    if baseline is not None:
        fig.add_scatter(
            x=layers,
            y=np.asarray(baseline, dtype=float),
            mode="markers",
            name=f"{name} here at tau = 1",
            marker=dict(symbol="circle-open", size=10, color="grey", line=dict(width=2)),
        )
    fig.update_xaxes(title="encoder layer", tickmode="linear", dtick=1)
    fig.update_yaxes(title=name)
    fig.update_layout(legend=dict(orientation="h", y=-0.25), barmode="overlay")
    return _layout(fig, title)


def question_profile(
    profile: np.ndarray,
    needle: tuple[int, int] | None = None,
    question: tuple[int, int] | None = None,
    layers: Sequence[int] | None = None,
    max_points: int = 1000,
    log_y: bool = False,
    title: str | None = None,
    baseline: np.ndarray | None = None,
) -> go.Figure:
    """Attention from the question's tokens to every position, one line per layer, needle shaded.

    ``profile`` is ``[layers, n]`` (head mean, averaged over question rows);
    each line is max-pooled to ``max_points`` positions. ``baseline`` (the
    same document at tau = 1, same shape) is drawn as thin grey lines under
    the coloured ones, so both temperatures read in one plot.
    """
    profile = np.asarray(profile)
    if profile.ndim != 2:
        raise ValueError(f"profile must be [layers, n], got shape {profile.shape}")
    layers = list(range(profile.shape[0])) if layers is None else list(layers)
    fig = go.Figure()
    if baseline is not None:
        baseline = np.asarray(baseline)
        for j, l in enumerate(layers):
            x, y = pool_max(baseline[l], max_points)
            fig.add_scatter(
                x=x.astype(np.int32),
                y=y.astype(np.float32),
                mode="lines",
                name="tau = 1",
                legendgroup="tau1",
                showlegend=j == 0,
                line=dict(width=1, color="rgba(120,120,120,0.55)"),
            )
    for l in layers:
        x, y = pool_max(profile[l], max_points)
        # float32 and int32: half the bytes of float64/int64 per point, plenty for a line on a screen
        fig.add_scatter(
            x=x.astype(np.int32), y=y.astype(np.float32), mode="lines", name=f"layer {l}", line=dict(width=1.2)
        )
    shapes, notes = [], []
    if needle is not None:
        shapes.append(_vrect(needle[0], needle[1], "red", 0.18))
        notes.append(_label(needle[0], "needle", color="#d62728", xanchor="left"))
    if question is not None:
        shapes.append(_vrect(question[0], question[1], "royalblue", 0.12))
        notes.append(_label(question[1], "question", color="#1f77b4", xanchor="right"))
    fig.update_layout(shapes=shapes, annotations=notes)
    fig.update_xaxes(title="document token")
    fig.update_yaxes(title="attention from the question", type="log" if log_y else "linear")
    return _layout(fig, title)


def _stacked_labels(
    items: Sequence[tuple[float, str, str]], x_range: tuple[float, float], plot_px: float = 700.0, row_px: int = 15
) -> tuple[list[dict], int]:
    """Labels (x, text, color) above the plot area, moved up a row where they would touch a neighbour.

    Widths are estimated from the text length (about 6.5 px a character at
    font size 11) on a plot ``plot_px`` wide, which errs on the narrow side, so
    labels that fit on one row in the browser are never drawn on each other.
    Returns the annotations and the number of rows used.
    """
    lo, hi = x_range
    span = max(hi - lo, 1e-9)
    rows_end: list[float] = []  # right edge (fraction of the width) of the last label in each row
    notes = []
    for x, text, color in sorted(items, key=lambda t: t[0]):
        frac = (x - lo) / span
        half = (len(text) * 6.5 + 8) / 2 / plot_px
        row = next((r for r, end in enumerate(rows_end) if frac - half > end), len(rows_end))
        if row == len(rows_end):
            rows_end.append(frac + half)
        else:
            rows_end[row] = frac + half
        note = _label(x, text, color=color)
        note["yshift"] = row * row_px
        notes.append(note)
    return notes, len(rows_end)


def rpe_curves(
    curves: np.ndarray,
    heads: Sequence[int] | None = None,
    query: int | None = None,
    train_length: int | None = None,
    max_distance: int | None = 128,
    title: str | None = None,
) -> go.Figure:
    """T5 relative-position bias b(m, n) against key position n for a fixed query m (paper Fig. 1).

    The marked positions (L_tr, the query m and m ± max_distance, where the
    last bucket starts) are labelled above the plot, stacked in rows where
    they are close, so no label covers another or the axis' tick labels.
    """
    curves = np.asarray(curves, dtype=float)
    if curves.ndim != 2:
        raise ValueError(f"curves must be [heads, length], got shape {curves.shape}")
    heads = list(range(curves.shape[0])) if heads is None else list(heads)
    x = np.arange(curves.shape[1])
    fig = go.Figure()
    for h in heads:
        fig.add_scatter(x=x, y=curves[h], mode="lines", name=f"head {h}", line=dict(width=1.4, shape="hv"))
    shapes, labels = [], []
    if train_length is not None:
        shapes.append(_vline(train_length))
        labels.append((train_length, "L_tr", "black"))
    if query is not None:
        shapes.append(_vline(query, "grey", "dot"))
        labels.append((query, "query m", "dimgrey"))
        if max_distance:
            for sgn in (-1, 1):
                shapes.append(_vline(query + sgn * max_distance, "lightgrey", "dot"))
                labels.append((query + sgn * max_distance, f"m{'+' if sgn > 0 else '−'}{max_distance}", "grey"))
    xs = [0, max(len(x) - 1, 1)] + [t[0] for t in labels]
    notes, rows = _stacked_labels(labels, (min(xs), max(xs)))
    fig.update_layout(shapes=shapes, annotations=notes)
    fig.update_xaxes(title="key position n")
    fig.update_yaxes(title="bias b(m, n)")
    _layout(fig, title)
    fig.update_layout(margin=dict(t=(50 if title else 6) + 16 * max(rows, 1)))
    return fig


def token_shading_html(
    text: str,
    offsets: np.ndarray,
    weights: np.ndarray,
    center: tuple[int, int] | None = None,
    window: int = 200,
    highlight: tuple[int, int] | None = None,
) -> str:
    """The document's text with each token's background shaded by ``weights`` (e.g. attention from the question).

    Shows tokens ``[center[0] - window, center[1] + window)`` (all when
    ``center`` is None); shading is relative to the largest weight in view.
    Tokens in ``highlight`` (the needle) are underlined. Text is HTML-escaped.
    """
    offsets = np.asarray(offsets)
    w = np.asarray(weights, dtype=float)
    n = min(len(offsets), len(w))
    if center is None:
        lo, hi = 0, n
    else:
        lo, hi = max(0, center[0] - window), min(n, center[1] + window)
    real = [i for i in range(lo, hi) if offsets[i][1] > offsets[i][0]]
    if not real:
        return "<div></div>"
    top = max(float(np.max(w[real])), 1e-12)
    parts = []
    if offsets[real[0]][0] > 0:
        parts.append("… ")
    prev_end = int(offsets[real[0]][0])
    for i in real:
        a, b = int(offsets[i][0]), int(offsets[i][1])
        if a > prev_end:  # characters no token covers (whitespace the tokenizer dropped)
            parts.append(html.escape(text[prev_end:a]))
        alpha = min(1.0, max(0.0, float(w[i]) / top))
        style = f"background: rgba(255, 80, 0, {alpha:.3f});"
        if highlight is not None and highlight[0] <= i < highlight[1]:
            style += " text-decoration: underline; text-decoration-color: #d62728;"
        parts.append(f'<span title="token {i}: {float(w[i]):.3g}" style="{style}">{html.escape(text[a:b])}</span>')
        prev_end = b
    if prev_end < len(text) and real[-1] < n - 1:
        parts.append(" …")
    body = "".join(parts).replace("\n", "<br>")
    return f'<div style="font-family: monospace; line-height: 1.6; white-space: pre-wrap;">{body}</div>'


# -- Calibrate ----------------------------------------------------------------------


def calibration_curves(panels: Mapping[str, dict], title: str | None = None) -> go.Figure:
    """S_ex(tau) over the grid per criterion with the S_tr(1) reference line and the pick (paper's Algorithm 1).

    ``panels``: criterion -> {"grid", "curve" (None where not evaluated), "reference", "tau"} and, optionally,
    ``"band": (low, high)``: the spread of the pick over the calibration documents (a bootstrap band), drawn as a
    shaded vertical band behind the curve from tau = low to tau = high (absent or None: no band).

    Labels never sit on each other: the pick is named in the panel's title
    (the red dotted line marks it), the dashed reference line's "S_tr(1)" label
    sits just outside the panel's right edge, at the line's height.
    """
    names = list(panels)
    if not names:
        raise ValueError("no calibration to plot")
    titles = [f"{n}: Algorithm 1 picks tau = {panels[n]['tau']:.2f}" for n in names]
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=titles, horizontal_spacing=0.14)
    fig.update_annotations(font_size=14)
    for c, name in enumerate(names, start=1):
        p = panels[name]
        pts = [(t, v) for t, v in zip(p["grid"], p["curve"]) if v is not None]
        if pts:
            xs, ys = zip(*pts)
            fig.add_scatter(x=xs, y=ys, mode="lines+markers", name=f"S_ex(tau), {name}", row=1, col=c)
        fig.add_hline(y=p["reference"], line=dict(color="black", dash="dash"), row=1, col=c)
        suffix = "" if c == 1 else str(c)
        fig.add_annotation(
            x=1,
            xref=f"x{suffix} domain",
            y=p["reference"],
            yref=f"y{suffix}",
            text="S_tr(1)",
            showarrow=False,
            xanchor="left",
            xshift=4,
            font=dict(size=11),
        )
        fig.add_vline(x=p["tau"], line=dict(color="#d62728", dash="dot"), row=1, col=c)
        band = p.get("band")
        if band is not None:
            lo, hi = sorted(float(b) for b in band)
            # a band of one grid point (the resamples all picked one tau) still shows: a quarter grid step
            # either side of it, or it would hide under the pick's dotted line
            steps = np.diff(sorted({float(t) for t in p["grid"]}))
            half = (float(steps.min()) if steps.size else 0.05) / 4 if hi - lo < 1e-9 else 0.0
            fig.add_shape(
                type="rect",
                xref=f"x{suffix}",
                yref=f"y{suffix} domain",
                x0=lo - half,
                x1=hi + half,
                y0=0,
                y1=1,
                fillcolor="#d62728",
                opacity=0.12,
                line=dict(width=0),
                layer="below",
            )
        fig.update_xaxes(title="tau", autorange="reversed", row=1, col=c)
        fig.update_yaxes(
            title="mean Pmax" if name == "pmax" else "mean entropy H" if name == "entropy" else name, row=1, col=c
        )
    fig.update_layout(showlegend=False)
    _layout(fig, title)
    fig.update_layout(margin=dict(r=60, t=(50 if title else 30) + 10))
    return fig


# -- Theory -------------------------------------------------------------------------


def qq_plot(vectors: Mapping[str, np.ndarray], max_points: int = 1000, title: str | None = None) -> go.Figure:
    """QQ plot of average sorted logit vectors against a normal distribution (paper Fig. 2).

    Each vector's values are plotted against standard normal quantiles, with
    the line mean + sigma * z it would follow if it were exactly Gaussian.
    """
    fig = go.Figure()
    for name, vec in vectors.items():
        v = np.sort(np.asarray(vec, dtype=float))
        if len(v) < 2:
            continue
        n = len(v)
        idx = np.unique(np.linspace(0, n - 1, min(n, max_points)).round().astype(int))
        nd = NormalDist()
        zq = np.array([nd.inv_cdf((i + 0.5) / n) for i in idx])
        fig.add_scatter(x=zq, y=v[idx], mode="markers", marker=dict(size=4), name=f"{name} (n = {n})")
        mu, sd = float(v.mean()), float(v.std())
        fig.add_scatter(
            x=[zq[0], zq[-1]],
            y=[mu + sd * zq[0], mu + sd * zq[-1]],
            mode="lines",
            line=dict(dash="dash", width=1),
            name=f"normal fit, {name} (sigma = {sd:.3g})",
        )
    fig.update_xaxes(title="standard normal quantile")
    fig.update_yaxes(title="average sorted logit (layer 0)")
    return _layout(fig, title, height=420)


def _log_vline(fig: go.Figure, x: float | None, label: str = "L_tr") -> None:
    """A dashed vertical line at ``x`` on a log x axis, labelled.

    plotly.js places shapes on a log axis in data units but annotations in
    log10 units (checked in a browser: a label at x = 256 stretched the axis
    to 1e256).
    """
    if x:
        fig.add_shape(_vline(x))
        fig.add_annotation(_label(math.log10(x), label))


def _length_ticks(fig: go.Figure, lengths: Sequence[float], train_length: int | None = None) -> None:
    """Readable ticks on a log length axis: L_tr times powers of two (256, 512, 1,024, ...), or the data's lengths.

    plotly's own log ticks label minor ticks with bare digits ("3 4 5 ... 1000 2"), which reads as nonsense.
    """
    xs = [float(x) for x in lengths if x and x > 0]
    if not xs:
        return
    lo, hi = min(xs), max(xs)
    if train_length:
        base = float(train_length)
        # a length a few tokens short of a multiple (2,045 for 8x 256) still gets that multiple's tick only
        k0, k1 = math.floor(math.log2(lo / base) + 0.05), math.ceil(math.log2(hi / base) - 0.05)
        ticks = [base * 2.0**k for k in range(k0, k1 + 1)]
    else:
        ticks = sorted(set(xs))
    fig.update_xaxes(tickvals=ticks, ticktext=[f"{t:,.0f}" for t in ticks])


def lmax_vs_length(df: pd.DataFrame, train_length: int | None = None, title: str | None = None) -> go.Figure:
    """l_max (and sigma) of layer 0's average sorted logit vector across lengths (paper Table 8)."""
    need = {"tokens", "l_max"}
    if not need <= set(df.columns):
        raise ValueError(f"table needs columns {sorted(need)}")
    d = df.sort_values("tokens")
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_scatter(x=d["tokens"], y=d["l_max"], mode="lines+markers", name="l_max", secondary_y=False)
    if "sigma" in d:
        fig.add_scatter(
            x=d["tokens"], y=d["sigma"], mode="lines+markers", name="sigma", line=dict(dash="dot"), secondary_y=True
        )
    _log_vline(fig, train_length)
    fig.update_xaxes(title="document tokens", type="log")
    _length_ticks(fig, list(d["tokens"]) + ([train_length] if train_length else []), train_length)
    fig.update_yaxes(title="l_max", secondary_y=False)
    fig.update_yaxes(title="sigma", secondary_y=True)
    return _layout(fig, title)


def temperature_curves(
    curves: Mapping[str, tuple[Sequence[int], Sequence[float | None]]],
    dots: Mapping[str, tuple[Sequence[int], Sequence[float]]] | None = None,
    train_length: int | None = None,
    title: str | None = None,
) -> go.Figure:
    """tau against document length per method (lines, each ``(lengths, taus)``), Algorithm 1 picks as dots (paper Fig. 3/4).

    ``None`` taus (a formula without a solution there) leave a gap. A curve equal to an earlier one at every
    length (log-n and Scalable-Softmax with fixed s equal log-length in an encoder) would hide under it: it is
    drawn dashed (a different dash per copy) and named "name (= earlier)" in the legend, so every method stays
    visible and the equality is said.
    """
    fig = go.Figure()
    drawn: list[tuple[str, list, np.ndarray]] = []
    same: dict[str, str | None] = {}  # curve -> the earlier curve it equals
    for name, (xs, ys) in curves.items():
        ys = [np.nan if y is None else float(y) for y in ys]
        if len(ys) != len(xs):
            raise ValueError(f"curve '{name}' has {len(ys)} values for {len(xs)} lengths")
        y = np.asarray(ys, dtype=float)
        same[name] = (
            None
            if np.isnan(y).all()
            else next(
                (n for n, x0, y0 in drawn if x0 == list(xs) and np.allclose(y0, y, rtol=0, atol=1e-9, equal_nan=True)),
                None,
            )
        )
        drawn.append((name, list(xs), y))
    copied = set(same.values())
    copies = 0
    for name, xs, y in drawn:
        ys = [float(v) for v in y]  # NaN: a gap
        if same[name] is None:  # a line with copies is drawn wide and pale, so the dashed copies show on it
            wide = name in copied
            fig.add_scatter(
                x=xs,
                y=ys,
                mode="lines+markers",
                name=name,
                marker=dict(size=5),
                line=dict(width=7 if wide else 2),
                opacity=0.45 if wide else 1.0,
            )
        else:
            dash = ("dash", "dot", "dashdot", "longdash")[copies % 4]
            copies += 1
            fig.add_scatter(x=xs, y=ys, mode="lines", name=f"{name} (= {same[name]})", line=dict(dash=dash, width=2.5))
    for name, (xs, ys) in (dots or {}).items():
        fig.add_scatter(x=list(xs), y=list(ys), mode="markers", name=name, marker=dict(size=12, symbol="diamond"))
    _log_vline(fig, train_length)
    fig.update_xaxes(title="document tokens", type="log")
    every = [x for xs, _ in list(curves.values()) + list((dots or {}).values()) for x in xs]
    _length_ticks(fig, every + ([train_length] if train_length else []), train_length)
    fig.update_yaxes(title="tau")
    return _layout(fig, title, height=420)


def mark_above_one(fig: go.Figure, xs: Sequence[int], ys: Sequence[float | None], name: str, why: str) -> bool:
    """Say on the figure where the curve ``name`` reads tau > 1 (a temperature that flattens instead of sharpening):
    an arrow at its highest such point with ``why``, and a dotted line at tau = 1. Returns whether it marked one.

    Why on the figure: a reader of the chart sees the line above 1 before any caption below it (issue 59, point
    12: Theory's Prop. 1 line sat at 2.07 at L_tr with its explanation only on another page)."""
    above = [(float(y), x) for x, y in zip(xs, ys) if y is not None and np.isfinite(y) and float(y) > 1]
    if not above:
        return False
    y, x = max(above)
    fig.add_hline(y=1.0, line=dict(color="grey", dash="dot", width=1))
    fig.add_annotation(
        x=float(np.log10(x)) if fig.layout.xaxis.type == "log" else x,
        y=y,
        text=f"{name} = {y:.2f} > 1 at {int(x):,} tokens: {why}",
        showarrow=True,
        arrowhead=2,
        ax=0,
        ay=-30,
        xanchor="center",
        bgcolor="rgba(255,255,255,0.85)",
        font=dict(size=11),
    )
    return True


def row_taus(frame: pd.DataFrame, train_length: int, x: str = "query row"):
    """Each per-row method's tau against the query row (one line per column of ``frame`` besides ``x``), L_tr marked:
    a Vega-Lite chart (altair), as Streamlit's line chart draws, with the legend below the plot and every name in
    full: the line chart's legend cut long names ("Llama 4 attention tempe...", issue 59 point 12)."""
    import altair as alt

    long = frame.melt(id_vars=[x], var_name="method", value_name="tau")
    lines = (
        alt.Chart(long)
        .mark_line()
        .encode(
            x=alt.X(f"{x}:Q", title=x),
            y=alt.Y("tau:Q", title="tau", scale=alt.Scale(zero=False)),
            color=alt.Color(
                "method:N", legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0, title=None)
            ),
            tooltip=[f"{x}:Q", "method:N", alt.Tooltip("tau:Q", format=".4f")],
        )
    )
    rule = alt.Chart(pd.DataFrame({x: [train_length]})).mark_rule(strokeDash=[4, 4], color="black").encode(x=f"{x}:Q")
    return (lines + rule).properties(height=260)


def cosine_hist(counts: np.ndarray, edges: np.ndarray, title: str | None = None) -> go.Figure:
    """Histogram of cos(q, k) in layer 0 for a cosine-attention model."""
    counts, edges = np.asarray(counts, dtype=float), np.asarray(edges, dtype=float)
    if len(edges) != len(counts) + 1:
        raise ValueError("edges must have one more entry than counts")
    total = counts.sum()
    frac = counts / total if total > 0 else counts
    fig = go.Figure(go.Bar(x=(edges[:-1] + edges[1:]) / 2, y=frac, width=np.diff(edges), name="cos(q, k)"))
    fig.update_xaxes(title="cos(q, k)", range=[-1, 1])
    fig.update_yaxes(title="fraction of (query, key) pairs")
    return _layout(fig, title)


# -- Sweep --------------------------------------------------------------------------


def accuracy_heatmap(
    table: pd.DataFrame, title: str | None = None, x_title: str = "document tokens", y_title: str | None = None
) -> go.Figure:
    """An accuracy pivot (percent) as a red-to-green heatmap with the numbers written in the cells."""
    if table.empty:
        raise ValueError("empty accuracy table")
    z = table.to_numpy(dtype=float)
    text = [["" if math.isnan(v) else f"{v:.0f}" for v in row] for row in z]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[str(c) for c in table.columns],
            y=[str(i) for i in table.index],
            zmin=0,
            zmax=100,
            colorscale="RdYlGn",
            text=text,
            texttemplate="%{text}",
            colorbar=dict(title="acc %"),
            hovertemplate="%{y} / %{x}: %{z:.1f} %<extra></extra>",
        )
    )
    fig.update_xaxes(title=x_title, type="category")
    fig.update_yaxes(title=y_title or table.index.name, type="category")
    return _layout(fig, title)


def perplexity_over_length(table: pd.DataFrame, train_length: int | None = None, title: str | None = None) -> go.Figure:
    """Perplexity against prefix length, one line per method (rows of ``table``, lengths as columns; paper Table 3).

    Both axes are logarithmic: perplexity past L_tr grows by factors, and the
    interesting question is which method stays near its value at L_tr."""
    if table.empty:
        raise ValueError("empty perplexity table")
    fig = go.Figure()
    xs = [float(c) for c in table.columns]
    for method, row in table.iterrows():
        fig.add_scatter(
            x=xs,
            y=[float(v) for v in row.to_numpy()],
            mode="lines+markers",
            name=str(method),
            hovertemplate=f"{method}<br>%{{x:,.0f}} tokens: perplexity %{{y:.1f}}<extra></extra>",
        )
    _log_vline(fig, train_length)
    fig.update_xaxes(title="prefix tokens", type="log")
    _length_ticks(fig, xs + ([train_length] if train_length else []), train_length)
    fig.update_yaxes(title="perplexity (log)", type="log")
    return _layout(fig, title, height=400)


def head_ratio_maps(
    panels: Mapping[str, np.ndarray], reference: np.ndarray, name: str = "Pmax", title: str | None = None
) -> go.Figure:
    """Per layer and head, a statistic over its value at L_tr (tau = 1), one heatmap per panel on one scale.

    Why per head: the layer means (and Algorithm 1's global mean) hide heads
    that stay saturated (ratio near 1 whatever the length) and heads that go
    flat; a ratio of 1 (white) is a head that looks as it did in training."""
    reference = np.asarray(reference, dtype=float)
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=list(panels), horizontal_spacing=0.08)
    for i, (label, values) in enumerate(panels.items()):
        v = np.asarray(values, dtype=float)
        if v.shape != reference.shape:
            raise ValueError(f"{label}: values {v.shape} and reference {reference.shape} differ")
        ratio = v / np.where(reference > 0, reference, np.nan)
        fig.add_heatmap(
            z=ratio,
            x=[f"h{h}" for h in range(v.shape[1])],
            y=[f"layer {l}" for l in range(v.shape[0])],
            zmin=0.0,
            zmax=2.0,
            colorscale="RdBu",
            reversescale=False,
            showscale=i == len(panels) - 1,
            colorbar=dict(title=f"{name} / L_tr"),
            text=[[f"{x:.2f}" for x in row] for row in ratio],
            texttemplate="%{text}",
            hovertemplate="%{y}, %{x}: %{z:.2f} of L_tr<extra>" + label + "</extra>",
            row=1,
            col=i + 1,
        )
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, title, height=120 + 40 * reference.shape[0])
