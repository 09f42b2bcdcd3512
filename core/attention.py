"""The one attention function every T5 and ModernBERT attention runs through.

Registered with transformers' ``AttentionInterface`` under the name
``"aligned"`` (and a matching entry in ``AttentionMaskInterface`` so the model
hands us compact boolean masks). A model loaded with
``attn_implementation="aligned"`` calls :func:`aligned_attention` for encoder
self-attention, decoder self-attention and cross-attention alike; the function
finds out which one it is serving from the module it is given
(``is_decoder`` / ``is_causal`` / ``layer_idx``), so the model never needs to
know who listens.

Per-call settings (the temperature schedule, the CosScale value, which
attentions to touch, the probe recorder) travel in a :class:`contextvars.ContextVar`
set by :func:`attention_call`. Context variables are per thread (and per
asyncio task), so two Streamlit sessions sharing one cached model never see
each other's tau. With no call active the function is exactly T5's own
attention (tau = 1), unless :func:`core.apply.install` pinned a standing call
on the model's attention modules (:data:`INSTALLED_ATTR`), which is per model
(:func:`listen` pins a recorder the same way).
The recorder (:mod:`core.probes`) is asked at each call whether it wants this
attention's blocks (its probes are named per kind and layer); when nobody
does, nobody needs the probabilities, so the blocks go through torch's fused
``scaled_dot_product_attention`` with the bias (over tau) as its additive
mask, an exact rewriting that is several times faster on long inputs.
A caller passing ``output_attentions=True`` (BertViz and friends) also needs
them: that pass takes the blocked path and gets the whole weights back, up to
:data:`MAX_WEIGHT_BYTES`.

The second family, rotary encoders (``model_type`` ``modernbert``, :data:`FAMILIES`), calls the
same function: ModernBERT applies its rotary embedding to q and k before the call, passes its own
``scaling`` (1/sqrt(head dim)) and no ``position_bias``, and its ``sliding_window`` kwarg is only a
hint for flash kernels (the window itself arrives in the boolean mask built by our mask function),
so nothing here depends on the family but :func:`attention_modules` and :func:`layer_count`.

Why chunked: T5 adds a learned bias to q.k, so fused kernels that never
materialise probabilities cannot give us Pmax/entropy. We therefore compute
the softmax ourselves, over blocks of query rows, so at most
``batch x heads x chunk x L`` probabilities exist at once, and feed the probes
from each block before it is dropped.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import torch
from transformers import AttentionInterface

from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from core import fused_softmax
from core import positions as rope_positions
from core.errors import UserError
from core.kinds import ATTN_NAME, CROSS, DECODER, ENCODER, KINDS
from core.relative_bias import RelativeBias
from core.schedule import Schedule

if TYPE_CHECKING:  # pragma: no cover
    from core.probes import Recorder


#: Bytes of float32 scores one block of query rows may hold (all heads and
#: batch items), per device type. On the CPU a block above glibc's mmap
#: threshold (32 MiB at most) is fresh mmap'd memory every time it is
#: allocated, and the page faults cost more than the softmax: 8 MiB blocks
#: made probed passes of the default model 1.7-2.6x faster than 256 MiB at
#: 2k-4k tokens (bench/README.md). A GPU's caching allocator reuses memory,
#: and large blocks keep its kernels busy. Either way a 16k-token pass holds
#: only a few blocks at once.
CHUNK_BYTES = {"cpu": 8 * 2**20, "cuda": 256 * 2**20}


#: Bytes of float32 scores per block on the fused CPU kernel's path (:func:`_kernel_blocks`): there one
#: buffer serves every block of a layer, so the page faults of a large block are paid once per layer, and
#: larger blocks keep the matmuls efficient. Measured on the default model at 8,192 tokens with every probe,
#: 2 threads (bench/README.md): 8 MiB 5.43 s, 32 MiB 4.78 s, 64 MiB 4.35 s, 128 MiB 4.29 s.
KERNEL_CHUNK_BYTES = 64 * 2**20

#: While autograd records (training), every block is kept for the backward pass
#: anyway, so small blocks would save no memory and only add work.
GRAD_CHUNK_BYTES = 256 * 2**20


def default_chunk_bytes(device: torch.device | str) -> int:
    """The block budget for ``device`` (see :data:`CHUNK_BYTES`; other devices get the CPU's)."""
    return CHUNK_BYTES.get(torch.device(device).type, CHUNK_BYTES["cpu"])


#: Lowest exponent the probed softmax evaluates (see :func:`_probed`): exp(-87) is still a normal float32.
EXP_FLOOR = -87.0

#: Most bytes of whole attention weights one pass may return per kind of attention (encoder,
#: decoder, cross) when the caller passes ``output_attentions=True``, counted at 4 bytes (float32)
#: per weight: ``batch x heads x q_len x k_len x layers`` at most 2**28 weights. The weights are
#: held whole (transformers keeps every layer's until the pass returns), which is exactly what the
#: blocked softmax avoids, so past this a clear :class:`~core.errors.UserError` beats running out
#: of memory halfway; probes (:mod:`core.probes`) give the same numbers at any length.
MAX_WEIGHT_BYTES = 2**30



@dataclass(frozen=True)
class AttentionSettings:
    """What one forward pass should do to the attention logits.

    ``tau``: the :class:`~core.schedule.Schedule` dividing q.k + bias (anything
    :meth:`Schedule.of` accepts is turned into one here, once).
    ``targets``: which attentions the schedule and ``cosine_scale`` touch; the
    paper scales encoder self-attention only.
    ``cosine_scale``: for models trained with cosine attention, the s in
    ``s * cos(q, k)`` used on the targeted attentions (None: the trained s).
    ``chunk_bytes``: budget for one block of query rows (memory vs speed;
    None: the device's default, :func:`default_chunk_bytes`).
    ``positions``: a position scheme bound to this input's length (:class:`core.positions.Bound`), applied to
    encoder self-attention whatever ``targets`` says: its mask rows are ANDed into the padding mask block by
    block, and a scheme that rectifies distances takes its logits from :func:`core.positions.rectified_logits`
    (the model's rotary module must then hand over unrotated q and k: :func:`core.rope_pass.scheme_pass` sets
    both up). None, or the plain scheme: nothing changes.
    """

    tau: Schedule = Schedule.of(1.0)
    targets: tuple[str, ...] = (ENCODER,)
    cosine_scale: float | None = None
    chunk_bytes: int | None = None
    positions: "rope_positions.Bound | None" = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tau", Schedule.of(self.tau))  # the same object when it is one already
        bad = [t for t in self.targets if t not in KINDS]
        if bad:
            raise ValueError(f"unknown attention target(s) {bad}; choose from {KINDS}")
        if self.cosine_scale is not None and not (self.cosine_scale > 0 and math.isfinite(self.cosine_scale)):
            raise ValueError("cosine_scale must be a positive number")
        if self.chunk_bytes is not None and not (isinstance(self.chunk_bytes, int) and self.chunk_bytes > 0):
            raise ValueError("chunk_bytes must be a positive whole number of bytes (or None: the device's default)")
        if self.positions is not None and not isinstance(self.positions, rope_positions.Bound):
            raise ValueError("positions must be a core.positions.Bound (positions.bind(...)) or None")


@dataclass
class _Call:
    settings: AttentionSettings
    recorder: "Recorder | None"
    taus: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)


