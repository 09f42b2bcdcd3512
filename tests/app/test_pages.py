"""The Streamlit app through AppTest: every page renders, tau moves the numbers, user errors show as st.error.

The app's default model comes from AAE_MODEL: a tiny random T5 (ByT5 bytes,
L_tr = 256, the smallest length that holds the pass key task) built once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import app_error_text, app_ok, build_tiny_t5, concurrent_sessions, scrubber_view, sweep_one_cell  # noqa: E402
from support.app import nav_click  # noqa: E402 (a page change as the browser's navigation sends it)

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
PAGES = ("app_pages/explore.py", "app_pages/calibrate.py", "app_pages/sweep.py", "app_pages/theory.py")
TIMEOUT = 120


_ok = app_ok


def _metric(at: AppTest, label: str) -> float:
    (m,) = [m for m in at.metric if m.label == label]
    return float(m.value)


def test_every_page_through_navigation(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    _ok(at)
    assert not at.get("plotly_chart"), "no plotly chart on the landing page (a new tab loads none of its JavaScript)"
    at.toggle(key="ex_show_bias").set_value(True).run()
    _ok(at)
    assert at.get("plotly_chart"), "Explore draws its bias curves behind the switch"
    header, chosen = scrubber_view(at)
    assert chosen["pmax"] == header["base"]["pmax"], "Explore's scrubber opens at tau = 1"
    at.session_state["tau_value"] = 0.8  # what a slider release writes; it must survive page switches
    at.run()
    for page in PAGES[1:] + PAGES[:1]:
        nav_click(at, page)
        _ok(at)
        assert at.title, page
        assert at.session_state["tau_value"] == pytest.approx(0.8), page
        if page != PAGES[0]:  # the other pages keep the slider in the sidebar; Explore's is the scrubber's
            assert at.slider(key="tau_value").value == pytest.approx(0.8), page
    assert scrubber_view(at)[0]["meta"]["tau"] == pytest.approx(0.8)


@pytest.mark.parametrize("page", PAGES)
def test_page_runs_alone(env, page):
    at = AppTest.from_file(str(ROOT / page), default_timeout=TIMEOUT).run()
    _ok(at)
    assert at.sidebar.selectbox(key="model_choice").value == str(env)
    assert at.caption, "every view explains itself"


def test_tau_slider_raises_pmax(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    _ok(at)
    assert at.selectbox(key="tau_method").value == "fixed"
    header, chosen = scrubber_view(at)
    before = chosen["pmax"]
    assert header["base"]["pmax"] == pytest.approx(before)
    at.session_state["tau_value"] = 0.6  # a release of the scrubber's slider
    at.run()
    _ok(at)
    header, chosen = scrubber_view(at)
    after = chosen["pmax"]
    assert after > before + 0.01, (before, after)
    assert header["base"]["pmax"] == pytest.approx(before)  # the tau = 1 card stays
    assert chosen["entropy"] < header["base"]["entropy"]
    assert header["meta"]["tau"] == pytest.approx(0.6) and chosen["tau"] == pytest.approx(0.6)
    # Back to 1.0: served from the cache, same number as the first run.
    at.session_state["tau_value"] = 1.0
    at.run()
    assert scrubber_view(at)[1]["pmax"] == pytest.approx(before)


def test_tour_first_step_sets_the_sidebar(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.button(key="tour_0").click().run()
    _ok(at)
    assert at.session_state["tau_method"] == "none"
    assert at.session_state["doc_tokens"] == 256
    assert any("Step 1" in i.value for i in at.info)


def test_explore_shows_where_the_answer_looks(tmp_path, monkeypatch):
    """The cross-attention view: the answer's rows over the document at both temperatures, one decoder layer
    or their mean, its table to download."""
    folder = build_tiny_t5(tmp_path / "two-decoder-layers", train_length=256, decoder_layers=2)
    monkeypatch.setenv("AAE_MODEL", str(folder))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    _ok(at)
    header, chosen = scrubber_view(at)
    assert len(chosen["cross_tokens"]) >= 1 and chosen["needle_share"] is not None
    layer = at.selectbox(key="ex_cross_layer")
    assert layer.value == "mean" and layer.options == ["mean", "layer 0", "layer 1"]
    mean_share = chosen["needle_share"]
    layer.set_value(1).run()
    _ok(at)
    assert at.session_state["ex_cross_layer"] == 1
    assert scrubber_view(at)[1]["needle_share"] != mean_share  # one layer's share, not the mean's
    assert any(b.proto.label == "answer_attention.csv" for b in at.get("download_button"))


def test_calibrate_use_this_tau_and_export(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    nav_click(at, "app_pages/calibrate.py")
    if any(b.key == "cal_run" for b in at.button):  # not there when the background grid already holds the curves
        at.button(key="cal_run").click().run()
    _ok(at)
    labels = [m.label for m in at.metric]
    assert "Algorithm 1 (pmax)" in labels and "Algorithm 1 (entropy)" in labels
    methods = set(at.dataframe[0].value["label"])
    assert {"InfoScale", "Prop. 1 (match Pmax)", "Algorithm 1, Pmax"} <= methods
    at.button(key="use_pmax").click().run()
    _ok(at)
    assert at.session_state["tau_method"] == "fixed"
    assert 0.3 <= at.session_state["tau_value"] <= 1.0
    assert any("python -m core run --settings choice.json" in c.value for c in at.code)
    assert any('"schema": "attention-alignment-explorer/settings@1"' in c.value for c in at.code)


def test_sweep_runs_one_cell(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    nav_click(at, "app_pages/sweep.py")
    sweep_one_cell(at, 1)
    _ok(at)
    table = at.dataframe[0].value
    assert list(table.index) == ["none (tau = 1)"] and list(table.columns) == [256]
    assert len(at.get("plotly_chart")) == 2


def test_theory_measures_lengths(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    nav_click(at, "app_pages/theory.py")
    at.multiselect(key="th_multiples").set_value([1, 2]).run()
    at.button(key="th_measure").click().run()
    _ok(at)
    stats = at.dataframe[0].value
    assert len(stats) == 2 and stats["tokens"].is_monotonic_increasing


# -- errors a person can act on -----------------------------------------------------------


def test_paste_mode_opens_without_an_error(env):
    """Paste mode before anything is typed (or only blanks): a note saying what to paste, no red error, and the
    sidebar says a shared link does not carry the text (issue 50, point 6)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.sidebar.radio(key="doc_mode").set_value("Paste").run()
    for text in ("", "   \n "):
        at.sidebar.text_area(key="doc_text").input(text).run()
        assert not at.exception and not at.error, [e.value for e in at.error]
        assert any("Paste mode." in i.value for i in at.info)
        assert any("does not carry the pasted text" in c.value for c in at.sidebar.caption)


