"""What every real-browser test shares: a `streamlit run` server, a headless Chromium page (Playwright), one
deadline per test, and the waits that read Streamlit's running state and the scrubber's paints.

The fixtures (``model_ref``, ``server``, ``engine_at``, ``deadline``, ``page``) reach every test through
``pytest_plugins`` in tests/conftest.py; the helpers are imported by name (``from support.browser import settle``).
How the waits work (no fixed sleeps; one generous deadline, ``AAE_BROWSER_BUDGET_S``, 10 min by default; a busy
machine makes a test slower, not red) is told in tests/browser/test_scrubber_browser.py's docstring.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import build_tiny_t5

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PAGES = ("explore", "calibrate", "sweep", "theory")
SCRUBBER = ".aae"  # the scrubber's root, inside the component's open shadow root (Playwright's CSS pierces it)
TAU_SLIDER = ".aae input[type=range]"
#: The scrubber's grid (core.views.frames.SCRUB_GRID), as the component writes taus.
GRID = tuple(f"{1 - 0.05 * i:.2f}" for i in range(15))
#: The document every test opens (a link: a fresh session shows exactly this), 2 x the tiny model's L_tr.
DOC = {"task": "passkey", "tokens": 512, "depth": 30, "seed": 3}
#: Seconds one test may take in all (server start excluded); a busy 2-core machine needs far less.
BUDGET_S = float(os.environ.get("AAE_BROWSER_BUDGET_S", "600")) + (1200 if os.environ.get("AAE_SCREENSHOTS") else 0)
SERVER_START_S = 300.0
#: Longer than Streamlit's delay before it shows the running-man widget (500 ms in 1.67):
#: a state that holds this long is not the gap between a run's start and its widget.
QUIET_MS = 700
CHUNK_MS = 15_000  # waits are cut in chunks so a dead server fails the test at once
TOL = 1e-6  # painted Pmax / H (6 decimals) against this process's pass
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url: str, proc: subprocess.Popen, timeout: float = SERVER_START_S) -> None:
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
def model_ref(tmp_path_factory) -> str:
    """The model the server shows: AAE_MODEL, else a tiny random T5 (L_tr 256) built here."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (Debian) to run the browser test")
    pytest.importorskip("playwright.sync_api", reason="playwright (python) is not installed")
    return os.environ.get("AAE_MODEL") or str(build_tiny_t5(tmp_path_factory.mktemp("browser-t5"), train_length=256))


@contextlib.contextmanager
def serving(model: str | None) -> Iterator[str]:
    """The base URL of a `streamlit run app.py` whose default model is ``model`` (AAE_MODEL; None: the bundled
    default, AAE_MODEL unset), stopped on exit."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium (Debian) to run the browser test")
    pytest.importorskip("playwright.sync_api", reason="playwright (python) is not installed")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "AAE_MODEL"} | {"PYTHONUNBUFFERED": "1"}
    if model is not None:
        env["AAE_MODEL"] = model
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            "app.py",
            "--server.headless",
            "true",
            "--server.address",
            "127.0.0.1",
            "--server.port",
            str(port),
            "--browser.gatherUsageStats",
            "false",
            "--server.fileWatcherType",
            "none",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    _SERVERS[url] = proc
    try:
        wait_health(url, proc)
        yield url
    finally:
        _SERVERS.pop(url, None)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def server(model_ref):
    """The base URL of a `streamlit run app.py` serving the tiny model (or AAE_MODEL)."""
    with serving(model_ref) as url:
        yield url


@pytest.fixture(scope="module")
def engine_at(model_ref):
    """tau -> the pass the server paints for :data:`DOC` at that fixed tau, computed in this process.

    The same settings as a grid frame of the scrubber (``ui/scrubber.py``:
    ``ctx.pair(tau=t, method="fixed", probes=cache.explore_probes(layer, head))``) and the document
    the sidebar builds from the link.
    """
    from core.models import load
    from core.runs import engine
    from core.runs.settings import DocumentRequest, Settings
    from ui import cache

    loaded = load(model_ref, device="cpu")
    req = DocumentRequest(task=DOC["task"], tokens=DOC["tokens"], depth=DOC["depth"] / 100, seed=DOC["seed"])
    doc = req.build(loaded.tokenizer, loaded.train_length)
    memo: dict[tuple, engine.Result] = {}

    def at(tau: float, layer: int, head: int | None = None) -> engine.Result:
        key = (round(tau, 2), layer, head)
        if key not in memo:
            t = round(tau, 2)
            chosen = Settings(method="fixed", tau=t, targets=("encoder",), cosine_scale=None)
            memo[key] = engine.run(
                loaded, doc, chosen.to_choice(), engine.Pass(probes=cache.explore_probes(layer, head))
            )
        return memo[key]

    return at


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


def link(server: str, **view) -> str:
    """The app's URL showing :data:`DOC` with a fixed tau (``tau=0.7``) or other view parameters."""
    q = {**{k: str(v) for k, v in DOC.items()}, "method": "fixed", **{k: str(v) for k, v in view.items()}}
    return f"{server}/?{urllib.parse.urlencode(q)}"


