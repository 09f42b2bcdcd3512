"""What a person at the browser waits for: the app timed in headless Chromium, from the input to the paint.

    python bench/browser_latency.py [--model NAME|FOLDER] [--repeats 5] [--cold-repeats N] [--multiple 8] [--json]
                                    [--skip cold,calibrate,theory,backend] [--screenshot DIR] [--timeout 300]
                                    [--idle-before-moves SECONDS]

Why: ``bench/app_latency.py`` times only the backend (the page's cached
functions and the figures), and issue 24 saw a tau move take 5.1 s in the
browser while that bench reported 0.64 s. This script starts ``streamlit run
app.py`` itself, drives Chromium through Playwright and times, on the default
model (or ``--model``) with the pass key task at ``--multiple`` x L_tr:

(a) the landing page to the answer cards, cold (first visit after the server
    started, model not loaded; a fresh server and browser context per repeat)
    and warm (afterwards, a new tab: a new Streamlit session, Streamlit's
    scripts in the HTTP cache) -> ``landing_cold_s``, ``landing_s``. The
    landing page shows the app's default document (1 x L_tr);
(b) a tau move to a value never computed before (one ArrowLeft on the tau
    slider = one 0.01 step), until every figure of the Explore page is
    painted -> ``tau_move_s``; the websocket bytes of each move ->
    ``bytes_per_tau_move``;
(c) a tau move back to a value visited before (cached) -> ``cached_s``;
(d) a length change: click ``1×``, wait, then time the click on ``8×``
    -> ``length_change_s`` (the first 8x visit computes; later ones are
    cached: ``length_change_first_s`` is the first alone);
(e) the Calibrate page, both criteria: from the click on "Run Algorithm 1"
    (or from the navigation when the page computes by itself) until the
    curves chart is painted -> ``calibrate_s``, and until the whole page is
    -> ``calibrate_page_s``. Every repeat uses a new document seed, so
    nothing is cached;
(f) the Theory page, from the click in the navigation until its figures are
    painted -> ``theory_s`` (a new seed per repeat as well);
and then, in this process with the server stopped (nothing else computing;
the app's background work would otherwise go on), the backend share of (b):
the same cached calls plus every Explore figure for fresh taus
(``bench/app_latency.backend``) -> ``backend_s``, ``browser_over_backend``.

"Painted" is judged in the page, not by the script ending: the script run
has finished (a ``script_finished`` message arrived after the action), no
element is stale, no skeleton is left, Streamlit's running indicator is gone
(or fading out), every plotly chart holds its ``.main-svg``, and a marker
that only the new state shows is there (``tau = 0.730`` in the answer card,
a new token count, a page title); then two ``requestAnimationFrame``s. Times
are read on the browser's clock, from the keydown / mousedown event (or the
navigation start) to that paint. Per measure the table also shows, as
medians on the same clock, when the first websocket frame after the action
arrived and when the ``script_finished`` frame did: the server's share and
the browser's share of the wait; and the CPU seconds the server process and
Chromium's processes used meanwhile (from /proc: on one machine they share
the cores).

Reported: medians (with min, max, n) of ``--repeats`` repeats; the machine
(CPU, cores, RAM, torch, load average before and after). Targets (issue 24):
(b) <= 1 s, (c) <= 0.3 s, (a, warm) <= 3 s, (e) <= 3 s, browser/backend <= 1.5.
Needs Playwright (python) and Debian's /usr/bin/chromium (no ``playwright
install``). The machine should be otherwise idle: Chromium, the server and
the backend share its cores.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1400, "height": 1000}
SKIPPABLE = ("cold", "calibrate", "theory", "backend")
#: (measure, limit, unit) of issue 24.
TARGETS = (("tau_move_s", 1.0, "s"), ("cached_s", 0.3, "s"), ("landing_s", 3.0, "s"), ("calibrate_s", 3.0, "s"),
           ("browser_over_backend", 1.5, "x"))
ORDER = ("landing_cold_s", "landing_first", "landing_s", "length_change_s", "tau_move_s", "cached_s", "calibrate_s",
         "calibrate_page_s", "theory_s", "backend_s", "backend_cached_s")
TOKENS_RE = r"(\d[\d,]*) tokens"

# Runs in every page before Streamlit's code: the clock marks and a websocket tap.
# __aae.t0: the action's keydown/mousedown (0 = navigation start for a fresh page);
# frames after t0: first, last, count, bytes; finished: the first script_finished
# (ForwardMsg field 6, any status but FINISHED_EARLY_FOR_RERUN = 2) after t0.
INIT_JS = r"""
(() => {
  const A = window.__aae = {t0: 0, armed: false, first: null, last: null, frames: 0, bytes: 0, finished: null,
                            gen: 0, okGen: -1, ok: null, paint: null, marks: {}};
  const mark = () => { if (A.armed) { A.armed = false; A.t0 = performance.now(); } };
  addEventListener('keydown', mark, true);
  addEventListener('mousedown', mark, true);
  function varint(b, i) { let v = 0, m = 1, c; do { c = b[i++]; v += (c & 127) * m; m *= 128; } while (c & 128); return [v, i]; }
  function finishedStatus(buf) {  // top-level fields of one ForwardMsg; -1 when it is not a script_finished
    const b = new Uint8Array(buf); let i = 0;
    try {
      while (i < b.length) {
        let tag; [tag, i] = varint(b, i);
        const f = Math.floor(tag / 8), w = tag & 7;
        if (w === 0) { let v; [v, i] = varint(b, i); if (f === 6) return v; }
        else if (w === 2) { let n; [n, i] = varint(b, i); i += n; }
        else if (w === 1) i += 8; else if (w === 5) i += 4; else return -1;
      }
    } catch (e) { return -1; }
    return -1;
  }
  const Native = window.WebSocket;
  class Tapped extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener('message', ev => {
        const now = performance.now();
        if (A.armed || now < A.t0) return;
        const n = ev.data.byteLength !== undefined ? ev.data.byteLength : (ev.data.length || 0);
        if (A.first === null) A.first = now;
        A.last = now; A.frames += 1; A.bytes += n;
        if (A.finished === null && ev.data.byteLength !== undefined) {
          const s = finishedStatus(ev.data);
          if (s >= 0 && s !== 2) A.finished = now;
        }
      });
    }
  }
  window.WebSocket = Tapped;
})();
"""

ARM_JS = """() => { const A = window.__aae; Object.assign(A, {armed: true, first: null, last: null, frames: 0, bytes: 0,
    finished: null, gen: A.gen + 1, okGen: -1, ok: null, paint: null, marks: {}}); }"""

# The "done" predicate (polled every 50 ms; the paint time itself is taken two animation frames after it holds). Returns the paint time, or an error object.
DONE_JS = r"""
([sel, re, notValue, minCharts, markSel]) => {
  const A = window.__aae, q = s => document.querySelectorAll(s);
  const reset = () => { A.gen += 1; A.ok = null; A.paint = null; return false; };
  if (markSel && A.marks.seen === undefined && !A.armed) {  // an early mark: these charts painted (two frames on)
    const m = [...q(markSel)];
    if (m.length && m.every(e => !e.closest('[data-stale="true"]') && e.querySelector('.main-svg'))) {
      A.marks.seen = null;
      requestAnimationFrame(() => requestAnimationFrame(() => { A.marks.seen = performance.now(); }));
    }
  }
  if (A.armed || A.finished === null) return reset();
  const busy = [...q('[data-testid="stStatusWidget"]')].some(e => !/StatusWidget-exit/.test(e.className));
  const text = [...q(sel)].map(e => e.innerText).join('\n');
  const match = text.match(new RegExp(re));
  const markerOk = !!match && (notValue === null || (match[1] || match[0]) !== notValue);
  if (!busy && !markerOk) {
    const err = document.querySelector('[data-testid="stException"], [data-testid="stAlertContentError"]');
    if (err) return {error: err.innerText.slice(0, 400)};
  }
  const charts = [...q('[data-testid="stPlotlyChart"]')];
  const ok = markerOk && !busy && !q('[data-stale="true"], [data-testid="stSkeleton"]').length
             && charts.length >= minCharts && charts.every(c => c.querySelector('.main-svg'));
  if (!ok) return reset();
  if (A.okGen !== A.gen) {
    A.okGen = A.gen; A.ok = performance.now(); const g = A.gen;
    requestAnimationFrame(() => requestAnimationFrame(() => { if (A.gen === g) A.paint = performance.now(); }));
  }
  return A.paint === null || A.marks.seen === null ? false : {paint: A.paint};
}
"""


class BenchError(Exception):
    """Bad input, an environment problem or an app that never got there: one line on stderr, exit 2."""


@dataclass
class Marker:
    """What only the new state shows: ``regex`` matches the text of ``selector`` (and differs from ``not_value``)."""

    selector: str
    regex: str
    not_value: str | None = None
    min_charts: int = 0
    mark_selector: str | None = None  # optional: also note when these charts are first painted


@dataclass
class Timing:
    """One timed action, on the browser's clock (seconds from the action)."""

    total: float
    first_frame: float | None
    finished: float | None
    last_frame: float | None
    frames: int
    bytes: int
    marked: float | None = None
    cpu_server: float | None = None  # CPU seconds the server process used meanwhile (all its threads)
    cpu_browser: float | None = None  # ... and Chromium's processes together


