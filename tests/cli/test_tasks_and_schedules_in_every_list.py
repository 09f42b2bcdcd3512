"""Issue 48: the new tasks and schedules reach every list.

The Sweep page offers the RULER-style tasks (a sweep over one runs and scores); Theory and Calibrate show every
registry method the CLI's ``--method`` offers, with a per-row method's tau on each query row; the CLI's
``--gamma`` sets critical scaling's gamma (one line and exit 2 for a bad one). The app runs through AppTest on a
tiny T5 the tests build (tests/conftest.py), the CLI through its ``main``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import app_ok, sweep_one_cell  # noqa: E402
from core import cli  # noqa: E402
from core.data import tasks  # noqa: E402
from core.runs import methods, temperature  # noqa: E402
from core.values.schedule import QWEN_LOGN, RowTau, Schedule  # noqa: E402
from support.app import calibrate_at_600, open_page  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 180


# -- Sweep: the RULER-style tasks ------------------------------------------------------------------------------------


def test_the_sweep_page_offers_every_generated_retrieval_task():
    from ui import sweep_views

    assert set(tasks.RULER_TASKS) <= set(sweep_views.SWEEP_TASKS)
    assert set(tasks.TASKS) <= set(sweep_views.SWEEP_TASKS)


def test_a_ruler_task_is_swept_and_scored(env):
    at = open_page("sweep.py").run()
    app_ok(at)
    at.sidebar.selectbox(key="doc_task").set_value("vartrack")
    at.sidebar.number_input(key="doc_tokens").set_value(512).run()
    app_ok(at)
    assert "task `vartrack`" in " ".join(c.value for c in at.caption), "the plan names the sidebar's RULER task"
    sweep_one_cell(at, 2)
    app_ok(at)
    table = at.dataframe[0].value
    assert list(table.index) == [methods.label("none")] and list(table.columns) == [512]
    rows = pd.read_csv(at.session_state["sw_csv"])
    assert list(rows["task"]) == ["vartrack"] and list(rows["tokens"]) == [512]
    assert rows["correct"].isin([True, False]).all()  # scored by the task's own scorer
    assert rows["expected"].astype(str).str.fullmatch(r"\d+").all()  # vartrack's answer: the chain's number


# -- Theory and Calibrate: every method, a per-row one's tau per row -------------------------------------------------


def _row_methods() -> list[str]:
    return [n for n, m in methods.REGISTRY.items() if m.per == "row" and not m.measured]


def test_the_per_row_frame_is_each_schedules_own_taus():
    from ui import theory_views

    names = _row_methods()
    assert len(names) >= 2  # Llama 4 and Qwen's log-n by query position
    schedules = {"llama4": Schedule.of(RowTau(256)), "log-n-rows": Schedule.of(RowTau(256, scheme=QWEN_LOGN))}
    frame = theory_views.row_tau_frame(schedules, 2048, 256)
    rows = frame["query row"].to_numpy()
    assert rows[0] == 0 and rows[-1] == 2047 and {255, 256} <= set(rows) and len(rows) <= theory_views.ROW_POINTS + 2
    qwen = frame[methods.label("log-n-rows")].to_numpy()
    llama = frame[methods.label("llama4")].to_numpy()
    # by hand: rows up to L_tr - 1 keep 1; the last row of 8x gets ln 256 / ln 2048 = 8 / 11 (Qwen) and
    # 1 / (0.1 ln(1 + floor(2048 / 256)) + 1) = 1 / (0.1 ln 9 + 1) (Llama 4)
    assert (qwen[rows < 256] == 1).all() and (llama[rows < 255] == 1).all()
    assert qwen[-1] == pytest.approx(8 / 11) and llama[-1] == pytest.approx(1 / (0.1 * math.log(9) + 1))
    assert qwen[list(rows).index(256)] == pytest.approx(math.log(256) / math.log(257))


def _chart_traces(at: AppTest) -> set[str]:
    names = set()
    for el in at.get("plotly_chart"):
        spec = json.loads(el.proto.spec)
        names |= {t.get("name") for t in spec.get("data", [])}
    return names


def test_theory_lists_every_method_and_draws_the_per_row_ones(env):
    at = open_page("theory.py")
    at.session_state["doc_tokens"] = 600
    at.run()
    app_ok(at)
    traces = _chart_traces(at)
    for name in _row_methods():  # each per-row method's mean row tau over length
        assert f"{methods.get(name).short} (mean row tau)" in traces, (name, traces)
    for name in methods.FORMULAS:
        if not methods.get(name).stats:
            assert any(t and t.startswith(methods.get(name).short) for t in traces), (name, traces)
    listed = [d.value for d in at.dataframe if "on this page" in d.value.columns]
    assert listed, "the page lists every method"
    assert list(listed[0]["name"]) == [f"`{n}`" for n in methods.NAMES]  # the CLI's --method list, in its order
    charts = at.get("vega_lite_chart")
    assert charts, "a per-row chart (tau on each query row)"
    assert any("tau per query row" in m.value and "600 rows" in m.value for m in at.markdown)


def test_calibrate_lists_every_method_with_the_per_row_ones(env, tiny):
    at, table = calibrate_at_600()
    shown = list(table["method"])
    missing = " ".join(c.value for c in at.caption if c.value.startswith("Not in the table yet"))
    for name in methods.NAMES:  # in the table, or named as not computed yet (a search of its own, on request)
        assert name in shown or methods.label(name) in missing, name
    assert shown == [n for n in methods.NAMES if n in shown], "in the registry's order"
    for name in _row_methods():
        cell = table.loc[table["method"] == name, "tau"].item()
        n = _tokens(at)
        assert tiny.train_length == 256  # the app model's L_tr too
        want = methods.resolve(tiny, None, name, tokens=n)[0].mean(n)
        assert cell.startswith(f"{want:.4f} (mean over"), (name, cell)
        assert want < 1
    assert at.get("vega_lite_chart"), "each row's tau, drawn"
    # the 'use' box offers them too, and using one puts it in the sidebar's Method box
    pick = at.selectbox(key="cal_pick")
    for name in _row_methods():
        assert any(o.startswith(methods.label(name) + ":") for o in pick.options), (name, pick.options)
    pick.set_value("log-n-rows").run()
    at.button(key="use_pick").click().run()
    app_ok(at)
    assert at.session_state["tau_method"] == "log-n-rows"


def _tokens(at: AppTest) -> int:
    text = next(m.value for m in at.markdown if "tau per query row" in m.value)
    return int(text.split("(")[1].split(" rows")[0].replace(",", ""))


# -- the CLI's --gamma: critical scaling's gamma, through the method's resolve into the run's schedule ----------------


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_gamma_sets_critical_scalings_tau(tiny_dir, capsys):
    base = ("run", "--model", tiny_dir, "--task", "passkey", "--tokens", 600, "--json", "--method", "critical")
    code, out, err = _cli(capsys, *base, "--gamma", 0.25)
    assert code == 0, err
    got = json.loads(out)
    n = got["tokens"]
    assert got["gamma"] == 0.25 and got["tau"] == pytest.approx(1 / (0.25 * math.log(n)), rel=1e-6)
    code, out, err = _cli(capsys, *base)  # no --gamma: 1 / ln L_tr, i.e. log-length's tau above L_tr
    assert code == 0, err
    got = json.loads(out)
    assert got["gamma"] == pytest.approx(temperature.critical_gamma(256))
    assert got["tau"] == pytest.approx(math.log(256) / math.log(n), rel=1e-6)


@pytest.mark.slow
def test_gamma_reaches_calibrates_table(tiny_dir, capsys):
    code, out, err = _cli(
        capsys,
        "calibrate",
        "--model",
        tiny_dir,
        "--task",
        "passkey",
        "--tokens",
        600,
        "--fast",
        "--json",
        "--gamma",
        0.5,
    )
    assert code == 0, err
    got = json.loads(out)
    assert got["methods"]["critical"] == pytest.approx(1 / (0.5 * math.log(got["tokens"])), rel=1e-6)
    assert got["methods"]["log-length"] == pytest.approx(math.log(256) / math.log(got["tokens"]), rel=1e-6)


@pytest.mark.parametrize(
    "argv, says",
    [
        (("--method", "critical", "--gamma", "-1"), "--gamma: a number in 0.001 .. 100, got '-1'"),
        (("--method", "critical", "--gamma", "nan"), "--gamma: a number in 0.001 .. 100"),
        (("--method", "critical", "--gamma", "1e9"), "--gamma: a number in 0.001 .. 100"),
        (("--method", "critical", "--gamma", "abc"), "--gamma: a number, got 'abc'"),
        (("--method", "yarn", "--gamma", "0.2"), "--gamma: only --method critical takes it (the method here is yarn)"),
        (("--tau", "0.8", "--gamma", "0.2"), "--gamma: only --method critical takes it (the method here is fixed)"),
    ],
)
def test_a_bad_gamma_is_one_line_and_exit_2(tiny_dir, capsys, argv, says):
    code, out, err = _cli(capsys, "run", "--model", tiny_dir, "--task", "passkey", "--tokens", 300, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and says in err, err


@pytest.mark.parametrize(
    "argv",
    [
        (
            "sweep",
            "--methods",
            "none,yarn",
            "--gamma",
            "0.2",
        ),  # sweep takes it, for critical (tests/cli/test_gamma_everywhere.py)
        (
            "mlm",
            "--methods",
            "none,yarn",
            "--gamma",
            "0.2",
        ),  # mlm takes it, for critical (tests/cli/test_gamma_everywhere.py)
    ],
)
def test_gamma_is_refused_where_a_command_would_not_use_it(tiny_dir, capsys, argv):
    code, out, err = _cli(capsys, argv[0], "--model", tiny_dir, *argv[1:])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--gamma" in err, err


# -- every schedule in every list: the CLI's --method, the app's Method box and the Sweep's methods -----------------


def test_every_registry_method_is_in_the_clis_method_list(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "2000")  # no line breaks inside a name (argparse wraps at hyphens)
    with pytest.raises(SystemExit) as done:
        cli.main(["run", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    listed = text.split("--method METHOD {")[1].split("}")[0].split(",")
    assert listed == [n for n, m in methods.REGISTRY.items() if not m.takes_value]
    assert "--gamma X" in text


def test_every_registry_method_is_in_the_apps_method_boxes(env):
    at = open_page("sweep.py").run()
    app_ok(at)
    box = at.sidebar.selectbox(key="tau_method")
    assert list(box.options) == [methods.label(n) for n in methods.NAMES]
    swept = at.multiselect(key="sw_methods")
    assert list(swept.options) == [methods.label(n) for n, m in methods.REGISTRY.items() if not m.takes_value]
