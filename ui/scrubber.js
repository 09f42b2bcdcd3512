// The scrubber: Explore's tau slider and every view that depends on tau, drawn in the browser.
//
// Python (ui/scrubber.py, from core/views/frames.py) sends one binary payload per
// document: the views of every grid tau computed so far, the tau = 1 column,
// the L_tr reference and, when the chosen tau is off the grid, its exact
// frame. A slider move repaints from those arrays with no server round trip;
// only a release sends the tau back (one rerun: URL, export, exact frame).
//
// Test hooks: the root element carries data-tau, data-kind (grid | nearest |
// exact | missing), data-answer, data-correct, data-pmax, data-entropy,
// data-map-sum, data-ready ("k/n"), data-paints and data-paint-ms (input event
// to the second animation frame after the draw). Where a move's time goes
// (bench/browser_latency.py reads them): data-paint-js-ms (the last paint's own
// JavaScript), data-payloads (payloads handled), data-payload-ms and
// data-payload-bytes (the last one's handling and size), data-releases (values
// sent to the server, each one rerun of Explore's panel).

const STATE = new WeakMap();
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const LAYER_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
  "#d62728", "#7f7f7f", "#aec7e8", "#ffbb78"];
const SVGNS = "http://www.w3.org/2000/svg";
// Keys wait for a pause before their value goes to the server (one rerun of Explore's panel: the URL, the export, an
// exact frame off the grid): LONE_KEY_MS after a single press, BURST_KEY_MS after a press that came within
// BURST_KEY_MS of the one before (PageDown pressed in a row, a presentation clicker). Why: each rerun's answer is
// rendered by Streamlit on the browser's main thread, 40-100 ms on the 2-core machine under load, and the answer to
// press n landed just as press n + 1 was to be drawn (bench/browser_latency.py's scrub, a press every 0.3 s: one
// rerun per press, its median 44-49 ms; issue 59 point 11). A row of presses now sends its last value only.
const LONE_KEY_MS = 200, BURST_KEY_MS = 700;

// -- payload -------------------------------------------------------------------------------

function unpack(bytes) {
  const u8 = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  const magic = String.fromCharCode(u8[0], u8[1], u8[2], u8[3]);
  if (magic !== "AAEF") throw new Error("not a scrubber payload");
  const n = u8[4] | (u8[5] << 8) | (u8[6] << 16) | (u8[7] << 24);
  const header = JSON.parse(new TextDecoder().decode(u8.subarray(8, 8 + n)));
  let start = 8 + n;
  start += (8 - (start % 8)) % 8;
  // One aligned copy of the blob area, so every array is a zero-copy typed view of it.
  const blob = u8.slice(start).buffer;
  const view = (e) => {
    if (!e) return null;
    const count = e.shape.reduce((a, b) => a * b, 1);
    const arr = e.dtype === "f32" ? new Float32Array(blob, e.off, count) : new Uint8Array(blob, e.off, count);
    return { data: arr, shape: e.shape };
  };
  const resolve = (f) => f && Object.assign({}, f, {
    map: view(f.map), qrows: view(f.qrows), profile: view(f.profile), text_weights: view(f.text_weights),
    cross: view(f.cross),
  });
  if (header.base) header.base = resolve(header.base);
  if (header.mask) header.mask = view(header.mask);
  if (header.causal) header.causal = view(header.causal);
  header.exact = resolve(header.exact);
  for (const k of Object.keys(header.frames)) header.frames[k] = resolve(header.frames[k]);
  return header;
}

// -- colour --------------------------------------------------------------------------------

function viridis(t) {
  t = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(t));
  const f = t - i, a = VIRIDIS[i], b = VIRIDIS[i + 1];
  return [a[0] + f * (b[0] - a[0]), a[1] + f * (b[1] - a[1]), a[2] + f * (b[2] - a[2])];
}

function decode(scale, c) {
  if (c === 0) return 0;
  const a = Math.log(scale.lo), b = Math.log(scale.hi);
  return Math.exp(a + ((c - 1) / 254) * (b - a));
}

// code -> RGBA, one table per colour scale. Log colour spreads the codes between the faint end of the tau = 1
// map (its 2nd percentile) and the brightest cell of the pair, so a dispersed map is not one flat colour and the
// needle cell stands out at any length; linear divides by the brightest cell of the pair.
function lut(scale, log, cmax, cmin) {
  const t = new Uint8ClampedArray(256 * 4);
  const vmax = decode(scale, cmax);
  for (let c = 0; c < 256; c++) {
    const x = log ? (c - cmin) / Math.max(1, cmax - cmin) : decode(scale, c) / vmax;
    const [r, g, b] = viridis(x);
    t.set([r, g, b, 255], c * 4);
  }
  return t;
}

function lowCode(a) {
  if (!a) return 0;
  const hist = new Uint32Array(256);
  let n = 0;
  for (let i = 0; i < a.data.length; i++) if (a.data[i]) { hist[a.data[i]]++; n++; }
  let acc = 0;
  for (let c = 1; c < 256; c++) { acc += hist[c]; if (acc >= 0.02 * n) return c; }
  return 0;
}

function maxCode(...arrs) {
  let m = 1;
  for (const a of arrs) if (a) for (let i = 0; i < a.data.length; i++) if (a.data[i] > m) m = a.data[i];
  return m;
}

// -- small DOM helpers ---------------------------------------------------------------------

function el(tag, cls, parent, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}

function svg(tag, attrs, parent) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

const fmt = (x, d) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));
const tauKey = (t) => Number(t).toFixed(2);
// The slider's axis: tau (default) or, on a cosine model, CosScale s (meta.axis). A frame's place on it:
const axisOf = (d) => (d.meta && d.meta.axis) || { name: "tau", label: "tau", min: 0.3, max: 1.0, step: 0.01 };
const val = (d, f) => (axisOf(d).name === "s" ? f.cosine_scale : f.tau);

// -- building the views (once per document) -------------------------------------------------

