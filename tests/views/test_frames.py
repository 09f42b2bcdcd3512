"""core.views.frames: the scrubber's payload, without Streamlit: shapes, quantisation, equality with the runs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import unpack_payload
from core.mechanics.probes import ProbeSpec
from core.runs import engine
from core.runs.settings import DocumentRequest
from core.values.choice import Choice
from core.views import frames, tables


def test_grid_covers_the_slider_and_orders_nearest_first():
    assert frames.SCRUB_GRID[0] == 1.0 and frames.SCRUB_GRID[-1] == pytest.approx(0.30)
    assert len(frames.SCRUB_GRID) == 15 and all(
        round(a - b, 2) == 0.05 for a, b in zip(frames.SCRUB_GRID, frames.SCRUB_GRID[1:])
    )
    order = frames.grid_order(0.62)
    assert order[0] == 1.0 and order[1] == 0.6 and order[2] == 0.65 and sorted(order) == sorted(frames.SCRUB_GRID)


@given(
    st.lists(st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=1, max_size=50),
    st.integers(min_value=16, max_value=20000),
)
@settings(max_examples=60, deadline=None)
def test_log_scale_round_trip(values, n):
    scale = frames.LogScale.for_length(n)
    p = np.asarray(values)
    back = scale.decode(scale.encode(p))
    above = p > scale.lo
    # inside the scale: within half a code (relative); at or below its floor: code 0, decoded as 0
    assert np.all(np.abs(back[above] - p[above]) <= p[above] * scale.step * 1.0001)
    assert np.all(back[~above] == 0)


def test_log_scale_is_monotone_and_uses_the_codes():
    scale = frames.LogScale.for_length(2048)
    p = np.geomspace(scale.lo * 1.0001, 1.0, 1000)
    codes = scale.encode(p)
    assert codes[0] == 1 and codes[-1] == 255 and np.all(np.diff(codes.astype(int)) >= 0)


def test_pack_unpack_round_trip():
    packer = frames.Packer()
    a = np.arange(7, dtype=np.uint8)
    b = np.linspace(0, 1, 10, dtype=np.float32).reshape(2, 5)
    head = {"x": packer.add(a, "u8"), "deep": [{"y": packer.add(b, "f32")}], "label": "é"}
    header, arrays = unpack_payload(packer.finish(head))
    assert header["label"] == "é"
    assert np.array_equal(arrays["x"], a) and np.array_equal(arrays["deep.0.y"], b)
    with pytest.raises(ValueError):
        unpack_payload(b"nope" + bytes(10))


def test_text_window_keeps_the_characters_between_tokens():
    text = "ab cd  ef"
    offsets = np.array([[0, 2], [3, 5], [7, 9]])
    lo, hi, pieces = frames.text_window(text, offsets, (1, 2), 5)
    assert (lo, hi) == (0, 3)
    assert "".join(g + t for g, t in pieces) == text


@pytest.fixture(scope="module")
def runs(tiny):
    """A pass key document at 2 x L_tr of the tiny test model at three taus, with Explore's probes."""
    loaded = tiny
    req = DocumentRequest(task="passkey", tokens=2 * loaded.train_length, depth=0.5, seed=0)
    doc = req.build_for(loaded)
    probes = ProbeSpec(
        heatmap_layer=loaded.n_layers - 1,
        heatmap_head=None,
        heatmap_size=64,
        sorted_logits=False,
        cosine_hist_bins=0,
        names=("cross.*.map", "cross.*.profile"),
    )
    out = {
        t: engine.run(loaded, doc, Choice.of(tau=t, method="fixed"), engine.Pass(probes=probes))
        for t in (1.0, 0.7, 0.5)
    }
    ref_doc = DocumentRequest(task="passkey", tokens=loaded.train_length, depth=0.5, seed=0).build_for(loaded)
    ref = engine.run(loaded, ref_doc, Choice.of(tau=1.0, method="none"), engine.Pass(generate=False))
    exact = engine.run(loaded, doc, Choice.of(tau=0.73, method="fixed"), engine.Pass(probes=probes))
    return doc, out, ref, exact


