"""Issue 41, point 6: Calibrate and Sweep as a teacher found them, and messages in the app's own words.

* Calibrate draws Algorithm 1 at once when the passes it needs are already in the shared stores (the background
  grid, the sidebar's bisection), says plainly where a curve stayed when it never met the L_tr reference, and
  then recommends a closed form with a one-click log-length; its every-method table never cuts a cell.
* Sweep names methods by the registry's label in the picker, tables and figures, says which lengths it runs,
  writes singulars in the singular, and its Start / Resume / Stop follow the run's state.
* Errors shown in the browser speak of the app's controls, never of flags or server paths; the CLI keeps its own.

AppTest with a tiny T5 (L_tr = 256, ByT5 bytes) of this module's own; every number the tests compare is computed
by the library on the same model (no mocks of our code). Each test uses its own document seed, so the process-wide
stores (:mod:`ui.stores`) hold nothing of it before the test.
"""

from __future__ import annotations

import base64
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import clear_app_caches

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import app_error_text, app_ok, build_tiny_t5, wait_until  # noqa: E402
from core.errors import InputTooLong, ModelLoadError, UserError  # noqa: E402
from core.runs import (
    engine,
    methods,
    temperature,  # noqa: E402
)
from core.runs.settings import DocumentRequest  # noqa: E402
from core.values.choice import Choice
from core.values.schedule import RowTau

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
CALIBRATE = str(ROOT / "app_pages/calibrate.py")
SWEEP = str(ROOT / "app_pages/sweep.py")
TIMEOUT = 240
GRID = temperature.GRID


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_t5(tmp_path_factory.mktemp("i41-t5"), train_length=256)


@pytest.fixture
def env(model_dir, monkeypatch, one_thread):
    monkeypatch.setenv("AAE_MODEL", str(model_dir))
    return model_dir


def _loaded(model_dir):
    """The app's own copy of the model (st.cache_resource: the same object the pages use)."""
    from ui import cache

    return cache.model(str(model_dir))


def _req(tokens: int, seed: int) -> DocumentRequest:
    """The request the sidebar builds for a generated pass key document (depth 50 %)."""
    return DocumentRequest(task="passkey", tokens=tokens, depth=0.5, seed=seed)


def _calibrate(tokens: int, seed: int, **state) -> AppTest:
    at = AppTest.from_file(CALIBRATE, default_timeout=TIMEOUT)
    at.session_state["doc_tokens"] = tokens
    at.session_state["doc_seed"] = seed
    for k, v in state.items():
        at.session_state[k] = v
    return at.run()


def _text(at: AppTest) -> str:
    return "\n".join(
        [i.value for i in at.info]
        + [c.value for c in at.caption]
        + [w.value for w in at.warning]
        + [m.value for m in at.markdown]
    )


def _keys(at: AppTest) -> set[str]:
    return {b.key for b in at.button}


def _pick(at: AppTest, crit: str) -> str:
    (m,) = [m for m in at.metric if m.label == f"Algorithm 1 ({crit})"]
    return m.value


def _stats_only_runs(loaded, req, taus) -> list[float]:
    """Grid taus at which Algorithm 1's own stats-only pass of this document is in the run store."""
    from core.mechanics.probes import ProbeSpec
    from ui import cache

    return [
        t
        for t in taus
        if cache.has_run(loaded, req, Choice.of(tau=t), engine.Pass(probes=ProbeSpec.stats_only(), generate=False))
    ]


def _array(v) -> np.ndarray:
    """A figure array from the browser's JSON: a plain list, or plotly's typed {"dtype", "bdata", "shape"}."""
    if isinstance(v, dict):
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"])
    return np.array(v, dtype=float)


# -- 1. Calibrate shows what the shared stores already hold ----------------------------------------------------


