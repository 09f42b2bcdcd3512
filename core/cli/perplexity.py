"""``python -m core perplexity``: language-modelling perplexity over lengths x methods (the paper's Table 3), one
CSV row per length x method x copy kind (``--copy``).
"""

from __future__ import annotations

import json
import sys

from core.cli.model import check_fits, check_reference, lengths, load_model
from core.runs import methods


def command(args) -> int:
    from tqdm import tqdm

    from core.experiments.perplexity import PerplexityPlan, run_perplexity, summary

    loaded = load_model(args.model, args.train_length, args.device, args.tokenizer, args.dtype)
    names = args.methods.split(",") if args.methods else list(methods.PERPLEXITY_DEFAULT)
    token_counts = lengths(args.lengths, loaded.train_length)
    check_fits(loaded, max(token_counts), "--lengths asks for sequences of", batch=args.batch_size)
    check_reference(loaded, names, args.samples)
    plan = PerplexityPlan(
        model=loaded.spec.name,
        lengths=token_counts,
        methods=names,
        sequences=args.sequences,
        seed=args.seed,
        calib_seed=args.calib_seed,
        calib_samples=args.samples,
        continuation=args.continuation,
        batch_size=args.batch_size,
        targets=args.targets or ("encoder",),
        params=args.params_,
        **({"copies": args.copy} if args.copy else {}),
    )
    bars: list = []

    def progress(done: int, total: int, row) -> None:
        if not bars:
            bars.append(tqdm(total=total, desc="perplexity (sequences)", file=sys.stderr))
        bars[0].n = done
        bars[0].refresh()

    try:
        df = run_perplexity(loaded, plan, out=args.out, resume=args.resume, progress=progress)
    finally:
        for bar in bars:
            bar.close()
    if args.json:
        print(json.dumps(summary(loaded, df), indent=2))
    elif not args.out:
        from core.experiments import csvio

        print(csvio.to_csv_text(df), end="")
    else:
        from core.experiments.perplexity import perplexity_table

        print(perplexity_table(df).to_string() if len(df) else "nothing new to run")
    return 0
