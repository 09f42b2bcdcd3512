"""Language modelling: a prefix of held-out prose, and the continuation the decoder must predict.

The paper's first experiment (Chi et al., Table 3) is the perplexity of
LM-adapted T5 models: the encoder reads a prefix of ``L_ex`` tokens, the
decoder is scored on how well it predicts the text that follows. This module
makes those sequences from the offline corpus (:mod:`core.data.corpus`):

- a sequence of seed ``s`` is a seeded shuffle of the pool's paragraphs, joined
  by spaces, that *ends* with the continuation: the last paragraph (the
  *anchor*, 40-60 words) is drawn first and the past grows backwards from it,
  so the same seed at 1x and 8x L_tr asks for the same continuation after a
  longer past (a length sweep compares like with like, and Algorithm 1's L_tr
  reference is the same sequence cut to L_tr);
- with chance ``repeat`` (default :data:`REPEAT`) the passage the continuation
  comes from appeared before, at a seeded depth of the prefix: its 8 words
  before the continuation and the continuation itself, as a paragraph of its
  own. Real long documents repeat names, phrases and passages, and that is
  what makes a language model read far back; shuffled paragraphs alone do
  not: a 2M-parameter model trained on them used only its last ~16 prefix
  tokens (perplexity 153.6 with 16 tokens, 152.3 with 128: docs/models.md),
  so its perplexity could not depend on how attention spreads over a long
  prefix. ``meta["repeat"]`` says whether this sequence has the earlier copy, and
  ``meta["copy_span"]`` where it is: the characters of ``text`` that repeat the
  continuation (from the space before its first word to the end of the word of
  its last token, as the continuation's ids start with that space; ``(0, 0)``
  without a copy), so :func:`copy_positions` can point each continuation token
  at its own earlier copy (the trainer's copy supervision,
  :mod:`core.training.supervision`). ``copy_room`` bounds the copy and the last
  paragraph's head together (default :data:`COPY_ROOM`; the trainer may raise it so
  more of its sequences repeat: the held-out ones keep the default);
- the continuation is ``continuation`` tokens (default :data:`CONTINUATION`),
  kept as token ids in ``meta["continuation_ids"]`` (its text, ``expected``, is
  for display only: a slice ending inside a word may tokenise differently);
- words are tokenised with the space before them and the prefix is cut at
  word starts, so re-tokenising ``text`` gives the prefix's tokens (tokenizers
  split at spaces first); where no word start gives exactly ``tokens`` tokens
  (the first word loses its space, which can cost a token), the prefix starts
  inside the word before, at the character that makes the count exact (or,
  for a byte tokenizer one byte short, with the first word's space).

``haystack`` picks the pool: "corpus-eval" (default: held out from training),
"corpus-train", or "lm-train" (the training sequences of ``python -m core
train`` with ``tasks: {"lm": 1}``: the train pool plus installed packages'
docstrings, :func:`core.data.corpus.lm_train_pool`). ``depth`` is accepted and ignored (the copy's depth is
drawn from the seed), so an LM document goes through every place a retrieval
document does.
"""

from __future__ import annotations

import operator
import random
import weakref
from typing import Any

import numpy as np

from core.data.tasks.document import Document, _check_seed

LM = "lm"
#: Tokens of continuation scored per sequence (the decoder's labels).
CONTINUATION = 32
#: Chance that a sequence repeats its last passage earlier in the prefix (see the module docstring); about
#: 2 in 3 of those fit (COPY_ROOM), so about half of all sequences of 112+ tokens repeat.
REPEAT = 0.75
#: Words of context before the continuation that the earlier copy carries.
COPY_CONTEXT = 8
#: The last paragraph's length in words: long enough to hold the continuation, short enough that
#: its head and the earlier copy fit in a prefix of 128 tokens (so 1x L_tr sequences repeat too).
ANCHOR_WORDS = (40, 60)
#: Tokens the earlier copy and the last paragraph's head may take together (see make_lm).
COPY_ROOM = 100
LM_HAYSTACKS = ("corpus-eval", "corpus-train", "lm-train")
#: Which held-out sequences a perplexity cell scores (its ``copy`` column; :mod:`core.experiments.perplexity` says how
#: each is drawn). Here, not there, so that ``python -m core perplexity --copy`` is checked without importing torch.
COPY_MIXED, COPY_WITH, COPY_WITHOUT = "mixed", "with", "without"
COPY_KINDS = (COPY_MIXED, COPY_WITH, COPY_WITHOUT)