def test_calibrate_draws_the_background_grid_without_a_button(env):
    from ui import cache
    from ui.prefetch import grid_job, prefetcher, progress

    loaded, req = _loaded(env), _req(512, seed=11)
    # what Explore leaves behind: its L_tr reference, and the prefetcher's grid of this document
    cache.run_reference(loaded, req)
    job = grid_job(loaded, req, Choice.of(tau=1.0, method="fixed"))
    prefetcher().want("issue41-test", job)
    try:
        wait_until(lambda: progress(job)[0] == progress(job)[1])
    finally:
        prefetcher().want("issue41-test", None)
    assert cache.calibrate_both(loaded, req, compute=False) is None  # not the calibration store: the grid's stats

    at = _calibrate(512, 11)
    app_ok(at)
    assert "cal_run" not in _keys(at), "the curves are drawn without 'Run Algorithm 1'"
    assert not [i.value for i in at.info if "will run" in i.value]
    cals = cache.calibrate_both(loaded, req, fast=False)  # the library's Algorithm 1 on the same passes
    # the page made none of Algorithm 1's own stats-only passes (at most the per-head view's one, at the pick)
    assert set(_stats_only_runs(loaded, req, GRID)) <= {cals["pmax"].tau}
    for crit, cal in cals.items():
        assert _pick(at, crit) == f"tau = {cal.tau:.2f}"
    # each curve on the page is the whole grid, with the library's values
    fig = next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if "cal_curves" in (c.proto.id or ""))
    for crit, cal in cals.items():
        (trace,) = [d for d in fig["data"] if d.get("name") == f"S_ex(tau), {crit}"]
        assert _array(trace["x"]).tolist() == pytest.approx(list(GRID))
        assert _array(trace["y"]).tolist() == pytest.approx(cal.curve)


def test_calibrate_completes_when_the_rest_of_the_grid_arrives(env):
    from ui import cache
    from ui.pass_gate import gate
    from ui.prefetch import grid_job, prefetcher, progress

    loaded, req = _loaded(env), _req(512, seed=12)
    cache.run_reference(loaded, req)
    first = GRID[:5]  # 1.0 ... 0.8: not enough for a bisection (it needs both ends)
    for t in first:
        cache.run(loaded, req, Choice.of(tau=t, method="fixed"))
    job = grid_job(loaded, req, Choice.of(tau=1.0, method="fixed"))
    # Explore's background grid of this document is wanted, but waits: a person's pass (this test) holds the gate
    with gate().foreground():
        prefetcher().want("issue41-grid", job)
        try:
            at = _calibrate(512, 12)
        except BaseException:
            prefetcher().want("issue41-grid", None)
            raise
    app_ok(at)
    info = " ".join(i.value for i in at.info)
    assert "cal_run" in _keys(at)
    assert f"Algorithm 1 will run {len(GRID) - len(first)} encoder passes" in info, info
    assert f"{len(first)} of the {len(GRID)} grid passes of this document are already made" in info
    assert not [m for m in at.metric if m.label.startswith("Algorithm 1")]
    assert f"being computed ({len(first)} of {len(GRID)} passes ready)" in _text(at)  # it looks again by itself
    try:
        wait_until(lambda: progress(job)[0] == progress(job)[1])  # the background grid goes on
    finally:
        prefetcher().want("issue41-grid", None)
    at.run()  # what the page's next look does
    app_ok(at)
    assert "cal_run" not in _keys(at)
    cals = cache.calibrate_both(loaded, req, fast=False)
    assert _pick(at, "pmax") == f"tau = {cals['pmax'].tau:.2f}"


def test_calibrate_does_not_wait_for_a_grid_nobody_computes(env):
    from ui import cache

    loaded, req = _loaded(env), _req(512, seed=15)
    cache.run_reference(loaded, req)
    cache.run(loaded, req, Choice.of(tau=1.0, method="fixed"))
    at = _calibrate(512, 15)
    app_ok(at)
    assert "cal_run" in _keys(at)
    assert "1 of the 11 grid passes of this document is already made" in " ".join(i.value for i in at.info)
    assert "being computed" not in _text(at)


def test_calibrate_shows_the_sidebars_bisection_then_completes_it(env):
    from ui import cache

    loaded, req = _loaded(env), _req(512, seed=13)
    at = _calibrate(512, 13, tau_method="pmax")  # the sidebar resolves Algorithm 1 (Pmax) by bisection
    app_ok(at)
    fast = cache.calibrate_both(loaded, req, fast=True, compute=False)
    assert fast is not None, "the sidebar's Algorithm 1 ran"
    info = " ".join(i.value for i in at.info)
    assert "Shown below: Algorithm 1 by bisection" in info and "curves have gaps" in info, info
    assert at.button(key="cal_run").label == "Complete the curves"
    assert _pick(at, "pmax") == f"tau = {fast['pmax'].tau:.2f}"
    todo = [t for t in GRID if cache.known_stats(loaded, req, t) is None]
    assert todo and f"The whole curve will run {len(todo)} encoder pass" in info, info

    at.button(key="cal_run").click().run()
    app_ok(at)
    assert "cal_run" not in _keys(at)
    full = cache.calibrate_both(loaded, req, fast=False, compute=False)
    assert full is not None and all(None not in c.curve for c in full.values())
    assert _pick(at, "pmax") == f"tau = {full['pmax'].tau:.2f}"


