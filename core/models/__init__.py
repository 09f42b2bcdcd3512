"""The models we run: which ones we know, and ``load(name | hub id | folder) -> Loaded``, a T5-family or rotary
(ModernBERT) model with our attention, read from safetensors only (no pickle is ever opened) and cached per
process. One module per concern, each importing only those listed before it: :mod:`~core.models.names` (what a
typed name is and how messages repeat it), :mod:`~core.models.device` (CUDA + bfloat16 when present, else CPU +
float32), :mod:`~core.models.hub_cache` (the local Hugging Face cache, no network),
:mod:`~core.models.safety` (the checks before a folder's files are trusted), :mod:`~core.models.catalog` (the
registry, the default model, name -> ModelSpec), :mod:`~core.models.hub` (the bounded hub download),
:mod:`~core.models.loaded` (the ``Loaded`` bundle) and :mod:`~core.models.loading` (``load`` and its cache).
The names below are re-exported so that ``from core.models import load`` keeps working; constants here are for
reading: a test that changes one (``HUB_WAIT_S``, ``MAX_MODELS``) patches the module that owns it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.errors import ModelLoadError
from core.lazy import lazy_exports

#: Each name re-exported here, by the module that owns it. They are imported on first use (PEP 562's module
#: ``__getattr__``), not with this package: ``core.models.device``'s name checks are what the CLI's ``--device`` and
#: ``--dtype`` read while it parses, and importing the catalog or the loader here would import torch and
#: transformers first (seconds; ``python -m core --help`` imports neither, tests/cli/test_cli_startup.py).
_OWNERS = {
    **dict.fromkeys(
        (
            "ASSETS",
            "ROPE_FAMILY",
            "T5_FAMILY",
            "Card",
            "ModelSpec",
            "bundled_specs",
            "default_model",
            "read_card",
            "registry",
            "resolve",
        ),
        "catalog",
    ),
    **dict.fromkeys(("DTYPE_NAMES", "check_device", "check_dtype", "dtype_name", "pick_device"), "device"),
    **dict.fromkeys(("HUB_WAIT_S", "fetch", "hub_reachable", "local_copy", "locate"), "hub"),
    **dict.fromkeys(("cached_snapshot", "hub_cache_dir", "hub_offline"), "hub_cache"),
    "Loaded": "loaded",
    **dict.fromkeys(("MAX_MODELS", "load"), "loading"),
    **dict.fromkeys(("APP_MODEL_BOX", "is_hub_id"), "names"),
    **dict.fromkeys(
        ("NOT_SAFETENSORS", "TOKENIZER_FILES", "WEIGHT_FILES", "check_config_matches", "check_weight_files"), "safety"
    ),
}

if TYPE_CHECKING:  # what type checkers and readers see; at run time the same names come from __getattr__
    from core.models.catalog import (
        ASSETS,
        ROPE_FAMILY,
        T5_FAMILY,
        Card,
        ModelSpec,
        bundled_specs,
        default_model,
        read_card,
        registry,
        resolve,
    )
    from core.models.device import DTYPE_NAMES, check_device, check_dtype, dtype_name, pick_device
    from core.models.hub import HUB_WAIT_S, fetch, hub_reachable, local_copy, locate
    from core.models.hub_cache import cached_snapshot, hub_cache_dir, hub_offline
    from core.models.loaded import Loaded
    from core.models.loading import MAX_MODELS, load
    from core.models.names import APP_MODEL_BOX, is_hub_id
    from core.models.safety import (
        NOT_SAFETENSORS,
        TOKENIZER_FILES,
        WEIGHT_FILES,
        check_config_matches,
        check_weight_files,
    )


#: The submodules, reachable as attributes once this package is imported (as when it imported them all).
_SUBMODULES = ("catalog", "device", "hub", "hub_cache", "loaded", "loading", "memory", "names", "safety", "tokenizer")


__getattr__, __dir__ = lazy_exports(__name__, _OWNERS, _SUBMODULES)


__all__ = [  # written out (not built from _OWNERS) so that readers and linters see the names
    "APP_MODEL_BOX",
    "ASSETS",
    "DTYPE_NAMES",
    "HUB_WAIT_S",
    "MAX_MODELS",
    "NOT_SAFETENSORS",
    "ROPE_FAMILY",
    "T5_FAMILY",
    "TOKENIZER_FILES",
    "WEIGHT_FILES",
    "Card",
    "Loaded",
    "ModelLoadError",
    "ModelSpec",
    "bundled_specs",
    "cached_snapshot",
    "check_config_matches",
    "check_device",
    "check_dtype",
    "check_weight_files",
    "default_model",
    "dtype_name",
    "fetch",
    "hub_cache_dir",
    "hub_offline",
    "hub_reachable",
    "is_hub_id",
    "load",
    "local_copy",
    "locate",
    "pick_device",
    "read_card",
    "registry",
    "resolve",
]
