"""The app's private Streamlit API stays in one module (ui/streamlit_private.py) and still answers as the app needs.

* every ``import streamlit.X`` / ``from streamlit.X import`` in the program's
  files (app.py, app_pages/, ui/, core/) other than the public ``streamlit``
  and ``streamlit.components.v1``/``v2`` is in ``ui/streamlit_private.py``;
* each function of that module, called inside a real AppTest run, answers
  what the app relies on: a full run is no fragment rerun and a fragment
  rerun is one, the session id is the same non-empty text in every run of a
  session, and the runtime tells an open session from a closed one. When Streamlit
  changes one of them, this fails here rather than in the scrubber or the
  background grid.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import browser_requests  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PRIVATE = ROOT / "ui" / "streamlit_private.py"
PROGRAM = [ROOT / "app.py"] + [p for d in ("app_pages", "ui", "core") for p in sorted((ROOT / d).rglob("*.py"))]
PUBLIC = re.compile(r"^streamlit(\.components\.v\d+)?$")


def streamlit_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a ``streamlit`` module in a file, at any depth (functions too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "streamlit"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "streamlit":
            mod = node.module
            # "from streamlit import x": x may itself be a submodule (runtime, testing...), public only if it is an API
            out += [(node.lineno, f"{mod}.{a.name}") if mod == "streamlit" else (node.lineno, mod) for a in node.names]
    return sorted(out)


def test_private_streamlit_imports_live_in_one_module():
    assert (ROOT / "app_pages").is_dir() and not (ROOT / "pages").exists(), "the pages' folder is app_pages/"
    outside = []
    for path in PROGRAM:
        if path == PRIVATE:
            continue
        for line, mod in streamlit_imports(path):
            if mod.startswith("streamlit.") and mod.count(".") == 1 and mod.split(".")[1] not in _SUBMODULES:
                continue  # "from streamlit import fragment": a public name of the package
            if not PUBLIC.match(mod):
                outside.append(f"{path.relative_to(ROOT)}:{line}: {mod}")
    assert not outside, "private Streamlit imports outside ui/streamlit_private.py:\n" + "\n".join(outside)
    assert any(not PUBLIC.match(m) for _, m in streamlit_imports(PRIVATE)), "the module holds the private imports"


def test_the_listing_catches_a_private_import(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(
        "import streamlit as st\nimport streamlit.components.v2\n"
        "def g():\n    from streamlit.runtime.scriptrunner import get_script_run_ctx\n"
        "from streamlit import runtime\n"
    )
    mods = [m for _, m in streamlit_imports(f)]
    assert mods == ["streamlit", "streamlit.components.v2", "streamlit.runtime.scriptrunner", "streamlit.runtime"]
    assert [m for m in mods if not PUBLIC.match(m)] == ["streamlit.runtime.scriptrunner", "streamlit.runtime"]


#: Submodules of the streamlit package ("from streamlit import runtime" imports one of them, not a public name).
_SUBMODULES = {
    p.stem if p.is_file() else p.name
    for p in Path(__import__("streamlit").__file__).parent.iterdir()
    if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
}


# -- the functions, inside a real run ----------------------------------------------------------

APP = """
import streamlit as st
from ui import streamlit_private as sp

st.session_state.setdefault("log", [])

@st.fragment
def part():
    st.session_state["log"].append(("fragment", sp.in_fragment_rerun(), sp.session_id(), sp.history_navigation()))
    st.button("again", key="again")

st.session_state["log"].append(("full", sp.in_fragment_rerun(), sp.session_id(), sp.history_navigation()))
part()
"""


def test_each_private_function_answers_as_the_app_needs(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    at = AppTest.from_string(APP, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    (fid,) = at._fragment_storage._fragments
    with browser_requests(fragment_id_queue=[fid]):  # a fragment's rerun, as the browser asks for one
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    with browser_requests(is_history_navigation=True):  # the back button, as the browser sends it
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    log = at.session_state["log"]
    kinds = [(kind, frag, back) for kind, frag, _, back in log]
    assert kinds == [
        ("full", False, False),
        ("fragment", False, False),
        ("fragment", True, False),
        ("full", False, True),
        ("fragment", False, True),
    ], log
    ids = {sid for _, _, sid, _ in log}
    assert len(ids) == 1 and isinstance(next(iter(ids)), str) and next(iter(ids)), "one session, one non-empty id"


def test_outside_a_run_they_answer_safely():
    from ui import streamlit_private as sp

    assert sp.in_fragment_rerun() is False
    assert sp.session_id() == ""
    assert sp.history_navigation() is False
    assert sp.session_alive("anything") is True
    t = __import__("threading").Thread(target=lambda: None)
    sp.share_run(t)  # nothing to share: the thread is left as it was
    t.start()
    t.join()


def test_a_real_runtime_tells_a_closed_session_from_an_open_one(monkeypatch):
    """``Runtime.exists()`` / ``Runtime.instance().is_active_session(id)``: what :func:`session_alive` reads."""
    from streamlit.runtime import Runtime

    from ui import streamlit_private as sp

    class Fake:
        def is_active_session(self, sid):
            return sid == "open"

    monkeypatch.setattr(Runtime, "exists", classmethod(lambda cls: True))
    monkeypatch.setattr(Runtime, "instance", classmethod(lambda cls: Fake()))
    assert sp.session_alive("open") is True and sp.session_alive("closed") is False
    # the real class still has what the module calls, with these names
    monkeypatch.undo()
    assert callable(Runtime.exists) and callable(Runtime.instance) and callable(Runtime.is_active_session)
