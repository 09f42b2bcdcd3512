"""Temperature methods: the paper's numbers, the approximations behind Prop. 1/2, and the searches."""

from __future__ import annotations

import math

import numpy as np
import pytest

from core.runs import temperature as T


@pytest.mark.parametrize(
    "lt,lx,want",
    [
        (512, 1024, 0.90),
        (512, 2048, 0.82),
        (512, 4096, 0.75),
        (512, 8192, 0.69),
        (512, 15000, 0.65),
        (768, 16000, 0.69),
    ],
)
def test_log_length_matches_paper(lt, lx, want):
    assert round(T.log_length(lt, lx), 2) == want


def test_log_length_never_above_one():
    assert T.log_length(512, 256) == 1.0


def test_infoscale():
    d = 64
    lam = math.sqrt(1 - 4096 ** (-2 / d)) / math.sqrt(1 - 512 ** (-2 / d))
    assert T.infoscale(512, 4096, d) == pytest.approx(1 / lam)
    assert T.infoscale(512, 4096, d) < 1.0
    assert T.infoscale(512, 512, d) == 1.0
    # longer -> sharper
    assert T.infoscale(512, 16000, d) < T.infoscale(512, 4096, d)


def _brute(sigma, tau, L, rows=64, seed=0):
    z = np.random.default_rng(seed).normal(0, sigma, (rows, L)) / tau
    lse = np.log(np.exp(z).sum(1)).mean()
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return lse, float(-(p * np.log(p)).sum(1).mean())


@pytest.mark.parametrize("sigma,tau", [(0.25, 1.0), (0.5, 0.7), (1.0, 1.0), (1.0, 0.7), (1.5, 1.0)])
def test_gaussian_approximations_hold_for_small_sigma_over_tau(sigma, tau):
    """softmax denominator ~ L exp(sigma^2 / 2 tau^2) and H ~ log L - sigma^2 / (2 tau^2).

    They hold while sigma/tau <~ 1.5 (L = 4096): the log-denominator within 0.02,
    the entropy within 0.1 nats.
    """
    L = 4096
    lse, h = _brute(sigma, tau, L)
    assert abs(lse - (math.log(L) + sigma**2 / (2 * tau**2))) < 0.02
    assert abs(h - (math.log(L) - sigma**2 / (2 * tau**2))) < 0.1


def test_gaussian_approximation_breaks_for_large_sigma():
    """And they fail once sigma/tau is large (a few max logits dominate): here sigma/tau ~ 4.3."""
    L = 4096
    _, h = _brute(3.0, 0.7, L)
    assert abs(h - (math.log(L) - 9 / (2 * 0.49))) > 1.0


def test_prop2_keeps_entropy_constant_under_the_gaussian_model():
    lt, lx, s_tr, s_ex = 512, 4096, 1.0, 1.1
    tau = T.prop2(lt, lx, s_tr, s_ex)
    h_tr = math.log(lt) - s_tr**2 / 2
    h_ex = math.log(lx) - s_ex**2 / (2 * tau**2)
    assert h_ex == pytest.approx(h_tr)
    assert 0 < tau < 1


def test_prop1_is_the_larger_root():
    lt, lx, p, s_tr, s_ex = 512, 4096, 0.3, 1.2, 1.3
    tau = T.prop1(lt, lx, p, s_tr, s_ex)
    a = math.log(lx) + math.log(p)
    b = math.log(lt) + math.log(p) + s_tr**2 / 2
    c = s_ex**2 / 2
    assert a * tau**2 - b * tau + c == pytest.approx(0, abs=1e-9)
    other = c / (a * tau)  # product of roots = c/a
    assert tau > other


def test_prop1_reports_no_real_root():
    with pytest.raises(ValueError):
        T.prop1(512, 4096, 0.9, 0.1, 30.0)


def _monotone_measure(slope_pmax=0.4):
    calls = []

    def measure(tau):
        calls.append(tau)
        t = np.atleast_1d(np.asarray(tau, dtype=float))
        t = np.broadcast_to(t, (3,)) if t.size == 1 else t
        # Pmax rises and entropy falls as tau drops, per layer with different slopes
        pm = 0.2 + slope_pmax * (1 - t) * np.array([1.0, 0.7, 1.3])
        return T.LayerStats(pmax=pm, entropy=3.0 - 2.0 * (1 - t) * np.array([1.0, 0.5, 1.5]))

    return measure, calls


@pytest.mark.parametrize("crit", ["pmax", "entropy"])
@pytest.mark.parametrize("target_tau", [1.0, 0.93, 0.81, 0.66, 0.52, 0.4])
def test_fast_search_picks_the_grid_point(crit, target_tau):
    measure, _ = _monotone_measure()
    reference = measure(target_tau)
    full = T.algorithm1(measure, reference, crit, fast=False)
    fast = T.algorithm1(measure, reference, crit, fast=True)
    assert full.tau == fast.tau
    assert full.passes == 11 and fast.passes <= 6
    assert full.tau == min(T.GRID, key=lambda g: (abs(g - target_tau), -g))
    assert full.reference == pytest.approx(float(np.mean(reference.criterion(crit))))
    assert len(full.curve) == 11 and None not in full.curve


def test_per_layer_alignment_finds_each_layer():
    # layer l's stats depend on its own tau only here: per-layer must recover each
    def measure(tau):
        t = np.broadcast_to(np.atleast_1d(np.asarray(tau, float)), (3,))
        return T.LayerStats(pmax=0.2 + 0.5 * (1 - t), entropy=3 - 2 * (1 - t))

    ref = measure([0.9, 0.7, 0.55])
    cal = T.per_layer(measure, ref, 3, "pmax")
    assert cal.schedule == [0.9, 0.7, 0.55]
    assert cal.passes < 3 * 11