_CURRENT: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("aligned_attention_call", default=None)

#: Attribute of an attention module holding a standing call (``core.apply.install``):
#: used when no :func:`attention_call` is active, so it is per model, not global.
INSTALLED_ATTR = "_aligned_installed_call"


def standing_call(settings: AttentionSettings, recorder: "Recorder | None" = None) -> _Call:
    """A call to pin on a model's attention modules (see :data:`INSTALLED_ATTR`)."""
    return _Call(settings, recorder)


def listen(model: torch.nn.Module, recorder: "Recorder") -> Callable[[], None]:
    """Feed ``recorder`` from every pass ``model`` runs outside an :func:`attention_call`, until the
    returned function is called; a schedule :func:`core.apply.install` pinned stays in force.

    The recorder rides on a standing call (:data:`INSTALLED_ATTR`), so the model still never knows who
    listens. What training's cross-attention tap uses (``cross.*.logits``,
    :class:`core.training.CrossAttentionTap`). Take listeners off in the reverse order of putting them on."""
    before = {m: m.__dict__.get(INSTALLED_ATTR) for m in attention_modules(model)}
    for m, prev in before.items():
        m.__dict__[INSTALLED_ATTR] = standing_call(prev.settings if prev else AttentionSettings(), recorder)

    def stop() -> None:
        for m, prev in before.items():
            if prev is None:
                m.__dict__.pop(INSTALLED_ATTR, None)
            else:
                m.__dict__[INSTALLED_ATTR] = prev

    return stop


#: The model families whose attention modules call :func:`aligned_attention`, by transformers ``model_type``:
#: T5's learned relative bias, and bidirectional rotary encoders with a masked-LM head (ModernBERT: its
#: attention goes through ``AttentionInterface``, one fused q/k/v projection, as many key as query heads).
FAMILIES: dict[str, tuple[str, ...]] = {"t5": ("t5", "mt5", "umt5"), "rope": ("modernbert",)}
T5, ROPE = "t5", "rope"


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

    kinds = (T5Attention, MT5Attention, UMT5Attention, ModernBertAttention)
    return [m for m in model.modules() if isinstance(m, kinds)]


