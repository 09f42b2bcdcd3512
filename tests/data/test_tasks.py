"""Tests for core.data.tasks and core.data.corpus: sizing, needle placement, reproducibility, scoring.

Documents are measured with a real tokenizer trained here (small vocabulary,
small sample) and with a deliberately odd one, so the sizing search is tested
against tokenizers whose counts are not additive.
"""

from __future__ import annotations

import ast
import math
import re

import pytest

from core.data import corpus, tasks
from core.data.tasks import Document, Score, from_text, make, score
from core.models.tokenizer import train_tokenizer, training_texts  # noqa: E402


@pytest.fixture(scope="session")
def tok():
    return train_tokenizer(training_texts(docs_per_task=6), vocab_size=512)


class CharTokenizer:
    """An HF-like callable whose count is not additive over pieces: ceil(chars / 3) + 1."""

    def __call__(self, text, add_special_tokens=True):
        def ids(t: str) -> list[int]:
            return [5] * math.ceil(len(t) / 3) + ([1] if add_special_tokens else [])

        return {"input_ids": ids(text) if isinstance(text, str) else [ids(t) for t in text]}


def n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text)["input_ids"])


def tolerance(target: int) -> float:
    return max(8, 0.03 * target)


# --------------------------------------------------------------------------- sizing


@pytest.mark.parametrize("task", tasks.TASKS)
@pytest.mark.parametrize("target", [512, 1024])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_documents_hit_target_length(tok, task, target, depth):
    doc = make(task, tok, target, depth=depth, seed=3)
    count = n_tokens(tok, doc.text)
    assert count == doc.meta["tokens"]
    assert count <= target, "a document must never exceed the asked length"
    assert target - count <= tolerance(target), f"{task}: {count} tokens for a target of {target}"


@pytest.mark.parametrize("task", ["passkey", "topic", "multidoc"])
@pytest.mark.parametrize("haystack", ["corpus-train", "corpus-eval"])
def test_corpus_haystacks_hit_target_length(tok, task, haystack):
    for seed, target in [(0, 400), (1, 777), (2, 2048)]:
        doc = make(task, tok, target, depth=0.3, seed=seed, haystack=haystack)
        count = n_tokens(tok, doc.text)
        assert count <= target and target - count <= tolerance(target), (seed, target, count)
        assert doc.meta["haystack"] == haystack


@pytest.mark.parametrize("task", tasks.TASKS)
def test_sizing_with_a_non_additive_tokenizer(task):
    odd = CharTokenizer()
    for target in (400, 1500):
        doc = make(task, odd, target, depth=0.7, seed=11)
        count = n_tokens(odd, doc.text)
        assert count == doc.meta["tokens"] and count <= target
        assert target - count <= tolerance(target), (target, count)


@pytest.mark.parametrize("task", tasks.TASKS)
def test_sizing_with_a_byte_tokenizer(task):
    """ByT5's byte tokenizer (slow, Python): coarse units, a different counting path."""
    from transformers import ByT5Tokenizer

    byt5 = ByT5Tokenizer()
    doc = make(task, byt5, 1500, depth=0.6, seed=2)
    count = n_tokens(byt5, doc.text)
    assert count == doc.meta["tokens"] and 0 <= 1500 - count <= tolerance(1500)


def test_longer_target_gives_longer_document(tok):
    lengths = [n_tokens(tok, make("passkey", tok, t, seed=1).text) for t in (256, 512, 1024, 2048)]
    assert lengths == sorted(lengths) and len(set(lengths)) == 4


def test_target_too_small_is_an_error(tok):
    with pytest.raises(ValueError, match="too small"):
        make("passkey", tok, 20)
    with pytest.raises(ValueError, match="too small"):
        make("line", tok, 50)


# --------------------------------------------------------------------------- needle and question


@pytest.mark.parametrize("task", tasks.TASKS)
def test_needle_span_holds_the_answer(tok, task):
    for seed in range(4):
        doc = make(task, tok, 600, depth=seed / 3, seed=seed)
        start, end = doc.needle_span
        assert 0 <= start < end <= len(doc.text)
        needle = doc.text[start:end]
        assert doc.expected in needle, (needle, doc.expected)
        assert doc.meta["answer_span"] is not None
        a, b = doc.meta["answer_span"]
        assert doc.text[a:b] == doc.expected and start <= a < b <= end


