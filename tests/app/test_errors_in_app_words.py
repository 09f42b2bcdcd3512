"""Issue 36's app causes through AppTest: every refusal is one line in the page, in the app's words.

* (4) numbers that overflow in a link (``tokens=inf``, ``depth=-inf``,
  ``seed=1e400``, ``tokens=infx``): the link's one message, and the page
  still draws;
* (7) a pasted text (or question) past the machine's token limit: one error,
  no second one and no traceback from the views drawn after it;
* (14) no message names a command-line option or a path of the server;
* (6) a 260-character model name, typed or in a link: one error, no exception.

The app's default model is a tiny random T5 (ByT5 bytes: one token a byte).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import app_error_text, app_model_of, app_ok, scrubber_view  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
TIMEOUT = 120
#: A command-line option (``--tokens``) or an absolute path (``/srv/models``, ``~/x``) as a word of a message.
FLAG = re.compile(r"(?<![\w-])--[a-z]")
ABSOLUTE_PATH = re.compile(r"(?:^|[\s'\"(`=])(?:/|~/)[^\s'\"`)]")


app_model = app_model_of("errors-t5")


@pytest.fixture
def small_memory(monkeypatch):
    """A machine that holds 2,000 tokens: a pasted page of text is past its limit (the engine's own check)."""
    from core.runs import engine

    monkeypatch.setattr(engine, "max_tokens", lambda loaded, batch=1, chunk_bytes=0: 2000)


def _errors(at) -> list[str]:
    assert not at.exception, [e.value for e in at.exception]
    return [e.value for e in at.error]


def _clean(messages: list[str]) -> None:
    for m in messages:
        assert not FLAG.search(m), m
        assert not ABSOLUTE_PATH.search(m), m


# -- (4) numbers that overflow in the URL ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        {"tokens": "inf", "depth": "-inf", "seed": "1e400"},
        {"tokens": "infx"},
        {"seed": "-1e400", "tau": "inf", "depth": "nan"},
    ],
)
def test_overflowing_link_values_get_the_links_one_message(env, query):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(**query)
    at.run()
    (err,) = _errors(at)
    assert err.startswith("This link has values that cannot be used")
    for name in query:
        assert f"{name}=" in err, err
    assert at.session_state["doc_tokens"] == 256 and at.session_state["doc_seed"] == 0  # left as they were
    assert scrubber_view(at)[1]["pmax"] > 0, "the page still draws"
    _clean([err])


# -- (7) a pasted text past the token limit ------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["text", "question"])
def test_a_text_past_the_token_limit_is_one_error(env, small_memory, where):
    """The too-long document is refused once; the bias curves (switched on earlier) do not refuse it again."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    app_ok(at)
    at.toggle(key="ex_show_bias").set_value(True).run()  # the views after the temperature panel are drawn
    app_ok(at)
    at.sidebar.radio(key="doc_mode").set_value("Paste").run()
    if where == "text":
        at.sidebar.text_area(key="doc_text").input("The sky is blue. The grass is green. " * 200).run()
    else:
        at.sidebar.text_area(key="doc_text").input("The sky is blue. The grass is green. " * 4).run()
        at.sidebar.radio(key="doc_needle_mode").set_value("no needle, my question").run()
        at.sidebar.text_input(key="doc_question").input("What colour is the sky? " * 120).run()
    errors = _errors(at)
    assert len(errors) == 1, errors
    assert "at most about 2,000 tokens" in errors[0] and "Use a shorter document" in errors[0]
    _clean(errors)
    at.sidebar.radio(key="doc_mode").set_value("Generate").run()  # a shorter document: the page is back
    app_ok(at)
    assert scrubber_view(at)[1]["pmax"] > 0


# -- (14) the app's words: no option, no server path ---------------------------------------------------------------


def test_no_app_error_names_an_option_or_a_server_path(env, small_memory, tmp_path):
    """Several refusals, each in the app's words: an unknown name, a folder without a model, a folder with the
    wrong kind of model, a text past the limit, bad link values."""
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(
        tmp_path
    )
    seen: list[str] = []
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    for ref in ("no-such-model-xyz", "/etc", str(tmp_path), str(tmp_path / "missing" / "folder")):
        at.sidebar.text_input(key="model_other").input(ref).run()
        seen.append(app_error_text(at))
    at.sidebar.text_input(key="model_other").input("").run()
    at.sidebar.radio(key="doc_mode").set_value("Paste").run()
    at.sidebar.text_area(key="doc_text").input("The sky is blue. " * 200).run()
    seen.append(app_error_text(at))
    link = AppTest.from_file(APP, default_timeout=TIMEOUT)
    link.query_params.update(tokens="1e400", depth="-5", method="nope", s="inf", model="/srv/models/none")
    link.run()
    seen.append(app_error_text(link))
    assert len(seen) == 6 and all(seen)
    assert "Unknown model 'no-such-model-xyz'" in seen[0] and "not T5-family" in seen[2], seen
    _clean(seen)


# -- (6) a model name too long for a file name ---------------------------------------------------------------------

LONG_NAME = "m" * 260


@pytest.mark.parametrize("how", ["box", "link"])
def test_a_260_character_model_name_is_one_error(env, how):
    if how == "box":
        at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
        at.sidebar.text_input(key="model_other").input(LONG_NAME).run()
    else:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.query_params.update(model=LONG_NAME)
        at.run()
    errors = _errors(at)
    assert len(errors) == 1, errors
    _clean(errors)
