"""Language modelling: the LM sequences, the perplexity of a run against a hand computation, the CLI contract."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from core.data import tasks
from core.experiments.perplexity import PerplexityPlan, run_perplexity, score
from core.runs import engine
from core.values.choice import TRAINED, Choice


def test_same_seed_same_continuation_at_every_length(tiny):
    short = tasks.make("lm", tiny.tokenizer, 60, seed=3)
    long = tasks.make("lm", tiny.tokenizer, 400, seed=3)
    assert short.meta["continuation_ids"] == long.meta["continuation_ids"]
    assert long.text.endswith(short.text)  # the past grows backwards
    for d, n in ((short, 60), (long, 400)):
        count = len(tiny.tokenizer(d.text).input_ids)
        assert count == d.meta["tokens"] and n - 8 <= count <= n
        assert len(d.meta["continuation_ids"]) == tasks.CONTINUATION


def test_seeds_and_pools_differ(tiny):
    a, b = (tasks.make("lm", tiny.tokenizer, 80, seed=s) for s in (0, 1))
    assert a.text != b.text
    held_out = tasks.make("lm", tiny.tokenizer, 80, seed=0)
    train = tasks.make("lm", tiny.tokenizer, 80, seed=0, haystack="corpus-train")
    assert held_out.meta["haystack"] == "corpus-eval" and train.text != held_out.text
    with pytest.raises(ValueError):
        tasks.make("lm", tiny.tokenizer, 80, haystack="nowhere")


def test_run_perplexity_equals_hand_computation(tiny):
    doc = tasks.make("lm", tiny.tokenizer, 90, seed=5, continuation=12)
    res = engine.run(tiny, doc, TRAINED, engine.Pass(generate=False))
    ids = torch.tensor([tiny.tokenizer(doc.text).input_ids])
    labels = torch.tensor([list(doc.meta["continuation_ids"])])
    with torch.no_grad():  # transformers' own T5 (sdpa attention), teacher-forced
        model = type(tiny.model).from_pretrained(tiny.spec.source, attn_implementation="sdpa")
        logits = model(input_ids=ids, labels=labels).logits[0]
    logp = torch.log_softmax(logits.double(), -1)
    hand = -sum(float(logp[i, t]) for i, t in enumerate(labels[0].tolist()))
    assert res.scored_tokens == 12
    assert res.nll == pytest.approx(hand, rel=1e-4)
    assert res.perplexity == pytest.approx(math.exp(hand / 12), rel=1e-4)
    assert res.summary()["perplexity"] == pytest.approx(res.perplexity)


def test_temperature_changes_perplexity_and_batches_agree(tiny):
    docs = [tasks.make("lm", tiny.tokenizer, 70 + 9 * i, seed=i, continuation=8) for i in range(3)]
    one = score(tiny, docs, TRAINED, batch_size=1)
    three = score(tiny, docs, TRAINED, batch_size=3)  # padded batch: same sums
    assert three["nll"] == pytest.approx(one["nll"], rel=1e-4) and three["scored_tokens"] == 24
    assert one["perplexity"] == pytest.approx(math.exp(one["nll"] / 24))
    sharp = score(tiny, docs, Choice.of(tau=0.5), batch_size=3)
    assert abs(sharp["nll"] - one["nll"]) > 1e-3


def test_plan_refuses_tuning_on_scored_seeds(tiny):
    from core.errors import UserError

    plan = PerplexityPlan(model="tiny", lengths=[64], methods=["none"], sequences=10, seed=0, calib_seed=5)
    with pytest.raises(UserError, match="overlap"):
        run_perplexity(tiny, plan)


def test_resume_keeps_one_row_per_cell(tiny, tmp_path):
    out = tmp_path / "ppl.csv"
    plan = PerplexityPlan(model="tiny", lengths=[48, 96], methods=["none", "0.7"], sequences=2, continuation=6)
    first = run_perplexity(tiny, plan, out=out, should_stop=lambda: len(out.read_text().splitlines()) >= 3)
    assert len(first) == 2
    full = run_perplexity(tiny, plan, out=out, resume=True)
    assert len(full) == 4 and set(full["method"]) == {"none", "tau=0.7"}
    assert len(out.read_text().splitlines()) == 5  # header + one row per cell


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_json_contract(tiny_dir):
    p = _cli(
        "perplexity",
        "--model",
        str(tiny_dir),
        "--lengths",
        "64,512",
        "--methods",
        "none,log-length,0.8",
        "--sequences",
        "2",
        "--continuation",
        "6",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["train_length"] == 256 and len(out["rows"]) == 6
    for row in out["rows"]:
        assert {"tokens", "train_length", "method", "tau", "perplexity", "sequences"} <= set(row)
        assert row["sequences"] == 2 and row["perplexity"] > 1
    tau = {(r["tokens"], r["method"]): r["tau"] for r in out["rows"]}
    assert tau[(512, "log-length")] == pytest.approx(
        math.log(256) / math.log(512), abs=0.005
    )  # of the sequence's own length
    assert tau[(64, "tau=0.8")] == 0.8


@pytest.mark.parametrize(
    "args", [("--sequences", "0"), ("--methods", "bogus"), ("--lengths", "0x"), ("--calib-seed", "0")]
)
def test_cli_bad_input_is_one_line(tiny_dir, args, capsys):
    from core.cli import main

    assert main(["perplexity", "--model", str(tiny_dir), "--lengths", "64", "--sequences", "2", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1, err


def test_some_sequences_repeat_their_passage_earlier_whatever_the_length():
    from transformers import AutoTokenizer

    from core.models import ASSETS

    tok = AutoTokenizer.from_pretrained(str(ASSETS / "retrieval-t5"))
    seen = 0
    for seed in range(12):
        short, long = (tasks.make("lm", tok, n, seed=seed) for n in (128, 1024))
        assert short.meta["repeat"] == long.meta["repeat"]  # a seed repeats at every length or at none
        head = tok.decode(list(short.meta["continuation_ids"])[:12]).strip()
        for d in (short, long):
            assert (head in d.text) == d.meta["repeat"], seed  # the copy is the continuation's only way in
        seen += short.meta["repeat"]
    assert 2 <= seen <= 10
    assert not any(tasks.make("lm", tok, 256, seed=s, repeat=0.0).meta["repeat"] for s in range(6))