def test_needle_texts_follow_the_paper_formats(tok):
    doc = make("passkey", tok, 400, seed=2)
    k = doc.expected
    assert re.fullmatch(r"\d{5}", k) and 10000 <= int(k) <= 99999
    assert doc.text[slice(*doc.needle_span)] == f"The pass key is {k}. Remember it. {k} is the pass key."
    assert doc.text.startswith("There is an important info hidden inside a lot of irrelevant text.")
    assert "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again." in doc.text

    line = make("line", tok, 600, seed=2)
    assert re.fullmatch(r"line [a-z]+-[a-z]+: REGISTER_CONTENT is \d{5}", line.text[slice(*line.needle_span)])

    code = make("code", tok, 600, seed=2)
    assert code.text[slice(*code.needle_span)] == f"def get_key():\n    return {code.expected}"


@pytest.mark.parametrize("task", tasks.TASKS)
def test_question_is_at_the_end(tok, task):
    doc = make(task, tok, 500, seed=5)
    qs, qe = doc.question_span
    assert qe == len(doc.text)
    question = doc.text[qs:qe]
    expected_question = {
        "passkey": "What is the pass key? The pass key is",
        "topic": "What is the first topic we discussed? Only give me the topic name.",
        "code": "# What does get_key() return? The key is",
    }
    if task in expected_question:
        assert question == expected_question[task]
    if task == "line":
        assert question == f"Tell me what is the REGISTER_CONTENT in line {doc.meta['line_index']}? I need the number."
    if task == "multidoc":
        assert question.startswith("Question: ") and question.endswith("Answer:")
        assert doc.meta["entity"] in question
    assert doc.needle_span[1] <= qs


@pytest.mark.parametrize("task", ["passkey", "line", "multidoc", "code"])
def test_depth_moves_the_needle(tok, task):
    starts = []
    for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
        doc = make(task, tok, 1024, depth=depth, seed=8)
        context_end = doc.question_span[0]
        starts.append(doc.needle_span[0] / context_end)
        assert abs(doc.depth - depth) <= 1.0 / (doc.meta["n_items"] - 1) + 1e-9
        if depth == 0.0:
            assert doc.depth == 0.0 and starts[-1] < 0.35  # right after the instructions
        if depth == 1.0:
            assert doc.depth == 1.0 and doc.meta["needle_index"] == doc.meta["n_items"] - 1
            if task != "multidoc":  # there the fact opens the last document, which goes on
                assert (context_end - doc.needle_span[1]) / context_end < 0.1
    assert starts == sorted(starts) and starts[-1] - starts[0] > 0.5


def test_depth_zero_puts_passkey_right_after_the_intro(tok):
    doc = make("passkey", tok, 2048, depth=0.0, seed=1)
    assert doc.needle_span[0] == len(tasks.PASSKEY_INTRO) + 1
    doc = make("passkey", tok, 2048, depth=1.0, seed=1)
    assert doc.needle_span[1] + 1 == doc.question_span[0]


def test_topic_document(tok):
    doc = make("topic", tok, 1500, depth=0.7, seed=4)
    assert doc.depth == 0.0
    assert doc.expected in tasks.TOPICS
    openings = re.findall(r"USER: I would like to discuss the topic of (.+?)\.\n", doc.text)
    assert openings[0] == doc.expected
    assert openings.count(doc.expected) == 1
    assert len(openings) >= 3 and doc.meta["n_topics"] == len(openings)


def test_topic_names_do_not_contain_each_other():
    norm = [tasks.normalize_answer(t) for t in tasks.TOPICS]
    assert len(set(map(tuple, norm))) == len(norm) >= 55
    for i, a in enumerate(norm):
        for j, b in enumerate(norm):
            if i != j:
                assert not score("topic", " ".join(a), " ".join(b)).correct, (tasks.TOPICS[i], tasks.TOPICS[j])


def test_line_indices_are_unique(tok):
    doc = make("line", tok, 4096, depth=0.4, seed=9)
    indices = re.findall(r"^line (\S+): REGISTER_CONTENT is (\d+)$", doc.text, flags=re.M)
    names = [name for name, _ in indices]
    assert len(names) > 100 and len(set(names)) == len(names)
    asked = doc.meta["line_index"]
    assert [value for name, value in indices if name == asked] == [doc.expected]
    assert all(len(value) == 5 for _, value in indices)


