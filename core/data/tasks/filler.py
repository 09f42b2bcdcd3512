"""Where filler comes from, and how a filler unit is cut short.

``HAYSTACKS`` names the filler sources: "default" (each task's own filler) or
a ``core.data.corpus`` pool ("corpus-train" / "corpus-eval"), read as endless
seeded sentences (``_corpus_sentences``). ``_filler_sources`` is the seeded
pair (unit rng, corpus sentences) that the record tasks (topic, multidoc)
draw their units from. ``_cut_sentence`` and ``_append_words`` close the last
few tokens of a document with the first words of one more sentence.

Why its own module: passkey, topic and multidoc take corpus filler the same
way, and the fine adjustment of several tasks cuts sentences the same way.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Callable, Iterator

HAYSTACKS: tuple[str, ...] = ("default", "corpus-train", "corpus-eval")


@functools.lru_cache(maxsize=4)
def _pool_sentences(name: str) -> tuple[tuple[str, ...], ...]:
    """Corpus pool paragraphs, each split into sentences (cached per pool)."""
    from core.data import corpus

    split = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
    return tuple(tuple(split.split(p)) for p in corpus.pool(name))


def _corpus_sentences(haystack: str, rng: random.Random, max_words: int | None = None) -> Iterator[str]:
    """Endless sentences: random corpus paragraphs of the pool, in reading order.

    ``max_words`` skips long sentences, for tasks whose units should stay short
    (a conversation turn, a search-result snippet).
    """
    paragraphs = _pool_sentences("train" if haystack == "corpus-train" else "eval")
    while True:
        for sentence in paragraphs[rng.randrange(len(paragraphs))]:
            if max_words is None or len(sentence.split()) <= max_words:
                yield sentence


def _cut_sentence(unit: str, words: int) -> str:
    """First ``words`` words of a sentence, closed with a period so it stays a sentence."""
    text = " ".join(unit.split()[:words]).rstrip(",;:-")
    return text if text[-1:] in ".!?" else text + "."


def _append_words(extra: str) -> tuple[Callable[[str, str, int], str], Callable[[str], int]]:
    """``extend``/``extend_limit`` appending the first words of a fixed sentence."""
    words = len(extra.split())
    return (lambda last, _next, w: f"{last} {_cut_sentence(extra, w)}"), (lambda _next: words - 1)


def _check_haystack(haystack: str) -> None:
    if haystack not in HAYSTACKS:
        raise ValueError(f"unknown haystack {haystack!r}; expected one of {HAYSTACKS}")


def _filler_sources(task: str, seed: int, haystack: str, max_words: int) -> tuple[random.Random, Iterator[str] | None]:
    """The seeded sources of a record's filler units (topic, multidoc).

    Returns the rng that draws the task's own filler (templates, turn counts,
    names) and, for a corpus haystack, endless corpus sentences of at most
    ``max_words`` words (None for "default"). Both are seeded by (task, seed,
    haystack) only, never the tokenizer, so one seed gives the same record
    whatever tokenizer sizes it.
    """
    unit_rng = random.Random(f"{task}:{seed}:{haystack}:units")
    corpus_sentences = (
        _corpus_sentences(haystack, random.Random(f"{task}:{seed}:{haystack}:corpus"), max_words=max_words)
        if haystack != "default"
        else None
    )
    return unit_rng, corpus_sentences
