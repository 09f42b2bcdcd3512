"""Settings files carry the position scheme (core.runs.settings: ``scheme``, ``scheme_params``): exported and read back,
refused in one line naming the field, old files without them read as the plain scheme, passed on in the Choice, and a
non-plain scheme on a T5 model refused where the settings meet the model, before any work."""

from __future__ import annotations

import json

import pytest

from conftest import build_tiny_rope
from core.cli import main
from core.errors import UserError
from core.models import load
from core.runs.settings import Settings
from core.values import positions


@pytest.mark.parametrize(
    "scheme, params",
    [
        ("window", {"window": 32}),
        ("lm-infinite", {"window": 8, "sinks": 2, "cap": 16}),
        ("yarn-rope", {"attention_factor": 1.0}),
        ("pi", {"factor": 4}),
        ("rerope", {}),
    ],
)
def test_the_scheme_round_trips_through_the_exported_json(scheme, params):
    s = Settings(train_length=64, scheme=scheme, scheme_params=params)
    d = json.loads(s.to_json())
    assert d["scheme"] == scheme and d["scheme_params"] == params
    back = Settings.from_dict(d)
    assert back == s and back.scheme == scheme and dict(back.scheme_params) == params
    assert back.to_choice().scheme == s.to_choice().scheme == positions.Scheme.of(scheme, params)
    # positions stay whole numbers (a window of 32.0 would be refused by the scheme itself); factors are floats
    assert all(type(back.scheme_params[k]) is (int if k in positions.INT_PARAMS else float) for k in params)


def test_to_choice_carries_the_scheme():
    chosen = Settings(scheme="lm-infinite", scheme_params={"window": 8, "sinks": 2})
    c = chosen.to_choice(1.0)
    assert c is chosen.to_choice()  # the one value, made once and handed on, not rebuilt
    assert c.scheme is chosen.to_choice(0.5).scheme  # another tau: a new Choice, the same Scheme object
    assert c.scheme == positions.Scheme("lm-infinite", (("window", 8), ("sinks", 2)))
    assert Settings().to_choice().scheme == positions.PLAIN_SCHEME


def test_an_old_file_without_a_scheme_reads_as_the_plain_scheme(tmp_path):
    d = Settings.from_dict({"method": "tau=0.8"}).to_dict()
    d.pop("scheme")
    d.pop("scheme_params")
    f = tmp_path / "old.json"
    f.write_text(json.dumps(d))
    s = Settings.load(f)
    assert s.scheme == positions.PLAIN and dict(s.scheme_params) == {}
    assert s.to_dict()["scheme"] == positions.PLAIN and s.to_dict()["scheme_params"] == {}


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"scheme": "nope"}, "scheme: Unknown position scheme 'nope'"),
        ({"scheme": "pose"}, "scheme: Position scheme 'pose' is not available"),
        ({"scheme": "alibi"}, "scheme: Position scheme 'alibi' is not available"),
        ({"scheme": 5}, "scheme:"),
        (
            {"scheme": "window", "scheme_params": {"factor": 2}},
            "scheme_params: Position scheme 'window' takes window; not factor",
        ),
        ({"scheme_params": {"window": 4}}, "scheme_params: Position scheme 'none' takes no parameters"),
        (
            {"scheme": "window", "scheme_params": {"window": True}},
            "scheme_params: window: window must be a finite number",
        ),
        ({"scheme": "pi", "scheme_params": {"factor": "2"}}, "scheme_params: pi: factor must be a finite number"),
        ({"scheme": "pi", "scheme_params": {"factor": float("nan")}}, "scheme_params: pi: factor must be a finite"),
        (
            {"scheme": "window", "scheme_params": {"window": 10**400}},
            "scheme_params: window: window must be a whole number from 0 to",
        ),
        (
            {"scheme": "window", "scheme_params": {"window": 4_000_001}},
            "scheme_params: window: window must be a whole number from 0 to",
        ),
        ({"scheme": "pi", "scheme_params": {"factor": 0.5}}, "scheme_params: pi: factor must be a number >= 1"),
        (
            {"scheme": "window", "scheme_params": {"window": 3.5}},
            "scheme_params: window: window must be a whole number",
        ),
        ({"scheme": "window", "scheme_params": [32]}, "scheme_params: Input should be a JSON object"),
    ],
)
def test_bad_schemes_and_parameters_are_one_line_naming_the_field(fields, needle):
    with pytest.raises(UserError) as err:
        Settings(**fields)
    assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError) as err:  # and from a file's JSON
        Settings.from_dict({**Settings().to_dict(), **fields}, where="Settings file x.json")
    assert str(err.value).startswith("Settings file x.json: ") and needle in str(err.value)


def test_a_t5_model_with_a_scheme_is_refused_before_any_work(tiny, tiny_dir, tmp_path, capsys):
    from core.runs import rope_pass

    rope_pass.check(tiny, Settings(scheme=positions.PLAIN).to_choice().scheme)  # the plain scheme is every model's
    with pytest.raises(UserError, match="needs a rotary"):
        rope_pass.check(tiny, Settings(scheme="window").to_choice().scheme)
    f = tmp_path / "s.json"
    f.write_text(Settings(scheme="window", scheme_params={"window": 16}).to_json())
    assert main(["run", "--model", str(tiny_dir), "--settings", str(f), "--tokens", "300"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: Position scheme 'window' needs a rotary") and "\n" not in err


@pytest.mark.parametrize("command", ["sweep", "calibrate"])
def test_commands_that_run_no_scheme_refuse_one_rather_than_drop_it(tiny_dir, tmp_path, capsys, command):
    f = tmp_path / "s.json"
    f.write_text(Settings(scheme="pi", scheme_params={"factor": 2}).to_json())
    assert main([command, "--model", str(tiny_dir), "--settings", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert "scheme 'pi:factor=2'" in err and f"{command} runs the plain scheme only" in err and "\n" not in err


def test_a_rotary_model_takes_the_scheme(tmp_path):
    rope = load(str(build_tiny_rope(tmp_path / "rope", layers=1, hidden=32, train_length=16)), device="cpu")
    from core.runs import rope_pass

    rope_pass.check(rope, Settings(scheme="window", scheme_params={"window": 4}).to_choice().scheme)
    rope_pass.check(rope, Settings(scheme="yarn-rope", scheme_params={"factor": 8}).to_choice().scheme)
