"""Issue 48: critical scaling's gamma in every list of methods, and the app's gamma box.

``sweep`` and ``perplexity`` take ``--gamma`` as ``run`` and ``calibrate`` do: the value reaches every cell of
``critical`` (its tau is 1 / (gamma ln L)), the rows name it (``critical:gamma=0.25``), a resumed CSV at another
gamma runs its own rows instead of taking the first gamma's as done, and a bad value or a list where no method takes
it is one line and exit 2. ``sweep --data`` (a batch run) takes it too. In the app, the Method box's ``critical``
shows a gamma input whose value goes into the resolve; Calibrate's "Export as fixed tau" of adaptive temperature
says what runs. The CLI through its ``main``, the app through AppTest, on the tiny T5 the tests build.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from core import cli
from core.runs import methods, temperature
from core.runs.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 180
CRITICAL = next(n for n, m in methods.REGISTRY.items() if m.param is not None and m.param.name == "gamma")


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _rows(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, keep_default_na=False)


# -- sweep --------------------------------------------------------------------------------------------------------


def test_sweep_gamma_reaches_critical_and_names_it_in_the_rows(tiny_dir, capsys, tmp_path):
    out = tmp_path / "s.csv"
    base = ("sweep", "--model", tiny_dir, "--lengths", 300, "--methods", f"none,{CRITICAL}", "--out", out)
    code, _, err = _cli(capsys, *base, "--gamma", 0.25)
    assert code == 0, err
    rows = _rows(out)
    assert list(rows["method"]) == ["none", f"{CRITICAL}:gamma=0.25"]
    crit = rows.iloc[1]
    assert crit["tau"] == pytest.approx(1 / (0.25 * math.log(crit["actual_tokens"])), rel=1e-6)
    # resumed at another gamma: its own rows run (not taken as done), the first gamma's stay, none is not rerun
    code, _, err = _cli(capsys, *base, "--gamma", 0.5, "--resume")
    assert code == 0, err
    rows = _rows(out)
    assert list(rows["method"]) == ["none", f"{CRITICAL}:gamma=0.25", f"{CRITICAL}:gamma=0.5"]
    assert rows.iloc[2]["tau"] == pytest.approx(1 / (0.5 * math.log(rows.iloc[2]["actual_tokens"])), rel=1e-6)
    # and without --gamma: the default from L_tr, named plainly
    code, _, err = _cli(capsys, *base, "--resume")
    assert code == 0, err
    last = _rows(out).iloc[-1]
    assert last["method"] == CRITICAL
    n = last["actual_tokens"]
    assert last["tau"] == pytest.approx(1 / (temperature.critical_gamma(256) * math.log(n)), rel=1e-6)


def test_sweep_data_gamma_reaches_critical(tiny_dir, capsys, tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text(
        json.dumps(
            {
                "id": "a",
                "text": "The pass key is 12345. " * 40,
                "question": "What is the pass key?",
                "expected": "12345",
            }
        )
        + "\n",
        encoding="utf-8",
    )
    out = tmp_path / "b.csv"
    code, _, err = _cli(
        capsys, "sweep", "--model", tiny_dir, "--data", data, "--methods", CRITICAL, "--gamma", 0.25, "--out", out
    )
    assert code == 0, err
    (row,) = _rows(out).to_dict("records")
    assert row["setting"] == f"{CRITICAL}:gamma=0.25" and row["method"] == CRITICAL
    assert float(row["tau"]) == pytest.approx(1 / (0.25 * math.log(row["tokens"])), rel=1e-5)


# -- perplexity -----------------------------------------------------------------------------------------------------


def test_perplexity_gamma_reaches_critical(tiny_dir, capsys):
    code, out, err = _cli(
        capsys,
        "perplexity",
        "--model",
        tiny_dir,
        "--lengths",
        64,
        "--sequences",
        2,
        "--continuation",
        8,
        "--methods",
        f"none,{CRITICAL}",
        "--gamma",
        0.25,
        "--json",
    )
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["method"] for r in rows] == ["none", f"{CRITICAL}:gamma=0.25"]
    assert rows[1]["tau"] == pytest.approx(1 / (0.25 * math.log(64)), rel=1e-5)
    assert rows[1]["perplexity"] != rows[0]["perplexity"]  # the gamma reached the attention


# -- mlm (the rotary masked-token table) ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rope_dir(tmp_path_factory):
    from conftest import build_tiny_rope

    return build_tiny_rope(tmp_path_factory.mktemp("gamma-rope"), layers=1, hidden=32, train_length=32, seed=3)


def test_mlm_gamma_reaches_critical_names_it_and_resumes_per_gamma(rope_dir, capsys, tmp_path):
    out = tmp_path / "m.csv"
    base = (
        "mlm",
        "--model",
        rope_dir,
        "--lengths",
        "1x,2x",
        "--sequences",
        2,
        "--methods",
        f"none,{CRITICAL}",
        "--out",
        out,
    )
    code, _, err = _cli(capsys, *base, "--gamma", 0.25)
    assert code == 0, err
    rows = _rows(out)
    assert list(rows["method"]) == ["none", f"{CRITICAL}:gamma=0.25"] * 2
    for _, r in rows[rows["method"] != "none"].iterrows():  # 1 / (gamma ln n) at each length, L_tr included
        assert r["tau"] == pytest.approx(1 / (0.25 * math.log(r["tokens"])), rel=1e-5)
    # another gamma resumed into the same CSV runs its own cells; none is not run again
    code, _, err = _cli(capsys, *base, "--gamma", 0.5, "--resume")
    assert code == 0, err
    rows = _rows(out)
    assert list(rows["method"]).count("none") == 2 and list(rows["method"])[-2:] == [f"{CRITICAL}:gamma=0.5"] * 2
    assert rows.iloc[-1]["tau"] == pytest.approx(1 / (0.5 * math.log(64)), rel=1e-5)


# -- settings files ------------------------------------------------------------------------------------------------


def _settings_file(tmp_path: Path, **fields) -> Path:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"method": CRITICAL, "method_params": {"gamma": 0.25}, **fields}), encoding="utf-8")
    return path


def test_a_settings_files_gamma_resolves_its_method_at_any_length(tiny_dir, capsys, tmp_path):
    """A file exported with critical at gamma 0.25 runs at gamma 0.25 (not the default from L_tr) wherever the
    method is resolved again; a stored tau is used at the length it was chosen at; --gamma wins over the file's,
    and another method (--method, --tau) does not inherit it."""
    f = _settings_file(tmp_path)
    code, out, err = _cli(capsys, "run", "--model", tiny_dir, "--settings", f, "--tokens", 300, "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["gamma"] == 0.25 and got["tau"] == pytest.approx(1 / (0.25 * math.log(got["tokens"])), rel=1e-5)
    # a stored tau at its own length is used as is (the file says where it was chosen)
    stored = _settings_file(tmp_path, tau=0.61, chosen_at=got["tokens"], document={"tokens": 300})
    code, out, err = _cli(capsys, "run", "--model", tiny_dir, "--settings", stored, "--json")
    assert code == 0, err
    assert json.loads(out)["tau"] == pytest.approx(0.61)
    # --gamma over the file's, and re-resolved even where a tau was stored
    code, out, err = _cli(capsys, "run", "--model", tiny_dir, "--settings", stored, "--gamma", 0.5, "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["gamma"] == 0.5 and got["tau"] == pytest.approx(1 / (0.5 * math.log(got["tokens"])), rel=1e-5)
    # another method does not take the file's gamma (and is not refused for it: the file is valid)
    code, out, err = _cli(capsys, "run", "--model", tiny_dir, "--settings", f, "--tau", 0.8, "--tokens", 300, "--json")
    assert code == 0, err
    assert json.loads(out)["tau"] == pytest.approx(0.8)
    # a sweep of the file's document lists critical at the file's gamma
    out_csv = tmp_path / "rows.csv"
    code, _, err = _cli(
        capsys,
        "sweep",
        "--model",
        tiny_dir,
        "--settings",
        f,
        "--lengths",
        300,
        "--methods",
        f"none,{CRITICAL}",
        "--out",
        out_csv,
    )
    assert code == 0, err
    assert list(_rows(out_csv)["method"]) == ["none", f"{CRITICAL}:gamma=0.25"]


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"method": "fixed", "tau": 0.8}, "method_params: gamma: only critical takes it (the method here is fixed)"),
        ({"method_params": {"gamma": -1}}, "method_params: gamma must be a number in 0.001 .. 100, got -1"),
        ({"method_params": {"gamma": True}}, "method_params: gamma must be a number in 0.001 .. 100, got True"),
        ({"method_params": {"beta": 1}}, "method_params: no method takes a parameter 'beta'"),
    ],
)
def test_a_bad_method_param_in_a_settings_file_is_one_line(tiny_dir, capsys, tmp_path, fields, says):
    f = _settings_file(tmp_path, **fields)
    code, out, err = _cli(capsys, "run", "--model", tiny_dir, "--settings", f)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and says in err, err


def test_settings_files_keep_their_method_params_through_json():
    s = Settings(method=CRITICAL, method_params={"gamma": 0.25})
    assert Settings.from_dict(json.loads(s.to_json())) == s
    assert Settings.from_dict({"method": CRITICAL}).method_params == {}  # a file from before: the default


# -- bad values: one line, exit 2 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, says",
    [
        (("sweep", "--methods", CRITICAL, "--gamma", "-1"), "--gamma: a number in 0.001 .. 100, got '-1'"),
        (("sweep", "--methods", CRITICAL, "--gamma", "abc"), "--gamma: a number, got 'abc'"),
        (
            ("sweep", "--methods", "none,yarn", "--gamma", "0.2"),
            f"--gamma: only --methods {CRITICAL} takes it (the methods here are none, yarn)",
        ),
        (
            ("sweep", "--gamma", "0.2"),
            f"--gamma: only --methods {CRITICAL} takes it (the methods here are {', '.join(methods.SWEEP_DEFAULT)})",
        ),
        (("sweep", "--methods", "tau=0.8", "--gamma", "0.2"), "(the method here is tau=0.8)"),
        (("perplexity", "--methods", CRITICAL, "--gamma", "nan"), "--gamma: a number in 0.001 .. 100"),
        (("perplexity", "--gamma", "0.2"), f"--gamma: only --methods {CRITICAL} takes it"),
        (
            ("mlm", "--gamma", "0.2"),
            f"--gamma: only --methods {CRITICAL} takes it (the methods here are {', '.join(methods.SWEEP_DEFAULT)})",
        ),
        (("mlm", "--methods", CRITICAL, "--gamma", "0"), "--gamma: a number in 0.001 .. 100"),
    ],
)
def test_a_bad_gamma_in_a_list_is_one_line_and_exit_2(tiny_dir, capsys, argv, says):
    code, out, err = _cli(capsys, argv[0], "--model", tiny_dir, "--lengths", 300, *argv[1:])
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and says in err, err


def test_sweep_data_refuses_gamma_for_a_fixed_tau(tiny_dir, capsys, tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"text": "x " * 40, "question": "q?"}) + "\n", encoding="utf-8")
    code, _, err = _cli(capsys, "sweep", "--model", tiny_dir, "--data", data, "--tau", 0.8, "--gamma", 0.2)
    assert code == 2 and "--gamma: only --method critical takes it (the method here is fixed)" in err, err


def test_the_sweep_page_names_a_rows_gamma():
    pytest.importorskip("streamlit")
    from ui.sweep_views import method_text

    assert method_text(f"{CRITICAL}:gamma=0.25") == f"{methods.label(CRITICAL)} (gamma=0.25)"


def test_a_plan_refuses_a_gamma_it_would_not_use():
    from core.errors import UserError
    from core.experiments.sweep import SweepPlan

    plan = SweepPlan("m", "passkey", [300], [0.5], [0], ["none"], params={"gamma": 0.2})
    with pytest.raises(UserError, match="Bad sweep option: gamma: only critical takes it"):
        plan.validated()
    with pytest.raises(UserError, match=r"Bad sweep option: gamma must be a number in 0.001 .. 100"):
        SweepPlan("m", "passkey", [300], [0.5], [0], [CRITICAL], params={"gamma": 1e9}).validated()


# -- the app --------------------------------------------------------------------------------------------------------


def _calibrate_page():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app_pages" / "calibrate.py"), default_timeout=TIMEOUT)
    at.session_state["doc_tokens"] = 600
    at.run()
    if any(b.key == "cal_run" for b in at.button):  # the search runs on request
        at.button(key="cal_run").click().run()
    return at


def _shown(at) -> str:
    return " ".join(c.value for c in [*at.caption, *at.sidebar.caption])


def _exported(at) -> dict:
    return json.loads(next(c.value for c in at.code if c.language == "json"))


def test_the_apps_gamma_box_reaches_the_resolved_tau(env):
    from conftest import app_ok

    at = _calibrate_page()
    app_ok(at)
    assert "tau_gamma" not in [n.key for n in at.sidebar.number_input]  # only where critical is picked
    at.sidebar.selectbox(key="tau_method").set_value(CRITICAL).run()
    app_ok(at)
    box = at.sidebar.number_input(key="tau_gamma")
    param = methods.get(CRITICAL).param
    assert (box.min, box.max) == (param.low, param.high)  # the registry's bounds
    assert box.value is None and f"{param.default(256):.4g} (default)" == box.proto.placeholder
    n = int(at.session_state["doc_tokens"])
    default_tau = 1 / (param.default(256) * math.log(n))
    assert f"resolves to **tau = {default_tau:.3f}** (gamma = {param.default(256):.4g}, the default" in _shown(at)
    box.set_value(0.25).run()
    app_ok(at)
    want = 1 / (0.25 * math.log(n))
    assert f"resolves to **tau = {want:.3f}** (gamma = 0.25)" in _shown(at), _shown(at)
    # Calibrate's table lists critical at that gamma too (as `calibrate --gamma` does)
    table = next(d.value for d in at.dataframe if "label" in d.value.columns and "note" in d.value.columns)
    assert table.loc[table["method"] == CRITICAL, "tau"].item().startswith(f"{want:.4f}")
    # and Calibrate's export of critical as a fixed tau holds that tau
    at.session_state["cal_pick"] = CRITICAL
    at.run()
    got = Settings.from_dict(_exported(at))
    assert got.method == methods.FIXED and got.tau.scalar == pytest.approx(want, rel=1e-6)
    assert got.method_params == {}  # a fixed tau holds the gamma's result, not the gamma
    # exported as the method, the file keeps the gamma it was resolved with (re-resolved at other lengths with it)
    at.radio(key="cal_export").set_value(at.radio(key="cal_export").options[1]).run()
    app_ok(at)
    got = Settings.from_dict(_exported(at))
    assert got.method == CRITICAL and got.method_params == {"gamma": 0.25}, got


def test_export_as_fixed_tau_of_adaptive_says_adaptive(env):
    from conftest import app_ok

    adaptive = next(n for n, m in methods.REGISTRY.items() if m.constant is not None and m.constant.adaptive)
    at = _calibrate_page()
    app_ok(at)
    at.selectbox(key="cal_pick").set_value(adaptive).run()
    at.radio(key="cal_export").set_value(at.radio(key="cal_export").options[0]).run()  # "fixed tau (used as is)"
    app_ok(at)
    got = _exported(at)
    assert got["method"] == adaptive, got  # it runs as adaptive: the file says so, not "fixed"
    assert Settings.from_dict(got).to_choice().tau.adaptive
    assert any("has no fixed tau" in i.value for i in at.info), [i.value for i in at.info]


def test_a_link_carries_a_gamma_the_person_set(env):
    """The address bar holds a gamma set in the box (and none at the default), a link with one opens with it in the
    box and its tau resolved from it, and a gamma outside the registry's bounds is the link's one message."""
    from streamlit.testing.v1 import AppTest

    from conftest import app_ok
    from support.app import APP, url_params

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.selectbox(key="tau_method").set_value(CRITICAL).run()
    app_ok(at)
    assert url_params(at)["method"] == CRITICAL and "gamma" not in url_params(at)  # the default travels as no number
    at.number_input(key="tau_gamma").set_value(0.25).run()
    app_ok(at)
    link = url_params(at)
    assert link["gamma"] == "0.25", link
    opened = AppTest.from_file(APP, default_timeout=TIMEOUT)
    opened.query_params.update(link)
    opened.run()
    app_ok(opened)
    assert opened.number_input(key="tau_gamma").value == pytest.approx(0.25)
    n = int(opened.session_state["doc_tokens"])
    assert f"resolves to **tau = {1 / (0.25 * math.log(n)):.3f}** (gamma = 0.25)" in _shown(opened), _shown(opened)
    param = methods.get(CRITICAL).param
    bad = AppTest.from_file(APP, default_timeout=TIMEOUT)
    bad.query_params.update({**link, "gamma": str(param.high * 10)})
    bad.run()
    assert not bad.exception
    (err,) = bad.sidebar.error
    assert "gamma=" in err.value and f"outside {param.low:g}-{param.high:g}" in err.value, err.value
