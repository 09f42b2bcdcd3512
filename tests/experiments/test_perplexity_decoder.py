"""Table 3 on a decoder-only LM (issue 57, item 2) on a tiny random Llama: every token of each held-out sequence
scored teacher-forced (equal to transformers' eager model's loss, at tau 1 and under tau), the mean per-token NLL
with its bootstrap SE over sequences, the NLL by position bucket in units of L_tr, ``--resume`` skipping finished
cells, and a position scheme's cell either carried by its choice or refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from core.data import tasks
from core.errors import UserError
from core.experiments import perplexity
from core.experiments.perplexity import BUCKET_COLUMNS, PerplexityPlan, run_perplexity, token_nll
from core.models import load
from core.runs import engine
from core.values.choice import TRAINED, Choice
from tests.runs.test_engine_decoder import TRAIN_LENGTH, build_tiny_llama


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama-ppl"), kv_heads=2)


@pytest.fixture(scope="module")
def llama(llama_dir):
    return load(str(llama_dir), device="cpu")


def _eager_losses(llama_dir, ids: np.ndarray, tau: float = 1.0) -> np.ndarray:
    """transformers' eager model's loss on each token after the ones before it, each attention's scaling over tau."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        llama_dir, attn_implementation="eager", dtype=torch.float32
    ).eval()
    for layer in model.model.layers:
        layer.self_attn.scaling = layer.self_attn.scaling / tau
    x = torch.as_tensor(ids)[None]
    with torch.no_grad():
        logits = model(input_ids=x).logits[0]
    return torch.nn.functional.cross_entropy(logits[:-1], x[0, 1:], reduction="none").numpy()


@pytest.mark.slow
def test_every_token_scored_as_eager(llama, llama_dir, monkeypatch):
    doc = tasks.make("lm", llama.tokenizer, 300, seed=3)
    ids = engine.encode(llama, doc).input_ids
    monkeypatch.setattr(perplexity, "LOGIT_ROWS", 64)  # several chunks of the vocabulary's logits
    for tau in (1.0, 0.6):
        got = token_nll(llama, ids, Choice.of(tau=tau))
        assert got.shape == (len(ids) - 1,)
        np.testing.assert_allclose(got, _eager_losses(llama_dir, ids, tau), rtol=1e-4, atol=1e-5)
    assert not np.allclose(token_nll(llama, ids, TRAINED), token_nll(llama, ids, Choice.of(tau=0.6)), rtol=1e-3)


def test_bootstrap_se():
    assert perplexity.bootstrap_se([2.0]) == 0.0 and perplexity.bootstrap_se([3.0, 3.0, 3.0]) == 0.0
    v = np.random.default_rng(1).normal(size=40)
    assert perplexity.bootstrap_se(v) == pytest.approx(v.std(ddof=0) / np.sqrt(len(v)), rel=0.1)
    assert perplexity.bootstrap_se(v) == perplexity.bootstrap_se(v)  # seeded


@pytest.mark.slow
def test_rows_buckets_and_resume(llama, tmp_path):
    out = tmp_path / "ppl.csv"
    plan = PerplexityPlan(model="tiny", lengths=[100, 600], methods=["none", "tau=0.7"], sequences=3)
    df = run_perplexity(llama, plan, out=out)
    assert len(df) == 4 and set(df["scheme"]) == {"none"}
    long = df[(df["tokens"] == 600) & (df["method"] == "none")].iloc[0]
    docs = perplexity.sequences(llama, 600, plan.validated())
    losses = [token_nll(llama, engine.encode(llama, d).input_ids, TRAINED) for d in docs]
    means = [float(lost.mean()) for lost in losses]
    assert long["nll_per_token"] == pytest.approx(np.mean(means), abs=1e-4)
    assert long["nll_se"] == pytest.approx(perplexity.bootstrap_se(means), abs=1e-4) and long["nll_se"] > 0
    assert long["scored_tokens"] == sum(len(lost) for lost in losses)
    # position buckets in units of L_tr (256): [0,128) [128,256) [256,512) [512,1024), the token at index i + 1
    pos = np.arange(1, len(losses[0]) + 1)
    for col, (lo, hi) in zip(BUCKET_COLUMNS[:4], [(0, 128), (128, 256), (256, 512), (512, 1024)]):
        want = np.concatenate([lost[(pos >= lo) & (pos < hi)] for lost in losses]).mean()
        assert long[col] == pytest.approx(want, abs=1e-4), col
    assert all(long[c] == "" for c in BUCKET_COLUMNS[4:])
    short = df[(df["tokens"] == 100) & (df["method"] == "none")].iloc[0]
    assert short[BUCKET_COLUMNS[0]] != "" and short[BUCKET_COLUMNS[1]] == ""
    assert TRAIN_LENGTH == 256
    before = out.read_text()
    again = run_perplexity(llama, plan, out=out, resume=True)  # every cell done: nothing runs, nothing is added
    assert out.read_text() == before and len(again) == 4


def test_a_scheme_cell_runs_under_its_scheme_or_is_refused_in_one_line(llama, tmp_path):
    plan = PerplexityPlan(model="tiny", lengths=[300], methods=["none"], sequences=2, schemes=("none", "yarn-rope"))
    try:
        df = run_perplexity(llama, plan)
    except UserError as err:  # until decoder-only models take position schemes: one line naming the scheme
        assert "yarn-rope" in str(err) and "\n" not in str(err)
        return
    assert list(df["scheme"]) == ["none", "yarn-rope"]
    assert df["nll_per_token"].iloc[0] != pytest.approx(df["nll_per_token"].iloc[1], abs=1e-6)


def test_plan_refuses_a_scheme_twice():
    plan = PerplexityPlan(
        model="tiny", lengths=[100], methods=["none"], sequences=2, schemes=("yarn-rope", "yarn-rope")
    )
    with pytest.raises(UserError, match="twice"):
        plan.validated()
