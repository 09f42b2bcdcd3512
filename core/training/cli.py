"""Train the bundled models: small T5s that learn retrieval at a short L_tr, reproducibly.

``python -m core train --out assets/models/NAME [--config FILE.json] [--steps N] ...``

``FILE.json`` holds one config or a list of them (stages: each starts from the
previous stage's weights; the default model is trained that way). Command-line
values apply to every stage.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from core.training.config import TrainConfig, load_stages


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m core train", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder, e.g. assets/models/passkey-t5")
    p.add_argument(
        "--config", help="JSON with TrainConfig fields, or a list of them: stages, each from the previous one's weights"
    )
    p.add_argument("--tokenizer", help="reuse the tokenizer of this folder")
    p.add_argument(
        "--stages-dir", default="runs", help="where a staged config keeps its intermediate stages (default: runs/)"
    )
    for f in fields(TrainConfig):
        if f.type in ("int", "float", "str", "float | None", "str | None") and f.name != "name":
            p.add_argument(
                f"--{f.name.replace('_', '-')}", type=float if "float" in f.type else (int if f.type == "int" else str)
            )
    p.add_argument("--name")
    p.add_argument("--cosine-search", help="comma list of s: pilot runs pick CosScale's s (see --pilot-steps)")
    p.add_argument("--pilot-steps", type=int, default=400)
    p.add_argument("--device", help="cpu | cuda (default: CUDA when present); training is float32 on both")
    args = p.parse_args(argv)
    from core.training.loop import search_cosine_scale, train_stages  # torch: once the options are read

    cfgs = load_stages(args.config) if args.config else [TrainConfig()]
    for cfg in cfgs:  # command-line values apply to every stage
        for f in fields(TrainConfig):
            v = getattr(args, f.name, None)
            if v is not None:
                setattr(cfg, f.name, v)
    cfg_note = {}
    if args.cosine_search:
        if len(cfgs) > 1:
            raise ValueError("--cosine-search picks s for a one-stage config; set cosine_scale in each stage instead")
        scales = [float(x) for x in args.cosine_search.split(",")]
        found = search_cosine_scale(cfgs[0], scales, args.pilot_steps, Path(args.out).parent / "pilots", args.tokenizer)
        cfgs[0].cosine_scale = min(found, key=found.get)
        cfg_note = {"cosine_search": {str(k): v for k, v in found.items()}, "pilot_steps": args.pilot_steps}
    card = train_stages(cfgs, args.out, reuse_tokenizer=args.tokenizer, device=args.device, stages_dir=args.stages_dir)
    if cfg_note:
        card.update(cfg_note)
        (Path(args.out) / "card.json").write_text(json.dumps(card, indent=2))
    print(
        json.dumps({"out": args.out, "metrics": card["metrics"], "minutes": card.get("minutes_total", card["minutes"])})
    )
    return 0
