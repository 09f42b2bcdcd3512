"""``python -m core mlm``: masked-token accuracy and perplexity over lengths x position schemes x methods (rotary
masked-LM models; the InfoScale paper's Table 1). ``--engine ray`` spreads the cells over Ray actors.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import TYPE_CHECKING

from core.cli.model import check_fits, check_reference, lengths, load_model
from core.cli.ray_engine import check_engine, pool
from core.errors import UserError
from core.runs import methods

if TYPE_CHECKING:
    from core.values.positions import Scheme

#: ``mlm``'s default lengths: the paper's 1x .. 64x L_tr.
MLM_LENGTHS = (1, 2, 4, 8, 16, 32, 64)


def with_params(schemes: list["Scheme"], given: list[tuple[str, str]] | None) -> list["Scheme"]:
    """``--schemes`` with ``--scheme-params`` given to every listed scheme that takes each (a scheme's own
    ``name:key=value`` wins); a parameter given twice, or that no listed scheme takes, is refused, naming who takes
    what."""
    from core.values import positions
    from core.values.positions import Scheme

    if not given:
        return schemes
    keys = [k for k, _ in given]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise UserError(f"--scheme-params: {', '.join(twice)} given twice; give each parameter once")
    out = []
    used = set()
    for scheme in schemes:
        takes = scheme.entry.params
        extra = {k: v for k, v in given if k in takes and k not in scheme.param_dict}
        used |= {k for k, _ in given if k in takes}
        text = positions.SPEC_SEP.join([scheme.spell(), *(f"{k}={v}" for k, v in extra.items())])
        try:
            out.append(Scheme.of(text) if extra else scheme)  # the options' values are text: read as a scheme's text
        except UserError as err:
            raise UserError(f"--scheme-params: {err}") from None
    unused = [k for k, _ in given if k not in used]
    if unused:
        takes = "; ".join(f"{s.name} takes {', '.join(s.entry.params) or 'nothing'}" for s in schemes)
        raise UserError(f"--scheme-params: no listed scheme takes {', '.join(unused)} ({takes})")
    return out


def command(args) -> int:
    from tqdm import tqdm

    from core.experiments import mlm

    if args.resume and not args.out:
        raise UserError("--resume needs --out (the CSV to resume)")
    on_ray = check_engine(args)
    # under Ray this process only tokenises, checks and writes: its copy of the model stays on the CPU
    loaded = load_model(
        args.model, args.train_length, "cpu" if on_ray else args.device, args.tokenizer, None if on_ray else args.dtype
    )
    names = args.methods.split(",") if args.methods else list(methods.SWEEP_DEFAULT)
    token_counts = lengths(args.lengths or [(k, True) for k in MLM_LENGTHS], loaded.train_length)
    schemes = with_params(args.schemes or [mlm.PLAIN_SCHEME], args.scheme_params)
    plan = mlm.MlmPlan(
        lengths=token_counts,
        methods=names,
        sequences=args.sequences,
        seed=args.seed,
        calib_seed=args.calib_seed,
        calib_samples=args.samples,
        batch_size=args.batch_size,
        cosine_scale=args.cosine_scale,
        schemes=tuple(schemes),
        params=args.params_,
    ).validated()
    mlm.check_model(loaded, plan)
    check_fits(loaded, max(token_counts), "--lengths asks for sequences of", batch=min(args.batch_size, args.sequences))
    check_reference(loaded, names, args.samples)
    actors = pool(args)
    bars: list = []

    def progress(done: int, total: int) -> None:
        if not bars:
            bars.append(tqdm(total=total, desc="mlm (sequences)", file=sys.stderr))
        bars[0].n = done
        bars[0].refresh()

    failed: list[str] = []

    def report(msg: str) -> None:
        failed.append(msg)
        tqdm.write(msg, file=sys.stderr)

    try:
        with actors or contextlib.nullcontext():
            rows = mlm.run_mlm_sweep(
                loaded, plan, out=args.out, resume=args.resume, progress=progress, pool=actors, report=report
            )
    finally:  # Ctrl-C and an overrun are worded by main(), after the bars are closed
        for bar in bars:
            bar.close()
    if failed:
        print(f"{len(failed)} mlm job(s) failed (listed above); --resume runs their rows again", file=sys.stderr)
    rows = [{k: r[k] for k in mlm.ROW_KEYS} for r in rows]
    if args.json:
        print(json.dumps(mlm.summary(loaded, plan, rows)))
    else:
        for r in rows:
            scheme = r["scheme"] + (f" ({r['scheme_params']})" if r["scheme_params"] else "")
            print(
                f"{r['tokens']:>7,} tokens  {scheme:>14}  {r['method']:>16}  tau {r['tau']:.4f}  accuracy {r['accuracy']:.4f}  "
                f"perplexity {r['perplexity']:.3f}  ({r['masked']} masked)"
            )
    return 0
