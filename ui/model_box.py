"""The sidebar's Model box: which model a page runs, loaded once per process (:func:`ui.cache.model`)."""

from __future__ import annotations

import streamlit as st

from core.errors import UserError
from core.models import Loaded
from ui import cache, choices, fail

OTHER_HINT = "…or a hub id / local folder (overrides the list)"


def chosen_model_ref() -> str:
    """The model the Model boxes name now: the typed hub id or folder, else the list's choice."""
    return (st.session_state.get("model_other") or "").strip() or st.session_state["model_choice"]


def model_section() -> Loaded:
    """Draw the Model box and load its model (a user error stops the page)."""
    sb = st.sidebar
    sb.subheader("Model")
    labels = choices.model_labels()
    sb.selectbox("Model", choices.model_options(), key="model_choice", persist_state=choices.KEEP, format_func=lambda r: labels.get(r, r),
                 help="Bundled models first (T5 retrieval and language models, and rotary masked-LM encoders: 'RoPE'), "
                      "then T5 models from the Hugging Face hub (need internet or a local copy).")
    sb.text_input(OTHER_HINT, key="model_other", persist_state=choices.KEEP, placeholder="google/flan-t5-base or ./my-t5-folder")
    ref = chosen_model_ref()
    st.session_state["_model_ref"] = ref
    try:
        loaded = cache.model(ref)
    except UserError as err:
        fail(err)
    d = loaded.describe()
    sb.caption(
        f"**{d['name']}** · L_tr = **{d['train_length']:,}** tokens · {d['parameters'] / 1e6:.2f} M parameters · "
        f"{d['layers']} layers × {d['heads']} heads (d_kv {d['d_kv']}) · {d['device']} / {d['dtype']} · "
        f"attention: {d['attention']} · "
        + ("T5: learned relative bias, encoder-decoder" if loaded.seq2seq else
           "RoPE: rotary positions, masked-LM encoder (fills masked tokens; no decoder)")
    )
    return loaded
