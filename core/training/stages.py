"""Staged recipes: checking that a recipe's stages chain before any of them trains, where
intermediate stages are saved, and the lineage (the recipe and a summary of each stage) that
every folder ``train`` writes keeps, so it can be continued and retrained."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from core.training.config import TrainConfig

_FIXED_SIZES = ("d_kv",)  # a stage cannot change this (heads would be cut anew)
_GROWABLE = (
    "num_heads",
    "encoder_layers",
    "decoder_layers",
    "d_model",
    "d_ff",
)  # a stage may raise these (grow_state, fresh blocks)


def check_stages(cfgs: list[TrainConfig]) -> None:
    """Refuse a recipe whose stages cannot chain, before any of it trains.

    Why: a staged recipe runs for hours; a stage that changes ``d_kv`` or shrinks
    the head count would otherwise fail (or, for ``d_kv``, silently regroup
    heads) only when its turn comes; so would a misspelt ``new_blocks``. The
    first stage is checked against its ``init_from`` folder's ``config.json``
    the same way."""

    def sizes(c: TrainConfig) -> dict:
        return {k: getattr(c, k) for k in _FIXED_SIZES + _GROWABLE}

    prev: dict | None = None
    if cfgs and cfgs[0].init_from:
        src = Path(cfgs[0].init_from)
        if not (src / "model.safetensors").exists() or not (src / "config.json").exists():
            raise ValueError(f"init_from {src}: no model.safetensors and config.json there")
        c = json.loads((src / "config.json").read_text())  # T5Config's names for our fields
        prev = {k: c.get(k) for k in ("d_model", "d_kv", "d_ff", "num_heads")}
        prev |= {
            "encoder_layers": c.get("num_layers"),
            "decoder_layers": c.get("num_decoder_layers", c.get("num_layers")),
        }
    for k, cfg in enumerate(cfgs):
        cur, where = sizes(cfg), f"stage {k + 1}" if len(cfgs) > 1 else "this config"
        if cfg.new_blocks not in ("fresh", "identity"):
            raise ValueError(f"{where}: new_blocks must be 'fresh' or 'identity', got {cfg.new_blocks!r}")
        if prev is not None:
            for key in _FIXED_SIZES:
                if prev.get(key) != cur[key]:
                    raise ValueError(
                        f"{where} has other sizes than the weights it starts from: {key} {cur[key]}, not {prev.get(key)}"
                    )
            for key in _GROWABLE:
                if prev.get(key) is not None and cur[key] < prev[key]:
                    raise ValueError(
                        f"{where}: {key} {cur[key]} is below the weights it starts from ({prev[key]}); stages may only grow"
                    )
        prev = cur


def taught_tasks(cfgs: list[TrainConfig]) -> list[str]:
    """Every task some stage taught (``first_tasks`` too), in first-taught order.

    Why: a card's task list drives what the results bench and the regression
    tests ask of the model, and a model knows every task it was taught, not
    only the last stage's mix."""
    return list(dict.fromkeys(t for c in cfgs for t in [*(c.first_tasks or {}), *c.tasks]))


def stage_dir(out: str | Path, k: int, stages_dir: str | Path = "runs") -> Path:
    """Where stage ``k`` (all but the last) of a staged run is saved: under ``stages_dir``
    (git-ignored ``runs/`` by default), never beside ``out``: a folder with a card
    in ``assets/models/`` would be registered as a bundled model."""
    return Path(stages_dir) / f"{Path(out).name}.stage{k}"


def source_recipe(init_from: str | None) -> tuple[list[dict], list[dict]]:
    """The recipe (config dicts) and stage summaries that made the weights in ``init_from``.

    Why: a model continued from another (say the bundled default) is only
    reproducible with the source's own recipe in front of the new stages, and
    only honest about its cost with the source's minutes counted; a folder that
    ``train`` wrote keeps both (``train_config.json``, ``card.json``), so the
    continued model inherits them. A folder without a card gives nothing (nor
    does a staged card without its ``train_config.json``: the card keeps only
    the last stage's config): the recipe then starts at its ``init_from``."""
    src = Path(init_from) if init_from else None
    if src is None or not (src / "card.json").is_file():
        return [], []
    card = json.loads((src / "card.json").read_text())
    if (src / "train_config.json").is_file():
        recipe = json.loads((src / "train_config.json").read_text())
        return (recipe if isinstance(recipe, list) else [recipe]), card.get("stages") or [stage_summary(card)]
    if card.get("stages"):
        return [], []
    return [card["config"]], [stage_summary(card)]


def lineage_entries(
    cfg: TrainConfig, card: dict, lineage: tuple[list[dict], list[dict]]
) -> tuple[list[dict], list[dict]]:
    """The recipe and stage summaries of a run with ``cfg``, after the ``lineage`` it continues.

    Why a function of its own: ``_save`` writes them at every save, not only
    when a run ends, so any folder ``train`` leaves behind (a stage of a
    staged run, a halfway save) can be continued without losing the stages
    that made it. Stages after the first drop ``init_from``: each starts from
    the one before it (``load_stages``)."""
    earlier_recipe, earlier_stages = lineage
    mine = asdict(cfg)
    summary = stage_summary(card)
    if earlier_recipe:
        mine.pop("init_from", None)
    if earlier_stages:
        summary["init_from"] = "previous stage"
    return earlier_recipe + [mine], earlier_stages + [summary]


def stage_summary(card: dict) -> dict:
    """What a staged card keeps of one stage's own card."""
    c = card["config"]
    return {
        "steps": card["steps_done"],
        "minutes": card["minutes"],
        "machine": card["machine"],
        "layers": f"{c['encoder_layers']}+{c['decoder_layers']}",
        "heads": c.get("num_heads"),
        "tasks": c["tasks"],
        "lr": c["lr"],
        "init_from": c.get("init_from"),
        "metrics": card["metrics"],
    }
