"""The CLI contract: JSON shapes, sweeps that resume, exit status 2 with one line on bad input."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from core.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_run_json(tiny_dir, capsys):
    out = _json(capsys, ["run", "--json", "--model", str(tiny_dir), "--tokens", "400", "--seed", "3"])
    for key in ("answer", "expected", "correct", "tau", "tokens", "train_length", "seconds"):
        assert key in out
    assert out["tau"] == 1.0 and out["train_length"] == 256 and abs(out["tokens"] - 400) <= 16
    assert [l["layer"] for l in out["layers"]] == [0, 1]
    sharp = _json(capsys, ["run", "--json", "--model", str(tiny_dir), "--tokens", "400", "--seed", "3", "--tau", "0.6"])
    assert sharp["tau"] == 0.6 and sharp["pmax"] > out["pmax"]
    ll = _json(
        capsys, ["run", "--json", "--model", str(tiny_dir), "--tokens", "400", "--seed", "3", "--method", "log-length"]
    )
    assert ll["tau"] < 1.0 and ll["method"] == "log-length"


def test_run_text_file(tiny_dir, tmp_path, capsys):
    f = tmp_path / "doc.txt"
    f.write_text("Caf\u00e9 notes. " * 40, encoding="utf-8")
    out = _json(
        capsys, ["run", "--json", "--model", str(tiny_dir), "--task", "text", "--text-file", str(f), "--seed", "2"]
    )
    assert out["task"] == "text" and len(out["expected"]) == 5


@pytest.mark.slow
def test_calibrate_json(tiny_dir, capsys):
    out = _json(capsys, ["calibrate", "--json", "--model", str(tiny_dir), "--tokens", "500"])
    assert set(out) >= {"criterion", "grid", "curve", "reference", "tau", "passes", "methods"}
    assert len(out["grid"]) == len(out["curve"]) == 11 and out["passes"] == 11
    assert out["tau"] in out["grid"]
    assert set(out["methods"]) >= {"log-length", "infoscale", "pmax", "entropy", "prop1", "prop2"}


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_sweep_writes_and_resumes(tiny_dir, tmp_path, capsys):
    out = tmp_path / "s.csv"
    argv = [
        "sweep",
        "--model",
        str(tiny_dir),
        "--lengths",
        "300,1.5x",
        "--depths",
        "0.2,0.8",
        "--methods",
        "none,0.7",
        "--samples",
        "2",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    rows = _rows(out)
    assert len(rows) == 2 * 2 * 2 * 2
    for key in ("model", "task", "tokens", "depth", "seed", "method", "tau", "answer", "expected", "correct"):
        assert key in rows[0]
    assert {r["tokens"] for r in rows} == {"300", "384"}
    assert {r["method"] for r in rows} == {"none", "tau=0.7"}
    # a "killed" sweep: drop the last rows, resume, and every row is there exactly once
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:-5]))
    assert main(argv + ["--resume"]) == 0
    rows2 = _rows(out)
    keys = [(r["tokens"], r["depth"], r["seed"], r["method"]) for r in rows2]
    assert len(keys) == 16 and len(set(keys)) == 16
    capsys.readouterr()


def test_rpe_csv(tiny_dir, tmp_path, capsys):
    out = tmp_path / "rpe.csv"
    assert main(["rpe", "--model", str(tiny_dir), "--out", str(out), "--length", "300"]) == 0
    rows = _rows(out)
    assert len(rows) == 300 and {"n", "distance", "head0", "head3"} <= set(rows[0])


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["run", "--model", "no-such-model"], "Unknown model"),
        (["run", "--task", "text", "--text-file", "EMPTY"], "empty"),
        (["run", "--depth", "1.5"], "depth"),
        (["run", "--tokens", "5"], "too small"),
        (["run", "--settings", "MISSING.json"], "not found"),
    ],
)
def test_bad_input_exits_2_with_one_line(tiny_dir, tmp_path, capsys, argv, needle):
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    argv = [a.replace("EMPTY", str(empty)).replace("MISSING", str(tmp_path / "missing")) for a in argv]
    if "--model" not in argv:
        argv += ["--model", str(tiny_dir)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0]


@pytest.mark.slow
def test_module_entry_point(tiny_dir):
    p = subprocess.run(
        [sys.executable, "-m", "core", "run", "--json", "--model", str(tiny_dir), "--tokens", "300"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["tokens"] > 0


def test_train_with_a_missing_config_exits_2_with_one_line(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "missing.json"), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "missing.json" in err[0]


# -- hardening (issue 25) -----------------------------------------------------------------


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


def test_rpe_keeps_an_existing_file_when_its_inputs_are_bad(tiny_dir, tmp_path, capsys):
    out = tmp_path / "keep.csv"
    out.write_text("precious\n")
    for argv in (["--length", "300", "--query", "300"], ["--length", "0"], ["--model", "no-such-model"]):
        assert main(["rpe", "--model", str(tiny_dir), "--out", str(out), *argv]) == 2
        _one_error_line(capsys)
        assert out.read_text() == "precious\n"
    assert main(["rpe", "--model", str(tiny_dir), "--out", str(out), "--length", "40"]) == 0
    assert len(_rows(out)) == 40 and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_rpe_default_length_from_a_huge_card_is_refused(tiny_dir, tmp_path, capsys):
    big = tmp_path / "big"
    big.mkdir()
    for f in tiny_dir.iterdir():
        (big / f.name).write_bytes(f.read_bytes())
    (big / "card.json").write_text(json.dumps({"train_length": 3_000_000}))
    assert main(["rpe", "--model", str(big), "--out", str(tmp_path / "r.csv")]) == 2
    assert "--length" in _one_error_line(capsys) and not (tmp_path / "r.csv").exists()


def test_model_folder_without_tokenizer_runs_only_with_tokenizer_option(tiny_dir, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "card.json"):
        (bare / name).write_bytes((tiny_dir / name).read_bytes())
    assert main(["run", "--json", "--model", str(bare), "--tokens", "300"]) == 2
    assert "no tokenizer files" in _one_error_line(capsys)
    out = _json(capsys, ["run", "--json", "--model", str(bare), "--tokens", "300", "--tokenizer", str(tiny_dir)])
    ref = _json(capsys, ["run", "--json", "--model", str(tiny_dir), "--tokens", "300"])
    assert out["tokens"] == ref["tokens"] and out["answer"] == ref["answer"]


def test_document_too_long_for_memory_is_refused_before_it_is_built(tiny_dir, capsys):
    assert main(["run", "--model", str(tiny_dir), "--tokens", "3000000"]) == 2
    assert "at most about" in _one_error_line(capsys)


def test_unexpected_exception_is_one_line_unless_debugging(tiny_dir, capsys, monkeypatch):
    """A bug (here injected into a library call) is exit 1 and one ``internal error`` line; AAE_DEBUG=1 re-raises it."""
    from core.runs import methods

    def broken(*a, **k):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(methods, "resolve", broken)
    argv = ["run", "--model", str(tiny_dir), "--tokens", "300"]
    monkeypatch.delenv("AAE_DEBUG", raising=False)
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["internal error: RuntimeError: boom (set AAE_DEBUG=1 for the traceback)"]
    monkeypatch.setenv("AAE_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(argv)


def test_os_error_is_one_line(tiny_dir, tmp_path, capsys):
    out = tmp_path / ("n" * 300 + ".csv")  # longer than any file system allows: open() raises OSError
    assert main(["rpe", "--model", str(tiny_dir), "--out", str(out), "--length", "10"]) == 2
    assert "too long" in _one_error_line(capsys).lower()


def test_haystack_option_reaches_runs_and_sweeps(tiny_dir, tmp_path, capsys):
    base = ["--model", str(tiny_dir), "--tokens", "400", "--seed", "3"]
    fixed = _json(capsys, ["run", "--json", *base])
    varied = _json(capsys, ["run", "--json", *base, "--haystack", "corpus-eval"])
    assert fixed["expected"] == varied["expected"] and fixed["pmax"] != varied["pmax"]  # same key, another haystack
    out = tmp_path / "h.csv"
    assert (
        main(
            [
                "sweep",
                "--model",
                str(tiny_dir),
                "--lengths",
                "300",
                "--methods",
                "none",
                "--samples",
                "2",
                "--haystack",
                "corpus-eval",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = _rows(out)
    assert len(rows) == 2
    assert main(["run", *base, "--haystack", "nowhere"]) == 2


def test_dtype_option_runs_in_that_precision_and_refuses_float16(tiny_dir, tmp_path, capsys):
    base = ["run", "--json", "--model", str(tiny_dir), "--tokens", "400", "--seed", "3", "--device", "cpu"]
    f32 = _json(capsys, base)
    bf16 = _json(capsys, base + ["--dtype", "bfloat16"])
    assert (f32["device"], f32["dtype"], bf16["dtype"]) == ("cpu", "float32", "bfloat16")
    assert bf16["pmax"] != f32["pmax"] and bf16["pmax"] == pytest.approx(f32["pmax"], rel=0.05)
    for argv, needle in (
        (base + ["--dtype", "float16"], "float16 is refused"),
        (base + ["--dtype", "int8"], "Unknown dtype"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0]
    sweep = [
        "sweep",
        "--model",
        str(tiny_dir),
        "--out",
        str(tmp_path / "s.csv"),
        "--engine",
        "ray",
        "--dtype",
        "bfloat16",
    ]
    assert main(sweep) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dtype is for local runs" in err[0]
    assert not (tmp_path / "s.csv").exists()
