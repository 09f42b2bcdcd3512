"""Issue 59 in a real browser: a class demo with a presentation clicker on the bundled models.

One `streamlit run app.py` on the bundled models (the default ``retrieval-t5``, L_tr = 256) and headless Chromium
(Playwright, Debian's /usr/bin/chromium) at 1400 x 1000. Each test opens its own document (its own seed or length),
so no test finds another's passes in the server's shared stores. Each fails on the code before its fix:

* a clicker's PageDown every 0.5 s through a grid still filling reaches the grid's end (focus stayed on the slider);
* the progress bar's value rises during a long first pass (it waited on the background grid's identical pass);
* a model switch keeps the length's multiple of L_tr, and never shows the old model's cards at full brightness;
* after a method change the address bar names the new method within 0.5 s, and the chosen card never shows another
  tau's frame unfaded;
* a closed tab's background grid stops within one layer (the server's CPU falls idle; before, the pass ran to its end);
* a cold start's first paint says something within 2 s.

Skipped when /usr/bin/chromium or playwright is missing.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from pathlib import Path

import pytest

from support.browser import (
    SCRUBBER,
    TAU_SLIDER,
    Deadline,
    choose,
    scrubber,
    server_of,
    serving,
    settle,
)

BUDGET_S = float(os.environ.get("AAE_BROWSER_BUDGET_S", "600"))
SHOTS = os.environ.get("AAE_DEMO_SHOTS")


@pytest.fixture(scope="module")
def server():
    """The base URL of a `streamlit run app.py` on the bundled models (AAE_MODEL unset)."""
    with serving(None) as url:
        yield url


def _shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"))


def _ready(page) -> tuple[int, int]:
    k, n = (scrubber(page, Deadline(60)).get("ready") or "0/15").split("/")
    return int(k), int(n)


def _confirm_if_asked(page, deadline: Deadline) -> None:
    """Press "Compute it" when the app asks before a long first pass (its estimate over 30 s); return once the pass
    is under way (its progress bar) or asked for. The ask can take a while: the estimate first times a law on this
    machine (``ui.cache.pass_estimate``), slower on a busy one."""
    ask = page.get_by_role("button", name="Compute it")
    while deadline.left() > 0:
        if ask.count():
            ask.first.click(timeout=deadline.ms())
            return
        if page.locator('[data-testid="stProgress"]').count():
            return
        page.wait_for_timeout(250)


#: The scrubber's slider has the keyboard focus (inside the component's shadow root).
FOCUSED = """() => { const a = document.activeElement; const inner = a && a.shadowRoot && a.shadowRoot.activeElement;
    return !!(inner && inner.matches('input[type=range]')); }"""


def test_a_clicker_pages_down_through_a_filling_grid_to_its_end(server, page):
    """Issue 59 point 1: PageDown every 0.5 s from tau = 1 while the grid is still being computed reaches 0.50,
    the slider keeping the focus (it stopped at 0.85 and focus went to the page body)."""
    deadline = Deadline(BUDGET_S)
    page.goto(f"{server}/?tokens=8x&seed=22", wait_until="domcontentloaded", timeout=deadline.ms())
    page.locator(TAU_SLIDER).first.wait_for(timeout=deadline.ms())
    k, n = _ready(page)
    assert k < n, "the grid was complete already: nothing to fill"
    page.locator(TAU_SLIDER).click(timeout=deadline.ms())  # a click on the slider, as a teacher would
    page.locator(TAU_SLIDER).focus(timeout=deadline.ms())
    page.keyboard.press("End")
    values = []
    for _ in range(10):
        page.keyboard.press("PageDown")
        page.wait_for_timeout(500)
        values.append(page.locator(TAU_SLIDER).input_value(timeout=deadline.ms()))
        assert page.evaluate(FOCUSED), f"the slider lost the keyboard focus after {values}"
    _shot(page, "clicker_pagedown")
    assert float(values[-1]) == 0.5, values


#: Every value the page's progress bars show, in order, from the first paint on (a MutationObserver, so no value
#: the browser drew is missed between two of the test's reads: CI's polling saw only 75 and 97 of a starved page).
BAR_VALUES = """() => { window.__bar = []; const note = () => {
    for (const b of document.querySelectorAll('[data-testid="stProgress"] [role="progressbar"]')) {
        const v = Number(b.getAttribute('aria-valuenow'));
        if (!Number.isNaN(v) && window.__bar[window.__bar.length - 1] !== v) window.__bar.push(v); } };
    new MutationObserver(note).observe(document, {subtree: true, childList: true, attributes: true,
        attributeFilter: ['aria-valuenow']}); }"""


def test_the_progress_bar_rises_during_a_long_first_pass(server, page):
    """Issue 59 point 2: a 32x document's first pass (the background grid's identical tau = 1 pass, waited on, or
    the person's own; ~10-70 s on the 2-core machine) moves the bar: its value rises at least twice (it stayed at
    0 %, "starting...", at 16x, 32x and 64x; then, moved only once a layer, it showed 75 % and 97 % on a busy CI
    machine). The tab closes at the end, so the server drops the rest of the pass at its next layer."""
    deadline = Deadline(BUDGET_S)
    page.add_init_script(f"({BAR_VALUES})()")
    page.goto(f"{server}/?tokens=32x&seed=5", wait_until="domcontentloaded", timeout=deadline.ms())
    _confirm_if_asked(page, deadline)
    bar = page.locator('[data-testid="stProgress"] [role="progressbar"]')
    bar.first.wait_for(timeout=deadline.ms())
    end = time.monotonic() + 120
    seen: list[float] = []
    while time.monotonic() < end:
        seen = page.evaluate("() => window.__bar.slice()")
        if len(seen) >= 3 or not bar.count():
            break
        page.wait_for_timeout(200)
    _shot(page, "progress_bar")
    # a document's second first pass (the chosen tau's) starts the same bar again from 0: the first pass's values
    first = seen[: next((i for i in range(1, len(seen)) if seen[i] < seen[i - 1]), len(seen))]
    assert len(first) >= 3, seen  # rising (consecutive repeats are not recorded)


def test_a_model_switch_keeps_the_multiple_and_hides_the_old_cards(server, page):
    """Issue 59 points 6 and 5: 8x on T5, switched to rope-mlm, stays 8x of rope-mlm's L_tr; from the switch on, no
    T5 card ("Answer:") is seen at full brightness (sampled every animation frame) while the box names rope-mlm."""
    deadline = Deadline(BUDGET_S)
    page.goto(f"{server}/?tokens=8x&seed=31", wait_until="domcontentloaded", timeout=deadline.ms())
    page.locator(SCRUBBER).first.wait_for(timeout=deadline.ms())
    settle(page, deadline, marker="Answer:", scope=SCRUBBER)
    page.evaluate(
        """() => { window.__old = []; const find = () => { for (const h of document.querySelectorAll('*'))
            if (h.shadowRoot) { const x = h.shadowRoot.querySelector('.aae'); if (x) return [h, x]; } return null; };
        const opacity = (e) => { let o = 1; for (let n = e; n; n = n.parentElement || (n.getRootNode() && n.getRootNode().host))
            o *= Number(getComputedStyle(n).opacity); return o; };
        const tick = () => { const f = find(); if (f) { const [host, r] = f; const card = r.querySelector('.card[data-side="chosen"]');
            if (card && card.innerText.includes('Answer:') && host.checkVisibility() && card.checkVisibility()
                && opacity(card) > 0.99 && window.__switched) window.__old.push(performance.now() - window.__switched); }
            if (!window.__stopSampling) requestAnimationFrame(tick); };
        requestAnimationFrame(tick); }"""
    )
    page.evaluate(  # the clock starts at the option's click (the sampler counts from then)
        """() => document.addEventListener('click', (e) => { if (e.target.closest && e.target.closest('[role="option"]')
            && !window.__switched) window.__switched = performance.now(); }, true)"""
    )
    choose(page, "model_choice", "rope-mlm (RoPE masked LM)", deadline, wait=False)
    settle(page, deadline, marker="masked tokens:", scope=SCRUBBER)
    seen = page.evaluate("() => { window.__stopSampling = true; return window.__old; }")
    side = page.locator('[data-testid="stSidebar"]').inner_text(timeout=deadline.ms())
    _shot(page, "after_switch")
    assert "8.00× L_tr" in side, side[:1500]
    # a grace of 500 ms: the rerun that hides the old views starts that long after the click on a busy machine
    # and at most two frames beyond it: the one between the component's new element and its script's first draw
    late = [t for t in seen if t > 500]
    assert len(late) <= 2, f"the old model's card at full brightness {len(late)} frames after the switch: {late[:8]}"


def test_a_method_change_names_the_method_in_the_url_at_once(server, page):
    """Issue 59 point 7: the address bar names the new method within 0.5 s of its choice (it waited ~6.5 s for the
    exact pass), and the chosen card never shows another tau's frame unfaded meanwhile."""
    deadline = Deadline(BUDGET_S)
    page.goto(f"{server}/?tokens=8x&seed=41&method=fixed&tau=1", wait_until="domcontentloaded", timeout=deadline.ms())
    page.locator(SCRUBBER).first.wait_for(timeout=deadline.ms())
    from playwright.sync_api import expect

    expect(page.locator(SCRUBBER)).to_have_attribute("data-ready", "15/15", timeout=deadline.ms())
    settle(page, deadline, marker="Answer:", scope=SCRUBBER)
    page.evaluate(
        """() => { window.__bad = []; const find = () => { for (const h of document.querySelectorAll('*'))
            if (h.shadowRoot) { const x = h.shadowRoot.querySelector('.aae'); if (x) return x; } return null; };
        const tick = () => { const r = find(); if (r && (r.dataset.kind === 'nearest' || r.dataset.kind === 'missing')) {
            const card = r.querySelector('.card[data-side="chosen"]');
            if (card && !card.classList.contains('approx')) window.__bad.push(r.dataset.kind + ' ' + r.dataset.shown); }
            if (!window.__stop) requestAnimationFrame(tick); }; requestAnimationFrame(tick); }"""
    )
    # the clock starts at the option's click (captured in the page), and stops at the first frame whose URL has moved
    page.evaluate(
        """() => { window.__lag = null; document.addEventListener('click', (e) => {
            if (e.target.closest && e.target.closest('[role="option"]') && !window.__t0) window.__t0 = performance.now();
        }, true); const tick = () => { if (window.__t0 && new URLSearchParams(location.search).get('method') !== 'fixed') {
            window.__lag = (performance.now() - window.__t0) / 1000; return; } requestAnimationFrame(tick); };
        requestAnimationFrame(tick); }"""
    )
    choose(page, "tau_method", "log-length", deadline, wait=False)
    page.wait_for_function("() => window.__lag !== null", timeout=deadline.ms(60_000))
    lag = page.evaluate("() => window.__lag")
    method = urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query)["method"][0]
    settle(page, deadline, marker="Answer:", scope=SCRUBBER)
    bad = page.evaluate("() => { window.__stop = true; return window.__bad; }")
    _shot(page, "method_change")
    assert method != "fixed"
    assert not bad, f"the chosen card showed another tau's frame unfaded: {bad[:5]}"
    assert lag <= 0.5, f"the URL named the new method {lag:.2f} s after its choice"


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _busy(pid: int, seconds: float) -> float:
    """The share of one core the process used over the next ``seconds``."""
    a = _cpu_s(pid)
    time.sleep(seconds)
    return (_cpu_s(pid) - a) / seconds


