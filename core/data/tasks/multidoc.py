"""The ``multidoc`` task: multi-document QA in the "lost in the middle" layout,
numbered search results about invented countries and people, one of which
holds the asked fact (a capital or a birth year); with its intro
(``MULTIDOC_INTRO``) and the name parts and filler templates it draws from.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Iterator
from typing import Any

from core.data.tasks.filler import _cut_sentence, _filler_sources
from core.data.tasks.layout import _Layout, _Stream

_MULTIDOC_EXTRA = (
    "It is also mentioned in several travel guides, school books and local newspapers, usually "
    "in passing and without much detail, which makes it hard to learn more about it."
)

MULTIDOC_INTRO = (
    "Write a high-quality answer for the given question using only the provided search results "
    "(some of which might be irrelevant)."
)
_COUNTRY_HEADS = (
    "Var",
    "Quen",
    "Tal",
    "Mor",
    "Zel",
    "Bran",
    "Kest",
    "Lum",
    "Dor",
    "Fen",
    "Gal",
    "Hes",
    "Ist",
    "Jor",
    "Nal",
    "Pel",
    "Ros",
    "Sar",
    "Tev",
    "Ul",
)
_COUNTRY_MIDS = ("no", "ma", "ri", "ve", "lo", "da", "be", "si", "tu", "ka", "", "ne")
_COUNTRY_TAILS = ("lia", "ria", "stan", "land", "mar", "dor", "via", "nia")
_CITY_HEADS = (
    "Trel",
    "Els",
    "Bram",
    "Cor",
    "Dun",
    "Ash",
    "Hol",
    "Kin",
    "Mar",
    "Nor",
    "Os",
    "Pen",
    "Quar",
    "Red",
    "Sil",
    "Thorn",
    "Wex",
    "Yar",
    "Brig",
    "Cal",
)
_CITY_MIDS = ("", "er", "en", "a", "il")
_CITY_TAILS = ("mont", "ford", "haven", "burg", "ton", "wick", "field", "port", "gate", "moor")
_FIRST_NAMES = (
    "Mira",
    "Oskar",
    "Lena",
    "Tomas",
    "Ilse",
    "Piotr",
    "Ada",
    "Rune",
    "Nora",
    "Emil",
    "Vera",
    "Anton",
    "Greta",
    "Felix",
    "Ines",
    "Jonas",
    "Clara",
    "Hugo",
    "Maren",
    "Viktor",
)
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
    unit_rng, corpus_sentences = _filler_sources("multidoc", seed, haystack, max_words=25)

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
