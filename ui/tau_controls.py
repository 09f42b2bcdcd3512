"""The temperature controls: method, position scheme, the method's own number, tau slider, targets and CosScale,
resolved to the run's one :class:`~core.values.choice.Choice`. Drawn in the sidebar, or in Explore's live panel.

A tau takes these forms from the slider to the attention: a float in the widget's key (``tau_value``; the person's
own in :data:`_OWN_TAU`), a :class:`~core.values.schedule.Schedule` from :func:`ui.cache.resolve_tau` on (the
Choice's ``tau``), and a tensor only inside the attention call. A scheme: the box's name and its number inputs,
one :class:`~core.values.positions.Scheme` from :meth:`Scheme.of` on (the Choice's ``scheme``), bound to a pass's
length only inside the attention call.
"""

from __future__ import annotations

import numpy as np
import streamlit as st

from core.errors import UserError
from core.mechanics.attention import CROSS, DECODER, ENCODER
from core.models import Loaded
from core.runs import methods, temperature, timing
from core.runs.settings import DocumentRequest
from core.values import positions
from core.values.choice import Choice
from ui import cache, choices, fail, long_work, message
from ui.page_state import ADAPTIVE_TEXT

_OWN_TAU = "_aae_own_tau"  # the person's own tau (the slider shows the resolved one while the method is not fixed)
_SHOWN = "_aae_tau_shown"  # the resolved tau last written into the disabled slider (not the person's own tau)


def own_tau() -> float:
    """The person's own tau: ``tau_value`` unless it holds the resolved tau this module drew in the disabled slider.

    A new value there (the slider, a link, the scrubber's release, a callback) is the person's and is kept.
    """
    ss = st.session_state
    v = ss.get("tau_value")
    if v is not None and (ss.get(_SHOWN) is None or v != ss[_SHOWN]):
        ss[_OWN_TAU], ss[_SHOWN] = float(v), None
    return float(ss.get(_OWN_TAU, 1.0))


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
        first = (
            f"The curve is already {abs(gap):.4f} {side} the L_tr reference at tau = {pick:.2f}, the top of the "
            "range searched"
        )
    else:
        end = min(taus) if taus else pick
        span = "over the range searched" if end is None else f"down to tau = {end:.2f}, the end of the range searched"
        first = f"The curve stays {abs(gap):.4f} {side} the L_tr reference {span}"
    n = len(info.get("unreached_heads") or ())
    heads = (
        f" ({n} heads never reached it and keep tau = 1)" if n != 1 else " (1 head never reached it and keeps tau = 1)"
    )
    return (
        f"{first}: tau = {shown} is where the search stopped, not a match"
        + (heads if n else "")
        + ". A closed form (log-length or YaRN) is the better bet for this document."
    )


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
    return (
        "How positions past L_tr are handled: the second axis beside the temperature (docs/positions.md). Every "
        "pass of this page runs under it; the left column stays the model as trained.\n\n" + "\n\n".join(lines)
    )


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
    where.selectbox(
        "Position scheme",
        positions.AVAILABLE,
        key="pos_scheme",
        persist_state=choices.KEEP,
        format_func=_scheme_label,
        help=scheme_help(),
    )
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
                row.number_input(
                    p,
                    min_value=_MIN[p],
                    value=None,
                    step=0.5,
                    key=keys[p],
                    persist_state=choices.KEEP,
                    placeholder="fitted",
                    help=f"{_EMPTY[p]} (docs/positions.md)",
                )
            else:
                row.number_input(
                    p,
                    min_value=_MIN[p],
                    max_value=4_000_000,
                    step=1,
                    key=keys[p],
                    persist_state=choices.KEEP,
                    help=f"tokens; this model's default at L_tr = {lt}: {entry.defaults(lt).get(p)}",
                )
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


def page_scheme(loaded: Loaded) -> positions.Scheme:
    """:func:`kept_scheme`, noted as the scheme this page run's state carries (the panel compares its own choice
    with it: a scheme chosen in Explore's fragment reruns the whole page, :func:`scheme_controls`)."""
    scheme = kept_scheme(loaded)
    st.session_state[_SCHEME_CTX] = (st.session_state["_model_ref"], scheme)
    return scheme


def kept_scheme(loaded: Loaded) -> positions.Scheme:
    """The scheme the panel chose last for this model (plain for a T5 model or none yet): the sidebar's context
    carries it before the panel is drawn (:func:`sidebar` with ``temperature=False``)."""
    got = st.session_state.get(_SCHEME_CHOSEN)
    if loaded.seq2seq or not got or got[0] != st.session_state.get("_model_ref"):
        return positions.PLAIN_SCHEME
    return got[1]


