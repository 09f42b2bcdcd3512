"""The server options app.py runs with (.streamlit/config.toml, read by `streamlit run` from the repository root).

Each is there for a measured reason, so a test says what would silently be lost without it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_READ = """
from streamlit import config
config.get_config_options(force_reparse=True)
print(config.get_option("runner.postScriptGC"), config.get_option("client.toolbarMode"),
      config.get_option("client.showErrorDetails"))
"""


def _options() -> list[str]:
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("STREAMLIT_")}
    out = subprocess.run([sys.executable, "-c", _READ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_no_full_garbage_collection_after_each_run():
    """Streamlit's gc.collect(2) after every run cost ~0.5 s of CPU per run here, and the scrubber's poll reruns the
    panel every 0.9 s while a grid fills: with it, an 8x grid on the AVX2 paths was ready after 20.6 / 26.2 s, without
    it 10.6 / 14.5 s (bench/README.md)."""
    assert _options()[0] == "False"


def test_a_class_sees_no_developer_toolbar_and_no_traceback():
    _, toolbar, details = _options()
    assert toolbar == "viewer" and details == "type"
