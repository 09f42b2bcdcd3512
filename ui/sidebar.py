"""The shared sidebar: model, document, temperature. Every page calls :func:`sidebar` itself.

Every page runs through ``app.py`` (``st.navigation``; the pages live in
``app_pages/``, not ``pages/``, so Streamlit's legacy multipage mode never
runs a page file alone); a page draws the sidebar because the temperature
controls are drawn where the page wants them (Explore: in its live panel, a
fragment; the other pages: in the sidebar), and a page file still works run
alone (``AppTest.from_file`` on a page).

State: every choice is a widget with a fixed key (its default in
:data:`ui.choices.DEFAULTS`, set before the widget is drawn; no
``value=``/``index=``) drawn with ``persist_state=choices.KEEP``
("session"), so Streamlit keeps its value across page changes, also when
the last change was made in a fragment rerun, and while it is hidden (the
pasted text while the source is "Generate"). :func:`init_state` also
re-assigns every choice's key to itself at the start of each full run
(Streamlit's documented recipe): a widget drawn on both pages has another id
on each, and in the run of a page change the new page's widget registers
before Streamlit restores the persisted value, so without it the run would
use the widget's default (the length at 16, the targets off; the recipe alone
loses a change made in a fragment rerun just before the page change, checked
in a browser on Streamlit 1.67). Callbacks, links and the code
set a choice by writing its key before its widget is drawn
(:func:`ui.choices.set_state`, :func:`ui.choices.put`).

One value is not a widget's: the person's own tau (:data:`_OWN_TAU`), because
the tau slider shows the resolved tau while the method is not "fixed".
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import streamlit as st

from core.runs import engine, methods, temperature, timing
from core.experiments import mlm
from core.values import positions
from core.data import tasks
from core.values.choice import Choice
from core.mechanics.attention import CROSS, DECODER, ENCODER
from core.errors import UserError
from core.models import Loaded
from core.runs.settings import DocumentRequest, Settings
from core.values.schedule import ONE, Schedule
from ui import cache, choices, fail, long_work, message, url

OTHER_HINT = "…or a hub id / local folder (overrides the list)"
MULTIPLES = (1, 2, 4, 8, 16)
_OWN_TAU = "_aae_own_tau"  # the person's own tau (the slider shows the resolved one while the method is not fixed)
_SHOWN = "_aae_tau_shown"  # the resolved tau last written into the disabled slider (not the person's own tau)
#: Adaptive temperature's tau in words, after "tau = " (the sidebar, the scrubber's note): a tau per query row set
#: inside each pass from the row itself, so no number (its base 1, what a slider shows, is not its tau).
ADAPTIVE_TEXT = "adaptive: 1 / beta(H) per query row, H its own entropy at tau = 1"


# -- state --------------------------------------------------------------------------

def init_state() -> list[str]:
    """Take a newly opened URL's view (:mod:`ui.url`) and set missing defaults, before any widget is drawn.

    Returns the URL parameters that could not be used (one message each).
    """
    ss = st.session_state
    for k in choices.DEFAULTS:  # see the module docstring: a widget that moved to another page takes this value
        if k in ss:
            ss[k] = ss[k]
    problems = url.apply()
    for k, v in choices.DEFAULTS.items():
        if v is not None and k not in ss:
            ss[k] = v
    if ss.get("model_choice") not in choices.model_options():
        ss["model_choice"] = choices.default_model_ref()
    return problems


def own_tau() -> float:
    """The person's own tau: ``tau_value`` unless it holds the resolved tau this module drew in the disabled slider.

    A new value there (the slider, a link, the scrubber's release, a callback) is the person's and is kept.
    """
    ss = st.session_state
    v = ss.get("tau_value")
    if v is not None and (ss.get(_SHOWN) is None or v != ss[_SHOWN]):
        ss[_OWN_TAU], ss[_SHOWN] = float(v), None
    return float(ss.get(_OWN_TAU, 1.0))


def _set_tokens(n: int) -> None:
    choices.put("doc_tokens", int(n))


def _read_upload() -> None:
    f = st.session_state.get("doc_file")
    if f is None:
        return
    try:
        choices.put("doc_text", f.getvalue().decode("utf-8"))
    except UnicodeDecodeError:
        st.session_state["upload_error"] = f"'{f.name}' is not UTF-8 text; save it as UTF-8 (.txt) and upload again."


# -- context ------------------------------------------------------------------------

@dataclass(frozen=True)
class Temperature:
    """The temperature the controls chose, resolved for the document: the :class:`~core.values.choice.Choice` (method,
    the schedule it resolved to, targets, CosScale, position scheme), the person's own slider tau, and what the
    resolution said (``info``), and the method's own number when the person set one (``params``: ``{"gamma": 0.2}``,
    empty for the default from L_tr; it went into the resolve and so into ``choice.tau``, as the CLI's --gamma does)."""

    choice: Choice
    tau_input: float
    info: dict
    params: dict = field(default_factory=dict)


@dataclass
class Context:
    """What the sidebar chose, resolved: every page works from this.

    ``choice`` is the one value a pass carries to the attention (:class:`core.values.choice.Choice`); ``method``,
    ``schedule``, ``targets``, ``cosine_scale`` and ``scheme`` read its parts. ``tau_input`` is the person's own
    slider tau (kept while another method shows its resolved one), ``tau_info`` what the resolution said,
    ``params`` the method's own number the person set (critical scaling's gamma; empty: its default from L_tr)."""

    loaded: Loaded
    model_ref: str
    request: DocumentRequest
    document: tasks.Document
    tokens: int
    choice: Choice
    tau_input: float
    tau_info: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)

    method = property(lambda self: self.choice.method)
    schedule = property(lambda self: self.choice.tau)
    targets = property(lambda self: self.choice.targets)
    cosine_scale = property(lambda self: self.choice.cosine_scale)
    scheme = property(lambda self: self.choice.scheme)

    @property
    def train_length(self) -> int:
        return self.loaded.train_length

    @property
    def ratio(self) -> float:
        return self.tokens / self.train_length

    @property
    def tau_mean(self) -> float:
        return self.schedule.mean(self.tokens)

    def tau_text(self, schedule: Any = None) -> str:
        """The schedule after "tau = ": '0.812', 'per row (mean 0.912)', 'per layer 0.90, 0.80 (mean 0.850)', or
        adaptive temperature's :data:`ADAPTIVE_TEXT` (its base 1 is not its tau)."""
        s = Schedule.of(self.schedule if schedule is None else schedule)
        if s.adaptive:
            return ADAPTIVE_TEXT
        if s.rows is not None:
            return f"per row (mean {s.mean(self.tokens):.3f})"
        a = np.asarray(s)
        if a.ndim == 0:
            return f"{float(a):.3f}"
        return "per layer " + ", ".join(f"{v:.2f}" for v in a.reshape(len(a), -1).mean(1)) + f" (mean {a.mean():.3f})"

    def with_temperature(self, t: Temperature) -> "Context":
        return replace(self, choice=t.choice, tau_input=t.tau_input, tau_info=t.info, params=t.params)

    def run_settings(self, tau: Any = None, method: str | None = None, **kw) -> engine.RunSettings:
        """What a pass needs: the context's :class:`~core.values.choice.Choice` as it is (or with ``tau`` / ``method``
        changed); ``kw``: other :class:`core.runs.engine.RunSettings` fields (None leaves a field as the context has it)."""
        parts = {k: v for k, v in dict(tau=tau, method=method).items() if v is not None}
        return engine.RunSettings(self.choice, **parts, **{k: v for k, v in kw.items() if v is not None})

    def settings(self, method: str | None = None, tau: Any = None, criterion: str = "pmax") -> Settings:
        """The exportable JSON settings (the CLI's ``--settings``); the resolved schedule as a fixed one by default
        (the model as trained and adaptive temperature stay themselves). A file says what runs: a schedule no fixed
        tau can hold (adaptive temperature's) is exported as its method whatever ``method`` asks
        (:func:`core.runs.methods.exported`)."""
        if method is None:
            method = self.method if methods.get(self.method).constant is not None else methods.FIXED
        sched = self.schedule if tau is None else tau
        method = methods.exported(method, sched)
        return Settings(
            model=self.model_ref, train_length=self.train_length, method=method,
            tau=None if methods.get(method).constant is not None else Schedule.of(sched), criterion=criterion,
            targets=self.targets, cosine_scale=self.cosine_scale, chosen_at=self.tokens, document=self.request,
            scheme=self.scheme.name, scheme_params=self.scheme.param_dict,
            method_params=methods.own_params(method, self.params) or {},  # the gamma the person set, for its method
        )


