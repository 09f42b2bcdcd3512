"""``python -m core sweep``: accuracy over lengths x depths x seeds x methods, one CSV row per cell (``--out``
written row by row, ``--resume`` runs the rest); ``--data FILE.jsonl`` runs your own documents instead
(:func:`core.experiments.batch.run_jsonl`). ``--engine ray`` spreads the passes over Ray actors.
"""

from __future__ import annotations

import contextlib
import sys

from core.cli.model import check_fits, check_reference, lengths, load_model
from core.cli.ray_engine import check_engine, pool
from core.cli.settings_merge import no_scheme
from core.errors import UserError
from core.runs import methods


def command(args) -> int:
    from core.experiments import cluster

    chosen = args.settings_
    no_scheme(chosen, "sweep")
    on_ray = check_engine(args)
    # under Ray this process only tokenises, checks and writes: its copy of the model stays on the CPU
    loaded = load_model(
        chosen.model,
        chosen.train_length,
        "cpu" if on_ray else args.device,
        args.tokenizer,
        None if on_ray else args.dtype,
    )
    actors = pool(args)
    if args.data:
        from core.experiments.batch import run_jsonl

        check_reference(loaded, args.methods.split(",") if args.methods else [chosen.method])
        with actors or contextlib.nullcontext():
            return run_jsonl(loaded, args, chosen, pool=actors)
    from tqdm import tqdm

    from core.data import tasks
    from core.experiments.sweep import SweepPlan, run_sweep

    names = args.methods.split(",") if args.methods else list(methods.SWEEP_DEFAULT)
    token_counts = lengths(args.lengths, loaded.train_length)
    check_fits(loaded, max(token_counts), "--lengths asks for documents of")
    check_reference(loaded, names, 1)
    task = chosen.document.task if chosen.document.task != "text" else "passkey"
    from core.cli.perplexity import _schemes

    schemes = _schemes(args)
    try:
        plan = SweepPlan(
            model=loaded.spec.name,
            task=task,
            lengths=token_counts,
            depths=list(args.depths),
            seeds=[(chosen.document.seed or 0) + i for i in range(args.samples)],
            methods=names,
            haystack=chosen.document.haystack,
            calib_samples=args.calib_samples,
            params=args.params_,
            **({"schemes": tuple(schemes)} if schemes else {}),
        )
    except ValueError as err:
        raise UserError(f"Bad sweep option: {err}") from None
    bar = cluster.Bar("sweep")  # drawn when the sweep starts: a refused sweep prints its one line and no bar
    failed: list[str] = []

    def report(msg: str) -> None:
        failed.append(msg)
        tqdm.write(msg, file=sys.stderr)

    try:
        with actors or contextlib.nullcontext():
            if actors is None or actors.on_cpu:  # one timed pass, so the sentence before the sweep can say how long
                cluster.time_a_pass(
                    loaded,
                    lambda: tasks.make(
                        task, loaded.tokenizer, min(token_counts), depth=0.5, seed=plan.seeds[0] if plan.seeds else 0
                    ),
                )
            df = run_sweep(loaded, plan, out=args.out, resume=args.resume, pool=actors, tracker=bar, report=report)
    finally:  # Ctrl-C and an overrun are worded by main(), after the bar is closed
        bar.close()
    if failed:
        print(f"{len(failed)} sweep job(s) failed (listed above); --resume runs their rows again", file=sys.stderr)
    if not args.out:
        from core.experiments import csvio

        print(csvio.to_csv_text(df), end="")
    else:
        from core.experiments.sweep import accuracy_se_table

        print(accuracy_se_table(df).to_string() if len(df) else "nothing new to run")
    return 0
