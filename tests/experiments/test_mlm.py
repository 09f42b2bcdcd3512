"""Masked-token evaluation (core.experiments.mlm and ``python -m core mlm``): masking by seed, accuracy and perplexity equal to
a hand computation from transformers' own logits, the CLI's JSON rows and its one-line refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from transformers import ModernBertForMaskedLM

from conftest import build_tiny_rope
from core import cli
from core.data import tasks
from core.errors import UserError
from core.experiments import mlm
from core.models import load
from core.runs import methods
from core.values.choice import Choice

L_TR = 64


@pytest.fixture(scope="module")
def rope_dir(tmp_path_factory):
    return build_tiny_rope(tmp_path_factory.mktemp("mlm-rope"), train_length=L_TR, seed=5)


@pytest.fixture(scope="module")
def rope(rope_dir):
    return load(str(rope_dir), device="cpu")


def test_masking_is_seeded_and_skips_specials(rope):
    tok = rope.tokenizer
    ids = tok(tasks.make(tasks.LM, tok, 200, seed=1).text).input_ids
    a, b, c = (mlm.mask_tokens(tok, ids, s) for s in (3, 3, 4))
    special = set(tok.all_special_ids)
    candidates = [i for i, t in enumerate(ids) if t not in special]
    assert len(candidates) < len(ids)  # the end-of-sequence token is there, and never masked
    assert len(a.positions) == round(0.15 * len(candidates))
    assert set(a.positions) <= set(candidates) and list(a.positions) == sorted(set(a.positions))
    assert np.array_equal(a.positions, b.positions) and not np.array_equal(a.positions, c.positions)
    assert (a.ids[a.positions] == tok.mask_token_id).all()
    assert np.array_equal(a.labels, np.asarray(ids)[a.positions])
    keep = np.setdiff1d(np.arange(len(ids)), a.positions)
    assert np.array_equal(a.ids[keep], np.asarray(ids)[keep])


def _hand(logits: torch.Tensor, positions, labels) -> tuple[int, float]:
    """Correct predictions and summed -log p(true token) from full logits ``[n, vocab]``, log-softmax written out."""
    rows = logits[torch.as_tensor(positions)].double()
    top = rows.max(-1, keepdim=True).values
    logp = rows - top - torch.log(torch.exp(rows - top).sum(-1, keepdim=True))
    lab = torch.as_tensor(labels)
    nll = float(-logp[torch.arange(len(lab)), lab].sum())
    correct = int((rows.argmax(-1) == lab).sum())
    return correct, nll


@pytest.mark.parametrize("tau", [1.0, 0.6])
def test_metric_equals_hand_computation(rope, rope_dir, tau):
    """Accuracy and perplexity from our pass equal the same numbers from transformers' own forward (sdpa; at
    tau != 1 with W_q / tau, which is what dividing q.k by tau means), log-softmax computed here."""
    ref = ModernBertForMaskedLM.from_pretrained(str(rope_dir), attn_implementation="sdpa").eval()
    with torch.no_grad():
        for layer in ref.model.layers:
            layer.attn.Wqkv.weight[: ref.config.hidden_size].div_(tau)
    seqs = [mlm.sequence(rope, n, seed)[1] for n, seed in ((96, 11), (80, 12))]  # two lengths: a padded batch
    got = mlm.score(rope, seqs, Choice.of(tau=tau))
    correct, nll, masked = 0, 0.0, 0
    for s in seqs:
        with torch.no_grad():
            logits = ref(input_ids=torch.as_tensor(s.ids)[None]).logits[0]
        c, l = _hand(logits, s.positions, s.labels)
        correct, nll, masked = correct + c, nll + l, masked + len(s.labels)
    assert got.masked == masked == round(0.15 * 95) + round(0.15 * 79)
    assert got.correct == correct
    assert math.isclose(got.nll, nll, rel_tol=1e-5)
    rows = mlm.run_mlm(
        rope, mlm.MlmPlan(lengths=[96], methods=[methods.spell(methods.FIXED, tau)], sequences=1, seed=11)
    )
    one = _hand(ref(input_ids=torch.as_tensor(seqs[0].ids)[None]).logits[0].detach(), seqs[0].positions, seqs[0].labels)
    assert rows[0]["masked"] == len(seqs[0].labels)
    assert rows[0]["accuracy"] == one[0] / rows[0]["masked"]
    assert math.isclose(rows[0]["perplexity"], math.exp(one[1] / rows[0]["masked"]), rel_tol=1e-5)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["mlm", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_json_rows(rope_dir, capsys):
    infoscale = "infoscale"
    rc, out, _ = _cli(
        capsys,
        "--model",
        str(rope_dir),
        "--lengths",
        "1x,2x",
        "--methods",
        f"{methods.AS_TRAINED},{infoscale},tau=0.8",
        "--sequences",
        "3",
        "--seed",
        "2",
        "--json",
    )
    assert rc == 0
    doc = json.loads(out)
    assert doc["family"] == "rope" and doc["train_length"] == L_TR
    rows = doc["rows"]
    assert [(r["tokens"], r["method"]) for r in rows] == [
        (n, m) for n in (64, 128) for m in (methods.AS_TRAINED, infoscale, "tau=0.8")
    ]
    for r in rows:
        assert {"tokens", "train_length", "scheme", "method", "tau", "accuracy", "perplexity", "masked"} <= set(r)
        assert r["scheme"] == "none" and r["train_length"] == L_TR and r["actual_tokens"] == r["tokens"]
        assert 0.0 <= r["accuracy"] <= 1.0 and r["perplexity"] > 1.0 and r["masked"] >= 3 * round(0.15 * 60)
        assert r["cosine_scale"] is None
    taus = {(r["tokens"], r["method"]): r["tau"] for r in rows}
    assert taus[(64, infoscale)] == 1.0 and taus[(128, infoscale)] < 1.0 and taus[(128, "tau=0.8")] == 0.8
    # the same seeds give the same rows
    rc, again, _ = _cli(
        capsys,
        "--model",
        str(rope_dir),
        "--lengths",
        "1x,2x",
        "--methods",
        f"{methods.AS_TRAINED},{infoscale},tau=0.8",
        "--sequences",
        "3",
        "--seed",
        "2",
        "--json",
    )
    strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]  # noqa: E731
    assert strip(json.loads(again)["rows"]) == strip(rows)


def test_cli_measured_method_and_cosine_scale(tmp_path, capsys):
    folder = build_tiny_rope(tmp_path, cosine=16.0, seed=6, train_length=L_TR)
    pmax = methods.ALGORITHM1["pmax"]
    rc, out, _ = _cli(
        capsys,
        "--model",
        str(folder),
        "--lengths",
        "2x",
        "--methods",
        pmax,
        "--sequences",
        "2",
        "--cosine-scale",
        "32",
        "--json",
    )
    assert rc == 0
    (row,) = json.loads(out)["rows"]
    assert row["method"] == pmax and row["cosine_scale"] == 32.0 and isinstance(row["reached"], bool)
    assert 0 < row["tau"] <= 1.0


@pytest.mark.parametrize(
    "args, says",
    [
        (["--lengths", "0x"], "--lengths"),
        (["--lengths", "1x,,2x"], "--lengths"),
        (["--lengths", "abc"], "--lengths"),
        (["--lengths", "4"], "at least 8"),
        (["--methods", "no-such-method"], "Unknown method"),
        (["--methods", "tau=0"], "--methods"),
        (["--sequences", "0"], "--sequences"),
        (["--cosine-scale", "8"], "dot-product attention"),
    ],
)
def test_cli_bad_input_is_one_line(rope_dir, capsys, args, says):
    rc, out, err = _cli(capsys, "--model", str(rope_dir), "--sequences", "1", *args, "--json")
    assert rc == 2 and out == ""
    lines = [line for line in err.splitlines() if line.strip() and "it/s" not in line and "%|" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], err


def test_cli_refuses_a_t5_model(tiny_dir, capsys):
    rc, _, err = _cli(capsys, "--model", str(tiny_dir), "--lengths", "1x", "--json")
    assert rc == 2 and "masked-LM" in err and len(err.strip().splitlines()) == 1


def test_plan_refuses_overlapping_calibration_seeds():
    with pytest.raises(UserError, match="overlap"):
        mlm.MlmPlan(lengths=[64], methods=[methods.AS_TRAINED], sequences=10, seed=0, calib_seed=5).validated()