function build(root, st) {
  root.textContent = "";
  // A new document may lack views the last one had (a RoPE model has no profile, text or cross-attention): drop
  // every handle of the old build, or a paint would reach for the old document's views.
  for (const k of ["maps", "mapLegend", "profileSvg", "lines", "baseLines", "spans", "cross", "heads", "meters"]) st[k] = null;
  const d = st.doc, meta = d.meta || {};
  // controls
  const ctl = el("div", "ctl", root);
  const ax = axisOf(d);
  el("span", "", ctl, ax.label);
  const range = el("input", "", ctl);
  Object.assign(range, { type: "range", min: String(ax.min), max: String(ax.max), step: String(ax.step) });
  range.setAttribute("aria-label", ax.label);
  const read = el("span", "tau-read", ctl);
  const ticks = el("div", "ticks", root);
  st.tickEls = {};
  for (const t of d.grid) {
    const s = el("span", "", ticks);
    s.style.left = `${((t - ax.min) / (ax.max - ax.min)) * 100}%`;
    s.title = `grid ${ax.label} ${tauKey(t)}`;
    st.tickEls[tauKey(t)] = s;
  }
  const status = el("div", "status", root);
  Object.assign(st, { range, read, status });

  // cards
  const cards = el("div", "row", root);
  st.cards = [0, 1].map((i) => {
    const c = el("div", "card col", cards);
    c.dataset.side = i ? "chosen" : "base";
    const badge = el("span", "badge", c, "updating");
    const title = el("div", "title", c);
    const note = el("div", "approx-note", c);
    const ans = el("div", "ans", c);
    const metrics = el("div", "metrics", c);
    const mk = () => {
      const m = el("div", "metric", metrics);
      return { lab: el("div", "lab", m), val: el("div", "val", m), dlt: el("div", "dlt", m) };
    };
    const pm = mk(), en = mk();
    const foot = el("div", "cap", c);
    return { c, badge, title, note, ans, pm, en, foot };
  });
  el("div", "cap", root, `The document is ${d.tokens.toLocaleString("en")} tokens, ${(d.tokens / d.train_length).toFixed(2)} × `
    + `the training length L_tr = ${d.train_length.toLocaleString("en")}. Left: ${meta.base_label || "tau = 1"}; right: the `
    + `${ax.name === "s" ? "CosScale s on the slider, at the chosen tau" : "tau on the slider"}. Deltas compare with the `
    + "same task at L_tr (tau = 1).");

  // meters
  el("h4", "", root, "Pmax and entropy per layer against L_tr");
  el("div", "cap", root, `Bars: the chosen ${ax.name === "s" ? "s" : "tau"}; black ticks: the same task at L_tr with tau = 1 (what training looked like); `
    + "grey circles: this document at tau = 1. Green within 10 % of the tick, orange within 30 %, red beyond. Alignment "
    + "means bars on the ticks (paper Sec. 4). The entropy axis reaches ln(tokens), the entropy of uniform attention.");
  const mrow = el("div", "row", root);
  st.meters = ["pmax", "entropy"].map((k) => buildMeter(el("div", "col", mrow), st, k));
  const det = el("details", "", root);
  el("summary", "", det, "Per head: Pmax over its value at L_tr");
  el("div", "cap", det, "Each cell is one head's mean Pmax over the same head's at L_tr (tau = 1): white looks as in "
    + "training, red has dispersed, blue is sharper than in training. Rows: layers; columns: heads.");
  const hrow = el("div", "heads", det);
  st.heads = [0, 1].map((i) => {
    const box = el("div", "", hrow);
    const t = el("div", "maptitle", box, i ? "chosen tau" : "tau = 1");
    const cv = el("canvas", "", box);
    cv.width = d.heads * 24; cv.height = d.layers * 24;
    return { t, cv };
  });

  // maps
  if (d.base.map) {
    el("h4", "", root, "Attention map");
    const what = d.heatmap_head === null || d.heatmap_head === undefined ? "mean of heads" : `head ${d.heatmap_head}`;
    el("div", "cap", root, `Encoder self-attention of layer ${d.heatmap_layer} (${what}), pooled to `
      + `${d.base.map.shape[0]} × ${d.base.map.shape[1]} cells of token ranges; both maps share one colour scale `
      + `(${meta.log ? "log" : "linear"} colour). ` + (meta.map_note || "Red dotted lines: the needle; blue: the question. "
      + "Below each map, the question's own rows, one token each: dispersed, their mass spreads over the whole row; a "
      + "sharper tau brings back a bright cell at the needle column."));
    const row = el("div", "row", root);
    st.maps = [0, 1].map((i) => {
      const col = el("div", "col", row);
      const t = el("div", "maptitle", col);
      const cv = el("canvas", "", col);
      cv.width = 512; cv.height = 512;
      const q = el("canvas", "", col);
      const qn = d.base.qrows ? d.base.qrows.shape[0] : 0;
      q.width = 512; q.height = Math.max(1, qn * 10);
      q.style.marginTop = "6px";
      if (!qn) q.style.display = "none";
      return { t, cv, q };
    });
    const leg = el("div", "legend", root);
    st.mapLegend = el("span", "", leg);
  }

  // profile
  if (d.base.profile) {
    el("h4", "", root, "Where the question looks");
    el("div", "cap", root, "Attention from the question's tokens to every document position (head mean, averaged over the "
      + "question rows; each point the largest in its range of tokens), one line per layer at the chosen tau, grey lines "
      + "at tau = 1" + (d.needle ? "; the needle is shaded red. Retrieval works when some layer puts a clear peak "
      + "inside the red band." : ". No needle is marked in this text: the peaks are what the question reads."));
    const leg = el("div", "legend", root);
    st.profileOn = st.profileOn || Array.from({ length: d.layers }, () => true);
    for (let l = 0; l < d.layers; l++) {
      const lab = el("label", "", leg);
      const cb = el("input", "", lab);
      cb.type = "checkbox"; cb.checked = st.profileOn[l];
      cb.onchange = () => { st.profileOn[l] = cb.checked; paintProfile(st, true); };
      const sw = el("span", "", lab, `layer ${l}`);
      sw.style.color = LAYER_COLOURS[l % LAYER_COLOURS.length];
    }
    const lab = el("label", "", leg);
    const lg = el("input", "", lab);
    lg.type = "checkbox"; lg.checked = !!st.profileLog;
    lg.onchange = () => { st.profileLog = lg.checked; paintProfile(st, true); };
    el("span", "", lab, "log scale");
    st.profileSvg = svg("svg", { viewBox: "0 0 800 260", width: "100%" }, root);
  }

  // text
  if (d.text && d.base.text_weights) {
    el("h4", "", root, "The text, shaded by the question's attention");
    el("div", "cap", root, "Each token's background is the attention the question gives it at the chosen tau, relative to "
      + "the largest in view" + (d.needle ? "; the needle is underlined. Zoomed around the needle." : ". Zoomed "
      + "around the question (no needle is marked in this text)."));
    const leg = el("div", "legend", root);
    const lab = el("label", "", leg, "attention of ");
    const sel = el("select", "", lab);
    el("option", "", sel, "mean of layers").value = "mean";
    for (let l = 0; l < d.layers; l++) el("option", "", sel, `layer ${l}`).value = String(l);
    sel.value = st.textLayer || "mean";
    sel.onchange = () => { st.textLayer = sel.value; paintText(st, currentFrame(st)); };
    const box = el("div", "shade", root);
    if (d.text.before) box.appendChild(document.createTextNode("… "));
    st.spans = d.text.pieces.map(([gap, tok], i) => {
      if (gap) box.appendChild(document.createTextNode(gap));
      const s = el("span", "", box, tok);
      const idx = d.text.first + i;
      if (d.needle && idx >= d.needle[0] && idx < d.needle[1]) s.className = "needle";
      return s;
    });
    if (d.text.after) box.appendChild(document.createTextNode(" …"));
  }

  // the answer's attention
  if (d.base.cross) {
    el("h4", "", root, "Where the answer looks");
    el("div", "cap", root, "The decoder's cross-attention while it writes the answer: one row per token it wrote, the "
      + "document's positions pooled like the maps above; the red bar marks the needle, the titles give the share of "
      + "attention on it. tau divides the encoder only, so a wrong answer either looks elsewhere (the share falls) or "
      + "reads a needle whose encoder states dispersion blurred (the share holds, the tokens come out wrong).");
    const row = el("div", "row", root);
    st.cross = [0, 1].map(() => {
      const col = el("div", "col", row);
      return { t: el("div", "maptitle", col), cv: el("canvas", "", col) };
    });
  }

  // events
  const move = (why) => {
    st.t0 = performance.now();
    st.why = why;
    schedule(st);
  };
  range.addEventListener("input", () => move("input"));
  range.addEventListener("pointerdown", () => { st.dragging = true; });
  const up = () => { if (st.dragging) { st.dragging = false; schedule(st); } };
  range.addEventListener("pointerup", up);
  range.addEventListener("pointercancel", up);
  // A pointer release goes to the server at once; keys wait for a pause (a held arrow key sends many changes).
  range.addEventListener("change", () => commit(st, st.why === "input" && !st.keyed ? 0 : keyPause(st)));
  range.addEventListener("keydown", () => {
    st.keyed = true;
    st.prevKey = st.lastKey;
    st.lastKey = performance.now();
  });
  range.addEventListener("pointerdown", () => { st.keyed = false; });
  range.addEventListener("keydown", (e) => {
    // PageUp / PageDown (and shift + arrows): the next grid value, the paper's 0.05 steps.
    const dir = { PageUp: 1, PageDown: -1, ArrowRight: 1, ArrowUp: 1, ArrowLeft: -1, ArrowDown: -1 }[e.key];
    if (!dir || (!e.key.startsWith("Page") && !e.shiftKey)) return;
    e.preventDefault();
    // The next grid value in the axis's own direction, whatever order the grid comes in (tau's descends, s's ascends).
    const v = Number(range.value);
    const above = d.grid.filter((t) => t > v + 1e-9), below = d.grid.filter((t) => t < v - 1e-9);
    if (!(dir > 0 ? above : below).length) return;
    const next = dir > 0 ? Math.min(...above) : Math.max(...below);
    range.value = tauKey(next);
    move("key");
    commit(st, keyPause(st));
  });
}

