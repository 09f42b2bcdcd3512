"""RULER-style tasks (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language
Models?", arXiv 2404.06654): several needles, a chain to trace, words to count. Issue 48, point 3.

- ``multikey``: RULER's NIAH multi-key. Several "One of the special magic numbers for <key> is: <number>."
  needles with different keys; the question asks for one key's number.
- ``multivalue``: NIAH multi-value. One key holds ``values`` numbers (default 2), each in its own needle; the
  answer must hold all of them.
- ``multiquery``: NIAH multi-query. Several keys, ``queries`` of them (default 2) asked at once.
- ``vartrack``: variable tracking. A chain ``VAR A = 12345.``, ``VAR B = VAR A.``, ... of ``hops`` assignments
  (default 2) among ``chains`` chains (default 2: the other chain is a distractor with its own value). RULER asks
  for every variable holding the value; here the question asks for the value of the chain's last variable, so
  the answer is one number (the same k hops to trace, one answer a retrieval decoder can give).
- ``commonwords``: common words extraction (RULER's CWE). A list of words where ``common`` words (default 3)
  each appear many times (a third of the list between them) and the rest rarely (each once per pass over a
  shuffled vocabulary); the answer names the common ones. Its filler is the list itself (no haystack). A
  document too short for the common words to stand out (each more often than any rare word) is refused.

The needle tasks and ``vartrack`` take the paper's fixed pass key filler (``haystack="default"``) or held-out
corpus prose (``corpus-eval`` / ``corpus-train``, a different haystack per seed). The asked needle sits at
``depth``; the other needles (distractors, other values, the chain's other links) at seeded fractions of the
filler, spread over the document. Answers fit :data:`core.data.tasks.scoring.MAX_ANSWER_TOKENS` (two
5-digit numbers, three words); RULER's defaults (4 values, 4 queries, 10 words) would not, and are options.

How the extra needles are placed with the shared sizing (``core.data.tasks.layout``), which places one needle:
they are units of the filler stream at positions spread over the unit count of a first fit (which holds them at
the start), and the fit is redone (with the positions scaled down) until every one of them lands inside the
document (so the unit after the last one, of which the fine adjustment and the trailing partial unit take
words, is never a needle). A document is still
exactly ``tokens`` long.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

from core.data.tasks.document import RULER_TASKS
from core.data.tasks.draws import _key
from core.data.tasks.filler import _corpus_sentences, _cut_sentence
from core.data.tasks.layout import _Draft, _fit_layout, _Layout, _Stream
from core.data.tasks.line import LINE_LABELS
from core.data.tasks.passkey import PASSKEY_FILLER

#: Those whose filler may be a corpus pool (``haystack``); commonwords' filler is its word list.
RULER_HAYSTACK: tuple[str, ...] = ("multikey", "multivalue", "multiquery", "vartrack")
#: Tasks whose answer is a list (every item must be in the model's answer).
LIST_ANSWERS: tuple[str, ...] = ("multivalue", "multiquery", "commonwords")

NIAH_INTRO = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
    "I will quiz you about the numbers afterwards."
)
VT_INTRO = "Memorize and track the chain of variable assignments hidden in the following text."
CWE_INTRO = (
    "Below is a list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often."
)

_ADJ, _NOUN = LINE_LABELS["classic"]
#: commonwords' vocabulary: the line task's word lists (distinct words; the common ones are drawn from it too).
CWE_WORDS: tuple[str, ...] = tuple(dict.fromkeys(_ADJ + _NOUN))
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
#: The most fits a document may take to place its extra needles (each a few tokenizer calls).
MAX_FITS = 6


def niah_needle(key: str, value: int) -> str:
    """RULER's NIAH needle sentence."""
    return f"One of the special magic numbers for {key} is: {value}."