def continuation_ids(document: Document) -> list[int]:
    """The token ids the decoder is scored on (no end-of-sequence token)."""
    ids = document.meta.get("continuation_ids")
    if document.task != LM or not ids:
        raise ValueError("not a language-modelling document (tasks.make('lm', ...))")
    return list(ids)


def copy_positions(document: Document, offsets: Any) -> list[int]:
    """Per continuation token, the index of the prefix token that is its earlier copy; ``[]`` without a copy.

    ``offsets``: the fast tokenizer's ``offset_mapping`` of ``document.text``
    (one ``(start, end)`` per token, ``(0, 0)`` for special tokens and padding).
    The tokens whose characters fall in ``meta["copy_span"]`` are the copy's,
    in order; the continuation's first token repeats the first of them, and so on
    (the prefix and the continuation are tokenised word by word alike, which
    tests/data/test_lm_copy_supervision.py checks id for id over many seeds and lengths)."""
    a, b = document.meta.get("copy_span", (0, 0))
    if document.task != LM or b <= a:
        return []
    n = len(continuation_ids(document))
    inside = [i for i, (s, e) in enumerate(offsets) if e > s and e > a and s < b]
    return inside[:n] if len(inside) >= n else []


def make_lm(
    tokenizer: Any,
    tokens: int,
    seed: int = 0,
    haystack: str = "corpus-eval",
    continuation: int = CONTINUATION,
    repeat: float = REPEAT,
    copy_room: int = COPY_ROOM,
) -> Document:
    """One LM sequence: a prefix of at most ``tokens`` tokens (end-of-sequence included, as every
    document is counted) and its ``continuation`` tokens; ValueError for bad arguments."""
    if haystack == "default":
        haystack = "corpus-eval"
    if haystack not in LM_HAYSTACKS:
        raise ValueError(f"unknown haystack {haystack!r} for the lm task; expected one of {LM_HAYSTACKS}")
    try:
        tokens, continuation = operator.index(tokens), operator.index(continuation)
    except TypeError:
        raise ValueError(f"tokens and continuation must be whole numbers, got {tokens!r}, {continuation!r}") from None
    if tokens < 8 or continuation < 1:
        raise ValueError(f"an lm sequence needs tokens >= 8 and continuation >= 1, got {tokens}, {continuation}")
    if not 0.0 <= float(repeat) <= 1.0:
        raise ValueError(f"repeat must be a chance in [0, 1], got {repeat!r}")
    if isinstance(copy_room, bool) or not isinstance(copy_room, int) or copy_room < 1:
        raise ValueError(f"copy_room must be a whole number of tokens >= 1, got {copy_room!r}")
    seed = _check_seed(seed)
    pool = {"corpus-train": "train", "lm-train": "lm-train"}.get(haystack, "eval")
    paragraphs = _pieces(tokenizer, pool)  # per paragraph: (words, token ids of each word with its space)
    rng = random.Random(f"lm:{seed}:{haystack}")
    wants_copy, depth = rng.random() < repeat, rng.random()
    indices = _endless(rng, len(paragraphs))
    anchor = next(i for i in indices if ANCHOR_WORDS[0] <= len(paragraphs[i][0]) <= ANCHOR_WORDS[1])
    past: list[int] = []  # past[0] is the paragraph right before the anchor
    # Grow the past backwards until the tokens suffice (the ids of each word are cached per pool).
    count_past = 0
    while count_past < tokens + continuation + 16:
        past.append(next(i for i in indices if i != anchor))
        count_past += sum(map(len, paragraphs[past[-1]][1]))
    units = [paragraphs[i] for i in reversed(past)] + [paragraphs[anchor]]
    words = [w for u in units for w in u[0]]
    pieces = [p for u in units for p in u[1]]
    starts = np.cumsum([0] + [len(p) for p in pieces])  # token index where each word starts
    total = int(starts[-1])
    cw = int(np.searchsorted(starts, total - continuation, side="right")) - 1  # the continuation's first word
    has_copy = False
    if wants_copy:
        anchor_start = len(words) - len(paragraphs[anchor][0])
        a = max(anchor_start, cw - COPY_CONTEXT)
        copy, copy_pieces = words[a:], pieces[a:]
        copy_tokens = sum(map(len, copy_pieces))
        # room for the copy: the window's first word once the copy is in
        first = int(np.searchsorted(starts, starts[cw] + copy_tokens - (tokens - 1), side="left"))
        bounds = [b for b in np.cumsum([0] + [len(u[0]) for u in units[:-1]]) if first + 2 < b <= anchor_start]
        # Copy and anchor head must fit in COPY_ROOM tokens whatever the length, so whether a seed repeats
        # does not depend on the length asked for (from about COPY_ROOM + 8 tokens on).
        room = copy_tokens + (starts[cw] - starts[anchor_start])
        if room <= copy_room and room < tokens - 8 and (bounds or first + 2 < anchor_start):
            b = int(bounds[round(depth * (len(bounds) - 1))]) if bounds else anchor_start
            words = words[:b] + copy + words[b:]
            pieces = pieces[:b] + copy_pieces + pieces[b:]
            starts = np.cumsum([0] + [len(p) for p in pieces])
            copy_word = b + (cw - a)  # where the copy of the continuation's first word now is
            cw += len(copy)
            has_copy = True
    ids = [t for p in pieces for t in p]
    c = int(starts[cw])
    # (tokens - 1) prefix ids + the end-of-sequence token; the first word loses its space when it
    # starts the text, which can cost a token, so step to the next word until it fits.
    sw = int(np.searchsorted(starts, c - (tokens - 1), side="left"))
    while True:
        prefix = " ".join(words[sw:cw])
        count = len(tokenizer(prefix).input_ids)
        if count <= tokens or sw >= cw - 1:
            break
        sw += 1
    while count < tokens and sw > 0:  # the estimate started late (pieces and text count apart): go back
        longer = " ".join(words[sw - 1 : cw])
        n = len(tokenizer(longer).input_ids)
        if n > tokens:
            break
        sw, prefix, count = sw - 1, longer, n
    if count < tokens and sw > 0:
        # Starting at a word start fell short (the word before costs more than the gap): start inside
        # that word, its end only, so the prefix has exactly ``tokens`` tokens (a window cut anywhere).
        word = words[sw - 1]
        for j in range(1, len(word)):
            longer = word[j:] + " " + prefix
            n = len(tokenizer(longer).input_ids)
            if n == tokens:
                prefix, count = longer, n
                break
            if n < tokens:  # shorter tails of the word only cost less
                break
        if count < tokens and len(tokenizer(" " + prefix).input_ids) == tokens:
            prefix, count = " " + prefix, tokens  # bytes: the first word keeps its space
    cont_ids = ids[c : c + continuation]
    expected = tokenizer.decode(cont_ids)
    copy_span = (0, 0)
    if has_copy and copy_word > sw:  # the copy's continuation part inside the window (it always is: tested)
        last_word = int(np.searchsorted(starts, c + len(cont_ids) - 1, side="right")) - 1
        first = len(prefix) - len(" ".join(words[copy_word:cw])) - 1  # with its space: a token of its own at times
        end = (
            len(prefix)
            - len(" ".join(words[copy_word + (last_word - cw) : cw]))
            + len(words[copy_word + (last_word - cw)])
        )
        copy_span = (first, end)
    return Document(
        task=LM,
        text=prefix,
        expected=expected.strip(),
        needle_span=(0, 0),
        question_span=(len(prefix), len(prefix)),
        depth=1.0,
        seed=seed,
        meta={
            "tokens": count,
            "target": tokens,
            "short_by": tokens - count,
            "haystack": haystack,
            "continuation_ids": tuple(int(i) for i in cont_ids),
            "continuation": continuation,
            "repeat": has_copy,
            "copy_span": copy_span,
        },
    )


