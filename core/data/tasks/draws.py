"""Seeded draws that several tasks share: the 5-digit key (``_key``, passkey,
line and code; an option may fix it) and endless unique integers
(``_unique_ints``, line indices and code function names).

Why its own module: the key is drawn first from the task's rng, so one seed
keeps the same answer across lengths and depths; every task that hides a key
must draw it the same way.
"""

from __future__ import annotations

import itertools
import operator
import random
from collections.abc import Iterator


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
