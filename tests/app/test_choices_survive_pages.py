"""Issue 41 through AppTest: every choice survives page changes, also one made in Explore's fragment rerun.

What happened in the browser: a tau or method change inside Explore's
``st.fragment`` reruns only the fragment, and a click on "Calibrate" then runs
the page-change cleanup (``SessionState._remove_stale_widgets``), which deletes
the value of every widget the new page does not draw. Re-assigning every key
to itself at the start of each full run (Streamlit's older recipe) does not
survive that: the fragment rerun was the last run, and the value was gone by
the time the next full run could copy it (checked in a real browser on
Streamlit 1.67). Now every choice's widget is drawn with
``persist_state="session"`` (:data:`ui.choices.KEEP`), and Streamlit keeps it.

AppTest has no public fragment rerun or navigation click, so
:func:`fragment_run` and :func:`nav_click` emulate the browser's two requests
with AppTest's own runner: a rerun request carrying the fragment's id; a page
request carrying the widget states of the entry file's widgets only (the
browser's ``onPageChange`` keeps the main script's elements and sends their
states), none here since ``app.py`` draws no widget. Every AppTest page change
of the app's tests goes through :func:`nav_click`: AppTest's own
``switch_page(page).run()`` also sends the old page's widget states, which no
browser does, and with those Streamlit 1.67 registers a persisted widget on
the new page at its default (the length at 16, the targets off).
:func:`test_the_browsers_sequence_loses_nothing` is the teacher's sequence;
:func:`test_a_tau_change_in_the_fragment_is_the_last_action` moves tau last.

The app's model is the tiny random T5 of tests/app/test_pages.py (ByT5 bytes, L_tr = 256).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import app_model_of, app_ok, build_tiny_t5  # noqa: E402
from support.app import fragment_run, nav_click  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
EXPLORE, CALIBRATE = "app_pages/explore.py", "app_pages/calibrate.py"
TIMEOUT = 180
TEXT = "The river bends twice before the mill. Lanterns hang by the door. " * 6


app_model = app_model_of("state-t5")


@pytest.fixture
def cos_env(tmp_path, monkeypatch):
    folder = build_tiny_t5(tmp_path / "cos-t5", train_length=256, cosine=24.0, seed=1)
    monkeypatch.setenv("AAE_MODEL", str(folder))
    return folder


# -- the browser's two requests, through AppTest's runner ---------------------------------

# -- tests ---------------------------------------------------------------------------------


def test_the_browsers_sequence_loses_nothing(env):
    """Length (sidebar), then a tau chosen by a component and a method change in the fragment, then Calibrate."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    app_ok(at)
    at.sidebar.number_input(key="doc_tokens").set_value(384).run()
    at.sidebar.slider(key="doc_depth").set_value(30).run()
    app_ok(at)
    # a component's release writes the session's tau (ui/scrubber.py), then the fragment reruns
    at.session_state["tau_value"] = 0.7
    fragment_run(at)
    at.selectbox(key="tau_method").set_value("log-length")
    fragment_run(at)  # the last action: a method change inside the fragment
    assert at.session_state["tau_method"] == "log-length"

    nav_click(at, CALIBRATE)
    app_ok(at)
    ss = at.session_state
    assert (ss["doc_tokens"], ss["doc_depth"], ss["tau_method"]) == (384, 30, "log-length")
    assert at.sidebar.number_input(key="doc_tokens").value == 384
    assert at.sidebar.selectbox(key="tau_method").value == "log-length"
    slider = at.sidebar.slider(key="tau_value")
    assert slider.disabled and slider.value < 1.0, "the disabled slider shows the method's tau"
    at.sidebar.selectbox(key="tau_method").set_value("fixed").run()
    assert at.sidebar.slider(key="tau_value").value == pytest.approx(0.7), "the person's own tau comes back"

    nav_click(at, EXPLORE)
    app_ok(at)
    ss = at.session_state
    assert (ss["doc_tokens"], ss["doc_depth"], ss["tau_method"]) == (384, 30, "fixed")
    assert ss["tau_value"] == pytest.approx(0.7)
    assert at.sidebar.number_input(key="doc_tokens").value == 384
    assert dict(at.query_params).get("tau") in ("0.70", ["0.70"])