# -- 2-4. the every-method table, 'not reached' in words, and the closed form it recommends ----------------------


def test_unreached_curve_is_said_plainly_and_log_length_is_one_click(env):
    from ui import cache

    loaded, req = _loaded(env), _req(1024, seed=14)
    cals = cache.calibrate_both(loaded, req, fast=False)  # 4x L_tr: this tiny model's curves run out of range
    ended = [c for c, cal in cals.items() if not cal.reached and cal.tau == min(GRID)]
    assert ended, {c: (cal.tau, cal.reached) for c, cal in cals.items()}  # the case under test happens

    at = _calibrate(1024, 14)
    app_ok(at)
    warnings = [w.value for w in at.warning]
    for crit in ended:
        cal = cals[crit]
        side = "below" if cal.gap < 0 else "above"
        name = "Pmax" if crit == "pmax" else "entropy"
        assert (
            f"The {name} curve stays {abs(cal.gap):.4f} {side} the L_tr reference all the way down to "
            f"tau = {min(GRID):.2f} (the end of the range searched)"
        ) in " ".join(warnings), warnings
    text = _text(at)
    assert "short by" not in text and "below the grid" not in text
    assert not re.search(r"[+-]\d\.\d{4} below|[+-]\d\.\d{4} above", text)  # no signed distance in words
    # a closed form is the better bet: said, with its value, and one click away
    ll = methods.formula(
        "log-length", 256, int(loaded.tokenizer(req.build_for(loaded).text, return_length=True)["length"]), loaded.d_kv
    )
    (advice,) = [m.value for m in at.markdown if "A closed form is the better bet here" in m.value]
    assert "log-length" in advice and "YaRN" in advice
    button = at.button(key="use_fallback")
    assert button.label == f"Use log-length (tau = {ll:.3f})"
    button.click().run()
    app_ok(at)
    assert at.session_state["tau_method"] == "log-length"
    assert "use_fallback" not in _keys(at)
    assert "Done: the sidebar's Method box says 'log-length: log L_tr / log L' now." in _text(at)


def test_every_method_table_cells_are_never_cut(env):
    at = _calibrate(1024, 14)  # the calibration of the test above, or a new one
    if "cal_run" in _keys(at):
        at.button(key="cal_run").click().run()
    app_ok(at)
    (frame,) = [d for d in at.dataframe if "label" in d.value.columns]
    table = frame.value.set_index("method")
    n = int(
        re.search(r"\*\*([\d,]+) tokens\*\*", " ".join(c.value for c in at.sidebar.caption)).group(1).replace(",", "")
    )
    rows = RowTau(floor_scale=256, attn_scale=methods.LLAMA4_ATTN_SCALE)
    # Llama 4's row: its mean tau and the row count, whole (it was cut at "mean 0.8861 ove")
    assert table.loc["llama4", "tau"] == f"{rows.mean(n):.4f} (mean over {n:,} rows)"
    assert table.loc["llama4", "note"] == "a tau per row: 1 before row L_tr, then smaller"
    assert table.loc["llama4", "label"] == methods.label("llama4")
    config = json.loads(frame.proto.columns)
    px = 6.5  # what a character of the app's table font takes, at most (about 6.1 measured in Chromium)
    for col in ("label", "tau", "note"):
        longest = max([len(col)] + [len(str(v)) for v in frame.value[col]])
        width = config[col]["width"]
        assert isinstance(width, int), config[col]
        if width < longest * px:  # only a note may be narrower than its text: then it is said in full below
            assert col == "note", (col, config[col])
    text = _text(at)
    for method, tau, note in zip(table.index, table["tau"], table["note"]):
        if tau == "n/a":  # its reason in full, under the table
            assert f"{methods.label(method)}: {note}" in text
        elif len(note) * px > config["note"]["width"]:
            assert f"{methods.label(method)}, in full: {note}." in text