def test_payload_carries_each_runs_own_numbers(runs):
    doc, out, ref, exact = runs
    payload = frames.payload(
        out[1.0], ref, {0.7: out[0.7], 0.5: out[0.5]}, exact, doc.text, frames.ViewSpec(window=40), meta={"tau": 0.73}
    )
    header, arrays = unpack_payload(payload)
    assert header["grid"] == list(frames.SCRUB_GRID) and set(header["frames"]) == {"0.70", "0.50"}
    assert header["meta"] == {"tau": 0.73} and header["exact"]["tau"] == pytest.approx(0.73)
    scale = frames.LogScale(**header["scale"])
    for key, res in (("frames.0.70", out[0.7]), ("frames.0.50", out[0.5]), ("base", out[1.0]), ("exact", exact)):
        f = header
        for part in key.split(".", 1):
            f = f[part]
        assert f["answer"] == res.answer and f["correct"] == res.correct
        assert f["pmax"] == pytest.approx(res.pmax, abs=1e-6) and f["entropy"] == pytest.approx(res.entropy, abs=1e-6)
        assert np.allclose(f["layer_pmax"], res.probes.layer_pmax, atol=1e-6)
        assert np.allclose(f["head_entropy"], res.probes.entropy[0], atol=1e-6)
        heat = res.probes.heatmap_mean
        assert arrays[f"{key}.map"].shape == heat.shape
        back = scale.decode(arrays[f"{key}.map"])
        inside = heat > scale.lo
        assert np.all(np.abs(back[inside] - heat[inside]) <= heat[inside] * scale.step * 1.0001)
        assert arrays[f"{key}.qrows"].shape == res.probes.question_map_mean.shape
        prof = arrays[f"{key}.profile"]
        assert prof.shape[0] == res.probes.profile.shape[0]
        # max-pooled: each layer's peak survives exactly
        assert np.allclose(prof.max(1), res.probes.profile.max(1), rtol=1e-6)
        lo = header["text"]["first"]
        w = arrays[f"{key}.text_weights"]
        assert np.allclose(w, res.probes.profile[:, lo : lo + w.shape[1]], rtol=1e-6)
        z, tokens = tables.answer_attention(res)
        assert arrays[f"{key}.cross"].shape == z.shape and f["cross_tokens"] == tokens
    # the frames differ where the runs do: a sharper tau raises Pmax
    assert header["frames"]["0.50"]["pmax"] > header["frames"]["0.70"]["pmax"] > header["base"]["pmax"]


def test_payload_without_a_question_or_cross_attention(tiny):
    loaded = tiny
    req = DocumentRequest(task="text", text="plain words " * 80, depth=0.5, seed=0, needle=None)
    doc = req.build_for(loaded)
    spec = ProbeSpec(heatmap_layer=0, heatmap_size=32, sorted_logits=False, cosine_hist_bins=0)
    res = engine.run(loaded, doc, Choice.of(tau=1.0, method="none"), engine.Pass(probes=spec))
    header, arrays = unpack_payload(frames.payload(res, res, {1.0: res}, None, doc.text))
    assert header["exact"] is None and "base.map" in arrays and "base.cross" not in arrays


def test_a_delta_carries_only_the_new_frames(runs):
    doc, out, ref, exact = runs
    grid = {1.0: out[1.0], 0.7: out[0.7], 0.5: out[0.5]}
    full = frames.payload(out[1.0], ref, grid, None, doc.text, meta={"doc_id": "d"})
    delta = frames.payload(out[1.0], ref, grid, exact, doc.text, meta={"doc_id": "d"}, only=[0.5])
    header, arrays = unpack_payload(delta)
    assert header["delta"] is True and set(header["frames"]) == {"0.50"} and "base" not in header
    assert header["exact"]["tau"] == pytest.approx(0.73) and header["meta"] == {"doc_id": "d"}
    # the new frame is the same as in the full payload, byte for byte
    _, full_arrays = unpack_payload(full)
    assert np.array_equal(arrays["frames.0.50.map"], full_arrays["frames.0.50.map"])
    assert len(delta) < len(full) / 2
