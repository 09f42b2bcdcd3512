"""Every relative link in the documentation points at a file that exists.

Checked: README.md, docs/*.md, bench/README.md and research/README.md.
Markdown links ``[text](path)`` and images ``![alt](path)`` (with an optional
``"title"``), and HTML ``href=`` / ``src=`` attributes; code blocks and inline
code are skipped, as are URLs with a scheme (``https:``, ``mailto:``). A
``#anchor`` into a Markdown file must name one of its headings, slugged the
way GitHub does it.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[^\S\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)
# [text](target "title") where text may hold one level of brackets (an image inside a link).
MD_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
HTML_ATTR = re.compile(r"<[a-zA-Z][^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']*)[\"']")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$", re.M)


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "research" / "README.md"]
    files += sorted((ROOT / "docs").glob("*.md"))
    return [f for f in files if f.exists()]


def strip_fences(text: str) -> str:
    """The text with fenced code blocks blanked (line numbers kept)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def strip_code(text: str) -> str:
    """The text with fenced code blocks and inline code spans blanked (line numbers kept)."""
    text = strip_fences(text)
    return INLINE_CODE.sub(
        lambda m: " " * len(m.group(0)) if "\n" not in m.group(0) else "\n" * m.group(0).count("\n"), text
    )


def links(text: str) -> list[tuple[int, str]]:
    """``(line, target)`` of every link and image in Markdown text, code excluded."""
    text = strip_code(text)
    out = []
    for pattern in (MD_LINK, HTML_ATTR):
        for m in pattern.finditer(text):
            out.append((text.count("\n", 0, m.start()) + 1, m.group(1)))
    return sorted(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (but - and _), spaces to hyphens."""
    h = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    h = re.sub(r"<[^>]+>", "", h)
    h = h.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeats."""
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(strip_fences(text)):
        s = slug(m.group(2))
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def broken(source: Path, text: str) -> list[str]:
    """One message per link in ``text`` (the content of ``source``) that does not resolve."""
    bad = []
    for line, target in links(text):
        if not target or SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (source.parent / unquote(path)).resolve() if path else source.resolve()
        where = f"{source.relative_to(ROOT) if source.is_relative_to(ROOT) else source}:{line}: {target}"
        if not dest.exists():
            bad.append(f"{where}: no such file")
        elif anchor and dest.suffix.lower() == ".md" and dest.is_file():
            if unquote(anchor).lower() not in anchors(dest.read_text(encoding="utf-8")):
                bad.append(f"{where}: no heading #{anchor} in {dest.name}")
    return bad


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken(path, path.read_text(encoding="utf-8")) == []


def test_the_documents_are_there():
    names = {str(p.relative_to(ROOT)) for p in doc_files()}
    assert {"README.md", "docs/README.md", "research/README.md", "bench/README.md"} <= names


def test_the_checker_finds_broken_links(tmp_path):
    (tmp_path / "there.md").write_text("# A heading, with `code`!\n\n## Twice\n\n## Twice\n")
    (tmp_path / "img.png").write_bytes(b"")
    src = tmp_path / "index.md"
    text = (
        "[ok](there.md) [ok anchor](there.md#a-heading-with-code) [second](there.md#twice-1)\n"
        '![img](img.png) [[nested] text](there.md "title") [web](https://example.com/x) [self](#local)\n'
        "# Local\n"
        "[gone](missing.md) ![gone image](nope.png)\n"
        '[bad anchor](there.md#no-such-heading) <img src="absent.png">\n'
        "`[in code](ignored.md)`\n"
        "```\n[in a fence](ignored-too.md)\n```\n"
    )
    src.write_text(text)
    found = broken(src, text)
    assert len(found) == 4, found
    assert any("missing.md: no such file" in f for f in found)
    assert any("nope.png: no such file" in f for f in found)
    assert any("absent.png: no such file" in f for f in found)
    assert any("no heading #no-such-heading" in f for f in found)
    assert not any("ignored" in f for f in found)


def test_slugs_follow_github():
    assert slug("`bench/browser_latency.py` (issue 24): the app timed in a real browser") == (
        "benchbrowser_latencypy-issue-24-the-app-timed-in-a-real-browser"
    )
    assert slug("retrieval-t5 (L_tr = 256 tokens)") == "retrieval-t5-l_tr--256-tokens"
    assert slug("The default's 22 stages") == "the-defaults-22-stages"
    assert slug("Use the tau in your own code: `core.apply`") == "use-the-tau-in-your-own-code-coreapply"
