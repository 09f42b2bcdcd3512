"""The sidebar's Document box: generate a task's document at a length, or paste a text, and build it."""

from __future__ import annotations

import streamlit as st

from core.data import tasks
from core.errors import UserError
from core.experiments import mlm
from core.models import Loaded
from core.runs import engine
from core.runs.settings import DocumentRequest
from ui import cache, choices, fail

MULTIPLES = (1, 2, 4, 8, 16)


def _set_tokens(n: int) -> None:
    choices.put("doc_tokens", int(n))


def _read_upload() -> None:
    f = st.session_state.get("doc_file")
    if f is None:
        return
    try:
        choices.put("doc_text", f.getvalue().decode("utf-8"))
    except UnicodeDecodeError:
        st.session_state["upload_error"] = f"'{f.name}' is not UTF-8 text; save it as UTF-8 (.txt) and upload again."


#: What a masked-LM model's document is (the sidebar says it in place of the Source and Task boxes).
MASKED_DOC = (
    "**Masked tokens in held-out prose**: the held-out text of the seed at the chosen length, "
    f"{round(100 * mlm.MASK_RATE)} % of its tokens replaced by the mask token (positions drawn by the seed); "
    "the model fills them in."
)


#: Paste mode before anything is typed: what to do (not an error), and what a shared link carries.
PASTE_FIRST = (
    "**Paste mode.** Paste a text into the sidebar's *Your text* box (or upload a .txt file); its views "
    "appear here. A pass key sentence is inserted at the chosen depth unless you choose another needle."
)
PASTE_NOT_IN_LINK = (
    "A shared link does not carry the pasted text (too long for an address): it opens in Generate "
    "mode. Send the text along, or export the settings."
)


def reads_prose(loaded: Loaded) -> bool:
    """Whether the model's document is held-out prose (task ``lm``): a T5 language model, or a masked-LM encoder.
    A decoder-only LM starts on a pass key, as T5 does: it answers the question at the prompt's end."""
    return loaded.language_model or choices.masked_lm(loaded)


#: Paste mode on a model trained on the generated tasks only (issue 59, point 4): what it can answer.
PASS_KEYS_ONLY = (
    "**{name} was trained on this project's generated tasks only**: it finds a pass key (or a line, a topic) "
    "and answers nothing else. A question of your own gets words of your text back, right or not. Free questions "
    "need a real LLM: **SmolLM2-135M** (a decoder-only LLM, L_tr = 8,192) or an instruction-tuned T5 "
    "(flan-t5-*, from the hub)."
)
#: Paste mode on a model that answers free questions.
FREE_QUESTIONS = (
    "**{name}** answers questions of your own on your text (a real LLM): the question goes last in its prompt, and "
    "Explore's maps show where its rows look."
)


def _use_real_llm() -> None:
    choices.set_state(model_choice=choices.REAL_LLM, model_other="")


def _free_question_note(loaded: Loaded, mode: str) -> None:
    """Paste mode's word on questions: which models can answer one of the person's own, and (when this one cannot)
    a button to the real LLM: it switches to it when installed, else the Model box offers its fetch (size and time
    said there, nothing downloaded until pressed)."""
    from core.models import install

    sb = st.sidebar
    name = loaded.spec.name
    if choices.answers_free_questions(loaded):
        sb.caption(FREE_QUESTIONS.format(name=name))
        return
    own_question = mode != choices.NEEDLE_MODES[0]
    (sb.warning if own_question else sb.caption)(PASS_KEYS_ONLY.format(name=name))
    have = install.installed(choices.REAL_LLM)
    sb.button(
        "Use SmolLM2-135M for my question" if have else "Get SmolLM2-135M (93 MB, once) for my question",
        key="paste_real_llm",
        on_click=_use_real_llm,
        help="Switches the Model box to SmolLM2-135M-Instruct"
        + ("." if have else ", which then offers to fetch it (its size and time said before anything downloads)."),
    )