def temperature_controls(
    where, loaded: Loaded, req: DocumentRequest, *, slider: bool = True, s_slider: bool = True
) -> tuple[Choice, float, dict]:
    """Draw method, tau slider, targets and CosScale in ``where`` (the sidebar, or Explore's live panel); resolve tau.
    Returns ``(choice, tau_input, info)``: the run's Choice (the method, the schedule it resolved to, targets,
    CosScale, scheme, the method's own number the person set), the person's own slider tau, and what the resolution
    said (:meth:`ui.page_state.PageState.with_choice` takes the three).

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
    c1.selectbox(
        "Method",
        methods.NAMES,
        key="tau_method",
        persist_state=choices.KEEP,
        format_func=methods.label,
        help="How tau is chosen for this document. Algorithm 1 and Prop. 1/2 run forward passes (cached).\n\n"
        + "\n\n".join(f"**{m.label}**: {m.help}" for m in methods.REGISTRY.values()),
    )
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
        slot.slider(
            "tau (fixed)",
            choices.SLIDER_MIN,
            choices.SLIDER_MAX,
            step=choices.SLIDER_STEP,
            key="tau_value",
            persist_state=choices.KEEP,
            disabled=not fixed,
            help="Every targeted attention logit is divided by tau; tau < 1 sharpens."
            + (
                ""
                if fixed
                else " Disabled: it shows the tau the method resolves to "
                "(the mean, for a schedule; adaptive temperature's base, 1: each row's own tau is set "
                "inside the pass); your own tau comes back with 'fixed tau'."
            ),
        )

    row = targets_at.container(horizontal=True, gap="small", vertical_alignment="center")
    row.caption("tau applies to:")
    row.checkbox(
        "self-attention" if loaded.decoder_only else "encoder",
        key="tgt_encoder",
        persist_state=choices.KEEP,
        help="the decoder's causal self-attention: its one attention, which reads the prompt and writes the answer "
        "(where dispersion happens; the probes measure the prompt's rows)"
        if loaded.decoder_only
        else "encoder self-attention (where dispersion happens; the probes measure it)",
    )
    if loaded.seq2seq:
        row.checkbox("decoder", key="tgt_decoder", persist_state=choices.KEEP, help="decoder self-attention")
        row.checkbox("cross", key="tgt_cross", persist_state=choices.KEEP, help="decoder -> encoder cross-attention")
        kinds = ((ENCODER, ss["tgt_encoder"]), (DECODER, ss["tgt_decoder"]), (CROSS, ss["tgt_cross"]))
    else:  # a masked-LM encoder or a decoder-only LM: one attention (the engine reads "encoder" as a decoder's own)
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
                where.error(
                    f"This link's s={v:g} is outside this model's CosScale range ({lo:g}-{hi:g}), "
                    "so it was left as it was."
                )
        if not lo <= float(ss["cos_scale"]) <= hi:
            choices.put("cos_scale", float(np.clip(float(ss["cos_scale"]), lo, hi)))
        if s_slider:
            where.slider(
                "CosScale s",
                lo,
                hi,
                step=choices.COS_STEP,
                key="cos_scale",
                persist_state=choices.KEEP,
                help=f"cosine attention: logits are s·cos(q, k) + bias; trained with s = {s:g}.",
            )
        else:
            where.caption(
                f"CosScale s = **{float(ss['cos_scale']):g}** (trained with s = {s:g}): the slider below moves it."
            )
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
        if where is not st.sidebar and not long_work.ask(
            ("resolve", cache.mkey(loaded), req, method), secs, what, where
        ):
            st.stop()  # Explore waits for the person's go-ahead (issue 47, point 5)
        # The estimate, its bar and the hiding of the old document's views go once the resolve is done, in this
        # run: left standing until the next run they pushed the answer cards down by their height (and a gap) and
        # then let them jump back up (seen in a class demo, tour step 4 at 1400 x 1000).
        with note.container():
            long_work.hide_stale()  # the old document's views are not this one's
            st.caption(what)
            bar = st.progress(0.0, text=f"resolving {methods.label(method)}…")
    try:
        schedule, info = cache.resolve_tau(
            loaded,
            req,
            method,
            base,
            tau_input,
            params=params,
            progress=(lambda f: bar.progress(min(1.0, f))) if bar else None,
        )
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
        where.caption(
            f"{methods.label(method)} resolves to **tau = {ADAPTIVE_TEXT}**, set inside each pass (the "
            "slider shows its base, 1, not its tau)"
        )
    elif schedule.rows is not None:  # Llama 4: one tau per query row
        shown = (
            f"{schedule.mean(info.get('length') or ss['doc_tokens']):.3f} (mean over the rows; rows before L_tr keep 1)"
        )
        where.caption(f"{methods.label(method)} resolves to **tau = {shown}**")
    elif not fixed:
        a = np.asarray(schedule)
        what = "layers" if a.ndim == 1 else "layers x heads"
        shown = f"{float(a):.3f}" if a.ndim == 0 else f"{a.mean():.3f} (mean of {a.size} {what})"
        where.caption(f"{methods.label(method)} resolves to **tau = {shown}**{param_note(method, info, params)}")
        if info.get("reached") is False:  # Algorithm 1 ended where its range did, not at a match: say so
            where.caption(f":orange[{not_reached_note(info, shown)}]")
    return base.with_(method=method, tau=schedule, method_params=params), tau_input, info


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
    where.number_input(
        param.name,
        min_value=param.low,
        max_value=param.high,
        value=None,
        step=0.01,
        format="%.4f",
        key=key,
        persist_state=choices.KEEP,
        placeholder=f"{default:.4g} (default)",
        help=f"{param.help}. Empty: the default for L_tr = {loaded.train_length:,}, {default:.4g}. "
        f"{param.low:g} .. {param.high:g}.",
    )
    value = st.session_state.get(key)
    return {} if value is None else {param.name: float(value)}


def param_note(method: str, info: dict, params: dict) -> str:
    """After a method's resolved tau: which value of its own number it used (the person's, or the default)."""
    param = methods.get(method).param
    if param is None or param.name not in info:
        return ""
    return f" ({param.name} = {info[param.name]:.4g}{'' if param.name in params else ', the default from L_tr'})"
