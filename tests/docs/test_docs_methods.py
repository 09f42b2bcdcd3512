"""The docs that list the temperature methods keep up with the registry (issue 37).

docs/cli.md (``--method``) and docs/app.md (the method menu) each have a
"Temperature methods" table with one row per name of
:data:`core.runs.methods.NAMES`. These tests read the real files and the real
registry, and name no method themselves: a method added to (or dropped
from) ``core.runs.methods.REGISTRY`` without its row fails here, naming the doc
and the method.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.runs import methods

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("docs/cli.md", "docs/app.md")
SECTION = "Temperature methods"
HEADING = re.compile(r"^(#{1,6})[ \t]+(.*?)[ \t#]*$", re.M)
ROW = re.compile(r"^\|\s*`([^`|]+)`\s*\|", re.M)  # a table row whose first cell is one code span


def mentioned(text: str, name: str) -> bool:
    """Whether ``text`` names the method as code: `name`."""
    return f"`{name}`" in text


def section(text: str, title: str = SECTION) -> str:
    """The body of the first heading called ``title``, up to the next heading of the same or a higher level."""
    heads = list(HEADING.finditer(text))
    for i, m in enumerate(heads):
        if m.group(2).strip() == title:
            level = len(m.group(1))
            end = next((h.start() for h in heads[i + 1 :] if len(h.group(1)) <= level), len(text))
            return text[m.end() : end]
    raise AssertionError(f"no heading '{title}'")


def table_names(text: str) -> list[str]:
    """The names in the first column of the methods table, in the order of its rows."""
    return ROW.findall(section(text))


def _read(doc: str) -> str:
    return (ROOT / doc).read_text(encoding="utf-8")


@pytest.mark.parametrize("doc", DOCS)
@pytest.mark.parametrize("name", methods.NAMES)
def test_each_registry_name_is_in_the_doc(doc, name):
    assert mentioned(_read(doc), name), f"{doc} does not mention `{name}` (core.runs.methods.REGISTRY)"


@pytest.mark.parametrize("doc", DOCS)
def test_the_methods_table_lists_exactly_the_registry_in_its_order(doc):
    rows = table_names(_read(doc))
    missing = [n for n in methods.NAMES if n not in rows]
    stale = [n for n in rows if n not in methods.NAMES]
    assert not missing and not stale, f"{doc}'s '{SECTION}' table: missing {missing}, not in the registry {stale}"
    assert rows == list(methods.NAMES), f"{doc}'s '{SECTION}' table is not in the registry's order"


@pytest.mark.parametrize("doc", DOCS)
def test_the_checks_fail_on_a_doc_that_misses_a_method(doc):
    """The checks themselves can fail: drop any one method's row from the real doc and both see it."""
    text = _read(doc)
    for name in methods.NAMES:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        cut = text.replace(row + "\n", "")
        assert name not in table_names(cut)
        assert table_names(cut) != list(methods.NAMES)
        assert not mentioned(cut.replace(f"`{name}`", name), name)
    with pytest.raises(AssertionError, match="no heading"):
        section("# Something else\n| `x` | y |\n")
