"""The shared sidebar: model, document, temperature. Every page calls :func:`sidebar` itself.

What it draws lives by what it draws: :mod:`ui.model_box`, :mod:`ui.document_controls`, :mod:`ui.tau_controls`
(method, scheme, tau, targets, CosScale: the run's :class:`~core.values.choice.Choice`); what a page works from is
one :class:`ui.page_state.PageState` (the Choice plus the page's state), and what it hands on :mod:`ui.export`.

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

import streamlit as st

from core.runs import methods
from core.values.choice import Choice
from core.values.schedule import ONE
from ui import choices, tau_controls, url
from ui.document_controls import document_section
from ui.model_box import model_section
from ui.page_state import PageState

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


def sidebar(temperature: bool = True) -> PageState:
    """Draw the sidebar, resolve model, document and (unless ``temperature`` is False) tau.

    Shows a user error and stops the page if any. With ``temperature=False``
    the page draws :func:`ui.tau_controls.temperature_controls` itself (Explore, in its live
    fragment) and completes the page state with :meth:`PageState.with_choice`;
    until then the page state carries the session's method at tau = 1.
    """
    problems = init_state()
    if problems:
        st.sidebar.error(
            "This link has values that cannot be used, so they were left as they were: " + "; ".join(problems)
        )
    loaded = model_section()
    req, doc, n = document_section(loaded)
    scheme = tau_controls.page_scheme(loaded)
    ctx = PageState(
        loaded=loaded,
        model_ref=st.session_state["_model_ref"],
        request=req,
        document=doc,
        tokens=n,
        choice=Choice(st.session_state.get("tau_method", methods.FIXED), ONE, scheme=scheme),
        tau_input=tau_controls.own_tau(),
    )
    if temperature:
        st.sidebar.subheader("Temperature")
        ctx = ctx.with_choice(*tau_controls.temperature_controls(st.sidebar, loaded, req))
        url.sync(ctx)
    return ctx
