"""Issue 41 in a real browser: choices made inside Explore's live fragment survive a page change.

A tau or method change inside Explore's ``st.fragment`` was the last run before
the user clicked "Calibrate" in the navigation; Streamlit's page-change cleanup
then dropped every widget value (length, pasted text, needle, method), and
Explore stayed reset afterwards. These tests drive the same steps through the
UI: a sidebar choice, then tau or the method moved in Explore's panel, a click
on "Calibrate" in the navigation, a click back to "Explore", and the widgets
read back.

Explore's tau slider is either the panel's Streamlit slider (key
``tau_value``) or the scrubber component's own range input (``aria-label=tau``,
moved one grid step with PageDown); either way its release reruns the fragment
and the URL gets the new tau.

Skipped when /usr/bin/chromium or playwright is missing (like test_browser.py,
whose waiting helper, :func:`test_browser.settle`, these use; the server and
the browser are this module's own).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import build_tiny_t5
from support.browser import CHROMIUM, choose, go, serving, settle

ROOT = Path(__file__).resolve().parents[2]

LENGTH = 384  # not L_tr (256), not a multiple button: only a typed length gives this
TAU = 0.95  # one grid step below 1 (the scrubber's PageDown)
CLOSED_FORM = "log-length"  # a method that needs no forward pass (quick), and not "fixed"
PANEL_SLIDER = '.st-key-tau_value input[type="range"]'
COMPONENT_SLIDER = 'input[type="range"][aria-label="tau"]'
TEXT = "The river bends twice before the mill. Lanterns hang by the door. " * 6


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The base URL of a `streamlit run app.py` serving a tiny random T5 (L_tr 256)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (Debian) to run the browser test")
    with serving(str(build_tiny_t5(tmp_path_factory.mktemp("state-t5"), train_length=256))) as url:
        yield url


def _number(page, key: str, deadline) -> str:
    return page.locator(f".st-key-{key} input").first.input_value(timeout=deadline.ms())


def _select_text(page, key: str, deadline) -> str:
    """A selectbox's shown option (Streamlit 1.67 draws it as a combobox input)."""
    return page.locator(f".st-key-{key} input[role=combobox]").first.input_value(timeout=deadline.ms()).strip()


def _radio(page, key: str, deadline) -> str:
    return (
        page.locator(f".st-key-{key} label")
        .filter(has=page.locator("input:checked"))
        .first.inner_text(timeout=deadline.ms())
        .strip()
    )


def _slider(page, key: str, deadline) -> float:
    return float(
        page.locator(f'.st-key-{key} input[type="range"]').first.get_attribute("aria-valuetext", timeout=deadline.ms())
    )


def _url_has(page, part: str, deadline) -> None:
    page.wait_for_function("(p) => location.search.includes(p)", arg=part, timeout=deadline.ms(120_000))


def _open_explore(page, server: str, deadline) -> None:
    page.goto(server, wait_until="domcontentloaded", timeout=deadline.ms())
    page.wait_for_selector('h1:has-text("Explore")', timeout=deadline.ms())
    page.wait_for_selector(".st-key-tau_method", timeout=deadline.ms())
    settle(page, deadline)


def _type_length(page, n: int, deadline) -> None:
    box = page.locator(".st-key-doc_tokens input").first
    box.fill(str(n), timeout=deadline.ms())
    box.press("Enter", timeout=deadline.ms())
    _url_has(page, f"tokens={n}", deadline)
    settle(page, deadline)


def _choose(page, key: str, label: str, deadline, url_part: str | None = None) -> None:
    choose(page, key, label, deadline, wait=False)
    if url_part:
        _url_has(page, url_part, deadline)
    settle(page, deadline)
    assert label in _select_text(page, key, deadline)


