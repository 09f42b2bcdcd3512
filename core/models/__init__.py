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

from core.errors import ModelLoadError
from core.models.catalog import (ASSETS, ROPE_FAMILY, T5_FAMILY, Card, ModelSpec, bundled_specs, default_model,
                                 read_card, registry, resolve)
from core.models.device import DTYPES, check_device, check_dtype, pick_device
from core.models.hub import HUB_WAIT_S, fetch, hub_reachable, local_copy, locate
from core.models.hub_cache import cached_snapshot, hub_cache_dir, hub_offline
from core.models.loaded import Loaded
from core.models.loading import MAX_MODELS, load
from core.models.names import APP_MODEL_BOX, is_hub_id
from core.models.safety import (NOT_SAFETENSORS, TOKENIZER_FILES, WEIGHT_FILES, check_config_matches,
                                check_weight_files)

__all__ = [
    "APP_MODEL_BOX", "ASSETS", "DTYPES", "HUB_WAIT_S", "MAX_MODELS", "NOT_SAFETENSORS", "ROPE_FAMILY", "T5_FAMILY",
    "TOKENIZER_FILES", "WEIGHT_FILES", "Card", "Loaded", "ModelLoadError", "ModelSpec", "bundled_specs",
    "cached_snapshot", "check_config_matches", "check_device", "check_dtype", "check_weight_files", "default_model",
    "fetch", "hub_cache_dir", "hub_offline", "hub_reachable", "is_hub_id", "load", "local_copy", "locate",
    "pick_device", "read_card", "registry", "resolve",
]