function buildMeter(box, st, kind) {
  const d = st.doc, L = d.layers;
  const W = 380, H = 230, x0 = 44, y0 = 16, w = W - x0 - 10, h = H - y0 - 34;
  const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%" }, box);
  const refs = d.ref[`layer_${kind}`], bases = d.base[`layer_${kind}`];
  const all = refs.concat(bases);
  for (const f of Object.values(d.frames)) all.push(...f[`layer_${kind}`]);
  if (d.exact) all.push(...d.exact[`layer_${kind}`]);
  // The axis holds every value a frame can have, also frames that arrive later (a CosScale s of 2 flattens the
  // attention): Pmax <= 1, and H <= ln(tokens), the entropy of uniform attention over the document (or over L_tr).
  const top = kind === "pmax" ? 1.0 : Math.max(Math.log(Math.max(2, d.tokens, d.train_length)), ...all);
  const y = (v) => y0 + h - (Math.min(top, Math.max(0, v)) / top) * h;
  svg("line", { x1: x0, y1: y0 + h, x2: x0 + w, y2: y0 + h, stroke: "#999" }, s);
  for (let k = 0; k <= 4; k++) {
    const v = (top * k) / 4;
    svg("line", { x1: x0 - 3, y1: y(v), x2: x0 + w, y2: y(v), stroke: "#eee" }, s);
    svg("text", { x: x0 - 6, y: y(v) + 4, "text-anchor": "end" }, s).textContent = v.toFixed(kind === "pmax" ? 2 : 1);
  }
  svg("text", { x: x0 + w / 2, y: 12, "text-anchor": "middle" }, s).textContent = kind === "pmax" ? "Pmax" : "entropy H (nats)";
  const bw = w / L;
  const bars = [], circles = [];
  for (let l = 0; l < L; l++) {
    const cx = x0 + bw * (l + 0.5);
    bars.push(svg("rect", { x: cx - bw * 0.3, width: bw * 0.6, y: y0 + h, height: 0, fill: "#2ca02c" }, s));
    svg("line", { x1: cx - bw * 0.4, x2: cx + bw * 0.4, y1: y(refs[l]), y2: y(refs[l]), stroke: "#000", "stroke-width": 3 }, s);
    circles.push(svg("circle", { cx, cy: y(bases[l]), r: 5, fill: "none", stroke: "#888", "stroke-width": 2 }, s));
    svg("text", { x: cx, y: y0 + h + 14, "text-anchor": "middle" }, s).textContent = `layer ${l}`;
  }
  const lx = x0 + 4, ly = H - 6;
  // The bars' colour says how far they are from the tick (green, orange, red): the key shows all three.
  ["#2ca02c", "#ff9f1c", "#d62728"].forEach((c, i) => svg("rect", { x: lx + 4 * i, y: ly - 8, width: 4, height: 8, fill: c }, s));
  svg("text", { x: lx + 16, y: ly }, s).textContent = axisOf(d).name === "s" ? "chosen s" : "chosen tau";
  svg("line", { x1: lx + 90, x2: lx + 104, y1: ly - 4, y2: ly - 4, stroke: "#000", "stroke-width": 3 }, s);
  svg("text", { x: lx + 108, y: ly }, s).textContent = "at L_tr (tau = 1)";
  svg("circle", { cx: lx + 222, cy: ly - 4, r: 4, fill: "none", stroke: "#888", "stroke-width": 2 }, s);
  svg("text", { x: lx + 230, y: ly }, s).textContent = "here at tau = 1";
  return { kind, bars, circles, y, refs, bases };
}

