"""Batch runs over a JSONL of the user's documents: rows, speed, kill + resume, bad lines, settings files."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.cli import main as cli
from core.experiments import batch
from core.runs import temperature
from core.runs.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_thread")


def _docs(n: int, start: int = 0) -> list[dict]:
    out = []
    for i in range(start, start + n):
        if i % 3 == 0:
            out.append(
                {
                    "id": f"doc-{i}",
                    "text": f"Note {i}: the code word is tulip{i % 7}. " * (1 + i % 4),
                    "expected": f"tulip{i % 7}",
                }
            )
        elif i % 3 == 1:
            out.append(
                {
                    "id": i,
                    "context": f"Item {i} costs {100 + i} coins. " * (1 + i % 5),
                    "question": "How much?",
                    "expected": 100 + i,
                }
            )
        else:
            out.append(
                {"id": f"doc-{i}", "context": "Rain fell on the quiet town. " * (1 + i % 6), "question": "What fell?"}
            )
    return out


def _write(path: Path, docs: list, extra: list[str] = ()) -> Path:
    lines = [json.dumps(d) for d in docs] + list(extra)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _bundled_or_tiny(tiny_dir) -> str:
    """The issue asks for the bundled model; the tiny one stands in where none ships."""
    from core.models import default_model

    return default_model() or str(tiny_dir)


def test_sweep_200_documents(tiny_dir, tmp_path, capsys):
    """200 short documents with the bundled model, within CI time (speed itself lives in bench/batch.py)."""
    data = _write(tmp_path / "docs.jsonl", _docs(200))
    out = tmp_path / "rows.csv"
    assert (
        cli(["sweep", "--model", _bundled_or_tiny(tiny_dir), "--data", str(data), "--out", str(out), "--tau", "0.7"])
        == 0
    )
    rows = _rows(out)
    assert len(rows) == 200
    assert list(rows[0]) == batch.COLUMNS
    assert {r["setting"] for r in rows} == {"tau=0.7"} and {r["tau"] for r in rows} == {"0.7"}
    assert sorted(int(r["line"]) for r in rows) == list(range(1, 201))
    by_line = {int(r["line"]): r for r in rows}
    assert by_line[2]["id"] == "1" and by_line[1]["id"] == "doc-0"
    assert by_line[3]["correct"] == "" and by_line[3]["expected"] == ""  # no expected -> not scored
    assert by_line[1]["correct"] in ("True", "False") and by_line[2]["expected"] == "101"
    assert all(int(r["tokens"]) > 10 and float(r["seconds"]) >= 0 for r in rows)
    assert "200 rows written" in capsys.readouterr().out


def test_batched_equals_one_by_one(tiny_dir, tmp_path):
    data = _write(tmp_path / "docs.jsonl", _docs(16))
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    common = ["sweep", "--model", str(tiny_dir), "--data", str(data), "--tau", "0.6"]
    assert cli(common + ["--out", str(a), "--batch-size", "8"]) == 0
    assert cli(common + ["--out", str(b), "--batch-size", "1"]) == 0
    ra = {r["line"]: r for r in _rows(a)}
    rb = {r["line"]: r for r in _rows(b)}
    assert ra.keys() == rb.keys() and len(ra) == 16
    for k in ra:
        assert ra[k]["answer"] == rb[k]["answer"] and ra[k]["tokens"] == rb[k]["tokens"]
        assert float(ra[k]["pmax"]) == pytest.approx(float(rb[k]["pmax"]), abs=1e-4)


@pytest.mark.slow
def test_killed_then_resumed_has_one_row_per_document_and_setting(tiny_dir, tmp_path):
    n_docs = 40
    data = _write(tmp_path / "docs.jsonl", _docs(n_docs))
    out = tmp_path / "rows.csv"
    argv = [
        "sweep",
        "--model",
        str(tiny_dir),
        "--data",
        str(data),
        "--out",
        str(out),
        "--methods",
        "none,0.7",
        "--batch-size",
        "1",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "core", *argv], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 180
    try:
        while time.time() < deadline and proc.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= 6:  # header + 5 rows at least
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    partial = _rows(out)
    assert 5 <= len(partial) < 2 * n_docs
    # as if the kill had cut a row in half: resume must drop it and redo that row
    with open(out, "a", encoding="utf-8") as f:
        f.write("999,half-writ")

    assert cli(argv + ["--resume"]) == 0
    rows = _rows(out)
    keys = [(r["id"], r["setting"]) for r in rows]
    assert len(keys) == len(set(keys)) == 2 * n_docs
    assert {s for _, s in keys} == {"none", "tau=0.7"}
    assert {k for k, _ in keys} == {str(d["id"]) for d in _docs(n_docs)}
    assert rows[: len(partial)] == partial  # what the killed run finished is kept as it was
    # resuming a finished run does nothing
    assert cli(argv + ["--resume"]) == 0
    assert len(_rows(out)) == 2 * n_docs


def test_bad_lines_are_reported_and_skipped(tiny_dir, tmp_path, capsys):
    good = _docs(3)
    extra = [
        "{not json",  # line 4
        json.dumps({"question": "What?"}),  # line 5: no text
        json.dumps({"text": "   "}),  # line 6: empty text
        json.dumps(["a", "list"]),  # line 7: not an object
        json.dumps({"id": "doc-0", "text": "dup"}),  # line 8: duplicate id
        "",  # line 9: blank, ignored silently
        json.dumps({"text": "fine again", "id": "x"}),  # line 10
        json.dumps({"context": "ctx", "question": ""}),  # line 11: empty question
    ]
    data = _write(tmp_path / "docs.jsonl", good, extra)
    with open(data, "ab") as f:
        f.write(b'{"text": "caf\xe9 latin-1"}\n')  # line 12: not UTF-8
        f.write(json.dumps({"text": "last good", "expected": 7}).encode() + b"\n")  # line 13
    out = tmp_path / "rows.csv"
    capsys.readouterr()
    assert cli(["sweep", "--model", str(tiny_dir), "--data", str(data), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    for line, why in [
        (4, "not valid JSON"),
        (5, 'no "text"'),
        (6, 'empty "text"'),
        (7, "not a JSON object"),
        (8, "duplicate id 'doc-0' (first on line 1)"),
        (11, '"question"'),
        (12, "not UTF-8"),
    ]:
        assert f"line {line}: {why}" in err, (line, err)
    assert "line 9" not in err and "line 10" not in err
    rows = _rows(out)
    assert sorted(int(r["line"]) for r in rows) == [1, 2, 3, 10, 13]
    assert {r["setting"] for r in rows} == {"none"} and {r["tau"] for r in rows} == {"1"}

    only_bad = _write(tmp_path / "bad.jsonl", [], ["nope"])
    assert cli(["sweep", "--model", str(tiny_dir), "--data", str(only_bad), "--out", str(out)]) == 2
    assert "No usable documents" in capsys.readouterr().err


def test_settings_file_and_per_document_resolution(tiny, tiny_dir, tmp_path, capsys):
    lt = tiny.train_length
    docs = [
        {"id": f"d{i}", "context": "Blue birds sing. " * (lt // 8 * (i + 1)), "question": "Who sings?"}
        for i in range(4)
    ]
    data = _write(tmp_path / "docs.jsonl", docs)
    lengths = {d["id"]: len(tiny.tokenizer(batch.parse_line(json.dumps(d))[1].text).input_ids) for d in docs}
    out = tmp_path / "rows.csv"
    f = tmp_path / "settings.json"

    f.write_text(Settings(model=str(tiny_dir), method="fixed", tau=0.8).to_json())
    assert cli(["sweep", "--settings", str(f), "--data", str(data), "--out", str(out)]) == 0
    assert {(r["setting"], r["tau"]) for r in _rows(out)} == {("tau=0.8", "0.8")}

    # log-length chosen at d1's length: d1 keeps the stored 0.9, the others are re-resolved at their own length
    f.write_text(Settings(model=str(tiny_dir), method="log-length", tau=0.9, chosen_at=lengths["d1"]).to_json())
    assert cli(["sweep", "--settings", str(f), "--data", str(data), "--out", str(out)]) == 0
    got = {r["id"]: float(r["tau"]) for r in _rows(out)}
    assert got["d1"] == 0.9 and len({got[k] for k in got}) == 4
    for k in ("d0", "d2", "d3"):
        assert got[k] == pytest.approx(temperature.log_length(lt, lengths[k]), abs=1e-6)

    # a per-layer schedule travels whole
    f.write_text(Settings(model=str(tiny_dir), method="fixed", tau=[0.9, 0.6]).to_json())
    assert cli(["sweep", "--settings", str(f), "--data", str(data), "--out", str(out)]) == 0
    rows = _rows(out)
    assert {r["setting"] for r in rows} == {"fixed-schedule"} and {r["tau"] for r in rows} == {"[0.9, 0.6]"}

    # --resume without --out, and a CSV that is not ours, are refused
    capsys.readouterr()
    assert cli(["sweep", "--model", str(tiny_dir), "--data", str(data), "--resume"]) == 2
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    assert cli(["sweep", "--model", str(tiny_dir), "--data", str(data), "--out", str(other), "--resume"]) == 2
    assert "not a batch-run CSV" in capsys.readouterr().err


def test_measured_method_is_resolved_per_document(tiny, tmp_path):
    docs = [{"id": f"m{i}", "text": "Numbers 12 34 56 and words. " * (4 + 4 * i)} for i in range(2)]
    items = batch.read_jsonl(_write(tmp_path / "docs.jsonl", docs), tiny.tokenizer, report=pytest.fail)
    out = tmp_path / "rows.csv"
    counts = batch.run_items(tiny, items, [batch.Setting("pmax", "pmax")], out=out)
    assert counts == {"written": 2, "skipped": 0, "failed": 0}
    rows = _rows(out)
    assert all(float(r["tau"]) in temperature.GRID for r in rows)
    assert all(float(r["seconds"]) > 0 for r in rows)