def cli_command(file_name: str = "choice.json") -> str:
    return f"python -m core run --settings {file_name} --json"


def mlm_command(ctx: Context) -> str:
    """The command that scores this view's masked tokens for a rotary masked-LM model: ``python -m core mlm`` on
    this document (its length and seed: the same held-out text and masked positions) under the chosen position
    scheme and method (a fixed tau as ``tau=0.8``; a per-layer or per-head schedule is resolved again there)."""
    fixed = methods.get(ctx.method).takes_value
    method = methods.spell(ctx.method, ctx.tau_input) if fixed else ctx.method
    parts = ["python -m core mlm", "--model", shlex.quote(ctx.model_ref), "--lengths", str(ctx.tokens),
             "--seed", str(ctx.request.seed), "--sequences", "1", "--schemes", shlex.quote(ctx.scheme.spell()),
             "--methods", shlex.quote(method)]
    if ctx.loaded.cosine and ctx.cosine_scale is not None:
        parts += ["--cosine-scale", f"{float(ctx.cosine_scale):g}"]
    return " ".join(parts + ["--json"])


# -- drawing ------------------------------------------------------------------------

def _model_section() -> Loaded:
    sb = st.sidebar
    sb.subheader("Model")
    labels = choices.model_labels()
    sb.selectbox("Model", choices.model_options(), key="model_choice", persist_state=choices.KEEP, format_func=lambda r: labels.get(r, r),
                 help="Bundled models first (T5 retrieval and language models, and rotary masked-LM encoders: 'RoPE'), "
                      "then T5 models from the Hugging Face hub (need internet or a local copy).")
    sb.text_input(OTHER_HINT, key="model_other", persist_state=choices.KEEP, placeholder="google/flan-t5-base or ./my-t5-folder")
    ref = chosen_model_ref()
    st.session_state["_model_ref"] = ref
    try:
        loaded = cache.model(ref)
    except UserError as err:
        fail(err)
    d = loaded.describe()
    sb.caption(
        f"**{d['name']}** · L_tr = **{d['train_length']:,}** tokens · {d['parameters'] / 1e6:.2f} M parameters · "
        f"{d['layers']} layers × {d['heads']} heads (d_kv {d['d_kv']}) · {d['device']} / {d['dtype']} · "
        f"attention: {d['attention']} · "
        + ("T5: learned relative bias, encoder-decoder" if loaded.seq2seq else
           "RoPE: rotary positions, masked-LM encoder (fills masked tokens; no decoder)")
    )
    return loaded


