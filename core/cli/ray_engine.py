"""``--engine ray`` and its options, for the commands that can run on a pool of Ray actors (``sweep``, ``mlm``).

Why checked before the model loads: a Ray option without ``--engine ray``, a bad count or an address that cannot be
reached is one line and exit 2, not a minute of loading first.
"""

from __future__ import annotations

import os

from core.errors import UserError


def check_engine(args) -> bool:
    """The Ray options checked before any model loads (one line each); whether the command runs on Ray."""
    from core.experiments import cluster

    on_ray = args.engine == "ray"
    if not on_ray:
        given = [
            o
            for o, v in (
                ("--address", args.address),
                ("--actors", args.actors),
                ("--cpus-per-actor", args.cpus_per_actor),
            )
            if v is not None
        ]
        if given:
            raise UserError(
                f"{', '.join(given)}: only with --engine ray (add it, or leave "
                f"{'this option' if len(given) == 1 else 'these options'} out)"
            )
    else:
        for opt, v in (("--actors", args.actors), ("--cpus-per-actor", args.cpus_per_actor)):
            if v is not None and not 1 <= v <= 100_000:
                raise UserError(f"{opt} must be a whole number from 1 to 100,000, got {v}")
        if args.dtype not in (None, "auto"):
            raise UserError(
                "--dtype is for local runs: Ray actors use their device's precision "
                "(bfloat16 on a GPU, float32 on a CPU)"
            )
        cluster.check_address(args.address or os.environ.get("RAY_ADDRESS") or None)  # before the model loads
    return on_ray


def pool(args):
    """The pool of Ray actors ``--engine ray`` asks for (not started yet), else None."""
    from core.experiments import cluster

    if args.engine != "ray":
        return None
    return cluster.RayEngine(
        address=args.address,
        actors=args.actors,
        cpus_per_actor=args.cpus_per_actor or 1,
        device=args.device,
        tokenizer=args.tokenizer,
    )
