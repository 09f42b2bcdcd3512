"""Which wrong line does the model pick? Misses by place and by what the labels share.

    python research/line_misses.py [--model PATH_OR_NAME] [--samples 200] [--tokens N]

On the training evaluation's documents (``core.training.eval_documents``: fresh
seeds from 1,000,000, the model's L_tr unless ``--tokens``), it answers every
document at tau = 1 and prints (1) accuracy by the asked line's place in the
record and (2) for each miss whose answer is another line's number, what that
line's label shares with the asked one: the noun, the adjective, only a BPE
piece (``-ma p`` / ``-p ath``), or nothing, next to how often a random pair of
labels shares each, and (3) how many misses name a label the generator
lengthened to three words (``high-pie-cloud``) against how many such lines
there are. A lookup that matched whole labels would spread its misses like
the random pairs; docs/line-retrieval.md's "The noun decides" uses this.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

from core.runs import engine
from core.data import tasks
from core.models import default_model, load
from core.mechanics.probes import ProbeSpec
from core.training import TrainConfig, eval_documents
from core.values.choice import TRAINED

LINE = re.compile(r"^line (\S+): REGISTER_CONTENT is (\d+)$", re.M)
KINDS = ("noun", "adjective", "a noun piece", "nothing")


def lengthened(label: str) -> bool:
    """A label the generator lengthened with a third word to fit the length (``high-pie-cloud``)."""
    return label.count("-") >= 2


def relation(asked: str, other: str, pieces) -> str:
    """What label ``other`` shares with ``asked``: "noun", "adjective", "a noun piece" or "nothing"."""
    (a1, n1), (a2, n2) = asked.split("-")[:2], other.split("-")[:2]
    if n1 == n2:
        return "noun"
    if a1 == a2:
        return "adjective"
    return "a noun piece" if pieces("-" + n1) & pieces("-" + n2) else "nothing"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="bundled name or a model folder (default: the default model)")
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--tokens", type=int, default=None, help="document length (default: the model's L_tr)")
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args(argv)
    loaded = load(args.model or default_model())
    tokens = args.tokens or loaded.spec.train_length
    if not tokens:
        print("error: the model has no L_tr; give --tokens", file=sys.stderr)
        return 2

    def pieces(word: str) -> set[str]:
        return {t for t in loaded.tokenizer.tokenize(word) if t != "-"}

    docs = eval_documents(loaded.tokenizer, TrainConfig(tasks={"line": 1.0}), "line", args.samples, tokens)
    res = engine.run_batch(loaded, docs, TRAINED, engine.Pass(probes=ProbeSpec.off()), batch_size=args.batch)
    by_place: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
    misses: collections.Counter[str] = collections.Counter()
    pairs: collections.Counter[str] = collections.Counter()
    # labels the generator lengthened with a third word to fit the length: among
    # the picked lines of the misses, and among all other lines
    longer: collections.Counter[str] = collections.Counter()
    for doc, r in zip(docs, res):
        lines = LINE.findall(doc.text)
        labels = [lab for lab, _ in lines]
        asked = doc.meta["line_index"]
        place = labels.index(asked)
        by_place[place][0] += bool(r.correct)
        by_place[place][1] += 1
        others = [other for other in labels if other != asked]
        pairs.update(relation(asked, other, pieces) for other in others)
        longer["others"] += sum(map(lengthened, others))
        if not r.correct:
            named = [lab for lab, value in lines if value == r.answer.strip()]
            misses[relation(asked, named[0], pieces) if named else "no line's number"] += 1
            longer["picked"] += bool(named) and lengthened(named[0])
    right = sum(bool(r.correct) for r in res)
    print(f"model {loaded.spec.name}: line retrieval at tau = 1, {len(docs)} documents of {tokens} tokens: "
          f"{right} right ({100 * right / len(docs):.1f} %)")
    print("\n| asked line's place | " + " | ".join(str(k + 1) for k in sorted(by_place)) + " |")
    print("|---|" + "---|" * len(by_place))
    print("| right | " + " | ".join(f"{a} / {n}" for a, n in (by_place[k] for k in sorted(by_place))) + " |")
    naming = sum(misses[k] for k in KINDS)
    total_pairs = sum(pairs.values())
    print(f"\n| the picked line shares with the asked label | misses ({naming} name a line) | random (asked, other) pairs in these documents |")
    print("|---|---|---|")
    for k in KINDS:
        print(f"| {k} | {misses[k]} | {100 * pairs[k] / max(1, total_pairs):.1f} % |")
    print(f"\nmisses naming a lengthened (three-word) label: {longer['picked']} of {naming}; "
          f"such labels among the other lines: {longer['others']} of {total_pairs}")
    garbled = misses["no line's number"]
    if garbled:
        print(f"\n{garbled} answers are no line's number")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
