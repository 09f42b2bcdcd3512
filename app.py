"""Attention Alignment Explorer: ``streamlit run app.py``.

Only declares the navigation; every run (a page change, a rerun, a link to
``/theory`` opened first) runs this file and then the chosen page. The pages
live in ``app_pages/``: a folder named ``pages/`` beside this file would switch
on Streamlit's legacy multipage mode, which runs a page file alone and lists
every file in the menu. Each page draws the shared sidebar itself
(``ui.sidebar.sidebar()``: Explore draws the temperature controls in its own
panel, the other pages in the sidebar); the choices outlive page changes
because their widgets are drawn with ``persist_state="session"`` (docs/app.md,
"Pages and how choices are kept").
"""

import sys

import streamlit as st

st.set_page_config(page_title="Attention Alignment Explorer", layout="wide")
# The page's first element, before the heavy imports: Streamlit shows a blank page until a run's first element, and
# the first run of a fresh server imports torch and transformers (~10-20 s on a busy 2-core CPU: issue 59 point 3, a
# cold start showed a white page for ~20 s). The slot is drawn in every run, empty once the imports are done.
_starting = st.empty()
if "ui.sidebar" not in sys.modules:
    _starting.info(
        "**Starting the Attention Alignment Explorer.** The first page after the server starts loads PyTorch, "
        "transformers and a model once; on a small CPU that takes a while. It appears here by itself."
    )

from ui import long_work  # noqa: E402 (after the first element, on purpose: see above)
from ui.model_box import SWITCHING, chosen_model_ref  # noqa: E402
from ui.sidebar import about_machine  # noqa: E402

_ss = st.session_state
if _ss.get("model_choice") is not None and (_ss.get(SWITCHING) or chosen_model_ref() != _ss.get("_model_ref")):
    # A model switch, from this run's first element on: the last model's views are hidden until redrawn
    # (ui.model_box says why; this slot is the earliest place a run can say it, before the page's own elements).
    with _starting.container():
        long_work.hide_stale()
else:
    _starting.empty()
nav = st.navigation(
    [
        st.Page("app_pages/explore.py", title="Explore", icon=":material/search:", default=True),
        st.Page("app_pages/calibrate.py", title="Calibrate", icon=":material/tune:"),
        st.Page("app_pages/sweep.py", title="Sweep", icon=":material/grid_on:"),
        st.Page("app_pages/theory.py", title="Theory", icon=":material/functions:"),
    ]
)
nav.run()
# A run that got here drew the chosen model's views: a model switch no longer hides the old ones (ui.model_box).
_ss.pop(SWITCHING, None)
# Last, so that a first call that builds the attention kernel never holds up a page's views.
about_machine()
