"""Sweep output files under hostile use: two writers, a torn last row, bad options before any delete, bad --out.

Both kinds: the generated sweep (:func:`core.experiments.sweep.run_sweep`) and the JSONL
batch run (:func:`core.experiments.batch.run_items` / ``python -m core sweep --data``).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from core.cli import main
from core.errors import UserError
from core.experiments import batch, csvio
from core.experiments.sweep import COLUMNS, KEY, SweepPlan, run_sweep

pytestmark = pytest.mark.usefixtures("one_thread")


def _plan(**kw) -> SweepPlan:
    base = dict(model="tiny", task="passkey", lengths=[300], depths=[0.2, 0.8], seeds=[0, 1], methods=["none", "0.7"])
    return SweepPlan(**{**base, **kw})


def cli(argv: list[str]) -> int:
    """The CLI's exit status, whether an option is refused by its parser (SystemExit) or later."""
    try:
        return main(argv)
    except SystemExit as done:
        return done.code


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _sweep_keys(rows: list[dict]) -> list[tuple]:
    return [tuple(r[k] for k in KEY) for r in rows]


def _cut_last_row(path: Path, keep_newline_r: bool) -> bytes:
    """Cut the file's last row short (in its middle, or just before its final newline); return the whole rows."""
    data = path.read_bytes()
    start = data.rstrip(b"\r\n").rfind(b"\n") + 1
    end = len(data) - 1 if keep_newline_r else start + (len(data) - start) // 2
    path.write_bytes(data[:end])
    return data[:start]


# -- two writers -----------------------------------------------------------------------


def test_second_sweep_on_the_same_out_is_refused_and_rows_stay_intact(tiny, tiny_dir, tmp_path, capsys):
    out = tmp_path / "results.csv"
    plan = _plan()
    refused: list[str] = []
    cli_status: list[int] = []

    def progress(done: int, total: int, row) -> None:
        if row is None or done != 2:
            return
        for resume in (False, True):  # a second writer starts while the first is between rows
            with pytest.raises(UserError) as err:
                run_sweep(tiny, plan, out=out, resume=resume)
            refused.append(str(err.value))
        capsys.readouterr()
        cli_status.append(cli(["sweep", "--model", str(tiny_dir), "--lengths", "300", "--out", str(out), "--resume"]))
        refused.append(capsys.readouterr().err)

    df = run_sweep(tiny, plan, out=out, progress=progress)
    assert len(refused) == 3 and cli_status == [2]
    for msg in refused:
        assert "another sweep is writing" in msg and str(out) in msg and "results.csv.lock" in msg, msg
    assert refused[2].count("error:") == 1  # one line (cli's progress bar may draw around it)
    rows = _rows(out)
    keys = _sweep_keys(rows)
    assert len(rows) == len(df) == plan.total and len(set(keys)) == plan.total
    assert not csvio.lock_path(out).exists()  # released, and its file removed
    # once the first is done, the file is free again; resuming a finished sweep adds nothing
    assert len(run_sweep(tiny, plan, out=out, resume=True)) == plan.total
    assert _rows(out) == rows


def test_lock_is_released_when_a_sweep_is_interrupted(tiny, tmp_path):
    out = tmp_path / "results.csv"

    def interrupt(done: int, total: int, row) -> None:
        if row is not None:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(tiny, _plan(), out=out, progress=interrupt)
    assert len(_rows(out)) == 1
    df = run_sweep(tiny, _plan(), out=out, resume=True)
    assert len(df) == _plan().total and len(set(_sweep_keys(_rows(out)))) == _plan().total


def _items(tiny, tmp_path: Path, n: int = 6, extra: list[dict] = ()) -> list[batch.Item]:
    docs = [
        {"id": f"d{i}", "text": f"Note {i}: the code word is tulip{i}. " * (1 + i % 3), "expected": f"tulip{i}"}
        for i in range(n)
    ] + list(extra)
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    return batch.read_jsonl(data, tiny.tokenizer, report=pytest.fail)


