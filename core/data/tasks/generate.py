"""``make``: one generated document of a task, sized in tokens, with the needle
at a depth. It checks the arguments, runs the task's builder (``_BUILDERS``:
one per task module), sizes the layout (``core.data.tasks.layout``) and assembles
the ``Document`` and its meta.

Why its own module: the checks, the seeding (``random.Random(f"{task}:{seed}")``,
the answer drawn first) and the meta are the same for every task; the task
modules only build layouts.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Callable
from typing import Any

from core.data.tasks import ruler
from core.data.tasks.code import _code
from core.data.tasks.document import TASKS, Document, _check_depth, _check_seed
from core.data.tasks.filler import _check_haystack
from core.data.tasks.layout import _fit_layout, _Layout
from core.data.tasks.line import _line
from core.data.tasks.lm import LM, make_lm
from core.data.tasks.multidoc import _multidoc
from core.data.tasks.passkey import _passkey
from core.data.tasks.topic import _topic

_BUILDERS: dict[str, Callable[..., tuple[_Layout, dict]]] = {
    "passkey": _passkey,
    "line": _line,
    "topic": _topic,
    "multidoc": _multidoc,
    "code": _code,
}
HAYSTACK_TASKS = ("passkey", "topic", "multidoc") + ruler.RULER_HAYSTACK  # tasks whose filler can come from the corpus


def make(
    task: str,
    tokenizer: Any,
    tokens: int,
    depth: float = 0.5,
    seed: int = 0,
    haystack: str = "default",
    **options: Any,
) -> Document:
    """Generate one retrieval document of ``tokens`` tokens (exactly, for any tokenizer that allows it; never more).

    tokens: target length of the whole encoder input, counted as
    ``len(tokenizer(text).input_ids)`` (special tokens included).
    depth: where the needle goes, 0 = right after the instructions,
    1 = right before the question (topic: the asked item is always the first
    conversation, so depth is ignored and recorded as 0.0).
    haystack: "default" (the task's classic filler) or "corpus-train" /
    "corpus-eval" (paragraphs of the disjoint core.data.corpus pools) for passkey,
    topic and multidoc; line and code have no prose and always use their own
    filler (recorded in ``meta["haystack"]``).
    options: ``key=`` (5-digit int) for passkey/line/code, ``attribute=``
    ("capital" | "born") for multidoc, ``labels=`` ("compact" | "classic",
    the word list of the line indices), ``intro=False`` (the record
    without LongChat's instructions) and ``share=`` (0..1: the chance that a
    line's label shares a word with the asked one; hard negatives for
    training) for line.

    ``task="lm"`` is not retrieval: a prefix of held-out prose and the
    continuation to predict (:mod:`core.data.tasks.lm`; depth is ignored, the
    haystack is a corpus pool, option ``continuation=`` tokens).

    Raises ValueError for an unknown task/haystack/option, a depth outside
    [0, 1], or a ``tokens`` too small to hold the needle and question.
    """
    if task == LM:
        _check_depth(depth)
        return make_lm(tokenizer, tokens, seed=seed, haystack=haystack, **options)
    if task not in _BUILDERS and task not in ruler.RULER_TASKS:
        hint = " (use from_text for your own text)" if task == "text" else ""
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS + ruler.RULER_TASKS}{hint}")
    depth = _check_depth(depth)
    _check_haystack(haystack)
    if isinstance(tokens, bool):
        raise ValueError(f"tokens must be a positive integer, got {tokens!r}")
    try:
        tokens = operator.index(tokens)  # ints, numpy ints from a sweep table; not floats
    except TypeError:
        raise ValueError(f"tokens must be a positive integer, got {tokens!r}") from None
    if tokens <= 0:
        raise ValueError(f"tokens must be a positive integer, got {tokens!r}")
    seed = _check_seed(seed)
    used_haystack = haystack if task in HAYSTACK_TASKS else "default"
    rng = random.Random(f"{task}:{seed}")
    opts = dict(options)
    if task in ruler.RULER_TASKS:  # several needles: the RULER module sizes its own layouts
        draft, count, info = ruler.build(task, tokenizer, tokens, depth, seed, used_haystack, opts)
        if opts:
            raise ValueError(f"unknown option(s) for task {task!r}: {sorted(opts)}")
    else:
        layout, info = _BUILDERS[task](tokenizer, rng, used_haystack, seed, opts)
        if opts:
            raise ValueError(f"unknown option(s) for task {task!r}: {sorted(opts)}")
        draft, count = _fit_layout(layout, tokenizer, tokens, depth, task)
    expected = info.pop("expected")
    meta: dict[str, Any] = {
        "tokens": count,
        "target": tokens,
        "short_by": tokens - count,  # 0 but for a tokenizer that cannot spend one token on one more character
        "haystack": used_haystack,
        "requested_depth": depth,
        "needle_index": draft.position,
        "n_items": draft.n_items,
        **info,
    }
    if task == "topic":
        meta["n_topics"] = draft.text.count("USER: I would like to discuss the topic of")
    if task == "multidoc":
        meta["gold_index"] = draft.position
        meta["n_docs"] = draft.n_items
    start = draft.text.find(expected, draft.needle_span[0], draft.needle_span[1])
    meta["answer_span"] = (start, start + len(expected)) if start >= 0 else None
    return Document(
        task=task,
        text=draft.text,
        expected=expected,
        needle_span=draft.needle_span,
        question_span=draft.question_span,
        depth=0.0 if task == "topic" else draft.depth,
        seed=seed,
        meta=meta,
    )
