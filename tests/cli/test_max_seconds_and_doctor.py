"""Issue 47 point 5 (the CLI's ``--max-seconds``), point 4's calibrate progress, and issue 49 point 4's ``doctor``.

``--max-seconds N``: ``run`` and ``calibrate`` refuse before any pass when their estimate is over the budget (one
line, exit 2); a pass that overruns stops at the next layer (:class:`core.runs.timing.Budget` through
``core.mechanics.attention.between_layers``) with one line and exit 124, a sweep's rows written staying for
``--resume``. ``calibrate`` shows both of its phases and the layers run inside each. ``doctor`` prints
``core.mechanics.machine``'s facts (and ``--json``) with what a compiler buys.
"""

from __future__ import annotations

import csv
import json

import pytest

from core import cli
from core.cli import doctor
from core.errors import UserError
from core.mechanics import machine
from core.runs import timing


def _lines(err: str) -> list[str]:
    return [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]


# -- doctor ---------------------------------------------------------------------------------------------------------


def test_doctor_prints_the_machine_s_facts_and_what_a_compiler_buys(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    facts = machine.describe()
    lines = out.splitlines()
    assert lines[0] == machine.one_line(facts)
    for key in (
        "device",
        "dtype",
        "backend",
        "why",
        "vector_isa",
        "kernel_isa",
        "threads",
        "compiler",
        "torch",
        "transformers",
    ):
        assert any(ln.split()[:1] == [key] for ln in lines[1:]), key
    assert lines[-1].startswith("A C++ compiler") and "fused softmax kernel" in lines[-1]
    assert (
        f"{doctor.COMPILER_MEASURED['with_s']:g} s with it and {doctor.COMPILER_MEASURED['without_s']:g} s" in lines[-1]
    )


def test_doctor_json_is_one_object_with_every_fact(capsys):
    assert cli.main(["doctor", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    facts = machine.describe()
    assert set(facts) <= set(got) and {"summary", "compiler_buys"} <= set(got)
    assert got["backend"] == facts["backend"] and got["threads"] == facts["threads"]
    assert got["summary"] == machine.one_line(facts)


def test_doctor_refuses_an_unknown_option_in_one_line(capsys):
    assert cli.main(["doctor", "--bogus"]) == 2
    assert len(_lines(capsys.readouterr().err)) == 1


# -- --max-seconds ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9", "abc", "1e400"])
def test_a_bad_budget_is_one_line(capsys, value):
    assert cli.main(["run", "--max-seconds", value]) == 2
    lines = _lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--max-seconds" in lines[0]


def test_budget_by_its_clock():
    now = [100.0]
    b = timing.Budget(10, clock=lambda: now[0])
    b.check()
    b.refuse(9.5, "work")
    with pytest.raises(UserError, match="over --max-seconds 10"):
        b.refuse(10.5, "work")
    now[0] = 110.5
    with pytest.raises(timing.OutOfTime, match="--max-seconds 10 reached after 10.5 s"):
        b.check()
    timing.Budget(None).check()  # no bound: nothing
    with pytest.raises(UserError):
        timing.Budget(0)


def test_run_is_refused_before_it_starts_when_its_estimate_is_over_the_budget(capsys, monkeypatch):
    from core.runs import engine

    passes = []
    real = engine.run

    def counting(*a, **kw):
        passes.append(kw.get("encoded").n if kw.get("encoded") is not None else None)
        return real(*a, **kw)

    monkeypatch.setattr(engine, "run", counting)
    rc = cli.main(["run", "--tokens", "8192", "--device", "cpu", "--max-seconds", "1"])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = _lines(err)
    assert len(lines) == 1 and lines[0].startswith("error: this run (1 pass of up to 8,192 tokens) would take")
    assert "over --max-seconds 1" in lines[0]
    assert passes and all(n is not None and n <= engine.SAMPLE_TOKENS for n in passes)  # only the timed samples


def test_calibrate_is_refused_before_it_starts_when_its_estimate_is_over_the_budget(capsys):
    rc = cli.main(["calibrate", "--tokens", "2048", "--device", "cpu", "--max-seconds", "2"])
    lines = _lines(capsys.readouterr().err)
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: this calibration (")
    assert "over --max-seconds 2" in lines[0]


def test_a_pass_that_overruns_stops_at_the_next_layer(capsys, monkeypatch):
    """The estimate let it start (refuse patched out); the budget then runs out inside the pass: the next layer's
    check stops it, one line, exit 124, the layers after it never run."""
    monkeypatch.setattr(timing.Budget, "refuse", lambda self, estimate, what: None)
    calls = []
    real_check = timing.Budget.check

    def check(self):
        calls.append(1)
        if len(calls) == 3:
            self.t0 -= 10 * self.seconds  # the budget is spent during the third attention call's layer
        real_check(self)

    monkeypatch.setattr(timing.Budget, "check", check)
    rc = cli.main(["run", "--tokens", "1024", "--device", "cpu", "--max-seconds", "600"])
    lines = _lines(capsys.readouterr().err)
    assert rc == cli.EXIT_OUT_OF_TIME == 124
    assert lines[-1].startswith("out of time: --max-seconds 600 reached after ") and "nothing written" in lines[-1]
    assert len(calls) == 3


def test_a_sweep_that_overruns_keeps_its_rows_and_resumes(tiny_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "s.csv"
    argv = [
        "sweep",
        "--model",
        str(tiny_dir),
        "--lengths",
        "1x,2x",
        "--samples",
        "3",
        "--methods",
        "none,tau=0.8",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]
    calls = []
    real_check = timing.Budget.check

    def check(self):
        calls.append(1)
        if not self.t0 < 0 and out.exists() and out.read_bytes().count(b"\n") >= 3:  # the header and two rows
            self.t0 = -10 * self.seconds
        real_check(self)

    monkeypatch.setattr(timing.Budget, "check", check)
    assert cli.main(argv + ["--max-seconds", "600"]) == 124
    lines = _lines(capsys.readouterr().err)
    assert lines[-1].startswith("out of time: ") and f"stay in {out}; --resume runs the rest" in lines[-1]
    kept = list(csv.DictReader(open(out)))
    assert 1 <= len(kept) < 12
    monkeypatch.setattr(timing.Budget, "check", real_check)
    assert cli.main(argv + ["--resume"]) == 0
    rows = list(csv.DictReader(open(out)))
    assert rows[: len(kept)] == kept and len(rows) == 12
    assert len({(r["tokens"], r["seed"], r["method"]) for r in rows}) == 12


def test_max_seconds_with_ray_is_one_line(capsys):
    assert cli.main(["sweep", "--engine", "ray", "--max-seconds", "5"]) == 2
    lines = _lines(capsys.readouterr().err)
    assert len(lines) == 1 and "--max-seconds" in lines[0]


# -- calibrate shows that it moves ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_calibrate_on_a_rope_model_shows_both_phases_and_the_layers_run(capsys):
    """Algorithm 1, then every method's tau (the per-layer and per-head searches: most of the time, which used to
    pass without a word once Algorithm 1's bar was erased), each with its bar and the layers run inside it."""
    assert (
        cli.main(["calibrate", "--model", "rope-mlm", "--task", "lm", "--tokens", "128", "--device", "cpu", "--json"])
        == 0
    )
    err = capsys.readouterr().err.replace("\r", "\n")
    assert "Algorithm 1 (pmax): 100%" in err
    assert "every method's tau: 100%" in err
    counts = [
        int(ln.rsplit(",", 1)[1].split()[0].replace(",", ""))
        for ln in err.splitlines()
        if ln.startswith("every method's tau") and ln.endswith("layers run")
    ]
    assert len(counts) >= 2 and counts == sorted(counts) and counts[-1] > counts[0]
