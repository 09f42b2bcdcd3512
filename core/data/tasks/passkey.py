"""The ``passkey`` task: the landmark-attention pass key test, a 5-digit key
in repeated filler sentences (or corpus sentences), and its texts
(``PASSKEY_INTRO``, ``PASSKEY_FILLER``, ``PASSKEY_QUESTION``,
``passkey_needle``; ``from_text`` hides the same needle in the user's text).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

from core.data.tasks.draws import _key
from core.data.tasks.filler import _corpus_sentences, _cut_sentence
from core.data.tasks.layout import _Layout, _Stream

PASSKEY_INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. "
    "Find it and memorize them. I will quiz you about the important information there."
)
PASSKEY_FILLER: tuple[str, ...] = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)
PASSKEY_QUESTION = "What is the pass key? The pass key is"


def passkey_needle(key: int | str) -> str:
    """The landmark-attention needle sentence for a key."""
    return f"The pass key is {key}. Remember it. {key} is the pass key."


def _passkey(tokenizer: Any, rng: random.Random, haystack: str, seed: int, options: dict) -> tuple[_Layout, dict]:
    key = _key(rng, options)
    needle = passkey_needle(key)
    if haystack == "default":
        units: Iterator[str] = itertools.cycle(PASSKEY_FILLER)
        # Keep the classic filler made of whole sentences unless a coarse
        # tokenizer (bytes: ~20 tokens a sentence) leaves a visible gap.
        min_gap = 8
    else:
        units = _corpus_sentences(haystack, random.Random(f"passkey:{seed}:{haystack}"))
        min_gap = 1

    def extend(last: str, nxt: str, w: int) -> str:
        # Close the gap with the first words of the next filler sentence.
        return f"{last} {_cut_sentence(nxt, w)}"

    layout = _Layout(
        head=PASSKEY_INTRO + "\n",
        tail="\n" + PASSKEY_QUESTION,
        question=PASSKEY_QUESTION,
        sep=" ",
        needle=needle,
        needle_core=needle,
        stream=_Stream(units, tokenizer, " "),
        extend=extend,
        extend_limit=lambda nxt: len(nxt.split()) - 1,
        min_gap=min_gap,
    )
    return layout, {"expected": str(key), "key": key}