// -- painting (per frame) -------------------------------------------------------------------

function currentFrame(st) {
  const d = st.doc, v = Number(st.range.value), key = tauKey(v);
  if (d.exact && tauKey(val(d, d.exact)) === key && !(key in d.frames)) return { f: d.exact, kind: "exact", tau: v };
  if (key in d.frames) return { f: d.frames[key], kind: "grid", tau: v };
  // nearest computed grid frame (ties: the gentler tau)
  let best = null;
  for (const t of d.grid) {
    if (!(tauKey(t) in d.frames)) continue;
    if (best === null || Math.abs(t - v) < Math.abs(best - v) - 1e-9) best = t;
  }
  const nearestAny = d.grid.reduce((a, t) => (Math.abs(t - v) < Math.abs(a - v) - 1e-9 ? t : a), d.grid[0]);
  if (best === null) return { f: null, kind: "missing", tau: v, nearest: nearestAny };
  const onGrid = Math.abs(nearestAny - v) < 1e-9;
  return { f: d.frames[tauKey(best)], kind: onGrid ? "missing" : "nearest", tau: v, shown: best, nearest: nearestAny };
}

function schedule(st) {
  if (st.raf) return;
  st.raf = requestAnimationFrame(() => {
    st.raf = 0;
    paint(st);
  });
}

// How long a key press waits before its value goes to the server (see LONE_KEY_MS).
function keyPause(st) {
  return st.prevKey !== undefined && st.lastKey - st.prevKey < BURST_KEY_MS ? BURST_KEY_MS : LONE_KEY_MS;
}

function paint(st) {
  const p0 = performance.now();
  const d = st.doc, meta = d.meta || {};
  let cur = currentFrame(st);
  // A drag paints every grid frame it crosses: step one grid frame per animation frame toward the pointer.
  if (st.dragging && st.lastGrid !== undefined && cur.f) {
    const target = cur.kind === "grid" ? cur.tau : cur.shown;
    const ready = d.grid.filter((t) => tauKey(t) in d.frames);
    const i = ready.findIndex((t) => tauKey(t) === tauKey(st.lastGrid));
    const j = ready.findIndex((t) => tauKey(t) === tauKey(target));
    if (i >= 0 && j >= 0 && Math.abs(i - j) > 1) {
      const step = ready[i + Math.sign(j - i)];
      cur = { f: d.frames[tauKey(step)], kind: "nearest", tau: Number(st.range.value), shown: step, nearest: target };
      schedule(st);
    }
  }
  const v = Number(st.range.value);
  st.read.textContent = v.toFixed(2);
  const ready = Object.keys(d.frames).length;
  for (const [k, s] of Object.entries(st.tickEls)) s.classList.toggle("ready", k in d.frames);
  const f = cur.f;
  let msg = "";
  const lab = axisOf(d).label;
  if (cur.kind === "grid") msg = `grid value ${lab} = ${tauKey(v)}`;
  else if (cur.kind === "exact") msg = `exact frame for ${lab} = ${tauKey(v)}`;
  else if (cur.kind === "nearest") {
    const waiting = (meta.pending_exact !== null && meta.pending_exact !== undefined && tauKey(meta.pending_exact) === tauKey(v))
      || (st.committed !== undefined && tauKey(st.committed) === tauKey(v));
    msg = `nearest grid value ${tauKey(cur.shown)}` + (waiting ? ", exact frame coming" : st.dragging ? "" : ", exact frame on release");
  } else msg = `<span class="warn">the frame for ${lab} = ${tauKey(cur.nearest)} is still being computed</span>`;
  const more = d.grid.length - ready;
  msg += more > 0 ? ` · ${ready} of ${d.grid.length} grid frames ready, ${more} still coming` : ` · all ${d.grid.length} grid frames ready`;
  if (meta.note) msg += ` · ${meta.note}`;
  st.status.innerHTML = msg;
  if (f) {
    if (cur.kind === "grid") st.lastGrid = cur.tau;
    else if (cur.kind === "nearest") st.lastGrid = cur.shown;
    paintCard(st, st.cards[1], f, v, cur.kind);
    paintMeters(st, f);
    paintHeads(st, 1, f);
    paintMap(st, 1, f);
    paintProfile(st, false, f);
    paintText(st, cur);
    paintCross(st, 1, f);
  }
  st.cards[1].badge.classList.toggle("on", cur.kind === "nearest" || cur.kind === "missing" || !!meta.pending_exact);
  const r = st.root.dataset;
  r.tau = tauKey(v);
  r.kind = cur.kind;
  r.shown = f ? tauKey(val(d, f)) : "";
  r.answer = f ? f.answer : "";
  r.correct = f ? String(f.correct) : "";
  r.accuracy = f && f.masked ? String(f.masked.accuracy) : "";
  r.mlmPerplexity = f && f.masked ? String(f.masked.perplexity) : "";
  r.pmax = f ? String(f.pmax) : "";
  r.entropy = f ? String(f.entropy) : "";
  r.mapSum = f && f.map ? String(f.map.data.reduce((a, b) => a + b, 0)) : "";
  r.ready = `${ready}/${d.grid.length}`;
  r.paints = String((Number(r.paints) || 0) + 1);
  r.paintJsMs = (performance.now() - p0).toFixed(2);
  const t0 = st.t0;
  if (t0 !== undefined) {
    st.t0 = undefined;
    requestAnimationFrame(() => requestAnimationFrame(() => { r.paintMs = (performance.now() - t0).toFixed(2); }));
  }
}