# --- waiting on Streamlit's own state ----------------------------------------------

#: Finds a selector in the document or inside an open shadow root (the scrubber's component).
FIND = """const find = sel => { const e = document.querySelector(sel); if (e || !sel) return e;
    for (const h of document.querySelectorAll('*')) if (h.shadowRoot) { const x = h.shadowRoot.querySelector(sel); if (x) return x; }
    return null; };"""

#: Truthy once the app is settled and ``marker`` (if any) is inside ``scope`` (or the body), and has
#: stayed so for ``quiet`` ms; returns "exception: ..." at once when the page shows a Python exception.
#: Settled: no running-man status widget (Streamlit shows it 500 ms into a run), no stale element
#: (marked at once when a rerun is requested), no stSkeleton (an element whose JS chunk, e.g.
#: plotly's, is still loading: seen for 7 s on a busy machine after the run had ended), and every
#: plotly chart has drawn its svg. While the scrubber's grid is still coming, its polls rerun the
#: fragment every 600 ms, so the app settles once the grid is complete.
SETTLED = (
    """([token, marker, scope, quiet]) => {
    """
    + FIND
    + """
    const exc = document.querySelector('[data-testid="stException"]');
    if (exc) return 'exception: ' + exc.innerText.slice(0, 600);
    const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')];
    const busy = document.querySelector('[data-testid="stStatusWidget"]')
        || document.querySelector('[data-stale="true"]')
        || document.querySelector('[data-testid="stSkeleton"]')
        || charts.some(c => !c.querySelector('.main-svg'))
        || !document.querySelector('[data-testid="stMain"]');
    const root = scope ? find(scope) : document.body;
    const ok = !busy && root && (!marker || root.innerText.includes(marker));
    const now = performance.now();
    if (!window.__aaeQuiet || window.__aaeQuiet.token !== token) window.__aaeQuiet = {token, since: null};
    if (!ok) { window.__aaeQuiet.since = null; return false; }
    if (window.__aaeQuiet.since === null) window.__aaeQuiet.since = now;
    return now - window.__aaeQuiet.since >= quiet ? 'ok' : false;
}"""
)

STATE = (
    """([scope]) => {
    """
    + FIND
    + """
    const root = scope ? find(scope) : document.body;
    const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')];
    return {status_widget: !!document.querySelector('[data-testid="stStatusWidget"]'),
            stale: document.querySelectorAll('[data-stale="true"]').length,
            skeletons: document.querySelectorAll('[data-testid="stSkeleton"]').length,
            charts: charts.length, charts_drawn: charts.filter(c => c.querySelector('.main-svg')).length,
            scope_found: !!root, scrubber: root && root.dataset ? Object.assign({}, root.dataset) : null,
            text: root ? root.innerText.slice(0, 400) : null};
}"""
)

_tokens = iter(range(1, 1 << 30))


