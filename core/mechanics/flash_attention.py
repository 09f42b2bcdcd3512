"""One fused attention for CUDA: T5's bias, tau, the padding mask and the row statistics in one Triton kernel.

Why: on a GPU the blocked torch path holds a block of scores per 256 MiB and runs the softmax as separate
kernels over it: 45 s for a Flan-T5-XL-shaped pass at 32,768 tokens, where the attention's own arithmetic
(flash without a bias) is ~17 ms a layer (../shared/notes/gpu-feasibility.md). FlexAttention takes the bias
as a ``score_mod`` and returns the row max and log-sum-exp (so Pmax), but the entropy needs
``sum(p * x)`` per row, a second flex pass at 4x the first. This kernel keeps that sum beside the running
total, as the CPU kernel does (:mod:`core.mechanics.fused_softmax`): one multiply-add per score more than
flash attention, and never an ``L x L`` tensor.

Per program: ``BLOCK_M`` query rows of one (batch item, head), a loop over blocks of ``BLOCK_N`` keys with
the online softmax (Milakov and Gimelshein 2018; Dao et al. 2022). For row i, key j:
``x = (q.k + bias(h, i, j)) * inv_tau`` (tau per head or per row), ``x = -FLT_MAX`` where the key is padding
(finite, as torch's path fills ``finfo.min``, so a row whose every key is masked averages its values as
eager attention does). With the running max ``m``, ``l = sum exp(x - m)``, ``u = sum exp(x - m) (x - m)``
and ``acc = sum exp(x - m) v``; a new block's max ``m'`` rescales them by ``a = exp(m - m')``:
``l' = a l + ...``, ``u' = a (u + (m - m') l) + ...``, ``acc' = a acc + ...``. At the end ``out = acc / l``,
``total = l``, ``dot = u``: Pmax = 1 / total, H = log(total) - dot / total (:class:`~core.mechanics.softmax_block.Block`).

A decoder-only LM's prefill: causal rows (key j of row i kept where ``j <= diagonal + i``; a program stops at the
last key its last row sees, so the blocks above the diagonal cost nothing: half a long prefill's work), grouped
K/V (query head h reads key head ``h // (H / H_kv)`` where it lies, never repeated) and Gemma 2's soft-cap.

The bias is read where it lies: T5's lazy bias (:class:`~core.mechanics.relative_bias.RelativeBias`) is one vector
of ``q + k - 1`` values per head, row i of head h starting at ``base + h * hs + i * rs`` (``rs = -1``), and a
dense ``[1, H, q, k]`` bias has the same form with its own strides.

Where it runs: CUDA with Triton (it ships with torch's CUDA wheels). Tests run the same kernel on the CPU
through Triton's interpreter (``TRITON_INTERPRET=1``, :func:`kernel` reads it when it first builds), slowly
and exactly; the GPU's speed is measured by bench/gpu.py where a GPU is lent.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

#: Rows and keys per program. 64 x 64 keeps a float32 block of scores and a bfloat16 tile of q, k and v of
#: head dim up to 128 in registers and shared memory on an A100/H100 class GPU.
BLOCK_M = 64
BLOCK_N = 64


def has_triton() -> bool:
    """Whether Triton can be imported here (torch's CUDA wheels bring it; the CPU wheel does not)."""
    return importlib.util.find_spec("triton") is not None


def interpreted() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``): how tests run this kernel."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def usable() -> bool:
    """The kernel can serve CUDA passes here: a GPU, Triton, and not ``AAE_FLASH_ATTENTION=0``."""
    return os.environ.get("AAE_FLASH_ATTENTION", "1") != "0" and torch.cuda.is_available() and has_triton()