def test_a_closed_tabs_grid_stops_within_a_layer(server, page):
    """Issue 59 point 9: a 64x document answered, its background grid computing the next tau's pass, the tab
    closed: within one layer's time the server stops computing, and stays idle. Before the fix a closed tab's wish
    was dropped only between two passes, so the grid's pass ran to its end (at 64x, minutes).

    retrieval-t5 has 4 encoder layers, so a layer is a quarter of the first pass (timed here, whatever the load): the
    idle window must begin within a layer and 10 s of closing, well before the rest of the grid's pass ends."""
    deadline = Deadline(BUDGET_S)
    page.goto(f"{server}/?tokens=64x&seed=11", wait_until="domcontentloaded", timeout=deadline.ms())
    _confirm_if_asked(page, deadline)
    page.locator('[data-testid="stProgress"]').first.wait_for(timeout=deadline.ms())
    t0 = time.monotonic()
    settle(page, deadline, marker="Answer:", scope=SCRUBBER)
    first = time.monotonic() - t0
    proc = server_of(page)
    assert proc is not None
    assert _busy(proc.pid, 2) > 0.5, "the grid was not computing when the tab closed: nothing to stop"
    page.close()
    closed = time.monotonic()
    bound = first / 4 + 10
    while time.monotonic() - closed < bound:
        busy = _busy(proc.pid, 5)
        if busy < 0.15:
            break
    else:
        pytest.fail(f"the server still computes {busy:.0%} of a core {bound:.0f} s after the tab closed")
    stopped = time.monotonic() - closed
    later = _busy(proc.pid, 20)
    assert later < 0.15, f"the server computed again after the tab closed: {later:.0%} of a core over 20 s"
    print(f"closed tab: first pass {first:.0f} s; the server fell idle {stopped:.0f} s after the tab closed")


def test_a_cold_start_speaks_within_two_seconds(page):
    """Issue 59 point 3: the first paint of a fresh server's first page says something within 2 s of the page's
    load (it was a blank white page for ~20 s while the first run imported torch and transformers)."""
    deadline = Deadline(BUDGET_S)
    with serving(None) as url:
        page.goto(url, wait_until="domcontentloaded", timeout=deadline.ms())
        t0 = time.monotonic()
        page.wait_for_function(
            """() => { const m = document.querySelector('[data-testid="stMain"]');
                return m && m.innerText.trim().length > 20; }""",
            timeout=deadline.ms(),
            polling=50,
        )
        said = time.monotonic() - t0
        _shot(page, "cold_start")
        text = page.locator('[data-testid="stMain"]').inner_text(timeout=deadline.ms())
        assert said <= 2.0, f"the first words came {said:.1f} s after the page loaded: {text[:200]}"
        settle(page, deadline, marker="Answer:", scope=SCRUBBER)
        assert "Starting the Attention Alignment Explorer" not in page.locator('[data-testid="stMain"]').inner_text()
