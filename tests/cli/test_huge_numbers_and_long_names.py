"""Hostile values at the CLI's edges stay one line naming the option or the file and field (hardening, round four).

- A whole number no float holds (``gamma`` of ``10**400``, written by ``json.dumps``) was an internal error (exit 1,
  OverflowError): ``Param.check`` turned it into a float before comparing.
- A whole number of more than 4,300 digits got Python's message (``sys.set_int_max_str_digits``), naming neither the
  file nor the field; ``--scheme-params window=<5,000 digits>`` said "must be a whole number" (it is one).
- An unknown scheme name of 100,000 characters was echoed whole (a 100,165-byte line from a settings file), or cut
  at 300 characters on the command line, which dropped the list of names to choose from.
- The factor bound read "1e+06"; a settings file with a key given twice kept the last value silently.

Nothing here loads a model except the ``--scheme-params`` case (``mlm`` reads those after loading the bundled one).
"""

from __future__ import annotations

import json

import pytest

from core import cli
from core.errors import UserError
from core.runs import methods
from core.values import positions
from core.values.positions import Scheme

DIGITS = "7" * 5000
LONG_NAME = "x" * 100_000


def _line(capsys, argv) -> str:
    """Run the CLI in-process: exit 2 and exactly one short line on stderr, which is returned."""
    code = cli.main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err[-500:]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-500:]
    assert len(lines[0]) < 600, f"{len(lines[0]):,} characters: {lines[0][:200]}..."
    return lines[0]


def _settings(tmp_path, text: str):
    f = tmp_path / "settings.json"
    f.write_text(text)
    return f


# -- 1. a gamma no float holds ----------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [10**400, -(10**400)], ids=["huge", "huge-negative"])
def test_a_gamma_no_float_holds_is_one_line_naming_file_and_field(tmp_path, capsys, gamma):
    f = _settings(tmp_path, json.dumps({"method": "critical", "method_params": {"gamma": gamma}}))
    line = _line(capsys, ["run", "--tokens", "300", "--settings", str(f)])
    assert f"Settings file {f}" in line and "method_params" in line and "gamma" in line
    assert "401-digit" in line and "OverflowError" not in line


@pytest.mark.parametrize("gamma", [10**400, -(10**400), 10**5000], ids=["e400", "-e400", "e5000"])
def test_param_check_refuses_any_whole_number_out_of_bounds(gamma):
    param = methods.get("critical").param
    with pytest.raises(UserError, match="gamma must be a number in") as err:
        param.check(gamma)
    assert len(str(err.value)) < 120


# -- 2. over 4,300 digits -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, field",
    [
        ('{"scheme": "window", "scheme_params": {"window": @}}', "scheme_params.window"),
        ('{"method": "critical", "method_params": {"gamma": @}}', "method_params.gamma"),
        ('{"method": "critical", "method_params": {"gamma": -@}}', "method_params.gamma"),
        ('{"method": "fixed", "tau": [0.5, @]}', "tau[1]"),
    ],
    ids=["window", "gamma", "gamma-negative", "tau-list"],
)
def test_a_number_of_5000_digits_in_a_settings_file_names_file_and_field(tmp_path, capsys, content, field):
    f = _settings(tmp_path, content.replace("@", DIGITS))  # the number as JSON writes it
    line = _line(capsys, ["run", "--tokens", "300", "--settings", str(f)])
    assert f"Settings file {f}" in line and field in line and "5,000-digit" in line
    assert "set_int_max_str_digits" not in line


def test_scheme_params_of_5000_digits_say_too_large_naming_the_option(capsys):
    line = _line(capsys, ["mlm", "--schemes", "window", "--scheme-params", f"window={DIGITS}"])
    assert "--scheme-params" in line and "5,000-digit" in line and "too large" in line
    assert "must be a whole number (got" not in line


@pytest.mark.parametrize(
    "spec",
    [f"window:window={DIGITS}", f"window:window=-{DIGITS}", f"pi:factor={DIGITS}"],
    ids=["window", "window-negative", "factor"],
)
def test_a_scheme_text_of_5000_digits_is_out_of_bounds_not_a_bad_number(capsys, spec):
    line = _line(capsys, ["mlm", "--schemes", spec])
    assert "--schemes" in line and "5,000-digit" in line and "must be a whole number (got" not in line


@pytest.mark.parametrize("value", [10**5000, -(10**400), 10**50], ids=["e5000", "-e400", "e50"])
def test_a_scheme_given_a_huge_int_by_a_library_caller_is_a_user_error(value):
    with pytest.raises(UserError, match="window must be a whole number from 0 to 4,000,000") as err:
        Scheme.of("window", {"window": value})
    assert len(str(err.value)) < 120


# -- 3. a long unknown name ---------------------------------------------------------------------------------------


def test_a_long_unknown_scheme_in_a_settings_file_is_quoted_short_then_the_choices(tmp_path, capsys):
    f = _settings(tmp_path, json.dumps({"scheme": LONG_NAME}))
    line = _line(capsys, ["run", "--tokens", "300", "--settings", str(f)])
    assert f"Settings file {f}" in line and "scheme" in line
    assert "choose from " + ", ".join(positions.AVAILABLE) in line


def test_a_long_unknown_scheme_on_the_command_line_keeps_the_choices(capsys):
    line = _line(capsys, ["mlm", "--schemes", LONG_NAME])
    assert "--schemes" in line and "choose from " + ", ".join(positions.AVAILABLE) in line


def test_a_long_unknown_method_is_quoted_short():
    with pytest.raises(UserError) as err:
        methods.get(LONG_NAME)
    assert len(str(err.value)) < 400 and "choose from" in str(err.value)


def test_a_long_unrecognized_argument_is_quoted_short(capsys):
    line = _line(capsys, ["run", "--tokens", "300", "--no-such-option", LONG_NAME])
    assert "unrecognized arguments: --no-such-option xxx" in line and line.endswith("--help)")


# -- 6. small ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["yarn-rope:factor=1e9", "pi:factor=0", "ntk:factor=-3"])
def test_the_factor_bound_is_written_out(capsys, spec):
    line = _line(capsys, ["mlm", "--schemes", spec])
    assert "at most 1,000,000" in line and "e+06" not in line


@pytest.mark.parametrize(
    "content, key, inside",
    [
        ('{"method": "fixed", "method": "nope"}', "method", ""),
        ('{"method": "fixed", "tau": 0.8, "tau": 0.5}', "tau", ""),
        ('{"document": {"tokens": 300, "tokens": 0}}', "tokens", "document"),
    ],
)
def test_a_key_given_twice_in_a_settings_file_is_refused(tmp_path, capsys, content, key, inside):
    f = _settings(tmp_path, content)
    line = _line(capsys, ["run", "--settings", str(f)])
    assert f"Settings file {f}" in line and f"key '{key}' is given twice" in line and inside in line
