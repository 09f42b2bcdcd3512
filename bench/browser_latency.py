"""What a person at the browser waits for: the app timed in headless Chromium, from the input to the paint.

    python bench/browser_latency.py [--model NAME|FOLDER] [--repeats 3] [--cold-repeats N] [--multiple 8] [--json]
                                    [--skip cold,scrub,drag,offgrid,calibrate,theory,backend,foreground]
                                    [--foreground-multiple 16] [--screenshot DIR]
                                    [--scrub-gap 0.3] [--drag-steps 60] [--drag-seconds 1] [--timeout 300]

Why: ``bench/app_latency.py`` times only the backend, and issue 24 saw a tau
move take 5.1 s in the browser while that bench reported 0.64 s. This script
starts ``streamlit run app.py`` itself, drives Chromium through Playwright
and times, on the default model (or ``--model``) with the pass key task at
``--multiple`` x L_tr, the Explore page's scrubber (``ui/scrubber.py``: one
``st.components.v2`` component that holds every grid tau's views and repaints
them in the browser on each slider event, issue 41):

(a) the landing page, cold (first visit after the server started, model not
    loaded; a fresh server and browser context per repeat) and warm (a new
    tab: a new Streamlit session, Streamlit's scripts in the HTTP cache), from
    the navigation start until the scrubber painted its first frame with the
    document's token count -> ``landing_cold_s``, ``landing_s``; until the
    whole page is settled too (script finished, every plotly chart drawn) ->
    ``landing_page_s``. The landing page shows the app's default document
    (1 x L_tr);
(b) a length change to a new document: type a new seed at 1x, then time the
    click on ``8x`` until the scrubber painted the new document's first frame
    -> ``length_change_s`` (a new seed per repeat: always a first visit), and
    from the same click until its grid is complete (``data-ready`` 15/15,
    computed in the background nearest the slider first) -> ``grid_ready_s``;
(c) scrubbing with the keyboard over the grid: PageDown from 1.00 to 0.30 and
    PageUp back (28 moves, one every ``--scrub-gap`` s; a press within 700 ms
    of the one before waits that long before the component sends its value, so
    at the default 0.3 s the row sends its last value only, and a gap over
    0.7 s reruns Explore's panel after every press while the next steps are
    drawn), each
    from the keydown event to the frame of the new grid tau painted ->
    ``scrub_s`` (median) and ``scrub_p95_s``;
(d) an off-grid move: one ArrowLeft from a grid value (1.00, then 0.95, ...;
    a tau never computed), from the keydown to the painted nearest grid frame
    (``data-kind`` "nearest") -> ``nearest_frame_s``, and to the painted exact
    frame of that tau (``data-kind`` "exact": the release is sent after the
    keys' 200 ms pause, one fragment rerun computes the pass and sends it)
    -> ``exact_frame_s``;
(e) a drag across the whole range in ``--drag-seconds`` (mouse down on the
    thumb at tau = 1.00, ``--drag-steps`` moves to the left end, mouse up):
    frames painted per second, ``data-paints`` at the pointerup minus at the
    pointerdown over the time between them -> ``scrub_fps``; and how many
    grid frames the drag showed on its way (all 15 when it paints every grid
    frame it crosses);
(f) the Calibrate page, both criteria: from the click on "Run Algorithm 1"
    (or from the navigation when the page computes by itself) until the
    curves chart is painted -> ``calibrate_s``, and until the whole page is
    -> ``calibrate_page_s``; a new document seed per repeat;
(g) the Theory page, from the click in the navigation until its figures are
    painted -> ``theory_s`` (a new seed per repeat as well);
(h) a person before the background (issue 49): a new tab opens a pass key
    document of ``--foreground-multiple`` x L_tr tokens by its link (64 x:
    16,384 tokens on the default model), whose grid the background thread
    then computes; as soon as a grid frame arrives (a background pass just
    ended, the next one has just begun), one ArrowLeft moves off the grid:
    from the keydown to the exact frame painted -> ``foreground_exact_s``,
    and whether a grid frame arrived before it (``foreground_went_first``:
    the scrubber's ``data-ready`` with the exact frame is what it was at the
    key press, so the person's pass did not wait for the background pass);
    then, in this process with the server stopped, the same exact pass alone
    (``foreground_own_s``) and its longest stretch between two attention calls
    (``foreground_layer_s``, one layer), and ``foreground_over_own_layer`` =
    ``foreground_exact_s / (foreground_own_s + foreground_layer_s)``: at most
    about 1 when the person waits for a layer, not the background pass;
and then, in this process with the server stopped, the backend share: the
same document's grid (15 passes, ``backend_grid_s``) and, for each off-grid
tau of (d), its exact pass plus the payload the rerun sends
(``core.views.frames.payload`` of the grid and the exact frame) -> ``backend_s``
(``backend_payload_s`` the payload alone), ``browser_over_backend`` =
``exact_frame_s / backend_s``, ``grid_over_backend`` = ``grid_ready_s /
backend_grid_s``.

Replaced measures (the old Streamlit slider and answer cards are gone from
Explore): ``tau_move_s`` (a move to a never-computed tau, until every figure
of the rerun was painted) is now ``exact_frame_s`` (its exact frame) with
``nearest_frame_s`` (what the person sees at once); ``cached_s`` (a move back
to a computed tau, one rerun) is now ``scrub_s``: every grid tau is in the
browser, and no move waits for the server; ``bytes_per_tau_move`` is the
websocket bytes of an off-grid move (``bytes_per_exact_move``).

"Painted" is judged in the page, on the browser's clock: an init script marks
the keydown / mousedown event (``Event.timeStamp``; the navigation start for a
fresh page) and taps the websocket; a ``MutationObserver`` on the scrubber's
root (``.aae``, inside the component's open shadow root) logs every change of
its ``data-paints`` counter with the frame it shows (``data-tau``,
``data-kind``, ``data-shown``, ``data-ready``, the token count), and the paint
time is two ``requestAnimationFrame``s after that (the component's own
``data-paint-ms`` is kept beside it: same definition, from its input
handler). Landing and length change also wait for the page to settle (a
``script_finished`` message after the action, nothing stale, no skeleton,
Streamlit's running indicator gone, every plotly chart drawn). Per measure
the table shows, as medians on the same clock, when the first websocket
frame after the action arrived and when the ``script_finished`` frame did,
frames and kB received, and the CPU seconds the server process and
Chromium's processes used meanwhile (from /proc: on one machine they share
the cores).

Reported: medians (with min, max, n; p95 where there are many moves) of
``--repeats`` repeats; the machine (CPU, cores, RAM, torch, load average
before and after). Targets (issue 41, default model, pass key at 8 x L_tr, an
idle 2-core machine): scrub_s median <= 0.05 s and p95 <= 0.15 s, scrub_fps
>= 20, grid_ready_s <= 20 s, nearest_frame_s <= 0.1 s, exact_frame_s <= 1.5 s,
landing_s (warm) <= 3 s; issue 24's calibrate_s <= 3 s. Needs Playwright
(python) and Debian's /usr/bin/chromium (no ``playwright install``). The
machine should be otherwise idle: Chromium, the server and the backend share
its cores.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from core.values.choice import Choice

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # core and ui, also without an installed package
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1400, "height": 1000}
SKIPPABLE = ("cold", "scrub", "drag", "offgrid", "calibrate", "theory", "backend", "foreground")
SLIDER = ".aae input[type=range]"  # Playwright's CSS engine pierces the component's open shadow root
GRID_N = 15  # 1.00, 0.95, ..., 0.30 (core.views.frames.SCRUB_GRID)
#: (measure, limit, unit, at most?) of issues 41 and 24.
TARGETS = (
    ("scrub_s", 0.05, "s", True),
    ("scrub_p95_s", 0.15, "s", True),
    ("scrub_fps", 20.0, "fps", False),
    ("grid_ready_s", 20.0, "s", True),
    ("nearest_frame_s", 0.1, "s", True),
    ("exact_frame_s", 1.5, "s", True),
    ("landing_s", 3.0, "s", True),
    ("calibrate_s", 3.0, "s", True),
)
ORDER = (
    "landing_cold_s",
    "landing_first",
    "landing_s",
    "landing_page_s",
    "length_change_s",
    "grid_ready_s",
    "scrub_s",
    "nearest_frame_s",
    "exact_frame_s",
    "calibrate_s",
    "calibrate_page_s",
    "theory_s",
    "backend_s",
    "backend_payload_s",
    "backend_grid_s",
    "foreground_exact_s",
    "foreground_own_s",
    "foreground_layer_s",
)
TOKENS_RE = r"(\d[\d,]*) tokens"

# Runs in every page before Streamlit's code: the clock marks, a websocket tap and the scrubber's paint log.
# __aae.t0: the action's keydown/mousedown event time (0 = navigation start for a fresh page); frames after
# t0: first, last, count, bytes; finished: the first script_finished (ForwardMsg field 6, any status but
# FINISHED_EARLY_FOR_RERUN = 2) after t0. log: one entry per change of the scrubber's data-paints (what it
# shows, when the change was seen, and two animation frames later: painted).
INIT_JS = r"""
(() => {
  const A = window.__aae = {t0: 0, armed: false, first: null, last: null, frames: 0, bytes: 0, finished: null,
                            gen: 0, okGen: -1, ok: null, paint: null, marks: {}, log: [], lastInput: 0, lastFrame: 0,
                            pointer: {}, root: null, observed: null, obs: null};
  const stamp = ev => { const now = performance.now(), t = ev.timeStamp;
                        return (t > 0 && t <= now && now - t < 5000) ? t : now; };
  const mark = ev => { A.lastInput = performance.now(); if (A.armed) { A.armed = false; A.t0 = stamp(ev); } };
  addEventListener('keydown', mark, true);
  addEventListener('mousedown', mark, true);
  addEventListener('keyup', () => { A.lastInput = performance.now(); }, true);
  const paintsNow = () => { const r = A.findRoot(); return r ? Number(r.dataset.paints || 0) : null; };
  addEventListener('pointerdown', ev => { A.lastInput = performance.now(); A.pointer.down = {t: stamp(ev), paints: paintsNow()}; }, true);
  addEventListener('pointerup', ev => { A.lastInput = performance.now(); A.pointer.up = {t: stamp(ev), paints: paintsNow()}; }, true);
  // The scrubber's root: in the document or in an open shadow root (found once, kept while connected).
  A.findRoot = () => {
    if (A.root && A.root.isConnected) return A.root;
    A.root = document.querySelector('.aae');
    if (!A.root) for (const h of document.querySelectorAll('*')) {
      if (h.shadowRoot) { const r = h.shadowRoot.querySelector('.aae'); if (r) { A.root = r; break; } }
    }
    return A.root;
  };
  A.snap = r => {
    const d = r.dataset, foot = r.querySelector('.card[data-side="base"] .cap');
    const m = foot && foot.textContent.match(/(\d[\d,]*) tokens/);
    return {tau: d.tau, kind: d.kind, shown: d.shown, answer: d.answer, correct: d.correct, pmax: d.pmax,
            entropy: d.entropy, mapSum: d.mapSum, ready: d.ready, paints: Number(d.paints || 0),
            paintJsMs: d.paintJsMs ? Number(d.paintJsMs) : null, payloads: Number(d.payloads || 0),
            releases: Number(d.releases || 0), tokens: m ? Number(m[1].replace(/,/g, '')) : null};
  };
  A.watch = () => {
    const r = A.findRoot();
    if (r && A.observed !== r) {
      if (A.obs) A.obs.disconnect();
      A.observed = r;
      A.obs = new MutationObserver(() => {
        const e = Object.assign(A.snap(r), {at: performance.now(), painted: null, paintMs: null});
        A.log.push(e);
        if (A.log.length > 4000) A.log.splice(0, 2000);
        requestAnimationFrame(() => requestAnimationFrame(() => {
          e.painted = performance.now(); e.paintMs = r.dataset.paintMs ? Number(r.dataset.paintMs) : null;
          // what reached the page between the action and this paint: websocket frames, scrubber payloads
          e.frames = A.frames; e.bytes = A.bytes; e.payloadsBetween = Number(r.dataset.payloads || 0) - A.payloads0; }));
      });
      A.obs.observe(r, {attributes: true, attributeFilter: ['data-paints']});
    }
    return r;
  };
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
        A.lastFrame = now;
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

ARM_JS = """() => { const A = window.__aae, r = A.watch(); Object.assign(A, {armed: true, first: null, last: null,
    frames: 0, bytes: 0, finished: null, gen: A.gen + 1, okGen: -1, ok: null, paint: null, marks: {}, log: [],
    pointer: {}, payloads0: r ? Number(r.dataset.payloads || 0) : 0}); }"""

# The "settled" predicate (polled every 50 ms; the paint time itself is taken two animation frames after it holds).
# Returns the paint time, or an error object. A selector starting with ".aae" is looked up inside the scrubber.
DONE_JS = r"""
([sel, re, notValue, minCharts, markSel, kinds]) => {
  const A = window.__aae, q = s => document.querySelectorAll(s);
  const reset = () => { A.gen += 1; A.ok = null; A.paint = null; return false; };
  const els = s => {
    if (!s.startsWith('.aae')) return [...q(s)];
    const r = A.watch(), sub = s.replace(/^\.aae\s*/, '');
    return !r ? [] : sub ? [...r.querySelectorAll(sub)] : [r];
  };
  if (A.armed) return reset();
  const text = els(sel).map(e => e.innerText).join('\n');
  const match = text.match(new RegExp(re));
  let markerOk = !!match && (notValue === null || (match[1] || match[0]) !== notValue);
  if (markerOk && kinds) { const r = A.watch(); markerOk = !!r && kinds.includes(r.dataset.kind); }
  if (markerOk && kinds && A.marks.seen === undefined) {  // the scrubber painted the new state (two frames on)
    A.marks.seen = null;
    requestAnimationFrame(() => requestAnimationFrame(() => { A.marks.seen = performance.now(); }));
  }
  if (markSel && A.marks.seen === undefined) {  // an early mark: these charts painted (two frames on)
    const m = [...q(markSel)];
    if (m.length && m.every(e => !e.closest('[data-stale="true"]') && e.querySelector('.main-svg'))) {
      A.marks.seen = null;
      requestAnimationFrame(() => requestAnimationFrame(() => { A.marks.seen = performance.now(); }));
    }
  }
  if (A.finished === null) return reset();
  const busy = [...q('[data-testid="stStatusWidget"]')].some(e => !/StatusWidget-exit/.test(e.className));
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

# The first logged paint since the action whose fields equal ``want`` (a value or a list of allowed values), once
# painted (two animation frames on). ``orNow``: also accept the scrubber's present state (a paint before the
# observer was attached), timed at this poll.
FIND_JS = r"""
([want, orNow]) => {
  const A = window.__aae, r = A.watch();
  const fits = e => Object.entries(want).every(([k, v]) => Array.isArray(v) ? v.map(String).includes(String(e[k]))
                                                                             : String(e[k]) === String(v));
  for (const e of A.log) if (fits(e)) return e.painted === null ? false : e;
  const err = document.querySelector('[data-testid="stException"], [data-testid="stAlertContentError"]');
  if (err) return {error: err.innerText.slice(0, 400)};
  if (orNow && r && !A.armed) { const e = A.snap(r); if (fits(e)) return Object.assign(e, {painted: performance.now(), polled: true}); }
  return false;
}
"""

# Idle: no websocket frame and no input for ``quiet`` ms, Streamlit's running indicator gone, nothing stale.
QUIET_JS = r"""
([quiet]) => {
  const A = window.__aae, now = performance.now(), q = s => document.querySelectorAll(s);
  const busy = [...q('[data-testid="stStatusWidget"]')].some(e => !/StatusWidget-exit/.test(e.className));
  return !busy && !q('[data-stale="true"]').length && now - Math.max(A.lastFrame, A.lastInput) >= quiet;
}
"""


class BenchError(Exception):
    """Bad input, an environment problem or an app that never got there: one line on stderr, exit 2."""


@dataclass
class Marker:
    """What only the new state shows: ``regex`` matches the text of ``selector`` (and differs from ``not_value``).

    ``kinds``: the scrubber must show a frame of one of these kinds (``data-kind``); its first such paint is
    noted as ``marked`` (the page may still be finishing).
    """

    selector: str
    regex: str
    not_value: str | None = None
    min_charts: int = 0
    mark_selector: str | None = None  # optional: also note when these charts are first painted
    kinds: tuple[str, ...] | None = None


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
    paint_ms: float | None = None  # the scrubber's own data-paint-ms for this paint, when it has one
    paint_js_ms: float | None = None  # the JavaScript of that paint alone (the scrubber's data-paint-js-ms)
    payloads: int | None = None  # scrubber payloads handled between the action and the paint


@dataclass
class Results:
    timings: dict[str, list[Timing]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    kinds: Counter = field(default_factory=Counter)  # websocket bytes of the timed off-grid moves, per kind of message

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
        rest = raw[raw.rindex(")") + 2 :].split()  # state ppid ... utime(12th) stime(13th)
        out[int(d)] = (int(rest[1]), raw[raw.index("(") + 1 : raw.rindex(")")], (int(rest[11]) + int(rest[12])) / tick)
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
        cmd = [
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
            str(self.port),
            "--browser.gatherUsageStats",
            "false",
            "--server.fileWatcherType",
            "none",
        ]
        # Own session: a Ctrl-C reaches this script only, which then stops the server itself.
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
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
        self.kinds: Counter | None = None  # bytes per kind of message, while an off-grid move is timed

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

    def _wait(self, page, js: str, arg: Any, what: str) -> Any:
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            handle = page.wait_for_function(js, arg=arg, polling=50, timeout=self.timeout_ms)
            # not "raf": a predicate run every frame keeps Chromium drawing frames (software rendering,
            # 2 cores) and slows the very server pass it times
        except PlaywrightTimeout:
            raise BenchError(f"timed out after {self.timeout_ms / 1000:g} s waiting for {what} (--timeout)") from None
        res = handle.json_value()
        if isinstance(res, dict) and "error" in res:
            raise BenchError(f"the app showed an error: {' '.join(res['error'].split())}")
        return res

    def wait_done(self, page, marker: Marker) -> dict:
        """Block until the page shows the marker and is painted (see DONE_JS); the in-page marks."""
        self._wait(
            page,
            DONE_JS,
            [
                marker.selector,
                marker.regex,
                marker.not_value,
                marker.min_charts,
                marker.mark_selector,
                list(marker.kinds) if marker.kinds else None,
            ],
            f"/{marker.regex}/ in '{marker.selector}' with every figure painted",
        )
        return page.evaluate(
            "() => { const A = window.__aae; return Object.assign({}, A, {log: [], root: null, "
            "observed: null, obs: null}); }"
        )

    def wait_paint(self, page, want: dict, or_now: bool = False) -> dict:
        """Block until the scrubber painted a frame whose fields equal ``want`` (see FIND_JS); that log entry."""
        return self._wait(page, FIND_JS, [want, or_now], f"the scrubber to paint {want}")

    def quiet(self, page, ms: int = 700) -> None:
        """Wait until nothing came from the server and nothing was pressed for ``ms`` (the release's rerun is over)."""
        self._wait(page, QUIET_JS, [ms], f"{ms} ms without a websocket frame")

    def t0(self, page) -> float:
        return page.evaluate("() => window.__aae.t0")

    def arm(self, page) -> None:
        page.evaluate(ARM_JS)

    def _timing(
        self,
        page,
        a: dict,
        total: float | None,
        cpu0: tuple[float, float],
        bytes0: int,
        navigation: bool = False,
        paint_ms: float | None = None,
    ) -> Timing:
        cpu1 = cpu_split(self.server_pid)
        t0 = 0.0 if navigation else a["t0"]

        def rel(x: float | None) -> float | None:
            return None if x is None else (x - t0) / 1000

        return Timing(
            total=rel(total),
            first_frame=rel(a["first"]),
            finished=rel(a["finished"]),
            last_frame=rel(a["last"]),
            frames=int(a["frames"]),
            bytes=self.ws_bytes - bytes0,
            marked=rel((a.get("marks") or {}).get("seen")),
            cpu_server=cpu1[0] - cpu0[0],
            cpu_browser=cpu1[1] - cpu0[1],
            paint_ms=paint_ms,
        )

    def timed(
        self,
        page,
        action: Callable[[], None],
        marker: Marker,
        name: str,
        results: Results | None = None,
        navigation: bool = False,
    ) -> Timing:
        """Arm the clock, do the action, wait until painted and settled; record the timing under ``name``."""
        if not navigation:
            self.arm(page)
        before = self.ws_bytes
        cpu0 = cpu_split(self.server_pid)
        action()
        a = self.wait_done(page, marker)
        t = self._timing(page, a, a["paint"], cpu0, before, navigation)
        if results is not None:
            results.add(name, t)
        self.shot(page, name, results)
        return t

    def shot(self, page, name: str, results: Results | None) -> None:
        if self.shots is not None and results is not None and name in results.timings:
            page.screenshot(path=str(self.shots / f"{name}_{len(results.timings[name])}.png"))


def explore_marker(min_charts: int = 1, **kw) -> Marker:
    """The Explore page with the scrubber painted: its token count (``.aae`` = inside the component)."""
    return Marker(".aae .card", kw.pop("regex", TOKENS_RE), min_charts=min_charts, kinds=("grid", "exact"), **kw)


def scrubber_state(page) -> dict:
    """What the scrubber shows now (its data attributes and the token count)."""
    s = page.evaluate("() => { const A = window.__aae, r = A.watch(); return r ? A.snap(r) : null; }")
    if not s:
        raise BenchError("no scrubber (.aae) on the Explore page")
    return s


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


def seed_action(page, seed: int) -> Callable[[], None]:
    """Type a document seed into the sidebar and press Enter (a new document: nothing cached)."""
    box = page.locator(".st-key-doc_seed input").first

    def act() -> None:
        box.fill(str(seed))
        box.press("Enter")

    return act


def p95(values: list[float]) -> float:
    """The 95th percentile, nearest rank (of 28 moves: the 27th fastest)."""
    s = sorted(values)
    return s[max(0, math.ceil(0.95 * len(s)) - 1)]


# -- the measures -------------------------------------------------------------------


def landing(browser: Browser, url: str, name: str, results: Results, min_charts: int = 0, context=None):
    """A new page (a new Streamlit session) opens the app; timed from the navigation start until the scrubber
    painted (``name``) and until the whole page settled (``landing_page_s``, warm landings only).

    ``context``: a browser context to open it in (its HTTP cache already holds Streamlit's scripts); by default a
    fresh one, as for a first visit.
    """
    page = browser.session(context)
    t = browser.timed(page, lambda: page.goto(url), explore_marker(min_charts), name, None, navigation=True)
    results.add(name, replace(t, total=t.marked if t.marked is not None else t.total))
    if name == "landing_s":
        results.add("landing_page_s", t)
    browser.shot(page, name, results)
    return page


def length_changes(
    browser: Browser, page, repeats: int, multiple: int, results: Results, min_charts: int, seed0: int = 100
) -> int:
    """A new document per repeat: seed at 1x, then the timed click on ``multiple``x: painted, then its grid complete.

    Returns the seed of the last document (the one the moves then use).
    """
    seed = seed0
    for i in range(repeats):
        seed = seed0 + i
        settle(browser, page, click(page, ".st-key-len_1x button"), explore_marker(min_charts))
        settle(browser, page, seed_action(page, seed), explore_marker(min_charts))
        before = scrubber_state(page)["tokens"]
        bytes0, cpu0 = browser.ws_bytes, cpu_split(browser.server_pid)
        t = browser.timed(
            page,
            click(page, f".st-key-len_{multiple}x button"),
            explore_marker(min_charts, not_value=f"{before:,}"),
            "length_change_s",
            results,
        )
        tokens = scrubber_state(page)["tokens"]
        e = browser.wait_paint(page, {"ready": f"{GRID_N}/{GRID_N}", "tokens": tokens}, or_now=True)
        a = page.evaluate(
            "() => { const A = window.__aae; return {t0: A.t0, first: A.first, last: A.last, "
            "frames: A.frames, finished: A.finished, marks: {}}; }"
        )
        results.add("grid_ready_s", browser._timing(page, a, e["painted"], cpu0, bytes0))
        results.notes.setdefault("grid_ready_polled", []).append(bool(e.get("polled")))
        if t.total is None:
            raise BenchError("the length change was never painted")
    return seed


def focus_slider(page):
    thumb = page.locator(SLIDER).first
    if not thumb.count():
        raise BenchError("no tau slider (.aae input[type=range]) on the Explore page")
    thumb.focus()
    return thumb


def key_to(browser: Browser, page, key: str, want: dict, name: str | None, results: Results | None) -> dict:
    """Press ``key`` on the focused slider, wait for the paint that fits ``want``; record it under ``name``."""
    browser.arm(page)
    page.keyboard.press(key)
    e = browser.wait_paint(page, want)
    if name is not None and results is not None:
        t0 = browser.t0(page)
        results.add(
            name,
            Timing(
                (e["painted"] - t0) / 1000,
                None,
                None,
                None,
                int(e.get("frames") or 0),
                int(e.get("bytes") or 0),
                paint_ms=e.get("paintMs"),
                paint_js_ms=e.get("paintJsMs"),
                payloads=e.get("payloadsBetween"),
            ),
        )
    return e


def scrub(browser: Browser, page, results: Results, gap: float) -> dict:
    """PageDown from 1.00 to 0.30 and PageUp back, one move every ``gap`` s; each timed to its frame painted.

    Returns what each grid tau showed (answer, Pmax, H, map sum), to check that the frames differ.
    """
    from core.views.frames import SCRUB_GRID

    grid = [f"{t:.2f}" for t in SCRUB_GRID]  # 1.00 ... 0.30
    focus_slider(page)
    while scrubber_state(page)["tau"] != grid[0]:  # start at 1.00
        key_to(browser, page, "PageUp", {"kind": "grid"}, None, None)
    browser.quiet(page)
    seen: dict[str, tuple] = {}
    before = scrubber_state(page)
    for key, path in (("PageDown", grid[1:]), ("PageUp", grid[-2::-1])):
        for tau in path:
            start = time.perf_counter()
            e = key_to(browser, page, key, {"tau": tau, "kind": "grid"}, "scrub_s", results)
            seen.setdefault(tau, (e["answer"], e["pmax"], e["entropy"], e["mapSum"]))
            time.sleep(max(0.0, gap - (time.perf_counter() - start)))
    browser.quiet(page)
    after = scrubber_state(page)
    # Where the moves' time went: the values the scrubber sent to the server (each one rerun of Explore's panel,
    # rendered by Streamlit on the browser's main thread) and the payloads it handled, over the whole scrub
    results.notes.setdefault("scrub_releases", []).append(after["releases"] - before["releases"])
    results.notes.setdefault("scrub_payloads", []).append(after["payloads"] - before["payloads"])
    browser.shot(page, "scrub_s", results)
    return seen


def off_grid(browser: Browser, page, repeats: int, results: Results) -> list[float]:
    """One ArrowLeft from a grid value (1.00, 0.95, ...): nearest frame, then exact frame. Returns the fresh taus."""
    focus_slider(page)
    while scrubber_state(page)["tau"] != "1.00":
        key_to(browser, page, "PageUp", {"kind": "grid"}, None, None)
    browser.quiet(page)
    fresh = []
    for i in range(repeats):
        v = round(float(scrubber_state(page)["tau"]) - 0.01, 2)
        want = f"{v:.2f}"
        browser.arm(page)
        bytes0, cpu0 = browser.ws_bytes, cpu_split(browser.server_pid)
        browser.kinds = results.kinds
        try:
            page.keyboard.press("ArrowLeft")
            near = browser.wait_paint(page, {"tau": want, "kind": "nearest"})
            exact = browser.wait_paint(page, {"tau": want, "kind": "exact"})
            a = page.evaluate(
                "() => { const A = window.__aae; return {t0: A.t0, first: A.first, last: A.last, "
                "frames: A.frames, finished: A.finished, marks: {}}; }"
            )
        finally:
            browser.kinds = None
        results.add(
            "nearest_frame_s",
            Timing((near["painted"] - a["t0"]) / 1000, None, None, None, 0, 0, paint_ms=near.get("paintMs")),
        )
        results.add("exact_frame_s", browser._timing(page, a, exact["painted"], cpu0, bytes0))
        fresh.append(v)
        browser.shot(page, "exact_frame_s", results)
        browser.quiet(page)
        if i + 1 < repeats:  # on to the next grid value below: the next ArrowLeft lands on a tau never computed
            key_to(browser, page, "PageDown", {"kind": "grid"}, None, None)
            browser.quiet(page)
    return fresh


def drag(browser: Browser, page, repeats: int, results: Results, steps: int, seconds: float) -> None:
    """Mouse down on the thumb at the slider's right end (tau = 1.00), ``steps`` moves to its left end over
    ``seconds``, mouse up. The moves are paced here; each waits for Chromium to take the event, so a busy page
    stretches the drag (the measured time between pointerdown and pointerup is the one used)."""
    from core.views.frames import SCRUB_GRID

    grid = {f"{t:.2f}" for t in SCRUB_GRID}
    for _ in range(repeats):
        thumb = focus_slider(page)
        if scrubber_state(page)["tau"] != "1.00":  # the thumb at the right end first (End: the range's max)
            key_to(browser, page, "End", {"tau": "1.00", "kind": "grid"}, None, None)
        browser.quiet(page)
        box = thumb.bounding_box()
        if not box:
            raise BenchError("the tau slider has no box on screen")
        y = box["y"] + box["height"] / 2
        x1, x0 = box["x"] + box["width"] - 2, box["x"] + 2
        browser.arm(page)
        page.mouse.move(x1, y)
        page.mouse.down()
        start = time.perf_counter()
        for k in range(1, steps + 1):
            time.sleep(max(0.0, start + seconds * k / steps - time.perf_counter()))
            page.mouse.move(x1 + (x0 - x1) * k / steps, y)
        page.mouse.up()
        end = browser.wait_paint(page, {"tau": f"{SCRUB_GRID[-1]:.2f}", "kind": "grid"})
        a = page.evaluate("() => { const A = window.__aae; return {pointer: A.pointer, log: A.log}; }")
        down, up = a["pointer"].get("down"), a["pointer"].get("up")
        if not down or not up or down.get("paints") is None or up.get("paints") is None:
            raise BenchError(f"the drag's pointer events were not seen: {a['pointer']}")
        secs = (up["t"] - down["t"]) / 1000
        results.add("scrub_fps", Timing((up["paints"] - down["paints"]) / secs, None, None, None, 0, 0))
        crossed = {e["shown"] for e in a["log"] if e["at"] <= end["at"] and e["kind"] in ("grid", "nearest")}
        results.notes.setdefault("drag_grid_frames_shown", []).append(len(crossed & grid))
        results.notes.setdefault("drag_grid_frames_missed", []).append(sorted(grid - crossed, reverse=True))
        results.notes.setdefault("drag_seconds", []).append(round(secs, 3))
        browser.quiet(page)
        browser.shot(page, "scrub_fps", results)


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
            results.add(
                "calibrate_s", replace(t, total=t.marked, finished=None, last_frame=None) if t.marked is not None else t
            )
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


#: The scrubber's data-ready once it differs from ``k`` ("3/15"), else false; an error shown in the page.
READY_JS = r"""
([k]) => {
  const A = window.__aae, r = A.watch();
  const err = document.querySelector('[data-testid="stException"], [data-testid="stAlertContentError"]');
  if (err) return {error: err.innerText.slice(0, 400)};
  if (!r) return false;
  const s = A.snap(r);
  return s.ready && s.ready !== k ? s.ready : false;
}
"""


#: "frame" once the scrubber shows tau 1.00 of a document of ``tokens`` tokens, "ask" while the app shows its
#: "Compute it" button instead (ui/long_work.py: it asks before work estimated over 30 s).
FIRST_JS = r"""
([tokens]) => {
  const A = window.__aae, r = A.watch();
  const err = document.querySelector('[data-testid="stException"], [data-testid="stAlertContentError"]');
  if (err) return {error: err.innerText.slice(0, 400)};
  if (r) { const s = A.snap(r); if (s.tau === '1.00' && s.tokens === tokens) return 'frame'; }
  const b = [...document.querySelectorAll('button')].find(b => b.innerText.trim().startsWith('Compute it'));
  return b ? 'ask' : false;
}
"""


def foreground(browser: Browser, url: str, tokens: int, seed: int, repeats: int, results: Results) -> dict:
    """(h) Off-grid moves while a long document's grid computes, each as soon as a grid frame arrived."""
    import urllib.parse

    from core.runs import methods

    page = browser.session()
    q = {"task": "passkey", "tokens": tokens, "depth": 50, "seed": seed, "method": methods.FIXED, "tau": "1.0"}
    page.goto(f"{url}/?{urllib.parse.urlencode(q)}")
    if browser._wait(page, FIRST_JS, [tokens], "the document's first frame or the app's 'Compute it'") == "ask":
        page.locator("button").filter(has_text="Compute it").first.click()  # the app asks before long work
        results.notes["foreground_asked"] = True
    browser.wait_paint(page, {"tau": "1.00", "kind": "grid", "tokens": tokens}, or_now=True)
    taus, ready_pairs = [], []
    for _ in range(repeats):
        ready = browser._wait(page, READY_JS, [scrubber_state(page)["ready"]], "a grid frame to arrive")
        if int(ready.split("/")[0]) >= GRID_N - 1:
            results.notes["foreground_cut"] = f"the grid was almost complete ({ready}): fewer repeats"
            break
        v = round(float(scrubber_state(page)["tau"]) - 0.01, 2)
        focus_slider(page)
        browser.arm(page)
        bytes0, cpu0 = browser.ws_bytes, cpu_split(browser.server_pid)
        page.keyboard.press("ArrowLeft")
        exact = browser.wait_paint(page, {"tau": f"{v:.2f}", "kind": "exact"})
        a = page.evaluate(
            "() => { const A = window.__aae; return {t0: A.t0, first: A.first, last: A.last, "
            "frames: A.frames, finished: A.finished, marks: {}}; }"
        )
        results.add("foreground_exact_s", browser._timing(page, a, exact["painted"], cpu0, bytes0))
        ready_pairs.append((ready, exact["ready"]))
        taus.append(v)
        browser.shot(page, "foreground_exact_s", results)
    results.notes["foreground_ready"] = ready_pairs  # (at the key press, with the exact frame)
    results.notes["foreground_went_first"] = [a == b for a, b in ready_pairs]
    page.context.close()
    return {"foreground_tokens": tokens, "foreground_seed": seed, "foreground_taus": taus}


def foreground_backend(model: str, tokens: int, seed: int, taus: list[float], results: Results) -> None:
    """(h)'s exact passes alone, in this process: their seconds and their longest stretch between attention calls."""
    import logging

    from streamlit.runtime.scriptrunner_utils import script_run_context

    logging.getLogger(script_run_context.__name__).setLevel(logging.ERROR)
    from core.mechanics.attention import between_layers
    from core.runs import engine, methods
    from core.runs.settings import DocumentRequest
    from ui import cache

    loaded = cache.model(model)
    probes = cache.explore_probes(loaded.n_layers - 1, None)  # the page's default: last layer, head mean
    short = DocumentRequest(task="passkey", tokens=2 * loaded.train_length, depth=0.5, seed=seed)
    engine.run(loaded, cache.document(loaded, short), Choice.of(tau=0.99), engine.Pass(probes=probes))  # warm
    doc = cache.document(loaded, DocumentRequest(task="passkey", tokens=tokens, depth=0.5, seed=seed))
    for tau in taus:
        settings = (
            Choice.of(tau=tau, method=methods.FIXED, targets=("encoder",), cosine_scale=None),
            engine.Pass(probes=probes),
        )
        stamps: list[float] = []
        with between_layers(lambda: stamps.append(time.perf_counter())):
            t0 = time.perf_counter()
            engine.run(loaded, doc, *settings)
            t1 = time.perf_counter()
        marks = [t0, *stamps, t1]
        results.add("foreground_own_s", Timing(t1 - t0, None, None, None, 0, 0))
        results.add("foreground_layer_s", Timing(max(b - a for a, b in zip(marks, marks[1:])), None, None, None, 0, 0))


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
                info["tokens_1x"] = scrubber_state(page)["tokens"]
                info["seed"] = length_changes(browser, page, args.repeats, args.multiple, results, explore_charts)
                info["tokens"] = scrubber_state(page)["tokens"]
                if "scrub" not in args.skip:
                    seen = scrub(browser, page, results, args.scrub_gap)
                    info["scrub_distinct"] = {
                        k: len({v[i] for v in seen.values()})
                        for i, k in enumerate(("answer", "pmax", "entropy", "map_sum"))
                    }
                if "offgrid" not in args.skip:
                    info["fresh_taus"] = off_grid(browser, page, args.repeats, results)
                if "drag" not in args.skip:
                    drag(browser, page, args.repeats, results, args.drag_steps, args.drag_seconds)
                if "calibrate" not in args.skip:
                    calibrate(browser, page, args.repeats, results)
                if "theory" not in args.skip:
                    theory(browser, page, args.repeats, results)
                page.context.close()
                if "foreground" not in args.skip:
                    tokens = args.foreground_multiple * info["tokens_1x"]
                    info.update(foreground(browser, srv.url, tokens, 3000, args.repeats, results))
        finally:
            browser.close()
    return info


# -- the backend share --------------------------------------------------------------


def backend_part(model: str, multiple: int, seed: int, taus: list[float], results: Results) -> None:
    """In this process: the document's grid, then per off-grid tau its exact pass and the payload its rerun sends."""
    import logging

    from streamlit.runtime.scriptrunner_utils import script_run_context

    logging.getLogger(script_run_context.__name__).setLevel(logging.ERROR)  # "missing ScriptRunContext": expected here
    from core.runs import engine, methods
    from core.runs.settings import DocumentRequest
    from core.views import frames
    from ui import cache

    loaded = cache.model(model)
    req = DocumentRequest(task="passkey", tokens=multiple * loaded.train_length, depth=0.5, seed=seed)
    probes = cache.explore_probes(loaded.n_layers - 1, None)  # the page's default: last layer, head mean

    def at(tau: float, method: str = methods.FIXED) -> tuple[Choice, engine.Pass]:
        return Choice.of(tau=tau, method=method, targets=("encoder",), cosine_scale=None), engine.Pass(probes=probes)

    t = time.perf_counter()  # what the server computes for a new document: base, reference, grid
    doc = cache.document(loaded, req)
    base = cache.run(loaded, req, *at(1.0, methods.AS_TRAINED))
    ref = cache.run_reference(loaded, req)
    grid = {g: cache.run(loaded, req, *at(g)) for g in frames.grid_order(1.0)}  # tau = 1 is the base pass (cached)
    results.add("backend_grid_s", Timing(time.perf_counter() - t, None, None, None, 0, 0))
    for tau in taus:
        t = time.perf_counter()
        exact = cache.run(loaded, req, *at(tau))
        mid = time.perf_counter()
        data = frames.payload(base, ref, grid, exact, doc.text, frames.ViewSpec(), meta={"tau": tau})
        end = time.perf_counter()
        results.add("backend_s", Timing(end - t, None, None, None, 0, len(data)))
        results.add("backend_payload_s", Timing(end - mid, None, None, None, 0, len(data)))
        results.notes.setdefault("backend_encoder", []).append(exact.seconds.get("encode"))
    results.notes["payload_bytes"] = len(data) if taus else None


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
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": ram,
        "torch": torch,
        "streamlit": metadata.version("streamlit"),
        "chromium": CHROMIUM,
    }


def stats(values: list[float]) -> dict:
    return {
        "median": statistics.median(values),
        "p95": p95(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "values": [round(v, 4) for v in values],
    }


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summary(results: Results, info: dict, args: argparse.Namespace, mach: dict) -> dict:
    out: dict[str, Any] = {}
    detail: dict[str, Any] = {}
    for name, ts in results.timings.items():
        s = stats([t.total for t in ts])
        s.update(
            first_frame=_median([t.first_frame for t in ts]),
            script_finished=_median([t.finished for t in ts]),
            last_frame=_median([t.last_frame for t in ts]),
            frames=_median([t.frames for t in ts]),
            after_script=_median([None if t.finished is None else t.total - t.finished for t in ts]),
            bytes=_median([t.bytes for t in ts]),
            cpu_server=_median([t.cpu_server for t in ts]),
            cpu_browser=_median([t.cpu_browser for t in ts]),
        )
        if any(t.paint_ms is not None for t in ts):
            pm = [t.paint_ms / 1000 for t in ts if t.paint_ms is not None]
            s["component_paint_ms"] = {"median": statistics.median(pm), "p95": p95(pm), "n": len(pm)}
        js = [t.paint_js_ms for t in ts if t.paint_js_ms is not None]
        if js:
            s["paint_js_ms"] = {"median": statistics.median(js), "p95": p95(js), "max": max(js), "n": len(js)}
        if any(t.payloads is not None for t in ts):
            hit = [t for t in ts if t.payloads]
            s["moves_with_a_payload"] = {
                "n": len(hit),
                "of": len(ts),
                "their_median_s": _median([t.total for t in hit]),
                "the_others_median_s": _median([t.total for t in ts if not t.payloads]),
            }
            s["moves_with_ws_frames"] = sum(1 for t in ts if t.frames)
        detail[name] = s
        out[name] = s["median"]
    for name in (*ORDER, "scrub_fps"):
        out.setdefault(name, None)
    out["scrub_p95_s"] = detail["scrub_s"]["p95"] if "scrub_s" in detail else None
    exact = results.timings.get("exact_frame_s", [])
    out["bytes_per_exact_move"] = int(statistics.median([t.bytes for t in exact])) if exact else None
    out["exact_move_bytes_by_kind"] = (
        {k: round(v / len(exact)) for k, v in results.kinds.most_common()} if exact else None
    )
    out["browser_over_backend"] = _ratio(out["exact_frame_s"], out["backend_s"])
    out["grid_over_backend"] = _ratio(out["grid_ready_s"], out["backend_grid_s"])
    out["warm_over_cold"] = _ratio(out["landing_s"], out["landing_cold_s"])
    own_layer = (out["foreground_own_s"] + out["foreground_layer_s"]) if out["foreground_own_s"] is not None else None
    out["foreground_over_own_layer"] = _ratio(out["foreground_exact_s"], own_layer)
    out["targets"] = {
        name: {
            "limit": lim,
            "at_most": at_most,
            "value": out.get(name),
            "met": None if out.get(name) is None else bool(out[name] <= lim if at_most else out[name] >= lim),
        }
        for name, lim, _, at_most in TARGETS
    }
    out.update(
        model=args.model_name,
        tokens=info.get("tokens"),
        tokens_landing=info.get("tokens_1x"),
        multiple=args.multiple,
        seed=info.get("seed"),
        repeats=args.repeats,
        scrub_gap_s=args.scrub_gap,
        drag_steps=args.drag_steps,
        drag_seconds=args.drag_seconds,
        fresh_taus=info.get("fresh_taus"),
        scrub_distinct=info.get("scrub_distinct"),
        foreground_tokens=info.get("foreground_tokens"),
        explore_charts=info.get("explore_charts"),
        machine=mach,
        details=detail,
        notes=results.notes,
        date=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    return out


def _f(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def print_table(s: dict) -> None:
    m = s["machine"]
    print(
        f"Browser latency: model {s['model']}, pass key at {s['multiple']} x L_tr = {s['tokens'] or 0:,} tokens "
        f"(landing page: {s['tokens_landing'] or 0:,}), {s['repeats']} repeats, headless Chromium {VIEWPORT['width']}x"
        f"{VIEWPORT['height']}"
    )
    print(
        f"machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, torch {m['torch']}, streamlit "
        f"{m['streamlit']}; load average {m['load_before'][0]:.2f} before, {m['load_after'][0]:.2f} after; {s['date']}"
    )
    print()
    print(
        f"{'measure':<18} {'median':>7} {'p95':>7} {'min':>7} {'max':>7} {'n':>3} | {'1st frame':>9} {'script done':>11} "
        f"{'paint-done':>10} {'frames':>6} {'kB':>6} | {'CPU server':>10} {'CPU browser':>11}"
    )
    d = s["details"]
    for name in (*ORDER[:7], "scrub_fps", *ORDER[7:]):
        if name not in d:
            continue
        r = d[name]
        kb = f"{r['bytes'] / 1000:.0f}" if r["bytes"] else ""
        digits = 1 if name == "scrub_fps" else 3
        print(
            f"{name:<18} {r['median']:>7.{digits}f} {r['p95']:>7.{digits}f} {r['min']:>7.{digits}f} "
            f"{r['max']:>7.{digits}f} {r['n']:>3} | {_f(r['first_frame']):>9} {_f(r['script_finished']):>11} "
            f"{_f(r['after_script']):>10} {_f(r['frames'], 0) if r['frames'] else '':>6} {kb:>6} | "
            f"{_f(r['cpu_server'], 2):>10} {_f(r['cpu_browser'], 2):>11}"
        )
    print(
        "(seconds from the keydown / mousedown / navigation start to the paint, browser clock; scrub_fps in frames\n"
        " per second; the columns after | are medians: first websocket frame, script_finished frame, paint minus\n"
        " script_finished, frames and kB received; CPU seconds of the server process and Chromium's processes)"
    )
    for name in ("scrub_s", "nearest_frame_s"):
        pm = d.get(name, {}).get("component_paint_ms")
        if pm:
            print(
                f"  {name}: the component's own data-paint-ms (from its input handler): median {pm['median']:.3f} s, "
                f"p95 {pm['p95']:.3f} s"
            )
    if "scrub_s" in d:
        print(
            f"  scrubbing: {d['scrub_s']['n']} PageDown/PageUp moves between grid values, one every "
            f"{s['scrub_gap_s']:g} s; distinct values over the grid: {s['scrub_distinct']}"
        )
        r = d["scrub_s"]
        if r.get("paint_js_ms"):
            print(
                f"  scrub_s, where the time went: the paint's own JavaScript {r['paint_js_ms']['median']:.1f} ms "
                f"median (max {r['paint_js_ms']['max']:.1f}); values sent to the server over the scrub "
                f"{s['notes'].get('scrub_releases')}, payloads handled {s['notes'].get('scrub_payloads')}; moves "
                f"with websocket frames before their paint {r.get('moves_with_ws_frames')} of {r['n']}"
            )
        hit = r.get("moves_with_a_payload")
        if hit and hit["n"]:
            print(
                f"  scrub_s: {hit['n']} of {hit['of']} moves handled a payload before their paint (median "
                f"{_f(hit['their_median_s'])} s, the others {_f(hit['the_others_median_s'])} s)"
            )
    shown = s["notes"].get("drag_grid_frames_shown")
    if shown:
        print(
            f"  drag: {s['drag_steps']} moves over {s['drag_seconds']:g} s (pointer down to up: "
            f"{', '.join(f'{x:.2f}' for x in s['notes']['drag_seconds'])} s); grid frames shown on the way: "
            f"{', '.join(map(str, shown))} of {GRID_N}"
            + (
                f" (missed: {s['notes']['drag_grid_frames_missed']})"
                if any(s["notes"].get("drag_grid_frames_missed", []))
                else ""
            )
        )
    if s["notes"].get("grid_ready_polled") and any(s["notes"]["grid_ready_polled"]):
        print("  grid_ready_s: some repeats were read at a 50 ms poll, not from the paint log")
    if "calibrate_s" in d:
        print(
            f"  calibrate_s: until the curves chart is painted; calibrate_page_s: the whole page; timed from "
            f"{s['notes'].get('calibrate_from')}"
        )
    if s["bytes_per_exact_move"] is not None:
        top = ", ".join(f"{k} {v / 1000:.0f} kB" for k, v in list(s["exact_move_bytes_by_kind"].items())[:4])
        print(
            f"  bytes per off-grid move (websocket, median, until its exact frame): {s['bytes_per_exact_move']:,} ({top})"
        )
    if s["backend_s"] is not None:
        enc = _median(s["notes"].get("backend_encoder", []))
        print(
            f"  backend, in this process: exact pass + payload {s['backend_s']:.3f} s (encoder {_f(enc)} s, payload "
            f"{_f(s['backend_payload_s'])} s, {s['notes'].get('payload_bytes') or 0:,} bytes); the document's base, "
            f"reference and grid {_f(s['backend_grid_s'], 2)} s"
        )
    if s["foreground_exact_s"] is not None:
        print(
            f"  foreground during the grid ({s['foreground_tokens'] or 0:,} tokens): exact frame "
            f"{s['foreground_exact_s']:.2f} s after the key; that pass alone {_f(s['foreground_own_s'], 2)} s, one "
            f"layer {_f(s['foreground_layer_s'], 2)} s: exact / (own + layer) = {_f(s['foreground_over_own_layer'], 2)}; "
            f"the person went before the background pass: {s['notes'].get('foreground_went_first')} "
            f"(data-ready at the key, with the exact frame: {s['notes'].get('foreground_ready')})"
        )
    print(
        f"  ratios: exact frame / backend = {_f(s['browser_over_backend'], 2)}; grid ready / backend grid = "
        f"{_f(s['grid_over_backend'], 2)}; warm / cold landing = {_f(s['warm_over_cold'], 2)}"
    )
    print()
    print("targets (issue 41; calibrate: issue 24):")
    for name, lim, unit, at_most in TARGETS:
        t = s["targets"][name]
        verdict = "not measured" if t["met"] is None else ("met" if t["met"] else "MISSED")
        print(f"  {name:<16} {'<=' if at_most else '>='} {lim:g} {unit}: {_f(t['value'], 3):>7}  [{verdict}]")


# -- entry --------------------------------------------------------------------------


def check_inputs(args: argparse.Namespace) -> None:
    if not Path(CHROMIUM).exists():
        raise BenchError(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        raise BenchError(
            "playwright (python) is not installed: pip install playwright (no 'playwright install' needed)"
        ) from None
    unknown = set(args.skip) - set(SKIPPABLE)
    if unknown:
        raise BenchError(f"--skip: unknown part(s) {', '.join(sorted(unknown))}; choose from {', '.join(SKIPPABLE)}")
    if args.repeats < 1 or args.cold_repeats < 0 or args.multiple < 2:
        raise BenchError("--repeats must be >= 1, --cold-repeats >= 0 and --multiple >= 2")
    if args.repeats > 14:
        raise BenchError("--repeats must be at most 14 (one off-grid move below each grid value but the last)")
    if args.multiple not in (2, 4, 8, 16):
        raise BenchError("--multiple must be one of the app's length buttons: 2, 4, 8, 16")
    if args.foreground_multiple < 2:
        raise BenchError("--foreground-multiple must be >= 2")
    if args.scrub_gap < 0 or args.drag_steps < 2 or args.drag_seconds <= 0:
        raise BenchError("--scrub-gap must be >= 0, --drag-steps >= 2 and --drag-seconds > 0")
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
    p.add_argument(
        "--model", default=None, help="registry name or folder (sets AAE_MODEL); default: the bundled default"
    )
    p.add_argument("--repeats", type=int, default=3, help="repeats per measure; medians are reported (default 3)")
    p.add_argument(
        "--cold-repeats", type=int, default=None, help="cold landings, each on a fresh server (default: --repeats)"
    )
    p.add_argument("--multiple", type=int, default=8, help="document length in multiples of L_tr (default 8)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--skip", default="", help=f"comma list of parts to leave out: {', '.join(SKIPPABLE)}")
    p.add_argument("--screenshot", type=Path, default=None, help="save a PNG here after every timed action")
    p.add_argument(
        "--scrub-gap",
        type=float,
        default=0.3,
        metavar="SECONDS",
        help="seconds from one scrubbing key press to the next (default 0.3: a row of presses, whose last value "
        "alone reaches the server; over 0.7: each press's value does, 200 ms after it)",
    )
    p.add_argument("--drag-steps", type=int, default=60, help="mouse moves of one drag across the slider (default 60)")
    p.add_argument(
        "--drag-seconds", type=float, default=1.0, help="how long one drag across the slider takes (default 1)"
    )
    p.add_argument(
        "--foreground-multiple",
        type=int,
        default=16,
        metavar="N",
        help="(h): the document whose grid computes while a person moves off the grid, in multiples of "
        "L_tr (default 16; 64 = 16,384 tokens on the default model)",
    )
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
            backend_part(args.model_name, args.multiple, info["seed"], info["fresh_taus"], results)
        if info.get("foreground_taus"):
            foreground_backend(
                args.model_name, info["foreground_tokens"], info["foreground_seed"], info["foreground_taus"], results
            )
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