def test_document_too_long_shows_engine_message(env, monkeypatch):
    from core.runs import engine

    monkeypatch.setattr(engine, "max_tokens", lambda loaded, batch=1, chunk_bytes=0: 100)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    msg = app_error_text(at)
    assert "at most about 100 tokens" in msg and "Use a shorter document" in msg


def test_unknown_model_error(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.sidebar.text_input(key="model_other").input("no-such-model-xyz").run()
    assert "Unknown model 'no-such-model-xyz'" in app_error_text(at)


def test_not_t5_model_error(env, tmp_path):
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(
        tmp_path
    )
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.sidebar.text_input(key="model_other").input(str(tmp_path)).run()
    assert "not T5-family" in app_error_text(at)


def test_nan_attention_error(env, tmp_path):
    import torch
    from transformers import T5ForConditionalGeneration

    folder = build_tiny_t5(tmp_path / "nan-t5", train_length=256)
    model = T5ForConditionalGeneration.from_pretrained(folder)
    with torch.no_grad():
        model.encoder.block[0].layer[0].SelfAttention.q.weight.fill_(float("nan"))
    model.save_pretrained(folder, safe_serialization=True)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.sidebar.text_input(key="model_other").input(str(folder)).run()
    assert "NaN/inf appeared in the attention" in app_error_text(at)


def test_measured_method_resolves_beside_the_cards(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.selectbox(key="tau_method").set_value("pmax").run()
    _ok(at)
    shown = " ".join(m.value for m in at.caption)
    assert "resolves to **tau = " in shown
    meta = scrubber_view(at)[0]["meta"]
    # the scrubber's slider is disabled and shows the resolved tau, not the person's own 1.00
    assert meta["disabled"] and meta["tau"] == pytest.approx(
        round(float(shown.split("resolves to **tau = ")[1][:5]), 2)
    )


def test_pasted_text_with_own_needle(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.sidebar.radio(key="doc_mode").set_value("Paste").run()
    at.sidebar.text_area(key="doc_text").input("The sky is blue. The grass is green. " * 4).run()
    at.sidebar.radio(key="doc_needle_mode").set_value("my needle + question").run()
    at.sidebar.text_input(key="doc_needle").input("The secret colour is teal.")
    at.sidebar.text_input(key="doc_question").input("What is the secret colour?")
    at.sidebar.text_input(key="doc_expected").input("teal").run()
    _ok(at)
    assert scrubber_view(at)[0]["expected"] == "teal"


def test_cosine_model_has_cosscale_and_histogram(tmp_path, monkeypatch):
    folder = build_tiny_t5(tmp_path / "cos-t5", train_length=256, cosine=24.0, seed=1)
    monkeypatch.setenv("AAE_MODEL", str(folder))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    _ok(at)
    assert at.slider(key="cos_scale").value == pytest.approx(24.0)
    at.slider(key="cos_scale").set_value(12.0).run()
    _ok(at)
    header, chosen = scrubber_view(at)
    # Left: the model as trained (its own s, tau = 1); right: the chosen s. Moving s moves only the right one.
    assert header["base"]["cosine_scale"] is None and "s = 24" in header["meta"]["base_label"]
    trained = header["base"]["pmax"]
    at.session_state["tau_value"] = 0.7
    at.run()
    header, chosen = scrubber_view(at)
    assert header["base"]["pmax"] == trained and chosen["cosine_scale"] == 12.0 and chosen["pmax"] != trained
    # The slider can scrub s instead: a grid of scales at the chosen tau, the trained s among them
    at.radio(key="ex_axis").set_value("s").run()
    _ok(at)
    header, chosen = scrubber_view(at)
    assert header["meta"]["axis"]["name"] == "s" and 24.0 in header["grid"] and header["meta"]["value"] == 12.0
    # one control moves s (issue 50): the scrubber's, and the panel says which s it holds instead of a second slider
    assert [w.key for w in at.slider if w.key == "cos_scale"] == []
    assert any("CosScale s = **12**" in c.value and "the slider below moves it" in c.value for c in at.caption)
    at.session_state["cos_scale"] = 24.0
    at.run()
    header, chosen = scrubber_view(at)
    assert chosen["cosine_scale"] == 24.0 and chosen["tau"] == pytest.approx(0.7)
    assert dict(at.query_params).get("s") in ("24", ["24"], "24.0", ["24.0"])  # a shared link keeps s
    nav_click(at, "app_pages/theory.py")
    _ok(at)
    assert any("cos(q, k)" in h.value for h in at.subheader)


def test_default_bundled_model(monkeypatch):
    """With no AAE_MODEL the app opens on the bundled default model, and tau 1.0 -> 0.6 raises Pmax."""
    from core.models import default_model

    if default_model() is None:
        pytest.skip("no bundled model in assets/models")
    monkeypatch.delenv("AAE_MODEL", raising=False)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    _ok(at)
    assert at.sidebar.selectbox(key="model_choice").value == default_model()
    before = scrubber_view(at)[1]["pmax"]
    at.session_state["tau_value"] = 0.6
    at.run()
    _ok(at)
    assert scrubber_view(at)[1]["pmax"] > before


def test_a_link_reopens_the_view(env):
    """Query parameters set model, document and temperature; the app writes the view back into the URL."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(
        model=str(env), task="passkey", tokens="512", depth="30", seed="3", method="fixed", tau="0.7"
    )
    at.run()
    _ok(at)
    ss = at.session_state
    assert (ss["doc_task"], ss["doc_tokens"], ss["doc_depth"], ss["doc_seed"]) == ("passkey", 512, 30, 3)
    assert ss["tau_method"] == "fixed" and ss["tau_value"] == pytest.approx(0.7)
    assert scrubber_view(at)[0]["meta"]["tau"] == pytest.approx(0.7)
    assert dict(at.query_params)["tau"] in ("0.70", ["0.70"])
    # a tau move is written back, so copying the address bar shares it
    at.session_state["tau_value"] = 0.6
    at.run()
    _ok(at)
    assert dict(at.query_params)["tau"] in ("0.60", ["0.60"])


def test_a_link_in_multiples_of_ltr(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(tokens="2x", method="log-length")
    at.run()
    _ok(at)
    assert at.session_state["doc_tokens"] == 2 * 256
    assert at.session_state["tau_method"] == "log-length"


def test_bad_link_values_get_one_message(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(tau="abc", tokens="-5", method="nope", depth="nan", seed="1")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    (err,) = at.sidebar.error
    for name in ("tau=", "tokens=", "method=", "depth="):
        assert name in err.value
    assert at.session_state["doc_seed"] == 1  # the usable value is taken
    assert at.session_state["tau_value"] == pytest.approx(1.0)  # the others are left as they were
    assert scrubber_view(at)[1]["pmax"] > 0, "the page still works"


def test_unknown_model_in_a_link(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(model="no-such-model-xyz")
    at.run()
    assert not at.exception
    assert "no-such-model-xyz" in " ".join(e.value for e in at.error)


def test_sessions_at_different_taus_at_once_keep_their_own(env, monkeypatch):
    """Three browser sessions move tau at the same time; each sees exactly what a lone session sees at its tau.

    Settings travel with each call (never a module global), and passes share one
    gate and one cache: a leak between sessions would show as another session's
    Pmax in this one's card.
    """
    import concurrent.futures as cf

    concurrent_sessions(monkeypatch)
    taus = (0.6, 0.8, 1.0)
    alone = {}
    for t in taus:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
        at.session_state["tau_value"] = t
        at.run()
        _ok(at)
        alone[t] = scrubber_view(at)[1]["pmax"]
    assert len(set(alone.values())) == len(taus)  # the taus do give different numbers

    sessions = [AppTest.from_file(APP, default_timeout=TIMEOUT).run() for _ in taus]

    def move(at: AppTest, t: float) -> float:
        at.session_state["tau_value"] = t
        at.run()
        _ok(at)
        return scrubber_view(at)[1]["pmax"]

    for order in (taus, taus[::-1]):  # and then each session to another tau, at once again
        with cf.ThreadPoolExecutor(len(taus)) as pool:
            got = list(pool.map(move, sessions, order))
        assert got == pytest.approx([alone[t] for t in order])


def test_sweep_page_visits_leak_no_file_descriptors(env):
    import os

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def visit() -> None:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
        nav_click(at, "app_pages/sweep.py")
        _ok(at)

    visit()  # the first visit loads the model and opens what stays open (caches, the model's files)
    before = fds()
    for _ in range(6):
        visit()
    assert fds() - before < 3, "each Sweep page visit left a file descriptor open"


@pytest.mark.parametrize(
    "card",
    [{"train_length": 3_000_000}, {"train_length": 1_000_000_000}, ["not", "a", "card"], {"train_length": "512"}],
)
def test_a_hostile_model_card_is_one_message(env, tmp_path, card):
    """A folder whose card.json claims a huge L_tr (the default document is L_tr long) or is malformed.

    Before, the app built the 1e9-token document and took the machine down with it.
    """
    import json
    import shutil

    folder = tmp_path / "hostile"
    shutil.copytree(env, folder)
    (folder / "card.json").write_text(json.dumps(card))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.sidebar.text_input(key="model_other").input(str(folder)).run()
    assert not at.exception
    msg = app_error_text(at)
    assert "card.json" in msg or "at most about" in msg, msg


@pytest.fixture
def lm_env(tmp_path, monkeypatch):
    """A tiny model whose card says it is a language model (tasks ["lm"]): the app opens it on the lm task."""
    import json

    folder = build_tiny_t5(tmp_path / "lm-t5", train_length=128)
    (folder / "card.json").write_text(json.dumps({"train_length": 128, "tasks": ["lm"]}))
    monkeypatch.setenv("AAE_MODEL", str(folder))
    return folder


def test_explore_shows_perplexity_for_a_language_model(lm_env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    _ok(at)
    assert at.session_state["doc_task"] == "lm"
    header, chosen = scrubber_view(at)
    assert header["base"]["perplexity"] > 1 and chosen["perplexity"] > 1  # tau = 1 and the chosen tau
    at.session_state["tau_method"] = "fixed"
    at.session_state["tau_value"] = 0.5
    at.run()
    _ok(at)
    header, chosen = scrubber_view(at)
    assert header["base"]["perplexity"] != chosen["perplexity"]  # the temperature reaches the perplexity


def test_sweep_page_draws_perplexity_for_a_language_model(lm_env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    nav_click(at, "app_pages/sweep.py")
    _ok(at)
    at.multiselect(key="lm_lengths").set_value([1, 2])
    at.multiselect(key="lm_methods").set_value(["none"])
    at.number_input(key="lm_sequences").set_value(2)
    at.button(key="lm_start").click().run()
    _ok(at)
    table = at.dataframe[0].value
    assert list(table.index) == ["none (tau = 1)"] and list(table.columns) == [128, 256]
    assert (table.to_numpy() > 1).all() and len(at.get("plotly_chart")) == 1


def test_filler_choice_makes_every_seed_another_haystack(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    _ok(at)
    assert at.selectbox(key="doc_haystack").value == "default"
    at.selectbox(key="doc_haystack").set_value("corpus-eval").run()
    _ok(at)
    assert dict(at.query_params).get("filler") in ("corpus-eval", ["corpus-eval"])
    at.selectbox(key="doc_task").set_value("lm").run()  # lm reads its own held-out pool: no choice offered
    _ok(at)
    assert not [s for s in at.selectbox if s.key == "doc_haystack"]


def test_a_language_model_opened_from_a_link_gets_its_task(lm_env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(tokens="256")  # a link without a task: the model's kind of document
    at.run()
    _ok(at)
    assert at.session_state["doc_task"] == "lm" and at.session_state["doc_tokens"] == 256
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(task="passkey", tokens="300")  # a link naming a task keeps it
    at.run()
    assert at.session_state["doc_task"] == "passkey"
    # this byte-level model's L_tr (128) cannot hold a pass key document: one message, no traceback
    assert not at.exception and any("No L_tr reference" in e.value for e in at.error)
