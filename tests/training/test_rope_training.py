"""Training the bundled rotary encoders (core.training.mlm): the masking is BERT's at 15 % and never touches a
special token, a few steps lower the masked loss, the saved folder is a complete ModernBERT masked-LM that
transformers and core.models load, and the same seed gives the same run. Tiny configs: seconds each."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.training import TrainConfig, load_stages, mlm, train

BPE = Path(__file__).resolve().parents[2] / "assets" / "models" / "retrieval-t5"
# Small enough for seconds on one thread; the stdlib train pool loads at once (the shipped recipes use "lm-train").
TINY = dict(
    name="tiny-rope",
    family="rope",
    train_length=64,
    batch_size=8,
    steps=40,
    lr=3e-3,
    warmup=5,
    encoder_layers=2,
    d_model=32,
    d_ff=64,
    num_heads=2,
    eval_every=0,
    eval_docs=4,
    threads=1,
    seed=0,
    mlm={"pool": "corpus-train"},
)


@pytest.fixture(scope="module")
def tok():
    return mlm.get_tokenizer(BPE)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny run with its final evaluation (8 held-out sequences instead of 200)."""
    out = tmp_path_factory.mktemp("rope") / "tiny"
    mp = pytest.MonkeyPatch()
    mp.setattr(mlm, "FINAL_SEQUENCES", 8)
    try:
        card = train(TrainConfig(**TINY), out, reuse_tokenizer=BPE, quiet=True)
    finally:
        mp.undo()
    return out, card


def test_the_bundled_bpe_gets_a_mask_token(tok):
    """The T5s' BPE has no mask token; ours adds one, special, so text never tokenises into it."""
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(BPE).mask_token_id is None
    assert tok.mask_token == mlm.MASK_TOKEN and tok.mask_token_id == 2048 and len(tok) == 2049
    assert tok.mask_token_id not in tok(f"a {mlm.MASK_TOKEN} in pasted text").input_ids  # split_special_tokens


