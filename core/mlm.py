"""Masked-token evaluation of a rotary masked-LM encoder: the InfoScale paper's accuracy and perplexity.

Li et al. (2025, Section 4 and Appendix A.3) train a bidirectional RoPE
encoder with masked-token prediction at L_tr = 64 tokens (15 % of the tokens
masked) and report, at 1x ... 64x L_tr, the accuracy of the masked tokens'
predictions and the perplexity exp(cross-entropy) over them. This module
measures the same on a loaded ``"rope"`` model (:mod:`core.models`):

- a sequence of seed ``s`` at ``tokens`` tokens is the held-out prose of
  :func:`core.tasks.make` ``("lm", ...)`` (specials included in the count, as
  every document is counted), so the texts are the ones perplexity tables
  use and never the training pool;
- its masked positions are drawn by seed from the tokens that are not special
  (``[CLS]``/``</s>``, padding and the mask token itself are never masked):
  ``round(rate x candidates)`` of them, at least one, each replaced by the
  mask token (no 80/10/10 at evaluation: every masked token is one to predict);
- one forward pass per batch of sequences under an
  :class:`~core.attention.AttentionSettings` (tau, CosScale s), no probes, so
  the attention takes torch's fused kernel;
- a cell's accuracy is correct / masked and its perplexity
  ``exp(sum of -log p(true token) / masked)`` over every masked position of
  every sequence (corpus-level, as :mod:`core.perplexity` reports: a mean of
  per-sequence perplexities would let one bad sequence dominate).

Position schemes (:mod:`core.positions`, the second axis beside the
temperature) are the plan's ``schemes``: each pass runs under one through
:func:`core.rope_pass.scheme_pass`, bound to the pass's length. A scheme is
one text, its name and any parameters (``yarn-rope:attention_factor=1``,
``window:window=32``; :func:`core.positions.parse_spec`).

A method is resolved once per length and scheme through :mod:`core.methods`;
measured ones calibrate on sequences whose seeds (``calib_seed`` on) are
disjoint from the scored ones, under the same CosScale s and the same position
scheme as the scored pass (a tau matched under other settings would answer
another question). The rows are plain dicts (:data:`ROW_KEYS`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch

from core import engine, methods, positions, rope_pass, tasks
from core.attention import AttentionSettings
from core.errors import NumericalError, UserError
from core.kinds import ENCODER
from core.models import Loaded
from core.schedule import Schedule
from core.validation import Positive, held_out_plan

#: Share of a sequence's (non-special) tokens that are masked, as the paper (and BERT) mask them.
MASK_RATE = 0.15
#: The position scheme a plan uses when not told: plain RoPE as trained.
PLAIN = positions.PLAIN
#: Shortest sequence: the held-out prose generator's own floor (:func:`core.tasks.make`, task "lm").
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


def sequence(loaded: Loaded, tokens: int, seed: int, rate: float = MASK_RATE,
             haystack: str = "corpus-eval") -> tuple[tasks.Document, MaskedSequence]:
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
def score(loaded: Loaded, batch: list[MaskedSequence], attn: AttentionSettings | None = None,
          scheme: str = PLAIN, params: dict | None = None) -> Scored:
    """One forward pass over ``batch`` (right-padded, padding masked) under ``attn`` and the position scheme
    ``scheme`` (``params``: its parameters; bound at the padded length); the masked positions scored."""
    if loaded.seq2seq:
        raise UserError(f"Model '{loaded.spec.name}' is a {loaded.family} model: masked-token evaluation needs a "
                        "masked-LM encoder (a rotary model such as ModernBERT)")
    ids, mask = engine.padded(loaded, [s.ids for s in batch])
    rows = torch.cat([torch.full((len(s.positions),), i, dtype=torch.long) for i, s in enumerate(batch)])
    cols = torch.from_numpy(np.concatenate([s.positions for s in batch]))
    labels = torch.from_numpy(np.concatenate([s.labels for s in batch])).to(loaded.device)
    with rope_pass.scheme_pass(loaded, attn, None, scheme, params, ids.shape[1]):
        hidden = loaded.encoder(input_ids=ids, attention_mask=None if bool(mask.all()) else mask).last_hidden_state
    logits = head_logits(loaded.model, hidden[rows.to(hidden.device), cols.to(hidden.device)]).float()
    if not bool(torch.isfinite(logits).all()):
        raise NumericalError(f"NaN/inf appeared in the masked-LM logits with dtype "
                             f"{str(loaded.dtype).replace('torch.', '')}: the logits divided by tau left its range.")
    logp = torch.log_softmax(logits, dim=-1)
    nll = -logp.gather(-1, labels[:, None]).squeeze(-1)
    correct = logits.argmax(-1) == labels
    return Scored(masked=int(labels.numel()), correct=int(correct.sum()), nll=float(nll.double().sum()))


@dataclass(frozen=True)
class MlmPlan:
    """What to measure: ``lengths`` x ``schemes`` x ``methods``, ``sequences`` held-out sequences per cell.

    ``schemes``: position schemes as texts (:func:`core.positions.parse_spec`: a name, or a name and its
    parameters, ``window:window=32``), the plain scheme when not told.

    ``task``, ``haystack``, ``calib_seed`` and ``calib_samples`` are what measured methods calibrate on
    (held-out prose of the same pool, seeds disjoint from the scored ones)."""

    lengths: list[int]
    methods: list[str]
    sequences: int = 32
    seed: int = 0
    calib_seed: int = 100_000
    calib_samples: int = 1
    batch_size: int = 8
    cosine_scale: float | None = None
    rate: float = MASK_RATE
    haystack: str = "corpus-eval"
    task: str = tasks.LM
    schemes: tuple[str, ...] = (PLAIN,)

    def validated(self) -> "MlmPlan":
        """This plan with methods in their one spelling and every bound checked, or a :class:`UserError`."""
        where = "Bad mlm option"
        if not self.lengths or not self.methods:
            raise UserError(f"{where}: at least one length and one method")
        plan = held_out_plan(self, where, methods.method_label, cosine_scale=Positive)
        short = [n for n in plan.lengths if n < MIN_TOKENS]
        if short:
            raise UserError(f"{where}: lengths: a sequence needs at least {MIN_TOKENS} tokens, got {short[0]}")
        if not plan.schemes:
            raise UserError(f"{where}: at least one position scheme")
        specs = [positions.spell(*positions.parse_spec(t)) for t in plan.schemes]
        if len(set(specs)) != len(specs):
            raise UserError(f"{where}: schemes: {', '.join(specs)} lists one scheme twice")
        return replace(plan, schemes=tuple(specs))


def check_model(loaded: Loaded, plan: MlmPlan) -> None:
    """Refuse, before any pass, a model this evaluation cannot read (one line each)."""
    if loaded.seq2seq:
        raise UserError(f"Model '{loaded.spec.name}' is a {loaded.family} model: mlm evaluates masked-LM encoders "
                        "(a rotary model such as ModernBERT); T5 models have `perplexity` and `sweep`")
    if plan.cosine_scale is not None and not loaded.cosine:
        raise UserError(f"--cosine-scale: model '{loaded.spec.name}' has dot-product attention; CosScale s applies to "
                        "models trained with cosine attention")
    for spec in plan.schemes:
        rope_pass.check(loaded, *positions.parse_spec(spec))


def resolve(loaded: Loaded, plan: MlmPlan, n: int, method: str, doc: tasks.Document,
            cache: dict, scheme: str = PLAIN) -> tuple[Schedule, dict]:
    """``(schedule, outcome)`` of ``method`` at length ``n`` under the position scheme ``scheme`` (a text of
    :func:`core.positions.parse_spec`). A measured one is resolved once per length and scheme on calibration
    sequences (seeds ``calib_seed + n`` on) under the plan's CosScale s and that scheme (its passes at L and at
    L_tr each bind it at their own length), and cached; ``outcome`` holds a search's ``reached`` and ``gap``
    (empty strings for anything else)."""
    name, value = methods.parse(method)
    if not methods.get(name).measured:
        tau, info = methods.resolve(loaded, doc, name, value)
        return tau, _outcome(info)
    if (n, scheme, method) not in cache:
        calib = tasks.make(plan.task, loaded.tokenizer, n, seed=plan.calib_seed + n, haystack=plan.haystack)
        scheme_name, params = positions.parse_spec(scheme)
        base = engine.RunSettings(cosine_scale=plan.cosine_scale, scheme=scheme_name, scheme_params=params)
        tau, info = methods.resolve(loaded, calib, name, samples=plan.calib_samples, base=base)
        cache[(n, scheme, method)] = (tau, _outcome(info))
    return cache[(n, scheme, method)]


def _outcome(info: dict) -> dict:
    """A search's ``reached`` and ``gap`` (as sweep rows give them); empty strings for a method that is no search."""
    if "reached" not in info or "gap" not in info:
        return {"reached": "", "gap": ""}
    return {"reached": bool(info["reached"]), "gap": round(float(info["gap"]), 6)}


