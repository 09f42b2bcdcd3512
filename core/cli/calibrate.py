"""``python -m core calibrate``: Algorithm 1 (the grid over tau, or a bisection with ``--fast``) plus every
method's tau, for one document.

Two phases, each with a bar that stays and the layers run so far beside it: a per-head search at a long length is
minutes of passes between two steps of its bar (issue 47 point 4 saw 180 s without a word).
"""

from __future__ import annotations

import json

import numpy as np

from core.cli.model import check_reference, document, load_model, precision
from core.cli.progress import layers_ticker, progress, refuse_over_budget
from core.cli.settings_merge import no_scheme
from core.runs import methods


def command(args) -> int:
    from core.runs import calibration

    chosen = args.settings_
    no_scheme(chosen, "calibrate")
    loaded = load_model(chosen.model, chosen.train_length, args.device, args.tokenizer, args.dtype)
    check_reference(loaded, methods.MEASURED, args.samples)
    doc = document(loaded, chosen, args.samples)
    if args.budget_.seconds is not None:  # Algorithm 1 and every measured method, estimated before they start
        from core.runs import engine

        refuse_over_budget(
            args.budget_,
            loaded,
            doc,
            engine.encode(loaded, doc),
            chosen.to_choice(1.0),
            list(methods.MEASURED),
            args.samples,
            "this calibration",
        )
    from core.mechanics import attention

    prog = progress(f"Algorithm 1 ({args.criterion})", leave=True)
    with attention.between_layers(layers_ticker(prog, args.budget_)):
        cal = calibration.calibrate(loaded, doc, args.criterion, fast=args.fast, samples=args.samples, progress=prog)
    prog.close()
    prog = progress("every method's tau", leave=True)
    with attention.between_layers(layers_ticker(prog, args.budget_)):
        found = methods.all_methods(loaded, doc, samples=args.samples, progress=prog, params=args.params_)
    prog.close()
    taus = {m: t if isinstance(t, str) else t.to_json() for m, t in found.items()}
    taus[args.criterion] = cal.tau
    out = {
        **cal.to_dict(),
        "methods": taus,
        "tokens": len(loaded.tokenizer(doc.text).input_ids),
        "train_length": loaded.train_length,
        "model": loaded.spec.name,
        **precision(loaded),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"Algorithm 1 ({cal.criterion}) at {out['tokens']} tokens: tau = {cal.tau}  (reference S_tr(1) = {cal.reference:.4f}, {cal.passes} passes)"
        )
        for t, v in zip(cal.grid, cal.curve):
            print(f"  tau {t:.2f}: {'-' if v is None else f'{v:.4f}'}")
        for m, t in taus.items():
            print(f"  {m:>10}: {t if isinstance(t, (str, dict)) else np.round(t, 4).tolist()}")
    return 0
