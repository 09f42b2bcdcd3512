"""``python -m core run``: answer one document and report its attention statistics (Pmax, entropy per layer).

The method's tau is resolved for this document (a measured method runs its own passes first, with a bar), then one
probed pass; a long one first says about how long it takes.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from core.cli.model import check_reference, document, load_model, precision
from core.cli.progress import layers_ticker, progress, refuse_over_budget
from core.cli.settings_merge import has_scheme
from core.models import memory
from core.runs import methods, rope_pass, timing


def command(args) -> int:
    from core.runs import engine

    chosen = args.settings_
    loaded = load_model(chosen.model, chosen.train_length, args.device, args.tokenizer, args.dtype)
    at_one = chosen.to_choice(1.0)  # the settings at tau = 1: for the checks, the estimate and a method's own passes
    rope_pass.check(loaded, at_one.scheme)  # a scheme this model cannot run: one line, before any document
    check_reference(loaded, [chosen.method], args.samples)
    entry = methods.get(chosen.method)
    doc = document(loaded, chosen, args.samples if entry.measured else 1)
    enc = engine.encode(loaded, doc)
    est = None
    if args.budget_.seconds is not None:  # refused before it starts when the estimate is over the budget
        est = refuse_over_budget(
            args.budget_, loaded, doc, enc, at_one, [chosen.method] if entry.measured else [], args.samples, "this run"
        )
    prog = progress("calibrating") if entry.search is not None else None
    from core.mechanics import attention

    # a search shows the layers it has run beside its bar (and still asks the budget); others only the budget
    ticker = layers_ticker(prog, args.budget_) if prog else (args.budget_.check if args.budget_.seconds else None)
    with attention.between_layers(ticker):
        # a stored schedule is used at the length it was chosen at; any other length re-resolves it
        # an explicit --gamma re-resolves the method whatever tau a settings file stored for it (the file's own
        # gamma re-resolves it at another length than chosen_at, as any stored schedule is)
        tau, info = methods.resolve(
            loaded,
            doc,
            chosen.method,
            None if args.given_params_ else chosen.tau,
            samples=args.samples,
            progress=prog,
            params=args.params_ or None,
            chosen_at=chosen.chosen_at,  # a measured method runs its passes under the scheme
            base=at_one if has_scheme(chosen) else None,
        )
    if prog:
        prog.close()
    choice = chosen.to_choice(tau)  # the run's one Choice, as the attention will read it
    if enc.n >= engine.ESTIMATE_FROM:  # long work says first about how long it takes
        if est is None:
            est = engine.estimate_pass(loaded, doc, enc, choice)
        print(
            f"a {enc.n:,}-token pass: {timing.describe(est)} here (two short passes and one attention call timed: "
            "a + b n + c n^2)",
            file=sys.stderr,
            flush=True,
        )
    res = engine.run(loaded, doc, choice, encoded=enc)
    out = res.summary()
    out["model"] = loaded.spec.name
    if entry.param is not None and entry.param.name in info:  # which gamma the tau came from (given or default)
        out[entry.param.name] = info[entry.param.name]
    out.update(precision(loaded))
    if args.json:
        print(json.dumps(out))
    else:
        mark = {True: "correct", False: "wrong", None: "-"}[res.correct]
        print(
            f"model {loaded.spec.name}  tokens {res.tokens} ({res.tokens / res.train_length:.1f}x L_tr={res.train_length})  "
            f"method {chosen.method}  {_tau_text(res.tau)}"
            + ("" if choice.scheme.is_plain else f"  scheme {choice.scheme.spell()}")
        )
        print(
            f"answer: {res.answer!r}  expected: {res.expected!r}  [{mark}]  {res.seconds['total']:.3f}s  "
            f"peak {memory.peak_bytes(loaded.device) / 2**30:.2f} GiB"
        )
        for layer in res.layers():
            print(f"  layer {layer['layer']}: Pmax {layer['pmax']:.4f}  H {layer['entropy']:.4f}")
    return 0


def _tau_text(tau: "np.ndarray") -> str:
    """The run's tau in words: one value when every layer and head has it ("tau 1 (every layer and head)"), else
    its mean per layer, said as such (a list of 30 ones printed bare read as noise, issue 59)."""
    if np.allclose(tau, tau.flat[0]):
        return f"tau {float(tau.flat[0]):.4g} (every layer and head)"
    return f"tau by layer (mean over heads) {np.round(tau.mean(1), 3).tolist()}"