@functools.lru_cache(maxsize=2)
def _build(interpret: bool):
    """The jitted kernel (built on first use, so ``TRITON_INTERPRET`` is read then, not at import)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _attend(
        Q,
        K,
        V,
        Bias,
        Tau,
        KeyMask,
        O,
        Total,
        Dot,
        Top,
        sqb,
        sqh,
        sqm,
        sqd,
        skb,
        skh,
        skn,
        skd,
        svb,
        svh,
        svn,
        svd,
        sob,
        soh,
        som,
        sod,
        H,
        M,
        N,
        groups,
        diag,
        cap,
        bias_hs,
        bias_rs,
        bias_base,
        TAU_MODE: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        HAS_MASK: tl.constexpr,
        CAUSAL: tl.constexpr,
        SOFTCAP: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        D: tl.constexpr,
        DV: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        hk = h // groups  # grouped K/V: the key/value head of this query head (repeat_kv's order), read in place
        rows = pid_m * BM + tl.arange(0, BM)
        row_ok = rows < M
        dq = tl.arange(0, D)
        dv = tl.arange(0, DV)
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + dq[None, :] * sqd, mask=row_ok[:, None], other=0.0)
        if TAU_MODE == 1:
            inv = 1.0 / tl.load(Tau + h + rows * 0)
        elif TAU_MODE == 2:
            inv = 1.0 / tl.load(Tau + rows, mask=row_ok, other=1.0)
        else:
            inv = tl.full([BM], 1.0, tl.float32)
        neg = -3.4028234663852886e38
        m_i = tl.full([BM], neg, tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        u_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, DV], tl.float32)
        hi = N
        if CAUSAL:  # the keys this program's last row sees: the key blocks past them are never loaded
            hi = tl.minimum(N, diag + (pid_m + 1) * BM)
        for start in range(0, hi, BN):
            cols = start + tl.arange(0, BN)
            col_ok = cols < N
            k = tl.load(
                K + b * skb + hk * skh + cols[None, :] * skn + dq[:, None] * skd, mask=col_ok[None, :], other=0.0
            )
            s = tl.dot(q, k).to(tl.float32)
            if SOFTCAP:  # Gemma 2: cap * tanh(s / cap), tanh written with exp (the interpreter has no tanh)
                s = cap * (1.0 - 2.0 / (tl.exp(2.0 * s / cap) + 1.0))
            if HAS_BIAS:
                s += tl.load(
                    Bias + bias_base + h * bias_hs + rows[:, None] * bias_rs + cols[None, :],
                    mask=row_ok[:, None] & col_ok[None, :],
                    other=0.0,
                )
            x = s * inv[:, None]
            keep = col_ok[None, :] & row_ok[:, None]
            if CAUSAL:
                keep = keep & (cols[None, :] <= diag + rows[:, None])
            if HAS_MASK:
                km = tl.load(KeyMask + b * N + cols, mask=col_ok, other=0)
                x = tl.where((km != 0)[None, :], x, neg)
            x = tl.where(keep, x, neg)  # keys past the end (and rows past the last) count for nothing below
            m_new = tl.maximum(m_i, tl.max(x, 1))
            a = tl.exp(m_i - m_new)
            d = tl.where(keep, x - m_new[:, None], 0.0)
            e = tl.where(keep, tl.exp(d), 0.0)
            u_i = a * (u_i + tl.where(l_i > 0, (m_i - m_new) * l_i, 0.0)) + tl.sum(e * d, 1)
            l_i = a * l_i + tl.sum(e, 1)
            v = tl.load(
                V + b * svb + hk * svh + cols[:, None] * svn + dv[None, :] * svd, mask=col_ok[:, None], other=0.0
            )
            acc = acc * a[:, None] + tl.dot(e.to(v.dtype), v).to(tl.float32)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # l_i = 0 only on rows past the last (not stored)
        tl.store(
            O + b * sob + h * soh + rows[:, None] * som + dv[None, :] * sod,
            out.to(O.dtype.element_ty),
            mask=row_ok[:, None],
        )
        at = pid_bh * M + rows
        tl.store(Total + at, l_i, mask=row_ok)
        tl.store(Dot + at, u_i, mask=row_ok)
        tl.store(Top + at, m_i, mask=row_ok)

    return _attend


def kernel():
    """The jitted kernel for this process's Triton mode."""
    return _build(interpreted())


