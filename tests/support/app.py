"""What AppTest tests share beyond tests/conftest.py: the app's entry, a page opened on its own, Explore's fragment
rerun, a page change as the navigation sends it, the URL's parameters, and Calibrate on a 600-token document."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from streamlit.proto.WidgetStates_pb2 import WidgetStates
from streamlit.testing.v1 import AppTest

from conftest import app_ok, browser_requests

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
TIMEOUT = 180


def open_page(name: str) -> AppTest:
    """One page of the app opened on its own (``app_pages/<name>``), as AppTest runs a script."""
    return AppTest.from_file(str(ROOT / "app_pages" / name), default_timeout=TIMEOUT)


def live_fragment(at: AppTest) -> str:
    """The id of Explore's live fragment (the one whose function is ``live``)."""
    frags = at._fragment_storage._fragments
    for fid, wrapped in frags.items():
        cells = [c.cell_contents for c in (wrapped.__closure__ or ()) if callable(c.cell_contents)]
        if any(getattr(f, "__name__", "") == "live" for f in cells):
            return fid
    assert len(frags) == 1, f"cannot tell Explore's fragment among {list(frags)}"
    return next(iter(frags))


def fragment_run(at: AppTest) -> AppTest:
    """Rerun only Explore's fragment with the widget values set on ``at`` (a change inside the fragment)."""
    with browser_requests(fragment_id_queue=[live_fragment(at)]):
        at.run()
    return at


def nav_click(at: AppTest, page: str) -> AppTest:
    """Open ``page`` the way the navigation does: a page request that carries no widget states."""
    at.switch_page(page)
    at._run(widget_state=WidgetStates())
    return at


def url_params(at: AppTest) -> dict[str, str]:
    return {k: (v[0] if isinstance(v, list) else v) for k, v in dict(at.query_params).items()}


def calibrate_at_600() -> tuple[AppTest, "pd.DataFrame"]:
    """Calibrate on a 600-token document, its search run: the page and its every-method table (also used by
    tests/app/test_adaptive_views.py)."""
    at = open_page("calibrate.py")
    at.session_state["doc_tokens"] = 600
    at.run()
    if any(b.key == "cal_run" for b in at.button):
        at.button(key="cal_run").click().run()
    app_ok(at)
    tables = [d.value for d in at.dataframe if "label" in d.value.columns and "note" in d.value.columns]
    assert tables, "Calibrate's every-method table"
    return at, tables[0]
