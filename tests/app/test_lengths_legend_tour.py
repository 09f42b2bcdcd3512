"""Issue 41's smaller points: documents of exactly the asked length, the meters' legend, the tour's sentences."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from conftest import clear_app_caches
from core.data import tasks
from core.models import default_model
from core.values.choice import Choice

needs_model = pytest.mark.skipif(default_model() is None, reason="no bundled model in assets/models")


@pytest.fixture(scope="module")
def loaded():
    from core.models import load

    return load("retrieval-t5")


# -- 2. exact token counts --------------------------------------------------------------------------

LENGTHS = (256, 512, 2048, 257, 777, 1001)  # 1x, 2x, 8x L_tr and odd counts


def _cases():
    for task in tasks.GENERATED:
        for haystack in ("default", "corpus-eval") if task in tasks.HAYSTACK_TASKS else ("default",):
            yield task, haystack


@needs_model
@pytest.mark.parametrize("task,haystack", list(_cases()))
@pytest.mark.slow
def test_generated_documents_have_exactly_the_asked_tokens(loaded, task, haystack):
    tok = loaded.tokenizer
    for n in LENGTHS:
        for seed in range(4):
            depth = random.Random(seed * 7919 + n).random()  # the depths bench/results.py draws
            doc = tasks.make(task, tok, n, depth=depth, seed=seed, haystack=haystack)
            count = len(tok(doc.text).input_ids)
            assert count == doc.meta["tokens"] == n, (task, haystack, n, seed, count)
            assert doc.meta["short_by"] == 0 and doc.meta["target"] == n
            if task != tasks.LM:
                if doc.meta.get("answer_span") is None:  # a list answer (RULER-style): no one span holds it
                    assert task in tasks.ruler.LIST_ANSWERS, task
                    for a, b in doc.meta.get("answer_spans", []):  # each asked number where it stands
                        assert doc.text[a:b] in doc.expected
                else:
                    a, b = doc.meta["answer_span"]
                    assert doc.text[a:b] == doc.expected
                assert doc.text[slice(*doc.question_span)] in doc.text[-300:]


@needs_model
def test_the_tour_length_is_exactly_l_tr_and_the_pad_keeps_records_whole(loaded):
    """The pass key at L_tr (the tour's step 1) has L_tr tokens; a line record's pad never adds a value."""
    tok = loaded.tokenizer
    doc = tasks.make("passkey", tok, loaded.train_length, depth=0.5, seed=0)
    assert len(tok(doc.text).input_ids) == loaded.train_length
    for seed in range(6):
        line = tasks.make("line", tok, 1001, depth=0.4, seed=seed)
        values = re.findall(r"^line (\S+): REGISTER_CONTENT is (\d+)$", line.text, flags=re.M)
        labels = [lab for lab, _ in values]
        assert len(labels) == len(set(labels))  # unique labels, one number each
        assert labels.count(line.meta["line_index"]) == 1
        assert len(re.findall(r"REGISTER_CONTENT is \d", line.text)) == len(values)  # no partial line with a number


def test_exact_with_a_byte_tokenizer():
    """ByT5's bytes: every generated task exact at a few lengths (the closer cuts words by characters)."""
    from transformers import ByT5Tokenizer

    byt5 = ByT5Tokenizer()
    for task in tasks.GENERATED:
        for n, seed in ((900, 0), (1501, 1), (2048, 2)):
            doc = tasks.make(task, byt5, n, depth=0.3, seed=seed)
            assert len(byt5(doc.text)["input_ids"]) == doc.meta["tokens"] == n, (task, n, seed)


# -- 3. the meters' legend ----------------------------------------------------------------------------


def test_meters_legend_keeps_its_brackets():
    """The meters the Explore page shows are drawn by ui/scrubber.js (``buildMeter``): its legend names each mark
    once, each bracket closed."""
    from pathlib import Path

    js = (Path(__file__).resolve().parents[2] / "ui" / "scrubber.js").read_text(encoding="utf-8")
    start = js.index("function buildMeter(")
    body = js[start : js.index("\nfunction ", start + 1)]
    shown = re.findall(r'textContent = "([^"]*)";', body)
    assert shown == ["at L_tr (tau = 1)", "here at tau = 1"]
    assert '? "chosen s" : "chosen tau";' in body  # the bars' entry names the slider's axis
    # its key shows the bars' three colours, not a green square over red and orange bars (issue 50, point 8)
    assert re.search(r'\["#2ca02c", "#ff9f1c", "#d62728"\]\.forEach\(\(c, i\) => svg\("rect"', body)
    for name in shown:
        assert name.count("(") == name.count(")"), name


# -- 4. the tour --------------------------------------------------------------------------------------


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text.strip()) if s]


