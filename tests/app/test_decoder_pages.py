"""The app on a decoder-only LM (issue 56, item 3): every page on a tiny random Llama saved to a folder, as the app
opens SmolLM2-135M. Explore reads the prompt's question rows as the question -> document attention, its maps are
causal (the upper triangle veiled, not drawn as attention), its meters are the same rows' Pmax/H per layer against
the L_tr reference, the rotary's distance curves stand where T5 draws its bias; Calibrate, Sweep and Theory run on
it; and paste mode says which models answer a question of one's own (issue 59, point 4).

The numbers are compared with the library's own run of the same document (:func:`core.runs.engine.run`), nothing of
our code mocked. The tiny model comes from tests/runs/test_engine_decoder.py (L_tr = 256, ByT5's bytes).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("streamlit")
from runs.test_engine_decoder import TRAIN_LENGTH, build_tiny_llama  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import app_ok, scrubber_view, sweep_one_cell, unpack_payload  # noqa: E402
from core.mechanics.run_pass import Pass  # noqa: E402
from core.models import load  # noqa: E402
from core.runs import calibration, engine  # noqa: E402
from core.values.choice import TRAINED  # noqa: E402
from support.app import APP, TIMEOUT, nav_click  # noqa: E402
from ui import cache, choices  # noqa: E402

PAGES = ("app_pages/explore.py", "app_pages/calibrate.py", "app_pages/sweep.py", "app_pages/theory.py")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("app-llama"), kv_heads=2)


@pytest.fixture
def llama_env(llama_dir, monkeypatch):
    monkeypatch.setenv(choices.ENV_MODEL, str(llama_dir))
    return llama_dir


def _explore(tokens: int | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    if tokens is not None:
        at.query_params.update(tokens=str(tokens))
    at.run()
    app_ok(at)
    return at


@pytest.mark.parametrize("page", PAGES)
def test_every_page_opens_alone_on_a_decoder(llama_env, page):
    """Each page on its own: no exception, no error, a pass-key document (not a masked-LM's prose)."""
    at = AppTest.from_file(str(APP).replace("app.py", page), default_timeout=TIMEOUT).run()
    app_ok(at)
    assert at.session_state["doc_task"] == "passkey"
    assert not any("Masked tokens" in c.value for c in at.sidebar.caption), "a decoder is not a masked-LM encoder"


def test_explore_reads_the_question_rows_causally(llama_env, llama_dir):
    """Explore's payload on a decoder: the question's rows are the prompt's last; the maps are causal and the
    payload veils their upper triangle; the left card's meters per layer are the library's run of the same document
    at tau = 1, and the ticks the L_tr reference's; the answer is the run's own."""
    at = _explore()
    header, chosen = scrubber_view(at)
    n = header["tokens"]
    qa, qb = header["question"]
    assert qb == n, "the question is last in the prompt"
    assert header["question_rows"] == list(range(qa, qb)), "question -> document attention is the question's rows"
    _, arrays = unpack_payload(at.get("bidi_component")[0].proto.bytes)
    veil = arrays["causal"].astype(float) / 255
    upper, lower = np.triu_indices_from(veil, 1), np.tril_indices_from(veil, -1)
    assert np.allclose(veil[upper], 1.0) and np.allclose(veil[lower], 0.0)
    base_map = arrays["base.map"]
    assert (base_map[upper] == 0).all(), "nothing above the diagonal of a causal map"
    assert "causal" in header["meta"]["map_note"] and "masked" not in header["meta"]["map_note"]
    assert "masked" not in header["base"], "a decoder answers: no masked-token card"

    loaded = load(str(llama_dir), device="cpu")
    doc = cache.document(loaded, at.session_state["doc_tokens"] and _request(at))
    probes = header_probes(at)
    mine = engine.run(loaded, doc, TRAINED, Pass(probes=probes))
    np.testing.assert_allclose(header["base"]["layer_pmax"], mine.probes.layer_pmax, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(header["base"]["layer_entropy"], mine.probes.layer_entropy, rtol=1e-4, atol=1e-6)
    assert header["base"]["answer"] == mine.answer and header["expected"] == mine.expected
    ref = engine.run(loaded, calibration.reference_document(loaded, doc), TRAINED, Pass(probes=probes))
    np.testing.assert_allclose(header["ref"]["layer_pmax"], ref.probes.layer_pmax, rtol=1e-4, atol=1e-6)


def _request(at: AppTest):
    from core.runs.settings import DocumentRequest

    ss = at.session_state
    return DocumentRequest(
        task=ss["doc_task"], tokens=int(ss["doc_tokens"]), depth=ss["doc_depth"] / 100, seed=int(ss["doc_seed"])
    )


def header_probes(at: AppTest):
    """The probes Explore records on a decoder (its map's layer and head, no cross-attention)."""
    from dataclasses import replace

    ss = at.session_state
    return replace(
        cache.explore_probes(ss["ex_layer"], None if ss["ex_head"] == "mean" else int(ss["ex_head"])), names=()
    )


def test_explore_past_ltr_tau_sharpens_and_the_distance_curves_replace_the_bias(llama_env):
    """At 2x L_tr a release at tau = 0.5 raises Pmax (the chosen card is the run at 0.5); the view controls
    offer no decoder layer of a cross-attention but the text window around the needle; the distance curves (the
    rotary's counterpart of T5's bias) draw one line per head."""
    at = _explore(2 * TRAIN_LENGTH)
    at.session_state["tau_value"] = 0.5
    at.run()
    app_ok(at)
    header, chosen = scrubber_view(at)
    if chosen is None:  # the frame is computed after the page is drawn; the component's poll brings it
        at.run()
        header, chosen = scrubber_view(at)
    assert chosen["tau"] == pytest.approx(0.5) and chosen["pmax"] > header["base"]["pmax"]
    assert not any(s.key == "ex_cross_layer" for s in at.selectbox)
    assert any(s.key == "ex_text_window" for s in at.slider)
    assert any(c.label == "self-attention" for c in at.checkbox), "tau's target named as the decoder has it"
    at.toggle(key="ex_show_bias").set_value(True).run()
    app_ok(at)
    assert any("relative distance" in h.value for h in at.subheader)
    (fig,) = at.get("plotly_chart")
    assert "head 0" in fig.proto.spec
    assert any("settings.json" in b.label for b in at.get("download_button")), "the export is the run's settings"


def test_calibrate_runs_algorithm_1_on_the_question_rows(llama_env):
    """Calibrate on a decoder at 2x L_tr: Algorithm 1's picks (or one clear line, never a traceback)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(tokens=str(2 * TRAIN_LENGTH))
    at.run()
    nav_click(at, "app_pages/calibrate.py")
    if any(b.key == "cal_run" for b in at.button):
        at.button(key="cal_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    labels = {m.label for m in at.metric}
    assert {"Algorithm 1 (pmax)", "Algorithm 1 (entropy)"} <= labels or len(at.error) == 1, (labels, at.error)


def test_sweep_scores_pass_keys_and_theory_draws(llama_env):
    """Sweep on a decoder is the pass-key grid (not the masked-LM table); Theory draws its curves."""
    at = _explore()
    nav_click(at, "app_pages/sweep.py")
    app_ok(at)
    assert any("accuracy over length" in t.value for t in at.title)
    sweep_one_cell(at, 1)
    app_ok(at)
    assert list(at.dataframe[0].value.columns) == [TRAIN_LENGTH]
    nav_click(at, "app_pages/theory.py")
    app_ok(at)
    assert at.get("plotly_chart")
    assert any("causal decoder" in c.value for c in at.caption)


def test_paste_mode_says_which_models_answer_free_questions(env):
    """On a bundled-style T5 (trained on pass keys only): paste mode says so, warns when the question is one's own,
    and offers SmolLM2-135M, whose button switches the Model box to it (the box then offers its fetch when it is
    not installed). No caption names a needle the text does not have."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.sidebar.radio(key="doc_mode").set_value("Paste").run()
    at.sidebar.text_area(key="doc_text").input("The coffee was roasted at dawn. " * 40).run()
    app_ok(at)
    assert any("generated tasks only" in c.value for c in at.sidebar.caption)
    at.sidebar.radio(key="doc_needle_mode").set_value(choices.NEEDLE_MODES[2]).run()
    at.sidebar.text_input(key="doc_question").input("When was the coffee roasted?").run()
    assert any("generated tasks only" in w.value for w in at.sidebar.warning), "a question of one's own: a warning"
    header, _ = scrubber_view(at)
    assert header["needle"] is None and "needle" not in header["meta"]["map_note"].split("no needle")[0]
    at.button(key="paste_real_llm").click()
    at.run(timeout=TIMEOUT)
    assert at.session_state["model_choice"] == choices.REAL_LLM


def test_paste_mode_on_a_decoder_says_it_answers(llama_env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.sidebar.radio(key="doc_mode").set_value("Paste").run()
    at.sidebar.text_area(key="doc_text").input("The coffee was roasted at dawn. " * 20).run()
    app_ok(at)
    assert any("answers questions of your own" in c.value for c in at.sidebar.caption)
    assert not any(b.key == "paste_real_llm" for b in at.button)


def test_the_tour_speaks_of_a_decoder_as_a_decoder(llama_env):
    """The guided tour on a decoder-only LLM: not the masked-LM paragraph (it has a pass key to find) and not the
    T5 steps (their 8 x L_tr is hours a pass on a CPU for a real LLM), but the same lesson at a size a CPU shows."""
    at = _explore()
    said = " ".join(i.value for i in at.info)
    assert "decoder-only LLM" in said and "masked-LM encoder" not in said
    assert not any(b.key and b.key.startswith("tour_") for b in at.button)


def test_the_model_box_names_a_decoder_as_one(llama_env):
    """The Model box's caption on a decoder-only LLM: causal self-attention and its key/value heads, not the
    masked-LM encoder's line."""
    at = _explore()
    said = " ".join(c.value for c in at.sidebar.caption)
    assert "decoder-only LLM" in said and "2 key/value heads" in said and "masked-LM encoder" not in said
