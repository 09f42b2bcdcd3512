"""The local Hugging Face hub cache as the environment says *now*: where it is, whether offline mode is on, and a
repo's cached snapshot. No network here.

Hub ids are looked up in this cache first (``HF_HUB_CACHE``, else ``HF_HOME/hub``, read when a load runs, not
when huggingface_hub was imported), and a complete cached copy is loaded from its snapshot folder without
touching the network (:func:`core.models.hub.locate`).
"""

from __future__ import annotations

import os
from pathlib import Path

_TRUE = {"1", "ON", "YES", "TRUE"}


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache as the environment says *now*.

    Same precedence as ``huggingface_hub.constants`` (``HF_HUB_CACHE``, legacy
    ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME/hub``, ``XDG_CACHE_HOME/huggingface/hub``,
    ``~/.cache/huggingface/hub``), but read at call time: those constants are
    frozen when huggingface_hub is imported.
    """
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        raw = env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]
    else:
        home = env.get("HF_HOME") or os.path.join(
            env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"
        )
        raw = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(raw)))


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` asks for no network."""
    return any(os.environ.get(v, "").strip().upper() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def cached_snapshot(repo_id: str, revision: str = "main") -> Path | None:
    """The snapshot folder of ``repo_id`` in the local hub cache when it holds a
    ``config.json`` (``models--org--name/snapshots/<hash>/`` via ``refs/<revision>``), else None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        hit = try_to_load_from_cache(repo_id, "config.json", cache_dir=str(hub_cache_dir()), revision=revision)
    except Exception:  # noqa: BLE001 - a malformed id or unreadable cache simply means "not cached"
        return None
    return Path(hit).parent if isinstance(hit, str) else None