def server_of(page) -> subprocess.Popen | None:
    parts = urllib.parse.urlsplit(page.url)
    return _SERVERS.get(f"{parts.scheme}://{parts.netloc}")


def check_server(page) -> None:
    proc = server_of(page)
    if proc is not None and proc.poll() is not None:
        raise RuntimeError(f"streamlit died ({proc.returncode}): {proc.stdout.read()[-2000:]}")


def settle(page, deadline: Deadline, marker: str | None = None, scope: str | None = None) -> None:
    """Wait until Streamlit is idle (no status widget, nothing stale, every plotly chart drawn)
    and ``marker`` shows inside ``scope`` (``.aae``: inside the scrubber), for as long as the deadline allows.

    Fails at once on a Python exception in the page or a dead server; on the
    deadline it says what the page looked like.
    """
    from playwright.sync_api import TimeoutError as PwTimeout

    token = next(_tokens)
    while True:
        left_ms = deadline.left() * 1000
        if left_ms <= 0:
            state = page.evaluate(STATE, [scope])
            raise AssertionError(
                f"app not settled with {marker!r} in {scope or 'the page'} "
                f"within the {deadline.seconds:.0f} s deadline: {state}"
            )
        try:
            handle = page.wait_for_function(
                SETTLED, arg=[token, marker, scope, QUIET_MS], polling=150, timeout=max(1.0, min(left_ms, CHUNK_MS))
            )
        except PwTimeout:
            check_server(page)
            continue
        result = handle.json_value()
        if isinstance(result, str) and result.startswith("exception"):
            raise AssertionError(f"the app raised: {result}")
        return


def open_settled(page, url: str, deadline: Deadline, marker: str | None = None, scope: str | None = None) -> None:
    """Open ``url`` (any app URL, query parameters included) and wait until it settled with ``marker`` shown."""
    page.goto(url, wait_until="domcontentloaded", timeout=deadline.ms())
    settle(page, deadline, marker=marker or None, scope=scope)


# --- the scrubber ---------------------------------------------------------------------

#: Installs (once per root) a log of the scrubber's paints: what each showed, from a MutationObserver on data-paints.
PAINT_LOG = """(r) => {
    const S = window.__scrub = window.__scrub || {log: [], root: null};
    S.snap = () => Object.assign({}, r.dataset);
    if (S.root !== r) {
        if (S.obs) S.obs.disconnect();
        S.root = r;
        S.obs = new MutationObserver(() => S.log.push(Object.assign({}, r.dataset)));
        S.obs.observe(r, {attributes: true, attributeFilter: ['data-paints']});
    }
    S.log = [];
}"""

#: The first paint logged since the last :data:`PAINT_LOG` call whose fields equal ``want``, else the present state if it
#: does; "exception: ..." when the page shows one.
FIND_PAINT = (
    """([want]) => {
    """
    + FIND
    + """
    const exc = document.querySelector('[data-testid="stException"]');
    if (exc) return {exception: exc.innerText.slice(0, 600)};
    const fits = e => Object.entries(want).every(([k, v]) => e[k] === v);
    const S = window.__scrub, logged = S && S.root && S.root.isConnected ? S.log.find(fits) : null;
    if (logged) return logged;
    const r = find('.aae');
    return r && fits(r.dataset) ? Object.assign({}, r.dataset) : false;
}"""
)


def scrubber(page, deadline: Deadline) -> dict:
    """What the scrubber shows now: its data attributes (tau, kind, shown, answer, pmax, entropy, mapSum, ready...)."""
    return page.locator(SCRUBBER).evaluate("(r) => Object.assign({}, r.dataset)", timeout=deadline.ms())