@pytest.mark.parametrize("attribute", ["capital", "born"])
def test_multidoc_document(tok, attribute):
    doc = make("multidoc", tok, 1500, depth=0.5, seed=6, attribute=attribute)
    numbers = [int(n) for n in re.findall(r"^Document \[(\d+)\] \(Title: ", doc.text, flags=re.M)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) == doc.meta["n_docs"] >= 5
    fact = doc.text[slice(*doc.needle_span)]
    assert doc.text.count(fact) == 1 and doc.meta["entity"] in fact
    # The gold document is the one at the depth-given position.
    gold_line = doc.text[: doc.needle_span[0]].rsplit("\n", 1)[-1]
    assert gold_line.startswith(f"Document [{doc.meta['gold_index'] + 1}] (Title: {doc.meta['entity']})")
    assert abs(doc.meta["gold_index"] / (doc.meta["n_docs"] - 1) - 0.5) <= 1 / (doc.meta["n_docs"] - 1)
    if attribute == "born":
        assert re.fullmatch(r"1[7-9]\d\d", doc.expected)
        assert f"{doc.meta['entity']} was born in" not in doc.text.replace(fact, "")
    else:
        assert f"capital of {doc.meta['entity']} is" not in doc.text.replace(fact, "")
    first_and_last = [make("multidoc", tok, 1500, depth=d, seed=6).meta for d in (0.0, 1.0)]
    assert first_and_last[0]["gold_index"] == 0
    assert first_and_last[1]["gold_index"] == first_and_last[1]["n_docs"] - 1


def test_code_document_is_python_with_one_get_key(tok):
    doc = make("code", tok, 2048, depth=0.3, seed=12)
    tree = ast.parse(doc.text)  # the question is a comment, so the whole input parses
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    keys = [f for f in functions if f.name == "get_key"]
    assert len(keys) == 1 and len(functions) > 30
    returned = keys[0].body[0]
    assert isinstance(returned, ast.Return) and returned.value.value == int(doc.expected)
    names = [f.name for f in functions]
    assert len(set(names)) == len(names)


# --------------------------------------------------------------------------- reproducibility


@pytest.mark.parametrize("task", tasks.TASKS)
def test_same_seed_same_document(tok, task):
    a = make(task, tok, 700, depth=0.4, seed=21, haystack="corpus-train")
    b = make(task, tok, 700, depth=0.4, seed=21, haystack="corpus-train")
    assert a == b and a.meta == b.meta


@pytest.mark.parametrize("task", tasks.TASKS)
def test_different_seeds_different_answers(tok, task):
    docs = [make(task, tok, 400, seed=s) for s in range(12)]
    assert len({d.expected for d in docs}) >= 9
    assert len({d.text for d in docs}) == 12


def test_answer_is_stable_across_lengths_and_depths(tok):
    keys = {make("passkey", tok, t, depth=d, seed=5).expected for t in (256, 1024) for d in (0.0, 1.0)}
    assert len(keys) == 1


def test_key_option(tok):
    assert make("passkey", tok, 300, key=12345).expected == "12345"
    with pytest.raises(ValueError):
        make("passkey", tok, 300, key=123)


# --------------------------------------------------------------------------- validation


def test_invalid_arguments(tok):
    with pytest.raises(ValueError, match="unknown task"):
        make("nope", tok, 512)
    with pytest.raises(ValueError, match="from_text"):
        make("text", tok, 512)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="depth"):
            make("passkey", tok, 512, depth=bad)
    with pytest.raises(ValueError, match="haystack"):
        make("passkey", tok, 512, haystack="web")
    with pytest.raises(ValueError, match="option"):
        make("passkey", tok, 512, colour="red")
    for bad_tokens in (0, -5, 512.0, "512", True):
        with pytest.raises(ValueError, match="tokens"):
            make("passkey", tok, bad_tokens)


def test_numpy_numbers_are_accepted(tok):
    np = pytest.importorskip("numpy")
    a = make("line", tok, np.int64(600), depth=np.float64(0.25), seed=np.int32(4))
    b = make("line", tok, 600, depth=0.25, seed=4)
    assert a == b and type(a.seed) is int


# --------------------------------------------------------------------------- scoring


def test_score_passkey_and_code():
    for task in ("passkey", "code"):
        assert score(task, "48213", "48213") == Score(True, "48213")
        assert score(task, " 48213. The pass key is 48213.", "48213").correct
        assert score(task, "The pass key is 48213", "48213").correct
        assert score(task, "48231", "48213") == Score(False, "48231")
        assert not score(task, "4821", "48213").correct
        assert not score(task, "12345 48213", "48213").correct  # the first number counts
        assert score(task, "no idea", "48213") == Score(False, None)
        assert score(task, "", "48213") == Score(False, None)


def test_score_line_uses_last_number():
    assert score("line", "line swift-otter: REGISTER_CONTENT is 48213", "48213").correct
    assert score("line", "12 then 48213", "48213") == Score(True, "48213")
    assert not score("line", "48213 or maybe 11111", "48213").correct
    assert score("line", "nothing", "48213") == Score(False, None)


