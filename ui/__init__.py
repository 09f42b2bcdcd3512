"""Streamlit glue shared by the pages: the sidebar (ui.sidebar), the cached backend (ui.cache), small helpers.

No maths here: numbers come from :mod:`core`, figures from :mod:`core.plots`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import pandas as pd
import streamlit as st

from core.csvio import to_csv_bytes
from core.errors import UserError

TITLE = "Attention Alignment Explorer"
PAPER = "Chi, Fan & Rudnicky 2023, *Attention Alignment and Flexible Positional Embeddings Improve Transformer Length Extrapolation*, [arXiv 2311.00684](https://arxiv.org/abs/2311.00684)"
PLOTLY_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def page_setup(name: str) -> None:
    """Page title and wide layout (callable from every page; the first call of a run wins the layout)."""
    st.set_page_config(page_title=f"{name} · {TITLE}", layout="wide")


def csv_of(df_fn):
    """A lazy CSV payload for st.download_button: built only when the button is clicked.

    Text cells a spreadsheet would run as formulas get a leading ``'`` (:mod:`core.csvio`).
    """
    def build() -> bytes:
        df = df_fn()
        return to_csv_bytes(df, index=not isinstance(df.index, pd.RangeIndex))

    return build


def chart(fig, key: str | None = None) -> None:
    """A plotly figure with the toolbar kept (PNG download in the browser)."""
    st.plotly_chart(fig, width="stretch", config=PLOTLY_CONFIG, key=key)


def fail(err: Exception) -> None:
    """Show a user-fixable error as one line in the page (never a traceback) and end this run."""
    st.error(str(err))
    st.stop()


@contextlib.contextmanager
def user_errors(*placeholders) -> Iterator[None]:
    """Run a block; a :class:`UserError` clears ``placeholders`` (progress bars), shows one line and ends the run."""
    try:
        yield
    except UserError as err:
        for p in placeholders:
            p.empty()
        fail(err)
