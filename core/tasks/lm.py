"""Language modelling: a prefix of held-out prose, and the continuation the decoder must predict.

The paper's first experiment (Chi et al., Table 3) is the perplexity of
LM-adapted T5 models: the encoder reads a prefix of ``L_ex`` tokens, the
decoder is scored on how well it predicts the text that follows. This module
makes those sequences from the offline corpus (:mod:`core.corpus`):

- a sequence of seed ``s`` is a seeded shuffle of the pool's paragraphs, joined
  by spaces, read so that it *ends* with the continuation: the prefix grows
  backwards from a fixed point, so the same seed at 1x and 8x L_tr asks for
  the same continuation after a longer past (a length sweep compares like with
  like, and Algorithm 1's L_tr reference is the same sequence cut to L_tr);
- the continuation is ``continuation`` tokens (default :data:`CONTINUATION`),
  kept as token ids in ``meta["continuation_ids"]`` (its text, ``expected``, is
  for display only: a slice ending inside a word may tokenise differently);
- the prefix is cut at word starts, so re-tokenising ``text`` gives exactly the
  prefix ids (the bundled byte-level tokenizer splits at spaces and digits).

``haystack`` picks the pool: "corpus-eval" (default: held out from training)
or "corpus-train" (the training sequences of ``python -m core train`` with
``tasks: {"lm": 1}``). ``depth`` is accepted and ignored, so an LM document
goes through every place a retrieval document does.
"""

from __future__ import annotations

import operator
import random
from typing import Any

import numpy as np

from core.tasks.document import Document, _check_seed

LM = "lm"
#: Tokens of continuation scored per sequence (the decoder's labels).
CONTINUATION = 32
LM_HAYSTACKS = ("corpus-eval", "corpus-train")


def continuation_ids(document: Document) -> list[int]:
    """The token ids the decoder is scored on (no end-of-sequence token)."""
    ids = document.meta.get("continuation_ids")
    if document.task != LM or not ids:
        raise ValueError("not a language-modelling document (tasks.make('lm', ...))")
    return list(ids)


def make_lm(tokenizer: Any, tokens: int, seed: int = 0, haystack: str = "corpus-eval",
            continuation: int = CONTINUATION) -> Document:
    """One LM sequence: a prefix of at most ``tokens`` tokens (end-of-sequence included, as every
    document is counted) and its ``continuation`` tokens; ValueError for bad arguments."""
    from core import corpus

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
    seed = _check_seed(seed)
    paragraphs = corpus.pool("train" if haystack == "corpus-train" else "eval")
    rng = random.Random(f"lm:{seed}:{haystack}")
    indices = _endless(rng, len(paragraphs))
    order: list[int] = []
    need = tokens + continuation + 16
    while True:
        # Grow the past backwards: paragraphs are prepended, so a longer sequence of the same
        # seed ends with the same text (the continuation does not move with the length).
        # Estimate from words (about 1.5 tokens each here), then check with the tokenizer.
        while sum(len(paragraphs[i].split()) for i in order) * 1.5 < need:
            order.append(next(indices))
        words = " ".join(paragraphs[i] for i in reversed(order)).split()
        # Each word with the space before it, tokenised on its own: the tokens of running text
        # (tokenizers split at spaces first), and every word start is a place to cut.
        pieces = tokenizer([w if i == 0 else " " + w for i, w in enumerate(words)], add_special_tokens=False)["input_ids"]
        if sum(map(len, pieces)) >= tokens + continuation + 16:
            break
        need += 64
    starts = np.cumsum([0] + [len(p) for p in pieces])  # token index where word i starts
    ids = [t for p in pieces for t in p]
    cw = int(np.searchsorted(starts, len(ids) - continuation, side="right")) - 1  # the continuation's first word
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
    cont_ids = ids[c:c + continuation]
    expected = " ".join(words[cw:])
    expected = tokenizer.decode(cont_ids) if len(ids) - c > continuation else expected
    return Document(
        task=LM, text=prefix, expected=expected.strip(), needle_span=(0, 0), question_span=(len(prefix), len(prefix)),
        depth=1.0, seed=seed,
        meta={"tokens": count, "target": tokens, "short_by": tokens - count, "haystack": haystack,
              "continuation_ids": tuple(int(i) for i in cont_ids), "continuation": continuation},
    )


def _endless(rng: random.Random, n: int):
    """Paragraph indices: one seeded shuffle of the pool after another."""
    while True:
        yield from rng.sample(range(n), n)

