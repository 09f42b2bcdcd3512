"""The scrubber's keys in a real browser: a row of presses sends the server its last value only (issue 59 point 11).

Why: each value the slider sends reruns Explore's panel, and Streamlit renders that rerun's answer on the browser's
main thread (40-100 ms on the 2-core machine under load). With a rerun per press, press n's answer landed just as
press n + 1 was to be drawn, and bench/browser_latency.py's scrub (a press every 0.3 s) slowed from 0.03 to 0.05 s.
A press that follows another within ``BURST_KEY_MS`` (``ui/scrubber.js``) waits that long before it sends; a lone
press still sends after 200 ms. Each value that reached the server shows as a new ``tau`` in the address bar (the
panel's rerun writes it): the test counts those.

Same tiny model and document as tests/browser/test_scrubber_browser.py (fixtures from tests/support/browser.py).
"""

from __future__ import annotations

from support.browser import (
    SCRUBBER,
    TAU_SLIDER,
    link,
    open_settled,
    settle,
    url_tau,
    wait_grid,
    wait_painted,
)

#: Logs every tau the app writes into the address bar (Streamlit's frontend uses history.pushState/replaceState).
URL_LOG = """() => {
    if (window.__taus) { window.__taus.length = 0; return; }
    const log = window.__taus = [];
    for (const name of ['pushState', 'replaceState']) {
        const orig = history[name].bind(history);
        history[name] = (state, title, url) => {
            const tau = url ? new URL(url, location.href).searchParams.get('tau') : null;
            if (tau !== null && tau !== log[log.length - 1]) log.push(tau);
            return orig(state, title, url);
        };
    }
}"""


def _sent(page) -> list[str]:
    """The taus written into the address bar since :data:`URL_LOG` was (re)installed."""
    return page.evaluate("() => [...window.__taus]")


def test_a_row_of_presses_sends_its_last_value_once_and_a_lone_press_at_once(server, page, deadline):
    open_settled(page, link(server, tau=1.0), deadline, marker="Answer:", scope=SCRUBBER)
    wait_grid(page, deadline)
    page.locator(TAU_SLIDER).focus(timeout=deadline.ms())
    page.evaluate(URL_LOG)
    # five PageDowns, 0.3 s apart (bench/browser_latency.py's scrub cadence): each frame painted, nothing sent yet
    for want in ("0.95", "0.90", "0.85", "0.80", "0.75"):
        page.keyboard.press("PageDown")
        wait_painted(page, {"tau": want, "kind": "grid"}, deadline)
        page.wait_for_timeout(300)
    during = _sent(page)
    assert len(during) <= 1, f"values written during a row of 5 presses 0.3 s apart: {during} (one per press before)"
    # the pause after the row: its last value reaches the server, once
    page.wait_for_function(
        "() => new URLSearchParams(location.search).get('tau') === '0.75'", timeout=deadline.ms(10_000)
    )
    settle(page, deadline, marker="Answer:", scope=SCRUBBER)
    assert _sent(page)[-1:] == ["0.75"] and len(_sent(page)) <= 2, _sent(page)
    assert url_tau(page) == "0.75"
    # a lone press, long after the row: sent after the short pause, on its own
    page.evaluate(URL_LOG)
    page.keyboard.press("PageDown")
    wait_painted(page, {"tau": "0.70", "kind": "grid"}, deadline)
    page.wait_for_function(
        "() => new URLSearchParams(location.search).get('tau') === '0.70'", timeout=deadline.ms(10_000)
    )
    assert _sent(page) == ["0.70"], _sent(page)
