"""How one run goes, as one value: :class:`Pass`.

A run has two values. :class:`core.values.choice.Choice` is *what* it asks of the attention (method, tau
schedule, targets, CosScale, position scheme, method parameters): it decides the numbers. :class:`Pass` is *how*
the pass runs: which probes ride along, the block budget, whether and how far the decoder generates, and the
device. Two passes with one choice and two :class:`Pass` values give the same attention (bar what the probes
record and what generation adds).

Why two values and not one: the old containers (``RunSettings``, ``AttentionSettings``) held both, copied the
choice's parts field by field, and grew a third form of the same tau at each floor. Now the engine, the
attention's per-call context (:func:`core.mechanics.attention.attention_call`) and the app's cache keys carry the
same two objects unchanged. It lives here, beside the probes it names, low enough for the attention to import.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.data.tasks import MAX_ANSWER_TOKENS
from core.mechanics.probes import ProbeSpec


@dataclass(frozen=True)
class Pass:
    """How one run goes (see the module docstring); frozen and hashable, a cache key's half.

    ``probes``: what the recorder measures (:class:`~core.mechanics.probes.ProbeSpec`; ``ProbeSpec.off()``: no
    recorder, the fastest backend); ``chunk_bytes``: the budget of one block of query rows (None: the device's
    default, :func:`core.mechanics.softmax_block.default_chunk_bytes`); ``max_new_tokens`` and ``generate``: the
    decoder's greedy answer after the encoder pass (a masked-LM encoder never generates); ``device``: where the
    run is expected to go (None: wherever the model is; a model elsewhere is refused by the engine, since a pass
    never moves a shared model)."""

    probes: ProbeSpec = field(default_factory=ProbeSpec)
    chunk_bytes: int | None = None
    max_new_tokens: int = MAX_ANSWER_TOKENS
    generate: bool = True
    device: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.probes, ProbeSpec):
            raise TypeError("Pass.probes must be a core.mechanics.probes.ProbeSpec")
        if self.chunk_bytes is not None and (
            isinstance(self.chunk_bytes, bool) or not isinstance(self.chunk_bytes, int) or self.chunk_bytes <= 0
        ):
            raise ValueError("chunk_bytes must be a positive whole number of bytes (or None: the device's default)")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be a whole number >= 0")
        if self.device is not None and not isinstance(self.device, str):
            raise TypeError("Pass.device must be a device name ('cpu', 'cuda:0') or None")


#: All probes, the device's block budget, a generated answer: what ``engine.run`` does when asked nothing.
DEFAULT_PASS = Pass()