def stuck_state(page) -> str:
    """What the page shows when a wait ran out (bounded on its own: the test's deadline has passed already)."""
    try:
        got = page.evaluate(
            """() => { """
            + FIND
            + """
            const r = find('.aae'), S = window.__scrub;
            return {dataset: r ? Object.assign({}, r.dataset) : null, connected: !!(S && S.root && S.root.isConnected),
                    log: S ? S.log.slice(-6) : null, url: location.href,
                    status: !!document.querySelector('[data-testid="stStatusWidget"]'),
                    stale: document.querySelectorAll('[data-stale="true"]').length,
                    text: r ? r.innerText.slice(0, 400) : null}; }"""
        )
    except Exception as err:  # noqa: BLE001 - a diagnostic must not hide the failure it describes
        return f"(the page could not be read: {err})"
    return f"it shows {got}"


def wait_painted(page, want: dict, deadline: Deadline) -> dict:
    """Wait until the scrubber painted a frame whose data attributes equal ``want`` (logged since the last action)."""
    from playwright.sync_api import TimeoutError as PwTimeout

    while True:
        try:
            handle = page.wait_for_function(FIND_PAINT, arg=[want], polling=50, timeout=deadline.ms(CHUNK_MS))
        except PwTimeout:
            check_server(page)
            if deadline.left() <= 0:
                raise AssertionError(f"the scrubber never painted {want}: {stuck_state(page)}") from None
            continue
        got = handle.json_value()
        if "exception" in got:
            raise AssertionError(f"the app raised: {got['exception']}")
        return got


def press(page, key: str, want: dict, deadline: Deadline) -> dict:
    """Press ``key`` on the scrubber's slider and wait until it painted a frame with ``want`` (returns its attributes)."""
    page.locator(SCRUBBER).evaluate(PAINT_LOG, timeout=deadline.ms())
    page.locator(TAU_SLIDER).focus(timeout=deadline.ms())
    page.keyboard.press(key)
    return wait_painted(page, want, deadline)


def wait_grid(page, deadline: Deadline) -> None:
    """Wait until every grid frame reached the browser (data-ready 15/15) and the app is idle again."""
    from playwright.sync_api import expect

    expect(page.locator(SCRUBBER)).to_have_attribute("data-ready", f"{len(GRID)}/{len(GRID)}", timeout=deadline.ms())
    settle(page, deadline)


def url_tau(page) -> str | None:
    return urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query).get("tau", [None])[0]


def set_tau(page, tau: float, deadline: Deadline) -> None:
    """Move the scrubber's slider to ``tau`` with the arrow keys (0.01 each) and wait until the server has it:
    the frame of that tau painted (a grid frame, or the exact one), the URL written, the app settled."""
    want = f"{tau:.2f}"
    now = scrubber(page, deadline)["tau"]
    steps = round((float(want) - float(now)) * 100)
    page.locator(SCRUBBER).evaluate(PAINT_LOG, timeout=deadline.ms())
    page.locator(TAU_SLIDER).focus(timeout=deadline.ms())
    for _ in range(abs(steps)):
        page.keyboard.press("ArrowRight" if steps > 0 else "ArrowLeft")
    kind = "grid" if want in GRID else "exact"
    wait_painted(page, {"tau": want, "kind": kind}, deadline)
    page.wait_for_function(
        "v => new URLSearchParams(location.search).get('tau') === v", arg=want, timeout=deadline.ms()
    )
    settle(page, deadline)


def map_layer(page, deadline: Deadline) -> tuple[int, int | None]:
    """The encoder layer and head of the scrubber's map (what the passes record), from its caption."""
    text = page.locator(SCRUBBER).inner_text(timeout=deadline.ms())
    m = re.search(r"self-attention of layer (\d+) \((mean of heads|head (\d+))\)", text)
    assert m, text[:600]
    return int(m.group(1)), None if m.group(3) is None else int(m.group(3))


def assert_frame_is_the_pass(frame: dict, res, where: str) -> None:
    """The painted answer, mean Pmax and mean H of a frame are this process's pass (within :data:`TOL`)."""
    assert frame["answer"] == res.answer, (where, frame["answer"], res.answer)
    assert abs(float(frame["pmax"]) - float(res.pmax)) <= TOL, (where, frame["pmax"], res.pmax)
    assert abs(float(frame["entropy"]) - float(res.entropy)) <= TOL, (where, frame["entropy"], res.entropy)


