"""One Schedule value: checked once where it enters, the same object down to the attention, its matrix built once.

Property tests (hypothesis) over what a settings file, a CLI option, a URL or ``core.runs.apply`` may hand over: a
value is either a Schedule that reads back equal from its JSON, or a ValueError; never another exception
(an OverflowError from a 400-digit number, a ZeroDivisionError from a tau that is 0 in float32).
"""

from __future__ import annotations

import json
import math
import threading
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st_

from core.data import tasks
from core.mechanics import attention
from core.runs import engine
from core.values.choice import Choice
from core.values.schedule import MAX_ATTN_SCALE, ONE, TAU_MAX, TAU_MIN, RowTau, Schedule

finite_tau = st_.floats(min_value=TAU_MIN, max_value=TAU_MAX, allow_nan=False)
anything = st_.recursive(
    st_.none()
    | st_.booleans()
    | st_.integers(min_value=-(10**400), max_value=10**400)
    | st_.floats()
    | st_.text(max_size=5),
    lambda inner: st_.lists(inner, max_size=4) | st_.dictionaries(st_.text(max_size=12), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(anything)
def test_anything_is_a_schedule_or_one_value_error(value):
    try:
        s = Schedule.of(value)
    except ValueError as err:
        assert "\n" not in str(err)
        return
    assert Schedule.of(json.loads(json.dumps(s.to_json()))) == s
    if s.rows is None:
        m = s.matrix(*(s._values.shape if s.ndim == 2 else (len(s._values) if s.ndim == 1 else 3, 2)))
        assert np.all((m >= TAU_MIN) & (m <= TAU_MAX))


@settings(max_examples=100, deadline=None)
@given(
    st_.one_of(
        finite_tau,
        st_.lists(finite_tau, min_size=1, max_size=6),
        st_.integers(1, 4).flatmap(
            lambda h: st_.lists(st_.lists(finite_tau, min_size=h, max_size=h), min_size=1, max_size=5)
        ),
    )
)
def test_valid_schedules_round_trip_and_key_by_value(value):
    s = Schedule.of(value)
    again = Schedule.of(s.to_json())
    assert again == s and hash(again) == hash(s) and again.key() == s.key()
    assert Schedule.of(s) is s  # validated once: an existing Schedule passes through untouched
    assert s.mean() == pytest.approx(float(np.mean(value)))


@pytest.mark.parametrize(
    "bad",
    [
        0.0,
        -0.5,
        1e-46,
        1e-300,
        TAU_MIN / 2,
        TAU_MAX * 2,
        math.inf,
        math.nan,
        10**400,
        True,
        "0.5",
        None,
        [],
        [[]],
        [[0.5], [0.5, 0.5]],
        [[[0.5]]],
        {"floor_scale": 10**400},
        {"floor_scale": 8, "attn_scale": MAX_ATTN_SCALE * 2},
        {"floor_scale": 8, "extra": 1},
        torch.tensor([True]),
        np.array(["a"]),
    ],
)
def test_bad_values_are_refused_in_one_line(bad):
    with pytest.raises(ValueError) as err:
        Schedule.of(bad)
    assert "\n" not in str(err.value)


def test_shape_against_a_model():
    assert Schedule.of(0.7).matrix(3, 2).tolist() == [[0.7, 0.7]] * 3
    assert Schedule.of([0.9, 0.8]).matrix(2, 3).tolist() == [[0.9] * 3, [0.8] * 3]
    with pytest.raises(ValueError, match="per-layer tau needs 3"):
        Schedule.of([0.9, 0.8]).matrix(3, 2)
    with pytest.raises(ValueError, match=r"per-head tau needs shape \(2, 3\)"):
        Schedule.of([[0.9, 0.8]] * 2).matrix(2, 3)
    rows = Schedule.of(RowTau(floor_scale=16))
    with pytest.raises(ValueError, match="length"):
        rows.matrix(2, 2)
    assert rows.matrix(2, 2, rows=64)[0, 0] == pytest.approx(rows.mean(64)) and rows.mean(64) < 1
    assert ONE.is_one and not Schedule.of([1.0, 0.9]).is_one
    assert Schedule.of(0.8).matrix(2, 2).flags.writeable is False  # what every pass shares cannot be changed


def test_a_pass_builds_its_tau_matrix_once(tiny, monkeypatch):
    """The slider's tau reaches the attention as one Schedule: the engine checks it against the model, the
    attention reads each layer from the same object, the Result reports it; the matrix is built once."""
    built = []
    real = Schedule._build

    def counting(self, *args):
        if self is tau:  # this schedule's builds (another thread, e.g. the app's background grid, builds its own)
            built.append(args)
        return real(self, *args)

    monkeypatch.setattr(Schedule, "_build", counting)
    seen = []
    real_call_init = attention._Call.__init__

    here = threading.current_thread()

    def watch(self, *args, **kwargs):
        real_call_init(self, *args, **kwargs)
        if threading.current_thread() is here:  # this test's passes (not the app's background grid's)
            seen.append(self.choice.tau)

    monkeypatch.setattr(attention._Call, "__init__", watch)
    tau = Schedule.of([[0.8, 0.7, 0.9, 0.6], [0.75, 0.85, 0.65, 0.95]])  # per layer and head (tiny: 2 x 4)
    doc = tasks.make("passkey", tiny.tokenizer, 300, seed=3)
    res = engine.run(tiny, doc, Choice.of(tau=tau), engine.Pass(max_new_tokens=4))
    assert len(built) == 1, built
    assert seen and all(s is tau for s in seen)  # the same object, never rebuilt on the way
    assert res.tau.tolist() == tau.to_json()
    engine.run(tiny, doc, Choice.of(tau=tau), engine.Pass(max_new_tokens=4))
    assert len(built) == 1  # kept: a second pass with the same schedule builds nothing


def test_the_apps_context_hands_its_schedule_on_unchanged(tiny):
    """The slider's tau is made a Schedule once (ui.cache.resolve_tau) and the page's run settings carry that
    very object; a tau a page passes on (the grid's) becomes one there, once."""
    from core.runs.settings import DocumentRequest
    from core.values.choice import Choice
    from ui import cache
    from ui.page_state import PageState

    req = DocumentRequest(task="passkey", tokens=300, seed=4)
    schedule, _ = cache.resolve_tau(tiny, req, "fixed", tau=0.65)
    assert isinstance(schedule, Schedule) and float(schedule) == 0.65
    choice = Choice("fixed", schedule)
    ctx = PageState(
        loaded=tiny,
        model_ref="tiny",
        request=req,
        document=cache.document(tiny, req),
        tokens=300,
        choice=choice,
        tau_input=0.65,
    )
    got, _ = ctx.pair()
    assert got is choice and got.tau is schedule
    assert ctx.pair(tau=0.5)[0].tau == Schedule.of(0.5)


@pytest.mark.parametrize(
    "tau",
    [
        {"scheme": "llama4", "floor_scale": 256, "attn_scale": 1e300},
        {"scheme": "llama4", "floor_scale": 10**400},
        1e-46,
        10**400,
        [0.5, 1e-300],
    ],
)
def test_a_settings_file_with_a_tau_out_of_bounds_is_one_line(tmp_path, capsys, tau):
    """Issue 36 (causes 4, 5, 12): no OverflowError, no ZeroDivisionError, no numpy warning with a server path
    before the error, no word of float16: one line naming the field, exit 2, before any model is loaded."""
    from core.cli import main

    f = tmp_path / "s.json"
    f.write_text(json.dumps({"method": "fixed", "tau": tau}))
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning would print before the error line
        assert main(["run", "--settings", str(f), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and "tau" in err and "float16" not in err, err
