"""bench/results.py: the results tables resume cell by cell, and inside a cell run by run."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from conftest import bench_module


def _results_module():
    return bench_module("results")


class Stop(Exception):
    """Stands for the end of a session arriving in the middle of a cell."""


@pytest.mark.slow
def test_a_cell_cut_short_resumes_after_its_last_finished_run(tiny_dir, tmp_path, monkeypatch):
    rb = _results_module()
    real = rb.accuracy
    runs: list[object] = []

    def stops_after_three(loaded, docs, encs, tau, batch):
        if len(runs) == 3:
            raise Stop
        runs.append(tau)
        return real(loaded, docs, encs, tau, batch)

    out = tmp_path / "cut"
    args = (str(tiny_dir), ["passkey"], [2], 3, 3)
    monkeypatch.setattr(rb, "accuracy", stops_after_three)
    with pytest.raises(Stop):
        rb.run_model(*args, out, stats_docs=2)
    # No cell finished, but the cell kept its taus, its dispersion and the three runs that ended.
    partial = json.loads((out / f"{tiny_dir.name}.partial.json").read_text())
    assert sum(k.startswith("passkey|2|3|accuracy|") for k in partial) == 3
    assert "passkey|2|3|taus" in partial and "passkey|2|3|dispersion|2" in partial
    assert not (out / f"{tiny_dir.name}.csv").exists()

    runs.clear()

    def counts(loaded, docs, encs, tau, batch):
        runs.append(tau)
        return real(loaded, docs, encs, tau, batch)

    monkeypatch.setattr(rb, "accuracy", counts)
    resumed = rb.run_model(*args, out, stats_docs=2)
    distinct = {rb.tau_key(t) for _, t in rb.tau_items(rb.taus_from_json(partial["passkey|2|3|taus"]))}
    assert len(distinct) >= 7 and len(runs) == len(distinct) - 3  # only the runs the cut left undone
    assert not (out / f"{tiny_dir.name}.partial.json").exists()  # the finished cell lives in the CSV now

    runs.clear()
    again = rb.run_model(*args, out, stats_docs=2)  # a finished cell is not run again
    assert runs == [] and len(again) == len(resumed) == len(rb.METHODS) + len(rb.FIXED)

    clean = rb.run_model(*args, tmp_path / "clean", stats_docs=2)
    pd.testing.assert_frame_equal(resumed.reset_index(drop=True), clean.reset_index(drop=True))


@pytest.mark.slow
def test_tables_computed_side_by_side_merge_into_one(tiny_dir, tmp_path, monkeypatch):
    """--merge: cells from several --out folders, and a cut cell's finished runs, land in one CSV that
    equals a single run's, and the merged folder resumes where the pieces stopped."""
    rb = _results_module()
    real = rb.accuracy
    runs: list[object] = []

    def counted(loaded, docs, encs, tau, batch):
        if len(runs) == limit:
            raise Stop
        runs.append(tau)
        return real(loaded, docs, encs, tau, batch)

    monkeypatch.setattr(rb, "accuracy", counted)
    limit = None
    name, a, b = str(tiny_dir), tmp_path / "a", tmp_path / "b"
    rb.run_model(name, ["passkey"], [1], 3, 3, a, stats_docs=2)
    rb.run_model(name, ["passkey"], [2], 3, 3, b, stats_docs=2)
    runs.clear()
    limit = 2
    with pytest.raises(Stop):
        rb.run_model(name, ["passkey"], [2, 4], 3, 3, b, stats_docs=2)  # 2x is done there: the cut falls in 4x

    merged = rb.merge(name, [a, b], tmp_path / "m")
    assert sorted(merged["multiple"].unique()) == [1, 2]
    partial = json.loads((tmp_path / "m" / f"{tiny_dir.name}.partial.json").read_text())
    assert sum(k.startswith("passkey|4|3|accuracy|") for k in partial) == 2 and not any(
        k.startswith("passkey|2|") for k in partial
    )
    assert "**passkey**" in (tmp_path / "m" / f"{tiny_dir.name}.md").read_text()

    limit = None
    single = rb.run_model(name, ["passkey"], [1, 2], 3, 3, tmp_path / "one", stats_docs=2)
    pd.testing.assert_frame_equal(
        rb._read_csv(tmp_path / "m" / f"{tiny_dir.name}.csv"), rb._read_csv(tmp_path / "one" / f"{tiny_dir.name}.csv")
    )
    assert len(single) == 2 * (len(rb.METHODS) + len(rb.FIXED))

    runs.clear()
    rb.run_model(name, ["passkey"], [1, 2, 4], 3, 3, tmp_path / "m", stats_docs=2)
    distinct = {rb.tau_key(t) for _, t in rb.tau_items(rb.taus_from_json(partial["passkey|4|3|taus"]))}
    assert len(runs) == len(distinct) - 2  # 1x and 2x merged, two runs of 4x carried over


@pytest.mark.slow
def test_an_older_table_grows_by_its_new_methods_only(tiny_dir, tmp_path, monkeypatch):
    """A CSV written with fewer methods (an older table) is extended: its taus, accuracies and dispersion are
    kept, only the new methods are calibrated and run, and cells outside this run's plan stay in the CSV."""
    rb = _results_module()
    real = rb.accuracy
    runs: list[object] = []

    def counted(loaded, docs, encs, tau, batch):
        runs.append(tau)
        return real(loaded, docs, encs, tau, batch)

    monkeypatch.setattr(rb, "accuracy", counted)
    out, name = tmp_path / "t", str(tiny_dir)
    with monkeypatch.context() as m:  # the older table: two closed forms and Algorithm 1 (Pmax)
        m.setattr(rb, "CLOSED", ("none", "log-length"))
        m.setattr(rb, "MEASURED", ("pmax",))
        m.setattr(rb, "METHODS", ("none", "log-length", "pmax"))
        old = rb.run_model(name, ["passkey"], [1, 2], 3, 3, out, stats_docs=2)
    assert set(old["method"]) == {"none", "log-length", "pmax", *(f"tau={t:g}" for t in rb.FIXED)}
    runs.clear()
    grown = rb.run_model(name, ["passkey"], [2], 3, 3, out, stats_docs=2)
    new = grown[grown["multiple"] == 2]
    assert set(rb.METHODS) <= set(new["method"])
    assert set(grown[grown["multiple"] == 1]["method"]) == set(
        old[old["multiple"] == 1]["method"]
    )  # 1x: kept as it was
    before = old[old["multiple"] == 2].set_index("method")
    after = new.set_index("method")
    for m in before.index:  # what the older table had is carried over, not recomputed
        assert after.loc[m, "accuracy"] == before.loc[m, "accuracy"] and after.loc[m, "tau"] == before.loc[m, "tau"]
    old_keys = {rb.tau_key(t) for t in before["tau"]}
    new_taus = rb.taus_from_json(
        rb.taus_json(rb.calibrated_taus(rb.load(name), "passkey", 2, int(after["tokens"].iloc[0])))
    )
    want = {rb.tau_key(t) for _, t in rb.tau_items(new_taus)} - {rb.tau_key(float(t)) for t in before["tau"]}
    assert len(runs) == len(want) > 0 and old_keys  # only the new methods' taus ran
    assert new.loc[new["method"] == "pmax-refined", "reached"].iloc[0] in (True, False)
    assert (new["distinct_docs"] == 3).all()
