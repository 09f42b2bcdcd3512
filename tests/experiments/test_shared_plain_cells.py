"""Cells that compute the model's own attention share one pass (issue 57's tables at 1x L_tr): on a tiny random
Llama (L_tr 256), tau = 1, log-length, Qwen's log-n, YaRN and dynamic NTK are each the model's own pass at L_tr, so a
perplexity table or a pass-key sweep runs it once per document, across a resume too; the shared numbers equal the
ones each cell gives when scored on its own, and past L_tr nothing is shared."""

from __future__ import annotations

import pytest

from core.experiments import sweep
from core.experiments.perplexity import PerplexityPlan, run_perplexity, score, sequences
from core.experiments.sweep import SweepPlan, run_sweep
from core.models import load
from core.runs import calibration, engine, methods
from core.values.choice import Choice
from tests.runs.test_engine_decoder import TRAIN_LENGTH, build_tiny_llama


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load(str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama-shared"), kv_heads=2)), device="cpu")


def _choice(llama, method: str, scheme: str, n: int) -> Choice:
    name, value = methods.parse(method)
    tau, _ = methods.resolve(llama, None, name, value, tokens=n)
    return Choice.of(tau=tau, method=name, scheme=scheme)


@pytest.mark.parametrize(
    "method, scheme, at_l_tr, past",
    [
        ("none", "none", True, True),
        ("log-length", "none", True, False),
        ("log-n", "none", True, False),
        ("log-n-rows", "none", True, False),
        ("none", "yarn-rope", True, False),
        ("none", "dynamic-ntk", True, False),
        ("none", "pi", True, False),
        ("llama4", "none", False, False),  # row L_tr - 1 already moves: (p + 1) / floor_scale = 1
        ("tau=0.9", "none", False, False),
        ("none", "window:window=32", False, False),  # a mask computes the logits another way, whatever it covers
    ],
)
def test_which_choices_act_plain(llama, method, scheme, at_l_tr, past):
    cfg, lt = llama.config, llama.train_length
    assert lt == TRAIN_LENGTH
    assert _choice(llama, method, scheme, lt).acts_plain(cfg, lt, lt) is at_l_tr
    assert _choice(llama, method, scheme, 2 * lt).acts_plain(cfg, lt, 2 * lt) is past


def test_log_n_moves_once_answer_rows_pass_l_tr(llama):
    cfg, lt = llama.config, llama.train_length
    c = _choice(llama, "log-n-rows", "none", lt)
    assert c.acts_plain(cfg, lt, lt) and not c.acts_plain(cfg, lt, lt, rows=lt + 4)


def test_perplexity_at_l_tr_runs_the_pass_once_and_resumes_it(llama, tmp_path):
    out = tmp_path / "ppl.csv"
    n = TRAIN_LENGTH
    first = PerplexityPlan(model="tiny", lengths=[n, 2 * n], methods=["none"], sequences=2)
    run_perplexity(llama, first, out=out)
    plan = PerplexityPlan(
        model="tiny", lengths=[n, 2 * n], methods=["none", "log-length"], schemes=("none", "yarn-rope"), sequences=2
    )
    df = run_perplexity(llama, plan, out=out, resume=True).set_index(["tokens", "scheme", "method"])
    at = df.loc[n]
    assert at.loc[("none", "none"), "seconds"] > 0
    others = [("none", "log-length"), ("yarn-rope", "none"), ("yarn-rope", "log-length")]
    for key in others:  # read from the resumed tau = 1 row, no pass
        assert at.loc[key, "seconds"] == 0.0
        assert at.loc[key, "nll_per_token"] == at.loc[("none", "none"), "nll_per_token"]
    # the shared numbers are what the cell gives scored on its own
    docs = sequences(llama, n, plan.validated())
    alone = score(llama, docs, _choice(llama, "log-length", "yarn-rope", n))
    assert at.loc[("yarn-rope", "log-length"), "nll_per_token"] == pytest.approx(alone["nll_per_token"], abs=1e-5)
    past = df.loc[2 * n]
    assert (past["seconds"] > 0).all()
    assert past.loc[("none", "log-length"), "nll_per_token"] != past.loc[("none", "none"), "nll_per_token"]


def test_sweep_at_l_tr_runs_each_document_once(llama, tmp_path):
    n = TRAIN_LENGTH
    plan = SweepPlan(
        model="tiny",
        task="passkey",
        lengths=[n, 2 * n],
        depths=[0.3],
        seeds=[0, 1],
        methods=["none", "log-length"],
        schemes=("none", "dynamic-ntk"),
    )
    df = run_sweep(llama, plan, out=tmp_path / "s.csv")
    shared = 0
    for (tokens, seed), rows in df.groupby(["tokens", "seed"]):
        doc = sweep.tasks.make("passkey", llama.tokenizer, n, depth=0.3, seed=seed)
        prompt = len(engine.encode(llama, doc).input_ids)
        if tokens == n and prompt <= n:
            assert (rows["seconds"] > 0).sum() == 1, rows[["scheme", "method", "seconds"]]
            assert rows["answer"].astype(str).nunique() == 1 and rows["pmax"].nunique() == 1
            shared += 1
        else:
            assert (rows["seconds"] > 0).all()
    assert shared, "no document at L_tr fitted in L_tr: nothing was checked"


def test_a_plain_plan_resumed_into_a_scheme_table(llama, tmp_path):
    """Plain methods added to a table of schemes (``--resume`` into its CSV) keep its columns, are told apart from
    a scheme's row of the same method, and share the pass of a scheme's cell that was the model's own."""
    n, out = TRAIN_LENGTH, tmp_path / "t.csv"
    kw = dict(model="tiny", task="passkey", lengths=[n], depths=[0.5], seeds=[3])  # a prompt of 255 tokens
    run_sweep(llama, SweepPlan(methods=["none"], schemes=("yarn-rope",), **kw), out=out)
    df = run_sweep(llama, SweepPlan(methods=["none", "tau=0.8"], **kw), out=out, resume=True)
    assert list(df.columns) == sweep.COLUMNS + sweep.SCHEME_COLUMNS
    got = df.set_index(["scheme", "method"])
    assert len(got) == 3 and got.loc[("none", "none"), "seconds"] == 0.0 and got.loc[("none", "tau=0.8"), "seconds"] > 0
    assert got.loc[("none", "none"), "answer"] == got.loc[("yarn-rope", "none"), "answer"]


@pytest.mark.parametrize("method", ["pmax", "entropy", "per-layer"])
def test_a_search_at_l_tr_on_its_own_reference_is_tau_1_without_passes(llama, method, monkeypatch):
    """At L_tr a table's calibration documents are their own references: the search's answer is tau = 1, reached,
    no gap: the shortcut gives what the search over the grid gives, and runs no pass."""
    n = TRAIN_LENGTH
    plan = SweepPlan(model="tiny", task="passkey", lengths=[n], depths=[0.5], seeds=[0], methods=[method])
    plan = plan.validated()
    doc = sweep.tasks.make("passkey", llama.tokenizer, n, depth=0.5, seed=plan.calib_seed + n)
    searched, info = methods.resolve(llama, doc, method, samples=plan.calib_samples)
    assert searched.mean(n) == 1.0 and info["reached"] and info["gap"] == 0.0
    calls = []
    measures = calibration.measures
    monkeypatch.setattr(calibration, "measures", lambda *a, **k: calls.append(a) or measures(*a, **k))
    tau, outcome = sweep.resolve_for(llama, plan, n, method, None, {})
    assert tau.is_one and outcome == {"reached": True, "gap": 0.0} and not calls
    sweep.resolve_for(llama, plan, 2 * n, method, None, {})  # past L_tr the search runs
    assert len(calls) == 1