def test_tour_step_4_is_two_sentences_on_the_page_with_the_detail_aside():
    from ui.tour import TOUR

    step = TOUR[3]
    assert len(_sentences(step["text"])) <= 2, _sentences(step["text"])
    assert "reached the L_tr line" in step["text"] and "ends short of the line" in step["text"]
    assert "grid" not in step["text"] + step["more"]  # one meaning of "the grid": the scrubber's frames (issue 50)
    assert "per-layer alignment" in step["more"] and "gap" in step["more"]
    assert "exactly L_tr tokens" in TOUR[0]["text"]


@needs_model
@pytest.mark.usefixtures("one_thread")
def test_tour_step_2_describes_what_the_default_model_shows(loaded):
    """At 8x L_tr, tau = 1 (pass key, seed 0, depth 50 %): the needle's peak in the question profile is lower
    but still above every filler token, the filler's share of the question's attention grows, and the answer
    is wrong with the key's own digits; at L_tr it is right (the numbers of the step's "more")."""
    from core.runs import engine
    from ui import cache
    from ui.tour import TOUR

    probes = cache.explore_probes(loaded.n_layers - 1, None)
    intro = len(loaded.tokenizer(tasks.PASSKEY_INTRO, add_special_tokens=False).input_ids) + 1
    seen = {}
    for mult in (1, 8):
        doc = tasks.make("passkey", loaded.tokenizer, mult * loaded.train_length, depth=0.5, seed=0)
        res = engine.run(loaded, doc, Choice.of(tau=1.0), engine.Pass(probes=probes))
        (a, b), (qa, _qb) = res.needle_tokens, res.question_tokens
        filler = np.zeros(res.tokens, bool)
        filler[intro : qa - 1] = True
        filler[a:b] = False
        prof = res.probes.profile
        seen[mult] = dict(
            res=res,
            needle_peak=prof[:, a:b].max(1),
            filler_peak=prof[:, filler].max(1),
            filler_share=prof[:, filler].sum(1),
            needle_share=prof[:, a:b].sum(1),
        )
    one, eight = seen[1], seen[8]
    assert one["res"].correct and not eight["res"].correct
    assert sorted(eight["res"].answer) == sorted(eight["res"].expected)  # the key's digits, wrong order
    for layer in (1, 2):
        assert eight["needle_peak"][layer] < one["needle_peak"][layer]  # lower ...
        assert eight["needle_peak"][layer] > 5 * eight["filler_peak"][layer]  # ... but still a peak
        assert eight["filler_share"][layer] > one["filler_share"][layer] + 0.15  # the filler takes more in total
        assert eight["needle_share"][layer] < one["needle_share"][layer]
    # the figures quoted in the step's detail
    more = TOUR[1]["more"]
    for value in (one["needle_peak"][1], eight["needle_peak"][1], one["needle_peak"][2], eight["needle_peak"][2]):
        assert f"{value:.3f}" in more, (value, more)
    for value in (one["filler_share"][2], eight["filler_share"][2]):
        assert f"{100 * value:.0f} %" in more, (value, more)
    assert f"{eight['res'].answer} for the key {eight['res'].expected}" in more


@needs_model
@pytest.mark.usefixtures("one_thread")
def test_tour_step_4_numbers_are_algorithm_1s(loaded):
    """The detail of step 4: Algorithm 1 (Pmax) at 8x does not reach the L_tr line; mean Pmax, reference, gap and
    the per-layer values are the ones quoted."""
    from core.runs import engine
    from core.runs.settings import DocumentRequest
    from ui import cache
    from ui.tour import TOUR

    clear_app_caches()
    req = DocumentRequest(task="passkey", tokens=8 * loaded.train_length, depth=0.5, seed=0)
    tau, info = cache.resolve_tau(loaded, req, "pmax")
    assert float(tau) == 0.5 and info["reached"] is False
    more = TOUR[3]["more"]
    run = cache.run(
        loaded, req, Choice.of(tau=tau), engine.Pass(probes=cache.explore_probes(loaded.n_layers - 1, None))
    )
    ref = cache.run_reference(loaded, req)
    assert f"{run.pmax:.4f} against {info['reference']:.4f} at L_tr" in more
    assert f"gap −{abs(info['gap']):.4f}" in more and info["gap"] < 0
    quoted = (
        ", ".join(f"{v:.3f}" for v in run.probes.layer_pmax)
        + " against "
        + ", ".join(f"{v:.3f}" for v in ref.probes.layer_pmax)
    )
    assert quoted in more
    clear_app_caches()


@needs_model
def test_a_new_session_lands_with_the_tour_open_at_its_first_step():
    """Issue 59: the first page spoke of nothing (1x, both cards agree). A session opened without a link lands with
    step 1 open, its sentence on the page; a link's own settings keep their view (no step opened over them)."""
    from streamlit.testing.v1 import AppTest

    from support.app import APP, TIMEOUT
    from ui.tour import TOUR

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert at.session_state["tour_step"] == 0
    assert any(TOUR[0]["title"] in i.value for i in at.info)
    linked = AppTest.from_file(APP, default_timeout=TIMEOUT)
    linked.query_params.update(tokens="8x")
    linked.run()
    assert "tour_step" not in linked.session_state or linked.session_state["tour_step"] is None