# --- actions -----------------------------------------------------------------------------


def click_if_there(page, key: str, deadline: Deadline) -> None:
    button = page.locator(f".st-key-{key} button")
    if button.count() and button.first.is_enabled():
        button.first.click(timeout=deadline.ms())
        settle(page, deadline)


def go(page, title: str, deadline: Deadline, shown: str | None = None) -> None:
    """Open a page through the sidebar navigation and wait until it settled (and ``shown``, a selector, is there)."""
    page.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).first.click(timeout=deadline.ms())
    page.wait_for_selector(f'h1:has-text("{title}")', timeout=deadline.ms())
    if shown:
        page.wait_for_selector(shown, timeout=deadline.ms())
    settle(page, deadline)


def choose(page, key: str, label: str, deadline: Deadline, wait: bool = True) -> None:
    """Pick ``label`` in the selectbox of ``key`` as a person does (click, then the option); then, with ``wait``,
    wait until the app settled."""
    from playwright.sync_api import TimeoutError as PwTimeout

    box = page.locator(f".st-key-{key} input[role=combobox]").first
    box.click(timeout=deadline.ms())
    try:  # a click may only focus the box (seen in the sidebar): then the arrow key opens its list
        page.locator('[role="option"]').first.wait_for(timeout=deadline.ms(3000))
    except PwTimeout:
        box.press("ArrowDown", timeout=deadline.ms())
    options = page.locator('[role="option"]')
    exact = options.filter(has_text=re.compile(rf"^\s*{re.escape(label)}\s*$"))  # "retrieval-t5", not "...-t5-cos"
    (exact if exact.count() else options.filter(has_text=label)).first.click(timeout=deadline.ms())
    if wait:
        settle(page, deadline)


def shoot(page, path: Path, deadline: Deadline) -> None:
    """The whole main column as one PNG (the page scrolls inside stMain, so grow the viewport to fit it)."""
    size = 1000
    for _ in range(5):  # until the content stops growing (a rerun may still be adding elements)
        settle(page, deadline)
        height = min(
            int(page.evaluate("""() => document.querySelector('[data-testid="stMain"]').scrollHeight""")) + 40, 9000
        )
        if height <= size:
            break
        size = height
        page.set_viewport_size({"width": 1400, "height": size})
    page.screenshot(path=str(path), timeout=deadline.ms())
    page.set_viewport_size({"width": 1400, "height": 1000})


def open_tour(page, deadline: Deadline) -> None:
    """The guided tour's expander open. A new session lands with it open at step 1 (ui.tour.land), so a click on
    its summary would close it: click only when it is closed."""
    details = page.locator('[data-testid="stExpander"] details').filter(has_text="Guided tour")
    details.wait_for(timeout=deadline.ms())
    if details.get_attribute("open", timeout=deadline.ms()) is None:
        details.locator("summary").click(timeout=deadline.ms())


def screenshots(page, server: str, out: Path, deadline: Deadline) -> None:
    """Every page in one session, after its 'compute' buttons, for the README.

    Explore shows the tour's last step (pass key at 8 x L_tr, Algorithm 1);
    the other pages are reached through the sidebar navigation, so they see
    that same document.
    """
    out.mkdir(parents=True, exist_ok=True)
    open_settled(page, server, deadline, marker="Answer:", scope=SCRUBBER)
    open_tour(page, deadline)
    settle(page, deadline)
    click_if_there(page, "tour_3", deadline)
    settle(page, deadline, marker="Answer:", scope=SCRUBBER)
    shoot(page, out / "explore.png", deadline)
    titles = {"calibrate": "Calibrate", "sweep": "Sweep", "theory": "Theory"}
    for name, title in titles.items():
        go(page, title, deadline)
        for key in {"calibrate": ["cal_run"], "sweep": ["sw_start"], "theory": ["th_measure", "th_alg1"]}[name]:
            click_if_there(page, key, deadline)
        shoot(page, out / f"{name}.png", deadline)


# --- the tests ---------------------------------------------------------------------------
