"""What a model name typed by a person is (a folder here, a hub id) and how a message repeats it.

Names arrive from the CLI, the app's free-text model box and ``?model=``, so they may be any string: these
helpers never raise on one, a message repeats at most :data:`_SHOWN_CHARS` characters of it, and the app's
words name a local folder by its own name, never the server's path to it.
"""

from __future__ import annotations

import re
from pathlib import Path

#: Where the app's messages send a person to name a model (the sidebar's free-text model box, ui.sidebar.OTHER_HINT).
APP_MODEL_BOX = "the sidebar's '…or a hub id / local folder' box"


def _is_dir(path: str | Path) -> bool:
    """``path`` (``~`` expanded) is a folder; False for a name the OS cannot even look up.

    Why not ``Path.is_dir``: it raises OSError for a name over the system's limit
    (ENAMETOOLONG, 255 bytes a component) and ValueError for a NUL, and a model
    name typed in the app's box or ``?model=`` may be either.
    """
    try:
        return Path(path).expanduser().is_dir()
    except (OSError, ValueError):
        return False


#: A hub id as the hub spells them: ``owner/name``, each part 1-96 letters, digits, ``-``, ``_`` or ``.``.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
#: How many characters of a name a message repeats (a 260-character name would drown the line).
_SHOWN_CHARS = 80


def _short(name: str) -> str:
    """``name`` cut to :data:`_SHOWN_CHARS` characters for a message, its control characters escaped."""
    text = str(name).encode("unicode_escape").decode("ascii")
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + f"… ({len(name)} characters)"


def is_hub_id(name: str) -> bool:
    """``name`` can be a hub id (``owner/name`` as the hub allows them: no ``--`` or ``..``)."""
    return bool(_HUB_ID.fullmatch(name)) and "--" not in name and ".." not in name


def _shown(src: str) -> str:
    """How the app's messages name a model source: a local folder by its own name (never the server's path to it)."""
    path = Path(src).expanduser()
    return path.name or src if path.is_absolute() or src.startswith((".", "~")) else src
