"""Tests for core.models.tokenizer: exact round trips, single-digit tokens, T5 specials, save/load.

The tokenizer is trained here, on a small sample, so the tests exercise the
real training pipeline and finish in seconds.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # plain `pytest` (not `python -m pytest`) does not put the repo root on sys.path
    sys.path.insert(0, ROOT)

from core.models.tokenizer import SPECIAL_TOKENS, train_tokenizer, training_texts  # noqa: E402

VOCAB = 512


@pytest.fixture(scope="session")
def tok():
    return train_tokenizer(training_texts(docs_per_task=6), vocab_size=VOCAB)


TRICKY = [
    "plain ascii text.",
    " leading space",
    "   three leading spaces and trailing   ",
    "\n\nnewlines\tand\ttabs\r\n",
    "Accents: café, naïve, Zürich, São Paulo, Ærøskøbing.",
    "Emoji: 😀🎉👩‍💻 and flags 🇫🇷",
    "CJK: 中文字符, 日本語のテキスト, 한국어",
    "Mixed RTL: שלום עולם مرحبا",
    "Maths: ∑ x² ≤ ∞, α→β",
    "Literal specials: </s> <pad> <unk> must stay text",
    "digits 0123456789 and 48213.5e-3",
    "",
    " ",
]


@pytest.mark.parametrize("text", TRICKY)
def test_round_trip_exact(tok, text):
    ids = tok(text).input_ids
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_round_trip_random_unicode(tok):
    rng = random.Random(1234)
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x4E00, 0x4FFF), (0x1F300, 0x1F64F)]
    for _ in range(200):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randint(lo, hi)) if rng.random() < 0.8 else rng.choice(" \n\t"))
        text = "".join(chars)
        ids = tok(text).input_ids
        assert tok.unk_token_id not in ids, text
        assert tok.decode(ids, skip_special_tokens=True) == text, text


def test_special_token_ids_follow_t5(tok):
    assert SPECIAL_TOKENS == ("<pad>", "</s>", "<unk>")
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    ids = tok("hello world").input_ids
    assert ids[-1] == tok.eos_token_id
    assert ids.count(tok.eos_token_id) == 1
    # A literal "</s>" in user text is text, not an end of sequence.
    assert tok("a </s> b").input_ids.count(tok.eos_token_id) == 1


def test_vocab_size_respected(tok):
    assert len(tok) <= VOCAB
    assert len(tok) > 300  # merges were learned beyond the 256 bytes + specials


def test_every_digit_is_its_own_token(tok):
    rng = random.Random(7)
    for _ in range(50):
        key = str(rng.randint(10000, 99999))
        text = f"The pass key is {key}. Remember it. {key}0{key} is the pass key."
        enc = tok(text, return_offsets_mapping=True)
        digit_tokens = [
            (tok.convert_ids_to_tokens(i), (s, e))
            for i, (s, e) in zip(enc.input_ids, enc.offset_mapping)
            if e > s and any(c.isdigit() for c in text[s:e])
        ]
        assert len(digit_tokens) == sum(c.isdigit() for c in text)
        for token, (s, e) in digit_tokens:
            assert e - s == 1 and token == text[s] and token.isdigit()
    # The same digit has the same id wherever it appears (copying is a lookup).
    assert tok(" 7", add_special_tokens=False).input_ids[-1] == tok("a7", add_special_tokens=False).input_ids[-1]


def test_offsets_cover_ascii_text_exactly(tok):
    text = "There is an important info hidden inside. The pass key is 31415. What is it?"
    enc = tok(text, return_offsets_mapping=True)
    spans = [(s, e) for s, e in enc.offset_mapping if e > s]
    assert "".join(text[s:e] for s, e in spans) == text
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert enc.offset_mapping[-1] == (0, 0)  # the appended </s>


def test_offsets_in_bounds_for_unicode(tok):
    text = "Zürich 😀 中文 ok"
    enc = tok(text, return_offsets_mapping=True)
    starts = [s for s, e in enc.offset_mapping if e > s]
    assert starts == sorted(starts)
    assert all(0 <= s <= e <= len(text) for s, e in enc.offset_mapping)


def test_padding_right_with_pad_id(tok):
    batch = tok(["a b", "a much longer text here"], padding=True)
    first = batch["input_ids"][0]
    assert first[-1] == tok.pad_token_id == 0
    assert batch["attention_mask"][0][-1] == 0


def test_save_and_autotokenizer_round_trip(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.unk_token_id) == (0, 1, 2)
    for text in TRICKY:
        assert loaded(text).input_ids == tok(text).input_ids
        assert loaded.decode(loaded(text).input_ids, skip_special_tokens=True) == text
    assert loaded("1234", add_special_tokens=False).input_ids == tok("1234", add_special_tokens=False).input_ids


def test_training_is_deterministic():
    texts = ["The grass is green. The sky is blue."] * 20 + ["Line 12345: REGISTER_CONTENT is 67890"] * 20
    a = train_tokenizer(texts, vocab_size=300)
    b = train_tokenizer(texts, vocab_size=300)
    assert a.get_vocab() == b.get_vocab()


def test_too_small_vocab_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["abc"], vocab_size=100)


def test_training_texts_cover_tasks():
    texts = list(training_texts(docs_per_task=2, corpus=False))
    joined = "\n".join(texts)
    for marker in ("pass key", "REGISTER_CONTENT", "the topic of", "Document [1]", "def get_key"):
        assert marker in joined