#: What a masked-LM model's document is (the sidebar says it in place of the Source and Task boxes).
MASKED_DOC = ("**Masked tokens in held-out prose**: the held-out text of the seed at the chosen length, "
              f"{round(100 * mlm.MASK_RATE)} % of its tokens replaced by the mask token (positions drawn by the seed); "
              "the model fills them in.")


#: Paste mode before anything is typed: what to do (not an error), and what a shared link carries.
PASTE_FIRST = ("**Paste mode.** Paste a text into the sidebar's *Your text* box (or upload a .txt file); its views "
               "appear here. A pass key sentence is inserted at the chosen depth unless you choose another needle.")
PASTE_NOT_IN_LINK = ("A shared link does not carry the pasted text (too long for an address): it opens in Generate "
                     "mode. Send the text along, or export the settings.")


def reads_prose(loaded: Loaded) -> bool:
    """Whether the model's document is held-out prose (task ``lm``): a T5 language model, or a masked-LM encoder."""
    return loaded.language_model or not loaded.seq2seq


def _document_section(loaded: Loaded) -> tuple[DocumentRequest, tasks.Document, int]:
    ss, sb = st.session_state, st.sidebar
    lt = loaded.train_length
    if ss.get("_ltr") != (ss["_model_ref"], lt) or ss.get("doc_tokens") is None:
        first = ss.get("_ltr") is None
        if not first or ss.get("doc_tokens") is None:
            choices.put("doc_tokens", lt)  # a new model: start at its training length
        # ... and with its kind of document, unless the page was opened from a link that names a task
        if not (first and "task" in st.query_params) and (reads_prose(loaded) or ss.get("doc_task") == tasks.LM):
            choices.put("doc_task", tasks.LM if reads_prose(loaded) else "passkey")
        ss["_ltr"] = (ss["_model_ref"], lt)
    if ss.get("_url_multiple"):
        choices.put("doc_tokens", int(ss.pop("_url_multiple")) * lt)
    sb.subheader("Document")
    if not loaded.seq2seq:  # a masked-LM encoder: held-out prose with masked tokens, nothing else to choose
        choices.put("doc_mode", "Generate")
        choices.put("doc_task", tasks.LM)
        sb.caption(MASKED_DOC)
    else:
        sb.radio("Source", ("Generate", "Paste"), key="doc_mode", persist_state=choices.KEEP, horizontal=True)
    if ss["doc_mode"] == "Generate":
        if ss.get("doc_task") not in tasks.GENERATED:
            choices.put("doc_task", tasks.LM if reads_prose(loaded) else "passkey")
        if loaded.seq2seq:
            sb.selectbox("Task", tasks.GENERATED, key="doc_task", persist_state=choices.KEEP,
                         help="passkey: a 5-digit key in filler; line/topic: LongChat retrieval; multidoc: QA over "
                              "documents; code: a key in Python; lm: continue held-out prose (perplexity, for LM models).")
        sb.number_input("Length in tokens", min_value=16, max_value=4_000_000, step=max(1, lt // 4), key="doc_tokens", persist_state=choices.KEEP)
        row = sb.container(horizontal=True, gap="small")
        for k in MULTIPLES:
            row.button(f"{k}×", key=f"len_{k}x", on_click=_set_tokens, args=(k * lt,), help=f"{k} × L_tr = {k * lt:,} tokens")
        if ss["doc_task"] != tasks.LM:  # an LM sequence has no needle
            sb.slider("Needle depth (%)", 0, 100, step=5, key="doc_depth", persist_state=choices.KEEP)
        haystack = "default"
        if ss["doc_task"] in tasks.HAYSTACK_TASKS:
            sb.selectbox("Filler", choices.HAYSTACK_CHOICES, key="doc_haystack", persist_state=choices.KEEP,
                         format_func=choices.HAYSTACK_CHOICES.get,
                         help="The paper's pass key filler is one fixed text: its documents differ only in the key. "
                              "Held-out corpus prose makes every seed a different haystack.")
            haystack = ss["doc_haystack"]
        sb.number_input("Seed", min_value=0, max_value=10**9, step=1, key="doc_seed", persist_state=choices.KEEP)
        req = DocumentRequest(task=ss["doc_task"], tokens=int(ss["doc_tokens"]), depth=ss["doc_depth"] / 100,
                              seed=int(ss["doc_seed"]), haystack=haystack)
    else:
        sb.text_area("Your text", key="doc_text", persist_state=choices.KEEP, height=150, placeholder="Paste the text to search in…")
        sb.file_uploader("…or upload a .txt file", type=["txt"], key="doc_file", on_change=_read_upload)
        sb.caption(PASTE_NOT_IN_LINK)
        if ss.get("upload_error"):
            st.error(ss.pop("upload_error"))
        if not (ss.get("doc_text") or "").strip():  # nothing typed yet: say what to do, not an error (issue 50)
            st.info(PASTE_FIRST)
            st.stop()
        sb.radio("Needle", choices.NEEDLE_MODES, key="doc_needle_mode", persist_state=choices.KEEP)
        mode = ss["doc_needle_mode"]
        needle = question = expected = None
        if mode == choices.NEEDLE_MODES[1]:
            sb.text_input("Needle sentence", key="doc_needle", persist_state=choices.KEEP, placeholder="The secret colour is teal.")
        if mode != choices.NEEDLE_MODES[0]:
            sb.text_input("Question", key="doc_question", persist_state=choices.KEEP, placeholder="What is the secret colour?")
            sb.text_input("Expected answer", key="doc_expected", persist_state=choices.KEEP, placeholder="teal")
            question, expected = ss["doc_question"] or None, ss["doc_expected"] or None
            needle = ss["doc_needle"] if mode == choices.NEEDLE_MODES[1] else ""
            if mode == choices.NEEDLE_MODES[1] and not (needle or "").strip():
                fail(UserError("Type the needle sentence to insert (or choose 'pass key sentence')."))
        if mode != choices.NEEDLE_MODES[2]:
            sb.slider("Needle depth (%)", 0, 100, step=5, key="doc_depth", persist_state=choices.KEEP)
        sb.number_input("Seed", min_value=0, max_value=10**9, step=1, key="doc_seed", persist_state=choices.KEEP)
        req = DocumentRequest(task="text", depth=ss["doc_depth"] / 100, seed=int(ss["doc_seed"]), text=ss["doc_text"],
                              needle=needle, question=question, expected=expected)
    try:
        doc = cache.document(loaded, req)
        n = cache.token_count(loaded, req)
    except UserError as err:
        fail(err)
    cap = engine.max_tokens(loaded)
    sb.caption(f"**{n:,} tokens** = **{n / lt:.2f}× L_tr** · this machine can run about {cap:,} tokens now")
    return req, doc, n


def not_reached_note(info: dict, shown: str) -> str:
    """Algorithm 1 ended where its range did, not on the L_tr reference: what that means, in words.

    ``info["gap"]`` is S_ex(tau) - S_tr(1) at the pick; its sign only says on which side the curve stays.
    """
    gap = float(info.get("gap") or 0.0)
    side = "below" if gap < 0 else "above"
    taus = [float(t) for t in info.get("grid") or []] + [float(p[0]) for p in info.get("refined") or []]
    pick = info.get("tau")
    pick = float(pick) if isinstance(pick, (int, float)) else None
    if pick is not None and taus and pick >= max(taus) - 1e-9:
        first = (f"The curve is already {abs(gap):.4f} {side} the L_tr reference at tau = {pick:.2f}, the top of the "
                 "range searched")
    else:
        end = min(taus) if taus else pick
        span = "over the range searched" if end is None else f"down to tau = {end:.2f}, the end of the range searched"
        first = f"The curve stays {abs(gap):.4f} {side} the L_tr reference {span}"
    n = len(info.get("unreached_heads") or ())
    heads = f" ({n} heads never reached it and keep tau = 1)" if n != 1 else " (1 head never reached it and keeps tau = 1)"
    return (f"{first}: tau = {shown} is where the search stopped, not a match" + (heads if n else "")
            + ". A closed form (log-length or YaRN) is the better bet for this document.")


_SCHEME_FOR = "_pos_for"  # (model, L_tr, scheme) whose defaults the parameter inputs hold
_SCHEME_CHOSEN, _SCHEME_CTX, _SCHEME_RERUN = "_pos_chosen", "_pos_ctx", "_pos_rerun"  # (model, name, params)
#: What an empty factor means, per parameter that may be left empty.
_EMPTY = {"factor": "empty: fitted to the input, s = L / L_tr", "attention_factor": "empty: YaRN's 0.1 ln s + 1"}
#: The smallest value each parameter takes (core.values.positions.Bound checks the same).
_MIN = {"window": 0, "sinks": 0, "cap": 1, "factor": 1.0, "attention_factor": 0.0}


def _scheme_label(name: str) -> str:
    entry = positions.get(name)
    return entry.label if entry.available else f"{entry.label} (not available)"


def scheme_help() -> str:
    """The scheme box's help: every scheme with what it does, the unavailable ones with why."""
    lines = [f"**{s.label}**: {s.help}" for s in positions.REGISTRY.values() if s.available]
    lines += [f"**{s.label}** (not available): {s.reason}" for s in positions.REGISTRY.values() if not s.available]
    return ("How positions past L_tr are handled: the second axis beside the temperature (docs/positions.md). Every "
            "pass of this page runs under it; the left column stays the model as trained.\n\n" + "\n\n".join(lines))


def scheme_controls(where, loaded: Loaded) -> positions.Scheme:
    """The position-scheme box and its parameters (a rotary model only; a T5 model has no scheme: plain).

    The box lists the schemes a pass can apply (:data:`core.values.positions.AVAILABLE`); the unavailable ones are
    named in its help with their reason. The parameters are small number inputs holding the scheme's defaults
    for this L_tr until changed (a new model or scheme starts from its defaults; a link's values win once).
    Returns the :class:`~core.values.positions.Scheme` (checked by :meth:`Scheme.of`, the one parser).
    """
    ss = st.session_state
    if loaded.seq2seq:
        ss.pop("_url_scheme", None)
        return positions.PLAIN_SCHEME
    lt = loaded.train_length
    url_scheme = ss.pop("_url_scheme", None)  # a link's Scheme (checked by Scheme.of)
    if url_scheme is not None:
        choices.put("pos_scheme", url_scheme.name)
    if ss.get("pos_scheme") not in positions.AVAILABLE:
        choices.put("pos_scheme", positions.PLAIN)
    where.selectbox("Position scheme", positions.AVAILABLE, key="pos_scheme", persist_state=choices.KEEP, format_func=_scheme_label,
                    help=scheme_help())
    name = ss["pos_scheme"]
    entry = positions.get(name)
    keys = choices.SCHEME_PARAM_KEYS
    here = (ss.get("_model_ref"), lt, name)
    if ss.get(_SCHEME_FOR) != here or url_scheme is not None:
        defaults = entry.defaults(lt)
        for p in entry.params:
            choices.put(keys[p], defaults.get(p))
        if url_scheme is not None:
            for p, v in url_scheme.params:
                choices.put(keys[p], v)
        ss[_SCHEME_FOR] = here
    if entry.params:
        row = where.container(horizontal=True, gap="small")
        for p in entry.params:
            if p in _EMPTY:
                row.number_input(p, min_value=_MIN[p], value=None, step=0.5, key=keys[p], persist_state=choices.KEEP, placeholder="fitted",
                                 help=f"{_EMPTY[p]} (docs/positions.md)")
            else:
                row.number_input(p, min_value=_MIN[p], max_value=4_000_000, step=1, key=keys[p], persist_state=choices.KEEP,
                                 help=f"tokens; this model's default at L_tr = {lt}: {entry.defaults(lt).get(p)}")
    params = {p: ss[keys[p]] for p in entry.params if ss.get(keys[p]) is not None}
    try:
        scheme = positions.Scheme.of(name, params)
    except UserError as err:  # a value the scheme refuses: said once, and the scheme's defaults run meanwhile
        where.error(f"{message(err)} The scheme's defaults are used.")
        scheme = positions.Scheme.of(name)
    chosen = (ss.get("_model_ref"), scheme)
    ss[_SCHEME_CHOSEN] = chosen
    if where is not st.sidebar and ss.get(_SCHEME_CTX) not in (None, chosen) and ss.get(_SCHEME_RERUN) != chosen:
        # Explore's panel (a fragment) chose another scheme: the views outside it (the distance curves) read the
        # scheme from the sidebar's context, so the whole page runs once more with it
        ss[_SCHEME_RERUN] = chosen
        st.rerun()
    return scheme


def chosen_model_ref() -> str:
    """The model the Model boxes name now: the typed hub id or folder, else the list's choice."""
    return (st.session_state.get("model_other") or "").strip() or st.session_state["model_choice"]


def kept_scheme(loaded: Loaded) -> positions.Scheme:
    """The scheme the panel chose last for this model (plain for a T5 model or none yet): the sidebar's context
    carries it before the panel is drawn (:func:`sidebar` with ``temperature=False``)."""
    got = st.session_state.get(_SCHEME_CHOSEN)
    if loaded.seq2seq or not got or got[0] != st.session_state.get("_model_ref"):
        return positions.PLAIN_SCHEME
    return got[1]


def temperature_controls(where, loaded: Loaded, req: DocumentRequest, *, slider: bool = True,
                         s_slider: bool = True) -> Temperature:
    """Draw method, tau slider, targets and CosScale in ``where`` (the sidebar, or Explore's live panel); resolve tau.

    One function for both places, so the widgets (same keys) and the
    resolution are written once. Explore draws them beside its answer cards,
    inside the fragment that reruns on a tau move; other pages in the sidebar.
    ``slider=False`` draws everything but the "tau (fixed)" slider (a
    component that draws its own and sets ``tau_value``, :func:`set_state`);
    ``s_slider=False`` leaves out the CosScale slider too (Explore's scrubber
    moves s: one control for s, issue 50), saying the s it holds instead.

    The slider always holds the person's own tau while the method is
    "fixed"; for another method it is disabled and shows the resolved tau
    (the mean of a per-layer / per-head / per-row schedule, on the slider's
    step), and the person's tau comes back when they return to "fixed".
    """
    ss = st.session_state
    if ss.get("tau_method") not in methods.NAMES:
        choices.put("tau_method", methods.FIXED)
    targets_at = where
    if where is st.sidebar:
        c1 = c2 = where
    elif not slider:  # Explore's panel: the method and what tau applies to side by side (the cards stay in view)
        c1, targets_at = where.columns([1.5, 1], vertical_alignment="bottom")
        c2 = where
    else:
        c1, c2 = where.columns([1, 1.4], vertical_alignment="bottom")
    c1.selectbox("Method", methods.NAMES, key="tau_method", persist_state=choices.KEEP, format_func=methods.label,
                 help="How tau is chosen for this document. Algorithm 1 and Prop. 1/2 run forward passes (cached).\n\n"
                      + "\n\n".join(f"**{m.label}**: {m.help}" for m in methods.REGISTRY.values()))
    scheme = scheme_controls(c1, loaded)
    method = ss["tau_method"]
    params = method_param_controls(c1, loaded, method)
    fixed = methods.get(method).takes_value  # the slider is the person's own tau
    slot = c2.empty() if slider else None  # the slider is drawn once the method's tau is known

    def draw_slider(value: float, shown: float | None = None) -> None:
        """The tau slider at ``value``; ``shown`` marks it as a resolved tau (not the person's, not copied)."""
        if slot is None:  # no slider here (Explore's is the scrubber's): the key holds the person's own tau
            ss["tau_value"], ss[_SHOWN] = tau_input, None
            return
        ss["tau_value"], ss[_SHOWN] = value, shown
        slot.slider("tau (fixed)", choices.SLIDER_MIN, choices.SLIDER_MAX, step=choices.SLIDER_STEP, key="tau_value", persist_state=choices.KEEP,
                    disabled=not fixed,
                    help="Every targeted attention logit is divided by tau; tau < 1 sharpens."
                         + ("" if fixed else " Disabled: it shows the tau the method resolves to "
                            "(the mean, for a schedule; adaptive temperature's base, 1: each row's own tau is set "
                            "inside the pass); your own tau comes back with 'fixed tau'."))

    row = targets_at.container(horizontal=True, gap="small", vertical_alignment="center")
    row.caption("tau applies to:")
    row.checkbox("encoder", key="tgt_encoder", persist_state=choices.KEEP, help="encoder self-attention (where dispersion happens; the probes measure it)")
    if loaded.seq2seq:
        row.checkbox("decoder", key="tgt_decoder", persist_state=choices.KEEP, help="decoder self-attention")
        row.checkbox("cross", key="tgt_cross", persist_state=choices.KEEP, help="decoder -> encoder cross-attention")
        kinds = ((ENCODER, ss["tgt_encoder"]), (DECODER, ss["tgt_decoder"]), (CROSS, ss["tgt_cross"]))
    else:  # a masked-LM encoder has no decoder: its one attention is the encoder's
        kinds = ((ENCODER, ss["tgt_encoder"]),)
    targets = tuple(k for k, on in kinds if on)
    cos = None
    if loaded.cosine:
        s = float(loaded.cosine_scale)
        lo, hi = choices.cos_range(loaded)
        if ss.get("cos_scale") is None or ss.get("_cos_model") != ss["_model_ref"]:
            choices.put("cos_scale", s)
            ss["_cos_model"] = ss["_model_ref"]
        if ss.get("_url_cos") is not None:  # a link's s, checked against this model's range
            v = float(ss.pop("_url_cos"))
            if lo <= v <= hi:
                choices.put("cos_scale", v)
            else:
                where.error(f"This link's s={v:g} is outside this model's CosScale range ({lo:g}-{hi:g}), "
                            "so it was left as it was.")
        if not lo <= float(ss["cos_scale"]) <= hi:
            choices.put("cos_scale", float(np.clip(float(ss["cos_scale"]), lo, hi)))
        if s_slider:
            where.slider("CosScale s", lo, hi, step=choices.COS_STEP, key="cos_scale", persist_state=choices.KEEP,
                         help=f"cosine attention: logits are s·cos(q, k) + bias; trained with s = {s:g}.")
        else:
            where.caption(f"CosScale s = **{float(ss['cos_scale']):g}** (trained with s = {s:g}): the slider below "
                          "moves it.")
        cos = float(ss["cos_scale"])
    else:
        ss.pop("_url_cos", None)  # a dot-product model has no s
    tau_input = own_tau()  # the person's own tau, whatever the slider shows
    bar = None
    base = Choice.of(targets=targets, cosine_scale=cos, scheme=scheme)  # the controls' values, checked once
    # The resolve's estimate has its slot in every run, empty when nothing is resolved: a slot drawn only in the
    # run that resolves moved every element after it by one in the next run, and until that run ended the old
    # element at the next slot stood beside the new one (the "not reached" note twice, the answer cards 61 px
    # down, seen at tour step 4 at 1400 x 1000). An empty slot takes no room.
    note = where.empty()
    if methods.get(method).measured and cache.resolve_tau(loaded, req, method, base, compute=False) is None:
        n = int(ss.get("doc_tokens") or loaded.train_length)
        mk = timing.model_key(loaded)
        passes = [(timing.algorithm1_passes(len(temperature.GRID), True), n)]
        secs = timing.total(mk, passes)
        what = timing.plan_note(f"Resolving {methods.label(method)}", mk, passes)
        if where is not st.sidebar and not long_work.ask(("resolve", cache.mkey(loaded), req, method), secs, what, where):
            st.stop()  # Explore waits for the person's go-ahead (issue 47, point 5)
        # The estimate, its bar and the hiding of the old document's views go once the resolve is done, in this
        # run: left standing until the next run they pushed the answer cards down by their height (and a gap) and
        # then let them jump back up (seen in a class demo, tour step 4 at 1400 x 1000).
        with note.container():
            long_work.hide_stale()  # the old document's views are not this one's
            st.caption(what)
            bar = st.progress(0.0, text=f"resolving {methods.label(method)}…")
    try:
        schedule, info = cache.resolve_tau(loaded, req, method, base, tau_input, params=params,
                                           progress=(lambda f: bar.progress(min(1.0, f))) if bar else None)
    except UserError as err:
        draw_slider(tau_input)
        fail(err)
    if bar is not None:
        note.empty()
    if fixed:
        draw_slider(tau_input)
    else:
        at = choices.slider_tau(schedule, int(info.get("length") or ss.get("doc_tokens") or loaded.train_length))
        draw_slider(at, shown=at)
    if schedule.adaptive:  # no number: each row's tau comes from that row's entropy, inside the pass
        where.caption(f"{methods.label(method)} resolves to **tau = {ADAPTIVE_TEXT}**, set inside each pass (the "
                      "slider shows its base, 1, not its tau)")
    elif schedule.rows is not None:  # Llama 4: one tau per query row
        shown = f"{schedule.mean(info.get('length') or ss['doc_tokens']):.3f} (mean over the rows; rows before L_tr keep 1)"
        where.caption(f"{methods.label(method)} resolves to **tau = {shown}**")
    elif not fixed:
        a = np.asarray(schedule)
        what = "layers" if a.ndim == 1 else "layers x heads"
        shown = f"{float(a):.3f}" if a.ndim == 0 else f"{a.mean():.3f} (mean of {a.size} {what})"
        where.caption(f"{methods.label(method)} resolves to **tau = {shown}**{param_note(method, info, params)}")
        if info.get("reached") is False:  # Algorithm 1 ended where its range did, not at a match: say so
            where.caption(f":orange[{not_reached_note(info, shown)}]")
    return Temperature(base.with_(method=method, tau=schedule), tau_input, info, params)


def method_param_controls(where, loaded: Loaded, method: str) -> dict[str, float]:
    """The number box of the method's own :class:`core.runs.methods.Param` (critical scaling's gamma), drawn only
    where that method is picked; its bounds, help and default come from the registry entry. Empty is the default
    for this model's L_tr (said in the box), so a new model never inherits another's default. Returns what the
    person set, ``{name: value}`` (empty: the default), which the resolve takes (:func:`ui.cache.resolve_tau`)."""
    param = methods.get(method).param
    if param is None:
        return {}
    key = choices.METHOD_PARAM_KEYS[param.name]
    default = param.default(loaded.train_length)
    where.number_input(param.name, min_value=param.low, max_value=param.high, value=None, step=0.01, format="%.4f",
                       key=key, persist_state=choices.KEEP, placeholder=f"{default:.4g} (default)",
                       help=f"{param.help}. Empty: the default for L_tr = {loaded.train_length:,}, {default:.4g}. "
                            f"{param.low:g} .. {param.high:g}.")
    value = st.session_state.get(key)
    return {} if value is None else {param.name: float(value)}


def param_note(method: str, info: dict, params: dict) -> str:
    """After a method's resolved tau: which value of its own number it used (the person's, or the default)."""
    param = methods.get(method).param
    if param is None or param.name not in info:
        return ""
    return f" ({param.name} = {info[param.name]:.4g}{'' if param.name in params else ', the default from L_tr'})"


@st.cache_resource(show_spinner=False)
def machine_line() -> str:
    """:func:`core.mechanics.machine.one_line`, once per process (its first call may build the attention kernel)."""
    from core.mechanics import machine

    return machine.one_line()


def about_machine() -> None:
    """The sidebar's last entry, collapsed: which machine and which attention path runs the passes (issue 49).
    Drawn at the end of a page's run, so a first call that builds the kernel never holds up the views."""
    with st.sidebar.expander("About this machine"):
        try:
            st.caption(machine_line())
        except Exception as err:  # noqa: BLE001 (a fact we could not read is said, never raised)
            st.caption(f"The machine's facts could not be read: {type(err).__name__}.")


def sidebar(temperature: bool = True) -> Context:
    """Draw the sidebar, resolve model, document and (unless ``temperature`` is False) tau.

    Shows a user error and stops the page if any. With ``temperature=False``
    the page draws :func:`temperature_controls` itself (Explore, in its live
    fragment) and completes the context with :meth:`Context.with_temperature`;
    until then the context carries the session's method at tau = 1.
    """
    problems = init_state()
    if problems:
        st.sidebar.error("This link has values that cannot be used, so they were left as they were: " + "; ".join(problems))
    loaded = _model_section()
    req, doc, n = _document_section(loaded)
    scheme = kept_scheme(loaded)
    st.session_state[_SCHEME_CTX] = (st.session_state["_model_ref"], scheme)
    ctx = Context(loaded=loaded, model_ref=st.session_state["_model_ref"], request=req, document=doc, tokens=n,
                  choice=Choice(st.session_state.get("tau_method", methods.FIXED), ONE, scheme=scheme),
                  tau_input=own_tau())
    if temperature:
        st.sidebar.subheader("Temperature")
        ctx = ctx.with_temperature(temperature_controls(st.sidebar, loaded, req))
        url.sync(ctx)
    return ctx
