"""core.runs.timing: measured pass times, estimates from them, and the words the pages show."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from core.runs import methods, timing
from core.values.choice import TRAINED

KEY = ("test-model", "cpu", "torch.float32")


@pytest.fixture(autouse=True)
def fresh():
    timing.clear(KEY)
    timing.clear(("other",))
    yield
    timing.clear(KEY)
    timing.clear(("other",))


def test_nothing_measured_gives_none():
    assert timing.estimate(KEY, 1000) is None
    timing.record(("other",), 1000, 1.0)
    assert timing.estimate(KEY, 1000) is None  # another model's times are not borrowed
    assert timing.total(KEY, [(3, 1000)]) is None


def test_one_length_scales_with_the_square():
    timing.record(KEY, 1000, 0.5)
    assert timing.estimate(KEY, 1000) == pytest.approx(0.5)
    assert timing.estimate(KEY, 2000) == pytest.approx(2.0)  # (2000/1000)^2 * 0.5
    assert timing.estimate(KEY, 500) == pytest.approx(0.125)


def test_nearest_length_is_used():
    timing.record(KEY, 256, 0.01)
    timing.record(KEY, 2048, 1.0)
    timing.record(KEY, 4096, 4.0)  # exactly quadratic between 2048 and 4096
    assert timing.estimate(KEY, 2048) == pytest.approx(1.0)
    # 3000 is nearer 4096 (log scale); local exponent from 2048/4096 is 2
    assert timing.estimate(KEY, 3000) == pytest.approx(4.0 * (3000 / 4096) ** 2)
    assert timing.estimate(KEY, 300) == pytest.approx(0.01 * (300 / 256) ** timing_exponent(256, 0.01, 2048, 1.0))


def timing_exponent(a, ta, b, tb):
    import math

    return min(2.0, max(1.0, math.log(tb / ta) / math.log(b / a)))


def test_local_exponent_is_kept_between_one_and_two():
    timing.record(KEY, 1000, 1.0)
    timing.record(KEY, 2000, 1.0)  # flat (overhead-bound): exponent clipped up to 1
    assert timing.estimate(KEY, 4000) == pytest.approx(2.0)
    timing.clear(KEY)
    timing.record(KEY, 1000, 1.0)
    timing.record(KEY, 2000, 16.0)  # steeper than quadratic (noise): clipped down to 2
    assert timing.estimate(KEY, 4000) == pytest.approx(64.0)


def test_repeated_lengths_use_the_median():
    for s in (0.9, 0.1, 0.12, 0.11, 0.1):  # one slow first pass (warm-up) does not dominate
        timing.record(KEY, 512, s)
    assert timing.estimate(KEY, 512) == pytest.approx(0.11)


def test_bad_records_are_ignored():
    timing.record(KEY, 0, 1.0)
    timing.record(KEY, 100, float("nan"))
    timing.record(KEY, 100, -1.0)
    assert timing.measured(KEY) == {}


def test_kinds_are_separate():
    timing.record(KEY, 100, 1.0, timing.GENERATE)
    assert timing.estimate(KEY, 100) is None
    assert timing.estimate(KEY, 100, timing.GENERATE) == pytest.approx(1.0)


def test_records_from_many_threads_all_arrive():
    def work(i):
        for j in range(200):
            timing.record(KEY, 1 + (i * 200 + j), 0.001)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(timing.measured(KEY)) == 8 * 200


def test_describe():
    assert timing.describe(0.2) == "under 1 s"
    assert timing.describe(8.4) == "about 8 s"
    assert timing.describe(61) == "about 61 s"
    assert timing.describe(125) == "about 2 min"
    assert timing.describe(50 * 60) == "about 50 min"
    assert timing.describe(2 * 3600) == "about 2.0 h"
    assert timing.describe(None) == "unknown"


def test_plan_note_says_count_and_time():
    assert timing.plan_note("Algorithm 1", KEY, [(12, 2045)]) == (
        "Algorithm 1 will run 12 encoder passes at 2,045 tokens; no pass has been timed on this model yet, "
        "so there is no time estimate."
    )
    timing.record(KEY, 2045, 0.75)
    timing.record(KEY, 256, 0.01)
    note = timing.plan_note("Algorithm 1", KEY, [(12, 2045), (1, 256)])
    assert note == (
        "Algorithm 1 will run 12 encoder passes at 2,045 tokens (plus 1 more): about 9 s on "
        "this machine (measured 0.75 s per pass here)."
    )
    assert "scaled from a 2,045-token pass" in timing.plan_note("x", KEY, [(1, 4000)])


def test_model_key_ignores_train_length():
    spec = SimpleNamespace(source="assets/models/x", name="x")
    a = SimpleNamespace(spec=spec, device="cpu", dtype="torch.float32", train_length=256)
    b = SimpleNamespace(spec=spec, device="cpu", dtype="torch.float32", train_length=512)
    assert timing.model_key(a) == timing.model_key(b)
    assert timing.model_key(a) != timing.model_key(SimpleNamespace(spec=spec, device="cuda:0", dtype="torch.float32"))


def test_engine_records_each_pass(tiny):
    from core.data import tasks
    from core.runs import engine

    key = timing.model_key(tiny)
    timing.clear(key)
    doc = tasks.make("passkey", tiny.tokenizer, 400, depth=0.5, seed=0)
    res = engine.run(tiny, doc, TRAINED, engine.Pass(generate=False))
    m = timing.measured(key)
    assert list(m) == [res.tokens]
    assert m[res.tokens] == pytest.approx(res.seconds["encode"])
    assert timing.measured(key, timing.GENERATE) == {}


def test_plan_note_can_name_every_length():
    timing.record(KEY, 512, 0.1)
    note = timing.plan_note("Measuring", KEY, [(1, 2048), (1, 512), (1, 1024)], name_all=True)
    assert note.startswith("Measuring will run 3 encoder passes at 512, 1,024 and 2,048 tokens: about 2 s")


def test_algorithm1_pass_counts():
    assert timing.algorithm1_passes(11, fast=False) == 11
    assert timing.algorithm1_passes(11, fast=True, criteria=1) == 6  # ends + ceil(log2 10) midpoints
    assert timing.algorithm1_passes(11, fast=True) == 10


def test_sweep_passes():
    got = timing.sweep_passes(
        [512, 1024],
        cells_per_length=6,
        costs=methods.costs(["pmax", "prop1", "tau=0.8"], 4, 8, samples=2, grid_size=11),
        train_length=256,
    )
    # per length: 6 cells + 6*2 (Alg. 1 bisection on 2 docs) + 1 (Prop. 1); L_tr: (2 + 1) per length
    assert got == [(19, 1024), (19, 512), (6, 256)]


def test_remaining_weighted_rescales_the_plan():
    # 10 s for work planned at 2 units; 6 units left -> 30 s, whatever the plan's absolute scale was
    assert timing.remaining_weighted(10.0, 2.0, 6.0) == pytest.approx(30.0)
    assert timing.remaining_weighted(10.0, 0.0, 6.0) is None


def test_a_bar_text_before_any_progress():
    assert timing.remaining(3.0, 0.0) is None
    assert timing.Countdown(120.0).text("Algorithm 1", 0.0, 0.0) == "Algorithm 1 0% · about 2 min left"
    assert timing.Countdown().text("x", 0.0, 0.0) == "x 0%" and timing.Countdown().text("x", 1.0, 5.0) == "x 100%"
