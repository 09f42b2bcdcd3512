"""T5's relative position bias held as one vector per head, never as ``[heads, L, L]``.

Why: transformers' ``T5Attention.compute_bias`` builds the whole ``[1, H, q_len, k_len]``
bias of a pass (plus ``L x L`` int64 bucket temporaries on the way), and every layer of the
stack receives that tensor. At 16,384 tokens with 8 heads that is 8 GiB of float32 before
any attention runs, though the bias depends only on the distance ``j - i``: one vector of
``q_len + k_len - 1`` values per head holds all of it, and row ``i`` of the bias is the
window ``vector[:, q_len - 1 - i : q_len - 1 - i + k_len]`` of it (rows read the vector
backwards, keys forwards).

How it is put in: :func:`core.mechanics.patches.patch` (the one module that patches models) swaps the class of
every attention module that owns a bias table (:func:`bias_owners`: T5, mT5 and UMT5's
``has_relative_attention_bias``) for a subclass with :class:`LazyBias` in front, whose
``compute_bias`` returns a :class:`RelativeBias` instead of the dense tensor, as PEFT swaps
modules in at load time; its undo puts the original class back. No transformers
source is edited or copied: the subclass computes the buckets with the module's own
``_relative_position_bucket`` and looks them up in its own embedding, on the ``q_len +
k_len - 1`` distances only, so every value equals transformers' own. The subclass hands
out the lazy object only while the model runs our attention (``attn_implementation ==
"aligned"``): any other attention function gets transformers' dense tensor, as before.

:class:`RelativeBias` answers ``bias[:, :, r0:r1]`` with the dense rows ``[1, H, r1 - r0,
k_len]`` (materialised per block of query rows, differentiable, so training takes the same
path), ``bias + x`` with the whole dense tensor (a probe that wants whole logits), and
exposes :attr:`RelativeBias.vector` to a kernel that reads each row's window in place
(:mod:`core.mechanics.fused_softmax`).
"""

from __future__ import annotations

from typing import Any

import torch

from core.kinds import is_aligned


class RelativeBias:
    """The bias ``[1, H, q_len, k_len]`` of one pass as ``vector[h, m]`` = bias at distance ``m - (q_len - 1)``.

    ``vector`` is ``[H, q_len + k_len - 1]`` (float, with autograd when the table has it); the
    distance of query row ``i`` (at position ``i + past``) to key ``j`` is ``j - i - past``, and
    the vector was made for that ``past`` (a decoder's cached generation step).
    """

    __slots__ = ("vector", "q_len", "k_len", "_flat")

    def __init__(self, vector: torch.Tensor, q_len: int, k_len: int) -> None:
        if vector.dim() != 2 or vector.shape[1] != q_len + k_len - 1:
            raise ValueError(
                f"a relative bias vector for {q_len} x {k_len} is [heads, {q_len + k_len - 1}], "
                f"got {tuple(vector.shape)}"
            )
        self.vector = vector
        self.q_len = int(q_len)
        self.k_len = int(k_len)
        self._flat: torch.Tensor | None = None

    def flat(self) -> torch.Tensor:
        """:attr:`vector` as one contiguous float32 block without autograd (what a kernel reads), made once
        per pass: every layer of the stack receives the same object."""
        if self._flat is None:
            self._flat = self.vector.detach().to(torch.float32).contiguous()
        return self._flat

    def strides(self, r0: int) -> tuple[int, int, int]:
        """``(per head, per row, base)`` of :meth:`flat` for a block whose first row is ``r0``: row ``r0 + i``
        of head ``h`` begins at ``h * per_head + i * per_row + base`` (rows read the vector backwards)."""
        return self.q_len + self.k_len - 1, -1, self.start(r0)

    # -- what a tensor would answer ------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return torch.Size((1, self.vector.shape[0], self.q_len, self.k_len))

    @property
    def dtype(self) -> torch.dtype:
        return self.vector.dtype

    @property
    def device(self) -> torch.device:
        return self.vector.device

    @property
    def heads(self) -> int:
        return int(self.vector.shape[0])

    def start(self, row: int) -> int:
        """Where query row ``row``'s window begins in :attr:`vector` (its keys follow, one by one)."""
        return self.q_len - 1 - row

    def rows(self, r0: int, r1: int, scale: torch.Tensor | float | None = None) -> torch.Tensor:
        """Dense rows ``[r0, r1)``: ``[1, H, r1 - r0, k_len]``, contiguous, a fresh tensor.

        ``scale``: multiply by this first (``[H, 1]`` per head, or a number), on the ``2L - 1``
        values of the vector rather than on the block: what dividing the bias by a per-head
        tau costs then is nothing. The rows' windows are an ``unfold`` view of the vector in
        reverse row order; one ``flip`` lays them out (a gather through ``index_select`` on
        that view was 1,000x slower, measured), and autograd goes through both."""
        if not 0 <= r0 <= r1 <= self.q_len:
            raise IndexError(f"rows {r0}:{r1} of a bias with {self.q_len} query rows")
        v = self.vector if scale is None else self.vector * scale
        windows = v.unfold(1, self.k_len, 1)  # [H, q_len, k_len]: windows[:, s] is row q_len - 1 - s
        return windows[:, self.q_len - r1 : self.q_len - r0].flip(1).unsqueeze(0)

    def full(self) -> torch.Tensor:
        """The whole dense bias, exactly what transformers' ``compute_bias`` returns (short inputs only)."""
        return self.rows(0, self.q_len)

    def __getitem__(self, index: Any) -> torch.Tensor:
        """``bias[:, :, r0:r1]`` (what the attention's blocks ask) is cut from the vector; anything else
        is answered from :meth:`full`."""
        if (
            isinstance(index, tuple)
            and len(index) == 3
            and index[0] == slice(None)
            and index[1] == slice(None)
            and isinstance(index[2], slice)
            and index[2].step in (None, 1)
        ):
            r0, r1, _ = index[2].indices(self.q_len)
            return self.rows(r0, max(r0, r1))
        return self.full()[index]

    def __add__(self, other: Any) -> torch.Tensor:
        return self.full() + other

    __radd__ = __add__

    def __repr__(self) -> str:
        return f"RelativeBias(heads={self.heads}, q_len={self.q_len}, k_len={self.k_len}, dtype={self.dtype})"


