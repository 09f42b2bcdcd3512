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

import streamlit as st

from ui.sidebar import about_machine

st.set_page_config(page_title="Attention Alignment Explorer", layout="wide")
nav = st.navigation(
    [
        st.Page("app_pages/explore.py", title="Explore", icon=":material/search:", default=True),
        st.Page("app_pages/calibrate.py", title="Calibrate", icon=":material/tune:"),
        st.Page("app_pages/sweep.py", title="Sweep", icon=":material/grid_on:"),
        st.Page("app_pages/theory.py", title="Theory", icon=":material/functions:"),
    ]
)
nav.run()
# Last, so that a first call that builds the attention kernel never holds up a page's views.
about_machine()
