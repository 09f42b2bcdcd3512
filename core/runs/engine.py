"""``run(loaded, document, choice, how) -> Result``: the one entry the app, the CLI and sweeps share.

A run takes two values: its :class:`~core.values.choice.Choice` (what it asks of the attention) and its
:class:`~core.mechanics.run_pass.Pass` (how it runs: probes, block budget, generation, device). Both travel
unchanged to the attention call (:func:`core.mechanics.attention.attention_call`).

One encoder pass, with the tau schedule applied and the probes riding along,
then greedy generation *from that encoder output* (the encoder is never run
twice; decoder and cross-attention probes, when asked by name, ride along
with it, one answer row per step), then scoring. Every stage is timed.
:func:`run_batch` does the same for several documents at once (right-padded,
padding masked), which is what batch runs use; :func:`run` is its
one-document case with all probes on.

A decoder-only LM (``Loaded.decoder_only``: Llama, Mistral, Qwen, Gemma 2, Phi-3, gpt-oss) reads the document as
its prompt, the question last (every generated task's text ends with its question; a trailing end token the
tokenizer adds is dropped), and answers by greedy decoding with a KV cache: one ``generate`` call, whose prefill
is the document's pass (timed as ``encode``; the probes read its rows, as the encoder's are read, through
``ProbeSpec.kind`` ``decoder``) and whose cached steps make the answer (``generate``). A batch is left-padded, its
longest document first. The choice's targets are read for the model once, at this edge (:func:`choice_for`). A
language-modelling document's continuation is scored teacher-forced after its prompt (:func:`_decoder_nll`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import transformers
from packaging.version import Version
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.generation import LogitsProcessor, LogitsProcessorList
from transformers.modeling_outputs import BaseModelOutput

from core.data import tasks
from core.errors import InputTooLong, NumericalError, UserError
from core.kinds import CROSS, DECODER, ENCODER
from core.mechanics import attention
from core.mechanics.attention import KERNEL_CHUNK_BYTES, attention_call, default_chunk_bytes
from core.mechanics.probes import ProbeRecord, ProbeSpec, Recorder
from core.mechanics.run_pass import DEFAULT_PASS, Pass  # noqa: F401  engine.Pass: the run's second value, named here too
from core.models import Loaded, memory
from core.runs import rope_pass, timing
from core.values import positions
from core.values.choice import TRAINED, Choice


@dataclass
class Encoded:
    """A tokenised document and where its needle and question sit, in tokens."""

    input_ids: np.ndarray  # [n]
    offsets: np.ndarray  # [n, 2] character span of each token in document.text ((0, 0) for specials)
    needle_tokens: tuple[int, int] | None
    question_tokens: tuple[int, int] | None

    @property
    def n(self) -> int:
        return len(self.input_ids)

    @property
    def question_rows(self) -> tuple[int, int]:
        """The rows a decoder-only LM's Pmax and H are read on when only the question's are asked
        (:attr:`ProbeSpec.question_rows <core.mechanics.probes.ProbeSpec>`, Algorithm 1's calibration): the
        question's tokens, or every token when the document has no question (a language-modelling prefix)."""
        q = self.question_tokens
        return (q[0], q[1]) if q is not None and q[1] > q[0] else (0, self.n)


@dataclass
class Result:
    """Everything one run produced, as plain numbers and numpy arrays."""

    task: str
    answer: str
    expected: str
    correct: bool | None
    parsed: str | None
    method: str
    tau: np.ndarray  # [layers, heads] the encoder schedule used
    tokens: int
    train_length: int
    needle_tokens: tuple[int, int] | None
    question_tokens: tuple[int, int] | None
    probes: ProbeRecord | None  # None when the run asked for no probes (ProbeSpec.off())
    seconds: dict[str, float]
    offsets: np.ndarray | None = None
    cosine_scale: float | None = None
    nll: float | None = None  # language modelling (task "lm"): summed -log p of the continuation's tokens
    scored_tokens: int | None = None  # how many continuation tokens ``nll`` sums over
    answer_tokens: list[str] | None = None  # the generated tokens one by one (eos included): decoder/cross map rows
    schedule: Any = (
        None  # the run's Schedule as given (a per-row one: ``tau`` holds only its mean, adaptive its base 1)
    )

    @property
    def perplexity(self) -> float | None:
        """exp(mean -log p) of the continuation (task "lm"); None for retrieval documents."""
        if self.nll is None or not self.scored_tokens:
            return None
        return float(np.exp(self.nll / self.scored_tokens))

    @property
    def tau_mean(self) -> float:
        return float(np.mean(self.tau))

    @property
    def pmax(self) -> float:
        """Mean Pmax over layers, heads and real rows."""
        return float(self.probes.pmax[0].mean())

    @property
    def entropy(self) -> float:
        return float(self.probes.entropy[0].mean())

    def layers(self) -> list[dict]:
        return [
            {"layer": i, "pmax": float(p), "entropy": float(h)}
            for i, (p, h) in enumerate(zip(self.probes.layer_pmax, self.probes.layer_entropy))
        ]

    def summary(self) -> dict:
        """The CLI's ``run --json`` object (a stable contract). ``tau`` is one number or a list per layer (a per-row
        schedule's mean over the rows; adaptive temperature's base, 1); a per-row schedule also gives ``schedule``
        (its JSON, as a settings file holds it) and ``schedule_text`` (what it is, in words)."""
        tau = self.tau
        same = bool(np.all(tau == tau.flat[0]))
        rows = self.schedule is not None and self.schedule.ndim < 0  # a tau per query row: its rule beside the number
        return {
            "task": self.task,
            "answer": self.answer,
            "expected": self.expected,
            "correct": self.correct,
            "parsed": self.parsed,
            "method": self.method,
            "tau": float(tau.flat[0]) if same else tau.mean(axis=1).round(4).tolist(),
            **(
                {"schedule": self.schedule.to_json(), "schedule_text": self.schedule.describe(self.tokens)}
                if rows
                else {}
            ),
            "tokens": self.tokens,
            "train_length": self.train_length,
            "ratio": round(self.tokens / self.train_length, 3),
            "seconds": round(self.seconds["total"], 4),
            "timings": {k: round(v, 4) for k, v in self.seconds.items()},
            "pmax": self.pmax,
            "entropy": self.entropy,
            "sigma": self.probes.sigma,
            "l_max": self.probes.l_max,
            "layers": self.layers(),
            **({"cosine_scale": self.cosine_scale} if self.cosine_scale is not None else {}),
            **(
                {"perplexity": self.perplexity, "nll": self.nll, "scored_tokens": self.scored_tokens}
                if self.nll is not None
                else {}
            ),
        }


# -- memory ----------------------------------------------------------------------

#: Bytes per L^2 a rotary encoder's pass holds at its peak (see :func:`max_tokens`).
ROPE_BYTES_PER_L2 = 16

#: Copies of one token's activations a T5 pass holds at its peak, in units of ``d_model + d_ff + 3 x heads x
#: d_kv`` values (see :func:`max_tokens`). Measured on the default model's probed pass (2026-11-26,
#: bench/README.md: growth 0.17 GiB at 4k, 0.32 GiB at 32k tokens): about 5.6 KB per token, 1.2 copies of
#: its 1,152 float32 values; 8 leaves room for models whose feed-forward holds more at once (gated ones).
T5_COPIES_PER_TOKEN = 8


def max_tokens(loaded: Loaded, batch: int = 1, chunk_bytes: int | None = None) -> int:
    """The longest input this machine can run now, from free memory.

    T5 under our attention holds nothing ``L x L``: the relative bias is one vector per head
    (:mod:`core.mechanics.relative_bias`), and the scores live in a few blocks of rows of a fixed budget. What
    grows with ``L`` is each token's activations (hidden states, q/k/v, the feed-forward, the decoder's
    cross-attention keys and values): :data:`T5_COPIES_PER_TOKEN` copies of ``d_model + d_ff + 3 x
    heads x d_kv`` values per token (measured: the default model's probed pass grew 0.25 GiB at 16,384
    tokens, where the dense bias of transformers' own pass needed 12.7 GiB). A padded batch adds a
    boolean mask ``[batch, 1, L, L]``.

    A rotary encoder (ModernBERT) has no bias, but transformers builds its ``L x L`` masks (global
    and sliding window) on every pass: measured peak above the loaded model, 6 layers x 4 heads in
    float32 on this 2-core machine (2026-11-26): 1.02 GiB at 8,192 tokens, 4.1 GiB at 16,384, about
    16 bytes per ``L^2``, with probes or without.

    A decoder-only LM holds nothing ``L x L`` either when its batch is unpadded (its causal rows need no mask:
    :func:`core.mechanics.attention.compact_mask` hands the attention none); what grows with ``L`` is each token's
    activations, counted as T5's (:data:`T5_COPIES_PER_TOKEN` copies of ``hidden + intermediate + (heads + 2 x
    key/value heads) x head_dim`` values), and its KV cache, ``2 x layers x key/value heads x head_dim`` values
    per token, kept through the whole answer (``generate`` computes the vocabulary's logits for the last row only).
    A left-padded batch adds its boolean causal mask ``[batch, 1, L, L]``, as a padded T5 batch does.

    We allow 80 % of free memory for those, after a fixed allowance for the weights and the blocks of
    scores (two on the CPU kernel's path, six on torch's), each no bigger than one layer's whole matrix.
    """
    elt = torch.finfo(loaded.dtype).bits // 8
    mask = batch if batch > 1 else 0
    cpu = loaded.device.type == "cpu"
    chunk = chunk_bytes or (KERNEL_CHUNK_BYTES if cpu else default_chunk_bytes(loaded.device))
    blocks = 2 if cpu else 6  # the CPU kernel's path holds one block buffer (and a few rows); torch's a few blocks
    base = 0.8 * memory.free_bytes(loaded.device) - 4 * loaded.n_params * elt
    if loaded.family == "rope":
        per_l2, per_token = ROPE_BYTES_PER_L2 + mask, 0.0
    elif loaded.decoder_only:
        cfg = loaded.config
        per_l2 = mask
        act = cfg.hidden_size + cfg.intermediate_size + (loaded.n_heads + 2 * loaded.n_kv_heads) * loaded.d_kv
        cache = 2 * loaded.n_layers * loaded.n_kv_heads * loaded.d_kv
        per_token = (T5_COPIES_PER_TOKEN * act + cache) * elt * batch
    else:
        cfg = loaded.config
        per_l2 = mask
        per_token = T5_COPIES_PER_TOKEN * (cfg.d_model + cfg.d_ff + 3 * loaded.n_heads * loaded.d_kv) * elt * batch
    # Blocks at their full budget; or, for short inputs, blocks no bigger than one layer's whole score matrix
    # (a tight memory, e.g. under ulimit -v, must not be refused for a 64 MiB block a 300-token pass never makes).
    whole = _longest(base - blocks * chunk, per_l2, per_token)
    block_l2 = blocks * 4 * loaded.n_heads * batch
    small = min(_longest(base, per_l2 + block_l2, per_token), math.isqrt(chunk // (4 * loaded.n_heads * batch)))
    return max(whole, small)


def _longest(budget: float, per_l2: float, per_token: float) -> int:
    """The largest L with ``per_l2 L^2 + per_token L <= budget`` (0 when nothing fits)."""
    if budget <= 0:
        return 0
    if per_l2 <= 0:
        return int(budget / per_token) if per_token > 0 else 0
    return int((-per_token + math.sqrt(per_token * per_token + 4 * per_l2 * budget)) / (2 * per_l2))


# -- tokenising ------------------------------------------------------------------


def _token_span(offsets: np.ndarray, span: tuple[int, int] | None) -> tuple[int, int] | None:
    """Tokens whose characters overlap ``span`` (``[start, end)`` in characters)."""
    if span is None or span[1] <= span[0]:
        return None
    a, b = span
    hit = np.nonzero((offsets[:, 1] > a) & (offsets[:, 0] < b) & (offsets[:, 1] > offsets[:, 0]))[0]
    return (int(hit[0]), int(hit[-1]) + 1) if len(hit) else None


def _offsets(tokenizer, text: str, ids: list[int]) -> np.ndarray:
    """Character offsets per token for a slow tokenizer (fast ones return them directly).

    Token i covers the characters whose prefix grows the token count past i;
    binary search keeps this O(n log n) tokenizer calls.
    """
    n_special = len(tokenizer("").input_ids)
    ends, pos = [], 0
    counts = {}

    def count(k: int) -> int:
        if k not in counts:
            counts[k] = len(tokenizer(text[:k]).input_ids) - n_special
        return counts[k]

    real = len(ids) - n_special
    for i in range(real):
        lo, hi = pos, len(text)
        while lo < hi:
            mid = (lo + hi) // 2
            if count(mid) > i:
                hi = mid
            else:
                lo = mid + 1
        ends.append((pos, lo))
        pos = lo
    ends += [(0, 0)] * n_special
    return np.asarray(ends, dtype=np.int64).reshape(-1, 2)


def encode(loaded: Loaded, document: tasks.Document) -> Encoded:
    """Tokenise a document (nothing is truncated) and map its needle and question to tokens. A decoder-only LM's
    prompt never ends in the end token: one the tokenizer appends (T5's, ByT5's) is dropped, since the answer is
    to follow the question."""
    if not document.text or not document.text.strip():
        raise UserError("The document is empty: paste some text or generate a document.")
    tok = loaded.tokenizer
    fast = getattr(tok, "is_fast", False)
    enc = tok(document.text, return_offsets_mapping=True) if fast else tok(document.text)
    ids = list(enc["input_ids"])
    eos = getattr(tok, "eos_token_id", None)
    n = len(ids) - 1 if loaded.decoder_only and len(ids) > 1 and eos is not None and ids[-1] == eos else len(ids)
    check_length(loaded, n)  # before the offsets: a slow tokenizer's are O(n log n) calls
    if fast:
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    else:
        offsets = _offsets(tok, document.text, ids)
    ids, offsets = ids[:n], offsets[:n]
    return Encoded(
        input_ids=np.asarray(ids, dtype=np.int64),
        offsets=offsets,
        needle_tokens=_token_span(offsets, document.needle_span),
        question_tokens=_token_span(offsets, document.question_span),
    )


def check_length(loaded: Loaded, n: int, batch: int = 1) -> None:
    """Refuse, with the limit in the message, an input this machine cannot hold."""
    cap = max_tokens(loaded, batch)
    if n > cap:
        raise InputTooLong(
            f"The document is {n:,} tokens; with this model ({loaded.n_heads} heads, {loaded.dtype}) "
            f"this machine can run at most about {cap:,} tokens now "
            f"({memory.free_bytes(loaded.device) / 2**30:.1f} GB free). Use a shorter document.",
            app=f"The document is {n:,} tokens; with this model ({loaded.n_heads} heads, {loaded.dtype}) "
            f"this machine can run at most about {cap:,} tokens now "
            f"({memory.free_bytes(loaded.device) / 2**30:.1f} GB free). Use a shorter document: a smaller number in "
            "the Length in tokens box, or a shorter text.",
        )


# -- running ---------------------------------------------------------------------


def run(
    loaded: Loaded,
    document: tasks.Document,
    choice: Choice = TRAINED,
    how: Pass = DEFAULT_PASS,
    encoded: Encoded | None = None,
) -> Result:
    """Run one document under ``choice`` (what) and ``how`` (by default all probes, question profile included,
    and a generated answer) and return a :class:`Result`."""
    t0 = time.perf_counter()
    enc = encoded or encode(loaded, document)
    probes = how.probes
    if probes.profile_rows is None and not probes.question_rows and enc.question_tokens is not None:
        how = replace(how, probes=replace(probes, profile_rows=enc.question_tokens))
    t_tok = time.perf_counter() - t0
    (res,) = run_encoded(loaded, [document], [enc], choice, how)
    res.seconds["tokenize"] = t_tok
    res.seconds["total"] += t_tok
    res.offsets = enc.offsets
    return res


#: Passes over this many tokens or more get an estimate before they start (the CLI's ``run``): at 8,192 tokens
#: the default model's probed pass takes about 4 s here, at 65,536 about 5 min (bench/README.md).
ESTIMATE_FROM = 8192
#: Tokens of the timed sample :func:`estimate_pass` scales up from.
SAMPLE_TOKENS = 2048


def estimate_pass(
    loaded: Loaded, document: tasks.Document, encoded: Encoded, choice: Choice = TRAINED, how: Pass = DEFAULT_PASS
) -> float:
    """Seconds the pass over ``encoded`` should take here, measured on this machine now (under a few seconds): a
    long document's pass can take minutes, and "before it starts, about how long it takes" needs this machine's
    speed, not a table's.

    Longer than the short samples: ``a + b n + c n^2`` (:mod:`core.runs.timing`), the encoder's (or a T5's) as the
    decoder-only LM's: ``c`` from one attention call of the model's shape timed here
    (:func:`core.runs.timing.attention_per_pair`: causal rows for a decoder, all-pairs rows with T5's relative
    bias for an encoder), ``a + b n`` the line through two short passes (same settings, no answer;
    :data:`core.runs.timing.ENCODER_SAMPLES` or :data:`~core.runs.timing.DECODER_SAMPLES`, after an untimed one
    that pays for what a process does once: the kernel library, the allocator) once ``c n^2`` is taken off. Why
    not the square of one sample's time: the linear layers are a quarter of the default T5's 2,048-token pass
    and half of SmolLM2's 8k pass, so the square law overshot (22 s said for a 16 s T5 pass at 8k;
    bench/estimates.py, bench/estimate_decoder.py). Up to the samples' length: the pass itself, timed twice."""
    how = replace(how, generate=False)

    def timed(m: int) -> float:
        head = replace(
            encoded,
            input_ids=encoded.input_ids[:m],
            offsets=encoded.offsets[:m],
            needle_tokens=None,
            question_tokens=None,
        )
        return run(loaded, document, choice, how, encoded=head).seconds["encode"]

    sizes = timing.DECODER_SAMPLES if loaded.decoder_only else timing.ENCODER_SAMPLES
    if encoded.n > sizes[-1]:
        c = timing.attention_per_pair(
            loaded.config, how.probes.wanted, device=str(loaded.device), causal=loaded.decoder_only
        )
        timed(sizes[0])  # what a process does once: the kernel library, the allocator
        samples = [(m, timed(m)) for m in sizes]
        a, b, c = timing.quadratic_fit(samples, c)
        timing.remember_law(timing.model_key(loaded), a, b, c)  # the pages' estimates past the passes made so far
        return a + b * encoded.n + c * encoded.n**2
    seconds = [timed(encoded.n) for _ in range(2)]
    return seconds[-1]


def run_batch(
    loaded: Loaded,
    documents: list[tasks.Document],
    choice: Choice = TRAINED,
    how: Pass | None = None,
    batch_size: int = 8,
) -> list[Result]:
    """Run many documents under ``choice``, batched by similar length, stats-only probes unless ``how`` asks
    otherwise.

    Results come back in the order of ``documents``.
    """
    how = how if how is not None else Pass(probes=ProbeSpec.stats_only())
    encs = [encode(loaded, d) for d in documents]
    order = sorted(range(len(documents)), key=lambda i: encs[i].n)
    out: list[Result | None] = [None] * len(documents)
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        for i, r in zip(idx, run_encoded(loaded, [documents[i] for i in idx], [encs[i] for i in idx], choice, how)):
            out[i] = r
    return out  # type: ignore[return-value]


def decoder_cache() -> EncoderDecoderCache:
    """An empty key/value cache for ``generate`` whose layers grow as the decoder fills them.

    Why not let ``generate`` make one: it sizes the cache from the config's
    ``num_hidden_layers``, which T5's config maps to the *encoder* depth
    (``num_layers``), so a model with more decoder than encoder layers (one a
    training stage grew) fails with an IndexError in its last decoder layer
    (transformers 5.23)."""
    return EncoderDecoderCache(DynamicCache(), DynamicCache())


# generate() takes that cache as ``cache`` from transformers 5.24 on (``past_key_values``
# still works there, with a FutureWarning on every run, until 6.0); older 5.x know only the old name.
_CACHE_KWARG = "cache" if Version(transformers.__version__) >= Version("5.24") else "past_key_values"


def padded(loaded: Loaded, sequences: list[np.ndarray], left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id arrays as one right-padded (``left``: left-padded, as a decoder-only LM generates) batch on the
    model's device: ``(ids, mask)``, mask 1 on real tokens; refused first (:func:`check_length`) when the batch
    cannot fit this machine now."""
    n = max(len(s) for s in sequences)
    check_length(loaded, n, len(sequences))
    ids = torch.full((len(sequences), n), _pad_id(loaded), dtype=torch.long)
    mask = torch.zeros((len(sequences), n), dtype=torch.long)
    for i, s in enumerate(sequences):
        where = slice(n - len(s), n) if left else slice(0, len(s))
        ids[i, where] = torch.as_tensor(s, dtype=torch.long)
        mask[i, where] = 1
    return ids.to(loaded.device), mask.to(loaded.device)


def _pad_id(loaded: Loaded) -> int:
    """The tokenizer's pad token; a decoder-only LM's tokenizer often has none: its end token then (never attended)."""
    tok = loaded.tokenizer
    pad = tok.pad_token_id
    if pad is None and loaded.decoder_only:
        pad = getattr(tok, "eos_token_id", None)
    return pad or 0


def choice_for(loaded: Loaded, choice: Choice) -> Choice:
    """The choice as it acts on ``loaded``: the one rule that reads a choice's targets for a model's family, at
    the engine's edge (the app, the CLI, settings files and sweeps make their choices for T5, whose default target
    is ``encoder``: the attention that reads the document).

    On a decoder-only LM the ``encoder`` target names its causal self-attention, ``decoder`` (the attention that
    reads its prompt and makes its answer, prefill and every cached step); ``decoder`` stays, ``cross`` names
    nothing there (a choice targeting only ``cross`` with a tau other than 1 is refused by the attention, in one
    line). Other models' choices are as given. Direct calls of the attention keep its own check
    (:func:`core.mechanics.attention.attention_call` on a decoder-only model refuses a tau without ``decoder``)."""
    if not loaded.decoder_only or ENCODER not in choice.targets:
        return choice
    return choice.with_(targets=tuple(dict.fromkeys(DECODER if t == ENCODER else t for t in choice.targets)))


@torch.inference_mode()
def run_encoded(
    loaded: Loaded, docs: list[tasks.Document], encs: list[Encoded], choice: Choice = TRAINED, how: Pass = DEFAULT_PASS
) -> list[Result]:
    """Run already tokenised documents as one padded batch (what :func:`run` and :func:`run_batch` share)."""
    if not isinstance(choice, Choice) or not isinstance(how, Pass):
        raise TypeError("run_encoded takes a core.values.choice.Choice and a core.mechanics.run_pass.Pass")
    want = None if how.device is None else torch.device(how.device)
    if want is not None and (
        want.type != loaded.device.type
        or want.index not in (None, loaded.device.index if loaded.device.index is not None else 0)
    ):
        raise UserError(
            f"This pass asks for device {how.device}, but the model is on {loaded.device}: load it "
            f"there (a pass never moves a shared model)."
        )
    if loaded.decoder_only:
        return _run_decoder(loaded, docs, encs, choice, how)
    ids, mask = padded(loaded, [e.input_ids for e in encs])
    n = ids.shape[1]
    try:  # refuse a schedule that does not fit the model before any pass
        tau_values = choice.tau.matrix(loaded.n_layers, loaded.n_heads, rows=n)
    except ValueError as err:
        raise UserError(
            f"The tau schedule does not fit the model ({loaded.n_layers} layers x {loaded.n_heads} heads): {err}"
        ) from None
    # No probe asked for: no recorder, so the attention's blocks only make the output (the fastest backend: softmax_block).
    recorder = Recorder(how.probes, mask.bool()) if how.probes.wanted else None
    # A batch without padding needs no mask at all (and gets the fast path).
    enc_mask = None if bool(mask.all()) else mask

    t0 = time.perf_counter()
    # a rotary model's pass runs under its position scheme (bound at this batch's length), holding the model's lock
    with rope_pass.scheme_pass(loaded, choice, how, recorder, n):
        hidden = loaded.encoder(input_ids=ids, attention_mask=enc_mask).last_hidden_state
    bad_layers = recorder.nonfinite(ENCODER) if recorder is not None else []
    if bad_layers or not bool(torch.isfinite(hidden).all()):
        where = f" (encoder layer(s) {bad_layers})" if bad_layers else ""
        dtype = str(loaded.dtype).replace("torch.", "")
        why = (
            "T5 overflows in float16: run in float32 (CPU) or bfloat16 (GPU)"
            if loaded.dtype == torch.float16
            else f"the logits divided by tau (smallest {float(np.min(tau_values)):g}) left {dtype}'s range, or the "
            "weights hold NaN/inf"
        )
        raise NumericalError(f"NaN/inf appeared in the attention{where} with dtype {dtype}: {why}.")
    t_enc = time.perf_counter() - t0

    answers, pieces = [""] * len(encs), [None] * len(encs)
    t1 = time.perf_counter()
    # Decoder and cross-attention probes ride along with generation, one answer row per step.
    listening = recorder if recorder is not None and how.probes.asks(DECODER, CROSS) else None
    if how.generate and loaded.seq2seq:  # a masked-LM encoder has no decoder: its pass is stats only
        with attention_call(choice, how, listening), quiet_length_reminder():
            out = loaded.model.generate(
                encoder_outputs=BaseModelOutput(last_hidden_state=hidden),
                attention_mask=mask,
                max_new_tokens=how.max_new_tokens,
                do_sample=False,
                num_beams=1,
                **{_CACHE_KWARG: decoder_cache()},
            )
        answers = [a.strip() for a in loaded.tokenizer.batch_decode(out, skip_special_tokens=True)]
        pieces = [_pieces(loaded.tokenizer, row) for row in out[:, 1:].tolist()]
    record = recorder.finish() if recorder is not None else None
    nll = _continuation_nll(loaded, docs, hidden, mask, choice, how) if loaded.seq2seq else None
    t_gen = time.perf_counter() - t1
    for e in encs:  # seconds per document, for the pages' "about N s" before long work (core.runs.timing)
        timing.record(timing.model_key(loaded), e.n, t_enc / len(encs))
        if how.generate and loaded.seq2seq:
            timing.record(timing.model_key(loaded), e.n, t_gen / len(encs), timing.GENERATE)

    scored = how.generate and loaded.seq2seq
    return _results(loaded, docs, encs, choice, answers, pieces, record, nll, t_enc, t_gen, scored)


def _results(
    loaded: Loaded,
    docs: list[tasks.Document],
    encs: list[Encoded],
    choice: Choice,
    answers: list[str],
    pieces: list,
    record: ProbeRecord | None,
    nll: list | None,
    t_read: float,
    t_gen: float,
    scored: bool,
    order: list[int] | None = None,
) -> list[Result]:
    """One :class:`Result` per document, for both model shapes (an encoder-decoder and a decoder-only LM): the answer
    scored where one was generated, the document's own probes (batch item ``order.index(i)`` when the batch was
    reordered, longest first), seconds shared evenly over the batch. ``t_read``: the encoder pass or the prefill."""
    at = {i: k for k, i in enumerate(order)} if order is not None else {i: i for i in range(len(encs))}
    results = []
    for i, (doc, enc) in enumerate(zip(docs, encs)):
        sc = (
            tasks.score(doc.task, answers[i], doc.expected)
            if scored and doc.expected and doc.task != tasks.LM
            else None
        )
        rec = record if (record is None or len(encs) == 1) else record.item(at[i])
        results.append(
            Result(
                task=doc.task,
                answer=answers[i],
                expected=doc.expected,
                correct=None if sc is None else sc.correct,
                parsed=None if sc is None else sc.parsed,
                method=choice.method,
                tau=choice.tau.matrix(loaded.n_layers, loaded.n_heads, rows=enc.n),  # a row schedule: its mean here
                tokens=enc.n,
                train_length=loaded.train_length,
                needle_tokens=enc.needle_tokens,
                question_tokens=enc.question_tokens,
                probes=rec,
                seconds={
                    "encode": t_read / len(encs),
                    "generate": t_gen / len(encs),
                    "total": (t_read + t_gen) / len(encs),
                },
                cosine_scale=choice.cosine_scale if loaded.cosine else None,
                nll=None if nll is None or nll[i] is None else nll[i][0],
                scored_tokens=None if nll is None or nll[i] is None else nll[i][1],
                answer_tokens=pieces[i],
                schedule=choice.tau,
            )
        )
    return results


class _Prefill(LogitsProcessor):
    """Rides along with ``generate`` (changing no score): notes when the first scores come, the end of the prefill
    (the document's pass), and whether any step's scores held NaN or +inf (another processor's -inf is a ban)."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.finite = True

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.at is None:
            self.at = time.perf_counter()
        if self.finite and bool(torch.isnan(scores).any() or torch.isposinf(scores).any()):
            self.finite = False
        return scores


def _run_decoder(
    loaded: Loaded, docs: list[tasks.Document], encs: list[Encoded], choice: Choice, how: Pass
) -> list[Result]:
    """:func:`run_encoded` on a decoder-only LM (see the module docstring): one ``generate`` call per batch (or,
    with ``how.generate`` off, the base model's pass alone), the document's probes read on the prefill."""
    check_decoder_scheme(loaded, choice.scheme)
    if len({e.n for e in encs}) > 1 and _sinks(loaded, choice, max(e.n for e in encs)):
        # sinks are the first tokens of each prompt: a left-padded item's sit past its padding, so each alone
        return [r for d, e in zip(docs, encs) for r in _run_decoder(loaded, [d], [e], choice, how)]
    choice = choice_for(loaded, choice)
    if how.probes.kind != DECODER:
        how = replace(how, probes=replace(how.probes, kind=DECODER))
    order = sorted(range(len(encs)), key=lambda i: -encs[i].n)  # longest first: item 0 (the views') is unpadded
    ids, mask = padded(loaded, [encs[i].input_ids for i in order], left=True)
    n = ids.shape[1]
    try:  # refuse a schedule that does not fit the model before any pass
        tau_values = choice.tau.matrix(loaded.n_layers, loaded.n_heads, rows=n)
    except ValueError as err:
        raise UserError(
            f"The tau schedule does not fit the model ({loaded.n_layers} layers x {loaded.n_heads} heads): {err}"
        ) from None
    recorder = Recorder(how.probes, _recorded_rows(mask, encs, order, how.probes)) if how.probes.wanted else None
    generating = how.generate and how.max_new_tokens > 0
    mark = _Prefill()
    finite = True
    t0 = time.perf_counter()
    with rope_pass.scheme_pass(loaded, choice, how, recorder, n), quiet_length_reminder():
        if generating:
            out = loaded.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=how.max_new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=_pad_id(loaded),
                logits_processor=LogitsProcessorList([mark]),
            )
        else:
            hidden = loaded.model.base_model(
                input_ids=ids, attention_mask=None if bool(mask.all()) else mask
            ).last_hidden_state
            finite = bool(torch.isfinite(hidden[mask.bool()]).all())
    t_end = time.perf_counter()
    t_pre = (mark.at or t_end) - t0
    t_gen = t_end - (mark.at or t_end)
    bad_layers = recorder.nonfinite(DECODER) if recorder is not None else []
    if bad_layers or not finite or not mark.finite:
        where = f" (layer(s) {bad_layers})" if bad_layers else ""
        dtype = str(loaded.dtype).replace("torch.", "")
        raise NumericalError(
            f"NaN/inf appeared in the attention{where} with dtype {dtype}: the logits divided by tau "
            f"(smallest {float(np.min(tau_values)):g}) left {dtype}'s range, or the weights hold "
            "NaN/inf."
        )
    answers, pieces = [""] * len(encs), [None] * len(encs)
    if generating:
        new = out[:, n:]
        for k, row in enumerate(new.tolist()):
            answers[order[k]] = loaded.tokenizer.decode(row, skip_special_tokens=True).strip()
            pieces[order[k]] = _pieces(loaded.tokenizer, row)
    record = recorder.finish() if recorder is not None else None
    nll = _decoder_nll(loaded, docs, encs, choice, how)
    for e in encs:  # seconds per document, for the pages' "about N s" before long work (core.runs.timing)
        timing.record(timing.model_key(loaded), e.n, t_pre / len(encs))
        if generating:
            timing.record(timing.model_key(loaded), e.n, t_gen / len(encs), timing.GENERATE)
    return _results(loaded, docs, encs, choice, answers, pieces, record, nll, t_pre, t_gen, generating, order)


def _recorded_rows(mask: torch.Tensor, encs: list[Encoded], order: list[int], probes: ProbeSpec) -> torch.Tensor:
    """The rows of a left-padded decoder batch whose statistics the recorder weighs: every real token, or with
    :attr:`ProbeSpec.question_rows <core.mechanics.probes.ProbeSpec>` each item's question
    (:attr:`Encoded.question_rows`, shifted past its padding)."""
    if not probes.question_rows:
        return mask.bool()
    rows = torch.zeros(mask.shape, dtype=torch.bool)
    n = mask.shape[1]
    for k, i in enumerate(order):
        a, b = encs[i].question_rows
        pad = n - encs[i].n
        rows[k, pad + a : pad + b] = True
    return rows


def check_decoder_scheme(loaded: Loaded, scheme: positions.Scheme) -> None:
    """Refuse, in one line, a position scheme a decoder-only LM cannot run here: one whose mask or distances the
    attention does not apply to a decoder's causal rows (:data:`core.mechanics.attention.SCHEME_KINDS`; without
    that, a rectified scheme's rotary modules would hand over unrotated q and k and the model would run with no
    positions at all). Frequency schemes (PI, NTK, dynamic NTK, YaRN) reach the model's rotary module, always."""
    if (
        not loaded.decoder_only
        or scheme.is_plain
        or not ({positions.MASK, positions.DISTANCES} & set(scheme.entry.changes))
    ):
        return
    if DECODER not in getattr(attention, "SCHEME_KINDS", (ENCODER,)):
        raise UserError(
            f"Position scheme '{scheme.name}' on a decoder-only model ('{loaded.spec.name}') is not there yet: its "
            "mask and distances need the attention's decoder rows; run a frequency scheme (pi, ntk, dynamic-ntk, "
            "yarn-rope) or the plain one"
        )


def _sinks(loaded: Loaded, choice: Choice, tokens: int) -> bool:
    """Whether the choice's scheme keeps sink tokens (StreamingLLM, LM-Infinite): the first keys of the input, so a
    left-padded batch item's sinks would be padding (what :func:`_run_decoder` runs one document at a time)."""
    return not choice.scheme.is_plain and choice.scheme.bind(loaded.train_length, tokens).sinks > 0


#: The text of transformers' reminder that a generate call went past ``max_position_embeddings``
#: (``generation.stopping_criteria.MaxLengthCriteria``): going past L_tr is what this tool studies.
_REMINDER = "This is a friendly reminder - the current text generation call has exceeded"
_QUIET_LOCK = threading.Lock()
_QUIET_CALLS = [0]


class _NoLengthReminder(logging.Filter):
    """Drops transformers' length reminder (:data:`_REMINDER`), nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(_REMINDER)


_QUIET = _NoLengthReminder()


@contextlib.contextmanager
def quiet_length_reminder() -> Iterator[None]:
    """Silence transformers' "friendly reminder" that a generate call exceeded the model's maximum length, for the
    enclosed calls only: a filter on the logger that emits it (transformers' own ``logging.get_logger``), added by
    the first call under way and removed when the last one ends, so nothing of it outlives them. Why: every answer
    past L_tr (the point of this tool) printed it."""
    logger = transformers.utils.logging.get_logger("transformers.generation.stopping_criteria")
    with _QUIET_LOCK:
        if _QUIET_CALLS[0] == 0:
            logger.addFilter(_QUIET)
        _QUIET_CALLS[0] += 1
    try:
        yield
    finally:
        with _QUIET_LOCK:
            _QUIET_CALLS[0] -= 1
            if _QUIET_CALLS[0] == 0:
                logger.removeFilter(_QUIET)


def _decoder_nll(
    loaded: Loaded, docs: list[tasks.Document], encs: list[Encoded], choice: Choice, how: Pass
) -> list[tuple[float, int] | None] | None:
    """A decoder-only LM's :func:`_continuation_nll`: per language-modelling document, (summed -log p, tokens) of
    its continuation after its prompt, teacher-forced in one pass over prompt + continuation under the run's
    choice (left-padded, the vocabulary's logits for the continuation's rows only); None for the others."""
    lm = [i for i, d in enumerate(docs) if d.task == tasks.LM]
    if not lm:
        return None
    conts = [tasks.continuation_ids(docs[i]) for i in lm]
    sizes = [encs[i].n + len(c) for i, c in zip(lm, conts)]
    if len(set(sizes)) > 1 and _sinks(loaded, choice, max(sizes)):  # each alone: see _run_decoder
        out: list[tuple[float, int] | None] = [None] * len(docs)
        for i in lm:
            out[i] = _decoder_nll(loaded, [docs[i]], [encs[i]], choice, how)[0]  # type: ignore[index]
        return out
    ids, mask = padded(
        loaded,
        [np.concatenate([encs[i].input_ids, np.asarray(c, dtype=np.int64)]) for i, c in zip(lm, conts)],
        left=True,
    )
    width = max(len(c) for c in conts)
    # the last width + 1 rows: row k predicts the token after it, so item j's continuation (its last len(c) tokens)
    # is predicted by rows width - len(c) .. width - 1, and the last row predicts nothing
    labels = torch.full((len(lm), width + 1), -100, dtype=torch.long)
    for j, c in enumerate(conts):
        labels[j, width - len(c) : width] = torch.tensor(c)
    labels = labels.to(loaded.device)
    with rope_pass.scheme_pass(loaded, choice, how, None, ids.shape[1]):  # the prompt and continuation's length
        logits = loaded.model(
            input_ids=ids, attention_mask=None if bool(mask.all()) else mask, logits_to_keep=width + 1
        ).logits
    lost = torch.nn.functional.cross_entropy(
        logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none"
    )
    out: list[tuple[float, int] | None] = [None] * len(docs)
    for j, i in enumerate(lm):
        out[i] = (float(lost[j].sum()), len(conts[j]))
    return out


def _continuation_nll(
    loaded: Loaded, docs: list[tasks.Document], hidden: torch.Tensor, mask: torch.Tensor, choice: Choice, how: Pass
) -> list[tuple[float, int] | None] | None:
    """Per document, (summed -log p, tokens) of a language-modelling document's continuation, teacher-forced
    on the encoder states already computed (the decoder runs under the same settings); None for the others.

    Why here and not in a task module: it is one more decoder pass over the run's own encoder output,
    so Explore, sweeps and the perplexity table all get it from the same run."""
    lm = [i for i, d in enumerate(docs) if d.task == tasks.LM]
    if not lm:
        return None
    conts = [tasks.continuation_ids(docs[i]) for i in lm]
    labels = torch.full((len(lm), max(len(c) for c in conts)), -100, dtype=torch.long)
    for j, c in enumerate(conts):
        labels[j, : len(c)] = torch.tensor(c)
    labels = labels.to(loaded.device)
    with attention_call(choice, how, None):
        logits = loaded.model(
            encoder_outputs=BaseModelOutput(last_hidden_state=hidden[lm]), attention_mask=mask[lm], labels=labels
        ).logits
    lost = torch.nn.functional.cross_entropy(
        logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none"
    )
    out: list[tuple[float, int] | None] = [None] * len(docs)
    for j, i in enumerate(lm):
        out[i] = (float(lost[j].sum()), len(conts[j]))
    return out


def _pieces(tokenizer, ids: list[int]) -> list[str]:
    """One generated answer token by token, up to and with its end token (a batch pads finished answers)."""
    eos = tokenizer.eos_token_id
    if eos in ids:
        ids = ids[: ids.index(eos) + 1]
    return [tokenizer.decode([t]) for t in ids]