def _tau_in_explore(page, deadline) -> None:
    """Move Explore's tau to TAU inside its fragment (the panel slider, or the scrubber component)."""
    if page.locator(PANEL_SLIDER).count():  # the panel's Streamlit slider: one step per press, a rerun each
        thumb = page.locator(PANEL_SLIDER).first
        while (shown := float(thumb.get_attribute("aria-valuetext", timeout=deadline.ms()))) > TAU + 1e-9:
            thumb.focus(timeout=deadline.ms())
            thumb.press("ArrowLeft", timeout=deadline.ms())
            page.wait_for_function(
                "([sel, v]) => document.querySelector(sel)?.getAttribute('aria-valuetext') !== v",
                arg=[PANEL_SLIDER, f"{shown:.2f}"],
                timeout=deadline.ms(60_000),
            )
            settle(page, deadline)
    else:
        thumb = page.locator(COMPONENT_SLIDER).first
        thumb.focus(timeout=deadline.ms())
        thumb.press("PageDown", timeout=deadline.ms())
    _url_has(page, f"tau={TAU:.2f}", deadline)
    settle(page, deadline)


def test_length_and_tau_survive_a_page_change_after_a_fragment_tau_move(server, page, deadline):
    from core.runs import methods

    fixed, closed = methods.label("fixed"), methods.label(CLOSED_FORM)
    _open_explore(page, server, deadline)
    _type_length(page, LENGTH, deadline)  # a sidebar (full-run) choice ...
    _tau_in_explore(page, deadline)  # ... then the last action inside the fragment

    go(page, "Calibrate", deadline, shown=".st-key-tau_method")
    assert _number(page, "doc_tokens", deadline) == str(LENGTH), "the length was reset by the page change"
    assert fixed in _select_text(page, "tau_method", deadline)
    assert _slider(page, "tau_value", deadline) == TAU
    go(page, "Explore", deadline, shown=".st-key-tau_method")
    assert _number(page, "doc_tokens", deadline) == str(LENGTH), "Explore stayed reset"
    _url_has(page, f"tau={TAU:.2f}", deadline)

    # a method change as the last action inside the fragment
    _choose(page, "tau_method", closed, deadline, url_part=f"method={CLOSED_FORM}")
    go(page, "Calibrate", deadline, shown=".st-key-tau_method")
    assert _number(page, "doc_tokens", deadline) == str(LENGTH), "the length was reset by the page change"
    assert closed in _select_text(page, "tau_method", deadline), "the method was reset by the page change"
    assert _slider(page, "tau_value", deadline) < 1.0, "the disabled slider shows the method's tau, not 1.00"
    _choose(page, "tau_method", fixed, deadline, url_part="method=fixed")  # back to 'fixed': the person's own tau
    assert _slider(page, "tau_value", deadline) == TAU
    go(page, "Explore", deadline, shown=".st-key-tau_method")
    assert _number(page, "doc_tokens", deadline) == str(LENGTH)
    assert fixed in _select_text(page, "tau_method", deadline)
    _url_has(page, f"tau={TAU:.2f}", deadline)


def test_pasted_text_and_needle_survive_a_page_change_after_a_fragment_method_change(server, page, deadline):
    from core.runs import methods

    closed = methods.label(CLOSED_FORM)
    _open_explore(page, server, deadline)
    page.locator(".st-key-doc_mode label").filter(has_text="Paste").first.click(timeout=deadline.ms())
    settle(page, deadline)
    area = page.locator(".st-key-doc_text textarea").first
    area.fill(TEXT, timeout=deadline.ms())
    area.press("Control+Enter", timeout=deadline.ms())  # Streamlit's text area commits on Ctrl+Enter (or blur)
    settle(page, deadline)
    page.locator(".st-key-doc_needle_mode label").filter(has_text="no needle").first.click(timeout=deadline.ms())
    settle(page, deadline)
    question = page.locator(".st-key-doc_question input").first
    question.fill("Where do the lanterns hang?", timeout=deadline.ms())
    question.press("Enter", timeout=deadline.ms())
    settle(page, deadline)
    _choose(page, "tau_method", closed, deadline, url_part=f"method={CLOSED_FORM}")  # the last action: in the fragment

    for title in ("Calibrate", "Explore"):
        go(page, title, deadline, shown=".st-key-tau_method")
        assert _radio(page, "doc_mode", deadline) == "Paste", f"{title}: the source was reset"
        assert page.locator(".st-key-doc_text textarea").first.input_value(timeout=deadline.ms()) == TEXT, title
        assert "no needle" in _radio(page, "doc_needle_mode", deadline), title
        assert (
            page.locator(".st-key-doc_question input").first.input_value(timeout=deadline.ms())
            == "Where do the lanterns hang?"
        ), title
        assert closed in _select_text(page, "tau_method", deadline), f"{title}: the method was reset"