_PIECES: "weakref.WeakKeyDictionary[Any, dict[str, list]]" = weakref.WeakKeyDictionary()


def _pieces(tokenizer: Any, pool: str) -> list[tuple[list[str], list[list[int]]]]:
    """Each paragraph of a corpus pool as (words, the token ids of each word with the space before it),
    once per tokenizer and pool: the tokens of running text (tokenizers split at spaces first), so a
    sequence is a concatenation, and every word start is a place to cut. Cached because the trainer
    builds 32 sequences a step and tokenising them afresh cost more than the step itself."""
    from core.data import corpus

    per_tok = _PIECES.setdefault(tokenizer, {})
    if pool not in per_tok:
        paragraphs = [p.split() for p in (corpus.lm_train_pool() if pool == "lm-train" else corpus.pool(pool))]
        flat = tokenizer([" " + w for p in paragraphs for w in p], add_special_tokens=False)["input_ids"]
        out, k = [], 0
        for p in paragraphs:
            out.append((p, [list(x) for x in flat[k : k + len(p)]]))
            k += len(p)
        per_tok[pool] = out
    return per_tok[pool]


def _endless(rng: random.Random, n: int):
    """Paragraph indices: one seeded shuffle of the pool after another."""
    while True:
        yield from rng.sample(range(n), n)
