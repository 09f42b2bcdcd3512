"""Put a chosen tau on a T5, ModernBERT or decoder-only model you hold, for your own ``generate`` or forward calls.

Two ways:

* a context manager, for a block of code::

      from core.runs.apply import apply

      with apply(model, tau=0.7):                    # one number: every encoder layer and head
          out = model.generate(**tok(text, return_tensors="pt"), max_new_tokens=20)
      with apply(model, schedule=[0.8, 0.7, 0.7]):   # one tau per encoder layer (or per layer and head)
          ...
      with apply(model, settings="settings.json"):   # the app's export (core.runs.settings.Settings)
          ...

  Inside the block the model runs our registered attention function
  (``attn_implementation="aligned"``, :mod:`core.mechanics.attention`) and the schedule
  travels in :mod:`core.mechanics.attention`'s context variable (``attention_call``), so
  it is seen by everything that runs *in this thread* inside the block:
  ``model.generate``, a pipeline built on the model, your own forward calls.
  On exit the model's previous attention implementation is put back exactly
  (the top config and every sub-model config, e.g. T5's encoder and decoder
  stacks) and nothing of ours is left on it. A block is closed in the thread
  (and asyncio task) that opened it, innermost first; an exit from anywhere
  else is a :class:`core.errors.UserError` that changes nothing, so the
  opening thread keeps its tau and still closes the block itself. Blocks on
  one model may be open in several threads at once, each thread seeing its
  own tau.

* a permanent variant, for a model that should always run with the tau (a
  server, a model handed to code you do not control, work in other threads)::

      from core.runs import apply
      apply.install(model, tau=0.7)
      ...                                            # any thread, any time
      apply.uninstall(model)                         # back to exactly what it was

  ``install`` registers our attention function bound to the settings under a
  name of its own and points the model's configs at it
  (:func:`core.mechanics.attention.standing`): the settings reach the attention through
  transformers' own dispatch whenever no ``attention_call`` is active, so two
  installed models keep their own tau and nothing is pinned on the model's
  modules. An explicit ``attention_call``/``apply`` block still wins over it.

Architectures: T5-family models whose attention goes through transformers'
``AttentionInterface`` and passes T5's relative position bias to it. In
transformers 5.23 that is ``model_type`` ``t5``, ``mt5`` and ``umt5``: the
``*ForConditionalGeneration``, ``*EncoderModel``, ``*Model``,
``*ForSequenceClassification``, ``*ForTokenClassification`` and
``*ForQuestionAnswering`` classes of T5, MT5 and UMT5 (Flan-T5, T5 v1.1 /
LM-adapted, CodeT5+ 220m/770m, mT5, umT5 checkpoints load as these). UMT5
has its own bias in every layer; the schedule applies to each layer's
logits the same way. Rotary encoders of ``model_type`` ``modernbert``
(``ModernBertModel``, ``*ForMaskedLM``, ``*ForSequenceClassification``,
``*ForTokenClassification``, ``*ForQuestionAnswering``) run through the same
attention function: they have encoder self-attention only, so a schedule
targets it alone. Decoder-only causal LMs of ``model_type`` ``llama``
(SmolLM2), ``mistral``, ``qwen2``, ``qwen3``, ``gemma2``, ``phi3`` and
``gpt_oss`` (``*ForCausalLM``, ``*Model``) run through it too: their one
attention is causal self-attention (the ``decoder`` kind), so with no
targets given the schedule targets it (``targets=("decoder",)``), and
``generate`` with a KV cache runs every step through it. Anything else (BART, GPT-2, LongT5's local attention,
other encoder-only BERTs, ...) is refused with a :class:`core.errors.UserError`.

What is *not* done here: re-resolving a length-dependent method (log-length,
InfoScale, Algorithm 1, Prop. 1/2, per-layer) at your inputs' length. The
stored schedule is used as is, whatever ``chosen_at`` says; for per-document
re-resolution use the CLI (``python -m core run|sweep --settings FILE``),
which has the document at hand.
"""

from __future__ import annotations

