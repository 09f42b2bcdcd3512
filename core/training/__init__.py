"""Train the bundled models: small T5s that learn retrieval at a short L_tr, reproducibly.

``python -m core train --out assets/models/NAME [--config FILE.json] [--steps N] ...``

``FILE.json`` holds one config or a list of them (stages: each starts from the
previous stage's weights; the default model is trained that way).

The model is transformers' own ``T5ForConditionalGeneration`` (learned
relative position bias, 32 buckets, max distance 128: exactly the mechanism
the paper studies), run through our ``aligned`` attention so a cosine-attention
variant (``logits = s * cos(q, k) + bias``) trains with the same code.
Documents come from :mod:`core.data.tasks`, generated on the fly in a background
process (varied haystacks from :mod:`core.data.corpus`' training pool, random needle
depth, lengths up to L_tr). A length curriculum grows the longest document
from ``min_length`` to ``train_length``: without it the copy solution is found
much later (see shared/notes/feasibility.md).

Everything is seeded; the config, the final metrics, the time it took and the
machine are written to ``card.json`` next to the weights.

The modules:

- :mod:`core.training.config`: ``TrainConfig``, ``load_stages`` (a config file);
- :mod:`core.training.stages`: staged recipes (``check_stages``, ``source_recipe``, lineage);
- :mod:`core.training.data`: training batches (producer processes) and ``eval_documents``;
- :mod:`core.training.model`: ``build_model``, ``get_tokenizer``, ``grow_state``, ``identity_blocks``;
- :mod:`core.training.supervision`: ``CrossAttentionTap`` and ``needle_attention_loss``;
- :mod:`core.training.loop`: ``train``, ``train_stages``, ``evaluate``, the card;
- :mod:`core.training.cli`: ``main``, ``python -m core train``.

The public names of all of them are importable from here (``from core.training import train``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.lazy import lazy_exports

#: Each public name, by the module that owns it, imported on first use (PEP 562's module ``__getattr__``): the
#: trainer's modules import torch and transformers (seconds), and ``python -m core train --help`` or a bad train
#: option should not wait for them (:mod:`core.training.cli` imports the loop only once its options are read).
_OWNERS = {
    "main": "cli",
    **dict.fromkeys(("TrainConfig", "load_stages"), "config"),
    **dict.fromkeys(("EVAL_SEED", "eval_documents", "sample_document"), "data"),
    **dict.fromkeys(("evaluate", "search_cosine_scale", "train", "train_stages"), "loop"),
    **dict.fromkeys(("build_model", "get_tokenizer", "grow_state", "identity_blocks"), "model"),
    **dict.fromkeys(
        ("check_stages", "lineage_entries", "source_recipe", "stage_dir", "stage_summary", "taught_tasks"), "stages"
    ),
    **dict.fromkeys(
        ("LOOKUP_SHARE", "CrossAttentionTap", "needle_attention_loss", "needle_log_shares", "needle_token_mask"),
        "supervision",
    ),
}

if TYPE_CHECKING:  # what type checkers and readers see; at run time the same names come from __getattr__
    from core.training.cli import main
    from core.training.config import TrainConfig, load_stages
    from core.training.data import EVAL_SEED, eval_documents, sample_document
    from core.training.loop import evaluate, search_cosine_scale, train, train_stages
    from core.training.model import build_model, get_tokenizer, grow_state, identity_blocks
    from core.training.stages import (
        check_stages,
        lineage_entries,
        source_recipe,
        stage_dir,
        stage_summary,
        taught_tasks,
    )
    from core.training.supervision import (
        LOOKUP_SHARE,
        CrossAttentionTap,
        needle_attention_loss,
        needle_log_shares,
        needle_token_mask,
    )


#: The submodules, reachable as attributes once this package is imported (as when it imported them all).
_SUBMODULES = ("cli", "config", "data", "loop", "mlm", "model", "optim", "stages", "supervision")


__getattr__, __dir__ = lazy_exports(__name__, _OWNERS, _SUBMODULES)


__all__ = [  # written out (not built from _OWNERS) so that readers and linters see the names
    "EVAL_SEED",
    "LOOKUP_SHARE",
    "CrossAttentionTap",
    "TrainConfig",
    "build_model",
    "check_stages",
    "eval_documents",
    "evaluate",
    "get_tokenizer",
    "grow_state",
    "identity_blocks",
    "lineage_entries",
    "load_stages",
    "main",
    "needle_attention_loss",
    "needle_log_shares",
    "needle_token_mask",
    "sample_document",
    "search_cosine_scale",
    "source_recipe",
    "stage_dir",
    "stage_summary",
    "taught_tasks",
    "train",
    "train_stages",
]
