"""Adaptive temperature in the app and ``run --json``: no view calls it tau = 1.

:data:`core.values.schedule.ADAPTIVE` has base tau 1 (its ``mean``, its numpy value) but no tau before a pass: each
query row's own comes from that row's entropy inside the pass. The views that turned a schedule into a number said
"tau = 1" for it, and Calibrate's "Use this tau" put a fixed tau of 1 in the sidebar (the model as trained) instead
of the method. Driven through AppTest on the tiny T5 the tests build (tests/conftest.py); the CLI through its main.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import app_ok, scrubber_view  # noqa: E402
from core import cli  # noqa: E402
from core.runs import methods  # noqa: E402
from core.values.schedule import ADAPTIVE, ONE, RowTau, Schedule  # noqa: E402
from support.app import calibrate_at_600  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 180
#: the registry's adaptive entry, found by what it holds (the registry owns the name)
NAME = next(n for n, m in methods.REGISTRY.items() if m.constant is not None and m.constant.adaptive)

pytestmark = pytest.mark.usefixtures("one_thread")


def _page(name: str) -> AppTest:
    return AppTest.from_file(str(ROOT / "app_pages" / name), default_timeout=TIMEOUT)


def _captions(at: AppTest) -> str:
    return "\n".join(c.value for c in [*at.caption, *at.sidebar.caption])


def _says_tau_1(text: str) -> bool:
    return any(f"tau = {one}" in text for one in ("1.000", "1.0000", "1.00 ", "1 at every"))


# -- the texts, without a page ---------------------------------------------------------------------------------------


def test_the_cell_and_the_context_say_adaptive():
    from ui import calibrate_views
    from ui.page_state import PageState

    cell, note = calibrate_views.tau_cell(ADAPTIVE, 600, 256)
    assert "adaptive" in cell and not cell.startswith("1.0") and "entropy" in cell + note
    assert calibrate_views.tau_cell(ONE, 600, 256) == ("1.0000", "")  # tau = 1 itself still reads as 1
    ctx = PageState.__new__(PageState)  # tau_text reads only the schedule handed to it
    text = ctx.tau_text(ADAPTIVE)
    assert "adaptive" in text and not text.startswith("1.0"), text
    assert ctx.tau_text(ONE) == "1.000"


# -- Theory: the method list -----------------------------------------------------------------------------------------


def test_theory_does_not_list_adaptive_as_tau_1(env):
    at = _page("theory.py")
    at.session_state["doc_tokens"] = 600
    at.run()
    app_ok(at)
    (listed,) = [d.value for d in at.dataframe if "on this page" in d.value.columns]
    where = listed.loc[listed["name"] == f"`{NAME}`", "on this page"].item()
    assert "adaptive" in where or "entropy" in where, where
    assert not _says_tau_1(where), where
    trained = listed.loc[listed["name"] == f"`{methods.AS_TRAINED}`", "on this page"].item()
    assert "tau = 1 at every length" in trained  # the model as trained still is tau = 1


# -- Calibrate: the table, the 'use' box and its button --------------------------------------------------------------


def test_calibrate_shows_adaptive_and_uses_it_as_the_method(env):
    at, table = calibrate_at_600()
    cell = table.loc[table["method"] == NAME, "tau"].item()
    assert "adaptive" in cell and not cell.startswith("1.0"), cell
    pick = at.selectbox(key="cal_pick")
    (option,) = [o for o in pick.options if o.startswith(methods.label(NAME) + ":")]
    assert "1.0000" not in option, option
    pick.set_value(NAME).run()
    at.button(key="use_pick").click().run()
    app_ok(at)
    # the method, not a fixed tau of 1 (that is the model as trained, a different pass)
    assert at.session_state["tau_method"] == NAME, at.session_state["tau_method"]
    used = " ".join(s.value for s in at.success)
    assert "Sidebar set to" in used and not _says_tau_1(used + " "), used
    captions = _captions(at)
    assert f"{methods.label(NAME)} resolves to **tau = adaptive" in captions, captions
    assert f"{methods.label(NAME)} resolves to **tau = 1" not in captions


# -- Explore: the sidebar's line and the scrubber's note -------------------------------------------------------------


def test_explore_says_adaptive_beside_a_slider_at_its_base(env):
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()
    at.selectbox(key="tau_method").set_value(NAME).run()
    app_ok(at)
    captions = _captions(at)
    assert "resolves to **tau = adaptive" in captions, captions
    assert not _says_tau_1(captions.split(methods.label(NAME))[-1][:80]), captions
    meta = scrubber_view(at)[0]["meta"]
    assert meta["disabled"] and meta["tau"] == pytest.approx(1.0)  # the slider shows its base, 1, and is not moved
    assert "adaptive" in meta["note"] and "tau = 1.000" not in meta["note"], meta["note"]


# -- run --json: tau is the base 1; the schedule beside it -----------------------------------------------------------


def _run_json(capsys, tiny_dir, *argv) -> dict:
    code = cli.main(
        ["run", "--model", str(tiny_dir), "--task", "passkey", "--tokens", "300", "--json", *map(str, argv)]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_run_json_carries_the_adaptive_schedule(tiny_dir, capsys):
    got = _run_json(capsys, tiny_dir, "--method", NAME)
    assert got["tau"] == 1.0  # the field keeps its meaning: the base tau
    assert Schedule.of(got["schedule"]) is ADAPTIVE and "adaptive" in got["schedule_text"]
    rows = _run_json(capsys, tiny_dir, "--method", methods.PER_ROW)  # Llama 4: its mean, and the rule beside it
    assert isinstance(Schedule.of(rows["schedule"]).rows, RowTau) and rows["tau"] < 1.0
    for method in (methods.AS_TRAINED, "log-length"):  # plain numbers: as before, no schedule field
        plain = _run_json(capsys, tiny_dir, "--method", method)
        assert "schedule" not in plain and "schedule_text" not in plain and isinstance(plain["tau"], float)
