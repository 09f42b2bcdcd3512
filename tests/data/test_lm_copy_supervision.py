"""Copy supervision for language modelling: each continuation token's earlier copy in the prefix, the
per-token needle the trainer builds from it, the loss on it, and a training run that uses it."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from core.data import tasks
from core.data.tasks.lm import copy_positions
from core.models import ASSETS
from core.training import TrainConfig, needle_attention_loss, train
from core.training.data import needle_targets
from core.training.supervision import copy_needle, needle_token_mask


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(ASSETS / "retrieval-t5"))


def _offsets(tok, doc):
    enc = tok(doc.text, return_offsets_mapping=True)
    return enc.input_ids, enc.offset_mapping


@pytest.mark.parametrize("haystack,copy_room", [("corpus-eval", tasks.lm.COPY_ROOM), ("corpus-train", 180)])
def test_copy_positions_hold_the_continuation_token_for_token(tok, haystack, copy_room):
    seen = 0
    for n in (120, 256, 1024):
        for seed in range(16):
            d = tasks.make("lm", tok, n, seed=seed, haystack=haystack, repeat=1.0, copy_room=copy_room)
            ids, offsets = _offsets(tok, d)
            pos = copy_positions(d, offsets)
            if not d.meta["repeat"]:
                assert pos == [] and d.meta["copy_span"] == (0, 0)
                continue
            seen += 1
            cont = list(d.meta["continuation_ids"])
            assert [ids[p] for p in pos] == cont, (n, seed)
            assert tok.decode([ids[p] for p in pos]) == tok.decode(cont)
            assert pos == list(range(pos[0], pos[0] + len(cont)))  # one run of consecutive prefix tokens
            assert pos[-1] < len(ids) - 1  # inside the prefix, never the end-of-sequence token
            a, b = d.meta["copy_span"]
            assert tok.decode(cont).strip() == d.text[a:b].strip()[: len(tok.decode(cont).strip())]
    assert seen >= 20


def test_no_copy_means_no_target_and_bad_room_is_refused(tok):
    for seed in range(6):
        d = tasks.make("lm", tok, 256, seed=seed, repeat=0.0)
        assert d.meta["copy_span"] == (0, 0) and copy_positions(d, _offsets(tok, d)[1]) == []
    with pytest.raises(ValueError, match="copy_room"):
        tasks.make("lm", tok, 256, copy_room=0)
    default, roomy = (
        [
            tasks.make("lm", tok, 256, seed=s, haystack="corpus-train", repeat=1.0, copy_room=r).meta["repeat"]
            for s in range(30)
        ]
        for r in (tasks.lm.COPY_ROOM, 180)
    )
    assert all(r for d, r in zip(default, roomy) if d) and sum(roomy) > sum(default)  # more room: more copies


def _batch(tok):
    """An lm sequence with a copy, the same seed without one, and a pass key document, padded together."""
    seed = next(s for s in range(50) if tasks.make("lm", tok, 200, seed=s, repeat=1.0).meta["repeat"])
    docs = [
        tasks.make("lm", tok, 200, seed=seed, repeat=1.0),
        tasks.make("lm", tok, 200, seed=seed, repeat=0.0),
        tasks.make("passkey", tok, 150, depth=0.4, seed=3),
    ]
    enc = tok([d.text for d in docs], padding=True, return_tensors="pt", return_offsets_mapping=True)
    return docs, enc


def test_copy_needle_marks_each_tokens_own_copy(tok):
    docs, enc = _batch(tok)
    offsets = enc.offset_mapping.numpy()
    spans = needle_token_mask(offsets, [d.needle_span for d in docs])
    T = tasks.CONTINUATION
    needle = copy_needle(offsets, docs, T, spans)
    assert needle.shape == (3, T, enc.input_ids.shape[1])
    cont = list(docs[0].meta["continuation_ids"])
    assert needle[0].sum(1).tolist() == [1] * T  # one target per continuation token
    assert enc.input_ids[0][torch.from_numpy(needle[0].argmax(1))].tolist() == cont
    assert not needle[1].any()  # no copy: nothing to look at
    assert (needle[2] == spans[2][None, :]).all() and spans[2].any()  # other tasks: their needle span on every row
    cfg = TrainConfig(needle_attention={"lm": 1.0, "passkey": 0.5})
    nd, weight = needle_targets(cfg, docs, offsets, T)
    assert nd.shape == needle.shape and weight.tolist() == [1.0, 0.0, 0.5]
    nd, weight = needle_targets(TrainConfig(needle_attention={"passkey": 0.5}), docs, offsets, T)
    assert nd.shape == spans.shape and weight.tolist() == [0.0, 0.0, 0.5]  # the old [B, S] form, unchanged


def test_copy_loss_is_lowest_with_attention_on_each_tokens_copy(tok):
    docs, enc = _batch(tok)
    offsets = enc.offset_mapping.numpy()
    T, S = tasks.CONTINUATION, enc.input_ids.shape[1]
    needle = torch.from_numpy(copy_needle(offsets, docs[:1], T))
    mask = enc.attention_mask[:1].bool()
    target = needle[0].int().argmax(1)  # [T]
    answer = torch.ones(1, T, dtype=torch.bool)

    def loss(where: torch.Tensor) -> float:
        """One head whose row t puts logit 6 on token where[t] (the rest 0)."""
        lg = torch.zeros(1, 1, T, S)
        lg[0, 0, torch.arange(T), where] = 6.0
        return needle_attention_loss([lg], mask, needle, torch.ones(1), answer).item()

    on_copy, off_by_one, first_only = loss(target), loss(target + 1), loss(target[:1].expand(T))
    assert on_copy < off_by_one and on_copy < first_only
    share = math.exp(6) / (math.exp(6) + S - 1 - (~mask[0]).sum().item())
    assert on_copy == pytest.approx(-math.log(share), rel=1e-4)
    # one span repeated on every row is the [B, S] loss exactly
    span = torch.zeros(1, S, dtype=torch.bool)
    span[0, target[0] : target[0] + 4] = True
    lg = torch.randn(1, 2, T, S)
    assert needle_attention_loss(
        [lg], mask, span[:, None, :].expand(1, T, S), torch.ones(1), answer
    ).item() == pytest.approx(needle_attention_loss([lg], mask, span, torch.ones(1), answer).item(), rel=1e-5)


def _train_briefly(out):
    """A tiny model on lm sequences with copy supervision, stopped by its time limit after its first step."""
    cfg = TrainConfig(
        name="t",
        tasks={"lm": 1.0},
        first_tasks=None,
        train_length=128,
        min_length=112,
        curriculum_steps=0,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        eval_every=0,
        batch_size=4,
        steps=50,
        threads=1,
        needle_attention={"lm": 1.0},
        task_options={"lm": {"repeat": 1.0, "copy_room": 180}},
        max_minutes=1e-4,
    )
    return train(
        cfg, out, reuse_tokenizer=str(ASSETS / "retrieval-t5"), quiet=True, evaluate_at_end=False, device="cpu"
    )


@pytest.mark.slow
def test_training_with_copy_supervision_and_a_time_limit(tmp_path):
    """A tiny model trains on lm sequences with copy supervision (the loss is recorded, finite) and stops at its
    time limit with a card that says so."""
    card = _train_briefly(tmp_path / "m")
    curve = card["needle_attention_curve"]
    assert curve and all(np.isfinite(curve)) and curve[0] > 0
    assert 1 <= card["steps_done"] < 50 and "max_minutes" in card["metrics"]["stopped"]
    assert (tmp_path / "m" / "model.safetensors").exists()


@pytest.mark.slow
def test_training_after_a_streamlit_run_leaves_the_host_script_alone(tmp_path, monkeypatch):
    """Streamlit installs each script run's module as ``__main__`` and leaves it there; a spawned data producer
    re-runs ``__main__`` first, so before the fix every producer re-ran the last app script (in CI: a Sweep page
    whose temporary CSV was gone) and died before step 0. Here the host is a real Streamlit run of a script that
    fails when re-run that way."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])  # put back after the test
    script = tmp_path / "page.py"
    script.write_text(
        "import streamlit as st\n"
        'if __name__ == "__mp_main__":\n'
        '    raise SystemExit("a spawned producer re-ran the app script")\n'
        'st.write("a page")\n'
    )
    at = AppTest.from_file(str(script)).run()
    assert not at.exception
    assert getattr(sys.modules["__main__"], "__file__", None) == str(script)  # the host as Streamlit leaves it
    card = _train_briefly(tmp_path / "m")
    assert card["steps_done"] >= 1
    assert sys.modules["__main__"].__file__ == str(script)  # and as it was: training put it back