def test_second_batch_run_on_the_same_out_is_refused_and_rows_stay_intact(tiny, tmp_path):
    out = tmp_path / "rows.csv"
    items = _items(tiny, tmp_path)
    setting = [batch.Setting("tau=0.7", "fixed", 0.7)]
    refused: list[str] = []

    def progress(k: int) -> None:
        if not refused:
            for resume in (False, True):
                with pytest.raises(UserError) as err:
                    batch.run_items(tiny, items, setting, out=out, resume=resume, batch_size=1)
                refused.append(str(err.value))

    counts = batch.run_items(tiny, items, setting, out=out, batch_size=1, progress=progress)
    assert counts == {"written": len(items), "skipped": 0, "failed": 0}
    assert len(refused) == 2 and all("another sweep is writing" in m and str(out) in m for m in refused)
    rows = _rows(out)
    assert sorted(r["id"] for r in rows) == sorted(it.id for it in items)
    assert not csvio.lock_path(out).exists()


# -- a torn last row ----------------------------------------------------------------------


@pytest.mark.parametrize("keep_newline_r", [False, True], ids=["mid-row", "newline-missing"])
def test_sweep_resume_redoes_a_torn_last_row_once(tiny, tmp_path, keep_newline_r):
    out = tmp_path / "s.csv"
    plan = _plan()
    run_sweep(tiny, plan, out=out)
    full = _rows(out)
    whole = _cut_last_row(out, keep_newline_r)
    redone: list[dict] = []
    df = run_sweep(tiny, plan, out=out, resume=True, progress=lambda d, t, row: row and redone.append(row))
    assert len(redone) == 1
    assert tuple(str(redone[0][k]) for k in KEY) == _sweep_keys(full)[-1]
    assert out.read_bytes().startswith(whole)  # the whole rows are kept byte for byte
    rows = _rows(out)
    assert rows[:-1] == full[:-1] and len(rows) == len(df) == plan.total
    assert len(set(_sweep_keys(rows))) == plan.total


@pytest.mark.parametrize("keep_newline_r", [False, True], ids=["mid-row", "newline-missing"])
def test_batch_resume_redoes_a_torn_last_row_once(tiny, tmp_path, keep_newline_r):
    out = tmp_path / "rows.csv"
    items = _items(tiny, tmp_path)
    setting = [batch.Setting("none", "none")]
    batch.run_items(tiny, items, setting, out=out)
    full = _rows(out)
    whole = _cut_last_row(out, keep_newline_r)
    counts = batch.run_items(tiny, items, setting, out=out, resume=True)
    assert counts == {"written": 1, "skipped": len(items) - 1, "failed": 0}
    assert out.read_bytes().startswith(whole)
    rows = _rows(out)
    assert rows[:-1] == full[:-1] and rows[-1]["id"] == full[-1]["id"]
    assert len({r["id"] for r in rows}) == len(rows) == len(items)


def _write_csv(path: Path, columns: list[str], rows: list[list[str]]) -> bytes:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        w.writerows(rows)
    return path.read_bytes()


def test_resume_drops_a_row_cut_inside_a_quoted_multiline_cell(tmp_path):
    """An answer with a newline is quoted; a cut just after that inner newline still leaves a torn row."""
    cols = ["id", "answer"]
    out = tmp_path / "r.csv"
    data = _write_csv(out, cols, [["a", "one"], ["b", "two\nlines"]])
    cut = data.index(b"two\n") + 4
    out.write_bytes(data[:cut])
    with csvio.ResultCSV(out, cols, resume=True) as sink:
        assert sink.rows == [{"id": "a", "answer": "one"}]
        sink.write({"id": "b", "answer": "two\nlines"})
    assert out.read_bytes() == data


@pytest.mark.parametrize(
    "content,why",
    [
        (b"a,b\r\n1,2\r\n", "not a sweep CSV"),
        (b"\xff\xfe junk", "not UTF-8"),
        (
            ",".join(COLUMNS).encode() + b"\r\n1,2,3\r\n" + b"x," * (len(COLUMNS) - 1) + b"x\r\n",
            "record 2 has 3 fields",
        ),
    ],
)
def test_resume_refuses_a_file_that_is_not_a_whole_sweep_csv(tiny, tmp_path, content, why):
    out = tmp_path / "s.csv"
    out.write_bytes(content)
    with pytest.raises(UserError, match=why):
        run_sweep(tiny, _plan(), out=out, resume=True)
    assert out.read_bytes() == content


