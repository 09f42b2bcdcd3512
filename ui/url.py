"""The view in the URL: a link reopens exactly this model, document and temperature.

``?model=retrieval-t5&task=passkey&tokens=2048&depth=50&seed=0&method=fixed&tau=0.7``
(``&method=critical&gamma=0.25`` for a method's own number the person set) on the page's own path (``/``, ``/calibrate``, ``/theory``, ``/sweep``): the
path is the page. A teacher copies the address bar and the class opens the
same view; the browser's back button steps through earlier views (Streamlit
pushes a history entry whenever the query string changes, and re-runs the
page with the old query string on back/forward).

How: :func:`apply` runs first in every full run. It takes a URL that differs
from what this session last wrote only in the session's first run (a link
just opened) or when the browser's back/forward button started the run
(:func:`ui.streamlit_private.history_navigation`); each known parameter is
checked and copied into the widgets' session state, and values that cannot
be used are listed in one message and left as they were. Any other differing
URL is the browser's address bar from before it took the last write, an
echo: the person acted, or the scrubber polled, while a run was under way,
and Streamlit folds a poll into a pending full rerun with the poll's query
string. Applying it undid the person's last choice (seen in a class demo:
the method went back to the tour's Algorithm 1 after "fixed tau" was
chosen; earlier, a model switch came back as the old model).
:func:`sync` writes the current view at the end of a run (also from a
fragment's rerun). Pasted text is not put in the URL (too long); such a view
carries only the model and the temperature. A cosine model's view also
carries its CosScale ``s`` (checked against the model's slider range once the
model is loaded, :func:`ui.tau_controls.temperature_controls`).

Values go into the widget keys before the widgets are drawn; the widgets keep
them across page changes (``persist_state``, :mod:`ui.choices`). The keys and
ranges come from :mod:`ui.choices`; the sidebar calls :func:`apply` and
:func:`sync`, and this module never imports the sidebar.

Every parser refuses what it cannot use with a ``ValueError`` whose text is
the reason (shown in the page's one message): a number too large for a float
or an integer (``1e400``, ``inf``) is refused like a word, never raised as
another kind of error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import streamlit as st

from core.data import tasks
from core.errors import UserError
from core.runs import methods
from core.values import positions
from ui import choices
from ui.streamlit_private import history_navigation

WRITTEN = "_url_written"  # the view this session last wrote or applied (a changed URL is a link or back/forward)


def _finite(v: str, what: str) -> float:
    """The number ``v`` spells, refused (ValueError ``what``) when it is not one or not finite.

    Why not ``float()`` alone: ``float("1e400")`` is inf, and inf or nan then
    raise OverflowError / ValueError wherever they are turned into an integer
    or divided; a link must get the page's one message instead.
    """
    try:
        x = float(v)
    except ValueError:
        raise ValueError(what) from None
    if not math.isfinite(x):
        raise ValueError(what)
    return x


def _int_in(lo: int, hi: int, step: int = 1) -> Callable[[str], int]:
    def parse(v: str) -> int:
        x = int(_finite(v, "not a whole number"))
        if not lo <= x <= hi:
            raise ValueError(f"outside {lo:,}-{hi:,}")
        return int(round(x / step) * step)

    return parse


def _choice(options) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v not in options:
            raise ValueError(f"choose from {', '.join(options)}")
        return v

    return parse


def _tau(v: str) -> float:
    x = _finite(v, "not a number")
    if not choices.SLIDER_MIN <= x <= choices.SLIDER_MAX:
        raise ValueError(f"outside {choices.SLIDER_MIN}-{choices.SLIDER_MAX}")
    return round(x, 2)


#: The largest ``s`` a link may carry before the model is known (any model's CosScale range ends far below;
#: :func:`ui.tau_controls.temperature_controls` checks the model's own).
COS_MAX = 1e6


def _cos(v: str) -> float:
    """A CosScale ``s``: a number on the slider's step, at least its bottom (its top depends on the model)."""
    x = _finite(v, "not a number")
    if x < choices.COS_MIN:
        raise ValueError(f"below {choices.COS_MIN:g}")
    if x > COS_MAX:  # keeps x / step finite (1e308 / 0.5 is inf)
        raise ValueError(f"above {COS_MAX:g}")
    return round(x / choices.COS_STEP) * choices.COS_STEP


def _tokens(v: str) -> int | str:
    """A token count, or a multiple of L_tr written ``8x`` (resolved once the model is known)."""
    if v.lower().endswith("x"):
        k = _int_in(1, 64)(v[:-1])
        return f"{k}x"
    return _int_in(16, 4_000_000)(v)


def _model(v: str) -> str:
    v = v.strip()
    if not v or len(v) > 300:
        raise ValueError("empty or too long")
    if not v.isprintable():  # a NUL, a line break: no folder a person means and no hub id has one
        raise ValueError("not a model name")
    return v


