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
  the gap is 8+ tokens (byte-level tokenizers). ``meta["tokens"]`` holds the
  exact count and ``meta["short_by"]`` the gap (a few tokens in practice).
- Everything random comes from ``random.Random`` seeded by ``seed`` (never the
  global generator); the answer (key, topic, entity) is drawn first, so one
  seed keeps the same answer across lengths and depths: a sweep compares like
  with like.
- Content of filler unit *i* depends only on (task, seed, haystack, i), never
  on the tokenizer: two tokenizers give the same text up to where it is cut.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import operator
import random
import re
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Document",
    "Score",
    "TASKS",
    "HAYSTACKS",
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
]


@dataclass(frozen=True)
class Document:
    """One encoder input with its gold answer and where the answer hides."""

    task: str  # "passkey" | "line" | "topic" | "multidoc" | "code" | "text"
    text: str  # the FULL encoder input: context followed by the question (prompt)
    expected: str  # gold answer as the model should generate it, e.g. "48213"
    needle_span: tuple[int, int]  # [start, end) in `text` of the needle (sentence/line holding the answer)
    question_span: tuple[int, int]  # [start, end) in `text` of the question at the end
    depth: float  # needle depth 0..1 actually used (relative position of the needle in the context)
    seed: int
    meta: dict = field(default_factory=dict, compare=False, hash=False)  # task-specific details


@dataclass(frozen=True)
class Score:
    """Outcome of scoring one model answer."""

    correct: bool
    parsed: str | None  # the value parsed from the model's answer (None if nothing parsable)


TASKS: tuple[str, ...] = ("passkey", "line", "topic", "multidoc", "code")  # generated tasks; "text" is user text
HAYSTACKS: tuple[str, ...] = ("default", "corpus-train", "corpus-eval")

# --------------------------------------------------------------------------- texts

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


LINE_INTRO = (
    "Below is a record of lines I want you to remember. Each line begins with 'line <line index>' "
    "and contains a '<REGISTER_CONTENT>' at the end of the line as a numerical value. For each line "
    "index, memorize its corresponding <REGISTER_CONTENT>. At the end of the record, I will ask you "
    "to retrieve the corresponding <REGISTER_CONTENT> of a certain line index. Now the record start:"
)
# Line labels are adjective-noun pairs, as in LongChat ("line righteous-ethernet").
# "compact" (the default) uses words the bundled 2,048-token BPE spells in few
# pieces: each label is 3-4 tokens (" quiet", "-", "mo", "on"), about what a
# LLaMA-size vocabulary spends on LongChat's labels. "classic" is the first
# list (swift-otter, ...): about 8 byte-level pieces per label. Label length
# turned out not to be why our small models miss lines (docs/line-retrieval.md: "Line
# retrieval: what was tried"), but the compact list is the closer analogue.
# "classic" stays because the default model's first training stages used it
# (their train_config says so).
LINE_LABELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "compact": (
        (
            "blue", "bold", "brave", "bright", "calm", "gentle", "green", "icy", "lively", "odd",
            "plain", "proud", "quiet", "red", "sleepy", "sour", "wild", "yellow", "kind", "good",
            "old", "new", "large", "small", "short", "long", "high", "full", "empty", "simple",
            "hidden", "open",
        ),
        (
            "ember", "moon", "storm", "tiger", "army", "block", "book", "cloud", "coast", "coins",
            "fish", "hill", "leaf", "loop", "map", "node", "otter", "path", "pie", "queue",
            "river", "root", "sea", "seal", "sky", "star", "stone", "sun", "swan", "tree",
            "yak", "lock",
        ),
    ),
    "classic": (
        (
            "swift", "quiet", "brave", "calm", "eager", "fancy", "gentle", "happy", "jolly", "kind",
            "lively", "merry", "nimble", "proud", "silly", "witty", "zesty", "bold", "bright", "clever",
            "cosy", "crisp", "daring", "dusty", "fuzzy", "grand", "hasty", "icy", "jumpy", "lucky",
            "mellow", "misty", "noble", "odd", "plain", "rapid", "rosy", "rusty", "shy", "sleepy",
            "smooth", "snowy", "sour", "spicy", "steady", "stormy", "sunny", "tidy", "tiny", "vivid",
            "wild", "wise", "young", "amber", "azure", "coral", "golden", "ivory", "lemon", "olive",
            "scarlet", "silver", "violet", "woolly",
        ),
        (
            "otter", "falcon", "badger", "beaver", "bison", "camel", "cobra", "crane", "dingo", "eagle",
            "ferret", "gecko", "heron", "hippo", "ibis", "jackal", "koala", "lemur", "llama", "lynx",
            "magpie", "marmot", "moose", "newt", "ocelot", "oriole", "osprey", "panda", "parrot", "pelican",
            "puffin", "python", "quail", "rabbit", "raven", "salmon", "seal", "shark", "sloth", "snail",
            "sparrow", "spider", "squid", "stork", "swan", "tapir", "tiger", "toucan", "trout", "turtle",
            "viper", "walrus", "weasel", "whale", "wombat", "yak", "zebra", "anchor", "barrel", "candle",
            "harbor", "lantern", "meadow", "pebble",
        ),
    ),
}
_TOPIC_EXTRA = (
    "By the way, there is a lot more to say about this, so feel free to ask follow up questions "
    "whenever you like and we can go into as much detail as you want."
)
_MULTIDOC_EXTRA = (
    "It is also mentioned in several travel guides, school books and local newspapers, usually "
    "in passing and without much detail, which makes it hard to learn more about it."
)
_LINE_EXTRAS = ("moon", "river", "stone", "cloud", "field", "storm", "leaf", "star", "hill", "wave", "frost", "ember")