def bias_vector(
    module: torch.nn.Module, q_len: int, k_len: int, past: int = 0, device: torch.device | None = None
) -> torch.Tensor:
    """``[H, q_len + k_len - 1]``: the module's bias at every distance a ``q_len x k_len`` pass meets.

    The buckets come from the module's own ``_relative_position_bucket`` (T5 and mT5 take the
    direction and sizes as arguments, UMT5 reads them from itself), the values from its own
    embedding, so each equals the dense tensor's value at that distance."""
    if device is None:
        device = module.relative_attention_bias.weight.device
    distance = torch.arange(-(q_len - 1) - past, k_len - past, dtype=torch.long, device=device)
    bucket_of = module._relative_position_bucket
    if getattr(bucket_of, "__self__", None) is None:  # T5 / mT5: a staticmethod taking the settings
        buckets = bucket_of(
            distance,
            bidirectional=not module.is_decoder,
            num_buckets=module.relative_attention_num_buckets,
            max_distance=module.relative_attention_max_distance,
        )
    else:  # UMT5: a method reading them from the module
        buckets = bucket_of(distance)
    return module.relative_attention_bias(buckets).transpose(0, 1)  # [H, q_len + k_len - 1]


class LazyBias:
    """Mixin put in front of a T5-family attention class: ``compute_bias`` hands out a :class:`RelativeBias`."""

    def compute_bias(self, query_length, key_length, device=None, past_seen_tokens=0):
        if not is_aligned(getattr(self.config, "_attn_implementation", None)):
            return super().compute_bias(query_length, key_length, device=device, past_seen_tokens=past_seen_tokens)
        past = int(past_seen_tokens)  # transformers may hand a 0-d tensor (a static cache's count)
        return RelativeBias(
            bias_vector(self, int(query_length), int(key_length), past, device), int(query_length), int(key_length)
        )


def bias_owners(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of ``model`` that own a relative bias table and compute the bias from it."""
    return [
        m
        for m in model.modules()
        if getattr(m, "has_relative_attention_bias", False)
        and hasattr(m, "compute_bias")
        and hasattr(m, "_relative_position_bucket")
        and hasattr(m, "relative_attention_bias")
    ]


def installed(model: torch.nn.Module) -> bool:
    """Whether any module of ``model`` hands out a lazy bias."""
    return any(isinstance(m, LazyBias) for m in model.modules())
