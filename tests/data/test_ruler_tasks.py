"""Issue 48, point 3: the RULER-style tasks (core/data/tasks/ruler.py), their scorers, the CLI and the RULER block
of bench/results.py (effective length). Each document is checked by reading its own text back: the needles are
there, the chain resolves to the gold answer, the common words are the most frequent ones."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from core.data import tasks

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

NIAH = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{5})\.")
VAR = re.compile(r"VAR ([A-Z]{5}) = (?:VAR ([A-Z]{5})|(\d{5}))\.")


@pytest.fixture(scope="module")
def tok():
    from core.models import load

    return load("retrieval-t5", device="cpu").tokenizer


def test_the_tasks_are_registered_where_everything_reads_them():
    assert set(tasks.RULER_TASKS) == {"multikey", "multivalue", "multiquery", "vartrack", "commonwords"}
    assert set(tasks.RULER_TASKS) <= set(tasks.GENERATED)
    assert {"multikey", "multivalue", "multiquery", "vartrack"} <= set(tasks.HAYSTACK_TASKS)
    assert "commonwords" not in tasks.HAYSTACK_TASKS  # its filler is its word list
    from core.runs.settings import DocumentRequest

    DocumentRequest(task="vartrack", tokens=512, haystack="corpus-eval")  # the settings take them


@pytest.mark.parametrize("task", ["multikey", "multivalue", "multiquery", "vartrack", "commonwords"])
@pytest.mark.parametrize("n", [256, 2048])
def test_exact_length_and_answer_kept_across_lengths(tok, task, n):
    hays = ("default", "corpus-eval") if task in tasks.HAYSTACK_TASKS else ("default",)
    for haystack in hays:
        for seed in range(3):
            d = tasks.make(task, tok, n, depth=0.4, seed=seed, haystack=haystack)
            assert d.meta["tokens"] == n and d.meta["short_by"] == 0, (task, seed, haystack)
            assert d.expected == tasks.make(task, tok, 600, depth=0.9, seed=seed, haystack=haystack).expected
            assert d.text[d.needle_span[0] : d.needle_span[1]] in d.text and d.meta["needles"] >= 1


def test_multikey_needles_by_reading_the_text(tok):
    for seed in range(5):
        d = tasks.make("multikey", tok, 1024, depth=0.5, seed=seed)
        found = dict(NIAH.findall(d.text))
        assert len(found) == 4 and len(set(found.values())) == 4  # four keys, four different numbers
        asked = d.meta["asked"][0]
        assert asked in d.text[d.question_span[0] :] and found[asked] == d.expected


def test_multivalue_and_multiquery_by_reading_the_text(tok):
    for seed in range(5):
        d = tasks.make("multivalue", tok, 1024, depth=0.2, seed=seed)
        pairs = NIAH.findall(d.text)
        assert {k for k, _ in pairs} == {d.meta["asked"][0]} and len(pairs) == 2
        assert sorted(v for _, v in pairs) == sorted(d.expected.split(", "))
        assert d.meta["answer_span"] is None  # a list answer has no one span; each number has its own
        assert [d.text[a:b] for a, b in d.meta["answer_spans"]] == d.expected.split(", ")
        d = tasks.make("multiquery", tok, 1024, depth=0.7, seed=seed)
        found = dict(NIAH.findall(d.text))
        assert len(found) == 4
        assert [found[k] for k in d.meta["asked"]] == d.expected.split(", ")
        assert [d.text[a:b] for a, b in d.meta["answer_spans"]] == d.expected.split(", ")


@pytest.mark.parametrize("hops", [1, 2, 4])
def test_vartrack_chain_resolves_to_the_answer(tok, hops):
    for seed in range(4):
        d = tasks.make("vartrack", tok, 2048, depth=0.6, seed=seed, hops=hops)
        assigned = {a: (b or v) for a, b, v in VAR.findall(d.text)}
        assert len(assigned) == 2 * (hops + 1)  # two chains of hops + 1 variables
        var, steps = d.meta["asked"][0], 0
        while not assigned[var].isdigit():  # follow the chain from the asked variable back to its value
            var, steps = assigned[var], steps + 1
        assert steps == hops and assigned[var] == d.expected
        other = [v for v in assigned.values() if v.isdigit() and v != d.expected]
        assert len(other) == 1  # the distractor chain has its own value


def test_commonwords_are_the_most_frequent_by_count(tok):
    for n in (256, 2048):
        for seed in range(5):
            d = tasks.make("commonwords", tok, n, seed=seed)
            body = d.text[d.text.index("\n") + 1 : d.question_span[0]]
            counts = Counter(body.split())
            want = d.expected.split(", ")
            top = [w for w, _ in counts.most_common(len(want))]
            assert sorted(top) == sorted(want), (n, seed)
            assert min(counts[w] for w in want) > max(c for w, c in counts.items() if w not in want)


def test_too_short_is_refused_in_one_line(tok):
    with pytest.raises(ValueError, match="too small"):
        tasks.make("multikey", tok, 60, seed=0)
    with pytest.raises(ValueError, match="unknown option"):
        tasks.make("vartrack", tok, 512, seed=0, nope=1)
    with pytest.raises(ValueError, match="hops must be"):
        tasks.make("vartrack", tok, 512, seed=0, hops=0)


def test_scorers():
    s = tasks.score
    assert s("multikey", "12345 and 99999", "12345").correct and not s("multikey", "99999 12345", "12345").correct
    assert s("vartrack", "54321", "54321").correct
    assert s("multivalue", "67890, 12345", "12345, 67890").correct  # any order
    assert not s("multivalue", "12345", "12345, 67890").correct  # all of them
    assert s("multiquery", "11111 22222", "11111, 22222").correct
    assert s("commonwords", "Otter, misty and crane.", "otter, misty, crane").correct
    assert not s("commonwords", "otter misty", "otter, misty, crane").correct
    assert s("commonwords", "", "otter").parsed is None


def test_effective_length_by_hand():
    import bench.results as br

    # L_tr 50 %: the bar is 42.5; 2x keeps 45, 4x falls to 40: 2x, even though 8x comes back to 44
    assert br.effective_length({256: 50, 512: 45, 1024: 40, 2048: 44}, 256) == 512
    assert br.effective_length({256: 80, 512: 80, 1024: 70, 2048: 68}, 256) == 2048  # 68 = 85 % of 80
    assert br.effective_length({256: 80, 512: 67.9}, 256) == 256
    assert br.effective_length({256: 0, 512: 10}, 256) is None  # nothing to keep at L_tr
    assert br.effective_length({512: 10}, 256) is None


def test_ruler_markdown_has_the_effective_length():
    import bench.results as br

    rows = [
        {"task": "multikey", "method": m, "tokens": n, "tau": 1.0, "accuracy": a, "samples": 20}
        for m, accs in (("none", (60, 20)), ("log-length", (60, 55)))
        for n, a in zip((256, 2048), accs)
    ]
    md = br.ruler_markdown(pd.DataFrame(rows), 256)
    assert "| none (tau = 1) | 60 (tau 1.00) | 20 (tau 1.00) | 256 (1x) |" in md
    assert "| 60 (tau 1.00) | 55 (tau 1.00) | 2048 (8x) |" in md
    assert br.ruler_spec("multikey-varied") == ("multikey", "corpus-eval")
    with pytest.raises(ValueError):
        br.ruler_spec("passkey")


@pytest.mark.parametrize("task", ["multikey", "commonwords"])
def test_cli_run_json_at_1x_and_8x(task, capsys):
    from core import cli

    for n in (256, 2048):
        assert cli.main(["run", "--model", "retrieval-t5", "--task", task, "--tokens", str(n), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["task"] == task and out["tokens"] == n and out["ratio"] == n / 256
        assert isinstance(out["correct"], bool) and out["expected"]
