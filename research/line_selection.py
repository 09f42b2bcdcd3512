"""Where line retrieval fails: picking the line, or copying its number?

    python research/line_selection.py [--model PATH_OR_NAME] [--lengths 170 190 220 256] [--samples 40] [--labels classic]

For LongChat line-retrieval documents of each length, it sorts the model's
answers (tau = 1) into: the asked line's number (right), another line's
number (wrong line, and at which offset from the asked one), or a number that
is in no line (garbled). Chance is 1 / lines. A model that copies whole
numbers but picks lines near chance has the copy skill and lacks the
associative lookup (match the question's label to a line's label); the
write-up in docs/line-retrieval.md uses this. Test seeds 5000.. (not
the results tables' 0..99, not training's).
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
from core.values.choice import TRAINED

VALUE = re.compile(r"REGISTER_CONTENT is (\d+)")


def record_values(text: str) -> list[str]:
    """The register values of the record, in order (the question after it repeats none)."""
    return VALUE.findall(text)


def classify(values: list[str], expected: str, answer: str) -> int | str:
    """``0`` for the asked line, ``+-k`` for the line k lines after/before it, ``"garbled"`` otherwise."""
    got = answer.strip()
    if got not in values:
        return "garbled"
    return values.index(got) - values.index(expected)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="bundled name or a model folder (default: the default model)")
    p.add_argument("--lengths", type=int, nargs="+", default=[170, 190, 220, 256])
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--labels", default="compact", choices=sorted(tasks.LINE_LABELS),
                   help="line index word list (classic: the ~8-token labels of the first attempts)")
    args = p.parse_args(argv)
    loaded = load(args.model or default_model())
    print(f"model {loaded.spec.name}: line retrieval at tau = 1, {args.samples} documents per length, {args.labels} labels")
    print("| tokens | lines | right | wrong line | garbled | chance | wrong-line offsets |")
    print("|---|---|---|---|---|---|---|")
    for n in args.lengths:
        docs = [tasks.make("line", loaded.tokenizer, n, depth=(s * 0.618) % 1.0, seed=5000 + s, labels=args.labels) for s in range(args.samples)]
        res = engine.run_batch(loaded, docs, TRAINED, engine.Pass(probes=ProbeSpec.off()), batch_size=args.batch)
        values = [record_values(d.text) for d in docs]
        kinds = collections.Counter(classify(v, r.expected, r.answer) for v, r in zip(values, res))
        lines = sum(map(len, values)) / len(docs)
        wrong = sum(v for k, v in kinds.items() if k not in (0, "garbled"))
        offsets = ", ".join(f"{k:+d}: {v}" for k, v in sorted((k, v) for k, v in kinds.items() if k not in (0, "garbled")))
        print(f"| {n} | {lines:.1f} | {kinds[0]} | {wrong} | {kinds['garbled']} | {args.samples / lines:.0f} | {offsets} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
