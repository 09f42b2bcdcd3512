"""``from_text``: a Document from the user's own text ("your own text"), with
the passkey needle, a custom needle, or no needle at all inserted at a
sentence boundary near the asked depth.

Why apart from ``make``: the text is given, not generated, so nothing is
sized; the needle goes at a sentence boundary (``_insertion_point``) instead
of between filler units.
"""

from __future__ import annotations

import random
import re
from typing import Any

from core.data.tasks.document import Document, _check_depth, _check_seed
from core.data.tasks.layout import count_tokens
from core.data.tasks.passkey import PASSKEY_QUESTION, passkey_needle

_BOUNDARY = re.compile(r"[.!?][\"')\]]*(?=\s)")


def _insertion_point(text: str, depth: float) -> int:
    """A sentence boundary of ``text`` near ``depth`` (0 and len(text) included).

    Falls back to word boundaries when the text has no sentence punctuation.
    """
    points = [0, len(text)] + [m.end() for m in _BOUNDARY.finditer(text)]
    if len(points) == 2:
        points += [m.start() for m in re.finditer(r"\s+", text)]
    aim = depth * len(text)
    return min(sorted(set(points)), key=lambda p: (abs(p - aim), p))


def from_text(
    text: str,
    tokenizer: Any = None,
    needle: str | None = None,
    question: str | None = None,
    expected: str | None = None,
    depth: float = 0.5,
    seed: int = 0,
) -> Document:
    """A Document from the user's own text ("your own text").

    needle None: insert the passkey needle with a seeded 5-digit key at a
    sentence boundary near ``depth`` and ask the passkey question (question /
    expected may still be overridden). needle given: insert it there and use
    ``question`` (required) / ``expected``. needle "": insert nothing and ask
    ``question`` (required) about the text itself; needle_span = (0, 0).
    A tokenizer, when given, only fills ``meta["tokens"]``.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("The text is empty: paste or type some text to search in.")
    depth = _check_depth(depth)
    seed = _check_seed(seed)
    context = text.rstrip()
    rng = random.Random(f"text:{seed}")
    meta: dict[str, Any] = {}
    if needle is None:
        key = rng.randint(10000, 99999)
        needle = passkey_needle(key)
        question = PASSKEY_QUESTION if question is None else question
        expected = str(key) if expected is None else expected
        meta["key"] = key
    elif question is None or not question.strip():
        raise ValueError("A custom needle (or an empty one) needs a question to ask.")
    expected = "" if expected is None else expected
    question = question.strip()

    if needle == "":
        body, span, used_depth = context, (0, 0), 0.0
    else:
        needle = needle.strip()
        at = _insertion_point(context, depth)
        before, after = context[:at], context[at:]
        joint_before = " " if before and not before[-1].isspace() else ""
        joint_after = " " if after and not after[0].isspace() else ""
        start = len(before) + len(joint_before)
        body = before + joint_before + needle + joint_after + after
        span = (start, start + len(needle))
        used_depth = at / len(context) if context else 0.0
        meta["inserted_at"] = at
    full = body + "\n" + question
    q_start = len(body) + 1
    if tokenizer is not None:
        meta["tokens"] = count_tokens(tokenizer, full)
    if expected and span != (0, 0):
        found = full.find(expected, *span)
        meta["answer_span"] = (found, found + len(expected)) if found >= 0 else None
    return Document(
        task="text",
        text=full,
        expected=expected,
        needle_span=span,
        question_span=(q_start, q_start + len(question)),
        depth=used_depth,
        seed=seed,
        meta=meta,
    )
