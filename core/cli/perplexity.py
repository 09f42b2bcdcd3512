"""``python -m core perplexity``: language-modelling perplexity over lengths x position schemes x methods (the paper's
Table 3), one CSV row per length x scheme x method x copy kind (``--copy``): perplexity, mean per-token NLL with its
bootstrap SE over sequences, and on a decoder-only LM the NLL by position bucket (:mod:`core.experiments.perplexity`).
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
    # a decoder-only LM scores one sequence per pass whatever --batch-size says (core.experiments.perplexity.score)
    batch = 1 if loaded.decoder_only else args.batch_size
    check_fits(loaded, max(token_counts), "--lengths asks for sequences of", batch=batch)
    check_reference(loaded, names, args.samples)
    schemes = _schemes(args)
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
        **({"schemes": tuple(schemes)} if schemes else {}),
    )
    bars: list = []
    calib: list = []  # the calibration bar drawn now, closed when the sequences move again

    def progress(done: int, total: int, row) -> None:
        while calib:
            calib.pop().close()
        if not bars:
            bars.append(tqdm(total=total, desc="perplexity (sequences)", file=sys.stderr))
        bars[0].n = done
        bars[0].refresh()

    def calibrating(tokens: int, method: str, scheme):
        """A measured method's calibration: one sentence of its passes and their time, then a bar of its search."""
        from core.runs import timing

        def step(fraction: float) -> None:
            if not calib:
                what = f"calibrating {method}{'' if scheme.is_plain else ' under ' + scheme.name} at {tokens:,} tokens"
                here, at_train = methods.costs([method], loaded.n_layers, loaded.n_heads, plan.calib_samples)[0]
                note = timing.plan_note(
                    what, timing.model_key(loaded), [(here, tokens), (at_train, loaded.train_length)]
                )
                tqdm.write(note, file=sys.stderr)
                calib.append(tqdm(total=100, desc="calibrating", unit="%", file=sys.stderr))
            calib[0].n = round(100 * min(1.0, fraction))
            calib[0].refresh()

        return step

    try:
        df = run_perplexity(loaded, plan, out=args.out, resume=args.resume, progress=progress, calibrating=calibrating)
    finally:
        for bar in calib + bars:
            bar.close()
    if args.json:
        print(json.dumps(summary(loaded, df), indent=2))
    elif not args.out:
        from core.experiments import csvio

        print(csvio.to_csv_text(df), end="")
    else:
        from core.experiments.perplexity import nll_table, perplexity_table

        if not len(df):
            print("nothing new to run")
        else:
            print(perplexity_table(df).to_string())
            print("\nmean per-token NLL ± bootstrap SE over sequences")
            print(nll_table(df).to_string())
    return 0


def _schemes(args) -> list:
    """``--schemes`` with ``--scheme-params``, spelt as ``mlm``'s (:func:`core.cli.mlm.with_params`); none when the
    parser gives this command no such option (the plain scheme)."""
    given = getattr(args, "schemes", None)
    if not given:
        return []
    from core.cli.mlm import with_params

    return with_params(given, getattr(args, "scheme_params", None))