# -- 5. Sweep: one naming, the lengths it runs, plurals, button states --------------------------------------------


def _sweep(tokens: int = 256) -> AppTest:
    at = AppTest.from_file(SWEEP, default_timeout=TIMEOUT)
    at.session_state["doc_tokens"] = tokens
    return at.run()


def _buttons(at: AppTest) -> dict[str, tuple[str, bool]]:
    return {b.key: (b.label, b.disabled) for b in at.button if b.key in ("sw_start", "sw_resume", "sw_stop_btn")}


def test_sweep_names_methods_by_label_everywhere_and_counts_in_words(env):
    at = _sweep()
    app_ok(at)
    picker = at.multiselect(key="sw_methods")
    assert "none (tau = 1)" in picker.options and "Algorithm 1, Pmax" in picker.options
    assert "tau = 1" not in picker.options and "Alg. 1 Pmax" not in picker.options  # the old short names
    assert all(f"**{methods.label(m)}**" in picker.help for m in ("none", "pmax"))
    at.multiselect(key="sw_lengths").set_value([1])
    at.multiselect(key="sw_depths").set_value([50])
    picker.set_value(["none", "pmax"])
    at.text_input(key="sw_fixed").input("0.8")
    at.number_input(key="sw_seeds").set_value(1).run()
    text = _text(at)
    assert "3 runs of task" in text and "Each cell averages 1 document (1 seed × 1 depth)" in text, text
    assert "1 documents" not in text and "1 seeds" not in text and "1 depths" not in text
    at.multiselect(key="sw_methods").set_value(["none"])
    at.text_input(key="sw_fixed").input("").run()
    assert "1 run of task" in _text(at)
    at.multiselect(key="sw_methods").set_value(["none", "pmax"])
    at.text_input(key="sw_fixed").input("0.8").run()

    at.button(key="sw_start").click().run()
    app_ok(at)
    labels = ["none (tau = 1)", "Algorithm 1, Pmax", "fixed tau = 0.8"]
    tables = [d.value for d in at.dataframe]
    (table,) = [t for t in tables if t.index.name == "method"]
    assert list(table.index) == labels and list(table.columns) == [256]
    assert at.selectbox(key="sw_heat_method").options == labels
    fig = next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if "sw_method" in (c.proto.id or ""))
    assert fig["data"][0]["y"] == labels
    assert [e.label for e in at.expander if e.label.startswith("All ")] == ["All 3 rows"]
    rows = [t for t in tables if "answer" in t.columns]
    assert rows and set(rows[0]["method"]) == set(labels)


def test_sweep_says_which_lengths_it_runs_and_offers_the_sidebars(env):
    at = _sweep(tokens=512)  # 2x L_tr in the sidebar, the sweep's lengths 1x, 2x, 4x by default
    app_ok(at)
    at.multiselect(key="sw_lengths").set_value([1]).run()
    text = _text(at)
    assert "The sweep runs at the lengths chosen here, in tokens: **256** (multiples of L_tr = 256)" in text, text
    assert re.search(r"the sidebar's document \([\d,]+ tokens\) is not used, nor its length", text), text
    at.button(key="sw_lengths_add_sidebar").click().run()
    app_ok(at)
    assert at.session_state["sw_lengths"] == [1, 2]
    assert "the sidebar's length (512) is among them" in _text(at)
    # a sidebar length that is no multiple of L_tr can be swept too
    at.number_input(key="doc_tokens").set_value(600).run()
    app_ok(at)
    assert "600 (the sidebar's length)" in at.multiselect(key="sw_lengths").options
    at.button(key="sw_lengths_add_sidebar").click().run()
    app_ok(at)
    assert "**256, 512, 600** (L_tr = 256)" in _text(at)