def test_score_topic_and_multidoc():
    assert score("topic", "Coral reefs.", "coral reefs").correct
    assert score("topic", "The first topic was coral reefs!", "coral reefs").correct
    assert score("topic", "Silk Road", "the Silk Road").correct
    assert not score("topic", "coral", "coral reefs").correct
    assert not score("topic", "reefs coral", "coral reefs").correct
    assert not score("topic", "", "coral reefs").correct and score("topic", "", "x").parsed is None
    assert score("multidoc", "Trelmont", "Trelmont").correct
    assert not score("multidoc", "Trelmonte", "Trelmont").correct
    assert score("multidoc", "He was born in 1834.", "1834").correct
    assert not score("multidoc", "18340", "1834").correct


def test_score_text_and_unknown():
    assert score("text", "52603", "52603").correct
    assert score("text", "It is a banana.", "banana").correct
    assert not score("text", "apple", "banana").correct
    with pytest.raises(ValueError):
        score("nope", "a", "b")


@pytest.mark.parametrize("task", tasks.TASKS)
def test_scorer_accepts_gold_and_rejects_other_gold(tok, task):
    a = make(task, tok, 400, seed=1)
    b = next(d for s in range(2, 20) if (d := make(task, tok, 400, seed=s)).expected != a.expected)
    assert score(task, a.expected, a.expected).correct
    assert not score(task, b.expected, a.expected).correct


# --------------------------------------------------------------------------- your own text

USER_TEXT = (
    "Alice went to the market. She bought apples and pears! Then she walked home. "
    "Was it raining? Nobody remembers. The end."
)


def test_from_text_default_needle_at_sentence_boundary(tok):
    for depth in (0.0, 0.3, 0.6, 1.0):
        doc = from_text(USER_TEXT, tok, depth=depth, seed=4)
        assert isinstance(doc, Document) and doc.task == "text"
        s, e = doc.needle_span
        assert doc.text[s:e] == f"The pass key is {doc.expected}. Remember it. {doc.expected} is the pass key."
        assert doc.text[doc.question_span[0] : doc.question_span[1]] == tasks.PASSKEY_QUESTION
        assert s == 0 or (doc.text[s - 1] == " " and doc.text[s - 2] in ".!?")
        # Removing the needle (and one joining space) gives the user's text back.
        context = doc.text[: doc.question_span[0] - 1]
        restored = context[:s] + context[e + 1 :] if s == 0 else context[: s - 1] + context[e:]
        assert restored == USER_TEXT
        assert abs(doc.depth - depth) < 0.35
        assert doc.meta["tokens"] == n_tokens(tok, doc.text)
    first = from_text(USER_TEXT, depth=0.0)
    assert first.needle_span[0] == 0 and first.depth == 0.0
    last = from_text(USER_TEXT, depth=1.0)
    needle = last.text[slice(*last.needle_span)]
    assert last.text == USER_TEXT + " " + needle + "\n" + tasks.PASSKEY_QUESTION and last.depth == 1.0


def test_from_text_is_seeded():
    assert from_text(USER_TEXT, seed=1) == from_text(USER_TEXT, seed=1)
    assert len({from_text(USER_TEXT, seed=s).expected for s in range(10)}) >= 9


def test_from_text_custom_needle_and_no_needle():
    doc = from_text(
        USER_TEXT, needle="The secret fruit is a mango.", question="What is the secret fruit?", expected="mango"
    )
    assert doc.text[slice(*doc.needle_span)] == "The secret fruit is a mango."
    assert doc.text.endswith("\nWhat is the secret fruit?") and doc.expected == "mango"
    bare = from_text(USER_TEXT, needle="", question="Where did Alice go?", expected="market")
    assert bare.needle_span == (0, 0) and bare.text == USER_TEXT + "\nWhere did Alice go?"
    assert bare.text[slice(*bare.question_span)] == "Where did Alice go?"
    with pytest.raises(ValueError):
        from_text(USER_TEXT, needle="x is 1.")  # a custom needle needs a question
    for empty in ("", "   \n\t "):
        with pytest.raises(ValueError, match="empty"):
            from_text(empty)


def test_from_text_keeps_unicode_and_no_punctuation():
    text = "naïve café 😀 中文 without any sentence end"
    doc = from_text(text, depth=0.5)
    s, e = doc.needle_span
    assert doc.text[s:e].startswith("The pass key is")
    assert doc.text[s - 1] == " " and doc.text[e] == " "


# --------------------------------------------------------------------------- corpus


