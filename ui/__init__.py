"""Streamlit glue shared by the pages: the sidebar (ui.sidebar), the cached backend (ui.cache), small helpers.

No maths here: numbers come from :mod:`core`, figures from :mod:`core.views.plots`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import pandas as pd
import streamlit as st

from core.errors import UserError
from core.experiments.csvio import to_csv_bytes

TITLE = "Attention Alignment Explorer"
PAPER = "Chi, Fan & Rudnicky 2023, *Attention Alignment and Flexible Positional Embeddings Improve Transformer Length Extrapolation*, [arXiv 2311.00684](https://arxiv.org/abs/2311.00684)"
PLOTLY_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def page_setup(name: str) -> None:
    """Page title and wide layout (callable from every page; the first call of a run wins the layout)."""
    st.set_page_config(page_title=f"{name} · {TITLE}", layout="wide")


def csv_of(df_fn):
    """A lazy CSV payload for st.download_button: built only when the button is clicked.

    Text cells a spreadsheet would run as formulas get a leading ``'`` (:mod:`core.experiments.csvio`).
    """

    def build() -> bytes:
        df = df_fn()
        return to_csv_bytes(df, index=not isinstance(df.index, pd.RangeIndex))

    return build


def chart(fig, key: str | None = None) -> None:
    """A plotly figure with the toolbar kept (PNG download in the browser).

    The toolbar stands upright at the figure's right edge: lying along the top it covered the titles of
    Calibrate's panels (issue 50). Set on the figure itself (idempotent, so a cached figure may be shared).
    """
    if fig.layout.modebar.orientation != "v":
        fig.layout.modebar.orientation = "v"
    st.plotly_chart(fig, width="stretch", config=PLOTLY_CONFIG, key=key)


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 run', '2 runs', '1,000 runs' (``words``: an irregular plural)."""
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


#: The command line's options and the app controls that do their job, for a message raised without an app
#: text (:attr:`core.errors.UserError.app_text`): a person in the browser has boxes, not flags.
CONTROLS = {
    "--tokens": "the Length in tokens box",
    "--model": "the sidebar's model boxes",
    "--tau": "the tau slider",
    "--method": "the Method box",
    "--depth": "the Needle depth slider",
    "--seed": "the Seed box",
    "--task": "the Task box",
    "--text-file": "the Your text box",
    "--lengths": "the Lengths box",
    "--methods": "the Methods box",
    "--depths": "the Needle depths box",
    "--seeds": "the Seeds box",
}
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
#: An absolute path (or one from the home folder) as a word of its own; URLs (``https://``) are left alone.
_PATH = re.compile(r"(?<![\w.:/~-])~?/(?:[^\s'\"`()\[\]/]+/)*([^\s'\"`()\[\]/]+)/?")


def app_words(text: str) -> str:
    """A library message in the app's words: flags named as the controls that do their job (an aside about an
    option with no control dropped) and a server path cut to its last name.

    The safety net for messages raised without an app text; the right fix is
    ``UserError(cli_text, app=app_text)`` where the message is raised.
    """
    text = _FLAG.sub(lambda m: CONTROLS.get(m.group(0), m.group(0)), text)
    text = re.sub(r"\s*\((?:[^()]*?\s)?--[a-z][^()]*\)", "", text)  # '(see --help)': no control for it
    text = re.sub(r"(?:[;,:]\s*)?(?:\b(?:use|pass|with|see)\s+)?--[a-z][a-z0-9-]*(?:\s+[^\s;,.()]+)?", "", text)
    return _PATH.sub(lambda m: m.group(1), text)


def message(err: Exception) -> str:
    """What the page says for an error: a :class:`UserError`'s app text (see :mod:`core.errors`), in the app's words."""
    return app_words(err.app_text if isinstance(err, UserError) else str(err))


def fail(err: Exception) -> None:
    """Show a user-fixable error as one line in the page (never a traceback) and end this run."""
    st.error(message(err))
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