def run_mlm(loaded: Loaded, plan: MlmPlan, progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """Every length x scheme x method cell of ``plan`` as one plain row (see :data:`ROW_KEYS`), lengths outermost,
    then schemes, then methods.

    The sequences of a length are built and masked once and scored under every scheme and method.
    ``attention_factor`` is the factor the scheme put on cos and sin as it acted on this model (logits x its
    square: YaRN's 0.1 ln s + 1 under ``yarn-rope``, 1 for any other scheme and for a cosine model, whose
    normalisation cancels it); a temperature method's tau divides the logits on top of it, so ``yarn-rope``
    with the method of the same paper counts YaRN's factor twice unless bound with ``attention_factor=1``
    (docs/positions.md)."""
    plan = plan.validated()
    check_model(loaded, plan)
    engine.check_length(loaded, max(plan.lengths), plan.batch_size)
    rows: list[dict] = []
    cache: dict = {}
    total, done = len(plan.lengths) * len(plan.schemes) * len(plan.methods) * plan.sequences, 0
    for n in plan.lengths:
        pairs = [sequence(loaded, n, plan.seed + i, plan.rate, plan.haystack) for i in range(plan.sequences)]
        masked = [m for _, m in pairs]
        for spec in plan.schemes:
            scheme, params = positions.parse_spec(spec)
            factor = rope_pass.attention_factor(loaded, rope_pass.bound(loaded, scheme, params, max(m.n for m in masked)))
            for method in plan.methods:
                tau, outcome = resolve(loaded, plan, n, method, pairs[0][0], cache, spec)
                attn = AttentionSettings(tau, (ENCODER,), plan.cosine_scale)
                t0 = time.perf_counter()
                count, correct, nll = 0, 0, 0.0
                for b in range(0, len(masked), plan.batch_size):
                    s = score(loaded, masked[b:b + plan.batch_size], attn, scheme, params)
                    count, correct, nll = count + s.masked, correct + s.correct, nll + s.nll
                    done += len(masked[b:b + plan.batch_size])
                    if progress:
                        progress(done, total)
                rows.append({
                    "tokens": n, "actual_tokens": int(round(np.mean([m.n for m in masked]))),
                    "train_length": loaded.train_length, "scheme": scheme,
                    "scheme_params": positions.params_text(params), "attention_factor": round(factor, 6),
                    "method": method, "tau": round(tau.mean(n), 6), "cosine_scale": _cosine(loaded, plan),
                    "accuracy": correct / count, "perplexity": math.exp(nll / count), "nll": nll, "masked": count,
                    "sequences": len(masked), "first_seed": plan.seed, "seconds": round(time.perf_counter() - t0, 3),
                    **outcome,
                })
    return rows


def _cosine(loaded: Loaded, plan: MlmPlan) -> float | None:
    """The CosScale s a row ran with: the plan's, else the trained one (None for a dot-product model)."""
    return plan.cosine_scale if plan.cosine_scale is not None else loaded.cosine_scale


#: The keys of every row :func:`run_mlm` returns (the CLI's ``mlm --json`` contract).
ROW_KEYS = ("tokens", "actual_tokens", "train_length", "scheme", "scheme_params", "attention_factor", "method", "tau",
            "cosine_scale", "accuracy", "perplexity", "nll", "masked", "sequences", "first_seed", "seconds", "reached", "gap")


def summary(loaded: Loaded, plan: MlmPlan, rows: list[dict]) -> dict:
    """The CLI's ``mlm --json`` object: the model, its L_tr, the masking rate and the rows."""
    return {"model": loaded.spec.name, "family": loaded.family, "train_length": loaded.train_length,
            "mask_rate": plan.rate, "rows": rows}
