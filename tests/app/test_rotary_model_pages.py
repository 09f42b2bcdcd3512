"""The app on a rotary masked-LM model (issue 38): every page opens a tiny ModernBERT without an exception, Explore's
masked-token cards equal core.experiments.mlm's own score of the same document at the same tau, tau and CosScale move them, the
distance view replaces T5's bias curves, Sweep scores masked tokens and Theory's InfoScale uses the model's head size.

The tiny models come from tests/conftest.py (``build_tiny_rope``: L_tr = 64, the bundled models' BPE with a mask
token); AAE_MODEL points the app at them. Nothing of our code is mocked: the numbers are compared with
:func:`core.experiments.mlm.score` on :func:`core.experiments.mlm.sequence`, the evaluation ``python -m core mlm`` runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import app_ok, build_tiny_rope, scrubber_view, unpack_payload  # noqa: E402
from core.experiments import mlm
from core.models import load  # noqa: E402
from core.runs import methods
from core.values import positions  # noqa: E402
from core.values.choice import Choice
from support.app import nav_click  # noqa: E402 (a page change as the browser's navigation sends it)

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
PAGES = ("app_pages/explore.py", "app_pages/calibrate.py", "app_pages/sweep.py", "app_pages/theory.py")
TIMEOUT = 120
L_TR = 64


@pytest.fixture(scope="module")
def rope_dir(tmp_path_factory):
    return build_tiny_rope(tmp_path_factory.mktemp("app-rope"), train_length=L_TR)


@pytest.fixture
def rope_env(rope_dir, monkeypatch):
    monkeypatch.setenv("AAE_MODEL", str(rope_dir))
    return rope_dir


def _scored(folder, tokens: int, seed: int, tau: float, cosine_scale: float | None = None) -> mlm.Scored:
    """core.experiments.mlm's own score of the held-out sequence of ``seed`` at ``tokens`` tokens under ``tau`` (and s)."""
    loaded = load(str(folder), device="cpu")
    _, seq = mlm.sequence(loaded, tokens, seed)
    return mlm.score(loaded, [seq], Choice.of(tau=tau, cosine_scale=cosine_scale))


def _array(v) -> list[float]:
    """A plotly trace's x or y as a list (plotly sends numeric arrays as base64 ``bdata``)."""
    if isinstance(v, dict) and "bdata" in v:
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).tolist()
    return list(v)


def _same(card: dict, scored: mlm.Scored) -> None:
    assert card["masked"] == scored.masked and card["correct"] == scored.correct
    assert card["accuracy"] == pytest.approx(scored.correct / scored.masked)
    assert card["perplexity"] == pytest.approx(float(__import__("math").exp(scored.nll / scored.masked)), rel=1e-4)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_opens_alone(rope_env, page):
    at = AppTest.from_file(str(ROOT / page), default_timeout=TIMEOUT).run()
    app_ok(at)
    assert at.title and at.session_state["doc_task"] == "lm"
    assert any("RoPE" in c.value for c in at.sidebar.caption), "the sidebar says which family the model is"