# -- options checked before anything is deleted ------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"depths": [1.5]},
        {"depths": [float("nan")]},
        {"lengths": [0]},
        {"lengths": [300.5]},
        {"lengths": [5]},
        {"seeds": [0.5]},
        {"methods": ["bogus"]},
        {"methods": ["-1"]},
        {"methods": ["inf"]},
        {"task": "nope"},
        {"calib_samples": 0},
    ],
)
def test_bad_sweep_option_leaves_an_existing_csv_untouched(tiny, tmp_path, bad):
    out = tmp_path / "existing.csv"
    out.write_bytes(b"precious,rows\r\n1,2\r\n")
    for resume in (False, True):
        with pytest.raises(UserError):
            run_sweep(tiny, _plan(**bad), out=out, resume=resume)
        assert out.read_bytes() == b"precious,rows\r\n1,2\r\n"


def test_cli_bad_depth_exits_2_and_keeps_the_csv(tiny_dir, tmp_path, capsys):
    out = tmp_path / "existing.csv"
    out.write_bytes(b"precious\r\n")
    capsys.readouterr()
    assert cli(["sweep", "--model", str(tiny_dir), "--lengths", "300", "--depths", "1.5", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "depth" in err[0]
    assert out.read_bytes() == b"precious\r\n"


def test_out_that_cannot_be_a_file_is_refused_in_one_line(tiny, tmp_path):
    folder = tmp_path / "a-folder"
    folder.mkdir()
    (folder / "keep.txt").write_text("x")
    missing = tmp_path / "no-such-folder" / "s.csv"
    items = _items(tiny, tmp_path, n=1)
    for out, why in ((folder, "is a folder"), (missing, "does not exist")):
        with pytest.raises(UserError, match=why):
            run_sweep(tiny, _plan(), out=out)
        with pytest.raises(UserError, match=why):
            batch.run_items(tiny, items, [batch.Setting("none", "none")], out=out)
    assert [p.name for p in folder.iterdir()] == ["keep.txt"] and not missing.parent.exists()


def test_batch_size_zero_is_refused_before_the_out_file_is_touched(tiny_dir, tmp_path, capsys):
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"text": "hello there"}) + "\n")
    out = tmp_path / "rows.csv"
    out.write_bytes(b"precious\r\n")
    capsys.readouterr()
    assert cli(["sweep", "--model", str(tiny_dir), "--data", str(data), "--out", str(out), "--batch-size", "0"]) == 2
    assert "--batch-size" in capsys.readouterr().err
    assert out.read_bytes() == b"precious\r\n"


def test_a_length_beyond_memory_is_refused_before_anything_is_built(tiny, tmp_path):
    """A length within the static bound (4M) but past memory used to build the document first (out of memory)."""
    out = tmp_path / "s.csv"
    out.write_text("keep me\n")
    with pytest.raises(UserError, match="at most about"):
        run_sweep(tiny, _plan(lengths=[256, 3_000_000]), out=out)
    assert out.read_text() == "keep me\n"


def test_the_guard_makes_a_sweep_take_turns_with_other_passes(tiny, tmp_path):
    """The app passes its pass gate: while another session's pass holds it, the sweep runs no row."""
    import threading
    import time

    from ui.pass_gate import PassGate

    gate = PassGate()
    rows: list[dict] = []
    holding, release = threading.Event(), threading.Event()

    def other_session() -> None:
        with gate.foreground():
            holding.set()
            release.wait(30)

    t = threading.Thread(target=other_session)
    t.start()
    holding.wait(5)
    s = threading.Thread(
        target=lambda: run_sweep(tiny, _plan(), progress=lambda d, n, r: r and rows.append(r), guard=gate.foreground)
    )
    s.start()
    time.sleep(1.0)
    assert rows == []  # waiting for the gate
    release.set()
    s.join(120)
    t.join(5)
    assert len(rows) == _plan().total