def _scheme(v: str) -> positions.Scheme:
    """A rotary model's position scheme: ``window``, ``lm-infinite:window=32:sinks=2``, read once, by the one parser
    (:meth:`core.values.positions.Scheme.of`: a known, available name, the parameters it takes, each in its bounds).
    The :class:`~core.values.positions.Scheme` it returns is what the sidebar fills its inputs from and what the
    run's :class:`~core.values.choice.Choice` carries: the link's text is not parsed again."""
    if not v or len(v) > 200 or not v.isprintable():
        raise ValueError("not a position scheme")
    try:
        return positions.Scheme.of(v)
    except UserError as err:
        raise ValueError(" ".join(str(err).split())) from None


def _method_param(name: str) -> Callable[[str], float]:
    """A method's own number (critical scaling's ``gamma``), in the bounds of its registry :class:`Param`."""
    param = methods.get(methods.takers(name)[0]).param

    def parse(v: str) -> float:
        x = _finite(v, "not a number")
        try:
            return param.check(x)
        except UserError:
            raise ValueError(f"outside {param.low:g}-{param.high:g}") from None

    return parse


#: URL parameter -> (session-state key, parser that returns the value or raises ValueError with a reason).
PARAMS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "model": ("_url_model", _model),
    "task": ("doc_task", _choice(tasks.GENERATED)),
    "tokens": ("doc_tokens", _tokens),
    "depth": ("doc_depth", _int_in(0, 100, 5)),
    "seed": ("doc_seed", _int_in(0, 10**9)),
    "filler": ("doc_haystack", _choice(tuple(choices.HAYSTACK_CHOICES))),
    "method": ("tau_method", _choice(methods.NAMES)),
    "tau": ("tau_value", _tau),
    "s": ("_url_cos", _cos),  # a cosine model's CosScale; the sidebar checks it against the model's range
    "scheme": ("_url_scheme", _scheme),  # a rotary model's position scheme; the sidebar binds it at the model's L_tr
    # each method's own number (gamma), when the person set one: its box starts from it
    **{name: (key, _method_param(name)) for name, key in choices.METHOD_PARAM_KEYS.items()},
}


def _current() -> dict[str, str]:
    return {k: v for k, v in st.query_params.to_dict().items() if k in PARAMS}


def apply() -> list[str]:
    """Copy a newly opened URL's view into session state; returns one message per unusable parameter."""
    ss = st.session_state
    url = _current()
    if not url or url == ss.get(WRITTEN):
        return []
    if ss.get(WRITTEN) is not None and not history_navigation():
        return []  # an echo of an older view (see the module docstring), not a link or back/forward

    problems = []
    for name, raw in url.items():
        key, parse = PARAMS[name]
        try:
            value = parse(raw)
        except ValueError as err:
            problems.append(f"{name}={raw[:40]!r} ({err})")
            continue
        if name == "model":
            if value in choices.model_options():
                ss["model_choice"] = value
                ss["model_other"] = ""
            else:
                ss["model_other"] = value  # a folder or hub id: loaded (or refused) like a typed one
            continue
        if name == "tokens":
            ss["_ltr"] = None  # keep the URL's length whatever model loads (see ui.document_controls.document_section)
            if isinstance(value, str):  # "8x": the sidebar resolves it with the model's L_tr
                ss["_url_multiple"] = int(value[:-1])
                continue
        ss[key] = value
    if "task" in url or "tokens" in url:
        ss["doc_mode"] = "Generate"
    ss[WRITTEN] = url  # applied once; the next sync() writes the resolved view
    return problems


def view(ctx) -> dict[str, str]:
    """The URL parameters of a page's :class:`ui.page_state.PageState`."""
    out = {"model": ctx.model_ref}
    if ctx.request.task in tasks.GENERATED:
        r = ctx.request
        out.update(task=r.task, tokens=str(r.tokens), depth=str(int(round(r.depth * 100))), seed=str(r.seed))
        if r.haystack != "default":
            out["filler"] = r.haystack
    out["method"] = ctx.choice.method
    if methods.get(ctx.choice.method).takes_value:
        out["tau"] = f"{ctx.tau_input:.2f}"
    for name, value in ctx.choice.params.items():  # only a number the person set, for the chosen method
        out[name] = f"{float(value):.12g}"
    if getattr(ctx.loaded, "cosine", False) and ctx.choice.cosine_scale is not None:  # only a cosine model has an s
        out["s"] = f"{float(ctx.choice.cosine_scale):g}"
    if not getattr(ctx.loaded, "seq2seq", True):  # only a rotary model has a position scheme
        out["scheme"] = ctx.choice.scheme.spell()
    return out


def sync(ctx) -> None:
    """Write the view into the address bar (a new history entry when it changed)."""
    v = view(ctx)
    if _current() != v:
        st.query_params.from_dict(v)
    st.session_state[WRITTEN] = v
