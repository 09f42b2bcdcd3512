"""Issue 50 in a real browser: a class demo that never breaks.

One `streamlit run app.py` on the bundled models (no AAE_MODEL: the default is the bundled ``retrieval-t5``) and
headless Chromium (Playwright), 1400 x 1000 like a projector. Each test drives the page as a teacher would and
waits on Streamlit's own state (:func:`test_browser.settle`, which fails at once on an exception shown in the
page); one deadline bounds each test.

Skipped when /usr/bin/chromium or playwright is missing.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from support.browser import (
    PAINT_LOG,
    SCRUBBER,
    TAU_SLIDER,
    Deadline,
    choose,
    go,
    open_tour,
    scrubber,
    serving,
    settle,
    wait_painted,
)

ROOT = Path(__file__).resolve().parents[2]
#: The four bundled models, by the Model box's labels (ui.choices.model_labels), in the order a class meets them.
MODELS = ("rope-mlm (RoPE masked LM)", "retrieval-t5-cos", "rope-mlm-cos (RoPE masked LM)", "retrieval-t5")
PAGES = ("Explore", "Calibrate", "Sweep", "Theory")
BUDGET_S = float(os.environ.get("AAE_BROWSER_BUDGET_S", "900"))

#: A folder for a screenshot of the page when a test fails (AAE_FAIL_SHOTS), to see where it stopped.
FAIL_SHOTS = os.environ.get("AAE_FAIL_SHOTS")


@pytest.fixture(scope="module")
def server():
    """The base URL of a `streamlit run app.py` on the bundled models (AAE_MODEL unset)."""
    with serving(None) as url:
        yield url


@pytest.fixture
def deadline() -> Deadline:
    return Deadline(BUDGET_S)


@pytest.fixture
def shot_on_failure(page, request):
    """Yield; on a failed test, save the page as <test>.png in AAE_FAIL_SHOTS (when set)."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if FAIL_SHOTS and (rep is None or rep.failed):
        Path(FAIL_SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(FAIL_SHOTS) / f"{request.node.name}.png"), full_page=True)


def _open(page, url: str, deadline: Deadline) -> None:
    page.goto(url, wait_until="domcontentloaded", timeout=deadline.ms())
    page.wait_for_selector('h1:has-text("Explore")', timeout=deadline.ms())
    settle(page, deadline)


def _no_error(page, where: str) -> None:
    errors = page.locator('[data-testid="stException"], [data-testid="stAlertContentError"]')
    assert errors.count() == 0, (where, [errors.nth(i).inner_text()[:300] for i in range(errors.count())])


#: Quarantined (xfail, not strict) from 745ea1f to 2026-11-29 12:40 UTC: it ran past its 900 s deadline in 1 of 3 whole-suite
#: runs. Not reproduced since (3 of 3 on fc09b70, 5 of 5 after the fix below, load 3-8). The one path found that leaves
#: the page never settled: a background grid whose pass raised was marked failed (or, for any exception but three
#: types, its thread died without a word) while the scrubber went on polling for its frames every 900 ms for good, and
#: a page that polls never settles. The thread now logs and goes on, and the scrubber stops polling a failed grid and
#: says why (ui/prefetch.py, ui/scrubber.py; tests/ui/test_prefetch_errors.py).
def test_switching_between_the_bundled_models_on_every_page(server, page, shot_on_failure):
    """Every bundled model on every page, switched in the sidebar as a teacher would: no exception, no error line;
    on Explore the scrubber is drawn for each model, also when the switch comes while the grid is still filling
    (defect 1: T5 -> RoPE raised a KeyError for ``ex_text_window`` on the scrubber's next poll)."""
    deadline = Deadline(BUDGET_S)
    _open(page, server, deadline)
    for title in PAGES:
        if title != "Explore":
            go(page, title, deadline)
        for label in MODELS:
            print(title, label, f"{deadline.left():.0f} s left", flush=True)
            choose(page, "model_choice", label, deadline)
            _no_error(page, f"{title}, {label}")
            if title == "Explore":
                marker = "masked tokens:" if "RoPE" in label else "Answer:"
                settle(page, deadline, marker=marker, scope=SCRUBBER)
                _no_error(page, f"{title}, {label}")
    # Mid-grid: a longer document's grid is still being computed when the family changes, both ways.
    go(page, "Explore", deadline)
    for label in ("rope-mlm (RoPE masked LM)", "retrieval-t5", "rope-mlm-cos (RoPE masked LM)", "retrieval-t5-cos"):
        page.locator(".st-key-len_4x button").first.click(timeout=deadline.ms())
        page.locator(SCRUBBER).first.wait_for(timeout=deadline.ms())
        choose(page, "model_choice", label, deadline, wait=False)
        name = label.split()[0]
        try:  # the address bar names the model once a run has taken the switch
            page.wait_for_function(
                "(m) => new URLSearchParams(location.search).get('model') === m", arg=name, timeout=deadline.ms(90_000)
            )
        except Exception:  # noqa: BLE001 (a click lost while the app was busy: once more, as a person would)
            settle(page, deadline)
            choose(page, "model_choice", label, deadline, wait=False)
        settle(page, deadline, marker="masked tokens:" if "RoPE" in label else "Answer:", scope=SCRUBBER)
        _no_error(page, f"mid-grid, {label}")


