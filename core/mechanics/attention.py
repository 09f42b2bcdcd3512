"""The one attention function every T5 and ModernBERT attention runs through.

Registered with transformers' ``AttentionInterface`` under the name
``"aligned"`` (and a matching entry in ``AttentionMaskInterface`` so the model
hands us compact boolean masks). A model loaded with
``attn_implementation="aligned"`` calls :func:`aligned_attention` for encoder
self-attention, decoder self-attention and cross-attention alike; the function
finds out which one it is serving from the module it is given
(``is_decoder`` / ``is_causal`` / ``layer_idx``), so the model never needs to
know who listens.

Per call, the run's two values (its :class:`~core.values.choice.Choice`: the temperature schedule, the
CosScale value, which attentions to touch, the position scheme; its :class:`~core.mechanics.run_pass.Pass`:
the block budget) and the probe recorder travel in a :class:`contextvars.ContextVar`
set by :func:`attention_call`. Context variables are per thread (and per
asyncio task), so two Streamlit sessions sharing one cached model never see
each other's tau. With no call active the function is exactly T5's own
attention (tau = 1), unless the model's config names one of the functions
:func:`standing` registers: this same function bound to a model's standing
settings (:func:`core.runs.apply.install`) or recorder (:func:`listen`), under a
name of its own (``aligned@3``). So those settings travel with the call too,
through transformers' own dispatch, and nothing is pinned on the model's
modules.
The recorder (:mod:`core.mechanics.probes`) is asked at each call what it wants of this
attention's blocks (its probes are named per kind and layer). The call is then cut
into blocks of query rows and each block computed by one backend, chosen per call
in one place (:func:`core.mechanics.softmax_block.choose_backend`): on the CPU in float32
(every long pass here) our fused C++ kernel (:mod:`core.mechanics.fused_softmax`), probed or
not; elsewhere, when nobody probes and nobody needs the probabilities, torch's fused
``scaled_dot_product_attention`` with the bias (over tau) as its additive mask, an
exact rewriting; otherwise plain torch ops (autograd, dropout, the decoder's causal
mask, whole weights, a rectified position scheme). Every backend returns a block as
one :class:`core.mechanics.softmax_block.Block`, and the recorder takes that one object
(:meth:`core.mechanics.probes.Recorder.observe`), whichever backend made it.
A caller passing ``output_attentions=True`` (BertViz and friends) gets the whole
weights back, up to :data:`MAX_WEIGHT_BYTES`: that pass takes the torch backend.

The second family, rotary encoders (``model_type`` ``modernbert``, :data:`FAMILIES`), calls the
same function: ModernBERT applies its rotary embedding to q and k before the call, passes its own
``scaling`` (1/sqrt(head dim)) and no ``position_bias``, and its ``sliding_window`` kwarg is only a
hint for flash kernels (the window itself arrives in the boolean mask built by our mask function),
so nothing here depends on the family but :func:`attention_modules` and :func:`layer_count`.

The third family, decoder-only causal LMs (``model_type`` ``llama``, ``mistral``, ``qwen2``, ``qwen3``,
``gemma2``, ``phi3``, ``gpt_oss``: :data:`FAMILIES` ``decoder``), calls it too: rotary embedding applied
before the call, the model's own ``scaling``, key/value heads fewer than query heads (read in place), causal
or sliding-window masks from transformers' masking utilities (through :func:`compact_mask`), KV-cache steps
(a few query rows at the end of the keys), Gemma 2's logit soft-capping and gpt-oss's sink logits; its
self-attention is the ``decoder`` kind (:func:`attention_kind`), which is what a schedule must target there.

Why blocks: T5 adds a learned bias to q.k, so fused kernels that never
materialise probabilities cannot give us Pmax/entropy. We therefore compute
the softmax ourselves, over blocks of query rows, so at most
``batch x heads x chunk x L`` scores exist at once, and feed the probes
from each block before it is dropped.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from transformers.masking_utils import sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from core.errors import UserError
from core.kinds import ATTN_NAME, CROSS, DECODER, ENCODER
from core.mechanics import patches, softmax_block
from core.mechanics.patches import configs, point, point_back, set_implementation  # noqa: F401  read here too
from core.mechanics.run_pass import DEFAULT_PASS, Pass
from core.values import positions as rope_positions
from core.values.choice import TRAINED, Choice

if TYPE_CHECKING:  # pragma: no cover
    from core.mechanics.probes import Recorder


#: The block budgets, the exp floor and the backends live in :mod:`core.mechanics.softmax_block`; named here too, where
#: callers (the engine, the benchmarks) have always read them.
CHUNK_BYTES = softmax_block.CHUNK_BYTES
KERNEL_CHUNK_BYTES = softmax_block.KERNEL_CHUNK_BYTES
GRAD_CHUNK_BYTES = softmax_block.GRAD_CHUNK_BYTES
RECTIFIED_BLOCK_SHARE = softmax_block.RECTIFIED_BLOCK_SHARE
EXP_FLOOR = softmax_block.EXP_FLOOR
default_chunk_bytes = softmax_block.default_chunk_bytes

#: Most bytes of whole attention weights one pass may return per kind of attention (encoder,
#: decoder, cross) when the caller passes ``output_attentions=True``, counted at 4 bytes (float32)
#: per weight: ``batch x heads x q_len x k_len x layers`` at most 2**28 weights. The weights are
#: held whole (transformers keeps every layer's until the pass returns), which is exactly what the
#: blocked softmax avoids, so past this a clear :class:`~core.errors.UserError` beats running out
#: of memory halfway; probes (:mod:`core.mechanics.probes`) give the same numbers at any length.
MAX_WEIGHT_BYTES = 2**30


@dataclass
class _Call:
    """One :func:`attention_call` under way: the run's :class:`~core.values.choice.Choice` (what: the tau
    :class:`~core.values.schedule.Schedule` dividing q.k + bias, the ``targets`` it and the CosScale s touch, the
    position scheme), its :class:`~core.mechanics.run_pass.Pass` (how: the block budget) and the recorder, the same
    objects the edge made. ``lengths``: ``(train length, tokens)`` of a rotary model's pass (set by
    :func:`core.runs.rope_pass.scheme_pass`), at which the call binds the choice's scheme itself, once
    (:attr:`positions`); None: no scheme is bound (a T5 model, or a pass outside a scheme pass).

    Why the attention binds the scheme and is not handed a ``Bound``: the scheme then has one form from the edge
    to here (a :class:`~core.values.positions.Scheme`, the choice's own), and the bound one exists only inside
    the call, for its length. Its mask rows are ANDed into the padding mask block by block (encoder
    self-attention, whatever the targets say), and a scheme that rectifies distances takes its logits from
    :func:`core.values.positions.rectified_logits` (the model's rotary modules then hand over unrotated q and k).

    The tau is a :class:`Schedule` up to here and a tensor inside: one per layer (or per row span), converted once
    per call (``taus``). Adaptive temperature (Velickovic et al. 2024) is a schedule like any other
    (:data:`core.values.schedule.ADAPTIVE`): each targeted query row's logits times a beta from that row's own
    entropy (:func:`core.mechanics.softmax_block.adaptive_rows`); such a call runs the ``torch`` backend."""

    choice: Choice
    how: Pass
    recorder: "Recorder | None"
    lengths: tuple[int, int] | None = None
    taus: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    _bound: list = field(default_factory=list)

    @property
    def positions(self) -> "rope_positions.Bound | None":
        """The choice's scheme bound at this call's :attr:`lengths` (None without them), bound once per call."""
        if self.lengths is None:
            return None
        if not self._bound:
            self._bound.append(self.choice.scheme.bind(*self.lengths))
        return self._bound[0]


_CURRENT: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("aligned_attention_call", default=None)
#: A counter of the calls this function serves, set only by :func:`served_by_us` (its own pass, no settings).
_SERVED: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("aligned_served", default=None)


#: What this thread runs between two attention calls (a layer's attention and the next), or None: see
#: :func:`between_layers`.
_BETWEEN: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("aligned_between", default=None)


@contextlib.contextmanager
def between_layers(fn: Callable[[], None] | None) -> Iterator[None]:
    """Call ``fn()`` before every attention call the enclosed passes make in this thread (once per layer and
    kind of attention), restored on exit.

    Why: work that may wait (the app's background grid) gives way there to a person's request: ``fn`` blocks
    until the foreground is served, so the person waits at most for the layer under way, not a whole pass.
    ``fn`` may also raise (a cancelled pass stops at the next layer, its partial results dropped)."""
    token = _BETWEEN.set(fn)
    try:
        yield
    finally:
        _BETWEEN.reset(token)


def current_call() -> _Call | None:
    """The :func:`attention_call` under way in this thread (or asyncio task), None outside one: what the rotary
    modules of a scheme pass read (:func:`core.runs.rope_pass.scheme_pass`), from the same context as the attention."""
    return _CURRENT.get()


def current_positions() -> "rope_positions.Bound | None":
    """The position scheme bound by the :func:`attention_call` under way in this thread (None: none, or no call):
    what a rotary model's modules read when they compute cos and sin (:func:`core.mechanics.patches.patch`'s
    ``rotary``)."""
    call = _CURRENT.get()
    return None if call is None else call.positions


_SERIAL = itertools.count(1)


def standing(choice: Choice, how: Pass = DEFAULT_PASS, recorder: "Recorder | None" = None) -> str:
    """Register :func:`aligned_attention` bound to a standing ``choice`` and ``how`` (and ``recorder``) under a new name of its
    own, ``aligned@N``, and return the name: a model whose configs name it (:func:`point`) runs with them in every
    thread whenever no :func:`attention_call` is active (an explicit call still wins). What
    :func:`core.runs.apply.install` and :func:`listen` use; :func:`forget` takes the name back.

    Why a name and not an attribute on the model's modules: the settings then reach the attention the way
    transformers dispatches every call (the config's ``attn_implementation``), and the model's modules stay as
    loaded; ``save_pretrained`` writes no private config field, so nothing of ours is saved either."""
    name = f"{ATTN_NAME}@{next(_SERIAL)}"
    patches.register_name(
        name, functools.partial(aligned_attention, standing=_Call(choice, how, recorder)), compact_mask
    )
    return name


def standing_call_of(name: object) -> _Call | None:
    """The standing call a name :func:`standing` registered carries, None for any other name."""
    fn = ALL_ATTENTION_FUNCTIONS.get(name) if isinstance(name, str) else None
    return getattr(fn, "keywords", {}).get("standing")


def forget(name: str) -> None:
    """Let go of a name :func:`standing` registered (idempotent): it leaves transformers' registries
    (:func:`core.mechanics.patches.release_name`), so it holds no settings or recorder any more. Point the configs
    elsewhere first (:func:`point_back`). The plain ``aligned`` is left as it is."""
    if name != ATTN_NAME and standing_call_of(name) is not None:
        patches.release_name(name)


def listen(model: torch.nn.Module, recorder: "Recorder") -> Callable[[], None]:
    """Feed ``recorder`` from every pass ``model`` runs outside an :func:`attention_call`, until the
    returned function is called; a schedule :func:`core.runs.apply.install` put on it stays in force.

    The recorder rides on a standing call (:func:`standing`), so the model still never knows who
    listens. What training's cross-attention tap uses (``cross.*.logits``,
    :class:`core.training.CrossAttentionTap`). Take listeners off in the reverse order of putting them on."""
    prev = standing_call_of(getattr(model.config, "_attn_implementation", None))
    name = standing(prev.choice, prev.how, recorder) if prev is not None else standing(TRAINED, DEFAULT_PASS, recorder)
    before = point(model, name)

    def stop() -> None:
        point_back(before)
        forget(name)

    return stop


#: The model families whose attention modules call :func:`aligned_attention`, by transformers ``model_type``:
#: T5's learned relative bias, and bidirectional rotary encoders with a masked-LM head (ModernBERT: its
#: attention goes through ``AttentionInterface``, one fused q/k/v projection, as many key as query heads).
#: Decoder-only causal LMs (``decoder``) whose attention modules call the interface with the common signature
#: (``scaling``, ``dropout``, ``sliding_window``; Gemma 2's ``softcap``, gpt-oss's ``s_aux`` sinks), with grouped
#: K/V heads, the causal and windowed masks from transformers' masking_utils through :func:`compact_mask`.
FAMILIES: dict[str, tuple[str, ...]] = {
    "t5": ("t5", "mt5", "umt5"),
    "rope": ("modernbert",),
    "decoder": ("llama", "mistral", "qwen2", "qwen3", "gemma2", "phi3", "gpt_oss"),
}
T5, ROPE, CAUSAL_LM = "t5", "rope", "decoder"


def family_of(model_type: object) -> str | None:
    """The family (:data:`FAMILIES`) of a transformers ``model_type``, None when we cannot run it."""
    return next((f for f, types in FAMILIES.items() if model_type in types), None)


def layer_count(config: object) -> int:
    """Encoder layers a config declares: T5's ``num_layers``, else ``num_hidden_layers`` (ModernBERT), else 1."""
    n = getattr(config, "num_layers", None) if family_of(getattr(config, "model_type", None)) == T5 else None
    return int(n or getattr(config, "num_hidden_layers", None) or getattr(config, "num_layers", None) or 1)


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The attention modules of ``model`` that call this function (T5-family and ModernBERT), and hold a standing call."""
    from transformers.models.modernbert.modeling_modernbert import ModernBertAttention
    from transformers.models.mt5.modeling_mt5 import MT5Attention
    from transformers.models.t5.modeling_t5 import T5Attention
    from transformers.models.umt5.modeling_umt5 import UMT5Attention

    kinds = (T5Attention, MT5Attention, UMT5Attention, ModernBertAttention, *_decoder_attention_classes())
    return [m for m in model.modules() if isinstance(m, kinds)]


def _decoder_attention_classes() -> tuple[type, ...]:
    """The attention classes of the ``decoder`` family (:data:`FAMILIES`), imported when asked."""
    import importlib

    names = {
        "llama": "Llama",
        "mistral": "Mistral",
        "qwen2": "Qwen2",
        "qwen3": "Qwen3",
        "gemma2": "Gemma2",
        "phi3": "Phi3",
        "gpt_oss": "GptOss",
    }
    return tuple(
        getattr(importlib.import_module(f"transformers.models.{t}.modeling_{t}"), f"{names[t]}Attention")
        for t in FAMILIES[CAUSAL_LM]
    )


@contextlib.contextmanager
def attention_call(
    choice: Choice | None = None,
    how: Pass | None = None,
    recorder: "Recorder | None" = None,
    *,
    lengths: tuple[int, int] | None = None,
) -> Iterator[None]:
    """Run the enclosed forward passes with ``choice`` (None: the model as trained) and ``how`` (None: the
    default :class:`~core.mechanics.run_pass.Pass`) and feed ``recorder``; ``lengths``: ``(train length, tokens)``
    at which the call binds the choice's position scheme (:class:`_Call`; :func:`core.runs.rope_pass.scheme_pass`
    gives them).

    The call lives in a context variable: visible to this thread (or task)
    only, restored on exit even if the pass raises.
    """
    choice = TRAINED if choice is None else choice
    how = DEFAULT_PASS if how is None else how
    if not isinstance(choice, Choice):
        raise TypeError("attention_call's choice must be a core.values.choice.Choice (Choice.of at the edge)")
    if not isinstance(how, Pass):
        raise TypeError(
            "attention_call's how must be a core.mechanics.run_pass.Pass (the recorder is the third argument)"
        )
    token = _CURRENT.set(_Call(choice, how, recorder, lengths))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def served_by_us(model: torch.nn.Module) -> bool:
    """Whether a forward pass of ``model`` (4 tokens, its encoder for a seq2seq model) runs its attention through
    :func:`aligned_attention`: one short pass counting the calls this function serves (no settings of its own:
    the model's standing ones, or tau = 1, as any pass outside a call).

    Why: a transformers release whose model does not dispatch through ``AttentionInterface`` (or dispatches
    elsewhere on some device) runs its own attention silently, and every tau then changes nothing: a GPU run
    with transformers 5.17 gave sdpa and "ours" the same time and memory (issue 49). Checked once per load
    (:func:`core.models.loading.load`), it makes such a run an error instead of a wrong answer."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    ids = torch.tensor([[4, 5, 6, 1]], device=device)
    encoder = (
        model.get_encoder()
        if hasattr(model, "get_encoder") and getattr(model.config, "is_encoder_decoder", False)
        else model
    )
    counter = [0]
    token = _SERVED.set(counter)
    try:
        with torch.no_grad():
            encoder(input_ids=ids)
        return counter[0] > 0
    finally:
        _SERVED.reset(token)


def attention_kind(module: torch.nn.Module) -> str:
    """Which attention a module is: encoder, decoder self, or cross (T5's ``is_decoder``/``is_causal``;
    a ModernBERT attention has no ``is_decoder`` and ``is_causal`` False: encoder self-attention; a decoder-only
    model's (Llama, Mistral, Qwen, Gemma 2, Phi-3, gpt-oss) has no ``is_decoder`` and ``is_causal`` True: its
    causal self-attention is ``decoder``, like T5's decoder self-attention: causal rows, cached decoding steps at
    the end of the keys)."""
    if not getattr(module, "is_decoder", False):
        return DECODER if getattr(module, "is_causal", False) else ENCODER
    return DECODER if getattr(module, "is_causal", False) else CROSS


def _decoder_only(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a decoder-only model's self-attention (no ``is_decoder``, ``is_causal`` True)."""
    return not getattr(module, "is_decoder", False) and bool(getattr(module, "is_causal", False))


def _check_probes(recorder: "Recorder", module: torch.nn.Module) -> None:
    """Refuse a recorder that asks a decoder-only model for probes of attentions it does not have (``encoder.*``,
    the default :class:`~core.mechanics.probes.ProbeSpec`'s, or ``cross.*``): they would come back empty. One line
    naming the probes to ask for instead."""
    other = sorted({str(p) for p in recorder.spec.probes if p.kind != DECODER})
    if other:
        raise UserError(
            f"This decoder-only model ({type(module).__name__}) has one attention, its causal self-attention "
            f"('{DECODER}'): the probes {', '.join(other[:4])} name attentions it does not have and would come back "
            f"empty; ask for '{DECODER}.*' probes, e.g. ProbeSpec.of('{DECODER}.*.pmax', '{DECODER}.*.entropy')."
        )


def _check_targets(call: _Call, module: torch.nn.Module) -> None:
    """Refuse a call whose schedule would change nothing on a decoder-only model: its one attention is
    ``decoder`` self-attention, and a choice made for T5 (the paper's default targets, ``encoder`` only) names
    none of it. One line, instead of a run at tau = 1 reported as a run at the chosen tau."""
    choice = call.choice
    if DECODER in choice.targets or (choice.tau.is_one and not choice.tau.adaptive and choice.cosine_scale is None):
        return
    name = type(module).__name__
    raise UserError(
        f"This decoder-only model ({name}) has one attention, its causal self-attention ('{DECODER}'), and the "
        f"run's targets ({', '.join(choice.targets) or 'none'}) do not name it, so tau would change nothing: "
        f"give targets=('{DECODER}',) (core.runs.apply does when no targets are given)."
    )


def _layer_tau(
    call: _Call, kind: str, layer: int, n_heads: int, device, dtype, q_len: int = 1, k_len: int = 1
) -> torch.Tensor | None:
    """The tau of one layer, ``[heads, 1, 1]`` (or ``[1, q_len, 1]``: one per query row for a
    row schedule), or None when it is 1 everywhere. Read from the call's :class:`Schedule` (which
    keeps what it computed) and converted to a tensor once per call and layer. Adaptive temperature's
    base tau is 1 (None here); each row's own beta comes from :func:`_adaptive`."""
    if kind not in call.choice.targets:
        return None
    tau = call.choice.tau
    if tau.adaptive:
        return None
    if tau.rows is not None:
        # Row positions: a decoder's cached step sits at the end of its keys; other rows start at 0.
        start = k_len - q_len if kind == DECODER else 0
        key = (kind, "rows", start, q_len)
        if key not in call.taus:
            t = tau.row_taus(start, q_len)
            call.taus[key] = None if t is None else torch.from_numpy(t)
        t = call.taus[key]
        return None if t is None else t.to(device=device, dtype=dtype).view(1, q_len, 1)
    key = (kind, layer)
    if key not in call.taus:
        row = tau.heads(layer, n_heads)
        call.taus[key] = None if row is None else torch.tensor(row, dtype=torch.float64)
    t = call.taus[key]
    return None if t is None else t.to(device=device, dtype=dtype).view(n_heads, 1, 1)


def _adaptive(call: _Call | None, kind: str) -> bool:
    """Whether this attention multiplies each row's logits by its own beta: the call's schedule is adaptive
    temperature (:data:`core.values.schedule.ADAPTIVE`) and ``kind`` is one of its targets. Read where the layer's
    tau is (:func:`_layer_tau`), from the same schedule: nothing else carries it."""
    return call is not None and call.choice.tau.adaptive and kind in call.choice.targets


def _check_weight_size(module: torch.nn.Module, kind: str, batch: int, heads: int, q_len: int, k_len: int) -> None:
    """Refuse ``output_attentions=True`` past :data:`MAX_WEIGHT_BYTES`, before anything is computed.

    Counted per kind of attention over the stack's layers (:func:`layer_count`: T5 gives the decoder
    stack its own config), because transformers keeps every layer's weights until the pass returns;
    the first layer raises, so nothing large is allocated first. One line, naming the length that fits."""
    layers = layer_count(getattr(module, "config", None))
    n = batch * heads * q_len * k_len * layers
    limit = MAX_WEIGHT_BYTES // 4
    if n <= limit:
        return
    per = batch * heads * layers
    if kind == CROSS:
        fits = f"encoder inputs of up to {limit // (per * q_len):,} tokens at this decoder length"
    else:
        fits = f"inputs of up to {math.isqrt(limit // per):,} tokens"
    raise UserError(
        f"output_attentions=True would return {n * 4 / 2**30:.1f} GiB of {kind} attention weights "
        f"(batch {batch} x {heads} heads x {q_len} x {k_len} x {layers} layers, as float32), past the bound of "
        f"{MAX_WEIGHT_BYTES / 2**30:g} GiB (core.mechanics.attention.MAX_WEIGHT_BYTES), which holds {fits} at batch {batch}; "
        f"use a shorter input, or probes (core.mechanics.probes), which give Pmax, entropy and maps at any length."
    )


def logit_operands(
    query: torch.Tensor, key: torch.Tensor, scaling: float | None, cosine_scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q', k')`` with ``q' @ k'.T`` the logits before the bias: ``s * cos(q, k)``
    in cosine mode (``cosine_scale`` = s), else ``q.k * scaling`` (T5 passes 1).

    One place for the rule: every logit a probe sees (``logits`` included) is made from these."""
    if cosine_scale is not None:
        return (torch.nn.functional.normalize(query, dim=-1) * cosine_scale, torch.nn.functional.normalize(key, dim=-1))
    if scaling is not None and scaling != 1.0:
        query = query * scaling
    return query, key


def aligned_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    position_bias: torch.Tensor | None = None,
    *,
    standing: _Call | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax((q.k * scaling + bias + mask) / tau) @ v, in blocks of query rows.

    Decoder-only models (:data:`FAMILIES` ``decoder``): ``key``/``value`` may carry fewer heads than ``query``
    (grouped-query attention), read in place, never repeated (:func:`core.mechanics.softmax_block.grouped_matmul`);
    the rows are causal (the mask transformers builds through :func:`compact_mask`, causal or windowed, or none
    and ``is_causal``: each of the ``q_len`` rows sits at the end of the ``k_len`` keys, so a cached decoding step
    goes through here too); the caller's ``scaling`` makes the logits and tau divides them, i.e. the scaling is
    multiplied by 1/tau. ``softcap`` (Gemma 2, in ``kwargs``): the logits are capped, ``c * tanh(z / c)``, as
    transformers' eager attention caps them, and tau divides the capped logits (what the softmax is fed), so at
    tau = 1 it is eager's attention and at tau = 0.7 eager's with ``scaling`` and ``softcap`` both over 0.7.
    ``s_aux`` (gpt-oss, in ``kwargs``): one sink logit per head, one more column of every row's softmax with no
    value, over the same tau. The schedule applies when the call's targets name ``decoder``
    (:func:`_check_targets` refuses a schedule that would change nothing).

    ``standing``: the model's standing call (choice and pass), bound by :func:`standing` (used when no
    :func:`attention_call` is active).

    Shapes follow transformers' attention interface: ``query`` is
    ``[batch, heads, q_len, d]``, ``key``/``value`` ``[batch, heads, k_len, d]``,
    ``attention_mask`` boolean (True = attend) or additive float,
    ``[batch, 1, q_len, k_len]`` or None; ``position_bias`` ``[1|batch, heads,
    q_len, k_len]``. Returns ``[batch, q_len, heads, d]`` and, normally, no
    weights (they are never held whole; probes get them block by block, one
    :class:`core.mechanics.softmax_block.Block` at a time, :meth:`core.mechanics.probes.Recorder.observe`).

    ``output_attentions=True`` in ``kwargs`` is how transformers asks for the
    weights (the model's forward passes it down to every attention function
    with its other ``TransformersKwargs``; a forward hook on the attention
    layer collects the second return value into ``encoder_attentions`` etc.),
    or, without the kwarg, ``config.output_attentions``.
    Then, and only then, the weights come back whole, ``[batch, heads, q_len,
    k_len]`` in the value's dtype like transformers' eager attention: the
    same blocks of probabilities the output is made from (same tau, mask,
    bias, CosScale), concatenated, so BertViz can be pointed at a model under
    our attention. Only the ``torch`` backend returns them, so such a pass
    takes it (:func:`core.mechanics.softmax_block.choose_backend`); a pass over
    :data:`MAX_WEIGHT_BYTES` is refused first (:func:`_check_weight_size`).
    """
    pause = _BETWEEN.get()
    if pause is not None:
        pause()
    served = _SERVED.get()
    if served is not None:
        served[0] += 1
    call = _CURRENT.get()
    if call is None:
        call = standing
    kind = attention_kind(module)
    if call is not None and kind == DECODER and _decoder_only(module):
        _check_targets(call, module)
        if call.recorder is not None:
            _check_probes(call.recorder, module)
    layer = int(getattr(module, "layer_idx", 0) or 0)
    batch, heads, q_len, _ = query.shape
    k_len = key.shape[-2]
    config = getattr(module, "config", None)
    # The kwarg wins, else the config's default, as transformers' collector decides (capture_outputs): a model
    # loaded eager with output_attentions=True in its config and then put under apply() still gets its weights.
    want_weights = bool(
        kwargs["output_attentions"] if "output_attentions" in kwargs else getattr(config, "output_attentions", False)
    )
    if want_weights:
        _check_weight_size(module, kind, batch, heads, q_len, k_len)
    cosine = bool(getattr(config, "cosine_attention", False))

    s = None
    if cosine:
        # CosScale: logits = s * cos(q, k). The trained s lives in the config;
        # a per-call value overrides it on the targeted attentions.
        s = float(getattr(config, "cosine_scale", 1.0))
        if call is not None and call.choice.cosine_scale is not None and kind in call.choice.targets:
            s = float(call.choice.cosine_scale)
    query, key = logit_operands(query, key, scaling, s)
    scheme = _scheme_of(call, kind, module, query, key)
    seen_q, seen_k = (query, key) if scheme is None or scheme.logits is None else scheme.rotated(query, key)

    tau = None if call is None else _layer_tau(call, kind, layer, heads, query.device, torch.float32, q_len, k_len)
    recorder = call.recorder if call is not None else None
    needs = None
    if recorder is not None:
        # what the recorder asks of this attention's blocks; nothing (None or False): it took whatever it wanted
        # of the call (whole logits) already, and the blocks may go through a backend that probes nothing
        needs = (
            recorder.begin_layer(
                layer, seen_q, seen_k, attention_mask, cosine_scale=s, kind=kind, position_bias=position_bias
            )
            or None
        )
        if needs is None:
            recorder = None

    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", False) if is_causal is None else is_causal
    softcap = kwargs.get("softcap")
    x = softmax_block.Inputs(
        query,
        key,
        value,
        attention_mask,
        position_bias,
        tau,
        causal=attention_mask is None and bool(is_causal) and q_len > 1,
        scheme=scheme,
        needs=needs,
        weights=want_weights,
        dropout=float(dropout) if module.training else 0.0,
        grad=torch.is_grad_enabled(),
        adaptive=_adaptive(call, kind),
        softcap=None if softcap is None else float(softcap),
        sinks=kwargs.get("s_aux"),
    )
    out, weights = [], []
    first = _unread_prefix(x)
    if first:  # rows no probe reads, before the ones it does: computed as nobody probed them (one block)
        prefix = dataclasses.replace(x, needs=None)
        out.append(_open(softmax_block.SDPA, prefix, first)(0, first).out)
    backend = softmax_block.choose_backend(x)
    step = softmax_block.rows_per_block(backend, x, call.how.chunk_bytes if call is not None else None)
    rows = _open(backend, x, step)
    for r0 in range(first, q_len, step):
        block = rows(r0, min(q_len, r0 + step))
        if recorder is not None:
            recorder.observe(layer, block, kind=kind)
        out.append(block.out)
        if want_weights:
            weights.append(block.weights)
        del block  # before the next block is made: its raw rows (16 MB at 4k tokens) are then memory to reuse
    if recorder is not None:
        recorder.end_layer(layer, kind)
    attn = out[0] if len(out) == 1 else torch.cat(out, dim=2)
    probs = None if not want_weights else weights[0] if len(weights) == 1 else torch.cat(weights, dim=2)
    return attn.transpose(1, 2).contiguous(), probs


def _unread_prefix(x: softmax_block.Inputs) -> int:
    """How many of a causal prefill's first rows no probe reads and ``sdpa`` can serve (0: none): the rows before
    :attr:`~core.mechanics.softmax_block.Needs.rows`, when nothing but the output is needed of them.

    Why: a decoder's Pmax and H are read on its question's rows (:mod:`core.runs.calibration`), the last few dozen
    of thousands; the rows before them then cost what an unprobed prefill costs (:func:`softmax_block.sdpa_prefill`),
    not what a probed one does. Their output is the same rows' output (the tests compare them)."""
    needs = x.needs
    if needs is None or needs.rows is None or needs.raw_rows is not None or needs.probs:
        return 0
    first = min(needs.rows[0], x.shape[2])
    if first <= 0 or softmax_block.choose_backend(dataclasses.replace(x, needs=None)) != softmax_block.SDPA:
        return 0  # (on a GPU the Triton kernel gives every row's statistics at the unprobed cost: no split there)
    return first


def _open(backend: str, x: softmax_block.Inputs, step: int) -> softmax_block.Rows:
    """:func:`core.mechanics.softmax_block.open_backend`, through :func:`_fused` / :func:`_kernel_blocks` for the two
    backends that serve passes nobody probes (tests/mechanics/test_output_attentions.py counts the calls they serve)."""
    opener = {softmax_block.SDPA: _fused, softmax_block.CPU_KERNEL: _kernel_blocks}.get(backend)
    return opener(x, step) if opener is not None else softmax_block.open_backend(backend, x, step)


def _fused(x: softmax_block.Inputs, step: int) -> softmax_block.Rows:
    """The ``sdpa`` backend opened for one call."""
    return softmax_block.open_backend(softmax_block.SDPA, x, step)


def _kernel_blocks(x: softmax_block.Inputs, step: int) -> softmax_block.Rows:
    """The ``cpu-kernel`` backend opened for one call."""
    return softmax_block.open_backend(softmax_block.CPU_KERNEL, x, step)


@dataclass(frozen=True)
class _SchemeOps:
    """A bound position scheme as one attention call applies it (see :class:`_Call`): ``mask(r0, r1, cols)``
    gives the allowed keys of rows ``[r0, r1)`` (bool ``[rows, k_len]``, or ``[rows, len(cols)]`` for the keys
    ``cols``) or None; ``logits(r0, r1, allowed, cols)`` the rows' float32 logits from unrotated q and k (rectified
    schemes) or None: the plain matmul; ``rotated(q, k)`` q and k at their own positions (what probes that take
    whole q and k see); ``columns(r0, r1)`` the only keys rows ``[r0, r1)`` can see (ascending int64 positions:
    a band's and its sinks, a decoder's causal rows' cut at their last row), or None: any key, or so many that a
    gather would not pay."""

    bound: "rope_positions.Bound"
    mask: Callable[..., torch.Tensor | None]
    logits: Callable[..., torch.Tensor] | None
    rotated: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    columns: Callable[[int, int], torch.Tensor | None] = lambda r0, r1: None


#: A block of rows reads only its band's keys (:attr:`_SchemeOps.columns`) when they are at most this share of all
#: keys; past it, the gather of keys and values would cost more than the columns it saves.
BAND_SHARE = 0.75


def _layer_type(config, layer: int) -> str | None:
    """The rope-parameter key of one layer (ModernBERT: ``config.layer_types[layer]``), None for a flat dict."""
    if rope_positions.layer_types(config) == [None]:
        return None
    return config.layer_types[layer]


#: The attentions a bound scheme's mask and distances reach: a rotary encoder's self-attention, and a decoder-only
#: LM's causal self-attention (:func:`_decoder_only`; its rows are causal, a cached step's at the end of its keys).
SCHEME_KINDS: tuple[str, ...] = (ENCODER, DECODER)


def _scheme_of(
    call: _Call | None, kind: str, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor
) -> _SchemeOps | None:
    """The call's position scheme for this attention (a rotary encoder's self-attention, a decoder-only LM's causal
    self-attention: :data:`SCHEME_KINDS`), or None when it changes nothing here (no scheme, the plain one, or one
    that only changes frequencies: the rotary module did that).

    ``query`` and ``key`` are the logit operands (:func:`logit_operands`: scaled, or normalised for CosScale; both
    commute with a rotation). A rectified scheme rotates k once per call here, every block's q in
    :func:`core.values.positions.rectified_logits`. A decoder's rows sit at the end of its keys (``shift`` = k_len -
    q_len: 0 for a prefill, the cache's length for a decoding step), so its mask rows and distances are those of
    positions ``shift + r``; the causal mask is the block's own, ANDed with the scheme's."""
    decoder = kind == DECODER and _decoder_only(module)
    bound = None if call is None or not (kind == ENCODER or decoder) else call.positions
    if bound is None or not ({rope_positions.MASK, rope_positions.DISTANCES} & set(bound.scheme.changes)):
        return None
    k_len, device = key.shape[-2], query.device
    shift = k_len - query.shape[-2] if decoder else 0

    def mask(r0: int, r1: int, cols: torch.Tensor | None = None) -> torch.Tensor | None:
        return bound.mask_rows(shift + r0, shift + r1, k_len, device, cols)

    def columns(r0: int, r1: int) -> torch.Tensor | None:
        span = bound.key_span(shift + r0, shift + r1, k_len)
        if span is None and not decoder:
            return None
        s, lo, hi = (0, 0, k_len) if span is None else span
        if decoder:  # causal rows: no key after the block's last row (ReRoPE's too, which has no band)
            hi, s = min(hi, shift + r1), min(s, shift + r1)
            lo = min(lo, hi)
        if s + hi - lo > BAND_SHARE * k_len:
            return None
        return torch.cat((torch.arange(s, device=device), torch.arange(lo, hi, device=device)))

    if not bound.rectified:
        return _SchemeOps(bound, mask, None, lambda q, k: (q, k), columns)
    config = module.config
    inv, a = bound.frequencies(config, _layer_type(config, int(getattr(module, "layer_idx", 0) or 0)))
    k_rot = rope_positions.rotate(key, torch.arange(k_len, device=device), inv, a)

    def logits(r0: int, r1: int, allowed: torch.Tensor | None, cols: torch.Tensor | None = None) -> torch.Tensor:
        distances = bound.capped_positions(shift + r0, shift + r1, k_len, device, cols)
        k0, kr = (key, k_rot) if cols is None else (key.index_select(2, cols), k_rot.index_select(2, cols))
        return rope_positions.rectified_logits(
            query, k0, inv, distances, r0, a, allowed=allowed, k_rotated=kr, shift=shift, key_positions=cols
        )

    def rotated(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_positions.rotate(q, torch.arange(shift, shift + q.shape[-2], device=device), inv, a), k_rot

    return _SchemeOps(bound, mask, logits, rotated, columns)


def compact_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """transformers' boolean ``sdpa_mask`` (True = attend; None when nothing is masked), with a padding mask
    whose rows are all the same handed over as one row of keys per item, broadcast over the query rows
    (``[B, 1, q, K]`` with stride 0 along q).

    Why: a padded batch's encoder (and cross-attention) mask is the same row of keys for every query, but
    ``sdpa_mask`` materialises it ``[B, 1, L, L]`` (1 GiB of booleans for 4 x 16k), and a per-row mask is one
    the fused kernel cannot read in place, so padded batches (sweeps, batch runs) never took it. Checked once
    per forward pass (the mask is made once and shared by every layer): ``B x L x L`` comparisons, against
    ``layers x heads x L x L x d`` multiply-adds of the pass. A causal or windowed mask keeps its rows."""
    mask = sdpa_mask(*args, **kwargs)
    if (
        isinstance(mask, torch.Tensor)
        and mask.dtype == torch.bool
        and mask.dim() == 4
        and mask.shape[2] > 1
        and mask.stride(2) != 0
    ):
        first = mask[:, :, :1]
        if torch.equal(mask, first.expand(mask.shape)):
            return first.clone().expand(mask.shape)
    return mask


def register() -> None:
    """Make ``attn_implementation="aligned"`` available to transformers (idempotent)."""
    # Boolean masks (True = attend), None when there is no padding: 4x smaller
    # than additive float masks, and nothing at all in the common case; a padding mask as one row per item.
    patches.register_name(ATTN_NAME, aligned_attention, compact_mask)


register()
