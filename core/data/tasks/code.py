"""The ``code`` task: a Python file of small generated functions hiding
``def get_key(): return N``, and a comment asking for the key.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from core.data.tasks.draws import _key, _unique_ints
from core.data.tasks.layout import _Layout, _Stream

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