def _pow2(n: int) -> int:
    return max(16, 1 << (int(n) - 1).bit_length())


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor | None = None,
    bias_strides: tuple[int, int, int] = (0, 0, 0),
    tau: torch.Tensor | None = None,
    tau_per: str = "head",
    keymask: torch.Tensor | None = None,
    diagonal: int | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """softmax((q.k + bias) / tau, masked) @ v for ``query`` ``[B, H, M, D]`` and ``key``/``value`` ``[B, H, N, D]``,
    with each row's statistics: ``(out [B, H, M, Dv], total, dot, top)``, the last three ``[B, H, M, 1]`` float32
    (``total = sum exp(x - top)``, ``dot = sum exp(x - top) (x - top)``, ``top`` the row max).

    ``bias``: float32, row (h, i) at ``bias_strides = (per head, per row, base)`` from its start, keys
    contiguous (as :func:`core.mechanics.fused_softmax.softmax_rows` takes it). ``tau``: ``[H]`` per head or
    ``[M]`` per row (``tau_per``), or None. ``keymask``: ``[B, N]`` (True: attend) or None. A head dim that
    is not a power of two (at least 16) is zero-padded, which changes no dot product.

    ``key``/``value`` may have fewer heads than ``query`` (grouped-query attention, ``H`` a multiple of theirs):
    query head ``h`` reads key head ``h // (H / H_kv)``, in place. ``diagonal``: causal rows, row ``i`` sees keys
    ``0 .. diagonal + i`` only (a decoder's prefill: ``k_len - q_len`` plus the first row's index), and the key
    blocks past a program's last row are never loaded; None: every key. ``softcap``: Gemma 2's
    ``c * tanh(q.k / c)`` before the bias, tau and mask, or None."""
    B, H, M, D = query.shape
    N, DV = key.shape[-2], value.shape[-1]
    if H % key.shape[1] or key.shape[1] != value.shape[1]:
        raise ValueError(f"{H} query heads cannot share {key.shape[1]} key and {value.shape[1]} value heads")
    if diagonal is not None and diagonal < 0:
        raise ValueError(f"diagonal must be at least 0 (a row sees its own key), got {diagonal}")
    Dp, DVp = _pow2(D), _pow2(DV)
    if Dp != D:
        query = torch.nn.functional.pad(query, (0, Dp - D))
        key = torch.nn.functional.pad(key, (0, Dp - D))
    vpad = torch.nn.functional.pad(value, (0, DVp - DV)) if DVp != DV else value
    dev = query.device
    out = torch.empty(B, H, M, DVp, dtype=value.dtype, device=dev)
    stats = torch.empty(3, B, H, M, dtype=torch.float32, device=dev)
    mode = 0
    if tau is not None:
        tau = tau.to(device=dev, dtype=torch.float32).contiguous().view(-1)
        mode = 1 if tau_per == "head" else 2
        if tau.numel() != (H if mode == 1 else M):
            raise ValueError(f"tau must hold {H if mode == 1 else M} values for tau_per={tau_per!r}")
    if keymask is not None:
        keymask = keymask.to(device=dev, dtype=torch.uint8).contiguous()
    if bias is not None:
        bias = bias.to(device=dev, dtype=torch.float32)
    hs, rs, base = bias_strides
    dummy = stats  # an unused pointer argument still needs a tensor
    grid = (triton_cdiv(M, BLOCK_M), B * H)
    kernel()[grid](
        query,
        key,
        vpad,
        dummy if bias is None else bias,
        dummy if tau is None else tau,
        dummy if keymask is None else keymask,
        out,
        stats[0],
        stats[1],
        stats[2],
        *query.stride(),
        *key.stride(),
        *vpad.stride(),
        *out.stride(),
        H,
        M,
        N,
        H // key.shape[1],
        0 if diagonal is None else int(diagonal),
        1.0 if softcap is None else float(softcap),
        hs,
        rs,
        base,
        TAU_MODE=mode,
        HAS_BIAS=bias is not None,
        HAS_MASK=keymask is not None,
        CAUSAL=diagonal is not None,
        SOFTCAP=softcap is not None,
        BM=BLOCK_M,
        BN=BLOCK_N,
        D=Dp,
        DV=DVp,
    )
    if DVp != DV:
        out = out[..., :DV]
    total, dot, top = (t.unsqueeze(-1) for t in stats)
    return out, total, dot, top


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
