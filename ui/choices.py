"""The choices a session makes in the sidebar and on the pages: their keys, defaults and ranges.

Why a module of its own: the sidebar (:mod:`ui.sidebar`) draws these
choices and a link (:mod:`ui.url`) writes its values into them, so both need
the same keys and ranges. Kept here, below both, the sidebar calls the URL
and the URL never imports the sidebar (no cycle).

Kept across page changes by Streamlit itself: every widget of a choice is
drawn with ``key=`` and ``persist_state=KEEP`` ("session"), so its value
outlives the page change, a fragment rerun before it, and the widget being
hidden (docs/app.md, "Pages and how choices are kept").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import streamlit as st

from core.mechanics.attention import ROPE, family_of
from core.models import Loaded, bundled_specs, default_model, registry
from core.runs import methods, temperature
from core.values import positions
from core.values.schedule import Schedule

ENV_MODEL = "AAE_MODEL"  # a folder or name: the app's default model when set (tests point it at a tiny model)
#: The tau slider's range and step (the app's sliders, the scrubber's axis, a link's ``tau=``): from the refined
#: searches' floor (:data:`core.runs.temperature.TAU_FLOOR`) to 1. Not :data:`core.values.schedule.TAU_MIN`, the bound of any
#: schedule a file or the library may hold.
SLIDER_MIN, SLIDER_MAX, SLIDER_STEP = temperature.TAU_FLOOR, 1.00, 0.01
COS_MIN, COS_STEP = 1.0, 0.5  # the CosScale slider (its top depends on the model: cos_range)

NEEDLE_MODES = ("pass key sentence", "my needle + question", "no needle, my question")

#: The filler choices the sidebar offers (the training pool stays out: it is what the models were trained on).
HAYSTACK_CHOICES = {"default": "the task's own (the paper's)", "corpus-eval": "held-out corpus prose"}
DEFAULTS: dict[str, Any] = {
    "model_choice": None,  # filled from AAE_MODEL / the bundled default
    "model_other": "",
    "doc_mode": "Generate",
    "doc_task": "passkey",
    "doc_tokens": None,  # filled with L_tr once the model is known
    "doc_depth": 50,
    "doc_seed": 0,
    "doc_haystack": "default",
    "doc_text": "",
    "doc_needle_mode": NEEDLE_MODES[0],
    "doc_needle": "",
    "doc_question": "",
    "doc_expected": "",
    "tau_method": methods.FIXED,
    "tau_value": 1.0,
    "tgt_encoder": True,
    "tgt_decoder": False,
    "tgt_cross": False,
    "cos_scale": None,
    "pos_scheme": positions.PLAIN,  # a rotary model's position scheme (core.values.positions); a T5 model has none
}
#: A position scheme's parameters as number inputs, one key each (the scheme's defaults for this L_tr fill them).
SCHEME_PARAM_KEYS: dict[str, str] = {p: f"pos_{p}" for s in positions.REGISTRY.values() for p in s.params}
DEFAULTS.update({k: None for k in SCHEME_PARAM_KEYS.values()})
#: A method's own number (critical scaling's gamma, :class:`core.runs.methods.Param`) as a number input, one key each;
#: None (the box left empty) is the registry's default from the model's L_tr, so no model's default is stored.
METHOD_PARAM_KEYS: dict[str, str] = {m.param.name: f"tau_{m.param.name}" for m in methods.REGISTRY.values() if m.param}
DEFAULTS.update({k: None for k in METHOD_PARAM_KEYS.values()})
#: A choice's widget keeps its value for the whole session: ``st.selectbox(..., key=k, persist_state=KEEP)``.
#: Across page changes (also right after a fragment rerun) and while the widget is not drawn (Streamlit 1.67).
KEEP = "session"


def default_model_ref() -> str:
    """AAE_MODEL when set, else the bundled default, else the first registry model (may need the hub)."""
    env = os.environ.get(ENV_MODEL, "").strip()
    if env:
        return env
    return default_model() or next(iter(registry()))


def model_options() -> list[str]:
    """The env model (if any), bundled models, then the registry's hub models."""
    env = os.environ.get(ENV_MODEL, "").strip()
    opts = ([env] if env else []) + [s.name for s in bundled_specs()]
    opts += [n for n, s in registry().items() if not s.bundled and n not in opts]
    return opts


def model_labels() -> dict[str, str]:
    """The model box's labels of the bundled models: the name, with "(RoPE masked LM)" for a rotary encoder (its
    family read from its config.json, nothing loaded); other entries show as they are."""
    out = {}
    for spec in bundled_specs():
        try:
            raw = json.loads((Path(spec.source) / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and family_of(raw.get("model_type")) == ROPE:
            out[spec.name] = f"{spec.name} (RoPE masked LM)"
    return out


def masked_lm(loaded: Loaded) -> bool:
    """Whether the model is a rotary masked-LM encoder: its document is held-out prose with masked tokens, its
    score the masked tokens' accuracy and perplexity. Not a decoder-only LM (also rotary, but it reads a prompt and
    answers it, as T5 does): the one test the app's views use to tell the two rotary families apart."""
    return loaded.family == ROPE


def answers_free_questions(loaded: Loaded) -> bool:
    """Whether the model can answer a question of the person's own on pasted text: a real LLM (a decoder-only LM
    such as SmolLM2-135M) or an instruction-tuned hub T5 (Flan-T5). The bundled T5 models were trained by this
    project on its generated tasks only (a pass key, a line, a topic...): asked anything else, they answer with
    words of the text, confidently and wrongly (issue 59, point 4)."""
    return loaded.decoder_only or loaded.spec.kind == "flan-t5"


#: The real LLM the app offers for free questions (:data:`core.models.install.FETCHABLE`: installed on first use).
REAL_LLM = "smollm2-135m"


def put(key: str, value: Any) -> None:
    """Set a choice (its widget key, before its widget is drawn in this run)."""
    st.session_state[key] = value


def set_state(**values: Any) -> None:
    """For on_click callbacks (and components): set choices before the next run draws their widgets."""
    st.session_state.update(values)


def cos_range(loaded: Loaded) -> tuple[float, float]:
    """The CosScale slider's range for a cosine model (a link's ``s`` is checked against it too)."""
    return COS_MIN, float(max(4 * float(loaded.cosine_scale), 64.0))


def slider_tau(schedule: Any, rows: int) -> float:
    """The one display of a tau on a slider: a schedule's mean (per layer, head or row: over ``rows`` query rows)
    on the slider's step, inside its range. What the sidebar's slider, the scrubber and "use this tau" show.
    Adaptive temperature has no tau before a pass: its base, 1 (the text beside the slider says what it is,
    :data:`ui.page_state.ADAPTIVE_TEXT`)."""
    mean = Schedule.of(schedule).mean(rows)
    return float(np.clip(round(round(mean / SLIDER_STEP) * SLIDER_STEP, 2), SLIDER_MIN, SLIDER_MAX))