@dataclass
class Results:
    timings: dict[str, list[Timing]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    kinds: Counter = field(default_factory=Counter)  # websocket bytes of all timed tau moves, per kind of message

    def add(self, name: str, t: Timing) -> None:
        self.timings.setdefault(name, []).append(t)


def forward_msg_kind(payload: bytes) -> str:
    """What a websocket frame carries: ForwardMsg type, or the element type for a new element."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    m = ForwardMsg()
    try:
        m.ParseFromString(payload)
    except Exception:  # noqa: BLE001 - not a ForwardMsg: count it anyway
        return "other"
    kind = m.WhichOneof("type") or "other"
    if kind == "delta":
        kind = m.delta.WhichOneof("type") or "delta"
        if kind == "new_element":
            kind = m.delta.new_element.WhichOneof("type") or kind
    return kind


def _proc_table() -> dict[int, tuple[int, str, float]]:
    """pid -> (parent pid, command name, CPU seconds used so far) for every process we can read."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        rest = raw[raw.rindex(")") + 2:].split()  # state ppid ... utime(12th) stime(13th)
        out[int(d)] = (int(rest[1]), raw[raw.index("(") + 1:raw.rindex(")")], (int(rest[11]) + int(rest[12])) / tick)
    return out


def cpu_split(server_pid: int | None) -> tuple[float, float]:
    """CPU seconds used so far by the server's process tree and by Chromium's processes (children of this one)."""
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)

    def tree(root: int) -> set[int]:
        out, todo = set(), [root]
        while todo:
            pid = todo.pop()
            out.add(pid)
            todo.extend(kids.get(pid, []))
        return out

    server = tree(server_pid) if server_pid in table else set()
    browser = {pid for pid in tree(os.getpid()) - server if table[pid][1].startswith("chrom")}
    return sum(table[pid][2] for pid in server), sum(table[pid][2] for pid in browser)


