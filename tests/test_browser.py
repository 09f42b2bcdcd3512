"""One real browser: `streamlit run app.py` + headless Chromium (Playwright), scrubbing tau on the Explore page.

Skipped only when /usr/bin/chromium (Debian's chromium package) or playwright
is missing. Uses the tiny test model unless AAE_MODEL is set.

Explore's tau views are one ``st.components.v2`` component (``ui/scrubber.py``):
the browser holds every grid tau's views and repaints on each slider event;
only a release reaches the server. The tests read what it painted from its
root's data attributes (``.aae``: data-tau, data-kind, data-shown,
data-answer, data-pmax, data-entropy, data-map-sum, data-ready, data-paints)
and compare the painted numbers with ``core.runs.engine.run`` in this process, on
the same model, document and settings (CPU float32: the same numbers).

No fixed waits: every step waits until Streamlit has *settled* (see
:func:`settle`: no running-man status widget, no stale element, every plotly
chart drawn, the state held for longer than Streamlit's 500 ms status delay)
and an expected text is on the page, or until the scrubber painted an
expected frame (:func:`press`: a log of every paint, so a frame shown for a
moment, like the nearest grid frame before the exact one, is not missed). One
generous deadline bounds a whole test (:class:`Deadline`, 10 min by default,
``AAE_BROWSER_BUDGET_S``); each wait gets what is left of it, so a busy
machine makes the test slower, not red.

To open a URL and wait for the app (e.g. a query-parameter check)::

    open_settled(page, f"{server}/?tau=0.7", deadline, marker="Answer:", scope=SCRUBBER)

Screenshots for the README: set AAE_SCREENSHOTS to a folder (e.g.
``AAE_SCREENSHOTS=assets/screenshots AAE_MODEL=<bundled model folder>``) and
the test also opens every page and saves ``<page>.png`` there.
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
from pathlib import Path
from typing import Iterator

import pytest

from conftest import build_tiny_t5
from core.values.choice import Choice

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
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
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "AAE_MODEL"} | {"PYTHONUNBUFFERED": "1"}
    if model is not None:
        env["AAE_MODEL"] = model
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
    from core.runs import engine
    from core.models import load
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
            memo[key] = engine.run(loaded, doc, chosen.to_choice(), engine.Pass(probes=cache.explore_probes(layer, head)))
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
_FIND = """const find = sel => { const e = document.querySelector(sel); if (e || !sel) return e;
    for (const h of document.querySelectorAll('*')) if (h.shadowRoot) { const x = h.shadowRoot.querySelector(sel); if (x) return x; }
    return null; };"""

#: Truthy once the app is settled and ``marker`` (if any) is inside ``scope`` (or the body), and has
#: stayed so for ``quiet`` ms; returns "exception: ..." at once when the page shows a Python exception.
#: Settled: no running-man status widget (Streamlit shows it 500 ms into a run), no stale element
#: (marked at once when a rerun is requested), no stSkeleton (an element whose JS chunk, e.g.
#: plotly's, is still loading: seen for 7 s on a busy machine after the run had ended), and every
#: plotly chart has drawn its svg. While the scrubber's grid is still coming, its polls rerun the
#: fragment every 600 ms, so the app settles once the grid is complete.
SETTLED = """([token, marker, scope, quiet]) => {
    """ + _FIND + """
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

STATE = """([scope]) => {
    """ + _FIND + """
    const root = scope ? find(scope) : document.body;
    const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"]')];
    return {status_widget: !!document.querySelector('[data-testid="stStatusWidget"]'),
            stale: document.querySelectorAll('[data-stale="true"]').length,
            skeletons: document.querySelectorAll('[data-testid="stSkeleton"]').length,
            charts: charts.length, charts_drawn: charts.filter(c => c.querySelector('.main-svg')).length,
            scope_found: !!root, scrubber: root && root.dataset ? Object.assign({}, root.dataset) : null,
            text: root ? root.innerText.slice(0, 400) : null};
}"""

_tokens = iter(range(1, 1 << 30))


def _server_of(page) -> subprocess.Popen | None:
    parts = urllib.parse.urlsplit(page.url)
    return _SERVERS.get(f"{parts.scheme}://{parts.netloc}")


def _check_server(page) -> None:
    proc = _server_of(page)
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
            raise AssertionError(f"app not settled with {marker!r} in {scope or 'the page'} "
                                 f"within the {deadline.seconds:.0f} s deadline: {state}")
        try:
            handle = page.wait_for_function(SETTLED, arg=[token, marker, scope, QUIET_MS], polling=150,
                                            timeout=max(1.0, min(left_ms, CHUNK_MS)))
        except PwTimeout:
            _check_server(page)
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
_LOG = """(r) => {
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

#: The first paint logged since the last :data:`_LOG` call whose fields equal ``want``, else the present state if it
#: does; "exception: ..." when the page shows one.
_FIND_PAINT = """([want]) => {
    """ + _FIND + """
    const exc = document.querySelector('[data-testid="stException"]');
    if (exc) return {exception: exc.innerText.slice(0, 600)};
    const fits = e => Object.entries(want).every(([k, v]) => e[k] === v);
    const S = window.__scrub, logged = S && S.root && S.root.isConnected ? S.log.find(fits) : null;
    if (logged) return logged;
    const r = find('.aae');
    return r && fits(r.dataset) ? Object.assign({}, r.dataset) : false;
}"""


def scrubber(page, deadline: Deadline) -> dict:
    """What the scrubber shows now: its data attributes (tau, kind, shown, answer, pmax, entropy, mapSum, ready...)."""
    return page.locator(SCRUBBER).evaluate("(r) => Object.assign({}, r.dataset)", timeout=deadline.ms())


def _stuck_state(page) -> str:
    """What the page shows when a wait ran out (bounded on its own: the test's deadline has passed already)."""
    try:
        got = page.evaluate("""() => { """ + _FIND + """
            const r = find('.aae'), S = window.__scrub;
            return {dataset: r ? Object.assign({}, r.dataset) : null, connected: !!(S && S.root && S.root.isConnected),
                    log: S ? S.log.slice(-6) : null, url: location.href,
                    status: !!document.querySelector('[data-testid="stStatusWidget"]'),
                    stale: document.querySelectorAll('[data-stale="true"]').length,
                    text: r ? r.innerText.slice(0, 400) : null}; }""")
    except Exception as err:  # noqa: BLE001 - a diagnostic must not hide the failure it describes
        return f"(the page could not be read: {err})"
    return f"it shows {got}"


def wait_painted(page, want: dict, deadline: Deadline) -> dict:
    """Wait until the scrubber painted a frame whose data attributes equal ``want`` (logged since the last action)."""
    from playwright.sync_api import TimeoutError as PwTimeout

    while True:
        try:
            handle = page.wait_for_function(_FIND_PAINT, arg=[want], polling=50, timeout=deadline.ms(CHUNK_MS))
        except PwTimeout:
            _check_server(page)
            if deadline.left() <= 0:
                raise AssertionError(f"the scrubber never painted {want}: {_stuck_state(page)}") from None
            continue
        got = handle.json_value()
        if "exception" in got:
            raise AssertionError(f"the app raised: {got['exception']}")
        return got


def press(page, key: str, want: dict, deadline: Deadline) -> dict:
    """Press ``key`` on the scrubber's slider and wait until it painted a frame with ``want`` (returns its attributes)."""
    page.locator(SCRUBBER).evaluate(_LOG, timeout=deadline.ms())
    page.locator(TAU_SLIDER).focus(timeout=deadline.ms())
    page.keyboard.press(key)
    return wait_painted(page, want, deadline)


def wait_grid(page, deadline: Deadline) -> None:
    """Wait until every grid frame reached the browser (data-ready 15/15) and the app is idle again."""
    from playwright.sync_api import expect

    expect(page.locator(SCRUBBER)).to_have_attribute("data-ready", f"{len(GRID)}/{len(GRID)}", timeout=deadline.ms())
    settle(page, deadline)


def _url_tau(page) -> str | None:
    return urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query).get("tau", [None])[0]


def set_tau(page, tau: float, deadline: Deadline) -> None:
    """Move the scrubber's slider to ``tau`` with the arrow keys (0.01 each) and wait until the server has it:
    the frame of that tau painted (a grid frame, or the exact one), the URL written, the app settled."""
    want = f"{tau:.2f}"
    now = scrubber(page, deadline)["tau"]
    steps = round((float(want) - float(now)) * 100)
    page.locator(SCRUBBER).evaluate(_LOG, timeout=deadline.ms())
    page.locator(TAU_SLIDER).focus(timeout=deadline.ms())
    for _ in range(abs(steps)):
        page.keyboard.press("ArrowRight" if steps > 0 else "ArrowLeft")
    kind = "grid" if want in GRID else "exact"
    wait_painted(page, {"tau": want, "kind": kind}, deadline)
    page.wait_for_function("v => new URLSearchParams(location.search).get('tau') === v", arg=want,
                           timeout=deadline.ms())
    settle(page, deadline)


def _map_layer(page, deadline: Deadline) -> tuple[int, int | None]:
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

def _click_if_there(page, key: str, deadline: Deadline) -> None:
    button = page.locator(f".st-key-{key} button")
    if button.count() and button.first.is_enabled():
        button.first.click(timeout=deadline.ms())
        settle(page, deadline)


def _go(page, title: str, deadline: Deadline, shown: str | None = None) -> None:
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
    open_settled(page, server, deadline, marker="Answer:", scope=SCRUBBER)
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Guided tour").click(timeout=deadline.ms())
    settle(page, deadline)
    _click_if_there(page, "tour_3", deadline)
    settle(page, deadline, marker="Answer:", scope=SCRUBBER)
    _shoot(page, out / "explore.png", deadline)
    titles = {"calibrate": "Calibrate", "sweep": "Sweep", "theory": "Theory"}
    for name, title in titles.items():
        _go(page, title, deadline)
        for key in {"calibrate": ["cal_run"], "sweep": ["sw_start"], "theory": ["th_measure", "th_alg1"]}[name]:
            _click_if_there(page, key, deadline)
        _shoot(page, out / f"{name}.png", deadline)


# --- the tests ---------------------------------------------------------------------------

def test_scrubbing_the_grid_paints_the_servers_frames(server, page, deadline, engine_at, tmp_path):
    """PageDown from 1.00 to 0.30 and PageUp back: every grid tau paints its own frame (answer, meters, map) with
    no server round trip, the same frame both ways, and at 0.70 and 0.50 the numbers of this process's pass."""
    open_settled(page, link(server, tau=1.0), deadline, marker="Answer:", scope=SCRUBBER)
    first = scrubber(page, deadline)
    assert (first["tau"], first["kind"], first["shown"]) == ("1.00", "grid", "1.00"), first
    assert "512 tokens" in page.locator(SCRUBBER).inner_text(timeout=deadline.ms())
    wait_grid(page, deadline)

    down = {"1.00": scrubber(page, deadline)}
    for tau in GRID[1:]:
        down[tau] = press(page, "PageDown", {"tau": tau, "kind": "grid"}, deadline)
        assert down[tau]["shown"] == tau and down[tau]["ready"] == "15/15", down[tau]
    page.screenshot(path=str(tmp_path / "explore_tau_0.3.png"), timeout=deadline.ms())
    assert (tmp_path / "explore_tau_0.3.png").stat().st_size > 10_000
    up = {}
    for tau in GRID[-2::-1]:
        up[tau] = press(page, "PageUp", {"tau": tau, "kind": "grid"}, deadline)

    fields = ("answer", "pmax", "entropy", "mapSum")
    for tau in GRID[:-1]:  # a frame is what it is, whichever way the slider came
        assert [up[tau][f] for f in fields] == [down[tau][f] for f in fields], (tau, up[tau], down[tau])
    pmax = [float(down[t]["pmax"]) for t in GRID]
    entropy = [float(down[t]["entropy"]) for t in GRID]
    assert len(set(pmax)) == len(GRID) and len(set(entropy)) == len(GRID), (pmax, entropy)  # the meters move
    assert pmax[-1] > pmax[0] and entropy[-1] < entropy[0], (pmax, entropy)  # a smaller tau sharpens attention
    assert len({down[t]["mapSum"] for t in GRID}) > 1, [down[t]["mapSum"] for t in GRID]  # the map changes
    card = page.locator('.aae .card[data-side="chosen"]').inner_text(timeout=deadline.ms())
    assert f"Answer: {down['1.00']['answer'] or '(empty)'}" in card, card  # the card shows the frame's answer

    # The painted numbers are the server's passes: equal to this process's at two grid taus (Pmax, H, answer), and
    # the answer follows the pass at both ends too (the tiny random model writes '' at every tau: its decoder
    # ends at once; a trained model's answer changes along the grid, and equality covers that as well).
    layer, head = _map_layer(page, deadline)
    for tau in ("0.70", "0.50"):
        assert_frame_is_the_pass(down[tau], engine_at(float(tau), layer, head), f"grid tau {tau}")
    for tau in ("1.00", "0.30"):
        assert down[tau]["answer"] == engine_at(float(tau), layer, head).answer, (tau, down[tau])

    shots = os.environ.get("AAE_SCREENSHOTS")
    if shots:
        _screenshots(page, server, Path(shots) if Path(shots).is_absolute() else ROOT / shots, deadline)


def _finishes_a_run(message) -> bool:
    """Whether a websocket message from the server is Streamlit's ``script_finished`` (the end of a run)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    try:
        return isinstance(message, bytes) and ForwardMsg.FromString(message).WhichOneof("type") == "script_finished"
    except Exception:  # not one ForwardMsg
        return False


def test_a_grid_frame_lost_on_the_wire_is_sent_again(server, page, deadline):
    """Streamlit drops the messages a run queued when a newer run starts, so a grid frame the server handed over may
    never reach the browser (and the server cannot know). Here that happens on the websocket, as Streamlit does it:
    the first delta that carries frames is dropped together with the rest of its run (up to and with its
    ``script_finished``: the browser never learns that run ended, as with a run a newer one replaced), and the next
    run (a poll, or the key press below) arrives as usual. The browser finds the gap in that run's list of held
    frames, asks for everything, and the grid still completes and paints every frame (before the fix, the grid
    stopped short for good: 'k/15', the server idle).

    Dropping the element message alone is not what Streamlit does: the run then finishes in the browser, which
    removes the scrubber as an element that run did not draw. A 2,048-token document keeps the grid filling over
    several polls, so a delta with frames goes by on any machine."""
    dropped: list[int] = []
    state = {"dropping": False}

    def route(ws) -> None:
        upstream = ws.connect_to_server()
        ws.on_message(upstream.send)

        def down(message) -> None:
            if state["dropping"]:
                state["dropping"] = not _finishes_a_run(message)
                return
            if not dropped and isinstance(message, bytes) and b'"delta":true' in message and b'"frames":{"' in message:
                dropped.append(len(message))
                state["dropping"] = not _finishes_a_run(message)
                return
            ws.send(message)

        upstream.on_message(down)

    page.route_web_socket(re.compile(r".*/_stcore/stream"), route)
    open_settled(page, link(server, tau=1.0, seed=11, tokens=2048), deadline, marker="Answer:", scope=SCRUBBER)
    wait_grid(page, deadline)
    assert dropped, "no delta with frames went by: the test did not drop anything"
    for tau in GRID[1:]:
        got = press(page, "PageDown", {"tau": tau, "kind": "grid"}, deadline)
        assert got["shown"] == tau, got


def test_an_off_grid_tau_shows_the_nearest_frame_then_the_exact_one(server, page, deadline, engine_at):
    """ArrowLeft from 0.70: the nearest grid frame (0.70) at once, marked "nearest"; after the release the
    server's exact pass of 0.69 replaces it, with this process's numbers, and the URL carries tau=0.69."""
    open_settled(page, link(server, tau=0.7), deadline, marker="Answer:", scope=SCRUBBER)
    at70 = scrubber(page, deadline)
    assert (at70["tau"], at70["kind"]) == ("0.70", "grid"), at70
    near = press(page, "ArrowLeft", {"tau": "0.69", "kind": "nearest"}, deadline)
    assert near["shown"] == "0.70" and near["pmax"] == at70["pmax"] and near["answer"] == at70["answer"], (near, at70)
    exact = wait_painted(page, {"tau": "0.69", "kind": "exact"}, deadline)
    assert exact["shown"] == "0.69", exact
    page.wait_for_function("() => new URLSearchParams(location.search).get('tau') === '0.69'", timeout=deadline.ms())
    settle(page, deadline)
    layer, head = _map_layer(page, deadline)
    assert_frame_is_the_pass(exact, engine_at(0.69, layer, head), "exact tau 0.69")
    assert exact["pmax"] != at70["pmax"], (exact, at70)
    assert scrubber(page, deadline)["kind"] == "exact"  # and it stays


def test_a_link_reopens_the_view_and_back_and_navigation_work(server, page, deadline):
    """A shared link opens exactly its view (in a fresh session); a released tau is written to the address bar,
    the browser's back button returns to the previous tau, and a trip to Calibrate and back keeps it."""
    open_settled(page, link(server, tau=0.7), deadline, marker="Answer:", scope=SCRUBBER)
    shown = scrubber(page, deadline)
    assert (shown["tau"], shown["kind"]) == ("0.70", "grid"), shown
    assert float(page.locator(TAU_SLIDER).input_value(timeout=deadline.ms())) == 0.70
    assert "512 tokens" in page.locator(SCRUBBER).inner_text(timeout=deadline.ms())
    assert "512" in page.locator(".st-key-doc_tokens input").first.input_value(timeout=deadline.ms())
    # one step, one release (one rerun, one history entry)
    set_tau(page, 0.69, deadline)
    assert "depth=30" in page.evaluate("() => location.search")
    page.go_back(timeout=deadline.ms())
    page.wait_for_function("() => new URLSearchParams(location.search).get('tau') === '0.70'", timeout=deadline.ms())
    wait_painted(page, {"tau": "0.70", "kind": "grid"}, deadline)
    settle(page, deadline, marker="Answer:", scope=SCRUBBER)
    assert float(page.locator(TAU_SLIDER).input_value(timeout=deadline.ms())) == 0.70

    _go(page, "Calibrate", deadline)
    _go(page, "Explore", deadline)
    settle(page, deadline, marker="Answer:", scope=SCRUBBER)
    back = scrubber(page, deadline)
    assert (back["tau"], back["kind"]) == ("0.70", "grid"), back
    assert _url_tau(page) == "0.70"


# --- a rotary masked-LM model (issue 38) --------------------------------------------------

@pytest.fixture(scope="module")
def rope_server(model_ref, tmp_path_factory):
    """A second `streamlit run app.py`, opening a tiny random ModernBERT masked LM (L_tr 64) through AAE_MODEL: the
    cosine variant (s = 16), so one server shows both axes of its slider, tau and CosScale s."""
    from conftest import build_tiny_rope

    folder = str(build_tiny_rope(tmp_path_factory.mktemp("browser-rope"), train_length=64, cosine=16.0))
    with serving(folder) as url:
        yield url, folder


def test_a_rope_model_opens_and_tau_moves_its_masked_token_card(rope_server, page, deadline):
    """The RoPE model in a real browser: Explore paints the masked tokens' card, PageDown moves tau along the grid,
    and the painted accuracy and perplexity are core.experiments.mlm's own score of the same document at that tau."""
    import math

    from core.experiments import mlm
    from core.models import load

    url, folder = rope_server
    open_settled(page, f"{url}/?tokens=128&seed=2&method=fixed&tau=1.0", deadline, marker="masked tokens:",
                 scope=SCRUBBER)
    first = scrubber(page, deadline)
    assert (first["tau"], first["kind"]) == ("1.00", "grid"), first
    painted = {"1.00": first}
    for tau in GRID[1:5]:
        painted[tau] = press(page, "PageDown", {"tau": tau, "kind": "grid"}, deadline)
    loaded = load(folder, device="cpu")
    _, seq = mlm.sequence(loaded, 128, seed=2)
    for tau in ("1.00", "0.80"):
        s = mlm.score(loaded, [seq], Choice.of(tau=float(tau)))
        assert float(painted[tau]["accuracy"]) == pytest.approx(s.correct / s.masked), (tau, painted[tau])
        assert float(painted[tau]["mlmPerplexity"]) == pytest.approx(math.exp(s.nll / s.masked), rel=1e-4), tau
    assert float(painted["0.80"]["pmax"]) > float(painted["1.00"]["pmax"])  # a smaller tau sharpens attention
    card = page.locator('.aae .card[data-side="chosen"]').inner_text(timeout=deadline.ms())
    assert "masked tokens: accuracy" in card and "→" in card, card


def test_a_cosine_rope_models_slider_moves_cosscale(rope_server, page, deadline):
    """The same model's slider switched to CosScale s: PageDown moves s along its grid in the browser, and the
    painted masked-token numbers are core.experiments.mlm's own score of the document at that s (tau = 1)."""
    import math

    from core.experiments import mlm
    from core.models import load

    url, folder = rope_server
    loaded = load(folder, device="cpu")
    open_settled(page, f"{url}/?tokens=128&seed=3&method=fixed&tau=1.0", deadline, marker="masked tokens:",
                 scope=SCRUBBER)
    page.get_by_test_id("stRadioGroup").get_by_text("CosScale s", exact=True).click(timeout=deadline.ms())
    here = wait_painted(page, {"tau": "16.00", "kind": "grid"}, deadline)  # the slider now holds the trained s
    wait_grid(page, deadline)
    page.locator(TAU_SLIDER).focus(timeout=deadline.ms())
    page.keyboard.press("PageDown")
    while True:  # the slider moved off the trained s: the frame painted is the one at the value it shows
        lower = scrubber(page, deadline)
        if lower["tau"] != "16.00" and lower["shown"] not in ("", "16.00"):
            break
        page.wait_for_timeout(100)
    s = float(lower["shown"])
    _, seq = mlm.sequence(loaded, 128, seed=3)
    for painted, scale in ((here, 16.0), (lower, s)):
        got = mlm.score(loaded, [seq], Choice.of(tau=1.0, cosine_scale=scale))
        assert float(painted["accuracy"]) == pytest.approx(got.correct / got.masked), (scale, painted)
        assert float(painted["mlmPerplexity"]) == pytest.approx(math.exp(got.nll / got.masked), rel=1e-4), scale
    assert float(lower["pmax"]) < float(here["pmax"])  # a smaller s flattens the softmax of s * cos(q, k)