def test_sweep_buttons_follow_the_run(env):
    at = _sweep()
    app_ok(at)
    at.multiselect(key="sw_lengths").set_value([1])
    at.multiselect(key="sw_depths").set_value([0, 100])
    at.multiselect(key="sw_methods").set_value(["none"])
    at.number_input(key="sw_seeds").set_value(1).run()
    b = _buttons(at)
    assert b["sw_start"] == ("Start sweep", False) and b["sw_resume"][1] and b["sw_stop_btn"][1], b  # no run: no Resume

    at.button(key="sw_start").click().run()
    app_ok(at)
    b = _buttons(at)
    assert b["sw_start"] == ("Run again", False), b  # finished: run again, nothing to resume, nothing to stop
    assert b["sw_resume"][1] and b["sw_stop_btn"][1], b
    path = Path(at.session_state["sw_csv"])
    full = pd.read_csv(path)
    assert len(full) == 2

    # What a Stop click leaves: Streamlit ends the script run inside the sweep (the run never reports its end),
    # the Stop button's callback asks to stop, and the CSV holds the rows finished before. AppTest cannot click
    # during a run, so the test leaves that state itself.
    path.write_text("\n".join(path.read_text().splitlines()[:2]) + "\n")  # header + the first row
    at.session_state["sw_last"] = {**at.session_state["sw_last"], "state": "running"}
    at.session_state["sw_stop"] = True
    at.run()
    app_ok(at)
    b = _buttons(at)
    assert b["sw_resume"] == ("Resume", False) and b["sw_start"] == ("Start sweep", False), b
    assert any("Stopped before the end" in w.value and "Resume runs the rest" in w.value for w in at.warning)

    at.button(key="sw_resume").click().run()
    app_ok(at)
    assert len(pd.read_csv(path)) == 2  # the missing row, once
    b = _buttons(at)
    assert b["sw_start"] == ("Run again", False) and b["sw_resume"][1], b

    # another grid: the finished run is not this one, so Start starts it
    at.multiselect(key="sw_depths").set_value([50]).run()
    b = _buttons(at)
    assert b["sw_start"] == ("Start sweep", False) and b["sw_resume"][1], b


def test_sweep_refusal_speaks_of_the_apps_controls(env, monkeypatch):
    at = _sweep()
    app_ok(at)
    at.multiselect(key="sw_lengths").set_value([16])
    at.multiselect(key="sw_depths").set_value([50])
    at.multiselect(key="sw_methods").set_value(["none"])
    at.number_input(key="sw_seeds").set_value(1).run()
    monkeypatch.setattr(engine, "max_tokens", lambda loaded, batch=1, chunk_bytes=0: 1000)  # 16x = 4,096 > 1,000
    at.button(key="sw_start").click().run()
    assert not at.exception
    (msg,) = [e.value for e in at.error]
    assert "at most about 1,000 tokens" in msg and "Length in tokens box" in msg, msg
    assert "--" not in msg
    assert _buttons(at)["sw_resume"][1]  # nothing ran: nothing to resume


# -- 6. messages in the app's words; the CLI keeps its own ---------------------------------------------------------

ABSOLUTE_PATH = re.compile(r"(?:^|[\s'\"(`=])(?:/|~/)[^\s'\"`)]")


def test_a_folder_that_holds_no_model_is_named_without_flags_or_paths(env):
    at = AppTest.from_file(CALIBRATE, default_timeout=TIMEOUT).run()
    at.sidebar.text_input(key="model_other").input("/etc").run()
    msg = app_error_text(at)
    assert "Could not load the model in folder 'etc'" in msg and "config.json" in msg, msg
    assert "box" in msg  # where to type another folder
    assert "--" not in msg and "hf download" not in msg
    assert not ABSOLUTE_PATH.search(msg), msg