@contextlib.contextmanager
def attention_call(settings: AttentionSettings | None = None, recorder: "Recorder | None" = None) -> Iterator[None]:
    """Run the enclosed forward passes with ``settings`` and feed ``recorder``.

    The settings live in a context variable: visible to this thread (or task)
    only, restored on exit even if the pass raises.
    """
    token = _CURRENT.set(_Call(settings or AttentionSettings(), recorder))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def attention_kind(module: torch.nn.Module) -> str:
    """Which attention a module is: encoder, decoder self, or cross (T5's ``is_decoder``/``is_causal``;
    a ModernBERT attention has no ``is_decoder`` and ``is_causal`` False: encoder self-attention)."""
    if not getattr(module, "is_decoder", False):
        return ENCODER
    return DECODER if getattr(module, "is_causal", False) else CROSS


def _layer_tau(call: _Call, kind: str, layer: int, n_heads: int, device, dtype, q_len: int = 1,
               k_len: int = 1) -> torch.Tensor | None:
    """The tau of one layer, ``[heads, 1, 1]`` (or ``[1, q_len, 1]``: one per query row for a
    row schedule), or None when it is 1 everywhere. Read from the call's :class:`Schedule` (which
    keeps what it computed) and converted to a tensor once per call and layer."""
    if kind not in call.settings.targets:
        return None
    tau = call.settings.tau
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


def _rows(tau: torch.Tensor | None, r0: int, r1: int) -> torch.Tensor | None:
    """The part of a tau for query rows ``[r0, r1)``: a per-row tau (``[1, q_len, 1]``) is cut, a per-head one kept."""
    return tau if tau is None or tau.shape[-2] == 1 else tau[:, r0:r1]


