"""One forward pass of a model under a position scheme: the one place a scheme reaches a model.

A position scheme (:mod:`core.values.positions`) is applied in two halves that must
agree: the model's rotary modules (the scheme's frequencies, or none at all
for a scheme that rectifies distances) and the attention function (mask rows
and rectified logits). Both read the same :class:`~core.values.positions.Bound` from
the attention call's context (``core.mechanics.attention._Call.positions``: the call
binds its choice's scheme at the lengths :func:`scheme_pass` gives it, once), for the enclosed pass: the
rotary modules through a subclass swapped in once
(:func:`core.mechanics.patches.rotate_per_call`), the attention function directly.
It is what every pass of a rotary model goes through:
:func:`core.runs.engine.run_encoded` (so Explore, sweeps and the passes of measured
methods, Algorithm 1 included, run under the scheme) and :func:`core.experiments.mlm.score`.

The scheme is bound per pass to the pass's own length (the padded batch's):
a calibration's L_tr reference passes get the scheme at L_tr, its passes at
L the scheme at L. That is why callers carry only their :class:`~core.values.choice.Choice`, whose
``scheme`` (a :class:`~core.values.positions.Scheme`) the attention call binds, rather than a
:class:`~core.values.positions.Bound`, which is fixed to one length; and why the scheme is taken from the
choice alone (a second scheme beside the choice could disagree with it).

Nothing of the shared model changes per pass: the context is per thread (and
per asyncio task), so two threads running two schemes on one model each get
their own, with no lock (the app, which serves many sessions from one cached
model, relies on it).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from core.errors import UserError
from core.mechanics import attention, patches
from core.mechanics.attention import CAUSAL_LM, ROPE, attention_call
from core.mechanics.run_pass import Pass
from core.values import positions
from core.values.choice import TRAINED, Choice

if TYPE_CHECKING:  # pragma: no cover
    from core.mechanics.probes import Recorder
    from core.models import Loaded


#: The families whose models rotate q and k (:data:`core.mechanics.attention.FAMILIES`): the rotary encoders and the
#: decoder-only LMs (Llama, Mistral, Qwen, Gemma 2, Phi-3, gpt-oss), every one of which holds a rotary module.
ROTARY_FAMILIES: tuple[str, ...] = (ROPE, CAUSAL_LM)


def rotary(loaded: "Loaded") -> bool:
    """Whether ``loaded`` rotates q and k: a rotary encoder or a decoder-only LM (T5 has its own relative bias)."""
    return loaded.family in ROTARY_FAMILIES


def check(loaded: "Loaded", scheme: positions.Scheme) -> None:
    """Refuse, in one line, a scheme this model cannot run: any scheme but the plain one on a non-rotary model.
    (The scheme's own values were checked when it was made, :meth:`core.values.positions.Scheme.of`.)"""
    if scheme.is_plain:
        return
    if not rotary(loaded):
        raise UserError(
            f"Position scheme '{scheme.name}' needs a rotary (RoPE) model; '{loaded.spec.name}' is a "
            f"{loaded.family} model with its own relative positions"
        )


def bound(loaded: "Loaded", scheme: positions.Scheme, tokens: int) -> positions.Bound | None:
    """The scheme bound for a pass of ``tokens`` tokens, or None for a model without rotary positions (checked:
    a non-plain scheme there is refused)."""
    check(loaded, scheme)
    if not rotary(loaded):
        return None
    check_rotation(loaded)
    return scheme.bind(loaded.train_length, tokens)


#: Models whose rotary config was found runnable (:func:`check_rotation`): asked once per model, not per pass.
_ROTATION_OK: "weakref.WeakSet" = weakref.WeakSet()


def check_rotation(loaded: "Loaded") -> None:
    """Refuse, in one line, a rotary model whose rotary modules hold frequencies its attention cannot apply (a
    ``partial_rotary_factor`` under a rope type that honours it on ModernBERT, which rotates the whole head; a
    ``head_dim`` narrower than the head): transformers' own model ends in a RuntimeError on a tensor size there
    (issue 47, point 3). The counts are read from the model's own modules' buffers."""
    model = loaded.model
    if model in _ROTATION_OK:
        return
    positions.check_rotation(model.config, positions.rotary_frequency_counts(model))
    _ROTATION_OK.add(model)


@contextlib.contextmanager
def scheme_pass(
    loaded: "Loaded",
    choice: Choice | None = None,
    how: Pass | None = None,
    recorder: "Recorder | None" = None,
    tokens: int | None = None,
) -> Iterator[positions.Bound | None]:
    """Run the enclosed forward pass(es) of ``loaded`` at ``tokens`` tokens (None: its training length) with
    ``choice`` (None: as trained), ``how`` and ``recorder``, under the choice's position scheme; yields the
    :class:`~core.values.positions.Bound` the attention call bound (None for a T5 model, which takes only the
    plain scheme). The model is exactly as before on exit, also after an error. See the module docstring for
    the lock."""
    choice = TRAINED if choice is None else choice
    n = tokens if tokens is not None else loaded.train_length
    b = bound(loaded, choice.scheme, n)  # the checks (a rotary model, its rotation), before any pass
    if b is None:
        with attention_call(choice, how, recorder):
            yield None
        return
    patches.rotate_per_call(loaded.model, attention.current_positions)  # done at load; a bare Loaded here
    with attention_call(choice, how, recorder, lengths=(loaded.train_length, n)):
        yield attention.current_call().positions


def attention_factor(loaded: "Loaded", b: positions.Bound | None) -> float:
    """The factor a frequency scheme puts on cos and sin (logits x its square) as it acts on this model: YaRN's
    0.1 ln s + 1 (or the one bound), 1 for every other scheme, and 1 for a cosine-attention model, whose
    normalisation of q and k cancels any factor on them."""
    if b is None or loaded.cosine or positions.FREQUENCIES not in b.scheme.changes:
        return 1.0
    config = loaded.model.config
    return float(b.frequencies(config, positions.layer_types(config)[0])[1])