def _ids_with_specials(tok, seed: int, rows: int = 4, length: int = 64) -> np.ndarray:
    """Ordinary token ids with some specials (pad, eos, unk, mask) at random places, as a padded batch might have."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, 2048, size=(rows, length))
    specials = mlm.special_ids(tok)
    hits = rng.random(ids.shape) < 0.2
    ids[hits] = rng.choice(specials, size=int(hits.sum()))
    ids[:, -1] = tok.eos_token_id
    return ids


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rate=st.sampled_from([0.15, 0.3]))
def test_masking_takes_the_rate_of_ordinary_tokens_and_never_a_special_one(tok, seed, rate):
    ids = _ids_with_specials(tok, seed)
    inputs, labels = mlm.mask_batch(ids, tok, np.random.default_rng(seed), rate)
    special = np.isin(ids, mlm.special_ids(tok))
    for r in range(ids.shape[0]):
        want = max(1, int(round(rate * int((~special[r]).sum()))))
        assert int((labels[r] != -100).sum()) == want
    asked = labels != -100
    assert not (asked & special).any()  # a special token is never a label ...
    assert (inputs[special] == ids[special]).all()  # ... nor changed
    assert (inputs[~asked] == ids[~asked]).all()  # only chosen positions change
    assert (labels[asked] == ids[asked]).all()  # the label is the true token
    assert not np.isin(
        inputs[asked & (inputs != tok.mask_token_id)], mlm.special_ids(tok)
    ).any()  # random ones are ordinary


def test_masking_is_bert_80_10_10(tok):
    """Of ~9,600 chosen positions: about 80 % <mask>, 10 % another token, 10 % kept (binomial: +-1.5 points is >4 sd)."""
    ids = np.random.default_rng(0).integers(3, 2048, size=(1000, 64))
    inputs, labels = mlm.mask_batch(ids, tok, np.random.default_rng(1), 0.15)
    asked = labels != -100
    assert asked.sum() == 1000 * 10  # round(0.15 x 64) per row
    share = {"mask": (inputs[asked] == tok.mask_token_id).mean(), "kept": (inputs[asked] == ids[asked]).mean()}
    share["random"] = 1 - share["mask"] - share["kept"]
    assert abs(share["mask"] - 0.8) < 0.015 and abs(share["kept"] - 0.1) < 0.015 and abs(share["random"] - 0.1) < 0.015


def test_a_batch_is_exactly_l_tr_tokens_from_the_training_pool(tok):
    """Windows of L_tr - 1 stream tokens and </s>, as held-out sequences are counted; a function of (seed, step)."""
    cfg = TrainConfig(**TINY)
    stream = mlm.token_stream(tok, "corpus-train", cfg.seed)
    (a, la), (b, lb), (c, _) = (mlm.batch_at(stream, tok, cfg, s, 0.15) for s in (3, 3, 4))
    assert a.shape == (cfg.batch_size, 64) and (a[:, -1] == tok.eos_token_id).all()
    assert (a == b).all() and (la == lb).all() and not (a == c).all()
    with pytest.raises(ValueError, match="never the evaluation pool"):
        mlm.options(TrainConfig(**{**TINY, "mlm": {"pool": "corpus-eval"}}))
    with pytest.raises(ValueError, match="unknown"):
        mlm.options(TrainConfig(**{**TINY, "mlm": {"mask_ratio": 0.2}}))


def test_a_few_steps_lower_the_masked_loss(trained):
    _, card = trained
    curve = card["loss_curve"]
    assert len(curve) == 40 and curve[0] > 7.0  # ~ln(vocab) at the start
    assert np.mean(curve[-5:]) < np.mean(curve[:5]) - 0.5, curve


def test_the_saved_folder_is_a_complete_modernbert_masked_lm(trained):
    from transformers import ModernBertForMaskedLM

    from core.models import load

    out, card = trained
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "card.json",
        "train_config.json",
    } <= {p.name for p in out.iterdir()}
    saved = json.loads((out / "card.json").read_text())
    assert saved["family"] == "rope" and saved["train_length"] == 64 and saved["tasks"] == ["mlm"]
    assert saved["finished"] and saved["steps_done"] == 40 and saved["seed"] == 0 and saved["threads"] == 1
    m = saved["metrics"]
    assert m["tokens"] == 64 and m["sequences"] == 8 and 0 <= m["masked_accuracy"] <= 1 and m["masked_perplexity"] > 1
    assert "accuracy" not in m  # a T5 card's {task: %}: the bundled regression tests replay those per task
    ref = ModernBertForMaskedLM.from_pretrained(str(out), attn_implementation="sdpa").eval()
    assert all(t == "full_attention" for t in ref.config.layer_types)
    assert ref.config.rope_parameters["full_attention"]["rope_theta"] == 10_000.0
    loaded = load(str(out), device="cpu")
    assert loaded.family == "rope" and loaded.train_length == 64 and loaded.tokenizer.mask_token_id == 2048
    assert loaded.model.config._attn_implementation == "aligned" and not loaded.cosine
    ids = torch.tensor([loaded.tokenizer("The module reads the file and returns a list of lines.").input_ids])
    with torch.no_grad():  # our attention (trained with) and transformers' own give the same logits
        assert torch.allclose(loaded.model(input_ids=ids).logits, ref(input_ids=ids).logits, atol=1e-5)
    # the recipe beside the weights retrains it
    assert [c.family for c in load_stages(out / "train_config.json")] == ["rope"]


def test_the_same_seed_gives_the_same_run_and_another_seed_another(tmp_path):
    from safetensors.torch import load_file

    short = {**TINY, "steps": 3}
    runs = [
        train(
            TrainConfig(**{**short, "seed": s}),
            tmp_path / f"r{k}",
            reuse_tokenizer=BPE,
            quiet=True,
            evaluate_at_end=False,
        )
        for k, s in enumerate((5, 5, 6))
    ]
    assert runs[0]["loss_curve"] == runs[1]["loss_curve"] and runs[0]["loss_curve"][0] != runs[2]["loss_curve"][0]
    a, b = load_file(str(tmp_path / "r0" / "model.safetensors")), load_file(str(tmp_path / "r1" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_cosine_variant_trains_with_its_s(tmp_path):
    """cosine_scale in the recipe: the saved config says cosine attention at that s, and core.models reads it."""
    from core.models import load

    card = train(
        TrainConfig(**{**TINY, "steps": 2, "cosine_scale": 16.0}),
        tmp_path / "cos",
        reuse_tokenizer=BPE,
        quiet=True,
        evaluate_at_end=False,
    )
    loaded = load(str(tmp_path / "cos"), device="cpu")
    assert loaded.cosine and loaded.cosine_scale == 16.0 == card["config"]["cosine_scale"]
    assert "cosine attention s=16" in card["summary"]


def test_family_dispatch_refuses_what_it_cannot_train(tmp_path):
    with pytest.raises(ValueError, match="family must be"):
        train(TrainConfig(**{**TINY, "family": "gpt"}), tmp_path / "x", reuse_tokenizer=BPE, quiet=True)
    with pytest.raises(ValueError, match="init_from"):
        train(TrainConfig(**{**TINY, "init_from": str(BPE)}), tmp_path / "y", reuse_tokenizer=BPE, quiet=True)