TOPIC_INTRO = (
    "Below is a record of our previous conversation on many different topics. You are the ASSISTANT, "
    "and I am the USER. At the beginning of each topic, the USER will say 'I would like to discuss the "
    "topic of <TOPIC>'. Memorize each <TOPIC>. At the end of the record, I will ask you to retrieve the "
    "first topic. Now the record start."
)
TOPIC_QUESTION = "What is the first topic we discussed? Only give me the topic name."
TOPICS: tuple[str, ...] = (
    "chess openings", "bird migration", "sourdough baking", "volcanoes", "jazz history",
    "urban gardening", "ancient Rome", "deep sea fish", "solar power", "origami",
    "marathon training", "coral reefs", "board games", "black holes", "knitting",
    "beekeeping", "medieval castles", "rock climbing", "tea ceremonies", "glaciers",
    "film noir", "electric cars", "photography", "opera", "desert plants",
    "space probes", "wine making", "street food", "the Silk Road", "sailing",
    "mushrooms", "wolves", "typography", "minimalism", "the printing press",
    "earthquakes", "violin making", "chocolate", "poetry", "skateboarding",
    "lighthouses", "carnivorous plants", "ballet", "comets", "pottery",
    "rainforests", "cryptography", "hot air balloons", "penguins", "sushi",
    "architecture", "time zones", "the Olympic Games", "windmills", "calligraphy",
    "dinosaurs", "coffee roasting", "bonsai trees", "submarines", "jellyfish",
    "folk music", "tornadoes", "mountain biking", "ice hockey",
)
_USER_TURNS: tuple[str, ...] = (
    "Where should a beginner start?",
    "What do most people get wrong about it?",
    "Can you give me an example?",
    "That is interesting. Tell me more.",
    "How has it changed over the last century?",
    "Is there a good book about it?",
    "What is the most surprising fact you know?",
    "Why do people find it so fascinating?",
    "How would you explain it to a child?",
    "What should I read next?",
    "Is it expensive to get into?",
    "Thanks, that helps a lot.",
)
_ASSISTANT_TURNS: tuple[str, ...] = (
    "Sure! {t} is a wonderful subject with a long history.",
    "A good start is to learn the basic vocabulary and then practice a little every day.",
    "Many people underestimate how much patience {t} requires.",
    "One classic example is often taught in introductory courses.",
    "It has changed a lot, mostly because of new tools and better communication.",
    "There are several good books; pick one with many pictures and short chapters.",
    "Experts still disagree about some details, which keeps {t} lively.",
    "People enjoy it because every small step shows visible progress.",
    "Imagine building something one piece at a time, and checking each piece as you go.",
    "You could look for a local club or an online community about {t}.",
    "It does not have to be expensive; borrowing equipment is a fine way to begin.",
    "You are welcome! Let me know if you have more questions about {t}.",
)

MULTIDOC_INTRO = (
    "Write a high-quality answer for the given question using only the provided search results "
    "(some of which might be irrelevant)."
)
_COUNTRY_HEADS = ("Var", "Quen", "Tal", "Mor", "Zel", "Bran", "Kest", "Lum", "Dor", "Fen",
                  "Gal", "Hes", "Ist", "Jor", "Nal", "Pel", "Ros", "Sar", "Tev", "Ul")
_COUNTRY_MIDS = ("no", "ma", "ri", "ve", "lo", "da", "be", "si", "tu", "ka", "", "ne")
_COUNTRY_TAILS = ("lia", "ria", "stan", "land", "mar", "dor", "via", "nia")
_CITY_HEADS = ("Trel", "Els", "Bram", "Cor", "Dun", "Ash", "Hol", "Kin", "Mar", "Nor",
               "Os", "Pen", "Quar", "Red", "Sil", "Thorn", "Wex", "Yar", "Brig", "Cal")