import contextvars
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from core.errors import UserError
from core.kinds import DECODER, ENCODER
from core.mechanics import attention, patches
from core.mechanics.attention import attention_call, family_of
from core.mechanics.run_pass import DEFAULT_PASS, Pass
from core.runs.settings import Settings
from core.values.choice import Choice
from core.values.validation import Bytes, Positive, validate

#: transformers ``model_type`` values whose attention we can take over (every family of core.mechanics.attention.FAMILIES).
SUPPORTED_TYPES = tuple(t for types in attention.FAMILIES.values() for t in types)
#: The model classes that work (per supported type), for messages and docs.
SUPPORTED_CLASSES = tuple(
    f"{p}{c}"
    for p in ("T5", "MT5", "UMT5")
    for c in (
        "ForConditionalGeneration",
        "EncoderModel",
        "Model",
        "ForSequenceClassification",
        "ForTokenClassification",
        "ForQuestionAnswering",
    )
) + tuple(
    f"ModernBert{c}"
    for c in ("ForMaskedLM", "Model", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")
)
#: Guards every model's :class:`_Hold` (its creation, its counts, the switch and the restore): blocks opened and
#: closed in several threads at once on one model must not both snapshot the model or both restore it. Held
#: only while configs are read or written, never across a forward pass.
_LOCK = threading.RLock()
#: The :class:`_Block` objects open in this thread (context), innermost last: how a block knows, before it
#: touches anything, that it is being closed where it was opened and in order (see :meth:`_Block.__exit__`).
_OPEN: contextvars.ContextVar[tuple] = contextvars.ContextVar("aligned_apply_blocks", default=())


# -- checks and settings ---------------------------------------------------------


def check_supported(model) -> None:
    """Raise :class:`UserError` unless ``model`` is a T5/MT5/UMT5, ModernBERT or decoder-only (Llama, Mistral, Qwen2/3,
    Gemma 2, Phi-3, gpt-oss) model whose attention we can take over."""
    name = type(model).__name__
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    works = ", ".join(
        SUPPORTED_CLASSES[:3] + SUPPORTED_CLASSES[6:9] + SUPPORTED_CLASSES[12:15] + SUPPORTED_CLASSES[18:20]
    )
    if not isinstance(model, torch.nn.Module) or model_type not in SUPPORTED_TYPES:
        raise UserError(
            f"core.runs.apply does not support {name} (model_type {model_type!r}): the temperature method needs "
            f"an attention that runs through ours (T5's relative-position bias, a ModernBERT rotary encoder, or a "
            f"decoder-only LM of the families {', '.join(attention.FAMILIES[attention.CAUSAL_LM])}). "
            f"It works with model_type {', '.join(SUPPORTED_TYPES)}: "
            f"{works} (and their sequence/token classification and QA heads), and the decoder-only "
            f"*ForCausalLM / *Model classes (LlamaForCausalLM, ...)."
        )
    if not hasattr(model, "set_attn_implementation") or not type(model)._can_set_attn_implementation():
        raise UserError(f"{name} cannot switch its attention implementation in this transformers version.")


def _n_layers_heads(model) -> tuple[int, int, int]:
    """(encoder layers, decoder layers, heads); a rotary encoder has no decoder (its count is the encoder's)."""
    c = model.config
    if family_of(c.model_type) in (attention.ROPE, attention.CAUSAL_LM):
        return int(c.num_hidden_layers), int(c.num_hidden_layers), int(c.num_attention_heads)
    enc = int(c.num_layers)
    dec = int(getattr(c, "num_decoder_layers", None) or enc)
    return enc, dec, int(c.num_heads)


def choice_for(
    model,
    tau: float | None = None,
    *,
    schedule=None,
    settings=None,
    targets=None,
    cosine_scale: float | None = None,
    chunk_bytes: int | None = None,
) -> tuple[Choice, Pass]:
    """Merge the ways of giving a schedule into the run's two values, checked against ``model``: the
    :class:`~core.values.choice.Choice` (what) and the :class:`~core.mechanics.run_pass.Pass` (how: here only the
    block budget ``chunk_bytes``).

    ``tau`` (one number) and ``schedule`` (per layer, or per layer and head)
    are alternatives. ``settings`` is a :class:`core.runs.settings.Settings` or the
    path of its JSON; explicit ``tau``/``schedule``/``targets``/``cosine_scale``
    override what it holds. Its stored schedule is used as is (see the module
    docstring: no re-resolution at another length here). The targets are checked by
    :meth:`Choice.of` / :meth:`Choice.with_` (the one check of them), as is the tau.
    """
    if tau is not None and schedule is not None:
        raise UserError("Give either tau (one number) or schedule (per layer / per layer and head), not both")
    value = tau if tau is not None else schedule
    # the bounds every entry point uses (core.values.validation), not a second set written here
    cosine_scale = None if cosine_scale is None else validate(Positive, cosine_scale, "cosine_scale")
    chunk_bytes = None if chunk_bytes is None else validate(Bytes, chunk_bytes, "chunk_bytes")
    overrides = {k: v for k, v in dict(targets=targets, cosine_scale=cosine_scale).items() if v is not None}
    if settings is not None:  # the one Settings -> run conversion; its Choice is handed on (explicit arguments win)
        chosen = settings if isinstance(settings, Settings) else Settings.load(Path(settings))
        choice = chosen.to_choice(value)
        if not choice.scheme.is_plain:
            raise UserError(
                f"The settings hold position scheme '{choice.scheme}': core.runs.apply puts a tau on a model, "
                "not a position scheme; run them with `python -m core run --settings FILE` (or `mlm`)"
            )
        choice = choice.with_(**overrides) if overrides else choice  # the targets' one check
    else:
        if value is None:
            raise UserError("No tau given: pass tau=0.7, schedule=[...] or settings=FILE")
        enc, _, heads = _n_layers_heads(model)
        try:
            choice = Choice.of(tau=value, **overrides)  # the one check of a tau
        except UserError as err:
            raise UserError(
                f"Bad tau schedule for {type(model).__name__} ({enc} layers x {heads} heads): {err}"
            ) from None
    if family_of(model.config.model_type) == attention.ROPE and any(t != ENCODER for t in choice.targets):
        raise UserError(f"{type(model).__name__} has encoder self-attention only: targets can only be {ENCODER!r}")
    if family_of(model.config.model_type) == attention.CAUSAL_LM:
        # a decoder-only model has one attention, its causal self-attention (core.kinds.DECODER): with no targets
        # given (here or in the settings) the schedule goes there; targets that name only others are refused
        if targets is None and settings is None:
            choice = choice.with_(targets=(DECODER,))
        elif DECODER not in choice.targets:
            raise UserError(
                f"{type(model).__name__} is a decoder-only model: its one attention is causal "
                f"self-attention, targets {DECODER!r} (got {', '.join(choice.targets) or 'none'})"
            )
    enc, dec, heads = _n_layers_heads(model)
    schedule = choice.tau
    try:
        if schedule.rows is None:
            schedule.matrix(enc, heads)  # does it fit this model?
    except ValueError as err:
        raise UserError(f"Bad tau schedule for {type(model).__name__} ({enc} layers x {heads} heads): {err}") from None
    if schedule.ndim >= 1 and dec != enc and any(t != ENCODER for t in choice.targets):
        raise UserError(
            f"A per-layer schedule has {enc} values (encoder layers) but the decoder has {dec} layers: "
            "use one number for decoder/cross targets"
        )
    return choice, (DEFAULT_PASS if chunk_bytes is None else Pass(chunk_bytes=chunk_bytes))


# -- switching the attention implementation --------------------------------------


@dataclass
class _Hold:
    """Who needs the model switched to our attention, and what it was before anyone did.

    One per model, so :func:`apply` blocks and :func:`install` can nest in any
    order: the model is switched when the first of them starts and put back
    to what it was *before the first* only when the last one ends. (A
    snapshot per call restored the wrong state: ``install`` inside an
    ``apply`` block lost its attention when the block ended, and
    ``uninstall`` then left the model on ours.)
    """

    before: patches.Patched  # what switching the model on changed (core.mechanics.patches.patch); undone at the end
    blocks: int = 0
    installed: bool = False
    standing: str | None = None  # the implementation name install() registered (core.mechanics.attention.standing)
    unpointed: list | None = None  # what the configs named before install() pointed them at it


def _hold(model) -> _Hold:
    """The model's :class:`_Hold`, made (and the model switched to ours) by the first taker. Call under :data:`_LOCK`."""
    hold = patches.hold_of(model)
    if hold is None:
        # our attention in every config (left as it is where it is ours already) and T5's bias as one vector per head
        hold = _Hold(patches.patch(model, implementation=attention.ATTN_NAME))
        patches.set_hold(model, hold)
    return hold


def _let_go(model, hold: _Hold) -> None:
    """Restore the model when nobody needs ours any more. Call under :data:`_LOCK`."""
    if hold.blocks <= 0 and not hold.installed and patches.drop_hold(model, hold):
        hold.before.undo()


# -- the public API --------------------------------------------------------------


def _thread_name(ident: int | None) -> str:
    for t in threading.enumerate():
        if t.ident == ident:
            return repr(t.name)
    return f"#{ident} (no longer running)"


class _Block:
    """One ``with apply(...)`` block: what :func:`apply` returns. Single use; closed where it was opened.

    Why a class and not ``contextlib.contextmanager``: the schedule is set in
    a context variable of the opening thread, and a ContextVar can only be
    reset in the context that set it. A generator-based block closed from
    another thread died half-way: ``ValueError: <Token ...> was created in a
    different Context`` from the reset, after the model had been restored,
    with the tau left active in the opening thread for good and the block
    impossible to close there any more. Here ``__exit__`` first checks that it
    runs in the opening thread, in that thread's context, on the innermost
    open block, and refuses otherwise with a :class:`UserError` *before
    changing anything*: the opening thread keeps its block (its tau and the
    model's attention) and can still close it, after which everything is as
    it was before the block.
    """

    def __init__(self, model, choice: Choice, how: Pass, recorder) -> None:
        self._model = model
        self.choice, self.how = choice, how
        self._recorder = recorder
        self._state = "new"  # new -> open -> closed
        self._thread: int | None = None
        self._open_token: contextvars.Token | None = None
        self._call = None
        self._hold: _Hold | None = None

    def __enter__(self) -> Choice:
        if self._state != "new":
            raise UserError("An apply block can be entered once: call apply(model, ...) again for another block.")
        with _LOCK:
            hold = _hold(self._model)
            hold.blocks += 1
        try:
            self._call = attention_call(self.choice, self.how, self._recorder)
            self._call.__enter__()
        except BaseException:
            with _LOCK:
                hold.blocks -= 1
                _let_go(self._model, hold)
            raise
        self._hold, self._thread, self._state = hold, threading.get_ident(), "open"
        self._open_token = _OPEN.set(_OPEN.get() + (self,))
        return self.choice

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._state != "open":
            raise UserError(
                f"This apply block is {'not open yet' if self._state == 'new' else 'already closed'}: "
                "close an apply block once, after entering it."
            )
        here = threading.get_ident()
        if here != self._thread:
            raise UserError(
                f"Close an apply block in the thread that opened it: opened in thread {_thread_name(self._thread)}, "
                f"closed in {_thread_name(here)}. The block stays open there (its tau and the model's attention); "
                "for a model shared by threads use core.runs.apply.install."
            )
        if _OPEN.get()[-1:] != (self,):
            raise UserError(
                "Close an apply block in the thread (and asyncio task or context) that opened it, innermost block "
                "first: this one is not the innermost block open here. It stays open."
            )
        try:
            _OPEN.reset(self._open_token)  # refused without side effects in another context (a copied one)
        except ValueError:
            raise UserError(
                "Close an apply block in the thread (and asyncio task or context) that opened it: this one was "
                "opened in another context of this thread. It stays open."
            ) from None
        self._state = "closed"
        try:
            self._call.__exit__(exc_type, exc, tb)  # same context, innermost: the reset cannot fail now
        finally:
            with _LOCK:
                self._hold.blocks -= 1
                _let_go(self._model, self._hold)
        return False  # an exception from the block goes on


def apply(
    model,
    tau: float | None = None,
    *,
    schedule=None,
    settings=None,
    targets=None,
    cosine_scale: float | None = None,
    chunk_bytes: int | None = None,
    recorder=None,
) -> _Block:
    """Run ``model`` with our attention and a tau schedule inside the block; restore it exactly on exit.

    ``tau``: one number for every targeted layer and head (< 1 sharpens).
    ``schedule``: one tau per encoder layer, or a ``[layers][heads]`` list.
    ``settings``: a :class:`core.runs.settings.Settings` or the path of the app's
    exported JSON; its *stored* schedule is used as is, even for a
    length-dependent method chosen at another length (``chosen_at``): this
    function never sees your documents, so it cannot re-resolve. Use
    ``python -m core run|sweep --settings FILE`` for per-document resolution.
    ``targets``: which attentions the schedule touches (default: the
    settings' targets, else encoder self-attention only, as in the paper;
    a decoder-only model's causal self-attention, ``"decoder"``, its only one).
    ``cosine_scale``: CosScale s for cosine-attention models.
    ``recorder``: an optional :class:`core.mechanics.probes.Recorder` fed by encoder passes.

    The ``with`` statement yields the :class:`~core.values.choice.Choice` in force.
    The schedule is carried by a context variable: code in *this thread*
    (generate, a pipeline, forward calls) sees it; other threads do not. The
    model's attention implementation is switched for the block's duration,
    so do not share this model with other threads meanwhile, unless it
    already runs ``"aligned"`` (e.g. loaded with :func:`core.models.load`),
    in which case the model is not touched at all. Any other T5 model running
    ``"aligned"`` in this thread inside the block also sees the schedule.
    Blocks on one model may be open in several threads at once: each thread
    sees its own tau, and the model is restored when the last block closes.

    Raises :class:`core.errors.UserError` for an unsupported architecture or
    a bad schedule (here, before the block is entered), and on exit from
    another thread or context, or out of order (the block then stays open
    where it was opened; see :class:`_Block`).
    """
    check_supported(model)
    choice, how = choice_for(
        model,
        tau,
        schedule=schedule,
        settings=settings,
        targets=targets,
        cosine_scale=cosine_scale,
        chunk_bytes=chunk_bytes,
    )
    return _Block(model, choice, how, recorder)


def install(
    model,
    tau: float | None = None,
    *,
    schedule=None,
    settings=None,
    targets=None,
    cosine_scale: float | None = None,
    chunk_bytes: int | None = None,
) -> Choice:
    """Make ``model`` always run with this schedule (every thread), until :func:`uninstall`.

    Same arguments as :func:`apply`. Installing again replaces the schedule
    (``uninstall`` still restores what the model was before the first
    install). The settings travel with every call: the model's configs name our
    attention function bound to them under a name of its own
    (:func:`core.mechanics.attention.standing`, ``aligned@3``), so nothing is pinned on
    its modules and nothing is global but transformers' own registry of
    implementations; ``save_pretrained`` writes nothing of ours (the name is a
    private config field).
    """
    check_supported(model)
    choice, how = choice_for(
        model,
        tau,
        schedule=schedule,
        settings=settings,
        targets=targets,
        cosine_scale=cosine_scale,
        chunk_bytes=chunk_bytes,
    )
    name = attention.standing(choice, how)
    with _LOCK:
        hold = _hold(model)
        old = hold.standing
        before = attention.point(model, name)
        if old is None:
            hold.unpointed = before
        else:
            attention.forget(old)
        hold.standing, hold.installed = name, True
    return choice


def installed(model) -> Choice | None:
    """The :class:`~core.values.choice.Choice` :func:`install` put on ``model``, or None."""
    hold = patches.hold_of(model)
    if hold is None or not hold.installed:
        return None
    call = attention.standing_call_of(hold.standing)
    return None if call is None else call.choice


def uninstall(model) -> None:
    """Undo :func:`install`: the previous attention implementation, and nothing of ours left. No-op if not installed."""
    with _LOCK:
        hold = patches.hold_of(model)
        if hold is None or not hold.installed:
            return
        attention.point_back(hold.unpointed or [])
        attention.forget(hold.standing)
        hold.installed, hold.standing, hold.unpointed = False, None, None
        _let_go(model, hold)  # inside an apply block the block still needs ours; its end restores