def test_the_cli_keeps_its_wording_for_the_same_folder(capsys):
    from core.cli import main

    assert main(["run", "--model", "/etc", "--tokens", "300"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Could not load model '/etc'" in err[0] and "--model" in err[0], err


def test_a_document_too_long_for_memory_names_the_length_box(env, monkeypatch):
    clear_app_caches()  # a document or calibration an earlier test stored is shown from the store, with no new check
    monkeypatch.setattr(engine, "max_tokens", lambda loaded, batch=1, chunk_bytes=0: 100)
    at = AppTest.from_file(CALIBRATE, default_timeout=TIMEOUT).run()
    msg = app_error_text(at)
    assert "at most about 100 tokens" in msg and "Length in tokens box" in msg, msg
    assert "--" not in msg and not ABSOLUTE_PATH.search(msg), msg


def test_too_long_keeps_the_cli_flag(tiny_dir, capsys):
    from core.cli import main

    assert main(["run", "--model", str(tiny_dir), "--tokens", "4000000"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--tokens" in line and "at most about" in line


def test_user_error_carries_both_texts_through_pickling():
    err = ModelLoadError("Could not load '/srv/x' (--model ./x)", app="Could not load 'x': type a folder in the box")
    assert str(err) == "Could not load '/srv/x' (--model ./x)"  # the CLI prints this
    assert err.app_text == "Could not load 'x': type a folder in the box"
    back = pickle.loads(pickle.dumps(err))  # Ray actors and worker processes send errors back pickled
    assert type(back) is ModelLoadError and str(back) == str(err) and back.app_text == err.app_text
    plain = UserError("no flags here")
    assert plain.app is None and plain.app_text == "no flags here"
    assert isinstance(InputTooLong("x", app="y"), ValueError)


def test_engine_length_check_has_an_app_text(tiny):
    with pytest.raises(InputTooLong) as exc:
        engine.check_length(tiny, 10**9)
    assert "Use a shorter document." in str(exc.value) and "--" not in exc.value.app_text
    assert "the Length in tokens box" in exc.value.app_text


def test_app_words_translate_what_has_no_app_text():
    from ui import app_words, message

    assert app_words("Use a shorter document (--tokens).") == "Use a shorter document (the Length in tokens box)."
    assert app_words("no GPU is available; use --device cpu") == "no GPU is available"
    assert app_words("bad option (see core run --help)") == "bad option"
    assert app_words("Model card /home/me/models/t5/card.json: bad") == "Model card card.json: bad"
    untouched = "log L_tr / log L, owner/name, 1/2, https://arxiv.org/abs/2311.00684"
    assert app_words(untouched) == untouched
    assert message(UserError("cli --tokens", app="app text")) == "app text"
    assert message(ValueError("Use --tokens")) == "Use the Length in tokens box"


def test_model_messages_have_app_texts_without_paths(tmp_path):
    from core import models

    (tmp_path / "card.json").write_text("{not json")
    with pytest.raises(ModelLoadError) as exc:
        models.read_card(tmp_path)
    assert str(tmp_path) in str(exc.value)  # the CLI names the file
    assert str(tmp_path) not in exc.value.app_text and f"model folder '{tmp_path.name}'" in exc.value.app_text
    err = models.hub._not_here("owner/model", "offline mode is on (HF_HUB_OFFLINE)", "the app runs offline")
    assert "hf download" in str(err) and "--model" in str(err)
    assert "--" not in err.app_text and "hf download" not in err.app_text and "owner/model" in err.app_text
    assert not ABSOLUTE_PATH.search(err.app_text)


def test_long_schedules_are_short_in_the_table_and_whole_below_it():
    from ui import calibrate_views as cv

    layers = [round(0.5 + 0.02 * i, 2) for i in range(24)]  # a per-layer schedule of a 24-layer encoder
    taus = {
        "per-layer": layers,
        "per-head": [[0.5, 0.7], [0.9, 1.0]],
        "prop1": "n/a (no root: sigma too large)",
        "llama4": RowTau(floor_scale=256, attn_scale=0.1),
        "yarn": 0.7713,
    }
    table = cv.taus_table(taus, rows=2048, train_length=256).set_index("method")
    assert table.loc["per-layer", "tau"] == "per layer (24): 0.50 to 0.96, mean 0.730"
    assert table.loc["per-head", "tau"].startswith("per head (2 x 2): 0.50 to 1.00")
    assert table.loc["prop1", ["tau", "note"]].tolist() == ["n/a", "no root: sigma too large"]
    assert table.loc["llama4", "tau"] == f"{taus['llama4'].mean(2048):.4f} (mean over 2,048 rows)"
    assert table.loc["yarn", "tau"] == "0.7713"
    lines = cv.long_notes(table.reset_index())
    assert lines[0] == "Why 'n/a': Prop. 1 (match Pmax): no root: sigma too large."
    (whole,) = [line for line in lines[1:] if line.startswith(methods.label("per-layer"))]
    assert whole.endswith(", ".join(f"{v:.2f}" for v in layers) + ".")  # every layer's tau, none cut