_CITY_MIDS = ("", "er", "en", "a", "il")
_CITY_TAILS = ("mont", "ford", "haven", "burg", "ton", "wick", "field", "port", "gate", "moor")
_FIRST_NAMES = ("Mira", "Oskar", "Lena", "Tomas", "Ilse", "Piotr", "Ada", "Rune", "Nora", "Emil",
                "Vera", "Anton", "Greta", "Felix", "Ines", "Jonas", "Clara", "Hugo", "Maren", "Viktor")
_SURNAME_HEADS = ("Tol", "Brek", "Hal", "Mor", "Ves", "Kar", "Lind", "Ost", "Fal", "Dre")
_SURNAME_TAILS = ("sen", "berg", "vik", "mann", "ard", "strom", "holt", "wen", "ley", "dahl")
_COUNTRY_FILLER: tuple[str, ...] = (
    "{e} is known for its {a} valleys and long rivers.",
    "Travelers often describe {e} as {a} and welcoming.",
    "The economy of {e} relies on farming, fishing and small workshops.",
    "Most people in {e} live near the coast.",
    "The flag of {e} shows a {a} star on a plain field.",
    "Winters in {e} are long, and summers are short but bright.",
    "{e} has a small army and a large number of public libraries.",
    "Historians still argue about how {e} got its name.",
    "Football is the most popular sport in {e}.",
    "Several old trade routes cross the hills of {e}.",
)
_PERSON_FILLER: tuple[str, ...] = (
    "{e} worked as a {a} clockmaker for most of their life.",
    "{e} is remembered for a series of letters about travel.",
    "Friends described {e} as {a} and stubborn.",
    "{e} spent many years collecting maps and old coins.",
    "A small museum now displays the notebooks of {e}.",
    "{e} never married and lived in a house by the sea.",
    "The paintings of {e} were rediscovered long after their death.",
    "{e} corresponded with several scientists of the time.",
    "Few portraits of {e} survive.",
    "{e} taught music to the children of the village.",
)
_FILLER_ADJ = ("quiet", "green", "busy", "gentle", "proud", "calm", "bright", "patient", "rugged", "friendly")

_CODE_HEADER = '"""Small helper functions used by the data pipeline."""'
_CODE_QUESTION = "# What does get_key() return? The key is"
_CODE_COMMENT = (
    "Note: the helpers in this module are small pure functions kept here for the examples, "
    "the tests and a few scripts that still import them from this place."
).split()
_CODE_PREFIXES = ("f", "g", "h", "calc", "step", "apply", "fold", "mix")
_CODE_GETTERS = ("size", "limit", "count", "offset", "mode", "level", "width", "depth", "rate", "scale")
_CODE_WORDS = ("alpha", "beta", "gamma", "delta", "name", "value", "total", "item", "color", "port")
_CODE_TEMPLATES: tuple[str, ...] = (
    "def {n}(x):\n    return x * {a} + {b}\n",
    "def {n}(x, y):\n    return (x + {a}) * y - {b}\n",
    "def {n}(x):\n    if x > {a}:\n        return x - {b}\n    return x + {c}\n",
    "def {n}(items):\n    return [v * {a} for v in items if v % {b}]\n",
    "def {n}(text):\n    return text.strip().lower()[:{a}]\n",
    "def {n}(x):\n    total = 0\n    for i in range({a}):\n        total += x * i\n    return total\n",
    "def {n}(p, q):\n    return max(p, q) % {a}\n",
    'def {n}(x):\n    """Scale x by {a}."""\n    return x * {a}\n',
    'def {n}(d):\n    return d.get("{w}", {a})\n',
    "def {n}(n):\n    return n // {a} if n else {b}\n",
    "def get_{g}_{i}():\n    return {a}{b}\n",
)