# -- the server ---------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``streamlit run app.py`` on a free port; always stopped by :meth:`stop` (use it as a context manager)."""

    running: set["Server"] = set()  # for the signal handler

    def __init__(self, model: str | None, timeout: float):
        self.model, self.timeout = model, timeout
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="aae-streamlit-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Server":
        env = {k: v for k, v in os.environ.items() if k != "AAE_MODEL"}
        if self.model:
            env["AAE_MODEL"] = self.model
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
               "--server.address", "127.0.0.1", "--server.port", str(self.port),
               "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
        # Own session: a Ctrl-C reaches this script only, which then stops the server itself.
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        Server.running.add(self)
        try:
            self._wait_health()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_health(self) -> None:
        end = time.monotonic() + min(self.timeout, 120)
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise BenchError(f"streamlit exited with {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise BenchError(f"streamlit did not answer {self.url}/_stcore/health: {self.tail()}")

    def tail(self, n: int = 600) -> str:
        try:
            return " | ".join(Path(self.log.name).read_text(errors="replace")[-n:].splitlines())
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        Server.running.discard(self)
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


# -- the browser --------------------------------------------------------------------

class Browser:
    """One Chromium; each :meth:`session` is a fresh context (a new Streamlit session) with the tap installed."""

    def __init__(self, playwright, timeout: float, shots: Path | None):
        self.browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        self.timeout_ms = timeout * 1000
        self.shots = shots
        self.server_pid: int | None = None  # for the CPU accounting (cpu_split)
        self.ws_bytes = 0  # every frame's payload, counted by Playwright
        self.kinds: Counter | None = None  # bytes per kind of message, while a tau move is timed

    def session(self, context=None):
        """A new page, in a fresh context (empty HTTP cache) unless ``context`` is given."""
        if context is None:
            context = self.browser.new_context(viewport=VIEWPORT)
            context.add_init_script(INIT_JS)
        page = context.new_page()
        page.on("websocket", lambda ws: ws.on("framereceived", self._count))
        return page

    def _count(self, payload: str | bytes) -> None:
        self.ws_bytes += len(payload)
        if self.kinds is not None and isinstance(payload, bytes):
            self.kinds[forward_msg_kind(payload)] += len(payload)

    def close(self) -> None:
        self.browser.close()

    def wait_done(self, page, marker: Marker) -> dict:
        """Block until the page shows the marker and is painted (see DONE_JS); the in-page marks."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            handle = page.wait_for_function(
                DONE_JS, arg=[marker.selector, marker.regex, marker.not_value, marker.min_charts, marker.mark_selector],
                polling=50, timeout=self.timeout_ms)  # not "raf": a predicate run every frame keeps
                # Chromium drawing frames (software rendering, 2 cores) and slows the very server pass it times
        except PlaywrightTimeout:
            raise BenchError(f"timed out after {self.timeout_ms / 1000:g} s waiting for /{marker.regex}/ in "
                             f"'{marker.selector}' with every figure painted (--timeout)") from None
        res = handle.json_value()
        if isinstance(res, dict) and "error" in res:
            raise BenchError(f"the app showed an error: {' '.join(res['error'].split())}")
        return page.evaluate("() => window.__aae")

    def timed(self, page, action: Callable[[], None], marker: Marker, name: str, results: Results | None = None,
              navigation: bool = False) -> Timing:
        """Arm the clock, do the action, wait until painted; record the timing under ``name``."""
        if not navigation:
            page.evaluate(ARM_JS)
        before = self.ws_bytes
        cpu0 = cpu_split(self.server_pid)
        if name == "tau_move_s" and results is not None:
            self.kinds = results.kinds
        try:
            action()
            a = self.wait_done(page, marker)
        finally:
            self.kinds = None
        got_bytes = self.ws_bytes - before
        cpu1 = cpu_split(self.server_pid)
        t0 = 0.0 if navigation else a["t0"]

        def rel(x: float | None) -> float | None:
            return None if x is None else (x - t0) / 1000

        t = Timing(total=rel(a["paint"]), first_frame=rel(a["first"]), finished=rel(a["finished"]),
                   last_frame=rel(a["last"]), frames=int(a["frames"]), bytes=got_bytes, marked=rel(a["marks"].get("seen")),
                   cpu_server=cpu1[0] - cpu0[0], cpu_browser=cpu1[1] - cpu0[1])
        if results is not None:
            results.add(name, t)
        if self.shots is not None and results is not None:
            page.screenshot(path=str(self.shots / f"{name}_{len(results.timings[name])}.png"))
        return t


def explore_marker(min_charts: int = 1, **kw) -> Marker:
    return Marker(".st-key-answer_card", kw.pop("regex", TOKENS_RE), min_charts=min_charts, **kw)


def card_tokens(page) -> str:
    m = re.search(TOKENS_RE, page.locator(".st-key-answer_card").first.inner_text())
    if not m:
        raise BenchError("the answer card shows no token count")
    return m.group(1)


def tau_thumb(page):
    thumb = page.locator('.st-key-tau_value input[type="range"]').first
    if not thumb.count():
        raise BenchError("no tau slider (widget key 'tau_value') on the Explore page")
    return thumb


def tau_of(thumb) -> float:
    return round(float(thumb.get_attribute("aria-valuetext")), 2)


def click(page, selector: str) -> Callable[[], None]:
    return lambda: page.locator(selector).first.click()


def nav_link(page, slug: str):
    """The navigation link of a page, wherever the navigation sits (sidebar or top)."""
    link = page.locator(f'a[href$="/{slug}"]').first
    if not link.count():
        raise BenchError(f"no navigation link to '/{slug}'")
    return link


def settle(browser: Browser, page, action: Callable[[], None], marker: Marker) -> None:
    """An untimed step: do it and wait until painted."""
    browser.timed(page, action, marker, "", None)


# -- the measures -------------------------------------------------------------------

def landing(browser: Browser, url: str, name: str, results: Results, min_charts: int = 1, context=None):
    """A new page (a new Streamlit session) opens the app; timed from the navigation start to the painted answer cards.

    ``context``: a browser context to open it in (its HTTP cache already holds Streamlit's scripts); by default a
    fresh one, as for a first visit.
    """
    page = browser.session(context)
    browser.timed(page, lambda: page.goto(url), explore_marker(min_charts), name, results, navigation=True)
    return page


def length_changes(browser: Browser, page, repeats: int, multiple: int, results: Results, min_charts: int) -> None:
    for _ in range(repeats):
        settle(browser, page, click(page, ".st-key-len_1x button"), explore_marker(min_charts))
        before = card_tokens(page)
        browser.timed(page, click(page, f".st-key-len_{multiple}x button"),
                      explore_marker(min_charts, not_value=before), "length_change_s", results)


def fresh_taus(start: float, n: int) -> list[float]:
    """``n`` taus below ``start`` in 0.01 steps, skipping the 0.05 grid (Algorithm 1's values)."""
    out, v = [], round(start, 2)
    while len(out) < n and v > 0.31:
        v = round(v - 0.01, 2)
        if round(v * 100) % 5:
            out.append(v)
    return out


# Best effort, app-specific: the Explore caption on its background tau grid ("3 of 11 passes ready" / "... is computed").
GRID_JS = r"""() => { const m = [...document.querySelectorAll('[data-testid="stCaptionContainer"]')]
    .map(e => e.innerText).join(' ').match(/\d+ of \d+ (?:\w+ )?ready|is computed/); return m ? m[0] : null; }"""
#: The chosen card's own account of its pass: "computed in 0.80 s (encoder 0.59 s)".
COMPUTED_RE = r"computed in ([\d.]+) s \(encoder ([\d.]+) s\)"


def server_pass(page) -> tuple[float, float] | None:
    """(run, encoder) seconds the server printed in the chosen answer card, if it does."""
    m = re.search(COMPUTED_RE, page.locator(".st-key-answer_card").first.inner_text())
    return (float(m.group(1)), float(m.group(2))) if m else None


def press_to(browser: Browser, page, key: str, expect: float, name: str, results: Results | None, min_charts: int) -> Timing:
    if results is not None and name == "tau_move_s":  # the app's background tau grid, if it shows one: busy or done?
        results.notes.setdefault("background_grid_before_tau_moves", []).append(page.evaluate(GRID_JS))
    thumb = tau_thumb(page)
    thumb.focus()
    t = browser.timed(page, lambda: page.keyboard.press(key), explore_marker(min_charts, regex=rf"tau = {expect:.3f}"),
                      name, results)
    got = tau_of(tau_thumb(page))
    if abs(got - expect) > 1e-9:
        raise BenchError(f"the tau slider shows {got}, expected {expect}")
    if results is not None and name == "tau_move_s":
        results.notes.setdefault("server_pass_in_card", []).append(server_pass(page))
    return t


def tau_moves(browser: Browser, page, repeats: int, results: Results, min_charts: int) -> list[float]:
    """Fresh taus one ArrowLeft at a time (grid values passed untimed), then back up (cached). Returns the fresh taus."""
    start = tau_of(tau_thumb(page))
    fresh = fresh_taus(start, repeats)
    v = start
    while v > fresh[-1] + 1e-9:
        v = round(v - 0.01, 2)
        press_to(browser, page, "ArrowLeft", v, "tau_move_s", results if v in fresh else None, min_charts)
    for _ in range(repeats):  # every value above was visited on the way down
        v = round(v + 0.01, 2)
        press_to(browser, page, "ArrowRight", v, "cached_s", results, min_charts)
    return fresh


def seed_action(page, seed: int) -> Callable[[], None]:
    """Type a document seed into the sidebar and press Enter (a new document: nothing cached)."""
    box = page.locator(".st-key-doc_seed input").first

    def act() -> None:
        box.fill(str(seed))
        box.press("Enter")

    return act


def calibrate(browser: Browser, page, repeats: int, results: Results) -> None:
    """Algorithm 1 (both criteria) on a new seed per repeat, from the click that starts it until painted.

    With a "Run Algorithm 1" button (key ``cal_run``) the timed action is its
    click; a page that computes by itself is timed from the navigation click
    (first repeat) or the seed change (later ones).
    """
    title = Marker("h1", r"Calibrate")
    curves = Marker("h1", r"Calibrate", min_charts=1, mark_selector=".st-key-cal_curves [data-testid='stPlotlyChart']")
    for i in range(repeats):
        action = nav_link(page, "calibrate").click if i == 0 else seed_action(page, 1000 + i)
        t = browser.timed(page, action, title, "calibrate_open", None)
        run = page.locator(".st-key-cal_run button")
        if run.count():
            t = browser.timed(page, run.first.click, curves, "calibrate_page_s", results)
            results.add("calibrate_s", replace(t, total=t.marked, finished=None, last_frame=None) if t.marked is not None else t)
            results.notes["calibrate_from"] = "the click on 'Run Algorithm 1'"
        elif page.locator("[data-testid='stPlotlyChart'] .main-svg").count():
            results.add("calibrate_s", t)
            results.add("calibrate_page_s", t)
            results.notes["calibrate_from"] = "the navigation click / seed change (the page computes by itself)"
        else:
            raise BenchError("the Calibrate page shows neither a 'Run Algorithm 1' button (key cal_run) nor a chart")


def theory(browser: Browser, page, repeats: int, results: Results) -> None:
    """The Theory page from the navigation click until painted; a new seed each repeat (typed on Calibrate)."""
    cal = Marker("h1", r"Calibrate")
    for i in range(repeats):
        if i > 0:
            settle(browser, page, nav_link(page, "calibrate").click, cal)
            settle(browser, page, seed_action(page, 2000 + i), cal)
        browser.timed(page, nav_link(page, "theory").click, Marker("h1", r"Theory", min_charts=1), "theory_s", results)


def browser_part(args: argparse.Namespace, results: Results) -> dict:
    from playwright.sync_api import sync_playwright

    info: dict[str, Any] = {}
    with sync_playwright() as p:
        browser = Browser(p, args.timeout, args.screenshot)
        try:
            cold = 0 if "cold" in args.skip else args.cold_repeats
            for _ in range(max(0, cold - 1)):  # extra cold starts, each on its own server
                with Server(args.model, args.timeout) as srv:
                    browser.server_pid = srv.proc.pid
                    landing(browser, srv.url, "landing_cold_s", results).context.close()
            with Server(args.model, args.timeout) as srv:
                browser.server_pid = srv.proc.pid
                page = landing(browser, srv.url, "landing_cold_s" if cold else "landing_first", results)
                explore_charts = page.locator('[data-testid="stPlotlyChart"]').count()
                info["explore_charts"] = explore_charts
                for _ in range(args.repeats):  # a returning visitor: a new tab, scripts in the HTTP cache
                    old, context = page, page.context
                    page = landing(browser, srv.url, "landing_s", results, explore_charts, context)
                    old.close()
                info["tokens_1x"] = int(card_tokens(page).replace(",", ""))
                length_changes(browser, page, args.repeats, args.multiple, results, explore_charts)
                info["tokens"] = int(card_tokens(page).replace(",", ""))
                if args.idle_before_moves > 0:  # let the app's background work (its tau grid) finish first
                    time.sleep(args.idle_before_moves)
                    settle(browser, page, click(page, f".st-key-len_{args.multiple}x button"), explore_marker(explore_charts))
                info["fresh_taus"] = tau_moves(browser, page, args.repeats, results, explore_charts)
                if "calibrate" not in args.skip:
                    calibrate(browser, page, args.repeats, results)
                if "theory" not in args.skip:
                    theory(browser, page, args.repeats, results)
                page.context.close()
        finally:
            browser.close()
    return info


# -- the backend share --------------------------------------------------------------

def backend_part(model: str, multiple: int, taus: list[float], results: Results) -> None:
    """The same cached calls and figures as a tau move, in this process (``bench/app_latency.backend``)."""
    import logging

    from streamlit.runtime.scriptrunner_utils import script_run_context

    logging.getLogger(script_run_context.__name__).setLevel(logging.ERROR)  # "missing ScriptRunContext": expected here
    import app_latency  # a sibling script: bench/ is sys.path[0] when this one runs as a script

    b = app_latency.backend(model, multiple, taus)
    for first, again, enc in zip(b["first"], b["again"], b["encoder"]):
        results.add("backend_s", Timing(first, None, None, None, 0, 0))
        results.add("backend_cached_s", Timing(again, None, None, None, 0, 0))
        results.notes.setdefault("backend_encoder", []).append(enc)


# -- the machine and the report -----------------------------------------------------

def machine() -> dict:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = None
    try:
        kb = next(int(l.split()[1]) for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal"))
        ram = round(kb / 2**20, 1)
    except (OSError, StopIteration):
        pass
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": ram, "torch": torch,
            "streamlit": metadata.version("streamlit"), "chromium": CHROMIUM}


def stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": [round(v, 4) for v in values]}


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summary(results: Results, info: dict, args: argparse.Namespace, mach: dict) -> dict:
    out: dict[str, Any] = {}
    detail: dict[str, Any] = {}
    for name, ts in results.timings.items():
        s = stats([t.total for t in ts])
        s.update(first_frame=_median([t.first_frame for t in ts]), script_finished=_median([t.finished for t in ts]),
                 last_frame=_median([t.last_frame for t in ts]), frames=_median([t.frames for t in ts]),
                 after_script=_median([None if t.finished is None else t.total - t.finished for t in ts]),
                 bytes=_median([t.bytes for t in ts]), cpu_server=_median([t.cpu_server for t in ts]),
                 cpu_browser=_median([t.cpu_browser for t in ts]))
        if any(t.marked is not None for t in ts):
            s["marked"] = _median([t.marked for t in ts])
        detail[name] = s
        out[name] = s["median"]
    for name in ORDER:
        out.setdefault(name, None)
    if results.timings.get("length_change_s"):
        out["length_change_first_s"] = results.timings["length_change_s"][0].total
    moves = results.timings.get("tau_move_s", [])
    out["bytes_per_tau_move"] = int(statistics.median([t.bytes for t in moves])) if moves else None
    out["tau_move_bytes_by_kind"] = {k: round(v / len(moves)) for k, v in results.kinds.most_common()} if moves else None
    out["browser_over_backend"] = (out["tau_move_s"] / out["backend_s"]) if out["tau_move_s"] and out["backend_s"] else None
    out["targets"] = {name: {"limit": lim, "value": out.get(name),
                             "met": None if out.get(name) is None else bool(out[name] <= lim)} for name, lim, _ in TARGETS}
    out.update(model=args.model_name, tokens=info.get("tokens"), tokens_landing=info.get("tokens_1x"),
               multiple=args.multiple, repeats=args.repeats, fresh_taus=info.get("fresh_taus"),
               explore_charts=info.get("explore_charts"), machine=mach, details=detail, notes=results.notes,
               date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    return out


def _f(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def print_table(s: dict) -> None:
    m = s["machine"]
    print(f"Browser latency: model {s['model']}, pass key at {s['multiple']} x L_tr = {s['tokens'] or 0:,} tokens "
          f"(landing page: {s['tokens_landing'] or 0:,}), {s['repeats']} repeats, headless Chromium {VIEWPORT['width']}x"
          f"{VIEWPORT['height']}")
    print(f"machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, torch {m['torch']}, streamlit "
          f"{m['streamlit']}; load average {m['load_before'][0]:.2f} before, {m['load_after'][0]:.2f} after; {s['date']}")
    print()
    print(f"{'measure':<18} {'median':>7} {'min':>7} {'max':>7} {'n':>2} | {'1st frame':>9} {'script done':>11} "
          f"{'paint-done':>10} {'frames':>6} {'kB':>6} | {'CPU server':>10} {'CPU browser':>11}")
    d = s["details"]
    for name in ORDER:
        if name not in d:
            continue
        r = d[name]
        kb = f"{r['bytes'] / 1000:.0f}" if r["bytes"] else ""
        print(f"{name:<18} {r['median']:>7.3f} {r['min']:>7.3f} {r['max']:>7.3f} {r['n']:>2} | {_f(r['first_frame']):>9} "
              f"{_f(r['script_finished']):>11} {_f(r['after_script']):>10} {_f(r['frames'], 0) if r['frames'] else '':>6} "
              f"{kb:>6} | {_f(r['cpu_server'], 2):>10} {_f(r['cpu_browser'], 2):>11}")
    print("(seconds from the keydown / mousedown / navigation start, browser clock; the columns after | are medians:\n"
          " first websocket frame, script_finished frame, paint minus script_finished, frames and kB received;\n"
          " CPU seconds the server process and Chromium's processes used from the action to the paint)")
    if s.get("length_change_first_s") is not None:
        print(f"  length change, first {s['multiple']}x visit (computes): {s['length_change_first_s']:.3f} s")
    if "calibrate_s" in d:
        print(f"  calibrate_s: until the curves chart is painted; calibrate_page_s: the whole page; timed from "
              f"{s['notes'].get('calibrate_from')}")
    if s["bytes_per_tau_move"] is not None:
        top = ", ".join(f"{k} {v / 1000:.0f} kB" for k, v in list(s["tau_move_bytes_by_kind"].items())[:4])
        print(f"  bytes per tau move (websocket, median): {s['bytes_per_tau_move']:,} ({top})")
    card = [c for c in s["notes"].get("server_pass_in_card", []) if c]
    if card:
        print(f"  the server's own pass of a fresh tau move (answer card, 'computed in'): "
              f"{statistics.median(c[0] for c in card):.3f} s (encoder {statistics.median(c[1] for c in card):.3f} s)")
    grid = s["notes"].get("background_grid_before_tau_moves")
    if grid and any(grid):
        print(f"  the app's background tau grid before each fresh move: {'; '.join(str(g) for g in grid)}")
    if s["browser_over_backend"] is not None:
        enc = _median(s["notes"].get("backend_encoder", []))
        print(f"  backend share of a tau move: {s['backend_s']:.3f} s (encoder pass {_f(enc)} s); "
              f"browser / backend = {s['browser_over_backend']:.2f}")
    print()
    print("targets (issue 24):")
    for name, lim, unit in TARGETS:
        t = s["targets"][name]
        verdict = "not measured" if t["met"] is None else ("met" if t["met"] else "MISSED")
        print(f"  {name:<22} <= {lim:g} {unit}: {_f(t['value'], 2):>6}  [{verdict}]")


# -- entry --------------------------------------------------------------------------

def check_inputs(args: argparse.Namespace) -> None:
    if not Path(CHROMIUM).exists():
        raise BenchError(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        raise BenchError("playwright (python) is not installed: pip install playwright (no 'playwright install' needed)") from None
    unknown = set(args.skip) - set(SKIPPABLE)
    if unknown:
        raise BenchError(f"--skip: unknown part(s) {', '.join(sorted(unknown))}; choose from {', '.join(SKIPPABLE)}")
    if args.repeats < 1 or args.cold_repeats < 0 or args.multiple < 2:
        raise BenchError("--repeats must be >= 1, --cold-repeats >= 0 and --multiple >= 2")
    if args.multiple not in (2, 4, 8, 16):
        raise BenchError("--multiple must be one of the app's length buttons: 2, 4, 8, 16")
    from core.errors import UserError
    from core.models import default_model, resolve

    name = args.model or default_model()
    if not name:
        raise BenchError("no model: no bundled model in assets/models; pass --model FOLDER")
    try:
        spec = resolve(name)
    except UserError as err:
        raise BenchError(str(err)) from None
    if Path(spec.source).is_dir() and not (Path(spec.source) / "config.json").exists():
        raise BenchError(f"model folder '{spec.source}' has no config.json")
    args.model_name = name
    if args.screenshot is not None:
        args.screenshot.mkdir(parents=True, exist_ok=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="registry name or folder (sets AAE_MODEL); default: the bundled default")
    p.add_argument("--repeats", type=int, default=5, help="repeats per measure; medians are reported (default 5)")
    p.add_argument("--cold-repeats", type=int, default=None,
                   help="cold landings, each on a fresh server (default: --repeats)")
    p.add_argument("--multiple", type=int, default=8, help="document length in multiples of L_tr (default 8)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--skip", default="", help=f"comma list of parts to leave out: {', '.join(SKIPPABLE)}")
    p.add_argument("--screenshot", type=Path, default=None, help="save a PNG here after every timed action")
    p.add_argument("--idle-before-moves", type=float, default=0, metavar="SECONDS",
                   help="wait this long after the length change before the tau moves, so that background work the "
                        "app started (its tau grid) is done; default 0: move at once, as a person would")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for any one state (default 300)")
    a = p.parse_args(argv)
    a.skip = [s.strip() for s in a.skip.split(",") if s.strip()]
    a.cold_repeats = a.repeats if a.cold_repeats is None else a.cold_repeats
    return a


def _interrupted(signum: int, _frame: Any) -> None:
    """Ctrl-C / SIGTERM: stop the server(s) here and leave at once.

    A KeyboardInterrupt raised while Playwright's sync API waits can be
    swallowed by its event loop (seen: the script then hangs with the server
    up), so the handler does the cleanup itself. Chromium and Playwright's
    driver exit when this process does (their pipe closes).
    """
    for srv in list(Server.running):
        srv.stop()
    print(f"browser_latency: interrupted by signal {signum}; the server was stopped", file=sys.stderr)
    os._exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupted)
    try:
        from playwright.sync_api import Error as PlaywrightError
    except ImportError:
        PlaywrightError = BenchError  # check_inputs reports the missing package
    try:
        check_inputs(args)
        mach = machine()
        mach["load_before"] = os.getloadavg()
        results = Results()
        info = browser_part(args, results)
        if "backend" not in args.skip and info.get("fresh_taus"):
            backend_part(args.model_name, args.multiple, info["fresh_taus"], results)
        mach["load_after"] = os.getloadavg()
    except BenchError as err:
        print(f"browser_latency: {err}", file=sys.stderr)
        return 2
    except PlaywrightError as err:
        print(f"browser_latency: the browser part failed: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    s = summary(results, info, args, mach)
    if args.json:
        print(json.dumps(s))
    else:
        print_table(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
