"""One block of attention rows, from q and k to the softmax's pieces and the output: the backends and their choice.

:func:`core.mechanics.attention.aligned_attention` cuts every attention call into blocks of query rows (so at most
``batch x heads x rows x keys`` scores exist at once) and asks one backend for each block. Whatever the
backend, a block comes back as one :class:`Block`: the output rows, and, where the backend computes the
softmax itself, its pieces (the un-normalised ``exp(x - max)`` or the probabilities, the row total, the row
sum of ``exp * (x - max)`` for the entropy, the raw logits of the rows the sorted-logits probe sorts). The
recorder (:meth:`core.mechanics.probes.Recorder.observe`) takes that one object, so a probe never depends on which
backend ran, and a backend never knows which probes exist: it hands over what :class:`Needs` asks for.

The backends (:data:`BACKENDS`), chosen in one place, :func:`choose_backend`:

* ``cpu-kernel``: the fused C++ kernel of :mod:`core.mechanics.fused_softmax` (bias read in place, tau, padding mask,
  max, exp and both row sums in two passes over each row). Inference on the CPU in float32, probed or not:
  no autograd, dropout, whole weights, causal mask or position scheme, and a bias and mask it can read in
  place. One scores buffer serves every block of a call (:data:`KERNEL_CHUNK_BYTES`).
* ``sdpa``: torch's ``scaled_dot_product_attention`` with the bias over tau as its additive mask (exact).
  Output only, so only where nothing is probed and nobody needs the probabilities: not for the decoder's
  causal mask, dropout, whole weights or a rectified scheme's logits.
* ``torch``: everything else, in plain torch ops (``exp`` clamped at :data:`EXP_FLOOR` where the
  un-normalised pieces are used; ``torch.softmax`` where nobody probes the block). The only backend
  autograd and dropout run through, and the only one that returns whole weights.
* ``cuda``: the Triton kernel of :mod:`core.mechanics.flash_attention` (bias read in place, tau, padding
  mask, online softmax with each row's total, max and ``sum(exp * (x - max))``; nothing ``L x L``). CUDA
  inference whose layer needs no block's probabilities or raw logits (Pmax and H only, or nothing); a layer
  with a map, profile or sorted logits takes ``torch``.

A backend is ``open``-ed once per attention call (its per-call work: buffers reused by every block of the
call, the bias view, tau laid out), and the opened backend is called per block. On the CPU that reuse is
what keeps page faults out of the hot loop (bench/README.md). A block's ``exp`` may live in such a buffer:
it is valid until the next block of the same call is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from core.mechanics import fused_softmax
from core.mechanics.relative_bias import RelativeBias
from core.values.schedule import ADAPTIVE_MIN_ENTROPY, ADAPTIVE_POLY

#: Bytes of float32 scores one block of query rows may hold (all heads and
#: batch items), per device type. On the CPU a block above glibc's mmap
#: threshold (32 MiB at most) is fresh mmap'd memory every time it is
#: allocated, and the page faults cost more than the softmax: 8 MiB blocks
#: made probed passes of the default model 1.7-2.6x faster than 256 MiB at
#: 2k-4k tokens (bench/README.md). A GPU's caching allocator reuses memory,
#: and large blocks keep its kernels busy. Either way a 16k-token pass holds
#: only a few blocks at once.
CHUNK_BYTES = {"cpu": 8 * 2**20, "cuda": 256 * 2**20}

#: Bytes of float32 scores per block on the ``cpu-kernel`` backend: there one buffer serves every block of a
#: call, so the page faults of a large block are paid once per call, and larger blocks keep the matmuls
#: efficient. Measured on the default model at 8,192 tokens with every probe, 2 threads (bench/README.md):
#: 8 MiB 5.43 s, 32 MiB 4.78 s, 64 MiB 4.35 s, 128 MiB 4.29 s.
KERNEL_CHUNK_BYTES = 64 * 2**20

#: While autograd records (training), every block is kept for the backward pass
#: anyway, so small blocks would save no memory and only add work.
GRAD_CHUNK_BYTES = 256 * 2**20

#: A rectified scheme's block holds, beside its float32 scores, the int64 distances and a boolean or two of the
#: same shape: its blocks get this share of the budget, so a block's memory stays about the budget.
RECTIFIED_BLOCK_SHARE = 4

#: Lowest exponent the ``torch`` backend evaluates: exp(-87) is still a normal float32. Below it the CPU's
#: vectorised exp takes a slow path (6-10x slower per element, measured) and a long input's rows are mostly
#: such far-off keys; clamping changes each probability by less than exp(-87) = 1.6e-38, and Pmax and H by
#: nothing float32 can show. The C++ kernel sets exp to 0 below the same floor.
EXP_FLOOR = -87.0

TORCH, CPU_KERNEL, SDPA, CUDA = "torch", "cpu-kernel", "sdpa", "cuda"


def default_chunk_bytes(device: torch.device | str) -> int:
    """The block budget for ``device`` (see :data:`CHUNK_BYTES`; other devices get the CPU's)."""
    return CHUNK_BYTES.get(torch.device(device).type, CHUNK_BYTES["cpu"])


@dataclass(frozen=True)
class Needs:
    """What a recorder asks of one attention call's blocks beyond the output (:meth:`core.mechanics.probes.Recorder.begin_layer`).

    ``stats``: the row sums of ``exp * (x - max)`` (:attr:`Block.dot`, for the entropy).
    ``raw_rows(r0, r1)``: the rows of block ``[r0, r1)`` (relative to ``r0``, int64) whose raw logits
    (q.k + bias, before tau and masks) the block must carry (:attr:`Block.raw`), or None for none of them;
    None: no raw logits at all. ``probs``: a view reads the block's probabilities (``exp``/``total`` or
    ``probs``: a map, a profile); without it a backend may hand over only each row's ``total`` and ``dot``
    (the ``cuda`` kernel). ``rows``: ``(a, b)``, the only query rows whose blocks the recorder reads (a decoder's
    question rows: Pmax and H weighed on them alone), or None: every row. The rows before ``a`` may then be computed
    by a backend that probes nothing (:func:`core.mechanics.attention.aligned_attention`). Any ``Needs`` also
    means: more than the block's output."""

    stats: bool = False
    raw_rows: Callable[[int, int], torch.Tensor | None] | None = None
    probs: bool = False
    rows: tuple[int, int] | None = None


@dataclass(frozen=True)
class Block:
    """Query rows ``[r0, r1)`` of one attention call, as one backend computed them.

    ``out``: the output rows ``[B, H, c, d]`` (softmax @ v, after dropout), in the value's dtype.
    ``exp``: ``exp(x - max)`` ``[B, H, c, K]`` float32, x = (q.k + bias) / tau + mask, exponents at or above
    :data:`EXP_FLOOR` (the kernel writes 0 below it, torch clamps); with ``total`` its row sums ``[B, H, c, 1]``:
    the probabilities are ``exp / total``. None where the backend made normalised ``probs`` instead (``torch``
    when nobody probes) or nothing (``sdpa``). May live in a buffer the next block overwrites.
    ``probs``: normalised probabilities ``[B, H, c, K]`` (before dropout) where the backend made them
    without ``exp``.
    ``top``: the row max of x ``[B, H, c, 1]`` where the backend keeps it (``torch``), else None.
    ``dot``: ``sum(exp * (x - max))`` per row ``[B, H, c, 1]`` when :attr:`Needs.stats` asked (the kernel
    always gives it), else None: then H = log(total) - dot / total and Pmax = 1 / total.
    ``raw``: raw logits (q.k + bias, before tau) of the rows :attr:`Needs.raw_rows` named,
    ``[B, H, rows, K]`` float32, or None.
    ``weights``: the probabilities ``output_attentions=True`` returns ``[B, H, c, K]`` (value dtype, after
    dropout, masked keys exactly 0) when asked, else None.
    ``probs_rows(a, b, k)``: item 0's probabilities ``[H, b - a, k]`` (float32) of rows ``[a, b)`` over the first
    ``k`` keys (None: all), computed on demand, from a backend that keeps no block of probabilities (``cuda``:
    a profile's few rows)."""

    r0: int
    r1: int
    out: torch.Tensor | None = None
    exp: torch.Tensor | None = None
    total: torch.Tensor | None = None
    probs: torch.Tensor | None = None
    top: torch.Tensor | None = None
    dot: torch.Tensor | None = None
    raw: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    probs_rows: Callable[[int, int, int | None], torch.Tensor] | None = None


@dataclass(frozen=True)
class Inputs:
    """One attention call as the backends see it (made once per call by :func:`core.mechanics.attention.aligned_attention`).

    ``query`` ``[B, H, q, d]`` and ``key``/``value`` ``[B, H, K, d]``: the logit operands
    (:func:`core.mechanics.attention.logit_operands`: scaled, or normalised for CosScale). ``mask``: the attention mask,
    boolean (True = attend) or additive float, ``[B, 1, q | 1, K]``, or None. ``bias``: T5's position bias
    ``[1 | B, H, q, K]`` (a :class:`~core.mechanics.relative_bias.RelativeBias`, read in place, or a tensor) or None.
    ``tau``: ``[H, 1, 1]`` per head or ``[1, q, 1]`` per row, or None (1). ``causal``: the decoder's causal
    mask (no mask given). ``scheme``: a position scheme's per-call operations
    (:class:`core.mechanics.attention._SchemeOps`: ``mask(r0, r1)`` rows ANDed into the mask; ``logits`` the rectified
    logits, or None) or None. ``needs``: what a recorder asks of the blocks (None: nothing is probed).
    ``weights``: ``output_attentions=True``. ``dropout``: the probability while training, else 0.
    ``grad``: autograd records (no ``out=`` buffers then). ``adaptive``: adaptive temperature (:func:`adaptive_rows`):
    each row's logits, after tau and the masks, multiplied by a beta from that row's own entropy (``torch`` only).

    Decoder-only models (:data:`core.mechanics.attention.FAMILIES` ``decoder``): ``key``/``value`` may have fewer
    heads than ``query`` (grouped-query attention: query head ``h`` reads key head ``h // (H // H_kv)``, as
    transformers' ``repeat_kv`` lays them out), read in place by :func:`grouped_matmul`, never repeated.
    ``softcap``: Gemma 2's logit soft-capping, ``c * tanh(z / c)`` of the scaled logits z before tau and the
    mask (so tau divides the capped logits fed to the softmax), or None. ``sinks``: gpt-oss's per-head sink
    logits ``[H]`` (``s_aux``), one more column of every row's softmax that no value is read from, divided by
    the same tau (``torch`` only), or None."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: torch.Tensor | None = None
    bias: Any = None
    tau: torch.Tensor | None = None
    causal: bool = False
    scheme: Any = None
    needs: Needs | None = None
    weights: bool = False
    dropout: float = 0.0
    grad: bool = False
    adaptive: bool = False
    softcap: float | None = None
    sinks: torch.Tensor | None = None

    @property
    def grouped(self) -> bool:
        """Whether key and value have fewer heads than the query (grouped-query attention)."""
        return self.key.shape[1] != self.query.shape[1]

    @property
    def rectified(self) -> bool:
        """Whether a position scheme replaces q.k by its own logits."""
        return self.scheme is not None and self.scheme.logits is not None

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(batch, heads, q_len, k_len)``."""
        b, h, q, _ = self.query.shape
        return b, h, q, self.key.shape[-2]


#: An opened backend: ``rows(r0, r1) -> Block`` for one call's blocks of query rows.
Rows = Callable[[int, int], Block]


@dataclass(frozen=True)
class Backend:
    """One way to compute blocks. ``open(inputs, rows_per_block)`` does the per-call work and returns the
    block function (:data:`Rows`); ``budget(inputs, asked)``: bytes of float32 scores per block (``asked``:
    the call's ``chunk_bytes`` or None). ``open`` None: registered but not available here."""

    name: str
    open: Callable[[Inputs, int], Rows] | None
    budget: Callable[[Inputs, int | None], int]
    about: str
    usable: Callable[[], bool] = lambda: True

    @property
    def available(self) -> bool:
        """Whether :func:`choose_backend` may pick it on this machine (``open`` exists and ``usable()``)."""
        return self.open is not None and self.usable()


def choose_backend(x: Inputs) -> str:
    """The backend (:data:`BACKENDS`) for one attention call: the one place with the rules.

    1. ``cuda``: a CUDA pass :func:`cuda_serves` (inference, no scheme or sinks, a bias and padding mask read in
       place or causal rows, grouped K/V and soft-cap included, nothing that needs a block's probabilities or raw
       logits) on a machine with Triton
       (:func:`core.mechanics.flash_attention.usable`; ``AAE_FLASH_ATTENTION=0`` switches it off). A layer whose
       map, profile or sorted logits are asked takes ``torch`` (one layer of a probed pass).
    2. ``sdpa``, for a causal prefill nobody probes (:func:`sdpa_prefill`): torch's fused kernel, which never
       holds a block of scores, took 2.8 s where ours took 5.3 s for one of SmolLM2's layers at 16k tokens on the
       2-core AVX2 CPU (bench/README.md); the rows' own temperature goes into q.
    3. ``cpu-kernel``: inference on the CPU in float32 (no autograd, dropout or whole weights), no position
       scheme, a bias and padding mask it can read in place (:func:`_kernel_view`) or causal rows (masked inside
       the kernel, the key blocks no row sees skipped), and the kernel built here
       (:func:`core.mechanics.fused_softmax.available`; ``AAE_FUSED_SOFTMAX=0`` switches it off).
    4. ``sdpa``: nothing probed and nothing that needs the probabilities or a mask torch cannot be handed:
       no causal mask, dropout, whole weights or rectified logits.
    5. ``torch``: the rest, and every call with adaptive temperature (:func:`adaptive_rows`): it needs each row's
       entropy before the row's softmax, a second softmax over the same logits that only this backend runs (the
       C++ and Triton kernels compute one softmax per row in their passes; sdpa takes the logits' scale per call,
       not per row from the row itself), and every call with gpt-oss's sink logits (one more softmax column).

    A decoder-only model's calls follow the same rules. An unpadded prefill arrives as causal rows (transformers'
    mask function hands over no mask then, so nothing ``L x L`` exists): on a GPU it takes the Triton kernel
    (:func:`cuda_serves`: causal rows and grouped K/V too); nobody probing it, ``sdpa`` (``is_causal``); probed,
    on the CPU the C++ kernel (half the work: :func:`_open_kernel`), else ``torch``. A recorder that reads only
    some rows (:attr:`Needs.rows`) has the rows before them computed by ``sdpa`` too. A prefill with a mask of rows of its own (a padded batch, Mistral's or Gemma 2's sliding window
    once the input is longer than the window, a chunk after cached keys) takes ``sdpa`` when nothing is probed
    and no ``softcap`` applies, else ``torch``. A cached decoding step (one query row, a key mask or none) takes
    the C++ kernel. Grouped K/V (:attr:`Inputs.grouped`) is read in place by every backend
    (:func:`grouped_matmul`; the Triton kernel maps each query head to its key head), and Gemma 2's ``softcap`` is
    applied by ``torch``, ``cpu-kernel`` (capped in place before the kernel's pass) and ``cuda``.
    """
    if x.adaptive or x.sinks is not None:
        return TORCH
    if x.query.device.type == "cuda" and cuda_serves(x) and BACKENDS[CUDA].available:  # pragma: no cover (GPU)
        return CUDA
    if sdpa_prefill(x):
        return SDPA
    if (
        x.query.device.type == "cpu"
        and x.query.dtype == torch.float32
        and x.value.dtype == torch.float32
        and not (x.grad or x.query.requires_grad or x.dropout or x.weights or x.adaptive)
        and x.scheme is None
        and _kernel_view(x) is not None
        and fused_softmax.available()
    ):
        return CPU_KERNEL
    if x.needs is None and not (
        x.causal or x.dropout or x.weights or x.rectified or x.adaptive or x.softcap is not None
    ):
        return SDPA
    return TORCH


def sdpa_prefill(x: Inputs) -> bool:
    """Whether ``sdpa`` serves this call as a causal prefill: causal rows over as many keys (``q_len == k_len``,
    nothing cached before them), nothing probed, and nothing ``sdpa`` cannot be handed as it is (autograd is fine;
    dropout, whole weights, a position scheme's mask or logits, soft-capping, sinks and adaptive rows are not).
    Its rows' temperature (one value, per head or per row) is an exact rewriting: q over tau."""
    b, h, q, k = x.shape
    return (
        x.causal
        and q == k
        and x.needs is None
        and x.mask is None
        and x.bias is None
        and x.scheme is None
        and not (x.dropout or x.weights or x.adaptive or x.sinks is not None or x.softcap is not None)
    )


def grouped_matmul(a: torch.Tensor, m: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ m`` per head with ``a`` ``[B, H, c, x]`` and ``m`` ``[B, H_kv, x, y]``, ``H`` a multiple of ``H_kv``:
    ``[B, H, c, y]``, query head ``h`` multiplied by ``m``'s head ``h // (H // H_kv)`` (transformers' ``repeat_kv``
    order). ``out``: a contiguous ``[B, H, c, y]`` to write into.

    Grouped-query attention without repeating K/V: the ``G = H / H_kv`` query heads of one key head are
    folded into its rows (``a`` as ``[B, H_kv, G * c, x]``, a copy of ``a`` only where it is not contiguous:
    a block of query rows or of probabilities, never the keys or values), one batched matmul per key head,
    and the result seen as ``[B, H, c, y]`` again (a view). With as many heads, plain ``torch.matmul``."""
    b, h, c, _ = a.shape
    hk = m.shape[1]
    if hk == h:
        return torch.matmul(a, m) if out is None else torch.matmul(a, m, out=out)
    folded = a.reshape(b, hk, (h // hk) * c, a.shape[-1])
    if out is None:
        return torch.matmul(folded, m).view(b, h, c, m.shape[-1])
    torch.matmul(folded, m, out=out.view(b, hk, (h // hk) * c, m.shape[-1]))
    return out


def fold_rows(t: torch.Tensor, groups: int) -> torch.Tensor:
    """A per-row tensor ``[B, 1 | H, c, K]`` (a mask) laid out for :func:`grouped_matmul`'s folded rows,
    ``[B, 1 | H_kv, G * c, K]``: the rows repeated once per query head of a group (a block's mask rows, bounded
    by the block budget; a single row ``[B, 1, 1, K]`` is returned as it is, it broadcasts)."""
    if groups == 1 or t.shape[-2] == 1:
        return t
    b, h, c, k = t.shape
    if h == 1:
        return t.unsqueeze(2).expand(b, 1, groups, c, k).reshape(b, 1, groups * c, k)
    return t.reshape(b, h // groups, groups * c, k)


def softcapped(scores: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Gemma 2's soft-capping ``cap * tanh(scores / cap)``, in place (``scores`` returned); None: unchanged."""
    if cap is None:
        return scores
    return scores.div_(cap).tanh_().mul_(cap)


def cuda_serves(x: Inputs) -> bool:
    """Whether the ``cuda`` kernel computes this call exactly as asked (its device aside): see :func:`choose_backend`."""
    needs = x.needs
    return (
        not (x.grad or x.query.requires_grad or x.dropout or x.weights or x.adaptive)
        and x.scheme is None
        and x.sinks is None
        and (needs is None or (needs.raw_rows is None and not needs.probs))
        and _kernel_view(x) is not None
    )


def rows_per_block(name: str, x: Inputs, asked: int | None) -> int:
    """How many query rows one block of backend ``name`` takes for this call."""
    b, h, q, k = x.shape
    return _chunk_rows(b, h, q, k, BACKENDS[name].budget(x, asked))


def open_backend(name: str, x: Inputs, rows: int) -> Rows:
    """Backend ``name`` opened for this call, blocks of ``rows`` query rows: ``f(r0, r1) -> Block``."""
    backend = BACKENDS[name]
    if backend.open is None:
        raise RuntimeError(f"the {name} attention backend is not available here")
    return backend.open(x, rows)


def _chunk_rows(batch: int, heads: int, q_len: int, k_len: int, budget: int) -> int:
    per_row = max(1, batch * heads * k_len * 4)
    return max(1, min(q_len, budget // per_row))


def _rows(tau: torch.Tensor | None, r0: int, r1: int) -> torch.Tensor | None:
    """The part of a tau for query rows ``[r0, r1)``: a per-row tau (``[1, q_len, 1]``) is cut, a per-head one kept."""
    return tau if tau is None or tau.shape[-2] == 1 else tau[:, r0:r1]


def _torch_budget(x: Inputs, asked: int | None) -> int:
    budget = asked
    if budget is None:
        budget = GRAD_CHUNK_BYTES if x.grad else default_chunk_bytes(x.query.device)
    if x.rectified:  # rectified logits hold a block's int64 distances and two boolean selections beside its scores
        budget = max(1, budget // RECTIFIED_BLOCK_SHARE)
    return budget


def _sdpa_budget(x: Inputs, asked: int | None) -> int:
    if x.causal or (x.bias is None and x.mask is None and x.scheme is None):
        # nothing L x L to bound (a rotary encoder on an unpadded batch): one call, one block
        return max(1, x.shape[0] * x.shape[1] * x.shape[2] * x.shape[3] * 4)
    return _torch_budget(x, asked)


# -- torch ---------------------------------------------------------------------------------------------------


def _block_scores(
    x: Inputs,
    keyT: torch.Tensor,
    r0: int,
    r1: int,
    raw_rows: torch.Tensor | None,
    cols: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(raw, scores)`` of query rows ``[r0, r1)``: scores = (q.k + bias) / tau + mask (float32), raw = the
    rows ``raw_rows`` of q.k + bias (a copy taken before tau), or None.

    Written in place on the one fresh tensor the matmul returns, so a block costs one matmul and one pass
    per step (add, scale, mask) and no copies. A position scheme's mask rows are ANDed into the mask, and a
    rectified scheme's logits replace the matmul (raw is then those logits). ``cols``: only these keys' columns
    (a band's, :func:`_band_block`; no bias then)."""
    scheme = x.scheme
    allowed = None if scheme is None else scheme.mask(r0, r1, cols)
    if scheme is not None and scheme.logits is not None:
        scores = scheme.logits(r0, r1, allowed, cols)
    else:
        scores = grouped_matmul(x.query[:, :, r0:r1], keyT if cols is None else keyT.index_select(-1, cols))
    if scores.dtype != torch.float32:
        scores = scores.float()
    if x.bias is not None:
        scores.add_(x.bias[:, :, r0:r1])
    if x.softcap is not None:
        scores = torch.tanh(scores / x.softcap) * x.softcap if x.grad else softcapped(scores, x.softcap)
    raw = None if raw_rows is None else scores[:, :, raw_rows.to(scores.device)]  # a copy (index_select: slower)
    if x.tau is not None:
        scores.div_(_rows(x.tau, r0, r1))
    m = x.mask
    if m is not None:
        m = m[:, :, r0:r1] if m.shape[-2] > 1 else m
        if cols is not None:
            m = m.index_select(-1, cols.to(m.device))
        if m.dtype == torch.bool:
            scores.masked_fill_(~m, torch.finfo(scores.dtype).min)
        else:
            scores.add_(m)
    elif x.causal:
        k_len, q_len = keyT.shape[-1], x.query.shape[-2]
        rows = torch.arange(r0, r1, device=scores.device)[:, None] + (k_len - q_len)
        keys = torch.arange(k_len, device=scores.device) if cols is None else cols.to(scores.device)
        scores.masked_fill_(keys[None, :] > rows, torch.finfo(scores.dtype).min)
    if allowed is not None:
        scores.masked_fill_(~allowed, torch.finfo(scores.dtype).min)
    return raw, scores


def _exp_rows(
    scores: torch.Tensor,
    out: torch.Tensor | None = None,
    sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``torch`` backend's softmax, un-normalised: ``(top, shifted, e, total)`` of a block of logit rows, with
    ``shifted = x - top`` clamped at :data:`EXP_FLOOR`, ``e = exp(shifted)`` and ``total`` its row sums (the
    probabilities are ``e / total``). ``out``: a buffer to write ``e`` into, ``scores`` then shifted in place
    (inference); None: fresh tensors, ``scores`` left as it is (autograd, or logits still needed).
    ``sink``: one more logit per row (gpt-oss's sinks over tau, broadcast to ``[B, H, c, 1]``), in ``top`` and
    ``total`` but not in ``e`` (it has no value)."""
    top = scores.amax(-1, keepdim=True)
    if sink is not None:
        top = torch.maximum(top, sink)
    if out is None:
        shifted = (scores - top).clamp(min=EXP_FLOOR)
        e = torch.exp(shifted)
    else:
        shifted = scores.sub_(top).clamp_(min=EXP_FLOOR)
        e = torch.exp(shifted, out=out)
    total = e.sum(-1, keepdim=True)
    if sink is not None:
        total = total + torch.exp((sink - top).clamp(min=EXP_FLOOR))
    return top, shifted, e, total


def adaptive_rows(scores: torch.Tensor) -> torch.Tensor:
    """Adaptive temperature (Velickovic et al. 2024, "softmax is not enough", arXiv 2410.01104) on a block of logit
    rows ``[..., K]`` (masked keys at the dtype's lowest value), the ``torch`` backend's option ``Inputs.adaptive``
    (its first softmax pass over the block): each row's entropy H of its softmax at tau = 1 (:func:`_exp_rows`, nats,
    with the paper's 1e-9 inside the log), its beta = max(poly(H), 1) where H > 0.5 and 1 elsewhere
    (:data:`core.values.schedule.ADAPTIVE_POLY`: the paper's fit), and the row multiplied by its beta, i.e. divided
    by its own tau = 1 / beta: what the ``adaptive`` schedule (:data:`core.values.schedule.ADAPTIVE`) asks of the
    targeted attentions (:func:`core.mechanics.attention._adaptive`). Masked keys stay at the lowest value (their
    product, -inf, is clamped back), so they keep weight 0. A new tensor (autograd sees the whole computation, as in the paper's code)."""
    _, _, e, total = _exp_rows(scores)
    p = e / total
    h = -(p * torch.log(p + 1e-9)).sum(-1, keepdim=True)
    del p, e
    poly = torch.zeros_like(h)
    for c in ADAPTIVE_POLY:  # Horner, highest power first (numpy's polyval)
        poly = poly * h + c
    beta = torch.where(h > ADAPTIVE_MIN_ENTROPY, poly.clamp(min=1.0), torch.ones_like(h))
    return (scores * beta).clamp(min=torch.finfo(scores.dtype).min)


def _open_torch(x: Inputs, step: int) -> Rows:
    """Plain torch ops. Where a recorder takes the blocks (or a rectified scheme's far-off logits would send
    ``exp`` down its slow path), the softmax stays un-normalised: ``exp(x - max)`` clamped at
    :data:`EXP_FLOOR`, written into one buffer per call, and the output is ``(exp @ v) / total`` (division
    commutes with the value product, so no block of probabilities is divided; on the CPU a third faster than
    normalising every probability). Elsewhere (the decoder's causal mask, whole weights, dropout, autograd,
    with nobody probing) ``torch.softmax``. Autograd: no ``out=`` and no in-place step after the row max."""
    keyT = x.key.transpose(-1, -2)
    unnormalised = (
        x.needs is not None or x.sinks is not None or (x.rectified and not (x.weights or x.grad or x.dropout))
    )
    banded = _bandable(x)
    reuse = not x.grad
    # gpt-oss's sink logits as one more column per row, over the same tau as the row's keys: [1, H, 1, 1]
    sinks = None if x.sinks is None else x.sinks.to(torch.float32).view(1, -1, 1, 1)
    buf: list[torch.Tensor] = []
    vdt = x.value.dtype

    def rows(r0: int, r1: int) -> Block:
        want = None if x.needs is None or x.needs.raw_rows is None else x.needs.raw_rows(r0, r1)
        cols = x.scheme.columns(r0, r1) if banded and want is None else None
        if cols is not None:
            return _band_block(x, r0, r1, cols, keyT, buf)
        raw, scores = _block_scores(x, keyT, r0, r1, want)
        if x.adaptive:  # this backend's option: a first softmax pass over the block gives each row its beta
            scores = adaptive_rows(scores)
        if not unnormalised:
            probs = torch.softmax(scores, dim=-1)
            p = torch.nn.functional.dropout(probs, p=x.dropout, training=True) if x.dropout else probs
            p = p.to(vdt)  # a fresh tensor per block: kept as it is for the weights, as eager returns it
            return Block(r0, r1, out=grouped_matmul(p, x.value), probs=probs, raw=raw, weights=p if x.weights else None)
        into = None
        if reuse:
            n = scores.numel()
            if not buf or buf[0].numel() < n:
                buf[:] = [torch.empty(n, dtype=scores.dtype, device=scores.device)]
            into = buf[0][:n].view(scores.shape)
        sink = None
        if sinks is not None:
            sink = sinks if x.tau is None else sinks / _rows(x.tau, r0, r1).unsqueeze(0)
            sink = sink.expand(scores.shape[0], scores.shape[1], r1 - r0, 1)
        top, shifted, e, total = _exp_rows(scores, into, sink)
        dot = None
        if x.needs is not None and x.needs.stats:
            with torch.no_grad():
                dot = torch.einsum("bhck,bhck->bhc", e, shifted).unsqueeze(-1)
                if sink is not None:  # the sink's share of the entropy: its probability is part of the row's
                    s = (sink - top).clamp(min=EXP_FLOOR)
                    dot = dot + torch.exp(s) * s
        weights = None
        if x.dropout:
            # masked keys (clamped at the floor) exactly 0, as in eager attention, then dropped like eager's
            p = (e / total).masked_fill_(shifted <= EXP_FLOOR, 0.0)
            p = torch.nn.functional.dropout(p, p=x.dropout, training=True).to(vdt)
            out = grouped_matmul(p, x.value)
            weights = p if x.weights else None
        else:
            out = grouped_matmul(e.to(vdt), x.value) / total.to(vdt)
            if x.weights:  # before the next block overwrites the buffer; any other weight moves by < exp(-87)
                weights = (e / total).masked_fill_(shifted <= EXP_FLOOR, 0.0).to(vdt)
        return Block(r0, r1, out=out, exp=e, total=total, top=top, dot=dot, raw=raw, weights=weights)

    return rows


def _bandable(x: Inputs) -> bool:
    """Whether this call's blocks may read only their band's keys (:func:`_band_block`): a position scheme's mask
    bounds them, and nothing asks for a whole row (autograd, dropout, whole weights, T5's bias, adaptive rows,
    sinks)."""
    return (
        x.scheme is not None
        and x.bias is None
        and not (x.grad or x.dropout or x.weights or x.adaptive or x.sinks is not None)
        and x.softcap is None
    )


def _band_block(x: Inputs, r0: int, r1: int, cols: torch.Tensor, keyT: torch.Tensor, buf: list) -> Block:
    """Rows ``[r0, r1)`` over the keys ``cols`` only (the band and sinks a scheme's mask lets them see, causal
    rows cut at the row: :attr:`core.mechanics.attention._SchemeOps.columns`): the same softmax, since every other
    key has weight exp(-inf) = 0, at the cost of the band rather than of every key (a StreamingLLM pass of a decoder
    over 4,096 tokens with a window of 251 was 12x its plain pass). A recorder that reads the rows' probabilities
    (a map, a profile) gets them over every key, the others 0; Pmax and H come from the rows' sums as ever."""
    _, scores = _block_scores(x, keyT, r0, r1, None, cols)
    stats = x.needs is not None and x.needs.stats
    # exp in place where nothing else reads the shifted logits; the entropy's dot product needs both
    top, shifted, e, total = _exp_rows(scores, torch.empty_like(scores) if stats else scores)
    dot = torch.einsum("bhck,bhck->bhc", e, shifted).unsqueeze(-1) if stats else None
    vdt = x.value.dtype
    out = grouped_matmul(e.to(vdt), x.value.index_select(2, cols)) / total.to(vdt)
    k_len = x.key.shape[-2]
    if x.needs is None:
        return Block(r0, r1, out=out)
    if not x.needs.probs:  # row statistics, and a profile's few rows over every key on demand

        def probs_rows(a: int, b: int, k: int | None) -> torch.Tensor:
            p = e[0, :, a - r0 : b - r0] / total[0, :, a - r0 : b - r0]
            whole = p.new_zeros(p.shape[0], b - a, k_len).index_copy_(-1, cols, p)
            return whole[..., :k]

        return Block(r0, r1, out=out, total=total, top=top, dot=dot, probs_rows=probs_rows)
    b, h, c, _ = e.shape
    n = b * h * c * k_len
    if not buf or buf[0].numel() < n:
        buf[:] = [torch.empty(n, dtype=e.dtype, device=e.device)]
    full = buf[0][:n].view(b, h, c, k_len).zero_()
    full.index_copy_(-1, cols, e)
    return Block(r0, r1, out=out, exp=full, total=total, top=top, dot=dot)


# -- cpu-kernel ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _KernelView:
    """The bias as one float32 block and how to find a row in it (``strides(r0)``: per head, per row, base),
    and the keys each batch item may attend (``[B, K]`` bool) or None."""

    bias: torch.Tensor | None
    strides: Callable[[int], tuple[int, int, int]]
    keymask: torch.Tensor | None


def _kernel_view(x: Inputs) -> _KernelView | None:
    """The kernel's view of the call's bias and mask, or None when it cannot read them in place.

    A padding mask that is the same for every row becomes one row of keys per item (a per-row mask is not);
    the bias is a :class:`~core.mechanics.relative_bias.RelativeBias` (read in place), none, or a dense ``[1, H, q, k]``
    float32 tensor with contiguous keys (T5's own dense bias, a permuted view, is not)."""
    k_len = x.value.shape[-2]
    keymask = None
    if x.mask is not None:
        m = x.mask
        if m.dtype != torch.bool or m.dim() != 4 or m.shape[1] != 1 or not (m.shape[2] == 1 or m.stride(2) == 0):
            return None
        if m.shape[-1] != k_len:
            return None
        keymask = m[:, 0, 0, :].expand(x.query.shape[0], k_len)
    b = x.bias
    if b is None:
        return _KernelView(None, lambda r0: (0, 0, 0), keymask)
    if isinstance(b, RelativeBias):
        return _KernelView(b.flat(), b.strides, keymask)
    if (
        isinstance(b, torch.Tensor)
        and b.dim() == 4
        and b.shape[0] == 1
        and b.dtype == torch.float32
        and b.stride(-1) == 1
        and b.shape[-1] == k_len
    ):
        hs, rs = (0 if b.shape[1] == 1 else b.stride(1)), b.stride(2)
        return _KernelView(b, lambda r0: (hs, rs, r0 * rs), keymask)
    return None


def _bias_rows(view: _KernelView, r0: int, rows: torch.Tensor, heads: int, k_len: int) -> torch.Tensor:
    """The view's bias of block rows ``r0 + rows`` (a few, for a raw-logit probe): ``[1, H, len(rows), k_len]``.

    Each row is a window of ``k_len`` values of its head's stretch of the flat bias, starting at
    ``base + row * per_row`` (``per_row`` is -1 for T5's lazy vector): the head's windows as one ``unfold`` view,
    the rows picked from it by one indexing copy. Why not a stack of per-row views: torch's ``stack`` and
    ``index_select`` took 1.3 s and 2.0 s of an 8k probed pass with its AVX2 kernels (issue 49)."""
    hs, rs, base = view.strides(r0)
    flat = view.bias.reshape(-1)
    per_head = flat.view(1, -1) if hs == 0 else flat.view(-1, hs)[:heads]
    starts = base + rows.to(torch.int64) * rs
    windows = per_head.unfold(1, k_len, 1)  # [H | 1, positions, k_len]: window a starts at value a
    picked = windows[:, starts]
    return (picked.expand(heads, -1, -1) if hs == 0 else picked).unsqueeze(0)


def _head_tau(tau: torch.Tensor, heads: int) -> torch.Tensor:
    """A tau that is not per row as one value per head ``[H]``: a per-head ``[H, 1, 1]``, or a per-row tau of a
    single row ``[1, 1, 1]`` (a decoder's cached step under a row schedule: one tau for every head)."""
    return tau.reshape(-1).repeat(heads) if tau.numel() == 1 else tau.reshape(heads)


def _open_kernel(x: Inputs, step: int) -> Rows:
    """Per block: one matmul into a buffer every block of the call reuses, the kernel (bias read in place,
    tau, mask, max, exp and the two row sums in two passes over each row while it is in cache), and
    ``(exp @ v) / total``. Raw logits are copied out before the kernel overwrites the block, only for the rows
    :attr:`Needs.raw_rows` names.

    Causal rows (:attr:`Inputs.causal`, a decoder's prefill; row ``i`` sees keys ``0 .. start + i`` with
    ``start = k_len - q_len``): a block of rows ``[r0, r1)`` multiplies only the ``start + r1`` keys its last row
    sees, q.k and exp @ v alike (the key blocks no row of it sees are never computed: about half the work of a
    long prefill), and the kernel masks the block's diagonal itself (``diagonal``: no mask tensor). The scores are
    then ``[B, H, c, start + r1]``, contiguous (a matmul writing into rows of all the keys ran 2x slower here). A
    layer whose probabilities a view reads (:attr:`Needs.probs`: a map, the question's rows) gets its ``exp`` laid
    out over all the keys, as every backend hands it over: the kernel writes it into a second buffer of
    ``[B, H, c, k_len]`` rows, zeroed once per call; blocks come in order, each seeing more keys than the one
    before, so the keys past a block's own stay zero without being written. Elsewhere ``exp`` is None and the
    block carries ``total`` and ``dot`` (Pmax and H need nothing more) and ``probs_rows`` for a profile's few
    rows, as the ``cuda`` backend's do. The raw
    logits a probe asks for are those of every key, as the ``torch`` backend gives them (a product of the few
    rows asked)."""
    view = _kernel_view(x)
    batch, heads, q_len, k_len = x.shape
    keyT = x.key.transpose(-1, -2)
    tau = x.tau
    per_row = tau is not None and tau.shape[-2] != 1
    tau_heads = None if tau is None or per_row else _head_tau(tau, heads)
    size = batch * heads * min(step, q_len) * k_len
    buf = torch.empty(size, dtype=torch.float32)
    start = k_len - q_len
    causal = x.causal and q_len > 1
    wide = torch.zeros(size, dtype=torch.float32) if causal and x.needs is not None and x.needs.probs else None

    def rows(r0: int, r1: int) -> Block:
        c = r1 - r0
        seen = start + r1 if causal else k_len  # the keys the block's last row sees
        scores = buf[: batch * heads * c * seen].view(batch, heads, c, seen)
        grouped_matmul(x.query[:, :, r0:r1], keyT[..., :seen], out=scores)
        softcapped(scores, x.softcap)
        want = None if x.needs is None or x.needs.raw_rows is None else x.needs.raw_rows(r0, r1)
        raw = None
        if want is not None:
            if seen == k_len:
                raw = scores[:, :, want]  # an indexing copy: index_select along rows is 20x slower here (issue 49)
            else:  # every key's logit, the ones past the diagonal included, as the torch backend's raw rows
                raw = softcapped(grouped_matmul(x.query[:, :, r0:r1][:, :, want], keyT), x.softcap)
            if view.bias is not None:
                raw.add_(_bias_rows(view, r0, want, heads, k_len))
        t, per = (tau[0, r0:r1, 0], "row") if per_row else (tau_heads, "head")
        into = None if wide is None else wide[: batch * heads * c * k_len].view(batch, heads, c, k_len)
        total, dot = fused_softmax.softmax_rows(
            scores,
            view.bias,
            view.strides(r0),
            t,
            per,
            view.keymask,
            diagonal=start + r0 if causal else None,
            out=into,
        )
        exp = scores if into is None else into[..., :seen]
        out = grouped_matmul(exp, x.value[:, :, :seen]).div_(total)
        if not causal or into is not None:
            return Block(r0, r1, out=out, exp=scores if into is None else into, total=total, dot=dot, raw=raw)

        def probs_rows(a: int, b: int, k: int | None) -> torch.Tensor:
            """Item 0's rows ``[a, b)`` over the first ``k`` keys (a profile's few rows), from the block's exp."""
            k = k_len if k is None else k
            p = scores[0, :, a - r0 : b - r0, : min(k, seen)] / total[0, :, a - r0 : b - r0]
            return torch.nn.functional.pad(p, (0, k - p.shape[-1])) if k > p.shape[-1] else p

        return Block(r0, r1, out=out, total=total, dot=dot, raw=raw, probs_rows=probs_rows)

    return rows


#: A causal call on the ``cpu-kernel`` backend is cut into at least this many blocks of rows (while a block keeps
#: :data:`CAUSAL_MIN_ROWS` rows): a block multiplies the keys its last row sees, so one block of all the rows would
#: compute the whole square; with n blocks the keys past the diagonal computed anyway are ``1 / (2 n)`` of the work.
CAUSAL_BLOCKS = 16
CAUSAL_MIN_ROWS = 32


def _kernel_budget(x: Inputs, asked: int | None) -> int:
    """Bytes of scores per block on the ``cpu-kernel`` backend: the call's budget, or :data:`KERNEL_CHUNK_BYTES`;
    causal rows get at most a :data:`CAUSAL_BLOCKS`-th of the call's rows per block (see there)."""
    budget = asked or KERNEL_CHUNK_BYTES
    b, h, q, k = x.shape
    if x.causal and q > 1:
        budget = min(budget, b * h * k * 4 * max(CAUSAL_MIN_ROWS, -(-q // CAUSAL_BLOCKS)))
    return budget


# -- cuda ----------------------------------------------------------------------------------------------------


def _open_cuda(x: Inputs, step: int) -> Rows:
    """The Triton kernel (:func:`core.mechanics.flash_attention.attend`): the whole call in one block (nothing
    ``L x L`` is ever held), its output and each row's ``total``, ``dot`` and max, with the bias and padding mask
    read in place as the CPU kernel reads them (:func:`_kernel_view`); a decoder's causal rows masked and their
    unseen key blocks skipped inside the kernel, grouped K/V read in place, Gemma 2's soft-cap applied there."""
    from core.mechanics import flash_attention

    view = _kernel_view(x)
    tau = x.tau
    per_row = tau is not None and tau.shape[-2] != 1
    _, heads, q_len, k_len = x.shape
    causal, start = x.causal and q_len > 1, k_len - q_len

    def rows(r0: int, r1: int) -> Block:
        t, per = (
            (None, "head") if tau is None else (tau[0, r0:r1, 0], "row") if per_row else (_head_tau(tau, heads), "head")
        )
        out, total, dot, top = flash_attention.attend(
            x.query[:, :, r0:r1],
            x.key,
            x.value,
            view.bias,
            view.strides(r0),
            t,
            per,
            view.keymask,
            diagonal=start + r0 if causal else None,
            softcap=x.softcap,
        )

        def probs_rows(a: int, b: int, k: int | None) -> torch.Tensor:
            """Rows ``[a, b)`` of item 0, as the kernel normalised them: exp(x - top) / total, the logits x
            made as the ``torch`` backend makes a block's (:func:`_block_scores`), the kernel's own row max and
            total dividing them (no softmax of its own here)."""
            first = _first_item(x)  # a profile's rows are item 0's
            z = _block_scores(first, first.key.transpose(-1, -2), a, b, None)[1][0]  # [H, n, K]
            p = torch.exp(z - top[0, :, a - r0 : b - r0]) / total[0, :, a - r0 : b - r0]
            return p if k is None else p[..., :k]

        return Block(r0, r1, out=out, total=total, dot=dot, top=top, probs_rows=probs_rows)

    return rows


def _first_item(x: Inputs) -> Inputs:
    """The call cut to its first batch item (a bias or mask shared by the batch is kept as it is)."""

    def first(t: Any) -> Any:
        return t if t is None or t.shape[0] == 1 else t[:1]

    return replace(
        x,
        query=x.query[:1].float(),
        key=x.key[:1].float(),
        value=x.value[:1],
        mask=first(x.mask),
        bias=first(x.bias),
        needs=None,
    )


def _whole_call(x: Inputs, asked: int | None) -> int:
    """One block for the whole call (the kernel holds no scores): the call's size in float32 scores."""
    b, h, q, k = x.shape
    return max(1, b * h * q * k * 4)


def _cuda_usable() -> bool:
    from core.mechanics import flash_attention

    return flash_attention.usable()


# -- sdpa ----------------------------------------------------------------------------------------------------


def _open_sdpa(x: Inputs, step: int) -> Rows:
    """``sdpa(q / tau, k, v, mask = bias / tau + mask, scale = 1)``: an exact rewriting of
    softmax((q.k + bias) / tau + mask) @ v (T5 does not scale q.k; a cosine model's q and k arrive already
    normalised and scaled). The bias is cut into the same blocks of query rows, so the float mask handed to
    the kernel never exceeds the block budget.

    Why the bias is copied on purpose: T5 hands over its bias as a permuted view of an ``[L, L, heads]``
    lookup, and torch's kernel wants each mask row contiguous, so it would copy every block into fresh memory
    itself (page faults included), after our division had already made one strided copy: on the 8-head
    default at 4,096 tokens, more time than the attention (bench/README.md). Instead each block is divided
    (or copied) once into one buffer that every block of the call reuses (not while training: autograd
    cannot differentiate through ``out=``).

    A position scheme's mask rows (never a rectified scheme: its logits are not q.k) are ANDed in per block,
    as an additive mask (finfo.min where masked), as eager attention takes one: a row whose every key is
    masked (a padding row far from the text under a window) then averages its values instead of giving NaN,
    which the next layer's masked keys would carry into the real rows (0 x NaN).

    Grouped K/V (a decoder-only model's): the query heads of each key head are folded into its rows, and a
    block's mask rows with them (:func:`fold_rows`), so sdpa reads the keys and values in place (its own
    ``enable_gqa`` may repeat them on the CPU)."""
    if x.causal:
        return _open_sdpa_causal(x)
    key, value, tau = x.key, x.value, x.tau
    query, scale = _tempered_query(x)
    if tau is not None:
        tau = tau.to(query.dtype)
    scratch: dict[str, torch.Tensor] | None = None if x.grad else {}
    groups = query.shape[1] // key.shape[1]

    def buffer(role: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """This block's slice of the role's buffer, or None (``out=None``: a fresh tensor) while training."""
        if scratch is None:
            return None
        if role not in scratch:
            scratch[role] = torch.empty((*shape[:2], step, shape[-1]), dtype=dtype, device=query.device)
        return scratch[role][:, :, : shape[2]]

    row_tau = tau is not None and tau.shape[-2] != 1
    head_scale = None if tau is None or row_tau else (1.0 / tau.float()).view(-1, 1)
    floor: list[torch.Tensor] = []  # made once per call: a scalar tensor per block would sync a GPU each time

    def min_of(dtype: torch.dtype) -> torch.Tensor:
        if not floor:
            floor.append(torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=query.device))
        return floor[0]

    def rows(r0: int, r1: int) -> Block:
        mask = None
        bias = x.bias
        if isinstance(bias, RelativeBias):
            # rows cut from the vector, divided by a per-head tau on the vector itself (one pass per block)
            mask = bias.rows(r0, r1, scale=head_scale)
            if row_tau:
                mask = mask.div_(_rows(tau, r0, r1))
            mask = mask.to(query.dtype)
        elif bias is not None:
            b = bias[:, :, r0:r1]
            if tau is not None or b.stride(-1) != 1 or b.dtype != query.dtype:
                # one pass: divide (by 1 when tau is None), cast and lay out contiguously
                b = torch.div(
                    b, 1.0 if tau is None else _rows(tau, r0, r1), out=buffer("bias", tuple(b.shape), query.dtype)
                )
            mask = b.to(query.dtype)
        if x.mask is not None:
            m = x.mask[:, :, r0:r1] if x.mask.shape[-2] > 1 else x.mask
            if mask is None:
                mask = m if m.dtype == torch.bool else m.to(query.dtype)
            elif m.dtype == torch.bool:
                shape = torch.broadcast_shapes(m.shape, mask.shape)
                mask = torch.where(m, mask, min_of(mask.dtype), out=buffer("masked", tuple(shape), mask.dtype))
            else:
                mask = mask + m.to(mask.dtype)
        allowed = None if x.scheme is None else x.scheme.mask(r0, r1)
        if allowed is not None:
            low = min_of(query.dtype)
            zero = torch.zeros((), dtype=query.dtype, device=query.device)
            if mask is None:
                mask = torch.where(allowed, zero, low)
            elif mask.dtype == torch.bool:
                mask = torch.where(mask & allowed, zero, low)
            else:
                mask = torch.where(allowed, mask, low)
        q = query[:, :, r0:r1]
        if groups > 1:  # grouped K/V read in place: each key head's query heads folded into its rows
            b, h, c, d = q.shape
            q = q.reshape(b, h // groups, groups * c, d)
            mask = None if mask is None else fold_rows(mask, groups)
        out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scale)
        if groups > 1:
            out = out.view(b, h, c, value.shape[-1])
        return Block(r0, r1, out=out)

    return rows


def _tempered_query(x: Inputs) -> tuple[torch.Tensor, float]:
    """``(q, scale)`` such that ``sdpa(q, k, v, scale=scale)`` divides the logits by the call's tau: one value for
    every row and head is sdpa's ``scale`` (exact: no rounding of q in low precision); per head or per row, q over
    tau (one copy of q per call)."""
    tau = x.tau
    if tau is None:
        return x.query, 1.0
    t = tau.view(-1)
    if bool((t == t[0]).all()):
        return x.query, 1.0 / float(t[0])
    return x.query / tau.to(x.query.dtype), 1.0


def _open_sdpa_causal(x: Inputs) -> Rows:
    """A causal prefill (:func:`sdpa_prefill`) through ``sdpa``: rows ``[r0, r1)`` see keys ``0 .. r0 + i``, so a
    block of rows takes the first ``r1`` keys and values, with ``is_causal`` from row 0 (the prefix of a call whose
    later rows a recorder reads, or the whole call) and a boolean mask of the block's own diagonal past it.
    Grouped K/V go to ``enable_gqa`` (folding query heads into rows, as :func:`_open_sdpa` does, would break the
    causal order of the rows). tau: :func:`_tempered_query`."""
    key, value = x.key, x.value
    query, scale = _tempered_query(x)
    grouped = x.grouped

    def rows(r0: int, r1: int) -> Block:
        q = query[:, :, r0:r1]
        mask = None
        if r0 > 0:
            keys = torch.arange(r1, device=q.device)
            mask = keys[None, :] <= torch.arange(r0, r1, device=q.device)[:, None]
        out = torch.nn.functional.scaled_dot_product_attention(
            q,
            key[:, :, :r1],
            value[:, :, :r1],
            attn_mask=mask,
            is_causal=mask is None,
            scale=scale,
            enable_gqa=grouped,
        )
        return Block(r0, r1, out=out)

    return rows


#: Every backend, by name.
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            CUDA,
            _open_cuda,
            _whole_call,
            "core.mechanics.flash_attention's Triton kernel: CUDA inference, output and row statistics",
            _cuda_usable,
        ),
        Backend(
            CPU_KERNEL,
            _open_kernel,
            _kernel_budget,
            "core.mechanics.fused_softmax's C++ kernel: CPU float32 inference, probed or not",
        ),
        Backend(SDPA, _open_sdpa, _sdpa_budget, "torch's scaled_dot_product_attention: output only, nothing probed"),
        Backend(
            TORCH,
            _open_torch,
            _torch_budget,
            "plain torch ops: autograd, dropout, whole weights, causal and rectified masks, probes anywhere",
        ),
    )
}