# --------------------------------------------------------------------------- scoring

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
    else the containment rule.
    """
    if task in ("passkey", "code"):
        return _score_int(answer, expected, last=False)
    if task == "line":
        return _score_int(answer, expected, last=True)
    if task in ("topic", "multidoc"):
        return _score_text(answer, expected)
    if task == "text":
        if re.fullmatch(r"\s*\d+\s*", expected or ""):
            return _score_int(answer, expected, last=False)
        return _score_text(answer, expected)
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS + ('text',)}")


# --------------------------------------------------------------------------- token counting


def _input_ids(tokenizer: Any, texts: str | list[str], add_special_tokens: bool = True) -> Any:
    """input_ids from any HF-like tokenizer (BatchEncoding, dict or object)."""
    try:
        out = tokenizer(texts, add_special_tokens=add_special_tokens)
    except TypeError:  # a bare callable without the keyword
        out = tokenizer(texts)
    return out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out.input_ids


def count_tokens(tokenizer: Any, text: str) -> int:
    """Token count the way the engine sees it: ``len(tokenizer(text).input_ids)``."""
    return len(_input_ids(tokenizer, text))


class _Stream:
    """Filler units generated lazily, in order, with estimated token costs.

    Costs come from one batched tokenizer call per extension, each unit
    tokenized as ``sep + unit`` without special tokens: with a pre-tokenizer
    that splits at whitespace this is exact for the concatenation, and close
    for others; the caller confirms with full-text counts anyway. Repeated
    units (the classic passkey filler) are costed once. Large extensions
    tokenize units in groups (at most ``MAX_STRINGS`` strings per call) and
    share each group's count by character length: per-string overhead, not
    tokens, dominates the cost of thousands of tiny strings, and only the
    running sums need to be accurate.
    """

    MAX_STRINGS = 64

    def __init__(self, units: Iterator[str], tokenizer: Any, sep: str) -> None:
        self._source = units
        self._tokenizer = tokenizer
        self._sep = sep
        self._known: dict[str, float] = {}
        self.units: list[str] = []
        self.costs: list[float] = []
        self.cum: list[float] = [0.0]

    def extend(self, count: int) -> None:
        """Generate (and cost) at least ``count`` more units."""
        batch = list(itertools.islice(self._source, max(8, count)))
        if not batch:
            raise RuntimeError("filler stream exhausted")  # streams are infinite by construction
        fresh = list(dict.fromkeys(u for u in batch if u not in self._known))
        if fresh:
            size = max(1, math.ceil(len(fresh) / self.MAX_STRINGS))
            groups = [fresh[i : i + size] for i in range(0, len(fresh), size)]
            texts = ["".join(self._sep + u for u in group) for group in groups]
            for group, ids in zip(groups, _input_ids(self._tokenizer, texts, add_special_tokens=False)):
                chars = sum(len(self._sep) + len(u) for u in group)
                for u in group:
                    self._known[u] = max(1.0, len(ids) * (len(self._sep) + len(u)) / chars)
        for unit in batch:
            self.units.append(unit)
            self.costs.append(self._known[unit])
            self.cum.append(self.cum[-1] + self.costs[-1])

    def ensure(self, n: int) -> None:
        """Make units[0:n] exist."""
        if n > len(self.units):
            self.extend(n - len(self.units))

    def fit(self, lo: int, budget: float) -> int:
        """Largest x >= lo whose units[lo:x] are estimated to cost <= budget."""
        self.ensure(lo + 1)
        while self.cum[-1] - self.cum[lo] <= budget:
            average = self.cum[-1] / len(self.units)
            remaining = budget - (self.cum[-1] - self.cum[lo])
            self.extend(int(remaining / average * 1.1) + 8)
        return bisect.bisect_right(self.cum, self.cum[lo] + budget) - 1


def _max_feasible(
    g: Callable[[int], int],
    target: int,
    lo: int,
    g_lo: int,
    limit: int,
    guess: Callable[[int, int], int],
    step_cost: Callable[[int], float],
) -> tuple[int, int]:
    """Largest x in [lo, limit] with g(x) <= target, g non-decreasing, g(lo) = g_lo <= target.

    Probes come from ``guess`` (estimated best x from a known feasible point)
    while no infeasible point is known, then from interpolation between the
    feasible and infeasible bracket ends (g is close to linear), and after a
    few probes from bisection, so a badly estimating tokenizer costs a few
    more probes but never a wrong answer. ``step_cost(x)`` is the estimated
    cost of going from x to x+1: when it clearly exceeds the remaining
    budget, x+1 is not probed at all.
    """
    hi: int | None = None  # smallest probed infeasible x
    g_hi = 0
    probes = 0
    while True:
        upper = limit if hi is None else hi - 1
        if lo >= upper:
            return lo, g_lo
        if hi is None and probes < 4:
            x = guess(lo, g_lo)
            if x <= lo:
                if step_cost(lo) > target - g_lo + 1:
                    return lo, g_lo
                x = lo + 1
        elif hi is None:
            x = lo + 2 ** (probes - 2)
        elif probes < 5 and g_hi > g_lo:
            x = lo + int((target - g_lo) * (hi - lo) / (g_hi - g_lo))
        else:
            x = (lo + hi) // 2
        x = max(lo + 1, min(x, upper))
        probes += 1
        gx = g(x)
        if gx <= target:
            lo, g_lo = x, gx
        else:
            hi, g_hi = x, gx


# --------------------------------------------------------------------------- layout


@dataclass
class _Layout:
    """How a task lays out its document; ``_fit_layout`` sizes it.

    text = head + sep.join(items) + tail, where items are the filler units
    (the fine adjustment: the last unit extended by ``extend`` with ``cut``
    words, or ``cut`` units made a little longer by ``lengthen``) with the
    needle item inserted
    after ``round(depth * m)`` of the m units (or at ``fixed_pos``), each item
    passed through ``fmt(index, item)``. The needle span is where
    ``needle_core`` sits inside the needle item; the question span is where
    ``question`` sits inside the tail.
    """

    head: str
    tail: str
    question: str
    sep: str
    needle: str
    needle_core: str
    stream: _Stream
    fixed_pos: int | None = None
    fmt: Callable[[int, str], str] | None = None
    extend: Callable[[str, str, int], str] | None = None  # (last unit, next unit, words) -> last unit + words
    extend_limit: Callable[[str], int] | None = None  # next unit -> most words ``extend`` may add
    lengthen: Callable[[str, int], str] | None = None  # (unit, salt) -> same unit, a few tokens longer
    min_gap: int = 1  # fine adjustment only when at least this many tokens are missing


@dataclass
class _Draft:
    text: str
    needle_span: tuple[int, int]
    question_span: tuple[int, int]
    depth: float
    position: int  # index of the needle item among all items
    n_items: int  # filler units + needle
    cut_words: int


def _render(layout: _Layout, n: int, cut: int, depth: float) -> _Draft:
    layout.stream.ensure(n + 1)
    units = layout.stream.units[:n]
    needle = layout.needle
    if cut and layout.extend is not None:
        if n:
            units = units[:-1] + [layout.extend(units[-1], layout.stream.units[n], cut)]
        else:  # no filler unit fits whole: extend the needle item (its core stays intact)
            needle = layout.extend(needle, layout.stream.units[0], cut)
    elif cut and layout.lengthen is not None:
        units = list(units)
        for k in range(cut):  # spread over the record, no positional pattern
            i = (k * n) // cut
            units[i] = layout.lengthen(units[i], i)
    m = len(units)
    pos = layout.fixed_pos if layout.fixed_pos is not None else int(math.floor(depth * m + 0.5))
    pos = min(pos, m)
    items = units[:pos] + [needle] + units[pos:]
    if layout.fmt is not None:
        items = [layout.fmt(i, item) for i, item in enumerate(items)]
    before = layout.head + "".join(item + layout.sep for item in items[:pos])
    core_at = items[pos].find(layout.needle_core)
    assert core_at >= 0, "needle core must be inside the needle item"
    needle_start = len(before) + core_at
    text = layout.head + layout.sep.join(items) + layout.tail
    q_start = len(text) - len(layout.tail) + layout.tail.rfind(layout.question)
    return _Draft(
        text=text,
        needle_span=(needle_start, needle_start + len(layout.needle_core)),
        question_span=(q_start, q_start + len(layout.question)),
        depth=(pos / m) if m else 0.0,
        position=pos,
        n_items=m + 1,
        cut_words=cut,
    )


def _fit_layout(layout: _Layout, tokenizer: Any, target: int, depth: float, task: str) -> tuple[_Draft, int]:
    """The longest rendering of ``layout`` with at most ``target`` tokens, and its count."""
    counts: dict[tuple[int, int], int] = {}

    def g(n: int, cut: int = 0) -> int:
        if (n, cut) not in counts:
            counts[(n, cut)] = count_tokens(tokenizer, _render(layout, n, cut, depth).text)
        return counts[(n, cut)]

    base = g(0)
    if base > target:
        raise ValueError(
            f"tokens={target} is too small for task {task!r}: the needle and question alone "
            f"take {base} tokens with this tokenizer; ask for at least {base}."
        )
    stream = layout.stream

    def step_cost(x: int) -> float:
        stream.ensure(x + 1)
        return stream.costs[x]

    n, tokens = _max_feasible(
        g,
        target,
        0,
        base,
        limit=target,  # every unit costs >= 1 token
        guess=lambda lo, g_lo: stream.fit(lo, target - g_lo),
        step_cost=step_cost,
    )
    # Fine adjustment: cut the next unit short, or lengthen some units.
    cut, limit = 0, 0
    if target - tokens < layout.min_gap:
        pass
    elif layout.extend is not None and layout.extend_limit is not None:
        stream.ensure(n + 1)
        limit = layout.extend_limit(stream.units[n])
    elif layout.lengthen is not None:
        limit = n
    if limit > 0 and g(n, 1) <= target:  # one step must fit, else stay at whole units
        g1 = g(n, 1)

        def cut_guess(lo: int, g_lo: int) -> int:
            # Tokens per step: measured once two feasible points exist; the
            # first step (w = 1) also pays for the joint, so take half of it.
            slope = (g_lo - g1) / (lo - 1) if lo > 1 else max(1, g1 - tokens) / 2
            return lo + int((target - g_lo) / max(slope, 0.25))

        cut, tokens = _max_feasible(lambda w: g(n, w), target, 1, g1, limit, cut_guess, lambda w: 1)
    return _render(layout, n, cut, depth), tokens


# --------------------------------------------------------------------------- haystacks


@functools.lru_cache(maxsize=4)
def _pool_sentences(name: str) -> tuple[tuple[str, ...], ...]:
    """Corpus pool paragraphs, each split into sentences (cached per pool)."""
    from core import corpus

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


# --------------------------------------------------------------------------- tasks


def _key(rng: random.Random, options: dict, name: str = "key") -> int:
    key = options.pop(name, None)
    if key is None:
        return rng.randint(10000, 99999)
    try:
        value = operator.index(key) if not isinstance(key, bool) else -1
    except TypeError:
        value = -1
    if not 10000 <= value <= 99999:
        raise ValueError(f"{name} must be a 5-digit integer (10000..99999), got {key!r}")
    return value


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


def _unique_ints(rng: random.Random, size: int) -> Iterator[int]:
    """Endless seeded draws, unique within a document: values in range(size)
    first, then range(size, 2*size) once 3/4 of the first range is used, etc.

    Why: unique line indices / function names without shuffling a big list per
    document; rejection sampling stays O(1) per draw below 3/4 occupancy, and
    callers turn ``value // size`` into a suffix ("quiet-moon-2").
    """
    for epoch in itertools.count():
        used: set[int] = set()
        while len(used) < (3 * size) // 4:
            value = rng.randrange(size)
            if value not in used:
                used.add(value)
                yield epoch * size + value


def _line(tokenizer: Any, rng: random.Random, haystack: str, seed: int, options: dict) -> tuple[_Layout, dict]:
    key = _key(rng, options)
    labels = options.pop("labels", "compact")
    if labels not in LINE_LABELS:
        raise ValueError(f"labels must be one of {sorted(LINE_LABELS)}, got {labels!r}")
    intro = options.pop("intro", True)  # False: a bare record (a training curriculum, not LongChat's format)
    if not isinstance(intro, bool):
        raise ValueError(f"intro must be true or false, got {intro!r}")
    # share (training only): the chance that a line's label shares a word with
    # the asked one ("long-queue" when "wild-queue" is asked). The bundled
    # model's misses were mostly such lines: it matched the noun and barely
    # the adjective; lines like these are the hard negatives that teach both.
    share = options.pop("share", 0.0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be a number in [0, 1], got {share!r}")
    adjectives, nouns = LINE_LABELS[labels]
    pairs = len(adjectives) * len(nouns)
    unit_rng = random.Random(f"line:{seed}:units")
    indices = _unique_ints(unit_rng, pairs)

    def idx(value: int) -> str:
        epoch, pair = divmod(value, pairs)
        a, n = divmod(pair, len(nouns))
        return f"{adjectives[a]}-{nouns[n]}" + (f"-{epoch + 1}" if epoch else "")

    asked_value = next(indices)
    asked = idx(asked_value)
    used = {asked_value}

    def sharing() -> int:
        """A pair of the first epoch that keeps the asked adjective or noun (the other word drawn anew)."""
        a, n = divmod(asked_value % pairs, len(nouns))
        if unit_rng.random() < 0.5:
            return a * len(nouns) + unit_rng.randrange(len(nouns))
        return unit_rng.randrange(len(adjectives)) * len(nouns) + n

    def lines() -> Iterator[str]:
        for value in indices:
            if share and unit_rng.random() < share:
                candidate = sharing()
                value = value if candidate in used else candidate  # all taken: the plain draw
            if value in used:  # a plain draw that a sharing line took before
                continue
            used.add(value)
            number = unit_rng.randint(10000, 99999)
            if number == key:
                number = 10000 + (number - 10000 + 1) % 90000
            yield f"line {idx(value)}: REGISTER_CONTENT is {number}"

    needle = f"line {asked}: REGISTER_CONTENT is {key}"
    question = f"Tell me what is the REGISTER_CONTENT in line {asked}? I need the number."

    def lengthen(unit: str, salt: int) -> str:
        # "quiet-moon" -> "quiet-moon-river": still unique, never a prefix of
        # the asked index (its pair appears once).
        head, _, rest = unit.partition(": ")
        return f"{head}-{_LINE_EXTRAS[salt % len(_LINE_EXTRAS)]}: {rest}"

    layout = _Layout(
        head=LINE_INTRO + "\n\n" if intro else "",
        tail="\n\nNow the record is over. " + question,
        question=question,
        sep="\n",
        needle=needle,
        needle_core=needle,
        stream=_Stream(lines(), tokenizer, "\n"),
        lengthen=lengthen,
    )
    return layout, {"expected": str(key), "key": key, "line_index": asked}


def _topic(tokenizer: Any, rng: random.Random, haystack: str, seed: int, options: dict) -> tuple[_Layout, dict]:
    order = list(TOPICS)
    rng.shuffle(order)
    first, others = order[0], order[1:]
    unit_rng = random.Random(f"topic:{seed}:{haystack}:units")
    corpus_sentences = (
        _corpus_sentences(haystack, random.Random(f"topic:{seed}:{haystack}:corpus"), max_words=30)
        if haystack != "default"
        else None
    )
    opening = "USER: I would like to discuss the topic of {}."

    def turns() -> Iterator[str]:
        for conversation in itertools.count(0):
            if conversation > 0:
                topic = others[(conversation - 1) % len(others)]  # the first topic never comes back
                yield opening.format(topic)
            else:
                topic = first
            # Odd counts: ASSISTANT/USER alternate after the USER opening and end on ASSISTANT.
            for turn in range(unit_rng.choice((3, 5, 7))):
                if turn % 2 == 0:
                    if corpus_sentences is not None:
                        yield "ASSISTANT: " + next(corpus_sentences)
                    else:
                        template = unit_rng.choice(_ASSISTANT_TURNS)
                        text = template.format(t=topic)
                        yield "ASSISTANT: " + text[0].upper() + text[1:]
                else:
                    yield "USER: " + unit_rng.choice(_USER_TURNS)

    needle = opening.format(first)

    extend, extend_limit = _append_words(_TOPIC_EXTRA)

    layout = _Layout(
        head=TOPIC_INTRO + "\n",
        tail="\nNow the record ends. " + TOPIC_QUESTION,
        question=TOPIC_QUESTION,
        sep="\n",
        needle=needle,
        needle_core=needle,
        stream=_Stream(turns(), tokenizer, "\n"),
        fixed_pos=0,
        extend=extend,
        extend_limit=extend_limit,
    )
    return layout, {"expected": first, "topic": first}


def _entity_names(rng: random.Random) -> Callable[[str], str]:
    """Seeded generator of unique invented names ("country", "city", "person")."""
    used: set[str] = set()

    def draw(kind: str) -> str:
        for attempt in itertools.count():
            if kind == "country":
                name = rng.choice(_COUNTRY_HEADS) + rng.choice(_COUNTRY_MIDS) + rng.choice(_COUNTRY_TAILS)
            elif kind == "city":
                name = rng.choice(_CITY_HEADS) + rng.choice(_CITY_MIDS) + rng.choice(_CITY_TAILS)
            else:
                name = f"{rng.choice(_FIRST_NAMES)} {rng.choice(_SURNAME_HEADS)}{rng.choice(_SURNAME_TAILS)}"
            if attempt > 50:  # name space exhausted in a huge document: disambiguate
                name = f"{name} {attempt}"
            if name not in used:
                used.add(name)
                return name
        raise AssertionError("unreachable")

    return draw


def _multidoc(tokenizer: Any, rng: random.Random, haystack: str, seed: int, options: dict) -> tuple[_Layout, dict]:
    attribute = options.pop("attribute", None)
    if attribute is None:
        attribute = rng.choice(("capital", "born"))
    if attribute not in ("capital", "born"):
        raise ValueError(f"attribute must be 'capital' or 'born', got {attribute!r}")
    names = _entity_names(rng)

    def fact(kind: str) -> tuple[str, str, str]:
        """(entity, value, sentence) for a new entity."""
        if kind == "capital":
            entity, value = names("country"), names("city")
            return entity, value, f"The capital of {entity} is {value}."
        entity, value = names("person"), str(rng.randint(1700, 1999))
        return entity, value, f"{entity} was born in {value}."

    entity, value, gold_fact = fact(attribute)
    unit_rng = random.Random(f"multidoc:{seed}:{haystack}:units")
    corpus_sentences = (
        _corpus_sentences(haystack, random.Random(f"multidoc:{seed}:{haystack}:corpus"), max_words=25)
        if haystack != "default"
        else None
    )

    def body(name: str, kind: str) -> str:
        if corpus_sentences is not None:
            # Corpus sentences run long: a few short ones keep documents (and
            # the smallest possible document) in the size range of the templates.
            count = unit_rng.randint(1, 3)
            return " ".join(itertools.islice(corpus_sentences, count))
        count = unit_rng.randint(2, 5)
        templates = unit_rng.sample(_COUNTRY_FILLER if kind == "capital" else _PERSON_FILLER, count)
        return " ".join(t.format(e=name, a=unit_rng.choice(_FILLER_ADJ)) for t in templates)

    def documents() -> Iterator[str]:
        while True:
            # Mostly the same attribute as the question (hard distractors), some of the other kind.
            kind = attribute if unit_rng.random() < 0.75 else ("born" if attribute == "capital" else "capital")
            name, _value, sentence = fact(kind)
            yield f"(Title: {name}) {sentence} {body(name, kind)}"

    needle = f"(Title: {entity}) {gold_fact} {body(entity, attribute)}"
    if attribute == "capital":
        question = f"Question: what is the capital of {entity}? Answer:"
    else:
        question = f"Question: in what year was {entity} born? Answer:"

    title = re.compile(r"^\(Title: (.*?)\) ")

    def extra_words(last: str, nxt: str) -> list[str]:
        # The next document's body (its fact dropped, its entity renamed to the
        # last document's), then a generic sentence: long enough to close any
        # gap smaller than one document.
        own, other = title.match(last), title.match(nxt)
        rest = nxt[other.end() :] if other else nxt
        body = rest[rest.find(". ") + 2 :] if ". " in rest else ""
        if own and other:
            body = body.replace(other.group(1), own.group(1))
        return (body + " " + _MULTIDOC_EXTRA).split()

    def extend(last: str, nxt: str, w: int) -> str:
        return f"{last} {_cut_sentence(' '.join(extra_words(last, nxt)), w)}"

    def extend_limit(nxt: str) -> int:
        return len(nxt.split()) + len(_MULTIDOC_EXTRA.split()) - 1

    layout = _Layout(
        head=MULTIDOC_INTRO + "\n\n",
        tail="\n\n" + question,
        question=question,
        sep="\n",
        needle=needle,
        needle_core=gold_fact,
        stream=_Stream(documents(), tokenizer, "\nDocument [10] "),
        fmt=lambda i, item: f"Document [{i + 1}] {item}",
        extend=extend,
        extend_limit=extend_limit,
    )
    return layout, {"expected": value, "entity": entity, "attribute": attribute}


def _code(tokenizer: Any, rng: random.Random, haystack: str, seed: int, options: dict) -> tuple[_Layout, dict]:
    key = _key(rng, options)
    unit_rng = random.Random(f"code:{seed}:units")
    names = _unique_ints(unit_rng, 10000)  # f_123 ... f_9999, then f_10000+

    def functions() -> Iterator[str]:
        for number in names:
            template = unit_rng.choice(_CODE_TEMPLATES)
            yield template.format(
                n=f"{unit_rng.choice(_CODE_PREFIXES)}_{number}",
                i=number,
                a=unit_rng.randint(2, 19),
                b=unit_rng.randint(1, 9),
                c=unit_rng.randint(1, 9),
                w=unit_rng.choice(_CODE_WORDS),
                g=unit_rng.choice(_CODE_GETTERS),
            )

    needle = f"def get_key():\n    return {key}\n"

    def extend(last: str, _next: str, words: int) -> str:
        # A comment line closes the gap: a cut function would not parse.
        return last + "# " + " ".join(_CODE_COMMENT[:words]) + "\n"

    layout = _Layout(
        head=_CODE_HEADER + "\n\n\n",
        tail="\n" + _CODE_QUESTION,
        question=_CODE_QUESTION,
        sep="\n",
        needle=needle,
        needle_core=needle.rstrip("\n"),
        stream=_Stream(functions(), tokenizer, "\n"),
        extend=extend,
        extend_limit=lambda _next: len(_CODE_COMMENT),
    )
    return layout, {"expected": str(key), "key": key}


_BUILDERS: dict[str, Callable[..., tuple[_Layout, dict]]] = {
    "passkey": _passkey,
    "line": _line,
    "topic": _topic,
    "multidoc": _multidoc,
    "code": _code,
}
_HAYSTACK_TASKS = ("passkey", "topic", "multidoc")  # tasks whose filler can come from the corpus


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


def make(
    task: str,
    tokenizer: Any,
    tokens: int,
    depth: float = 0.5,
    seed: int = 0,
    haystack: str = "default",
    **options: Any,
) -> Document:
    """Generate one retrieval document of ``tokens`` tokens (never more).

    tokens: target length of the whole encoder input, counted as
    ``len(tokenizer(text).input_ids)`` (special tokens included).
    depth: where the needle goes, 0 = right after the instructions,
    1 = right before the question (topic: the asked item is always the first
    conversation, so depth is ignored and recorded as 0.0).
    haystack: "default" (the task's classic filler) or "corpus-train" /
    "corpus-eval" (paragraphs of the disjoint core.corpus pools) for passkey,
    topic and multidoc; line and code have no prose and always use their own
    filler (recorded in ``meta["haystack"]``).
    options: ``key=`` (5-digit int) for passkey/line/code, ``attribute=``
    ("capital" | "born") for multidoc, ``labels=`` ("compact" | "classic",
    the word list of the line indices), ``intro=False`` (the record
    without LongChat's instructions) and ``share=`` (0..1: the chance that a
    line's label shares a word with the asked one; hard negatives for
    training) for line.

    Raises ValueError for an unknown task/haystack/option, a depth outside
    [0, 1], or a ``tokens`` too small to hold the needle and question.
    """
    if task not in _BUILDERS:
        hint = " (use from_text for your own text)" if task == "text" else ""
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS}{hint}")
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
    used_haystack = haystack if task in _HAYSTACK_TASKS else "default"
    rng = random.Random(f"{task}:{seed}")
    opts = dict(options)
    layout, info = _BUILDERS[task](tokenizer, rng, used_haystack, seed, opts)
    if opts:
        raise ValueError(f"unknown option(s) for task {task!r}: {sorted(opts)}")
    draft, count = _fit_layout(layout, tokenizer, tokens, depth, task)
    expected = info.pop("expected")
    meta: dict[str, Any] = {
        "tokens": count,
        "target": tokens,
        "short_by": tokens - count,  # > 0 only by less than one filler unit
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


# --------------------------------------------------------------------------- your own text

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
