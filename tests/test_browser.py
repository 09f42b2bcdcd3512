"""One real browser: `streamlit run app.py` + headless Chromium (Playwright), moving tau with the keyboard.

Skipped only when /usr/bin/chromium (Debian's chromium package) or playwright
is missing. Uses the tiny test model unless AAE_MODEL is set.

No fixed waits: every step waits until Streamlit has *settled* (see
:func:`settle`: no running-man status widget, no stale element, every plotly
chart drawn, the state held for longer than Streamlit's 500 ms status delay)
and an expected text is on the page. One generous deadline bounds a whole
test (:class:`Deadline`, 10 min by default, ``AAE_BROWSER_BUDGET_S``); each
wait gets what is left of it, so a busy machine makes the test slower, not red.

To open a URL and wait for the app (e.g. a query-parameter check)::

    open_settled(page, f"{server}/?tau=0.7", deadline, marker="tau = 0.700", scope=CARD)

Screenshots for the README: set AAE_SCREENSHOTS to a folder (e.g.
``AAE_SCREENSHOTS=assets/screenshots AAE_MODEL=<bundled model folder>``) and
the test also opens every page and saves ``<page>.png`` there.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import build_tiny_t5

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
PAGES = ("explore", "calibrate", "sweep", "theory")
CARD = ".st-key-answer_card"  # the chosen-tau answer card on Explore
TAU_SLIDER = '.st-key-tau_value input[type="range"]'  # by key: wherever the page puts the slider
#: Seconds one test may take in all (server start excluded); a busy 2-core machine needs far less.
BUDGET_S = float(os.environ.get("AAE_BROWSER_BUDGET_S", "600")) + (1200 if os.environ.get("AAE_SCREENSHOTS") else 0)
SERVER_START_S = 300.0
#: Longer than Streamlit's delay before it shows the running-man widget (500 ms in 1.67):
#: a state that holds this long is not the gap between a run's start and its widget.
QUIET_MS = 700
CHUNK_MS = 15_000  # waits are cut in chunks so a dead server fails the test at once
_SERVERS: dict[str, subprocess.Popen] = {}  # url -> its streamlit process, for liveness checks


class Deadline:
    """One bound for a whole test; every wait takes its timeout from what is left."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def ms(self, cap_ms: float | None = None) -> float:
        """Milliseconds left (at least 1), optionally capped; raises once the deadline has passed."""
        left = self.left()
        if left <= 0:
            raise TimeoutError(f"the browser test ran past its {self.seconds:.0f} s deadline")
        out = left * 1000
        return max(1.0, min(out, cap_ms) if cap_ms is not None else out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(url: str, proc: subprocess.Popen, timeout: float = SERVER_START_S) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {proc.returncode}: {proc.stdout.read()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)  # polling interval of a health check, not a wait for the app
    raise TimeoutError(f"streamlit did not become healthy in {timeout:.0f} s")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The base URL of a `streamlit run app.py` serving the tiny model (or AAE_MODEL)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (Debian) to run the browser test")
    pytest.importorskip("playwright.sync_api", reason="playwright (python) is not installed")
    model = os.environ.get("AAE_MODEL") or str(build_tiny_t5(tmp_path_factory.mktemp("browser-t5"), train_length=256))
    port = _free_port()
    env = {**os.environ, "AAE_MODEL": model, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.address", "127.0.0.1",
         "--server.port", str(port), "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    _SERVERS[url] = proc
    try:
        _wait_health(url, proc)
        yield url
    finally:
        _SERVERS.pop(url, None)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def deadline() -> Deadline:
    return Deadline(BUDGET_S)


@pytest.fixture
def page():
    """A fresh headless Chromium page (1400 x 1000)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, timeout=120_000)
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


# --- waiting on Streamlit's own state ----------------------------------------------

#: Truthy once the app is settled and ``marker`` (if any) is inside ``scope`` (or the body), and has
#: stayed so for ``quiet`` ms; returns "exception: ..." at once when the page shows a Python exception.
#: Settled: no running-man status widget (Streamlit shows it 500 ms into a run), no stale element
#: (marked at once when a rerun is requested), no stSkeleton (an element whose JS chunk, e.g.
#: plotly's, is still loading: seen for 7 s on a busy machine after the run had ended), and every
#: plotly chart has drawn its svg.
SETTLED = """([token, marker, scope, quiet]) => {
    const exc = document.querySelector('[data-testid="stException"]');
    if (exc) return 'exception: ' + exc.innerText.slice(0, 600);
    const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')];
    const busy = document.querySelector('[data-testid="stStatusWidget"]')
        || document.querySelector('[data-stale="true"]')
        || document.querySelector('[data-testid="stSkeleton"]')
        || charts.some(c => !c.querySelector('.main-svg'))
        || !document.querySelector('[data-testid="stMain"]');
    const root = scope ? document.querySelector(scope) : document.body;
    const ok = !busy && root && (!marker || root.innerText.includes(marker));
    const now = performance.now();
    if (!window.__aaeQuiet || window.__aaeQuiet.token !== token) window.__aaeQuiet = {token, since: null};
    if (!ok) { window.__aaeQuiet.since = null; return false; }
    if (window.__aaeQuiet.since === null) window.__aaeQuiet.since = now;
    return now - window.__aaeQuiet.since >= quiet ? 'ok' : false;
}"""

STATE = """([scope]) => {
    const root = scope ? document.querySelector(scope) : document.body;
    const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')];
    return {status_widget: !!document.querySelector('[data-testid="stStatusWidget"]'),
            stale: document.querySelectorAll('[data-stale="true"]').length,
            skeletons: document.querySelectorAll('[data-testid="stSkeleton"]').length,
            charts: charts.length, charts_drawn: charts.filter(c => c.querySelector('.main-svg')).length,
            scope_found: !!root, text: root ? root.innerText.slice(0, 400) : null};
}"""

_tokens = iter(range(1, 1 << 30))


def _server_of(page) -> subprocess.Popen | None:
    parts = urllib.parse.urlsplit(page.url)
    return _SERVERS.get(f"{parts.scheme}://{parts.netloc}")


def settle(page, deadline: Deadline, marker: str | None = None, scope: str | None = None) -> None:
    """Wait until Streamlit is idle (no status widget, nothing stale, every plotly chart drawn)
    and ``marker`` shows inside ``scope``, for as long as the deadline allows.

    Fails at once on a Python exception in the page or a dead server; on the
    deadline it says what the page looked like.
    """
    from playwright.sync_api import TimeoutError as PwTimeout

    token = next(_tokens)
    while True:
        left_ms = deadline.left() * 1000
        if left_ms <= 0:
            state = page.evaluate(STATE, [scope])
            raise AssertionError(f"app not settled with {marker!r} in {scope or 'the page'} "
                                 f"within the {deadline.seconds:.0f} s deadline: {state}")
        try:
            handle = page.wait_for_function(SETTLED, arg=[token, marker, scope, QUIET_MS], polling=150,
                                            timeout=max(1.0, min(left_ms, CHUNK_MS)))
        except PwTimeout:
            proc = _server_of(page)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"streamlit died ({proc.returncode}): {proc.stdout.read()[-2000:]}") from None
            continue
        result = handle.json_value()
        if isinstance(result, str) and result.startswith("exception"):
            raise AssertionError(f"the app raised: {result}")
        return


def open_settled(page, url: str, deadline: Deadline, marker: str | None = None, scope: str | None = None) -> None:
    """Open ``url`` (any app URL, query parameters included) and wait until it settled with ``marker`` shown."""
    page.goto(url, wait_until="domcontentloaded", timeout=deadline.ms())
    settle(page, deadline, marker=marker or None, scope=scope)


# --- actions -----------------------------------------------------------------------------

def _click_if_there(page, key: str, deadline: Deadline) -> None:
    button = page.locator(f".st-key-{key} button")
    if button.count() and button.first.is_enabled():
        button.first.click(timeout=deadline.ms())
        settle(page, deadline)


def _shoot(page, path: Path, deadline: Deadline) -> None:
    """The whole main column as one PNG (the page scrolls inside stMain, so grow the viewport to fit it)."""
    size = 1000
    for _ in range(5):  # until the content stops growing (a rerun may still be adding elements)
        settle(page, deadline)
        height = min(int(page.evaluate("""() => document.querySelector('[data-testid="stMain"]').scrollHeight""")) + 40, 9000)
        if height <= size:
            break
        size = height
        page.set_viewport_size({"width": 1400, "height": size})
    page.screenshot(path=str(path), timeout=deadline.ms())
    page.set_viewport_size({"width": 1400, "height": 1000})


def _screenshots(page, server: str, out: Path, deadline: Deadline) -> None:
    """Every page in one session, after its 'compute' buttons, for the README.

    Explore shows the tour's last step (pass key at 8 x L_tr, Algorithm 1);
    the other pages are reached through the sidebar navigation, so they see
    that same document.
    """
    out.mkdir(parents=True, exist_ok=True)
    open_settled(page, server, deadline, marker="Answer:", scope=CARD)
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Guided tour").click(timeout=deadline.ms())
    settle(page, deadline)
    _click_if_there(page, "tour_3", deadline)
    _shoot(page, out / "explore.png", deadline)
    titles = {"calibrate": "Calibrate", "sweep": "Sweep", "theory": "Theory"}
    for name, title in titles.items():
        page.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).click(timeout=deadline.ms())
        page.wait_for_selector(f'h1:has-text("{title}")', timeout=deadline.ms())
        settle(page, deadline)
        for key in {"calibrate": ["cal_run"], "sweep": ["sw_start"], "theory": ["th_measure", "th_alg1"]}[name]:
            _click_if_there(page, key, deadline)
        _shoot(page, out / f"{name}.png", deadline)


def _slider_text(page, deadline: Deadline) -> str:
    return page.locator(TAU_SLIDER).get_attribute("aria-valuetext", timeout=deadline.ms())


def _slider_value(page, deadline: Deadline) -> float:
    return float(_slider_text(page, deadline))


def _slide_to(page, target: float, deadline: Deadline, step: float = 0.01) -> None:
    """Focus the slider and press arrows (one ``step`` each, up to 10 at a time) until it *shows* ``target``.

    After each burst it waits for the shown value to change or, if the presses
    were swallowed by a rerun redrawing the slider, for the app to settle, then
    reads the value again.
    """
    from playwright.sync_api import TimeoutError as PwTimeout

    while True:
        shown = _slider_text(page, deadline)
        steps = round((float(shown) - target) / step)
        if steps == 0:
            return
        page.locator(TAU_SLIDER).focus(timeout=deadline.ms())
        for _ in range(min(abs(steps), 10)):
            page.keyboard.press("ArrowLeft" if steps > 0 else "ArrowRight")
        try:
            page.wait_for_function(
                "([sel, v]) => { const e = document.querySelector(sel); return !e || e.getAttribute('aria-valuetext') !== v; }",
                arg=[TAU_SLIDER, shown], polling=50, timeout=deadline.ms(CHUNK_MS))
        except PwTimeout:
            settle(page, deadline)  # the press was lost: let the rerun finish, then press again


def _pmax(page, deadline: Deadline) -> float:
    card = page.locator(CARD)
    metric = card.locator('[data-testid="stMetric"]').filter(has_text="mean Pmax").locator('[data-testid="stMetricValue"]')
    return float(metric.inner_text(timeout=deadline.ms()).strip())


def _card_text(page, deadline: Deadline) -> str:
    return page.locator(CARD).inner_text(timeout=deadline.ms())


def set_tau(page, tau: float, deadline: Deadline) -> None:
    """Move the fixed-tau slider to ``tau`` and wait until the answer card was computed with it.

    The slider can show a value the server never received (a press landing
    while a rerun redraws it); then the settled card still shows the old tau,
    and one press away and back sends the value again.
    """
    want = f"tau = {tau:.3f}"
    for _ in range(6):
        _slide_to(page, tau, deadline)
        settle(page, deadline, scope=CARD)
        if want in _card_text(page, deadline):
            settle(page, deadline, marker=want, scope=CARD)
            return
        thumb = page.locator(TAU_SLIDER)
        at_max = _slider_value(page, deadline) >= float(thumb.get_attribute("aria-valuemax", timeout=deadline.ms()) or "inf")
        thumb.focus(timeout=deadline.ms())
        page.keyboard.press("ArrowLeft" if at_max else "ArrowRight")
        settle(page, deadline)
    raise AssertionError(f"the card never showed {want!r}: {_card_text(page, deadline)[:300]}")


def test_tau_moves_in_the_browser(server, page, deadline, tmp_path):
    open_settled(page, server, deadline, marker="Answer:", scope=CARD)
    assert "tau = 1.000" in _card_text(page, deadline)
    before = _pmax(page, deadline)
    assert 0 < before <= 1

    set_tau(page, 0.60, deadline)
    assert abs(_slider_value(page, deadline) - 0.60) < 1e-9
    after = _pmax(page, deadline)
    assert after > before, (before, after)
    page.screenshot(path=str(tmp_path / "explore_tau_0.6.png"), full_page=False, timeout=deadline.ms())
    assert (tmp_path / "explore_tau_0.6.png").stat().st_size > 10_000

    shots = os.environ.get("AAE_SCREENSHOTS")
    if shots:
        _screenshots(page, server, Path(shots) if Path(shots).is_absolute() else ROOT / shots, deadline)


def test_a_link_reopens_the_view_and_back_works(server, page, deadline):
    """A shared link opens exactly its view (in a fresh session), tau moves are written to the address bar,
    and the browser's back button returns to the previous tau."""
    link = f"{server}/?task=passkey&tokens=512&depth=30&seed=3&method=fixed&tau=0.7"
    open_settled(page, link, deadline, marker="tau = 0.700", scope=CARD)
    assert "tokens" in _card_text(page, deadline)
    assert abs(_slider_value(page, deadline) - 0.70) < 1e-9
    assert "512" in page.locator(".st-key-doc_tokens input").first.input_value(timeout=deadline.ms())
    # one step (one rerun, one history entry): with several presses every intermediate tau is
    # its own entry too, and back returns to the last of them
    set_tau(page, 0.69, deadline)
    page.wait_for_function("() => location.search.includes('tau=0.69')", timeout=deadline.ms(60_000))
    assert "depth=30" in page.evaluate("() => location.search")
    page.go_back(timeout=deadline.ms())
    settle(page, deadline, marker="tau = 0.700", scope=CARD)
    assert abs(_slider_value(page, deadline) - 0.70) < 1e-9