#: Screenshots of the moments this module checks, for a person to look at (AAE_DEMO_SHOTS: a folder).
DEMO_SHOTS = os.environ.get("AAE_DEMO_SHOTS")

#: The bars and legend of the scrubber's two meters (svg 380 x 230): the lowest top and the highest bottom of
#: any rect, and whether a bar covers the chart's title row (y < 16: the y axis starts there).
_METERS = """(r) => {
    const out = [];
    for (const s of r.querySelectorAll('svg[viewBox="0 0 380 230"]')) {
        const rects = [...s.querySelectorAll('rect')].map(e => [Number(e.getAttribute('y')), Number(e.getAttribute('height'))]);
        out.push({top: Math.min(...rects.map(([y]) => y)), bottom: Math.max(...rects.map(([y, h]) => y + h))});
    }
    return out;
}"""


def _shot(page, name: str) -> None:
    if DEMO_SHOTS:
        Path(DEMO_SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(DEMO_SHOTS) / f"{name}.png"))


def _grid_of(page, deadline: Deadline) -> list[float]:
    """The scrubber's grid values, from its ticks' titles ("grid tau 0.95", "grid CosScale s 16.00"), sorted."""
    page.locator(".aae .ticks span").first.wait_for(state="attached", timeout=deadline.ms())
    titles = page.locator(SCRUBBER).evaluate(
        "(r) => [...r.querySelectorAll('.ticks span')].map(t => t.title)", timeout=deadline.ms()
    )
    assert titles, "the scrubber shows no grid ticks"
    return sorted(float(t.split()[-1]) for t in titles)


def _key(page, key: str, want: str, deadline: Deadline) -> dict:
    """Press ``key`` on the scrubber's slider; wait until the frame of ``want`` (the slider's value) is painted.

    A press that left the slider where it was (it landed while a rerun replaced the element: seen once on a
    busy machine) is pressed once more; a press that moved it elsewhere fails on the painted value."""
    slider = page.locator(TAU_SLIDER)
    before = slider.input_value(timeout=deadline.ms())
    for attempt in range(2):
        page.locator(SCRUBBER).evaluate(PAINT_LOG, timeout=deadline.ms())
        slider.focus(timeout=deadline.ms())
        page.keyboard.press(key)
        try:
            page.wait_for_function(
                "([sel, v]) => { const r = [...document.querySelectorAll('*')].map(e => "
                "e.shadowRoot && e.shadowRoot.querySelector(sel)).find(Boolean); "
                "return r && r.value !== v; }",
                arg=["input[type=range]", before],
                timeout=deadline.ms(10_000),
            )
            break
        except Exception:  # noqa: BLE001 (the slider did not move: the press was lost)
            if attempt:
                raise
    return wait_painted(page, {"tau": want, "kind": "grid"}, deadline)


#: The walkthrough runs with the suite again (2026-11-28). Its failures and their causes: the lost grid frames and
#: the lagging address bar (fixed at earlier stops); the answer cards measured below the fold, twice from the
#: resolve's estimate left standing until the next run and once (this day) from the slot only the resolving run drew,
#: which left the old "not reached" note beside the new one in the next run (both fixed in ui/sidebar.py). One
#: run of 45 on 2026-11-27/28 left the page on the old model after the Model box named the new one, cause not
#: established; Explore's fragment now reruns the page where the box and its views disagree. Then 51 runs here at
#: load 3-5: 50 passed; the one failure was the slot above (the 22 runs after its fix all passed).
def test_a_class_walkthrough(page, shot_on_failure):
    """A cold start that speaks within 2 s (its own fresh server); the tour's step 4 with the cards above the fold,
    its text closing when the method changes; tau's keys one grid value each way; a clicker's PageDown every 0.5 s
    through a grid still filling down to its end, the slider keeping the focus; a 16x length change that says at
    once that it computes (and hides the old views) while it runs; on a cosine model one control for s, its keys
    one grid value each way and the meters inside their charts at every s of the grid; paste mode without an
    error."""
    with serving(None) as server:
        _walkthrough(page, server)


