"""What a page hands on: the settings JSON (the CLI's ``--settings``) and the commands that run the same view."""

from __future__ import annotations

import shlex
from typing import Any

from core.runs import methods
from core.runs.settings import Settings
from core.values.schedule import Schedule
from ui.page_state import PageState


def settings(ctx: PageState, method: str | None = None, tau: Any = None, criterion: str = "pmax") -> Settings:
    """The exportable JSON settings of the page's choice (the CLI's ``--settings``); the resolved schedule as a fixed
    one by default (the model as trained and adaptive temperature stay themselves). A file says what runs: a schedule
    no fixed tau can hold (adaptive temperature's) is exported as its method whatever ``method`` asks
    (:func:`core.runs.methods.exported`)."""
    c = ctx.choice
    if method is None:
        method = c.method if methods.get(c.method).constant is not None else methods.FIXED
    sched = c.tau if tau is None else tau
    method = methods.exported(method, sched)
    return Settings(
        model=ctx.model_ref,
        train_length=ctx.train_length,
        method=method,
        tau=None if methods.get(method).constant is not None else Schedule.of(sched),
        criterion=criterion,
        targets=c.targets,
        cosine_scale=c.cosine_scale,
        chosen_at=ctx.tokens,
        document=ctx.request,
        scheme=c.scheme.name,
        scheme_params=c.scheme.param_dict,
        method_params=methods.own_params(method, c.params) or {},  # the gamma the person set, for its method
    )


def cli_command(file_name: str = "choice.json") -> str:
    return f"python -m core run --settings {file_name} --json"


def mlm_command(ctx: PageState) -> str:
    """The command that scores this view's masked tokens for a rotary masked-LM model: ``python -m core mlm`` on
    this document (its length and seed: the same held-out text and masked positions) under the chosen position
    scheme and method (a fixed tau as ``tau=0.8``; a per-layer or per-head schedule is resolved again there)."""
    fixed = methods.get(ctx.choice.method).takes_value
    method = methods.spell(ctx.choice.method, ctx.tau_input) if fixed else ctx.choice.method
    parts = [
        "python -m core mlm",
        "--model",
        shlex.quote(ctx.model_ref),
        "--lengths",
        str(ctx.tokens),
        "--seed",
        str(ctx.request.seed),
        "--sequences",
        "1",
        "--schemes",
        shlex.quote(ctx.choice.scheme.spell()),
        "--methods",
        shlex.quote(method),
    ]
    if ctx.loaded.cosine and ctx.choice.cosine_scale is not None:
        parts += ["--cosine-scale", f"{float(ctx.choice.cosine_scale):g}"]
    return " ".join(parts + ["--json"])