# -- Algorithm 1 honest at the edges (reached, gap, refined search) --------------------------


def _linear_measure(slope: float, offset: float):
    """A fake model whose mean Pmax falls linearly in tau: S(tau) = offset - slope * tau (monotone, as Pmax is)."""
    from core.runs.temperature import LayerStats

    def measure(tau):
        t = float(np.mean(tau))
        return LayerStats(pmax=np.array([offset - slope * t]), entropy=np.array([slope * t]))

    return measure


def test_grid_reaches_and_the_refined_search_finds_the_crossing():
    from core.runs.temperature import LayerStats, algorithm1

    meas = _linear_measure(1.0, 1.2)  # S(tau) = 1.2 - tau: equals 0.47 at tau = 0.73
    ref = LayerStats(pmax=np.array([0.47]), entropy=np.array([0.0]))
    grid = algorithm1(meas, ref, "pmax")
    assert grid.reached and grid.tau in (0.7, 0.75) and abs(grid.gap) <= 0.03 + 1e-9
    fine = algorithm1(meas, ref, "pmax", fast=True, refined=True)
    assert fine.reached and fine.tau == pytest.approx(0.73, abs=0.001) and abs(fine.gap) < 0.001
    assert fine.refined and all(0.7 <= t <= 0.75 for t, _ in fine.refined)


def test_when_the_grid_is_not_enough_the_refined_search_goes_below_half():
    from core.runs.temperature import TAU_FLOOR, LayerStats, algorithm1

    meas = _linear_measure(1.0, 1.2)  # reaches 0.82 only at tau = 0.38, below the paper's grid
    ref = LayerStats(pmax=np.array([0.82]), entropy=np.array([0.0]))
    grid = algorithm1(meas, ref, "pmax")
    assert grid.tau == 0.5 and not grid.reached and grid.gap == pytest.approx(0.7 - 0.82)
    d = grid.to_dict()
    assert d["reached"] is False and d["gap"] == pytest.approx(-0.12)
    fine = algorithm1(meas, ref, "pmax", refined=True)
    assert fine.reached and fine.tau == pytest.approx(0.38, abs=0.001) and fine.tau > TAU_FLOOR
    unreachable = algorithm1(meas, LayerStats(pmax=np.array([0.99]), entropy=np.array([0.0])), "pmax", refined=True)
    assert not unreachable.reached and unreachable.tau == pytest.approx(TAU_FLOOR)
    assert unreachable.gap == pytest.approx(1.2 - TAU_FLOOR - 0.99)


def test_entropy_refined_and_a_curve_past_the_reference_at_one():
    from core.runs.temperature import LayerStats, algorithm1

    meas = _linear_measure(2.0, 0.0)  # entropy 2 tau falls as tau falls: 1.3 at tau = 0.65
    ref = LayerStats(pmax=np.array([0.0]), entropy=np.array([1.3]))
    assert algorithm1(meas, ref, "entropy", refined=True).tau == pytest.approx(0.65, abs=0.001)
    past = algorithm1(meas, LayerStats(pmax=np.array([0.0]), entropy=np.array([2.5])), "entropy", refined=True)
    assert past.tau == 1.0 and not past.reached and past.gap == pytest.approx(-0.5)


def test_per_head_matches_each_head_and_lists_the_unreachable():
    from core.runs.temperature import GRID, LayerStats, per_head

    slopes = np.array([[1.0, 0.5, 0.0], [2.0, 1.0, 0.3]])  # Pmax of (layer, head) = 1 - slope * tau; 0: a flat head
    refs = np.array([[0.30, 0.62, 0.9], [0.0, 0.35, 0.2]])  # head (1, 2) would need tau > 1: unreachable
    calls = []

    def measure(schedule):
        tau = np.asarray(schedule, dtype=float).reshape(2, 3)
        calls.append(tau)
        p = 1.0 - slopes * tau
        return LayerStats(pmax=p.mean(1), entropy=-p.mean(1), head_pmax=p, head_entropy=-p)

    ref = LayerStats(pmax=refs.mean(1), entropy=-refs.mean(1), head_pmax=refs, head_entropy=-refs)
    cal = per_head(measure, ref, 2, 3)
    sched = np.asarray(cal.schedule)
    # by hand: head (0,0) 1 - t = 0.30 -> t = 0.70; (0,1) 1 - t/2 = 0.62 -> 0.76 -> grid 0.75;
    # (1,0) 1 - 2t = 0 -> 0.5; (1,1) 1 - t = 0.35 -> 0.65; flat (0,2) and (1,2) (0.3 t >= 0.3 > 0.2... no) stay 1
    assert sched[0, 0] == 0.7 and sched[0, 1] == 0.75 and sched[1, 0] == 0.5 and sched[1, 1] == 0.65
    assert sched[0, 2] == 1.0 and sched[1, 2] == 1.0
    assert cal.unreached_heads == [(0, 2), (1, 2)] and not cal.reached
    assert cal.passes == 2 * len(GRID) + 1  # a pass per grid point per layer, all heads at once; one to check
    assert cal.to_dict()["unreached_heads"] == [[0, 2], [1, 2]]


def test_per_head_through_the_registry_on_a_tiny_model(tiny):
    from core.data import tasks
    from core.runs import methods

    doc = tasks.make("passkey", tiny.tokenizer, 600, seed=1)
    sched, info = methods.resolve(tiny, doc, "per-head")
    assert np.asarray(sched).shape == (tiny.n_layers, tiny.n_heads)
    assert set(np.asarray(sched).ravel()) <= set(T.GRID)
    assert info["source"] == "resolved" and "unreached_heads" in info