#: The scrubber's slider has the keyboard focus (inside the component's shadow root).
_FOCUSED = """() => { const a = document.activeElement; const inner = a && a.shadowRoot && a.shadowRoot.activeElement;
    return !!(inner && inner.matches('input[type=range]')); }"""


def _walkthrough(page, server: str) -> None:
    deadline = Deadline(BUDGET_S)
    # -- a cold start: the first run of a fresh server imports torch; the page says so within 2 s (issue 59.3) ----
    page.goto(server, wait_until="domcontentloaded", timeout=deadline.ms())
    t0 = time.monotonic()
    page.wait_for_function(
        "() => { const m = document.querySelector('[data-testid=\"stMain\"]'); return m && m.innerText.trim().length > 20; }",
        timeout=deadline.ms(),
        polling=50,
    )
    said = time.monotonic() - t0
    assert said <= 2.0, f"a cold start's first words came after {said:.1f} s"
    page.wait_for_selector('h1:has-text("Explore")', timeout=deadline.ms())
    settle(page, deadline)

    # -- the landing: the tour open at its first step, with nothing clicked -----------------------------------
    main = page.locator('[data-testid="stMain"]')
    assert "Step 1 · At L_tr" in main.inner_text(timeout=deadline.ms()), "the first page lands on the tour's step 1"

    # -- the tour: step 4 open, the cards in view at 1400 x 1000 --------------------------------------------
    open_tour(page, deadline)
    page.locator(".st-key-tour_3 button").click(timeout=deadline.ms())
    settle(page, deadline, marker="Answer:", scope=SCRUBBER)
    assert "Step 4 · Algorithm 1" in page.locator('[data-testid="stMain"]').inner_text(timeout=deadline.ms())
    card = page.locator('.aae .card[data-side="chosen"]').bounding_box(timeout=deadline.ms())
    _shot(page, "tour_step4")
    assert card["y"] + card["height"] <= 1000, f"the answer cards fall below the fold with the tour open: {card}"
    # the method changed in the panel: the step's text goes (it described Algorithm 1)
    choose(page, "tau_method", "fixed tau", deadline)
    page.locator('[data-testid="stMain"]').get_by_text("closed: you changed the set-up").first.wait_for(
        timeout=deadline.ms(120_000)
    )  # the panel's rerun asks for a full one, which redraws the tour
    settle(page, deadline)
    main = page.locator('[data-testid="stMain"]').inner_text(timeout=deadline.ms())
    assert "Step 4 · Algorithm 1." not in main and "closed: you changed the set-up" in main, main[:800]

    # -- tau's keys: one grid value each way -------------------------------------------------------------------
    grid = [f"{t:.2f}" for t in _grid_of(page, deadline)]
    now = scrubber(page, deadline)["tau"]
    assert now in grid, (now, grid)
    i = grid.index(now)
    assert _key(page, "PageDown", grid[i - 1], deadline)["shown"] == grid[i - 1]
    assert _key(page, "PageDown", grid[i - 2], deadline)["shown"] == grid[i - 2]
    assert _key(page, "PageUp", grid[i - 1], deadline)["shown"] == grid[i - 1]
    assert _key(page, "Shift+ArrowLeft", grid[i - 2], deadline)["shown"] == grid[i - 2]

    # -- a clicker: PageDown every 0.5 s through a grid still filling, down to its end (issue 59.1) -------------
    page.locator(".st-key-doc_seed input").first.fill("23", timeout=deadline.ms())
    page.locator(".st-key-doc_seed input").first.press("Enter", timeout=deadline.ms())
    page.wait_for_function(
        "() => new URLSearchParams(location.search).get('seed') === '23'", timeout=deadline.ms(120_000)
    )
    page.locator(TAU_SLIDER).first.wait_for(timeout=deadline.ms())
    page.locator(TAU_SLIDER).click(timeout=deadline.ms())
    page.keyboard.press("End")  # tau = 1
    values = []
    for _ in range(len(grid)):
        page.keyboard.press("PageDown")
        page.wait_for_timeout(500)
        values.append(float(page.locator(TAU_SLIDER).input_value(timeout=deadline.ms())))
        assert page.evaluate(_FOCUSED), f"the slider lost the keyboard focus after {values}"
    assert f"{values[-1]:.2f}" == grid[0], (values, grid)
    _shot(page, "clicker_at_the_end")
    settle(page, deadline)

    # -- a long document: computing, said at once, the old views hidden -----------------------------------------
    box = page.locator(".st-key-doc_tokens input").first
    box.fill("4096", timeout=deadline.ms())
    box.press("Enter", timeout=deadline.ms())
    waiting = page.locator('[data-testid="stMain"] [data-testid="stAlert"]').filter(
        has_text="This document is 4,096 tokens"
    )
    waiting.first.wait_for(timeout=deadline.ms(60_000))
    text = waiting.first.inner_text(timeout=deadline.ms())
    assert "on this machine" in text and "grid frames follow" in text, text
    _shot(page, "long_document_wait")
    assert not page.locator(SCRUBBER).first.is_visible(), "the old document's views are shown during the wait"
    ask = page.get_by_role("button", name=re.compile(r"^Compute it"))
    if ask.count():  # the estimate is over the limit: the app asked first; the old views are hidden meanwhile
        ask.first.click(timeout=deadline.ms())
        page.locator('[data-testid="stMain"] [data-testid="stAlert"]').filter(
            has_text="Computing the new document"
        ).first.wait_for(timeout=deadline.ms(60_000))
        assert not page.locator(SCRUBBER).first.is_visible()
    page.locator('[data-testid="stProgress"]').first.wait_for(timeout=deadline.ms(60_000))
    page.wait_for_function(
        "() => { const r = [...document.querySelectorAll('*')].map(e => e.shadowRoot && "
        "e.shadowRoot.querySelector('.aae')).find(Boolean); return r && r.innerText.includes("
        "'4,096 tokens'); }",
        timeout=deadline.ms(),
        polling=500,
    )

    # -- a cosine model: one control for s, its keys, the meters at every s -------------------------------------
    choose(page, "model_choice", "rope-mlm-cos (RoPE masked LM)", deadline)
    page.get_by_test_id("stRadioGroup").get_by_text("CosScale s", exact=True).click(timeout=deadline.ms())
    settle(page, deadline, marker="masked tokens:", scope=SCRUBBER)
    assert page.locator(".st-key-cos_scale").count() == 0, "two controls move s"
    assert "the slider below moves it" in page.locator(".st-key-temperature_panel").inner_text(timeout=deadline.ms())
    grid = [f"{s:.2f}" for s in _grid_of(page, deadline)]
    now = scrubber(page, deadline)["tau"]
    assert now in grid, (now, grid)
    i = grid.index(now)
    assert _key(page, "PageUp", grid[i + 1], deadline)["shown"] == grid[i + 1]
    assert _key(page, "PageDown", grid[i], deadline)["shown"] == grid[i]
    assert _key(page, "Shift+ArrowLeft", grid[i - 1], deadline)["shown"] == grid[i - 1]
    for j in range(i - 2, -1, -1):  # down to the lowest s, where attention is flattest and entropy highest
        _key(page, "PageDown", grid[j], deadline)
        for m in page.locator(SCRUBBER).evaluate(_METERS, timeout=deadline.ms()):
            assert m["top"] >= 16 - 1e-6 and m["bottom"] <= 230 + 1e-6, (grid[j], m)
    _shot(page, "cosscale_lowest_s")

    # -- paste mode: no error before anything is typed, and what a link carries ---------------------------------
    choose(page, "model_choice", "retrieval-t5", deadline)
    page.locator(".st-key-doc_mode label").filter(has_text="Paste").first.click(timeout=deadline.ms())
    settle(page, deadline)
    _no_error(page, "paste mode")
    assert "Paste mode." in page.locator('[data-testid="stMain"]').inner_text(timeout=deadline.ms())
    assert "does not carry the pasted text" in page.locator('[data-testid="stSidebar"]').inner_text(
        timeout=deadline.ms()
    )
    _shot(page, "paste_mode")