def test_explore_cards_equal_mlm_score_and_tau_moves_them(rope_env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    app_ok(at)
    assert at.session_state["doc_tokens"] == L_TR and not at.get("plotly_chart")
    header, chosen = scrubber_view(at)
    seed = int(at.session_state["doc_seed"])
    _same(header["base"]["masked"], _scored(rope_env, L_TR, seed, 1.0))  # tau = 1
    _same(header["ref"]["masked"], _scored(rope_env, L_TR, seed, 1.0))  # at L_tr the reference is this document
    rows = header["base"]["masked"]["rows"]
    assert 1 <= len(rows) <= 8 and all(isinstance(r[1], str) and isinstance(r[2], str) for r in rows)
    # 2x L_tr, then a release of the scrubber's slider at 0.6: the chosen card is the score at tau = 0.6
    at.session_state["doc_tokens"] = 2 * L_TR
    at.run()
    at.session_state["tau_value"] = 0.6
    at.run()
    app_ok(at)
    header, chosen = scrubber_view(at)
    assert header["meta"]["tau"] == pytest.approx(0.6) and chosen["tau"] == pytest.approx(0.6)
    _same(chosen["masked"], _scored(rope_env, 2 * L_TR, seed, 0.6))
    _same(header["base"]["masked"], _scored(rope_env, 2 * L_TR, seed, 1.0))
    assert chosen["masked"]["perplexity"] != header["base"]["masked"]["perplexity"]
    assert chosen["pmax"] > header["base"]["pmax"], "tau < 1 sharpens the attention of the masked document"
    # an off-grid tau: its exact frame carries its own card
    at.session_state["tau_value"] = 0.62
    at.run()
    header, chosen = scrubber_view(at)
    if chosen is not None and chosen["tau"] == pytest.approx(0.62):
        _same(chosen["masked"], _scored(rope_env, 2 * L_TR, seed, 0.62))


def test_explore_draws_the_distance_view_and_the_tour_says_whom_it_is_for(rope_env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.toggle(key="ex_show_bias").set_value(True).run()
    app_ok(at)
    assert any("relative distance" in h.value for h in at.subheader)
    (chart,) = at.get("plotly_chart")
    spec = json.loads(chart.proto.spec)
    lines = [t for t in spec["data"] if t.get("name", "").startswith("head ")]
    assert len(lines) == 4 and _array(lines[0]["x"]) == list(range(-(L_TR - 1), L_TR))  # every distance
    at.selectbox(key="ex_dist_layer").set_value(1).run()
    app_ok(at)
    assert any("T5 pass-key models" in i.value for i in at.info), "the tour says it is for the T5 models"
    assert not any(b.key == "tour_0" for b in at.button)


def test_a_measured_method_and_the_other_pages(rope_env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.selectbox(key="tau_method").set_value(methods.BASELINE).run()
    app_ok(at)
    for page in PAGES[1:] + PAGES[:1]:
        nav_click(at, page)
        app_ok(at)
    nav_click(at, "app_pages/calibrate.py")
    if any(b.key == "cal_run" for b in at.button):
        at.button(key="cal_run").click().run()
    app_ok(at)
    assert {"Algorithm 1 (pmax)", "Algorithm 1 (entropy)"} <= {m.label for m in at.metric}


def test_theory_infoscale_uses_the_models_head_size(rope_env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    nav_click(at, "app_pages/theory.py")
    app_ok(at)
    loaded = load(str(rope_env), device="cpu")
    assert loaded.d_kv == 16  # hidden 64 over 4 heads
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if "InfoScale" in c.proto.spec)
    (line,) = [t for t in spec["data"] if "InfoScale" in t.get("name", "")]
    name = next(n for n in methods.FORMULAS if methods.get(n).short in line["name"])
    for n, tau in zip(_array(line["x"]), _array(line["y"])):
        assert tau == pytest.approx(methods.formula(name, L_TR, int(n), loaded.d_kv, None), rel=1e-6)
    assert methods.formula(name, L_TR, 16 * L_TR, 16, None) != methods.formula(name, L_TR, 16 * L_TR, 64, None)


def test_sweep_scores_masked_tokens_as_the_cli(rope_env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    nav_click(at, "app_pages/sweep.py")
    app_ok(at)
    at.multiselect(key="lm_lengths").set_value([1, 2])
    at.multiselect(key="lm_methods").set_value([methods.AS_TRAINED])
    at.number_input(key="lm_sequences").set_value(2)
    at.button(key="mlm_start").click().run()
    app_ok(at)
    perplexity, accuracy = at.dataframe[0].value, at.dataframe[1].value
    assert list(perplexity.columns) == [L_TR, 2 * L_TR] and len(at.get("plotly_chart")) == 1
    rows = mlm.run_mlm(
        load(str(rope_env), device="cpu"),
        mlm.MlmPlan(lengths=[L_TR, 2 * L_TR], methods=[methods.AS_TRAINED], sequences=2),
    )
    for r in rows:
        assert perplexity[r["tokens"]].iloc[0] == pytest.approx(r["perplexity"], abs=0.006)
        assert accuracy[r["tokens"]].iloc[0] == pytest.approx(r["accuracy"], abs=1e-4)


def test_a_cosine_rope_model_moves_cosscale(tmp_path, monkeypatch):
    folder = build_tiny_rope(tmp_path / "rope-cos", cosine=16.0, seed=1, train_length=L_TR)
    monkeypatch.setenv("AAE_MODEL", str(folder))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    app_ok(at)
    assert at.slider(key="cos_scale").value == pytest.approx(16.0)
    at.slider(key="cos_scale").set_value(8.0).run()
    app_ok(at)
    header, chosen = scrubber_view(at)
    assert "s = 16" in header["meta"]["base_label"] and chosen["cosine_scale"] == 8.0
    seed = int(at.session_state["doc_seed"])
    _same(chosen["masked"], _scored(folder, L_TR, seed, 1.0, cosine_scale=8.0))
    _same(header["base"]["masked"], _scored(folder, L_TR, seed, 1.0))
    # the scrubber's slider moves s: a grid of scales, the trained one among them; a release at s = 16
    at.radio(key="ex_axis").set_value("s").run()
    app_ok(at)
    header, chosen = scrubber_view(at)
    assert header["meta"]["axis"]["name"] == "s" and 16.0 in header["grid"]
    at.session_state["cos_scale"] = 16.0
    at.run()
    header, chosen = scrubber_view(at)
    assert chosen["cosine_scale"] == 16.0
    _same(chosen["masked"], _scored(folder, L_TR, seed, 1.0, cosine_scale=16.0))
    nav_click(at, "app_pages/theory.py")
    app_ok(at)


# -- the position-scheme axis (issue 38, point 5) --------------------------------------------------------------


def _scored_scheme(folder, tokens: int, seed: int, tau: float, scheme: str, params: dict) -> mlm.Scored:
    """core.experiments.mlm's own score of the held-out sequence under ``tau`` and the position scheme ``scheme``."""
    loaded = load(str(folder), device="cpu")
    _, seq = mlm.sequence(loaded, tokens, seed)
    return mlm.score(loaded, [seq], Choice.of(tau=tau, scheme=positions.Scheme.of(scheme, params)))


def _query(at, name: str):
    v = dict(at.query_params).get(name)
    return v[0] if isinstance(v, list) else v


def test_a_window_scheme_changes_the_cards_as_mlm_scores_it_and_is_kept(rope_env):
    import numpy as np

    from core.values import positions
    from core.views import rope_view

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.session_state["doc_tokens"] = 2 * L_TR
    at.run()
    app_ok(at)
    seed = int(at.session_state["doc_seed"])
    assert at.selectbox(key="pos_scheme").value == positions.PLAIN and _query(at, "scheme") == positions.PLAIN
    header, plain = scrubber_view(at)
    assert "mask" not in header
    _same(plain["masked"], _scored(rope_env, 2 * L_TR, seed, 1.0))
    assert [o for o in at.selectbox(key="pos_scheme").options if "ALiBi" in o or "PoSE" in o] == []  # not selectable
    at.selectbox(key="pos_scheme").set_value("window").run()
    app_ok(at)
    assert at.number_input(key="pos_window").value == L_TR - 1  # the scheme's default for this L_tr
    at.number_input(key="pos_window").set_value(8).run()
    app_ok(at)
    header, chosen = scrubber_view(at)
    windowed = _scored_scheme(rope_env, 2 * L_TR, seed, 1.0, "window", {"window": 8})
    _same(chosen["masked"], windowed)
    assert (chosen["masked"]["correct"], chosen["masked"]["perplexity"]) != (
        plain["masked"]["correct"],
        plain["masked"]["perplexity"],
    )
    assert chosen["pmax"] > plain["pmax"], "the maps' pass runs under the window: 17 keys a row, not 128"
    _same(header["base"]["masked"], _scored(rope_env, 2 * L_TR, seed, 1.0))  # the left column stays as trained
    assert "window" in header["meta"]["chosen_title"] and "needle" not in header["meta"]["map_note"]
    # the mask drawn on the map: the scheme's mask pooled on the map's own cells
    _, arrays = unpack_payload(at.get("bidi_component")[0].proto.bytes)
    want = rope_view.mask_cells(positions.get("window").bind(L_TR, 2 * L_TR, window=8), np.asarray(header["edges"]))
    np.testing.assert_array_equal(arrays["mask"], np.rint(want * 255).astype(np.uint8))
    assert _query(at, "scheme") == "window:window=8"
    # tau moves under the scheme
    at.session_state["tau_value"] = 0.6
    at.run()
    app_ok(at)
    header, chosen = scrubber_view(at)
    _same(chosen["masked"], _scored_scheme(rope_env, 2 * L_TR, seed, 0.6, "window", {"window": 8}))
    # the export's command is the mlm command of this view
    cmd = next(m.value for m in at.markdown if "Then run" in m.value)
    assert "python -m core mlm" in cmd and "--schemes window:window=8" in cmd and "--methods tau=0.6" in cmd
    assert f"--lengths {2 * L_TR}" in cmd and f"--seed {seed}" in cmd
    assert not any(s.key == "ex_text_window" for s in at.slider), "the text window does nothing for a RoPE model"
    # kept across pages, and Calibrate / Theory run under it
    for page in ("app_pages/theory.py", "app_pages/calibrate.py", "app_pages/explore.py"):
        nav_click(at, page)
        app_ok(at)
        assert at.session_state["pos_scheme"] == "window" and at.session_state["pos_window"] == 8
    header, chosen = scrubber_view(at)
    _same(chosen["masked"], _scored_scheme(rope_env, 2 * L_TR, seed, 0.6, "window", {"window": 8}))


def test_the_scheme_travels_in_the_url(rope_env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(tokens="2x", scheme="lm-infinite:sinks=2:window=16")
    at.run()
    app_ok(at)
    assert at.session_state["pos_scheme"] == "lm-infinite"
    assert (at.session_state["pos_window"], at.session_state["pos_sinks"], at.session_state["pos_cap"]) == (
        16,
        2,
        L_TR - 1,
    )
    link = _query(at, "scheme")
    assert link == f"lm-infinite:window=16:sinks=2:cap={L_TR - 1}"
    header, chosen = scrubber_view(at)
    _same(
        chosen["masked"],
        _scored_scheme(
            rope_env, 2 * L_TR, int(at.session_state["doc_seed"]), 1.0, "lm-infinite", {"window": 16, "sinks": 2}
        ),
    )
    # the written link opens the same view in a new session
    again = AppTest.from_file(APP, default_timeout=TIMEOUT)
    again.query_params.update({k: (v[0] if isinstance(v, list) else v) for k, v in dict(at.query_params).items()})
    again.run()
    app_ok(again)
    assert _query(again, "scheme") == link and again.session_state["pos_window"] == 16


@pytest.mark.parametrize("bad", ["bogus", "alibi", "window:sinks=2", "pi:factor=0.5"])
def test_a_bad_scheme_in_the_url_is_one_message(rope_env, bad):
    from core.values import positions

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(scheme=bad, seed="3")
    at.run()
    assert not at.exception
    (err,) = at.error
    assert "scheme=" in err.value and "cannot be used" in err.value
    assert at.session_state["pos_scheme"] == positions.PLAIN and int(at.session_state["doc_seed"]) == 3


def test_sweep_runs_each_chosen_position_scheme(rope_env):
    """The Sweep page's masked-token grid takes position schemes too: one row per scheme and method, each equal to
    core.experiments.mlm's own rows under that scheme (the CLI's `mlm --schemes`)."""
    from core.values import positions

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    nav_click(at, "app_pages/sweep.py")
    app_ok(at)
    at.multiselect(key="lm_lengths").set_value([2])
    at.multiselect(key="lm_methods").set_value([methods.AS_TRAINED])
    at.multiselect(key="lm_schemes").set_value([positions.PLAIN, "window"])
    at.number_input(key="lm_sequences").set_value(2)
    at.button(key="mlm_start").click().run()
    app_ok(at)
    perplexity = at.dataframe[0].value
    assert len(perplexity) == 2, perplexity
    rows = mlm.run_mlm(
        load(str(rope_env), device="cpu"),
        mlm.MlmPlan(lengths=[2 * L_TR], methods=[methods.AS_TRAINED], sequences=2, schemes=[positions.PLAIN, "window"]),
    )
    got = sorted(perplexity[2 * L_TR].tolist())
    assert got == pytest.approx(sorted(r["perplexity"] for r in rows), abs=0.006)
    assert rows[0]["perplexity"] != pytest.approx(rows[1]["perplexity"])  # the window does change the numbers
