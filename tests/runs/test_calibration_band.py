"""Algorithm 1's bootstrap band: the spread of the picked tau over the calibration documents."""

from __future__ import annotations

import numpy as np
import pytest

from core.data import tasks
from core.runs import calibration
from core.runs import temperature as T
from core.runs.temperature import LayerStats, algorithm1, bootstrap_band


def _docs(crossings: list[float], offsets: list[float] | None = None, slope: float = 0.5):
    """A measure over documents whose Pmax (2 layers) is ``r_d + slope * (c_d - tau)``: document d meets its
    reference ``r_d`` exactly at tau = c_d. Returns (measure, reference) with per-document arrays."""
    c = np.asarray(crossings, dtype=float)
    r = np.asarray(offsets if offsets is not None else [0.3] * len(c), dtype=float)
    calls = []

    def stats(doc: np.ndarray) -> LayerStats:  # doc: [documents] -> 2 identical layers
        per = np.stack([doc, doc], axis=1)
        return LayerStats(pmax=per.mean(0), entropy=-per.mean(0), doc_pmax=per, doc_entropy=-per)

    def meas(t: float) -> LayerStats:
        calls.append(t)
        return stats(r + slope * (c - t))

    meas.calls = calls
    return meas, stats(r)


@pytest.mark.parametrize("fast", [False, True])
def test_documents_that_agree_give_a_band_of_one_point(fast):
    meas, ref = _docs([0.8] * 5, offsets=[0.1, 0.2, 0.3, 0.4, 0.5])
    cal = algorithm1(meas, ref, "pmax", fast=fast)
    assert cal.tau == 0.8
    assert cal.band == {"low": 0.8, "high": 0.8, "level": 0.9, "resamples": 200, "documents": 5, "seed": 0}
    assert cal.to_dict()["band"] == cal.band
    assert len(meas.calls) == cal.passes  # the band costs no pass


def test_documents_that_disagree_give_a_band_spanning_both_crossings():
    meas, ref = _docs([0.8, 0.6])
    cal = algorithm1(meas, ref, "pmax")
    assert cal.tau == 0.7  # the mean curve crosses half-way
    assert cal.band["low"] == 0.6 and cal.band["high"] == 0.8 and cal.band["documents"] == 2
    again = algorithm1(*_docs([0.8, 0.6]), "pmax")
    assert again.band == cal.band  # deterministic
    ent = algorithm1(meas, ref, "entropy")  # entropy falls as tau drops: the same crossings
    assert (ent.tau, ent.band["low"], ent.band["high"]) == (0.7, 0.6, 0.8)


def test_one_document_or_no_per_document_stats_give_no_band():
    assert algorithm1(*_docs([0.8]), "pmax").band is None

    def plain(t: float) -> LayerStats:
        return LayerStats(pmax=np.array([0.3 + 0.5 * (0.8 - t)]), entropy=np.array([0.0]))

    cal = algorithm1(plain, LayerStats(pmax=np.array([0.3]), entropy=np.array([0.0])), "pmax")
    assert cal.band is None and cal.to_dict()["band"] is None


def test_the_pure_function_picks_as_algorithm1_does():
    taus = list(T.GRID)
    curve = np.array([[0.3 + 0.5 * (c - t) for c in (0.8, 0.6)] for t in taus])  # [points, documents]
    band = bootstrap_band(taus, curve, np.array([0.3, 0.3]), resamples=50, seed=3, level=0.5)
    assert band["resamples"] == 50 and band["seed"] == 3 and band["level"] == 0.5
    assert 0.6 <= band["low"] <= band["high"] <= 0.8 and band["low"] in taus and band["high"] in taus
    # a tie (0.8 and 0.75 equally far from the reference) goes to the larger tau, as _closest does
    tie = np.array([[0.0, 0.0], [2.0, 2.0], [5.0, 5.0]])
    tied = bootstrap_band([0.8, 0.75, 0.7], tie, np.array([1.0, 1.0]))
    assert tied["low"] == tied["high"] == 0.8
    assert bootstrap_band([0.8], np.array([[1.0]]), np.array([1.0])) is None


def test_a_refined_search_keeps_the_grid_band():
    meas, ref = _docs([0.72, 0.62])
    grid = algorithm1(meas, ref, "pmax")
    refined = algorithm1(meas, ref, "pmax", refined=True)
    assert refined.tau == pytest.approx(0.67, abs=1e-3) and refined.band == grid.band


def test_a_real_calibration_has_a_band_containing_its_pick(tiny, one_thread):
    doc = tasks.make("passkey", tiny.tokenizer, 600, depth=0.5, seed=0)
    cal = calibration.calibrate(tiny, doc, "pmax", samples=3)
    band = cal.band
    assert band is not None and band["documents"] == 3 and band["resamples"] == 200
    assert band["low"] <= cal.tau <= band["high"]
    assert band["low"] in cal.grid and band["high"] in cal.grid
    meas, _ = calibration.measures(tiny, doc, 3)
    st = meas(1.0)
    assert st.doc_pmax.shape == (3, tiny.n_layers)
    np.testing.assert_allclose(st.doc_pmax.mean(0), st.pmax)  # the means are what they were
