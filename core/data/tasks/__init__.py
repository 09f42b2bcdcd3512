"""Retrieval documents for length-extrapolation experiments, and their scorers.

The tasks follow Chi et al. (arXiv 2311.00684), who evaluate T5 length
extrapolation on retrieval: a fact (the *needle*) is hidden at a chosen depth
in a long context, the encoder reads context + question, and the decoder must
produce the fact. Five generated tasks:

- ``passkey``: the landmark-attention pass key test (5-digit key in filler).
- ``line``: LongChat line retrieval (many ``line <idx>: REGISTER_CONTENT is N``).
- ``topic``: LongChat topic retrieval (first topic of many conversations).
- ``multidoc``: multi-document QA in the "lost in the middle" layout.
- ``code``: a Python file hiding ``def get_key(): return N``.

and five RULER-style ones (``RULER_TASKS``, :mod:`core.data.tasks.ruler`):
``multikey``, ``multivalue``, ``multiquery`` (several needles), ``vartrack``
(a chain of k assignments) and ``commonwords`` (the most frequent words),

and ``from_text`` for "your own text" (a pasted text, optionally with a needle).

Why the generators look the way they do:

- A document is sized in *tokens of the tokenizer at hand* (``len(tokenizer(
  text).input_ids)``, specials included), because length is the independent
  variable of every experiment. Sizing is a search over the number of filler
  units, driven by per-unit token estimates (one batched tokenizer call) and
  confirmed by a handful of full-text counts, so a document costs a few
  tokenizer calls, not one per unit. The result never exceeds the target.
  The gap left by whole units is then closed by a second, word-level search:
  the last unit gets the first words of one more sentence (prose, turns,
  search-result bodies), a comment line (code), or some line indices get a
  third word (line). The classic passkey filler stays whole sentences unless
  the gap is 8+ tokens (byte-level tokenizers). What is still missing after
  that (a word can cost two tokens where one is left; a line index costs
  two) is filled by a trailing partial unit: the first words of the next
  sentence, turn, search result or comment without a closing period, or the
  start of the next record line without its number (``line simple-``),
  the last word cut short where only part of it fits. An ``lm`` prefix
  starts inside a word when no word start fits exactly. So a generated
  document has exactly the asked number of tokens (``meta["tokens"] ==
  meta["target"]``, ``meta["short_by"] == 0``) with the bundled BPE
  tokenizers, ByT5's bytes and any tokenizer that can spend a single token on
  one more character; a tokenizer that cannot (every character of the next
  unit costing 2+ tokens) keeps a gap of a token or two, recorded in
  ``meta["short_by"]``. Documents that were exact after the word-level step
  are unchanged by the last one.
- Everything random comes from ``random.Random`` seeded by ``seed`` (never the
  global generator); the answer (key, topic, entity) is drawn first, so one
  seed keeps the same answer across lengths and depths: a sweep compares like
  with like.
- Content of filler unit *i* depends only on (task, seed, haystack, i), never
  on the tokenizer: two tokenizers give the same text up to where it is cut.

Package layout (one module per task, plus what the tasks share):

- ``document``: ``Document``, ``TASKS``, depth/seed checks.
- ``scoring``: ``score``, ``Score``, ``normalize_answer``, ``target``,
  ``MAX_ANSWER_TOKENS``.
- ``layout``: the shared layout (``_Layout``) and its sizing in tokens
  (``_fit_layout``, ``_Stream``, ``count_tokens``).
- ``filler``: haystacks (``HAYSTACKS``, corpus sentences), the seeded filler
  sources of the record tasks, sentence cutting.
- ``draws``: the seeded key and unique integers several tasks draw.
- ``passkey``, ``line``, ``topic``, ``multidoc``, ``code``: one task each
  (its texts and its layout builder).
- ``generate``: ``make``; ``text``: ``from_text``.
- ``lm``: language modelling (``make("lm", ...)``): a held-out prefix and the
  continuation the decoder is scored on (perplexity, not retrieval).

Everything callers use is re-exported here: ``from core import tasks`` and
``tasks.make(...)`` as before.
"""

from __future__ import annotations

from core.data.tasks.document import GENERATED, RULER_TASKS, TASKS, Document
from core.data.tasks.filler import HAYSTACKS
from core.data.tasks.generate import HAYSTACK_TASKS, make
from core.data.tasks.layout import count_tokens
from core.data.tasks.line import LINE_INTRO, LINE_LABELS
from core.data.tasks.lm import CONTINUATION, LM, continuation_ids
from core.data.tasks.multidoc import MULTIDOC_INTRO
from core.data.tasks.passkey import PASSKEY_FILLER, PASSKEY_INTRO, PASSKEY_QUESTION, passkey_needle
from core.data.tasks.scoring import (
    LINE_ANSWERS,
    MAX_ANSWER_TOKENS,
    Score,
    check_line_answer,
    normalize_answer,
    score,
    target,
)
from core.data.tasks.text import from_text
from core.data.tasks.topic import TOPIC_INTRO, TOPIC_QUESTION, TOPICS

__all__ = [
    "Document",
    "Score",
    "TASKS",
    "RULER_TASKS",
    "GENERATED",
    "LM",
    "CONTINUATION",
    "continuation_ids",
    "HAYSTACKS",
    "HAYSTACK_TASKS",
    "make",
    "from_text",
    "score",
    "normalize_answer",
    "count_tokens",
    "passkey_needle",
    "PASSKEY_INTRO",
    "PASSKEY_FILLER",
    "PASSKEY_QUESTION",
    "TOPICS",
    "TOPIC_INTRO",
    "TOPIC_QUESTION",
    "LINE_INTRO",
    "LINE_LABELS",
    "LINE_ANSWERS",
    "MULTIDOC_INTRO",
    "MAX_ANSWER_TOKENS",
    "check_line_answer",
    "target",
]