def document_section(loaded: Loaded) -> tuple[DocumentRequest, tasks.Document, int]:
    ss, sb = st.session_state, st.sidebar
    lt = loaded.train_length
    if ss.get("_ltr") != (ss["_model_ref"], lt) or ss.get("doc_tokens") is None:
        first = ss.get("_ltr") is None
        if not first or ss.get("doc_tokens") is None:
            choices.put("doc_tokens", lt)  # a new model: start at its training length
        # ... and with its kind of document, unless the page was opened from a link that names a task
        if not (first and "task" in st.query_params) and (reads_prose(loaded) or ss.get("doc_task") == tasks.LM):
            choices.put("doc_task", tasks.LM if reads_prose(loaded) else "passkey")
        ss["_ltr"] = (ss["_model_ref"], lt)
    if ss.get("_url_multiple"):
        choices.put("doc_tokens", int(ss.pop("_url_multiple")) * lt)
    sb.subheader("Document")
    if choices.masked_lm(loaded):  # a masked-LM encoder: held-out prose with masked tokens, nothing else to choose
        choices.put("doc_mode", "Generate")
        choices.put("doc_task", tasks.LM)
        sb.caption(MASKED_DOC)
    else:
        sb.radio("Source", ("Generate", "Paste"), key="doc_mode", persist_state=choices.KEEP, horizontal=True)
    if ss["doc_mode"] == "Generate":
        if ss.get("doc_task") not in tasks.GENERATED:
            choices.put("doc_task", tasks.LM if reads_prose(loaded) else "passkey")
        if not choices.masked_lm(loaded):  # T5 and a decoder-only LM read every task as a prompt and answer it
            sb.selectbox(
                "Task",
                tasks.GENERATED,
                key="doc_task",
                persist_state=choices.KEEP,
                help="passkey: a 5-digit key in filler; line/topic: LongChat retrieval; multidoc: QA over "
                "documents; code: a key in Python; lm: continue held-out prose (perplexity, for LM models).",
            )
        sb.number_input(
            "Length in tokens",
            min_value=16,
            max_value=4_000_000,
            step=max(1, lt // 4),
            key="doc_tokens",
            persist_state=choices.KEEP,
        )
        row = sb.container(horizontal=True, gap="small")
        for k in MULTIPLES:
            row.button(
                f"{k}×", key=f"len_{k}x", on_click=_set_tokens, args=(k * lt,), help=f"{k} × L_tr = {k * lt:,} tokens"
            )
        if ss["doc_task"] != tasks.LM:  # an LM sequence has no needle
            sb.slider("Needle depth (%)", 0, 100, step=5, key="doc_depth", persist_state=choices.KEEP)
        haystack = "default"
        if ss["doc_task"] in tasks.HAYSTACK_TASKS:
            sb.selectbox(
                "Filler",
                choices.HAYSTACK_CHOICES,
                key="doc_haystack",
                persist_state=choices.KEEP,
                format_func=choices.HAYSTACK_CHOICES.get,
                help="The paper's pass key filler is one fixed text: its documents differ only in the key. "
                "Held-out corpus prose makes every seed a different haystack.",
            )
            haystack = ss["doc_haystack"]
        sb.number_input("Seed", min_value=0, max_value=10**9, step=1, key="doc_seed", persist_state=choices.KEEP)
        req = DocumentRequest(
            task=ss["doc_task"],
            tokens=int(ss["doc_tokens"]),
            depth=ss["doc_depth"] / 100,
            seed=int(ss["doc_seed"]),
            haystack=haystack,
        )
    else:
        sb.text_area(
            "Your text",
            key="doc_text",
            persist_state=choices.KEEP,
            height=150,
            placeholder="Paste the text to search in…",
        )
        sb.file_uploader("…or upload a .txt file", type=["txt"], key="doc_file", on_change=_read_upload)
        sb.caption(PASTE_NOT_IN_LINK)
        if ss.get("upload_error"):
            st.error(ss.pop("upload_error"))
        if not (ss.get("doc_text") or "").strip():  # nothing typed yet: say what to do, not an error (issue 50)
            st.info(PASTE_FIRST)
            st.stop()
        sb.radio("Needle", choices.NEEDLE_MODES, key="doc_needle_mode", persist_state=choices.KEEP)
        mode = ss["doc_needle_mode"]
        _free_question_note(loaded, mode)
        needle = question = expected = None
        if mode == choices.NEEDLE_MODES[1]:
            sb.text_input(
                "Needle sentence",
                key="doc_needle",
                persist_state=choices.KEEP,
                placeholder="The secret colour is teal.",
            )
        if mode != choices.NEEDLE_MODES[0]:
            sb.text_input(
                "Question", key="doc_question", persist_state=choices.KEEP, placeholder="What is the secret colour?"
            )
            sb.text_input("Expected answer", key="doc_expected", persist_state=choices.KEEP, placeholder="teal")
            question, expected = ss["doc_question"] or None, ss["doc_expected"] or None
            needle = ss["doc_needle"] if mode == choices.NEEDLE_MODES[1] else ""
            if mode == choices.NEEDLE_MODES[1] and not (needle or "").strip():
                fail(UserError("Type the needle sentence to insert (or choose 'pass key sentence')."))
        if mode != choices.NEEDLE_MODES[2]:
            sb.slider("Needle depth (%)", 0, 100, step=5, key="doc_depth", persist_state=choices.KEEP)
        sb.number_input("Seed", min_value=0, max_value=10**9, step=1, key="doc_seed", persist_state=choices.KEEP)
        req = DocumentRequest(
            task="text",
            depth=ss["doc_depth"] / 100,
            seed=int(ss["doc_seed"]),
            text=ss["doc_text"],
            needle=needle,
            question=question,
            expected=expected,
        )
    try:
        doc = cache.document(loaded, req)
        n = cache.token_count(loaded, req)
    except UserError as err:
        fail(err)
    cap = engine.max_tokens(loaded)
    sb.caption(f"**{n:,} tokens** = **{n / lt:.2f}× L_tr** · this machine can run about {cap:,} tokens now")
    return req, doc, n
