"""The ``topic`` task: LongChat topic retrieval, a record of USER/ASSISTANT
conversations, each opened by "I would like to discuss the topic of <TOPIC>",
and a question for the first topic; with its texts (``TOPIC_INTRO``,
``TOPIC_QUESTION``) and topic list (``TOPICS``).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

from core.data.tasks.filler import _append_words, _filler_sources
from core.data.tasks.layout import _Layout, _Stream

_TOPIC_EXTRA = (
    "By the way, there is a lot more to say about this, so feel free to ask follow up questions "
    "whenever you like and we can go into as much detail as you want."
)

TOPIC_INTRO = (
    "Below is a record of our previous conversation on many different topics. You are the ASSISTANT, "
    "and I am the USER. At the beginning of each topic, the USER will say 'I would like to discuss the "
    "topic of <TOPIC>'. Memorize each <TOPIC>. At the end of the record, I will ask you to retrieve the "
    "first topic. Now the record start."
)
TOPIC_QUESTION = "What is the first topic we discussed? Only give me the topic name."
TOPICS: tuple[str, ...] = (
    "chess openings",
    "bird migration",
    "sourdough baking",
    "volcanoes",
    "jazz history",
    "urban gardening",
    "ancient Rome",
    "deep sea fish",
    "solar power",
    "origami",
    "marathon training",
    "coral reefs",
    "board games",
    "black holes",
    "knitting",
    "beekeeping",
    "medieval castles",
    "rock climbing",
    "tea ceremonies",
    "glaciers",
    "film noir",
    "electric cars",
    "photography",
    "opera",
    "desert plants",
    "space probes",
    "wine making",
    "street food",
    "the Silk Road",
    "sailing",
    "mushrooms",
    "wolves",
    "typography",
    "minimalism",
    "the printing press",
    "earthquakes",
    "violin making",
    "chocolate",
    "poetry",
    "skateboarding",
    "lighthouses",
    "carnivorous plants",
    "ballet",
    "comets",
    "pottery",
    "rainforests",
    "cryptography",
    "hot air balloons",
    "penguins",
    "sushi",
    "architecture",
    "time zones",
    "the Olympic Games",
    "windmills",
    "calligraphy",
    "dinosaurs",
    "coffee roasting",
    "bonsai trees",
    "submarines",
    "jellyfish",
    "folk music",
    "tornadoes",
    "mountain biking",
    "ice hockey",
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


def _topic(tokenizer: Any, rng: random.Random, haystack: str, seed: int, options: dict) -> tuple[_Layout, dict]:
    order = list(TOPICS)
    rng.shuffle(order)
    first, others = order[0], order[1:]
    unit_rng, corpus_sentences = _filler_sources("topic", seed, haystack, max_words=30)
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