function paintCard(st, card, f, tau, kind) {
  const d = st.doc, meta = d.meta || {}, ref = d.ref, chosen = card === st.cards[1];
  const ax = axisOf(d), on = val(d, f);
  card.title.textContent = chosen ? `${meta.chosen_title || "Chosen"}, ${ax.label} = ${
    kind === "exact" && !f.uniform && ax.name === "tau" ? `${fmt(on, 3)} (mean)` : kind === "grid" || kind === "exact" ? fmt(on, ax.name === "tau" ? 3 : 1) : fmt(tau, 2)}`
    : meta.base_label || "tau = 1 (no alignment)";
  if (f.masked) {  // a masked-LM model: the masked tokens' predictions beside the true tokens
    const m = f.masked, rm = ref.masked;
    card.ans.innerHTML = "";
    card.ans.append(`masked tokens: accuracy ${fmt(100 * m.accuracy, 1)} % (${m.correct} of ${m.masked}) · perplexity `
      + `${fmt(m.perplexity, 2)}` + (rm ? ` · at L_tr ${fmt(100 * rm.accuracy, 1)} %, ${fmt(rm.perplexity, 2)}` : ""));
    const tbl = el("div", "masked", card.ans);
    for (const [pos, truth, pred, p, ok] of m.rows) {
      const r = el("div", "", tbl);
      r.title = `position ${pos}: p(true token) = ${fmt(p, 4)}`;
      el("code", "", r, JSON.stringify(truth));
      r.append(" → ");
      el("code", "", r, JSON.stringify(pred));
      el("span", ok ? "ok" : "bad", r, ok ? " ✓" : ` ✗ p=${fmt(p, 3)}`);
    }
  } else if (f.perplexity !== null && f.perplexity !== undefined) {
    card.ans.innerHTML = "";
    card.ans.append(`perplexity ${fmt(f.perplexity, 1)} · at L_tr ${fmt(ref.perplexity, 1)} · writes `);
    el("code", "", card.ans, f.answer || "(empty)");
  } else {
    card.ans.innerHTML = "";
    card.ans.append("Answer: ");
    el("code", "", card.ans, f.answer || "(empty)");
    card.ans.append(" · expected: ");
    el("code", "", card.ans, d.expected || "–");
    card.ans.append(" · ");
    if (f.correct === true) el("span", "ok", card.ans, "✓ correct");
    else if (f.correct === false) el("span", "bad", card.ans, "✗ wrong");
    else card.ans.append("no expected answer");
  }
  const put = (m, lab, v, rv, dg) => {
    m.lab.textContent = lab;
    m.val.textContent = fmt(v, dg);
    const dl = Number((v - rv).toFixed(dg));
    m.dlt.textContent = dl ? `${dl > 0 ? "+" : ""}${dl.toFixed(dg)} vs L_tr` : "same as L_tr";
  };
  put(card.pm, "mean Pmax", f.pmax, ref.pmax, 4);
  put(card.en, "mean entropy H", f.entropy, ref.entropy, 3);
  // A frame of another value than the chosen one (the nearest grid frame while the exact one or the grid frame is
  // computed) is never shown as if it were the chosen one: faded, and said in the card's first line (issue 59
  // point 7: after a method change the card showed tau = 1's wrong answer under the new method's title for ~3 s).
  // Not during a drag, whose in-between frames are the point of the scrubber.
  const approx = chosen && !st.dragging && (kind === "nearest" || kind === "missing");
  card.c.classList.toggle("approx", approx);
  card.c.dataset.approx = approx ? "1" : "";
  if (card.note) card.note.textContent = approx ? `Not the answer at ${ax.label} = ${fmt(tau, 2)} yet: the grid frame `
    + `${ax.label} = ${fmt(on, 2)} is shown, faded, ` + (kind === "missing" ? "while this grid frame is computed." : "until the exact frame arrives.") : "";
  card.foot.textContent = chosen && kind === "nearest" ? `showing the grid frame ${ax.label} = ${fmt(on, 2)}`
    : chosen && kind === "missing" ? "this grid frame is still being computed"
    : `${d.tokens.toLocaleString("en")} tokens` + (f.seconds ? ` · computed in ${fmt(f.seconds, 2)} s` : "");
}

