"""Only the attention backends compute a softmax over attention logits.

The backends (core/mechanics/softmax_block.py: torch and sdpa; the kernels core/mechanics/fused_softmax.py and
core/mechanics/flash_attention.py) own every softmax of an attention call: adaptive temperature's entropy pass is
an option of the torch backend's block computation, the CUDA backend's on-demand profile rows reuse the torch
backend's logits and the kernel's own row max and total. A softmax written anywhere else in core/ or ui/ fails
here; a log-softmax over a model head's vocabulary (masked-LM scoring, training's supervision) is not attention
and is left alone. The tests' numpy reference of the adaptive softmax lives in tests/conftest.py.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = {
    ROOT / "core" / "mechanics" / name for name in ("softmax_block.py", "fused_softmax.py", "flash_attention.py")
}
#: A call of a softmax (torch.softmax, x.softmax, F.softmax, a softmax of one's own), not in a comment or docstring
#: line, and not a log-softmax.
SOFTMAX_CALL = re.compile(r"(?<![\w.])(?:torch\.|F\.|functional\.)?softmax_?\(|\.softmax_?\(")


def _code_lines(path: Path):
    in_doc = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        quotes = stripped.count('"""') + stripped.count("'''")
        if in_doc or stripped.startswith(('"""', "'''", "#")):
            if quotes % 2 == 1:
                in_doc = not in_doc
            continue
        yield n, line.split("#", 1)[0]


def test_no_softmax_outside_the_backends():
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for top in ("core", "ui")
        for p in sorted((ROOT / top).rglob("*.py"))
        if p not in BACKENDS
        for n, line in _code_lines(p)
        if SOFTMAX_CALL.search(line)
    ]
    assert found == []


def test_the_scan_sees_a_softmax_and_leaves_a_log_softmax():
    for line in ("p = torch.softmax(x, -1)", "p = x.softmax(-1)", "p = F.softmax(x, dim=-1)", "def softmax(x):"):
        assert SOFTMAX_CALL.search(line), line
    for line in ("logp = torch.log_softmax(x, -1)", "x.log_softmax(-1)", "fused_softmax.softmax_rows(x)"):
        assert not SOFTMAX_CALL.search(line), line
