"""One masked-LM pass: a held-out sequence masked by seed, scored in one forward pass (accuracy and -log p).

The evaluation :mod:`core.experiments.mlm` runs over lengths, schemes and methods is built from these; the
trainer's held-out score (:mod:`core.training.mlm`) and the rotary views (:mod:`core.views.rope_view`) make the
same pass, so they import it from here, below both. Which tokens are masked and how a batch is scored is
described in :mod:`core.experiments.mlm`'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from core.data import tasks
from core.errors import NumericalError, UserError
from core.models import Loaded
from core.runs import engine, rope_pass
from core.values.choice import Choice

#: Share of a sequence's (non-special) tokens that are masked, as the paper (and BERT) mask them.
MASK_RATE = 0.15
#: Shortest sequence: the held-out prose generator's own floor (:func:`core.data.tasks.make`, task "lm").
MIN_TOKENS = 8
#: Mixed into the masking seed so that masked positions never share a random stream with the text's own draw.
_SALT = 0x6D6C6D


@dataclass(frozen=True)
class MaskedSequence:
    """One sequence as the model reads it: ``ids`` with ``positions`` replaced by the mask token, ``labels`` the
    true ids there (both sorted by position)."""

    ids: np.ndarray  # [n] int64, the masked input
    positions: np.ndarray  # [k] int64
    labels: np.ndarray  # [k] int64
    seed: int

    @property
    def n(self) -> int:
        return len(self.ids)


def mask_tokens(tokenizer, ids: list[int] | np.ndarray, seed: int, rate: float = MASK_RATE) -> MaskedSequence:
    """Mask ``rate`` of the non-special tokens of ``ids``, positions drawn by ``seed`` (see the module docstring)."""
    mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        raise UserError("This tokenizer has no mask token: masked-token evaluation needs a masked-LM model's tokenizer")
    if not 0.0 < rate < 1.0:
        raise UserError(f"the masking rate must be between 0 and 1, got {rate!r}")
    ids = np.asarray(ids, dtype=np.int64)
    special = np.isin(ids, np.asarray(sorted(set(tokenizer.all_special_ids) | {mask_id}), dtype=np.int64))
    candidates = np.flatnonzero(~special)
    if len(candidates) == 0:
        raise UserError("the sequence has no token that is not special: nothing to mask")
    k = max(1, int(round(rate * len(candidates))))
    rng = np.random.default_rng([_SALT, int(seed)])
    positions = np.sort(rng.choice(candidates, size=k, replace=False))
    masked = ids.copy()
    masked[positions] = mask_id
    return MaskedSequence(masked, positions, ids[positions].copy(), int(seed))


def sequence(
    loaded: Loaded, tokens: int, seed: int, rate: float = MASK_RATE, haystack: str = "corpus-eval"
) -> tuple[tasks.Document, MaskedSequence]:
    """The held-out document of ``seed`` at ``tokens`` tokens and its masked ids."""
    try:
        doc = tasks.make(tasks.LM, loaded.tokenizer, tokens, seed=seed, haystack=haystack)
    except ValueError as err:  # e.g. fewer than 8 tokens
        raise UserError(f"No held-out sequence of {tokens:,} tokens: {err}") from None
    return doc, mask_tokens(loaded.tokenizer, loaded.tokenizer(doc.text).input_ids, seed, rate)


def head_logits(model: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The masked-LM head on some hidden states (``[k, hidden]`` -> ``[k, vocab]``), as the model's forward
    applies it (ModernBERT: ``decoder(head(h))``). Why not the forward's logits: they cover every position,
    ``L x vocab`` floats (800 MB at 4,096 tokens for a 50k vocabulary), where only the masked ones are read."""
    return model.decoder(model.head(hidden))


@dataclass(frozen=True)
class Scored:
    """What a batch of masked sequences scored: masked positions, correct predictions, summed -log p."""

    masked: int
    correct: int
    nll: float


@torch.inference_mode()
def score(loaded: Loaded, batch: list[MaskedSequence], choice: Choice | None = None) -> Scored:
    """One forward pass over ``batch`` (right-padded, padding masked) under ``choice`` (tau, CosScale s and the
    position scheme, bound at the padded length; None: the model as trained); the masked positions scored."""
    if loaded.seq2seq:
        raise UserError(
            f"Model '{loaded.spec.name}' is a {loaded.family} model: masked-token evaluation needs a "
            "masked-LM encoder (a rotary model such as ModernBERT)"
        )
    ids, mask = engine.padded(loaded, [s.ids for s in batch])
    rows = torch.cat([torch.full((len(s.positions),), i, dtype=torch.long) for i, s in enumerate(batch)])
    cols = torch.from_numpy(np.concatenate([s.positions for s in batch]))
    labels = torch.from_numpy(np.concatenate([s.labels for s in batch])).to(loaded.device)
    with rope_pass.scheme_pass(loaded, choice, None, None, ids.shape[1]):
        hidden = loaded.encoder(input_ids=ids, attention_mask=None if bool(mask.all()) else mask).last_hidden_state
    logits = head_logits(loaded.model, hidden[rows.to(hidden.device), cols.to(hidden.device)]).float()
    if not bool(torch.isfinite(logits).all()):
        raise NumericalError(
            f"NaN/inf appeared in the masked-LM logits with dtype "
            f"{str(loaded.dtype).replace('torch.', '')}: the logits divided by tau left its range."
        )
    logp = torch.log_softmax(logits, dim=-1)
    nll = -logp.gather(-1, labels[:, None]).squeeze(-1)
    correct = logits.argmax(-1) == labels
    return Scored(masked=int(labels.numel()), correct=int(correct.sum()), nll=float(nll.double().sum()))