def _chunk_rows(batch: int, heads: int, q_len: int, k_len: int, budget: int) -> int:
    per_row = max(1, batch * heads * k_len * 4)
    return max(1, min(q_len, budget // per_row))


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
        f"{MAX_WEIGHT_BYTES / 2**30:g} GiB (core.attention.MAX_WEIGHT_BYTES), which holds {fits} at batch {batch}; "
        f"use a shorter input, or probes (core.probes), which give Pmax, entropy and maps at any length.")


def logit_operands(query: torch.Tensor, key: torch.Tensor, scaling: float | None,
                   cosine_scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q', k')`` with ``q' @ k'.T`` the logits before the bias: ``s * cos(q, k)``
    in cosine mode (``cosine_scale`` = s), else ``q.k * scaling`` (T5 passes 1).

    One place for the rule: every logit a probe sees (``logits`` included) is made from these."""
    if cosine_scale is not None:
        return (torch.nn.functional.normalize(query, dim=-1) * cosine_scale,
                torch.nn.functional.normalize(key, dim=-1))
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
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax((q.k * scaling + bias + mask) / tau) @ v, in blocks of query rows.

    Shapes follow transformers' attention interface: ``query`` is
    ``[batch, heads, q_len, d]``, ``key``/``value`` ``[batch, heads, k_len, d]``,
    ``attention_mask`` boolean (True = attend) or additive float,
    ``[batch, 1, q_len, k_len]`` or None; ``position_bias`` ``[1|batch, heads,
    q_len, k_len]``. Returns ``[batch, q_len, heads, d]`` and, normally, no
    weights (they are never held whole; probes get them block by block).

    ``output_attentions=True`` in ``kwargs`` is how transformers asks for the
    weights (the model's forward passes it down to every attention function
    with its other ``TransformersKwargs``; a forward hook on the attention
    layer collects the second return value into ``encoder_attentions`` etc.),
    or, without the kwarg, ``config.output_attentions``.
    Then, and only then, the weights come back whole, ``[batch, heads, q_len,
    k_len]`` in the value's dtype like transformers' eager attention: the
    same blocks of probabilities the output is made from (same tau, mask,
    bias, CosScale), concatenated, so BertViz can be pointed at a model under
    our attention. The fused kernel gives no probabilities, so such a pass
    takes the blocked path; a pass over :data:`MAX_WEIGHT_BYTES` is refused
    first (:func:`_check_weight_size`).
    """
    call = _CURRENT.get()
    if call is None:
        call = module.__dict__.get(INSTALLED_ATTR)
    kind = attention_kind(module)
    layer = int(getattr(module, "layer_idx", 0) or 0)
    batch, heads, q_len, _ = query.shape
    k_len = key.shape[-2]
    config = getattr(module, "config", None)
    # The kwarg wins, else the config's default, as transformers' collector decides (capture_outputs): a model
    # loaded eager with output_attentions=True in its config and then put under apply() still gets its weights.
    want_weights = bool(kwargs["output_attentions"] if "output_attentions" in kwargs
                        else getattr(config, "output_attentions", False))
    if want_weights:
        _check_weight_size(module, kind, batch, heads, q_len, k_len)
    cosine = bool(getattr(config, "cosine_attention", False))

    s = None
    if cosine:
        # CosScale: logits = s * cos(q, k). The trained s lives in the config;
        # a per-call value overrides it on the targeted attentions.
        s = float(getattr(config, "cosine_scale", 1.0))
        if call is not None and call.settings.cosine_scale is not None and kind in call.settings.targets:
            s = float(call.settings.cosine_scale)
    query, key = logit_operands(query, key, scaling, s)
    scheme = _scheme_of(call, kind, module, query, key)
    seen_q, seen_k = (query, key) if scheme is None or scheme.logits is None else scheme.rotated(query, key)

    tau = None if call is None else _layer_tau(call, kind, layer, heads, query.device, torch.float32, q_len, k_len)
    recorder = call.recorder if call is not None else None
    if recorder is not None and not recorder.begin_layer(layer, seen_q, seen_k, attention_mask, cosine_scale=s,
                                                         kind=kind, position_bias=position_bias):
        recorder = None  # nothing asked of this attention's blocks (whole logits, if asked, were taken already)

    causal = attention_mask is None and getattr(module, "is_causal", False) and q_len > 1
    asked = call.settings.chunk_bytes if call is not None else None
    plan = _kernel_plan(query, value, attention_mask, position_bias, causal, scheme, want_weights,
                        bool(dropout and module.training))
    if plan is not None:
        step = _chunk_rows(batch, heads, q_len, k_len, asked or KERNEL_CHUNK_BYTES)
        out = _kernel_blocks(query, key, value, plan, tau, step, kind, layer, recorder)
        if recorder is not None:
            recorder.end_layer(layer, kind)
        return out, None
    budget = asked
    if budget is None:
        budget = GRAD_CHUNK_BYTES if torch.is_grad_enabled() else default_chunk_bytes(query.device)
    if scheme is not None and scheme.logits is not None:
        # rectified logits hold a block's int64 distances and two boolean selections beside its float32 scores
        budget = max(1, budget // RECTIFIED_BLOCK_SHARE)
    step = _chunk_rows(batch, heads, q_len, k_len, budget)
    if (recorder is None and not causal and not (dropout and module.training) and not want_weights
            and (scheme is None or scheme.logits is None)):
        # Nobody needs the probabilities: let torch's fused kernel do the softmax. With no bias and no mask
        # (a rotary encoder on an unpadded batch) there is nothing L x L to bound: one call, no blocks.
        whole = position_bias is None and attention_mask is None and scheme is None
        return _fused(query, key, value, attention_mask, position_bias, tau, q_len if whole else step, scheme), None
    keyT = key.transpose(-1, -2)
    weights: list[torch.Tensor] | None = [] if want_weights else None  # blocks of probabilities, when asked for
    rectified = scheme is not None and scheme.logits is not None
    clamped = rectified and weights is None and not torch.is_grad_enabled()  # _probed writes exp with out=
    if (recorder is not None or clamped) and not (dropout and module.training):
        # a rectified scheme without probes takes the probed path's clamped softmax too (recorder None): its
        # far-off logits would otherwise send torch's exp down its slow path for results below float32's normals
        out = _probed(query, keyT, value, attention_mask, position_bias, tau, step, causal, kind, layer, recorder,
                      weights, scheme)
    else:
        out = []
        for r0 in range(0, q_len, step):
            r1 = min(q_len, r0 + step)
            scores = _block_scores(query, keyT, attention_mask, position_bias, tau, r0, r1, causal, scheme=scheme)[1]
            if recorder is None:
                probs = torch.softmax(scores, dim=-1)
            else:  # dropout while training with a recorder: normalise, observe, then drop
                top = scores.amax(-1, keepdim=True)
                shifted = scores - top
                e = torch.exp(shifted)
                total = e.sum(-1, keepdim=True)
                recorder.observe_exp(layer, r0, r1, None, shifted, e, total, kind=kind)
                probs = e / total
            if dropout and module.training:
                probs = torch.nn.functional.dropout(probs, p=dropout, training=True)
            probs = probs.to(value.dtype)
            if weights is not None:  # a fresh tensor per block: kept as it is, as eager returns it (after dropout)
                weights.append(probs)
            out.append(torch.matmul(probs, value))
    attn = out[0] if len(out) == 1 else torch.cat(out, dim=2)
    if recorder is not None:
        recorder.end_layer(layer, kind)
    probs_all = None if weights is None else weights[0] if len(weights) == 1 else torch.cat(weights, dim=2)
    return attn.transpose(1, 2).contiguous(), probs_all


@dataclass(frozen=True)
class _KernelPlan:
    """What :func:`_kernel_blocks` hands the fused kernel for one attention call: the bias as one float32
    block and how to find a row in it (``strides(r0)``: per head, per row, base), and the keys each batch
    item may attend (``[B, K]`` bool) or None."""

    bias: torch.Tensor | None
    strides: Callable[[int], tuple[int, int, int]]
    keymask: torch.Tensor | None


def _kernel_plan(query, value, attention_mask, position_bias, causal: bool, scheme: "_SchemeOps | None",
                 want_weights: bool, dropout: bool) -> _KernelPlan | None:
    """The fused kernel's view of this call (:mod:`core.fused_softmax`), or None when torch's path must run it.

    The kernel serves inference on the CPU in float32 (what every long pass here is): not while autograd
    records (training differentiates torch's path), not for whole weights (``output_attentions``), dropout,
    a causal or per-row mask (decoder self-attention while teacher forcing, a position scheme's window) or
    a rectified scheme. A padding mask that is the same for every row becomes one row of keys per item. The
    bias is a :class:`~core.relative_bias.RelativeBias` (read in place), none, or a dense ``[1, H, q, k]``
    tensor with contiguous keys; T5's own dense bias (a permuted view) is not."""
    if (query.device.type != "cpu" or query.dtype != torch.float32 or value.dtype != torch.float32 or causal
            or scheme is not None or want_weights or dropout or torch.is_grad_enabled() or query.requires_grad):
        return None
    keymask = None
    if attention_mask is not None:
        m = attention_mask
        if m.dtype != torch.bool or m.dim() != 4 or m.shape[1] != 1 or not (m.shape[2] == 1 or m.stride(2) == 0):
            return None
        if m.shape[-1] != value.shape[-2]:
            return None
        keymask = m[:, 0, 0, :].expand(query.shape[0], value.shape[-2])
    if position_bias is None:
        bias, strides = None, (lambda r0: (0, 0, 0))
    elif isinstance(position_bias, RelativeBias):
        bias, strides = position_bias.flat(), position_bias.strides
    elif (isinstance(position_bias, torch.Tensor) and position_bias.dim() == 4 and position_bias.shape[0] == 1
          and position_bias.dtype == torch.float32 and position_bias.stride(-1) == 1
          and position_bias.shape[-1] == value.shape[-2]):
        bias = position_bias
        hs, rs = position_bias.stride(1), position_bias.stride(2)
        if position_bias.shape[1] == 1:
            hs = 0
        strides = (lambda r0: (hs, rs, r0 * rs))
    else:
        return None
    if not fused_softmax.available():
        return None
    return _KernelPlan(bias, strides, keymask)


def _kernel_blocks(query, key, value, plan: _KernelPlan, tau, step: int, kind: str, layer: int,
                   recorder: "Recorder | None") -> torch.Tensor:
    """softmax((q.k + bias) / tau + mask) @ v in blocks of query rows, each block's softmax one kernel call.

    Per block: one matmul into a buffer every block reuses, the kernel (bias read in place, tau, mask, max,
    exp and the two row sums in two passes over each row while it is in cache), the recorder fed from the
    same exponentials (:meth:`Recorder.observe_sums`: Pmax and H from the kernel's sums, views from the rows
    they need), and ``(exp @ v) / total``. Raw logits (q.k + bias before tau) are kept only for the rows
    the sorted-logits probe sorts (:meth:`Recorder.sorted_rows`). Returns ``[batch, q_len, heads, d]``."""
    batch, heads, q_len, _ = query.shape
    k_len = key.shape[-2]
    keyT = key.transpose(-1, -2)
    per_row = tau is not None and tau.shape[-2] != 1
    tau_heads = None if tau is None or per_row else tau.reshape(heads)
    buf = torch.empty(batch * heads * min(step, q_len) * k_len, dtype=torch.float32)
    out = []
    for r0 in range(0, q_len, step):
        r1 = min(q_len, r0 + step)
        scores = buf[: batch * heads * (r1 - r0) * k_len].view(batch, heads, r1 - r0, k_len)
        torch.matmul(query[:, :, r0:r1], keyT, out=scores)
        rows = None if recorder is None else recorder.sorted_rows(layer, r0, r1, kind)
        raw = None
        if rows is not None:  # before the kernel overwrites the block
            raw = scores.index_select(2, rows)
            if plan.bias is not None:
                raw.add_(_bias_rows(plan, r0, rows, heads, k_len))
        t, per = (tau[0, r0:r1, 0], "row") if per_row else (tau_heads, "head")
        total, dot = fused_softmax.softmax_rows(scores, plan.bias, plan.strides(r0), t, per, plan.keymask)
        if recorder is not None:
            recorder.observe_sums(layer, r0, r1, raw, scores, total, dot, kind=kind)
        out.append(torch.matmul(scores, value).div_(total))
    attn = out[0] if len(out) == 1 else torch.cat(out, dim=2)
    return attn.transpose(1, 2).contiguous()


def _bias_rows(plan: _KernelPlan, r0: int, rows: torch.Tensor, heads: int, k_len: int) -> torch.Tensor:
    """The plan's bias of block rows ``r0 + rows`` (a few, for a raw-logit probe): ``[1, H, len(rows), k_len]``."""
    hs, rs, base = plan.strides(r0)
    flat = plan.bias.reshape(-1)
    starts = [base + int(i) * rs for i in rows]
    picked = [flat.as_strided((heads, k_len), (hs, 1), flat.storage_offset() + a) for a in starts]
    return torch.stack(picked, dim=1).unsqueeze(0)


#: A rectified scheme's block holds, beside its float32 scores, the int64 distances and a boolean or two of the
#: same shape: its blocks get this share of the budget, so a block's memory stays about the budget.
RECTIFIED_BLOCK_SHARE = 4


@dataclass(frozen=True)
class _SchemeOps:
    """A bound position scheme as one attention call applies it (see :class:`AttentionSettings`): ``mask(r0, r1)``
    gives the allowed keys of rows ``[r0, r1)`` (bool ``[rows, k_len]``) or None; ``logits(r0, r1, allowed)`` the
    rows' float32 logits from unrotated q and k (rectified schemes) or None: the plain matmul; ``rotated(q, k)``
    q and k at their own positions (what probes that take whole q and k see)."""

    bound: "rope_positions.Bound"
    mask: Callable[[int, int], torch.Tensor | None]
    logits: Callable[[int, int, torch.Tensor | None], torch.Tensor] | None
    rotated: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _layer_type(config, layer: int) -> str | None:
    """The rope-parameter key of one layer (ModernBERT: ``config.layer_types[layer]``), None for a flat dict."""
    if rope_positions.layer_types(config) == [None]:
        return None
    return config.layer_types[layer]


def _scheme_of(call: _Call | None, kind: str, module: torch.nn.Module, query: torch.Tensor,
               key: torch.Tensor) -> _SchemeOps | None:
    """The call's position scheme for this attention (encoder self-attention only), or None when it changes
    nothing here (no scheme, the plain one, or one that only changes frequencies: the rotary module did that).

    ``query`` and ``key`` are the logit operands (:func:`logit_operands`: scaled, or normalised for CosScale; both
    commute with a rotation). A rectified scheme rotates k once per call here, every block's q in
    :func:`core.positions.rectified_logits`."""
    bound = None if call is None or kind != ENCODER else call.settings.positions
    if bound is None or not ({rope_positions.MASK, rope_positions.DISTANCES} & set(bound.scheme.changes)):
        return None
    k_len, device = key.shape[-2], query.device

    def mask(r0: int, r1: int) -> torch.Tensor | None:
        return bound.mask_rows(r0, r1, k_len, device)

    if not bound.rectified:
        return _SchemeOps(bound, mask, None, lambda q, k: (q, k))
    config = module.config
    inv, a = bound.frequencies(config, _layer_type(config, int(getattr(module, "layer_idx", 0) or 0)))
    k_rot = rope_positions.rotate(key, torch.arange(k_len, device=device), inv, a)

    def logits(r0: int, r1: int, allowed: torch.Tensor | None) -> torch.Tensor:
        return rope_positions.rectified_logits(query, key, inv, bound.capped_positions(r0, r1, k_len, device), r0, a,
                                               allowed=allowed, k_rotated=k_rot)

    def rotated(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_positions.rotate(q, torch.arange(q.shape[-2], device=device), inv, a), k_rot

    return _SchemeOps(bound, mask, logits, rotated)


def _block_scores(query, keyT, attention_mask, position_bias, tau, r0: int, r1: int, causal: bool,
                  keep_raw: bool = False, scheme: _SchemeOps | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(raw, scores)`` of query rows ``[r0, r1)``: raw = q.k + bias (float32), scores = raw / tau + mask.

    Written in place on the one fresh tensor the matmul returns, so a block
    costs one matmul and one pass per step (add, scale, mask) and no copies;
    ``raw`` is a copy only when asked for (``keep_raw``), else None.
    ``scheme``: a position scheme's mask rows are ANDed into the mask, and a
    rectified scheme's logits replace the matmul (raw is then those logits).
    """
    allowed = None if scheme is None else scheme.mask(r0, r1)
    if scheme is not None and scheme.logits is not None:
        scores = scheme.logits(r0, r1, allowed)
    else:
        scores = torch.matmul(query[:, :, r0:r1], keyT)
    if scores.dtype != torch.float32:
        scores = scores.float()
    if position_bias is not None:
        scores.add_(position_bias[:, :, r0:r1])
    raw = scores.clone() if keep_raw else None
    if tau is not None:
        scores.div_(_rows(tau, r0, r1))
    if attention_mask is not None:
        m = attention_mask[:, :, r0:r1] if attention_mask.shape[-2] > 1 else attention_mask
        if m.dtype == torch.bool:
            scores.masked_fill_(~m, torch.finfo(scores.dtype).min)
        else:
            scores.add_(m)
    elif causal:
        k_len, q_len = keyT.shape[-1], query.shape[-2]
        rows = torch.arange(r0, r1, device=scores.device)[:, None] + (k_len - q_len)
        cols = torch.arange(k_len, device=scores.device)[None, :]
        scores.masked_fill_(cols > rows, torch.finfo(scores.dtype).min)
    if allowed is not None:
        scores.masked_fill_(~allowed, torch.finfo(scores.dtype).min)
    return raw, scores


def _probed(query, keyT, value, attention_mask, position_bias, tau, step: int, causal: bool, kind: str, layer: int,
            recorder: "Recorder | None", weights: list[torch.Tensor] | None = None,
            scheme: _SchemeOps | None = None) -> list[torch.Tensor]:
    """Blocks of softmax(scores) @ v that feed ``recorder``, never normalising a whole block.

    softmax = exp(s - max) / total, and division commutes with the value
    product: (exp @ v) / total. So the block of probabilities is never
    divided (the probes get exp and total, :meth:`Recorder.observe_exp`), and
    ``exp`` is written into one buffer per layer. On the CPU this made a
    probed pass of the default model about a third faster than normalising
    every probability and computing the entropy from them.

    ``weights``: a list to append each block's probabilities to (``output_attentions=True``), or None.
    Those are exp / total with the exponents clamped at :data:`EXP_FLOOR` set to 0, so masked keys
    get exactly 0 as in eager attention (any other weight moves by less than exp(-87) = 1.6e-38).
    """
    q_len = query.shape[-2]
    want_raw = recorder is not None and "sorted_logits" in recorder.asked(kind, layer)
    out = []
    exp_buf: torch.Tensor | None = None
    for r0 in range(0, q_len, step):
        r1 = min(q_len, r0 + step)
        raw, shifted = _block_scores(query, keyT, attention_mask, position_bias, tau, r0, r1, causal, want_raw,
                                     scheme)
        # exp of anything below about -87 underflows float32 into denormals or 0, and the CPU's
        # vectorised exp takes a slow path there (6-10x slower per element, measured): a long
        # input's rows are mostly such far-off keys. exp(-87) = 1.6e-38, so clamping changes each
        # probability by less than that, and Pmax and H by nothing float32 can show.
        shifted.sub_(shifted.amax(-1, keepdim=True)).clamp_(min=EXP_FLOOR)
        if exp_buf is None or exp_buf.numel() < shifted.numel():
            exp_buf = torch.empty(shifted.numel(), dtype=shifted.dtype, device=shifted.device)
        e = torch.exp(shifted, out=exp_buf[: shifted.numel()].view(shifted.shape))
        total = e.sum(-1, keepdim=True)
        if recorder is not None:
            recorder.observe_exp(layer, r0, r1, raw, shifted, e, total, kind=kind)
        if weights is not None:  # before the next block overwrites exp_buf
            weights.append((e / total).masked_fill_(shifted <= EXP_FLOOR, 0.0).to(value.dtype))
        out.append(torch.matmul(e.to(value.dtype), value) / total.to(value.dtype))
    return out


def _fused(query, key, value, attention_mask, position_bias, tau, step: int,
           scheme: _SchemeOps | None = None) -> torch.Tensor:
    """The fast path without probes: ``sdpa(q / tau, k, v, mask = bias / tau + mask, scale = 1)``.

    Exact rewriting of softmax((q.k + bias) / tau + mask) @ v (T5 does not
    scale q.k; a cosine model's q and k arrive already normalised and scaled).
    The bias is still cut into the same blocks of query rows, so the float
    mask handed to the kernel never exceeds the block budget.

    Why the bias is copied on purpose: T5 hands over its bias as a permuted
    view of an ``[L, L, heads]`` lookup, and torch's kernel wants each mask
    row contiguous, so it would copy every block into fresh memory itself
    (page faults included), after our division had already made one strided
    copy: on the 8-head default at 4,096 tokens, more time than the attention
    (bench/README.md). Instead each block is divided (or copied) once into one
    buffer that every block of the layer reuses. Returns ``[batch, q_len, heads, d]``.

    ``scheme``: a position scheme's mask rows (never a rectified scheme: its logits are not q.k) are ANDed
    in per block, as an additive mask (finfo.min where masked), as eager attention takes one: a row whose every
    key is masked (a padding row far from the text under a window) then averages its values instead of giving
    NaN, which the next layer's masked keys would carry into the real rows (0 x NaN).
    """
    scale = 1.0
    if tau is not None:
        t = tau.view(-1)
        if bool((t == t[0]).all()):
            scale = 1.0 / float(t[0])  # exact: no rounding of q in low precision
        else:
            query = query / tau.to(query.dtype)
        tau = tau.to(query.dtype)
    q_len = query.shape[-2]
    # One buffer per role, reused by every block of this layer. Not while training:
    # autograd cannot differentiate through out= arguments (and keeps each block anyway).
    scratch: dict[str, torch.Tensor] | None = None if torch.is_grad_enabled() else {}

    def buffer(role: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """This block's slice of the role's buffer, or None (``out=None``: a fresh tensor) while training."""
        if scratch is None:
            return None
        if role not in scratch:
            scratch[role] = torch.empty((*shape[:2], step, shape[-1]), dtype=dtype, device=query.device)
        return scratch[role][:, :, : shape[2]]

    row_tau = tau is not None and tau.shape[-2] != 1
    head_scale = None if tau is None or row_tau else (1.0 / tau.float()).view(-1, 1)
    out = []
    floor: torch.Tensor | None = None
    for r0 in range(0, q_len, step):
        r1 = min(q_len, r0 + step)
        mask = None
        if isinstance(position_bias, RelativeBias):
            # rows cut from the vector, divided by a per-head tau on the vector itself (one pass per block)
            mask = position_bias.rows(r0, r1, scale=head_scale)
            if row_tau:
                mask = mask.div_(_rows(tau, r0, r1))
            mask = mask.to(query.dtype)
        elif position_bias is not None:
            b = position_bias[:, :, r0:r1]
            if tau is not None or b.stride(-1) != 1 or b.dtype != query.dtype:
                # one pass: divide (by 1 when tau is None), cast and lay out contiguously
                b = torch.div(b, 1.0 if tau is None else _rows(tau, r0, r1), out=buffer("bias", tuple(b.shape), query.dtype))
            mask = b.to(query.dtype)
        if attention_mask is not None:
            m = attention_mask[:, :, r0:r1] if attention_mask.shape[-2] > 1 else attention_mask
            if mask is None:
                mask = m if m.dtype == torch.bool else m.to(query.dtype)
            elif m.dtype == torch.bool:
                shape = torch.broadcast_shapes(m.shape, mask.shape)
                if floor is None:  # made once per layer: a scalar tensor per block would sync a GPU each time
                    floor = torch.tensor(torch.finfo(mask.dtype).min, dtype=mask.dtype, device=mask.device)
                mask = torch.where(m, mask, floor, out=buffer("masked", tuple(shape), mask.dtype))
            else:
                mask = mask + m.to(mask.dtype)
        allowed = None if scheme is None else scheme.mask(r0, r1)
        if allowed is not None:
            if floor is None:
                floor = torch.tensor(torch.finfo(query.dtype).min, dtype=query.dtype, device=query.device)
            if mask is None:
                mask = torch.where(allowed, torch.zeros((), dtype=query.dtype, device=query.device), floor)
            elif mask.dtype == torch.bool:
                mask = torch.where(mask & allowed, torch.zeros((), dtype=query.dtype, device=query.device), floor)
            else:
                mask = torch.where(allowed, mask, floor)
        out.append(torch.nn.functional.scaled_dot_product_attention(
            query[:, :, r0:r1], key, value, attn_mask=mask, scale=scale))
    attn = out[0] if len(out) == 1 else torch.cat(out, dim=2)
    return attn.transpose(1, 2).contiguous()


def register() -> None:
    """Make ``attn_implementation="aligned"`` available to transformers (idempotent)."""
    AttentionInterface.register(ATTN_NAME, aligned_attention)
    # Boolean masks (True = attend), None when there is no padding: 4x smaller
    # than additive float masks, and nothing at all in the common case.
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)


register()
