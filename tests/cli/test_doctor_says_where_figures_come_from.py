"""``python -m core doctor`` says where its compiler figures were measured, against the machine it runs on (issue 59
point 10: it printed "this project's 2-core AVX-512 Xeon" while it ran on, and reported, an AVX2 EPYC)."""

from __future__ import annotations

from core import cli
from core.cli import doctor
from core.mechanics import machine


def test_another_cpu_hears_the_figures_are_from_another_machine_and_how_to_measure_here():
    said = doctor.where_measured({"cpu": "AMD EPYC", "vector_isa": "avx2"})
    assert "another machine than this one (AMD EPYC, avx2)" in said
    assert "AAE_FUSED_SOFTMAX=0" in said and "--tokens 8192" in said
    assert doctor.COMPILER_MEASURED["where"] in said


def test_the_measured_cpu_hears_a_machine_like_this_one():
    m = doctor.COMPILER_MEASURED
    said = doctor.where_measured({"cpu": m["cpu"] + " 2.5 GHz", "vector_isa": m["vector_isa"]})
    assert said.endswith("a machine like this one") and "another machine" not in said


def test_doctor_never_calls_the_figures_this_machines(capsys):
    assert cli.main(["doctor"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "this project's" not in last
    assert doctor.where_measured(machine.describe()) in last