def test_corpus_is_deterministic_prose():
    paragraphs = corpus.paragraphs()
    assert paragraphs == corpus.paragraphs()
    assert len(paragraphs) > 500 and len(set(paragraphs)) == len(paragraphs)
    for p in paragraphs:
        words = p.split()
        assert corpus.MIN_WORDS <= len(words) <= corpus.MAX_WORDS
        assert p.isascii() and p == " ".join(words) and p[-1] in ".!?"
        assert not re.search(r"\d{4,}", p)


def test_corpus_split_is_disjoint_and_stable():
    paragraphs = corpus.paragraphs()
    train, evaluation = corpus.split_train_eval(paragraphs)
    assert not set(train) & set(evaluation)
    assert sorted(train + evaluation) == sorted(paragraphs)
    assert 0.1 < len(evaluation) / len(paragraphs) < 0.3
    # Membership depends on the paragraph alone: dropping others moves nothing.
    sub_train, sub_eval = corpus.split_train_eval(paragraphs[::3])
    assert set(sub_train) <= set(train) and set(sub_eval) <= set(evaluation)
    assert corpus.pool("train") == tuple(train) and corpus.pool("eval") == tuple(evaluation)


def test_corpus_haystack_uses_its_pool(tok):
    def sentences(pool: str) -> set[str]:
        return {s for p in corpus.pool(pool) for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(])", p)}

    train, evaluation = sentences("train"), sentences("eval")
    doc = make("passkey", tok, 3000, depth=0.5, seed=3, haystack="corpus-eval")
    context = doc.text[len(tasks.PASSKEY_INTRO) + 1 : doc.question_span[0] - 1]
    context = context.replace(doc.text[slice(*doc.needle_span)], " ")
    found = [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(])", context.strip()) if s]
    in_eval = sum(s in evaluation for s in found)
    assert in_eval >= len(found) - 2  # all but the sentence cut to fit the length
    assert not any(s in train and s not in evaluation for s in found)


def test_line_label_sets(tok):
    """``labels=`` picks the word list; both give unique indices; an unknown set is refused."""
    for labels in tasks.LINE_LABELS:
        adjectives, nouns = tasks.LINE_LABELS[labels]
        doc = make("line", tok, 700, seed=4, labels=labels)
        idx = re.findall(r"^line (\S+): REGISTER_CONTENT is \d+$", doc.text, flags=re.M)
        assert len(idx) == len(set(idx)) > 5
        assert all(i.split("-")[0] in adjectives and i.split("-")[1] in nouns for i in idx)
    assert make("line", tok, 700, seed=4).text == make("line", tok, 700, seed=4, labels="compact").text
    with pytest.raises(ValueError, match="labels must be one of"):
        make("line", tok, 700, seed=4, labels="emoji")


def test_line_bare_record_has_no_instructions(tok):
    """``intro=False``: the record starts at its first line (a training curriculum); the question stays."""
    doc = make("line", tok, 300, seed=4, intro=False)
    assert doc.text.startswith("line ") and tasks.LINE_INTRO not in doc.text
    assert doc.text.endswith("? I need the number.") and f"REGISTER_CONTENT is {doc.expected}" in doc.text
    with_intro = make("line", tok, 300, seed=4)
    assert with_intro.text.startswith(tasks.LINE_INTRO)
    assert doc.text.count("REGISTER_CONTENT is") > with_intro.text.count("REGISTER_CONTENT is")
    with pytest.raises(ValueError, match="intro must be"):
        make("line", tok, 300, seed=4, intro="no")


def test_line_share_adds_hard_negatives_and_leaves_the_default_documents_alone(tok):
    """``share=``: lines whose label keeps the asked adjective or noun (training's hard negatives);
    labels stay unique, the answer stays the asked line's number, and share=0 is the plain document."""
    plain = make("line", tok, 600, seed=11)
    assert make("line", tok, 600, seed=11, share=0.0).text == plain.text
    for seed in range(5):
        doc = make("line", tok, 600, seed=seed, share=0.6)
        asked = doc.meta["line_index"]
        labels = re.findall(r"^line (\S+): REGISTER_CONTENT is (\d+)$", doc.text, flags=re.M)
        assert len({lab for lab, _ in labels}) == len(labels) > 8
        assert dict(labels)[asked] == doc.expected
        adj, noun = asked.split("-")[:2]
        sharing = [lab for lab, _ in labels if lab != asked and (lab.split("-")[0] == adj or lab.split("-")[1] == noun)]
        assert len(sharing) >= len(labels) // 4, (asked, labels)
    long = make("line", tok, 4000, seed=1, share=1.0)  # more lines than sharing pairs: plain draws fill in
    assert long.meta["tokens"] > 3900
    with pytest.raises(ValueError, match="share must be"):
        make("line", tok, 300, seed=4, share=2)