def test_a_model_change_reaching_only_the_fragment_reruns_the_page(env):
    """A rerun of Explore's fragment alone that carries another model in the Model box (the browser's request for
    the box's change folded into a fragment's): the whole page runs with it, not the old model's views under a box
    that names the new one."""
    from ui import choices

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    app_ok(at)
    old = at.session_state["_model_ref"]
    other = next(m for m in choices.model_options() if m != old and m == "retrieval-t5")
    at.sidebar.selectbox(key="model_choice").set_value(other)  # in the box, not run yet
    fragment_run(at)
    app_ok(at)
    assert at.session_state["_model_ref"] == other
    assert any(other in c.value and "L_tr" in c.value for c in [*at.sidebar.markdown, *at.sidebar.caption]), (
        "the sidebar describes the model the box names"
    )


def test_a_tau_change_in_the_fragment_is_the_last_action(env):
    """Model box, pasted text, length, targets, then tau moved in Explore's panel (a fragment rerun) as the very last
    action before a navigation click: every choice is on Calibrate, and back on Explore."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.sidebar.text_input(key="model_other").input(str(env)).run()  # the same tiny model, by its folder
    at.sidebar.number_input(key="doc_tokens").set_value(320).run()
    at.sidebar.radio(key="doc_mode").set_value("Paste").run()
    at.sidebar.text_area(key="doc_text").input(TEXT).run()
    app_ok(at)
    at.checkbox(key="tgt_decoder").check()
    fragment_run(at)
    at.session_state["tau_value"] = 0.65  # the scrubber's release (ui/scrubber.py), then its fragment rerun
    fragment_run(at)
    want = {
        "model_other": str(env),
        "doc_mode": "Paste",
        "doc_text": TEXT,
        "doc_tokens": 320,
        "tgt_decoder": True,
        "tau_method": "fixed",
    }
    for page in (CALIBRATE, EXPLORE):
        nav_click(at, page)
        app_ok(at)
        assert {k: at.session_state[k] for k in want} == want, page
        assert at.session_state["tau_value"] == pytest.approx(0.65), page
        assert at.sidebar.text_area(key="doc_text").value == TEXT, page
        assert at.checkbox(key="tgt_decoder").value, page
        assert dict(at.query_params).get("tau") in ("0.65", ["0.65"]), page
    assert at.sidebar.text_input(key="model_other").value == str(env)
    at.sidebar.radio(key="doc_mode").set_value("Generate").run()  # the pasted text, hidden, is kept too
    assert at.sidebar.number_input(key="doc_tokens").value == 320
    at.sidebar.radio(key="doc_mode").set_value("Paste").run()
    assert at.sidebar.text_area(key="doc_text").value == TEXT


def test_pasted_text_needle_and_method_survive_a_fragment_change_and_a_page_change(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.sidebar.radio(key="doc_mode").set_value("Paste").run()
    at.sidebar.text_area(key="doc_text").input(TEXT).run()
    at.sidebar.radio(key="doc_needle_mode").set_value("my needle + question").run()
    at.sidebar.text_input(key="doc_needle").input("The lantern is green.")
    at.sidebar.text_input(key="doc_question").input("What colour is the lantern?")
    at.sidebar.text_input(key="doc_expected").input("green").run()
    app_ok(at)
    at.selectbox(key="tau_method").set_value("yarn")
    fragment_run(at)
    want = {
        "doc_mode": "Paste",
        "doc_text": TEXT,
        "doc_needle_mode": "my needle + question",
        "doc_needle": "The lantern is green.",
        "doc_question": "What colour is the lantern?",
        "doc_expected": "green",
        "tau_method": "yarn",
    }
    for page in (CALIBRATE, EXPLORE, CALIBRATE):
        nav_click(at, page)
        app_ok(at)
        assert {k: at.session_state[k] for k in want} == want, page
        assert at.sidebar.text_area(key="doc_text").value == TEXT, page
        assert at.sidebar.text_input(key="doc_needle").value == "The lantern is green.", page
        assert at.selectbox(key="tau_method").value == "yarn", page


def test_every_choice_survives_every_page(env):
    """Widgets set through the UI, the method last (Explore's temperature panel, a full run), then every page."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.sidebar.number_input(key="doc_tokens").set_value(320).run()
    at.sidebar.number_input(key="doc_seed").set_value(7).run()
    at.checkbox(key="tgt_decoder").check().run()
    at.session_state["tau_value"] = 0.8  # what the scrubber's release writes
    at.run()
    at.selectbox(key="tau_method").set_value("log-length").run()
    app_ok(at)
    for page in (CALIBRATE, "app_pages/sweep.py", "app_pages/theory.py", EXPLORE):
        nav_click(at, page)
        app_ok(at)
        ss = at.session_state
        got = (ss["doc_tokens"], ss["doc_seed"], ss["tgt_decoder"], ss["tau_method"])
        assert got == (320, 7, True, "log-length"), page
    at.selectbox(key="tau_method").set_value("fixed").run()
    assert at.session_state["tau_value"] == pytest.approx(0.8)


def test_disabled_slider_shows_the_resolved_tau_and_fixed_brings_back_the_own(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    nav_click(at, CALIBRATE)
    at.sidebar.button(key="len_8x").click().run()
    at.sidebar.slider(key="tau_value").set_value(0.9).run()
    for method in ("log-length", "yarn", "per-layer"):
        at.sidebar.selectbox(key="tau_method").set_value(method).run()
        app_ok(at)
        slider = at.sidebar.slider(key="tau_value")
        shown = [c.value for c in at.sidebar.caption if "resolves to **tau = " in c.value][0]
        mean = float(shown.split("tau = ")[1].split()[0].strip("*"))
        assert slider.disabled, method
        assert slider.value == pytest.approx(round(mean, 2), abs=0.0101), (method, shown)
        assert slider.value < 1.0, method
        assert at.session_state["_aae_own_tau"] == pytest.approx(0.9), method  # the person's own, kept aside
    at.sidebar.selectbox(key="tau_method").set_value("fixed").run()
    assert at.sidebar.slider(key="tau_value").value == pytest.approx(0.9)
    assert not at.sidebar.slider(key="tau_value").disabled
    assert dict(at.query_params).get("tau") in ("0.90", ["0.90"])


def test_temperature_controls_without_the_slider(env, monkeypatch):
    """``slider=False`` draws method, targets (and CosScale) but no "tau (fixed)" slider, and still resolves."""
    from ui import tau_controls

    seen = {}
    plain = tau_controls.temperature_controls

    def spy(where, loaded, req, **kw):
        t = plain(where, loaded, req, slider=False)
        seen["t"] = t
        return t

    monkeypatch.setattr(tau_controls, "temperature_controls", spy)
    at = AppTest.from_file(str(ROOT / CALIBRATE), default_timeout=TIMEOUT).run()
    app_ok(at)
    assert not [s for s in at.slider if s.key == "tau_value"]
    assert at.sidebar.selectbox(key="tau_method").value == "fixed"
    choice, _, _ = seen["t"]
    assert choice.method == "fixed" and float(choice.tau) == pytest.approx(1.0)


def test_not_reached_note_says_it_plainly():
    from ui.tau_controls import not_reached_note

    text = not_reached_note(
        {"gap": -0.0079, "grid": [1.0, 0.9, 0.8, 0.7, 0.6, 0.5], "tau": 0.5, "reached": False}, "0.500"
    )
    assert "stays 0.0079 below the L_tr reference down to tau = 0.50, the end of the range searched" in text
    assert "log-length or YaRN" in text
    assert "-0.0079" not in text and "short by" not in text
    above = not_reached_note(
        {"gap": 0.012, "grid": [1.0, 0.5], "tau": 1.0, "unreached_heads": [[0, 1], [1, 2]]}, "1.000"
    )
    assert "already 0.0120 above the L_tr reference at tau = 1.00" in above and "2 heads" in above


def test_cosscale_travels_in_the_link(cos_env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    app_ok(at)
    assert dict(at.query_params).get("s") in ("24", ["24"])
    at.slider(key="cos_scale").set_value(12.5).run()
    app_ok(at)
    assert dict(at.query_params).get("s") in ("12.5", ["12.5"])
    # a shared link opens at its s
    link = {k: (v[0] if isinstance(v, list) else v) for k, v in dict(at.query_params).items()}
    other = AppTest.from_file(APP, default_timeout=TIMEOUT)
    other.query_params.update(link)
    other.run()
    app_ok(other)
    assert other.session_state["cos_scale"] == pytest.approx(12.5)
    assert other.slider(key="cos_scale").value == pytest.approx(12.5)
    # and keeps it across a page change
    nav_click(other, CALIBRATE)
    assert other.sidebar.slider(key="cos_scale").value == pytest.approx(12.5)


def test_a_bad_cosscale_in_a_link_gets_a_message(cos_env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(s="abc", tau="0.8")
    at.run()
    assert not at.exception
    (err,) = at.sidebar.error
    assert "s='abc'" in err.value
    assert at.session_state["cos_scale"] == pytest.approx(24.0)  # left as it was (the model's own)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(s="5000")  # beyond this model's slider (1-96)
    at.run()
    assert not at.exception
    assert any("s=5000" in e.value for e in at.error)
    assert at.session_state["cos_scale"] == pytest.approx(24.0)


def test_a_dot_product_model_has_no_s_in_its_link(env):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(s="12", tau="0.8")
    at.run()
    app_ok(at)
    assert "s" not in dict(at.query_params)
    assert at.session_state["tau_value"] == pytest.approx(0.8)


def test_user_errors_show_the_apps_wording(env, monkeypatch):
    """A UserError's app text (``err.app``: no command-line flags, no server paths) is what the sidebar shows."""
    from core.errors import UserError
    from ui import cache

    def refuse(*a, **k):
        err = UserError("Use a shorter document (--tokens 512) or /srv/models/x.")
        err.app = "Use a shorter document (the Length in tokens box)."
        raise err

    monkeypatch.setattr(cache, "token_count", refuse)
    at = AppTest.from_file(str(ROOT / CALIBRATE), default_timeout=TIMEOUT).run()
    assert not at.exception
    text = " ".join(e.value for e in at.error)
    assert "Length in tokens box" in text
    assert "--tokens" not in text and "/srv/" not in text


def test_each_pages_own_settings_survive_a_round_trip(env):
    """A page's own controls (Sweep's lengths and seeds, Theory's multiples, Explore's map layer) are kept when
    the person goes to another page and back: each widget is drawn with ``persist_state`` (without it Streamlit
    deletes a widget's value on the first run of a page that does not draw it)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    app_ok(at)
    at.selectbox(key="ex_layer").set_value(1).run()
    nav_click(at, "app_pages/sweep.py")
    app_ok(at)
    at.multiselect(key="sw_lengths").set_value([1, 16]).run()
    at.number_input(key="sw_seeds").set_value(3).run()
    nav_click(at, "app_pages/theory.py")
    app_ok(at)
    at.multiselect(key="th_multiples").set_value([1, 2]).run()
    for page in (CALIBRATE, EXPLORE, "app_pages/sweep.py", "app_pages/theory.py"):
        nav_click(at, page)
        app_ok(at)
        ss = at.session_state
        assert (ss["ex_layer"], list(ss["sw_lengths"]), ss["sw_seeds"], list(ss["th_multiples"])) == (
            1,
            [1, 16],
            3,
            [1, 2],
        ), page
    assert at.multiselect(key="th_multiples").value == [1, 2]


def _path_of(node, text: str, path: tuple = ()) -> tuple | None:
    """Where in the page's element tree (the block indexes down to it) the element whose value holds ``text`` is."""
    if isinstance(getattr(node, "value", None), str) and text in node.value:
        return path
    for i, child in getattr(node, "children", {}).items():
        found = _path_of(child, text, (*path, i))
        if found is not None:
            return found
    return None


@pytest.mark.slow
def test_the_panels_elements_keep_their_slots_after_a_resolve(env):
    """The run that resolves a method and the next one draw the panel's elements in the same slots. A slot drawn
    only while resolving (the estimate's) moved every later element by one in the next run, and until that run
    ended the browser showed the old element of the next slot beside the new one: the answer cards jumped 61 px
    down at tour step 4 (a class walkthrough, 1400 x 1000)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    app_ok(at)
    at.sidebar.number_input(key="doc_tokens").set_value(352).run()  # a document no other test resolved
    at.selectbox(key="tau_method").set_value("pmax").run()  # this run resolves Algorithm 1 (its estimate shows)
    app_ok(at)
    resolving = _path_of(at.main, "resolves to **tau =")
    assert resolving is not None
    at.run()  # the resolve is cached now: nothing to estimate
    app_ok(at)
    assert _path_of(at.main, "resolves to **tau =") == resolving
