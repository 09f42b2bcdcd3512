"""The ``line`` task: LongChat line retrieval, a record of lines
``line <label>: REGISTER_CONTENT is N`` and a question for one label's number,
with its texts (``LINE_INTRO``) and label word lists (``LINE_LABELS``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from core.data.tasks.draws import _key, _unique_ints
from core.data.tasks.layout import _Layout, _Stream

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
            "blue",
            "bold",
            "brave",
            "bright",
            "calm",
            "gentle",
            "green",
            "icy",
            "lively",
            "odd",
            "plain",
            "proud",
            "quiet",
            "red",
            "sleepy",
            "sour",
            "wild",
            "yellow",
            "kind",
            "good",
            "old",
            "new",
            "large",
            "small",
            "short",
            "long",
            "high",
            "full",
            "empty",
            "simple",
            "hidden",
            "open",
        ),
        (
            "ember",
            "moon",
            "storm",
            "tiger",
            "army",
            "block",
            "book",
            "cloud",
            "coast",
            "coins",
            "fish",
            "hill",
            "leaf",
            "loop",
            "map",
            "node",
            "otter",
            "path",
            "pie",
            "queue",
            "river",
            "root",
            "sea",
            "seal",
            "sky",
            "star",
            "stone",
            "sun",
            "swan",
            "tree",
            "yak",
            "lock",
        ),
    ),
    "classic": (
        (
            "swift",
            "quiet",
            "brave",
            "calm",
            "eager",
            "fancy",
            "gentle",
            "happy",
            "jolly",
            "kind",
            "lively",
            "merry",
            "nimble",
            "proud",
            "silly",
            "witty",
            "zesty",
            "bold",
            "bright",
            "clever",
            "cosy",
            "crisp",
            "daring",
            "dusty",
            "fuzzy",
            "grand",
            "hasty",
            "icy",
            "jumpy",
            "lucky",
            "mellow",
            "misty",
            "noble",
            "odd",
            "plain",
            "rapid",
            "rosy",
            "rusty",
            "shy",
            "sleepy",
            "smooth",
            "snowy",
            "sour",
            "spicy",
            "steady",
            "stormy",
            "sunny",
            "tidy",
            "tiny",
            "vivid",
            "wild",
            "wise",
            "young",
            "amber",
            "azure",
            "coral",
            "golden",
            "ivory",
            "lemon",
            "olive",
            "scarlet",
            "silver",
            "violet",
            "woolly",
        ),
        (
            "otter",
            "falcon",
            "badger",
            "beaver",
            "bison",
            "camel",
            "cobra",
            "crane",
            "dingo",
            "eagle",
            "ferret",
            "gecko",
            "heron",
            "hippo",
            "ibis",
            "jackal",
            "koala",
            "lemur",
            "llama",
            "lynx",
            "magpie",
            "marmot",
            "moose",
            "newt",
            "ocelot",
            "oriole",
            "osprey",
            "panda",
            "parrot",
            "pelican",
            "puffin",
            "python",
            "quail",
            "rabbit",
            "raven",
            "salmon",
            "seal",
            "shark",
            "sloth",
            "snail",
            "sparrow",
            "spider",
            "squid",
            "stork",
            "swan",
            "tapir",
            "tiger",
            "toucan",
            "trout",
            "turtle",
            "viper",
            "walrus",
            "weasel",
            "whale",
            "wombat",
            "yak",
            "zebra",
            "anchor",
            "barrel",
            "candle",
            "harbor",
            "lantern",
            "meadow",
            "pebble",
        ),
    ),
}
_LINE_EXTRAS = ("moon", "river", "stone", "cloud", "field", "storm", "leaf", "star", "hill", "wave", "frost", "ember")


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
        # The last few tokens: the start of the next line, never its number (no second value for any label).
        pad=lambda _last, nxt: "\n" + nxt.rsplit(" ", 1)[0],
    )
    return layout, {"expected": str(key), "key": key, "line_index": asked}