function paintMeters(st, f) {
  for (const m of st.meters) {
    const vals = f[`layer_${m.kind}`];
    vals.forEach((v, l) => {
      const b = m.bars[l], yv = m.y(v), yb = m.y(0);
      b.setAttribute("y", Math.min(yv, yb));
      b.setAttribute("height", Math.abs(yb - yv));
      const rel = Math.abs(v - m.refs[l]) / Math.max(1e-9, Math.abs(m.refs[l]));
      b.setAttribute("fill", rel <= 0.1 ? "#2ca02c" : rel <= 0.3 ? "#ff9f1c" : "#d62728");
    });
  }
}

function paintHeads(st, i, f) {
  const d = st.doc, { cv, t } = st.heads[i], ctx = cv.getContext("2d");
  const ref = d.ref.head_pmax;
  for (let l = 0; l < d.layers; l++) for (let h = 0; h < d.heads; h++) {
    const r = Math.log2(Math.max(1e-6, f.head_pmax[l][h]) / Math.max(1e-6, ref[l][h]));
    const a = Math.min(1, Math.abs(r) / 2);
    ctx.fillStyle = r < 0 ? `rgba(214,39,40,${a})` : `rgba(31,119,180,${a})`;
    ctx.clearRect(h * 24, l * 24, 24, 24);
    ctx.fillRect(h * 24, l * 24, 24, 24);
  }
  t.textContent = i ? `chosen ${axisOf(d).label} = ${fmt(val(d, f), 2)}` : "tau = 1";
}

function drawCodes(cv, arr, table, rowsPx) {
  const [rows, cols] = arr.shape;
  const img = new ImageData(cols, rows);
  const px = img.data, src = arr.data;
  for (let k = 0; k < src.length; k++) {
    const o = src[k] * 4;
    px[4 * k] = table[o]; px[4 * k + 1] = table[o + 1]; px[4 * k + 2] = table[o + 2]; px[4 * k + 3] = 255;
  }
  const off = cv._off || (cv._off = document.createElement("canvas"));
  off.width = cols; off.height = rows;
  off.getContext("2d").putImageData(img, 0, 0);
  const ctx = cv.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(off, 0, 0, cv.width, rowsPx || cv.height);
}

// The position scheme's mask over the chosen map: each cell veiled in grey by the share of its pairs masked out.
function shade(cv, mask) {
  const [rows, cols] = mask.shape;
  const img = new ImageData(cols, rows);
  const px = img.data, src = mask.data;
  for (let k = 0; k < src.length; k++) {
    px[4 * k] = 235; px[4 * k + 1] = 235; px[4 * k + 2] = 235; px[4 * k + 3] = Math.round(src[k] * 0.6);
  }
  const off = cv._mask || (cv._mask = document.createElement("canvas"));
  off.width = cols; off.height = rows;
  off.getContext("2d").putImageData(img, 0, 0);
  const ctx = cv.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(off, 0, 0, cv.width, cv.height);
}