def _int_option(options: dict, name: str, default: int, low: int, high: int) -> int:
    value = options.pop(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be a whole number in {low} .. {high}, got {value!r}")
    return value


def _distinct_keys(rng: random.Random, n: int) -> list[str]:
    keys: list[str] = []
    while len(keys) < n:
        k = f"{rng.choice(_ADJ)}-{rng.choice(_NOUN)}"
        if k not in keys:
            keys.append(k)
    return keys


def _distinct_values(rng: random.Random, n: int, first: int | None = None) -> list[int]:
    values = [] if first is None else [first]
    while len(values) < n:
        v = rng.randint(10000, 99999)
        if v not in values:
            values.append(v)
    return values


def _spec(task: str, rng: random.Random, options: dict) -> dict:
    """What a document of ``task`` holds, drawn first (so one seed keeps its answer across lengths and depths):
    the asked needle, the other needles in order, the question and the answer."""
    if task == "multikey":
        keys = _int_option(options, "keys", 4, 2, 16)
        names = _distinct_keys(rng, keys)
        values = _distinct_values(rng, keys, _key(rng, options))
        needles = [niah_needle(k, v) for k, v in zip(names, values)]
        q = f"What is the special magic number for {names[0]}? The special magic number for {names[0]} is"
        return {
            "intro": NIAH_INTRO,
            "needle": needles[0],
            "core": str(values[0]),
            "extras": needles[1:],
            "question": q,
            "expected": str(values[0]),
            "info": {"key": values[0], "asked": [names[0]], "keys": names},
        }
    if task == "multivalue":
        n = _int_option(options, "values", 2, 2, 8)
        name = _distinct_keys(rng, 1)[0]
        values = _distinct_values(rng, n, _key(rng, options))
        needles = [niah_needle(name, v) for v in values]
        q = f"What are all the special magic numbers for {name}? The special magic numbers for {name} are"
        return {
            "intro": NIAH_INTRO,
            "needle": needles[0],
            "core": str(values[0]),
            "extras": needles[1:],
            "question": q,
            "expected": ", ".join(map(str, values)),
            "info": {"values": values, "asked": [name]},
        }
    if task == "multiquery":
        n = _int_option(options, "queries", 2, 2, 8)
        keys = _int_option(options, "keys", 4, n, 16)
        names = _distinct_keys(rng, keys)
        values = _distinct_values(rng, keys, _key(rng, options))
        needles = [niah_needle(k, v) for k, v in zip(names, values)]
        asked = " and ".join(names[:n]) if n == 2 else ", ".join(names[: n - 1]) + f" and {names[n - 1]}"
        q = f"What are the special magic numbers for {asked}? The special magic numbers for {asked} are"
        return {
            "intro": NIAH_INTRO,
            "needle": needles[0],
            "core": str(values[0]),
            "extras": needles[1:],
            "question": q,
            "expected": ", ".join(map(str, values[:n])),
            "info": {"values": values[:n], "asked": names[:n], "keys": names},
        }
    if task == "vartrack":
        hops = _int_option(options, "hops", 2, 1, 10)
        chains = _int_option(options, "chains", 2, 1, 4)
        names: list[str] = []
        while len(names) < chains * (hops + 1):
            v = "".join(rng.choice(_LETTERS) for _ in range(5))
            if v not in names:
                names.append(v)
        values = _distinct_values(rng, chains, _key(rng, options))
        links = []
        for c in range(chains):
            chain = names[c * (hops + 1) : (c + 1) * (hops + 1)]
            links.append([f"VAR {chain[0]} = {values[c]}."] + [f"VAR {b} = VAR {a}." for a, b in zip(chain, chain[1:])])
        asked = names[hops]  # the last variable of the first chain
        # the asked chain's value statement is the needle (the answer's place); its hops and the other chains are
        # extras, interleaved so that each chain keeps its order among the extras
        extras = [s for group in itertools.zip_longest(*([links[0][1:]] + links[1:])) for s in group if s]
        q = f"What is the value of VAR {asked}? The value of VAR {asked} is"
        return {
            "intro": VT_INTRO,
            "needle": links[0][0],
            "core": str(values[0]),
            "extras": extras,
            "question": q,
            "expected": str(values[0]),
            "info": {"key": values[0], "asked": [asked], "hops": hops, "chain": names[: hops + 1]},
        }
    if task == "commonwords":
        n = _int_option(options, "common", 3, 1, 10)
        words = list(CWE_WORDS)
        rng.shuffle(words)
        common, rare = words[:n], words[n:]
        q = (
            f"What are the {n} most common words in the list above? The {n} most common words are"
            if n > 1
            else "What is the most common word in the list above? The most common word is"
        )
        return {
            "intro": CWE_INTRO,
            "needle": common[0],
            "core": common[0],
            "extras": [],
            "question": q,
            "expected": ", ".join(common),
            "info": {"common": common, "rare_words": len(rare)},
            "common": common,
            "rare": rare,
        }
    raise ValueError(f"unknown RULER task {task!r}; expected one of {RULER_TASKS}")


def _filler(haystack: str, task: str, seed: int) -> tuple[Iterator[str], int]:
    if haystack == "default":
        return itertools.cycle(PASSKEY_FILLER), 8
    return _corpus_sentences(haystack, random.Random(f"{task}:{seed}:{haystack}")), 1


def _words(spec: dict, seed: int) -> Iterator[str]:
    """commonwords' list: each word is one of the common ones with chance 1/3 (each of 3 about 1/9 of the list, taken in shuffled rounds),
    else the next rare word of the rest of the vocabulary (~125 words) in a shuffled order, reshuffled once all
    were used: a rare word appears once per ~190 words of the list, a common one ~20 times as often."""
    rng = random.Random(f"commonwords-list:{seed}")
    rare = list(spec["rare"])

    def rounds() -> Iterator[str]:  # the common words in shuffled rounds: their counts differ by at most one
        common = list(spec["common"])
        while True:
            rng.shuffle(common)
            yield from common

    common = rounds()
    while True:
        rng.shuffle(rare)
        for word in rare:
            while rng.random() < 1 / 3:
                yield next(common)
            yield word


def _layout(spec: dict, task: str, tokenizer: Any, haystack: str, seed: int, placed: dict[int, str]) -> _Layout:
    """The shared layout, the extra needles ``placed`` at these unit indices of the filler stream."""
    if task == "commonwords":
        base, min_gap = _words(spec, seed), 1
    else:
        base, min_gap = _filler(haystack, task, seed)

    def units() -> Iterator[str]:
        for i in itertools.count():
            yield placed[i] if i in placed else next(base)

    def extend(last: str, nxt: str, w: int) -> str:
        return f"{last} {_cut_sentence(nxt, w)}"

    sep = " "
    tail = "\n" + spec["question"]
    common = task == "commonwords"
    return _Layout(
        head=spec["intro"] + "\n",
        tail=tail,
        question=spec["question"],
        sep=sep,
        needle=spec["needle"],
        needle_core=spec["core"],
        stream=_Stream(units(), tokenizer, sep),
        extend=None if common else extend,
        extend_limit=None if common else (lambda nxt: len(nxt.split()) - 1),
        min_gap=min_gap,
        pad=(lambda last, nxt: " " + nxt) if common else None,
    )


def build(
    task: str, tokenizer: Any, tokens: int, depth: float, seed: int, haystack: str, options: dict
) -> tuple[_Draft, int, dict]:
    """One RULER-style document: ``(draft, token count, info)``; ``info["expected"]`` is the gold answer.
    Consumes the options it knows from ``options`` (the caller refuses what is left)."""
    rng = random.Random(f"{task}:{seed}")
    spec = _spec(task, rng, options)
    extras: list[str] = spec["extras"]
    place = random.Random(f"{task}:{seed}:places")
    fractions = sorted(place.uniform(0.0, 1.0) for _ in extras)
    # the first fit holds the extras at the start: its unit count (extras included) is what they are spread over
    draft, count = _fit_layout(
        _layout(spec, task, tokenizer, haystack, seed, dict(enumerate(extras))), tokenizer, tokens, depth, task
    )
    units = draft.n_items - 1
    scale = 1.0
    for _ in range(MAX_FITS):
        if not extras:
            break
        room = int(units * scale)  # indices 0 .. room - 1; the unit after the last one (which the fine adjustment
        # and the gap closer cut words from) must never be an extra: checked after the fit
        if room < len(extras):
            raise ValueError(
                f"tokens={tokens} is too small for task {task!r}: its {len(extras) + 1} needles "
                f"and the question leave room for {max(units, 0)} filler units; ask for more tokens"
            )
        positions: list[int] = []
        for f in fractions:  # distinct, increasing, in 0 .. room - 1
            p = min(room - 1, max(int(f * room), positions[-1] + 1 if positions else 0))
            positions.append(p)
        if positions[-1] >= room or len(set(positions)) < len(positions):
            positions = list(range(room - len(extras), room))
        placed = dict(zip(positions, extras))
        draft, count = _fit_layout(
            _layout(spec, task, tokenizer, haystack, seed, placed), tokenizer, tokens, depth, task
        )
        if positions[-1] < draft.n_items - 1:  # every extra among the units used, the next unit a filler one
            break
        scale *= max(0.5, 0.95 * (draft.n_items - 1) / max(units, 1))
    else:
        raise ValueError(f"could not place {len(extras)} extra needles of task {task!r} in {tokens} tokens")
    missing = [e for e in extras if e not in draft.text]
    if missing:  # a guard: the loop above only stops once every extra sits in the document
        raise ValueError(f"task {task!r}: {len(missing)} needles fell outside a {tokens}-token document")
    info = {"expected": spec["expected"], **spec["info"], "needles": 1 + len(extras)}
    if task in ("multivalue", "multiquery"):  # a list answer has no one span: each asked number's own
        spans = []
        for v in spec["info"]["values"]:
            at = draft.text.find(f": {v}.") + 2
            spans.append((at, at + len(str(v))))
        info["answer_spans"] = spans
    if task == "commonwords":
        body = draft.text[len(spec["intro"]) + 1 : draft.question_span[0]]
        counts = Counter(w.strip(".,") for w in body.split())
        top = sorted(counts.values(), reverse=True)
        n = len(spec["common"])
        least_common = min(counts[w] for w in spec["common"])
        rare_most = max([c for w, c in counts.items() if w not in spec["common"]] or [0])
        if least_common <= rare_most:
            raise ValueError(
                f"tokens={tokens} is too small for task {task!r}: its {n} common words do not yet "
                f"stand out (each at least {least_common} times, a rare word {rare_most}); "
                "ask for more tokens"
            )
        info["counts"] = {w: counts[w] for w in spec["common"]}
        info["rare_max"] = rare_most
        del top
    return draft, count, info
