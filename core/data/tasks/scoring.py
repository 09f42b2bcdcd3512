"""Gold answers: scoring a model's answer per task (``score``, ``Score``,
``normalize_answer``), the decoder's training target (``target``, with the
line task's ``LINE_ANSWERS``), and the answer length limit for generation
(``MAX_ANSWER_TOKENS``).

Why its own module: scoring reads only the task name and two strings, never a
generator; engine, batch runs, training and the CLI use it on answers that
come back long after the document was made.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from core.data.tasks.document import RULER_TASKS, TASKS, Document


@dataclass(frozen=True)
class Score:
    """Outcome of scoring one model answer."""

    correct: bool
    parsed: str | None  # the value parsed from the model's answer (None if nothing parsable)


_INT = re.compile(r"\d+")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT_TABLE = str.maketrans({ch: " " for ch in string.punctuation})


def normalize_answer(text: str) -> list[str]:
    """SQuAD-style normalisation as a word list: lowercase, no punctuation, no articles."""
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCT_TABLE))
    return text.split()


def _contains(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def _score_int(answer: str, expected: str, last: bool) -> Score:
    found = _INT.findall(answer)
    if not found:
        return Score(False, None)
    parsed = found[-1] if last else found[0]
    try:
        correct = int(parsed) == int(expected.strip())
    except ValueError:
        correct = False
    return Score(correct, parsed)


def _score_text(answer: str, expected: str) -> Score:
    words = normalize_answer(answer)
    if not words:
        return Score(False, None)
    return Score(_contains(words, normalize_answer(expected)), " ".join(words))


def _score_all_ints(answer: str, expected: str) -> Score:
    """Every number of the gold list (``"12345, 67890"``) among the answer's integers, in any order (RULER's
    multi-value / multi-query scorer counts the share found; here a document is right only with all of them)."""
    found = _INT.findall(answer)
    if not found:
        return Score(False, None)
    want = {int(x) for x in _INT.findall(expected)}
    return Score(bool(want) and want <= {int(x) for x in found}, ", ".join(found))


def _score_all_words(answer: str, expected: str) -> Score:
    """Every word of the gold list (``"otter, misty, crane"``) among the answer's normalised words, in any order."""
    words = normalize_answer(answer)
    if not words:
        return Score(False, None)
    want = set(normalize_answer(expected))
    return Score(bool(want) and want <= set(words), " ".join(words))


LINE_ANSWERS: tuple[str, ...] = ("number", "label")
# Answer length limit for generation (engine, batch runs, CLI, saved models):
# the longest target, a labelled line answer "line quiet-moon: 12345", is 13
# tokens of the bundled tokenizer.
MAX_ANSWER_TOKENS = 16


def check_line_answer(line_answer: str) -> str:
    """``line_answer`` if it is one of LINE_ANSWERS, else a ValueError (training checks it up front)."""
    if line_answer not in LINE_ANSWERS:
        raise ValueError(f"line_answer must be one of {LINE_ANSWERS}, got {line_answer!r}")
    return line_answer


def target(doc: Document, line_answer: str = "number") -> str:
    """The decoder's training target for ``doc``: the gold answer, except that a
    line answer may name its line first ("label": ``"line quiet-moon: 12345"``,
    spelled as in the record so that its tokens are the record's).

    Why "label": a model that must output the number alone has to find the
    question's label and match it against every line inside one forward pass.
    Writing the label first splits that: copy the label from the question (a
    fixed spot), then the number that follows that label in the record.
    LongChat's scorer takes the last number of the answer for the same reason
    (chat models answer "line quiet-moon: REGISTER_CONTENT is 12345");
    ``score`` does too. On our 1.2 M-parameter model it did not help: the
    label came out right every time, the number after it did not (docs/line-retrieval.md).
    """
    if check_line_answer(line_answer) == "label" and doc.task == "line":
        return f"line {doc.meta['line_index']}: {doc.expected}"
    return doc.expected


def score(task: str, answer: str, expected: str) -> Score:
    """Score a model answer against the gold answer, per the task's convention.

    passkey, code: the FIRST integer of the answer must equal the key (a model
    often goes on generating after the key). line: the LAST integer (LongChat's
    convention; the answer may repeat the line index text first). topic,
    multidoc: the normalised gold answer must appear as a word sequence in the
    normalised answer. text: integer rule when the gold answer is a number,
    else the containment rule. RULER-style tasks: multikey and vartrack the
    first integer; multivalue and multiquery every gold number among the
    answer's integers; commonwords every gold word among its words (any order).
    """
    if task in ("passkey", "code"):
        return _score_int(answer, expected, last=False)
    if task == "line":
        return _score_int(answer, expected, last=True)
    if task in ("topic", "multidoc"):
        return _score_text(answer, expected)
    if task in ("multikey", "vartrack"):
        return _score_int(answer, expected, last=False)
    if task in ("multivalue", "multiquery"):
        return _score_all_ints(answer, expected)
    if task == "commonwords":
        return _score_all_words(answer, expected)
    if task == "text":
        if re.fullmatch(r"\s*\d+\s*", expected or ""):
            return _score_int(answer, expected, last=False)
        return _score_text(answer, expected)
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS + RULER_TASKS + ('text',)}")
