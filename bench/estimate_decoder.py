"""How close the estimate before a decoder's long pass comes (core.runs.engine.estimate_pass, issue 56 item 5).

    python bench/estimate_decoder.py --lengths 4096,8192        # SmolLM2-135M from the user's cache

For each length: a pass key document on SmolLM2-135M, the estimate the CLI prints before the pass
(``estimate_pass``: ``a + b n + c n^2`` from one timed attention call and two short prefills), then the same
pass timed (probed, no answer: what the estimate is of), and the square law the estimate replaced (a 2,048-token
sample's time scaled by the square of the length, the sample timed here too). One line per length, with the
load average before and after (other processes' work counts in every wall time here).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="4096,8192")
    ap.add_argument("--model", default="smollm2-135m")
    args = ap.parse_args(argv)

    from core import models
    from core.data import tasks
    from core.errors import UserError
    from core.runs import engine

    try:
        loaded = models.load(args.model, device="cpu")
    except UserError as err:
        print(f"bench/estimate_decoder.py: {args.model} is not available here ({err}); fetch it first")
        return 2
    how = engine.Pass(generate=False)

    def load() -> str:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())

    for n in (int(x) for x in args.lengths.split(",")):
        doc = tasks.make("passkey", loaded.tokenizer, n, seed=0)
        enc = engine.encode(loaded, doc)
        before = load()
        t = time.perf_counter()
        est = engine.estimate_pass(loaded, doc, enc)
        cost = time.perf_counter() - t
        m = min(engine.SAMPLE_TOKENS, enc.n)
        head = replace(
            enc, input_ids=enc.input_ids[:m], offsets=enc.offsets[:m], needle_tokens=None, question_tokens=None
        )
        sample = engine.run(loaded, doc, how=how, encoded=head).seconds["encode"]
        square = sample * (enc.n / m) ** 2
        measured = engine.run(loaded, doc, how=how, encoded=enc).seconds["encode"]
        print(
            f"{enc.n:>6} tokens: estimate {est:7.1f} s (took {cost:.1f} s to make), measured {measured:7.1f} s, "
            f"estimate/measured {est / measured:.2f}; the square law from {m:,} tokens said {square:7.1f} s "
            f"({square / measured:.2f}); load {before} -> {load()}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
