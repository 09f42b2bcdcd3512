"""What a task produces: the ``Document`` (encoder input, gold answer, needle and
question spans, depth, seed, meta), the names of the generated ``TASKS``, and
the checks of the arguments every document takes (depth, seed).

Why its own module: every task module, the generator (``make``), the user's
text (``from_text``) and the scorers all speak in Documents; keeping the type
and its argument checks apart from any one task lets each of them import it
without importing the others.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Document:
    """One encoder input with its gold answer and where the answer hides."""

    task: str  # "passkey" | "line" | "topic" | "multidoc" | "code" | a RULER task | "lm" | "text"
    text: str  # the FULL encoder input: context followed by the question (prompt)
    expected: str  # gold answer as the model should generate it, e.g. "48213"
    needle_span: tuple[int, int]  # [start, end) in `text` of the needle (sentence/line holding the answer)
    question_span: tuple[int, int]  # [start, end) in `text` of the question at the end
    depth: float  # needle depth 0..1 actually used (relative position of the needle in the context)
    seed: int
    meta: dict = field(default_factory=dict, compare=False, hash=False)  # task-specific details


TASKS: tuple[str, ...] = ("passkey", "line", "topic", "multidoc", "code")  # generated tasks; "text" is user text
#: The RULER-style tasks (core.data.tasks.ruler, issue 48): several needles, a chain, word counts.
RULER_TASKS: tuple[str, ...] = ("multikey", "multivalue", "multiquery", "vartrack", "commonwords")
#: Every task ``make`` generates: the paper's retrieval ``TASKS``, the RULER-style ones and language modelling
#: ("lm", core.data.tasks.lm).
GENERATED: tuple[str, ...] = TASKS + RULER_TASKS + ("lm",)


def _check_seed(seed: int) -> int:
    try:
        return operator.index(seed)  # numpy ints become plain ints: Documents compare and print alike
    except TypeError:
        raise ValueError(f"seed must be an integer, got {seed!r}") from None


def _check_depth(depth: float) -> float:
    try:
        depth = float(depth)
    except (TypeError, ValueError):
        raise ValueError(f"depth must be a number in [0, 1], got {depth!r}") from None
    if not 0.0 <= depth <= 1.0:  # also rejects NaN
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    return depth
