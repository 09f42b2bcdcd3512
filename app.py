"""Attention Alignment Explorer: ``streamlit run app.py``.

Only declares the navigation. Each page draws the shared sidebar itself
(``ui.sidebar.sidebar()``), so a page also works when Streamlit runs it alone.
"""

import streamlit as st

st.set_page_config(page_title="Attention Alignment Explorer", layout="wide")
nav = st.navigation(
    [
        st.Page("pages/explore.py", title="Explore", icon=":material/search:", default=True),
        st.Page("pages/calibrate.py", title="Calibrate", icon=":material/tune:"),
        st.Page("pages/sweep.py", title="Sweep", icon=":material/grid_on:"),
        st.Page("pages/theory.py", title="Theory", icon=":material/functions:"),
    ]
)
nav.run()
