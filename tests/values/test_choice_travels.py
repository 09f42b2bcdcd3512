"""Issue 46: one value carries a run's choices from each edge to the attention.

A choice (method, tau schedule, targets, CosScale, position scheme) is made
into a :class:`core.values.choice.Choice` once, where it enters: the CLI's options,
a settings file, a link's ``?tau=``, the app's slider, ``core.runs.apply``. Each
test here follows one choice from its edge and checks that what the attention
function reads in its call (``attention.current_call().choice``) is
*the same object* the edge made, not a copy rebuilt on the way.

The spy replaces the function transformers' ``AttentionInterface`` holds under
our name, so it sees exactly what the model's attention layers see, and calls
the real function.
"""

from __future__ import annotations

import json

import pytest
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from conftest import app_ok
from core.kinds import ATTN_NAME
from core.mechanics import attention
from core.runs.settings import Settings
from core.values.choice import Choice
from core.values.schedule import Schedule


@pytest.fixture
def arrived(monkeypatch):
    """The choices the attention function was called with, in order (encoder calls only), not counting the app's
    background grid thread: an app test module before this one may have left it computing another document."""
    import threading

    seen: list[Choice] = []
    real = ALL_ATTENTION_FUNCTIONS[ATTN_NAME]

    def spy(module, *args, **kwargs):
        call = attention.current_call()
        if (
            call is not None
            and attention.attention_kind(module) == "encoder"
            and threading.current_thread().name != "aae-prefetch"
        ):
            seen.append(call.choice)
        return real(module, *args, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, ATTN_NAME, spy)
    return seen


@pytest.fixture
def made(monkeypatch):
    """The Choice each Settings converted to at an edge (the CLI's options, a file), in order."""
    out: list[Choice] = []
    real = Settings.to_choice

    def spy(self, *args, **kwargs):
        made = real(self, *args, **kwargs)
        out.append(made)
        return made

    monkeypatch.setattr(Settings, "to_choice", spy)
    return out


def _same_object(arrived: list, made: Choice) -> None:
    assert arrived, "the attention was never called with a choice"
    assert all(c is made for c in arrived), [c for c in arrived if c is not made][:1]


def test_from_the_cli_options(tiny_dir, arrived, made, capsys):
    from core.cli import main

    assert main(["run", "--model", str(tiny_dir), "--tokens", "300", "--tau", "0.7", "--json"]) == 0
    *_, choice = made  # the run's own (before it: the settings at tau = 1, for the CLI's checks)
    assert float(choice.tau) == 0.7 and choice.method == "fixed"
    _same_object(arrived, choice)


def test_from_a_settings_file(tiny_dir, tmp_path, arrived, made, capsys):
    from core.cli import main

    f = tmp_path / "choice.json"
    f.write_text(json.dumps({"method": "fixed", "tau": [0.8, 0.6], "targets": ["encoder"]}))
    assert main(["run", "--model", str(tiny_dir), "--tokens", "300", "--settings", str(f), "--json"]) == 0
    *_, choice = made  # the run's own (before it: the settings at tau = 1, for the CLI's checks)
    assert choice.tau == Schedule.of([0.8, 0.6])
    _same_object(arrived, choice)


def test_from_core_apply(tiny, arrived):
    from core.runs.apply import apply

    ids = tiny.tokenizer("the pass key is 4711. " * 10, return_tensors="pt").input_ids
    chosen = Settings(method="fixed", tau=0.6)
    with apply(tiny.model, settings=chosen) as choice:
        tiny.model.get_encoder()(input_ids=ids)
    assert choice is chosen.to_choice()  # the file's value, handed on
    _same_object(arrived, choice)
    arrived.clear()
    with apply(tiny.model, tau=0.9) as choice:
        tiny.model.get_encoder()(input_ids=ids)
    _same_object(arrived, choice)


@pytest.fixture
def contexts(monkeypatch):
    """The Choice each page run's state carried (what the temperature controls made from the slider / link)."""
    from ui.page_state import PageState

    out: list[Choice] = []
    real = PageState.with_choice

    def spy(self, choice, *rest):
        out.append(choice)
        return real(self, choice, *rest)

    monkeypatch.setattr(PageState, "with_choice", spy)
    return out


def _made_by_the_sidebar(arrived: list, contexts: list, tau: float) -> None:
    """Every pass at ``tau`` ran with a Choice the sidebar made in some run (the same object): which run made the
    pass depends on when the frame was computed (a later run finds it cached and runs nothing)."""
    ours = [c for c in arrived if c.tau == Schedule.of(tau)]
    assert ours, f"no pass at tau = {tau}"
    assert all(any(c is m for m in contexts) for c in ours), "a pass ran with a rebuilt choice"


def test_from_a_link_and_from_the_slider(env, arrived, contexts):
    """A link's ``tau=`` and then the slider (what the scrubber's release writes), each off the grid so Explore
    computes the exact frame: the pass's choice is the one the sidebar made, not a copy."""
    from streamlit.testing.v1 import AppTest

    from support.app import APP, fragment_run

    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params.update({"method": "fixed", "tau": "0.63", "tokens": "300"})
    at.run()
    app_ok(at)
    fragment_run(at)
    app_ok(at)
    _made_by_the_sidebar(arrived, contexts, 0.63)

    at.session_state["tau_value"] = 0.57  # the scrubber's release: the slider's new value
    fragment_run(at)
    app_ok(at)
    _made_by_the_sidebar(arrived, contexts, 0.57)