function binOf(edges, tok) {
  let lo = 0, hi = edges.length - 2;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (edges[mid] <= tok) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Dotted lines around a span of tokens (the needle, the question): columns (keys) or rows (queries).
function mark(cv, d, span, colour, bins, rows = false) {
  if (!span || !d.edges) return;
  const ctx = cv.getContext("2d"), step = (rows ? cv.height : cv.width) / bins;
  ctx.save();
  ctx.setLineDash([3, 3]);
  ctx.strokeStyle = colour;
  ctx.lineWidth = 1.5;
  for (const tok of [span[0], span[1] - 1]) {
    const p = (binOf(d.edges, tok) + (tok === span[0] ? 0 : 1)) * step;
    ctx.beginPath();
    if (rows) { ctx.moveTo(0, p); ctx.lineTo(cv.width, p); } else { ctx.moveTo(p, 0); ctx.lineTo(p, cv.height); }
    ctx.stroke();
  }
  ctx.restore();
}

function tables(st, a, b) {
  const d = st.doc, log = !!(d.meta || {}).log;
  const lo = st._low !== undefined ? st._low : (st._low = lowCode(d.base.map));
  const key = `${log}:${maxCode(a, b)}:${lo}`;
  if (!st._lut || st._lutKey !== key) {
    st._lutKey = key;
    st._lut = lut(d.scale, log, maxCode(a, b), lo);
  }
  return st._lut;
}

function paintMap(st, i, f) {
  if (!st.maps || !f.map) return;
  const d = st.doc, m = st.maps[i];
  // Linear colour: one scale for the pair, tau = 1 and the frame shown (the brightest cell of either).
  const table = tables(st, d.base.map, f.map);
  if (i === 1 && st._baseLutKey !== st._lutKey) { st._baseLutKey = st._lutKey; paintMap(st, 0, d.base); }
  drawCodes(m.cv, f.map, table);
  if (d.causal) shade(m.cv, d.causal);  // a causal model: the keys no row sees
  if (i === 1 && d.mask) shade(m.cv, d.mask);
  const bins = f.map.shape[1];
  for (const [span, colour] of [[d.needle, "#ff2b2b"], [d.question, "#3b7dff"]]) {
    mark(m.cv, d, span, colour, bins);
    mark(m.cv, d, span, colour, bins, true);
  }
  m.t.textContent = i ? `chosen ${axisOf(d).label} = ${fmt(val(d, f), 2)}` : (d.meta || {}).base_label || "tau = 1";
  if (f.qrows) {
    drawCodes(m.q, f.qrows, table);
    mark(m.q, d, d.needle, "#ff2b2b", bins);
  }
  if (st.mapLegend) {
    st.mapLegend.textContent = (d.meta || {}).log
      ? `log colour: dark ≤ ${decode(d.scale, st._low || 1).toExponential(1)} … yellow = ${decode(d.scale, maxCode(d.base.map, f.map)).toPrecision(2)} (the brightest cell of the two maps); uniform attention is ${(1 / d.tokens).toExponential(1)}`
      : `linear colour: dark = 0 … yellow = ${decode(d.scale, maxCode(d.base.map, f.map)).toPrecision(2)} (the brightest cell of the two maps)`;
  }
}

function profilePath(st, arr, l, y) {
  const d = st.doc, xs = d.profile_x, n = d.tokens, P = arr.shape[1];
  let p = "";
  for (let k = 0; k < P; k++) {
    const x = 50 + ((xs[k] + 0.5) / n) * 740;
    p += `${k ? "L" : "M"}${x.toFixed(1)},${y(arr.data[l * P + k]).toFixed(1)}`;
  }
  return p;
}

function paintProfile(st, rebuild, f) {
  if (!st.profileSvg) return;
  const d = st.doc;
  f = f || (currentFrame(st).f);
  if (!f) return;
  const s = st.profileSvg, L = d.layers, H = 220, y0 = 10;
  // One y axis for the document: the largest value any computed frame reaches, so scrubbing shows peaks grow.
  if (rebuild || !st.profileAxis || st.profileAxis.log !== !!st.profileLog || st.profileAxis.frames !== Object.keys(d.frames).length) {
    let top = 1e-9, bottom = 1;
    const frames = [d.base, ...Object.values(d.frames)];
    if (d.exact) frames.push(d.exact);
    for (const fr of frames) for (const v of fr.profile.data) { if (v > top) top = v; if (v > 0 && v < bottom) bottom = v; }
    const log = !!st.profileLog;
    const lo = log ? Math.log10(Math.max(bottom, top * 1e-6)) : 0, hi = log ? Math.log10(top) : top * 1.05;
    const y = (v) => y0 + H - ((log ? Math.log10(Math.max(v, 10 ** lo)) : v) - lo) / (hi - lo) * H;
    s.textContent = "";
    if (d.needle) {
      const xa = 50 + (d.needle[0] / d.tokens) * 740, xb = 50 + (d.needle[1] / d.tokens) * 740;
      svg("rect", { x: xa - 1, y: y0, width: Math.max(2, xb - xa + 2), height: H, fill: "rgba(214,39,40,0.18)" }, s);
    }
    svg("line", { x1: 50, y1: y0 + H, x2: 790, y2: y0 + H, stroke: "#999" }, s);
    for (let k = 0; k <= 4; k++) {
      const v = log ? 10 ** (lo + ((hi - lo) * k) / 4) : (hi * k) / 4;
      svg("text", { x: 46, y: y(v) + 4, "text-anchor": "end" }, s).textContent = v.toPrecision(2);
    }
    svg("text", { x: 420, y: 250, "text-anchor": "middle" }, s).textContent = "document position (token)";
    st.baseLines = [];
    st.lines = [];
    for (let l = 0; l < L; l++) {
      st.baseLines.push(svg("path", { d: profilePath(st, d.base.profile, l, y), fill: "none", stroke: "#bbb", "stroke-width": 1 }, s));
    }
    for (let l = 0; l < L; l++) {
      st.lines.push(svg("path", { fill: "none", stroke: LAYER_COLOURS[l % LAYER_COLOURS.length], "stroke-width": 1.4 }, s));
    }
    st.profileAxis = { log, frames: Object.keys(d.frames).length, y };
  }
  for (let l = 0; l < L; l++) {
    const on = st.profileOn[l];
    st.baseLines[l].style.display = on ? "" : "none";
    st.lines[l].style.display = on ? "" : "none";
    if (on) st.lines[l].setAttribute("d", profilePath(st, f.profile, l, st.profileAxis.y));
  }
}

function paintText(st, cur) {
  if (!st.spans || !cur || !cur.f || !cur.f.text_weights) return;
  const w = cur.f.text_weights, L = w.shape[0], n = w.shape[1];
  const vals = new Float32Array(n);
  for (let k = 0; k < n; k++) {
    if (st.textLayer && st.textLayer !== "mean") vals[k] = w.data[Number(st.textLayer) * n + k];
    else { let s = 0; for (let l = 0; l < L; l++) s += w.data[l * n + k]; vals[k] = s / L; }
  }
  let top = 1e-12;
  for (let k = 0; k < n; k++) if (st.spans[k].textContent && vals[k] > top) top = vals[k];
  for (let k = 0; k < n; k++) {
    st.spans[k].style.background = `rgba(255, 80, 0, ${Math.min(1, vals[k] / top).toFixed(3)})`;
    st.spans[k].title = `token ${st.doc.text.first + k}: ${vals[k].toPrecision(3)}`;
  }
}

function paintCross(st, i, f) {
  if (!st.cross || !f.cross) return;
  const d = st.doc, c = st.cross[i];
  const rows = f.cross.shape[0];
  c.cv.width = 512; c.cv.height = Math.max(1, rows * 18);
  const table = lut(d.scale, !!(d.meta || {}).log, maxCode(d.base.cross, f.cross), lowCode(d.base.cross));
  drawCodes(c.cv, f.cross, table);
  mark(c.cv, d, d.needle, "#ff2b2b", f.cross.shape[1]);
  const ctx = c.cv.getContext("2d");
  ctx.font = "11px sans-serif"; ctx.fillStyle = "#fff";
  (f.cross_tokens || []).forEach((t, r) => ctx.fillText(t, 4, r * 18 + 13));
  const share = f.needle_share === null || f.needle_share === undefined ? "" : `: ${(100 * f.needle_share).toFixed(0)} % of it on the needle`;
  c.t.textContent = (i ? `chosen ${axisOf(d).label} = ${fmt(val(d, f), 2)}` : "tau = 1") + share;
}

// Ask the server for the whole payload ("full"), again every few seconds until one arrives: the request itself is
// a rerun that a newer run can swallow, and a browser left with a gap would wait forever for frames the server
// believes it sent. Cleared by the next payload that leaves no gap.
function heal(st, lacking, every) {
  if (!lacking) {
    clearInterval(st.healTimer);
    st.healTimer = 0;
    return () => {};
  }
  st.setTriggerValue("poll", "full");
  if (!st.healTimer) st.healTimer = setInterval(() => st.setTriggerValue("poll", "full"), Math.max(2000, every || 0));
  return () => { clearInterval(st.healTimer); st.healTimer = 0; };
}

function commit(st, delay = 200) {
  clearTimeout(st.commitTimer);
  st.commitTimer = setTimeout(() => {
    const v = Number(Number(st.range.value).toFixed(2));
    if (v === st.committed) return;
    st.committed = v;
    st.root.dataset.releases = String((Number(st.root.dataset.releases) || 0) + 1);
    st.setStateValue("value", v);
    paint(st);  // "exact frame coming"
  }, delay);
}

// -- entry ---------------------------------------------------------------------------------

export default function (component) {
  const { data, parentElement, setStateValue, setTriggerValue } = component;
  let root = parentElement.querySelector(".aae");
  if (!root) root = el("div", "aae", parentElement);
  let st = STATE.get(root);
  if (!st) { st = { root }; STATE.set(root, st); }
  Object.assign(st, { setStateValue, setTriggerValue });
  if (!data) return;
  const h0 = performance.now();
  try {
    return receive(st, root, data);
  } finally {
    const r = root.dataset;
    r.payloads = String((Number(r.payloads) || 0) + 1);
    r.payloadMs = (performance.now() - h0).toFixed(2);
    r.payloadBytes = String(data.byteLength !== undefined ? data.byteLength : data.length || 0);
  }
}

// One payload from the server: merge it into what the browser holds and draw what it changes.
function receive(st, root, data) {
  let doc;
  try {
    doc = unpack(data);
  } catch (err) {
    root.textContent = `The views could not be drawn: ${err.message}`;
    return;
  }
  const meta = doc.meta || {};
  const same = st.doc && st.doc.meta && st.doc.meta.doc_id === meta.doc_id;
  // A payload that brings nothing to draw (a release's echo onto a frame the browser holds, a poll with no new
  // frame): no repaint. Each such payload repainted the tau = 1 column (its map twice) and rebuilt the profile's
  // svg, on the browser's main thread, while the next clicker press waited for it (issue 59 point 11).
  const lastMeta = same ? st.doc.meta : null;
  const idle = same && doc.delta && !doc.exact && !Object.keys(doc.frames).length && lastMeta
    && meta.tau_version === st.tauVersion && meta.pending_exact === lastMeta.pending_exact
    && meta.note === lastMeta.note && !!meta.disabled === !!lastMeta.disabled && meta.chosen_title === lastMeta.chosen_title
    && !(doc.held || []).some((k) => !(k in st.doc.frames));
  const redraw = !doc.delta || !!doc.exact;  // a full payload of the same document (a remount, a heal), an exact frame
  if (idle) {
    st.doc.meta = meta;
    heal(st, false);
    if (!meta.poll_ms && st.pollTimer) { clearInterval(st.pollTimer); st.pollTimer = 0; }
    if (!meta.poll_ms) paint(st);  // the status line says the grid is complete
    return () => {
      clearInterval(st.pollTimer); st.pollTimer = 0; clearTimeout(st.commitTimer); clearInterval(st.healTimer); st.healTimer = 0;
    };
  }
  if (doc.delta) {
    // Only what is new since the last payload (a poll while the grid fills, a release): merge it in. A delta for
    // a document this element does not hold (it was mounted anew) asks the server for everything.
    if (!same) return heal(st, true, meta.poll_ms);
    Object.assign(st.doc.frames, doc.frames);
    if (doc.exact) st.doc.exact = doc.exact;
    st.doc.meta = meta;
    // A payload can be lost on its way (Streamlit drops the queued messages of a run when a new run starts), and
    // the server cannot know: every delta lists the frames the browser must hold by now, and a gap asks for all.
    const lacking = (doc.held || []).some((k) => !(k in st.doc.frames));
    doc = st.doc;
    heal(st, lacking, meta.poll_ms);
  } else heal(st, false);
  st.doc = doc;
  if (!same) {
    st.profileAxis = null; st._lut = null; st._baseLutKey = null; st.lastGrid = undefined; st._low = undefined;
    build(root, st);
  } else if (redraw) {
    st.profileAxis = null;  // (new grid frames rebuild the profile's axis by their count, paintProfile)
    st._baseLutKey = null;
  }
  // The server's tau wins when it changed there (a method, the tour, a link); a drag under way keeps its place.
  if (!same || meta.tau_version !== st.tauVersion) {
    st.tauVersion = meta.tau_version;
    const at = meta.value !== undefined ? meta.value : meta.tau;
    if (!st.dragging) st.range.value = Number(at).toFixed(2);
    st.committed = Number(Number(at).toFixed(2));
  }
  st.range.disabled = !!meta.disabled;
  st.range.title = meta.disabled ? "The method chooses tau; pick 'fixed' to move it by hand." : "";
  if (!same || redraw) {  // the tau = 1 column never changes within a document (its map follows the colour scale)
    paintCard(st, st.cards[0], doc.base, 1, "grid");
    paintHeads(st, 0, doc.base);
    if (st.maps) paintMap(st, 0, doc.base);
    if (st.cross) paintCross(st, 0, doc.base);
  }
  paint(st);
  // Frames still coming: ask the server again every poll_ms (one light rerun of the fragment each) until a
  // payload says nothing is pending. An interval, not a timeout: a poll that finds nothing new sends the same
  // data, and Streamlit does not call this function again for unchanged data.
  if (meta.poll_ms && !st.pollTimer) {
    st.pollTimer = setInterval(() => st.setTriggerValue("poll", Date.now()), meta.poll_ms);
  } else if (!meta.poll_ms && st.pollTimer) {
    clearInterval(st.pollTimer);
    st.pollTimer = 0;
  }
  return () => {
    clearInterval(st.pollTimer); st.pollTimer = 0; clearTimeout(st.commitTimer); clearInterval(st.healTimer); st.healTimer = 0;
  };
}
