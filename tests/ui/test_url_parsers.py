"""The URL's parsers (ui.url.PARAMS) over arbitrary query values: a value in range, or a ValueError with a reason.

Why property-based: a link is typed or pasted by anyone, and issue 36 found
``tokens=inf``, ``depth=-inf``, ``seed=1e400`` and ``tokens=infx`` stopping
the page with an OverflowError that the page's one message never caught.
Every parser must either return a value the widgets accept or refuse with
a ValueError (listed in that message); nothing else may escape.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.data import tasks
from core.runs import methods
from core.values import positions
from ui import choices, url

#: Number-like text: what a person (or a probe) writes for a number, overflowing ones included.
_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda x: f"{x:g}"),
    st.integers(min_value=-(10**400), max_value=10**400).map(str),
    st.builds(lambda m, e: f"{m}e{e}", st.integers(-99, 99), st.integers(-500, 500)),
    st.sampled_from(
        [
            "inf",
            "-inf",
            "+inf",
            "Infinity",
            "nan",
            "-nan",
            "NaN",
            "1e400",
            "-1e400",
            "1e-400",
            "1_000",
            " 512 ",
            "0x10",
            "١٢",
            "",
            " ",
            "x",
            "8x",
            "infx",
            "nanx",
            "1e400x",
            "-1x",
            "65x",
            "\x00",
            "1\x00",
        ]
    ),
)
_VALUES = st.one_of(
    _NUMBERS, _NUMBERS.map(lambda v: v + "x"), st.text(max_size=60), st.text(min_size=280, max_size=320)
)


def _in_range(name: str, value) -> bool:
    """Whether ``value`` is something the widget behind parameter ``name`` accepts."""
    if name == "model":
        return isinstance(value, str) and 0 < len(value) <= 300 and value == value.strip() and value.isprintable()
    if name == "task":
        return value in tasks.GENERATED
    if name == "tokens":
        if isinstance(value, str):
            return value.endswith("x") and 1 <= int(value[:-1]) <= 64
        return type(value) is int and 16 <= value <= 4_000_000
    if name == "depth":
        return type(value) is int and 0 <= value <= 100 and value % 5 == 0
    if name == "seed":
        return type(value) is int and 0 <= value <= 10**9
    if name == "filler":
        return value in choices.HAYSTACK_CHOICES
    if name == "method":
        return value in methods.NAMES
    if name == "tau":
        return (
            isinstance(value, float) and choices.SLIDER_MIN <= value <= choices.SLIDER_MAX and value == round(value, 2)
        )
    if name == "s":
        return (
            isinstance(value, float)
            and math.isfinite(value)
            and value >= choices.COS_MIN
            and (value / choices.COS_STEP).is_integer()
        )
    if name == "scheme":  # an available Scheme, its one text read back to itself, its numbers finite
        if not isinstance(value, positions.Scheme):
            return False
        return (
            value.entry.available
            and positions.Scheme.of(value.spell()) == value
            and all(math.isfinite(v) for _, v in value.params)
        )
    if name in choices.METHOD_PARAM_KEYS:  # a method's own number (gamma): a finite float in its Param's bounds
        param = methods.get(methods.takers(name)[0]).param
        return isinstance(value, float) and math.isfinite(value) and param.low <= value <= param.high
    raise AssertionError(f"a parameter this test does not know: {name}")


def test_every_parameter_is_covered():
    assert set(url.PARAMS) == {
        "model",
        "task",
        "tokens",
        "depth",
        "seed",
        "filler",
        "method",
        "tau",
        "s",
        "scheme",
        "gamma",
    }


@pytest.mark.parametrize("name", sorted(url.PARAMS))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=_VALUES)
@example(raw="inf")
@example(raw="-inf")
@example(raw="1e400")
@example(raw="infx")
@example(raw="1e308")
def test_a_parser_returns_a_value_in_range_or_refuses(name, raw):
    _, parse = url.PARAMS[name]
    try:
        value = parse(raw)
    except ValueError as err:  # the refusal the page lists in its one message; any other exception fails here
        assert str(err) and "\n" not in str(err)
        return
    assert _in_range(name, value), (name, raw, value)


@pytest.mark.parametrize(
    "name, raw",
    [
        ("tokens", "inf"),
        ("depth", "-inf"),
        ("seed", "1e400"),
        ("tokens", "infx"),
        ("s", "1e308"),
        ("tau", "nan"),
        ("model", "a\x00b"),
    ],
)
def test_the_issues_values_are_refused(name, raw):
    with pytest.raises(ValueError):
        url.PARAMS[name][1](raw)


@pytest.mark.parametrize(
    "name, raw, value",
    [
        ("tokens", "2048", 2048),
        ("tokens", "8x", "8x"),
        ("depth", "33", 35),
        ("seed", "1e3", 1000),
        ("tau", "0.704", 0.7),
        ("s", "24.3", 24.5),
    ],
)
def test_ordinary_values_still_parse(name, raw, value):
    assert url.PARAMS[name][1](raw) == value


_SCHEME_TEXT = st.one_of(
    st.sampled_from(positions.NAMES + ("Window", "window ", "win", "none:window=2", "alibi:window=2", "")),
    st.builds(
        lambda n, k, v: f"{n}:{k}={v}",
        st.sampled_from(positions.NAMES),
        st.sampled_from(["window", "sinks", "cap", "factor", "attention_factor", "bogus", ""]),
        _NUMBERS,
    ),
    st.builds(lambda a, b: f"{a}:{b}", st.text(max_size=20), st.text(max_size=20)),
)


@settings(max_examples=400, deadline=None)
@given(raw=_SCHEME_TEXT)
@example(raw="pi:factor=0.5")
@example(raw="lm-infinite:cap=0")
@example(raw="window:window=1e400")
@example(raw="pose")
def test_a_scheme_in_a_link_is_one_known_scheme_or_one_reason(raw):
    try:
        value = url.PARAMS["scheme"][1](raw)
    except ValueError as err:
        assert str(err) and "\n" not in str(err)
        return
    assert isinstance(value, positions.Scheme) and _in_range("scheme", value), (raw, value)
    value.bind(64, 256)  # runs on a model


@pytest.mark.parametrize(
    "raw, value",
    [
        ("window", "window"),
        ("window:window=32", "window:window=32"),
        ("lm-infinite:sinks=2:window=8", "lm-infinite:window=8:sinks=2"),
        ("yarn-rope:attention_factor=1", "yarn-rope:attention_factor=1"),
    ],
)
def test_schemes_parse_to_their_one_text(raw, value):
    scheme = url.PARAMS["scheme"][1](raw)
    assert scheme.spell() == value and scheme == positions.Scheme.of(value)  # the one value, whatever the spelling


@pytest.mark.parametrize(
    "raw",
    [
        "bogus",
        "alibi",
        "pose",
        "pi:factor=0.5",
        "lm-infinite:cap=0",
        "window:sinks=2",
        "window:window=-1",
        "pi:factor=inf",
        "window\n",
    ],
)
def test_bad_schemes_are_refused(raw):
    with pytest.raises(ValueError):
        url.PARAMS["scheme"][1](raw)
