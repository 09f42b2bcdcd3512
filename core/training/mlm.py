"""Masked-token training of the bundled rotary encoders (``family: "rope"``): the InfoScale paper's own setting.

Li et al. (2025, Section 4, Appendix A.2) train a bidirectional RoPE encoder
(GAU-alpha, 6 layers) with masked-token prediction at L_tr = 64 tokens, 15 %
of each sample's tokens masked, and measure masked-token accuracy and
perplexity from 1x to 64x L_tr. This module trains that model here, small
enough for a 2-core CPU:

- the model is transformers' own ``ModernBertForMaskedLM`` (rotary positions,
  global attention in every layer, ``rope_theta`` 10,000 as GAU-alpha, no
  sliding window), run through our ``aligned`` attention while training, so
  training and evaluation share one attention function and the cosine
  variant (``cosine_scale`` set: logits ``s * cos(q, k)``) trains with the
  same code (:func:`core.mechanics.attention.aligned_attention`);
- the tokenizer is the bundled T5s' byte-level BPE (``--tokenizer``) with a
  ``<mask>`` token added when it has none (it has none), so held-out text
  tokenises as it does for every other model here;
- the text is a training pool of :mod:`core.data.corpus`, never the evaluation
  pool: ``"lm-train"`` (default: the stdlib train pool plus installed
  packages' docstrings, 0.55 M words, eval-bucket paragraphs excluded) or
  ``"corpus-train"`` (the 56 k-word stdlib pool alone, which a model this
  size memorises; the tests use it because it loads at once). Its paragraphs,
  in a seeded order and joined by spaces as :func:`core.data.tasks.make` ``("lm")``
  joins them, form one token stream; each sample is a window of L_tr - 1
  tokens from a seeded random place plus ``</s>``, exactly L_tr tokens, as
  the held-out sequences of :mod:`core.experiments.mlm` are counted;
- in each sample ``round(0.15 x non-special tokens)`` positions are chosen
  (never a special token), BERT-style: 80 % become ``<mask>``, 10 % a random
  non-special token, 10 % stay; the loss is the cross-entropy on those
  positions only (the head is applied to them alone: computing logits at
  every position would double the cost of a step for nothing);
- every step's batch is a pure function of ``(seed, step)`` and the weights
  start from ``torch.manual_seed(seed)``: the same config gives the same
  first loss and, on the CPU, the same weights;
- the held-out score is :mod:`core.runs.mlm_pass`'s (``sequence`` and ``score``, what :mod:`core.experiments.mlm` runs:
  the corpus' eval pool, masked positions drawn by seed, tau = 1), so the card
  says what ``python -m core mlm`` measures at L_tr.

Options of this family live in ``TrainConfig.mlm`` (:data:`MLM_DEFAULTS`);
the sizes reuse T5's fields: ``encoder_layers`` layers, ``d_model`` hidden,
``d_ff`` intermediate (ModernBERT's GLU doubles it inside), ``num_heads``
heads (head dim ``d_model / num_heads``).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from core.training.config import TrainConfig
from core.training.optim import optimizer

ROPE = "rope"
#: The added mask token (the bundled BPE has none).
MASK_TOKEN = "<mask>"
#: The options of ``TrainConfig.mlm`` and their defaults: the text pool, the masking rate (the paper's 15 %),
#: the rotary base (GAU-alpha's 10,000; ModernBERT's own default is 160,000 for global layers).
MLM_DEFAULTS = {"pool": "lm-train", "mask_rate": 0.15, "rope_theta": 10_000.0}
POOLS = ("lm-train", "corpus-train")
#: The shares of the chosen positions that become <mask>, a random token, or stay (BERT's 80/10/10).
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1
#: Held-out sequences at the end of a run (about 9 masked tokens each at 64 tokens: ~1,900 masked positions).
FINAL_SEQUENCES = 200


def options(cfg: TrainConfig) -> dict:
    """``cfg.mlm`` over :data:`MLM_DEFAULTS`, checked: a typo fails before any training."""
    unknown = set(cfg.mlm) - set(MLM_DEFAULTS)
    if unknown:
        raise ValueError(f"mlm options: unknown {sorted(unknown)}; known: {sorted(MLM_DEFAULTS)}")
    opts = {**MLM_DEFAULTS, **cfg.mlm}
    if opts["pool"] not in POOLS:
        raise ValueError(
            f"mlm pool must be one of {POOLS} (a training pool, never the evaluation pool), got {opts['pool']!r}"
        )
    if not 0.0 < float(opts["mask_rate"]) < 1.0:
        raise ValueError(f"mlm mask_rate must be in (0, 1), got {opts['mask_rate']!r}")
    if not float(opts["rope_theta"]) > 0:
        raise ValueError(f"mlm rope_theta must be positive, got {opts['rope_theta']!r}")
    return opts


def get_tokenizer(reuse: str | Path | None):
    """The bundled BPE of ``reuse`` (or a fresh one, :mod:`core.models.tokenizer`) with :data:`MASK_TOKEN` added if missing."""
    from core.training.model import get_tokenizer as bpe

    tok = bpe(TrainConfig(), reuse)
    if tok.mask_token_id is None:
        tok.add_special_tokens({"mask_token": MASK_TOKEN})
    return tok


def build_model(cfg: TrainConfig, tok):
    """A fresh ``ModernBertForMaskedLM`` of the config's sizes on our attention (cosine when ``cosine_scale``).

    Vocabulary rounded up to a multiple of 8 as the project's tiny rotary models do (the rows past the
    tokenizer are never a label and never an input). ``max_position_embeddings`` is L_tr: rotary positions
    are not learned, so the field only says how long training sequences were, which is what dynamic NTK
    scaling reads (core.values.positions)."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    from core.mechanics import attention, patches

    opts = options(cfg)
    if cfg.d_model % cfg.num_heads:
        raise ValueError(f"d_model {cfg.d_model} does not split into {cfg.num_heads} heads")
    eos = tok.eos_token_id
    mcfg = ModernBertConfig(
        vocab_size=len(tok) + (-len(tok)) % 8,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.encoder_layers,
        num_attention_heads=cfg.num_heads,
        global_attn_every_n_layers=1,
        max_position_embeddings=cfg.train_length,
        pad_token_id=tok.pad_token_id,
        bos_token_id=eos,
        eos_token_id=eos,
        cls_token_id=eos,
        sep_token_id=eos,
        mask_token_id=tok.mask_token_id,
        attention_dropout=cfg.dropout,
        embedding_dropout=cfg.dropout,
        mlp_dropout=cfg.dropout,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": float(opts["rope_theta"])},
            "sliding_attention": {"rope_type": "default", "rope_theta": float(opts["rope_theta"])},
        },
    )
    if cfg.cosine_scale:
        mcfg.cosine_attention = True
        mcfg.cosine_scale = float(cfg.cosine_scale)
    mcfg._attn_implementation = attention.ATTN_NAME
    torch.manual_seed(cfg.seed)
    model = ModernBertForMaskedLM(mcfg)
    patches.patch(model, implementation=attention.ATTN_NAME)  # every config on ours, should the constructor differ
    if any(t != "full_attention" for t in model.config.layer_types):
        raise AssertionError("every layer must be global attention")
    return model


def token_stream(tok, pool: str, seed: int) -> np.ndarray:
    """The training pool's paragraphs in a seeded order, joined by spaces, as one array of token ids (no specials)."""
    from core.data import corpus

    paras = list(corpus.lm_train_pool() if pool == "lm-train" else corpus.pool("train"))
    random.Random(seed).shuffle(paras)
    ids = tok([" " + p for p in paras], add_special_tokens=False).input_ids
    return np.fromiter((t for row in ids for t in row), dtype=np.int64)


def special_ids(tok) -> np.ndarray:
    """Ids that are never masked and never drawn as a random replacement: every special token and <mask>."""
    return np.asarray(sorted(set(tok.all_special_ids) | {tok.mask_token_id}), dtype=np.int64)


def mask_batch(
    ids: np.ndarray, tok, rng: np.random.Generator, rate: float, vocab: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """BERT-style masking of ``ids`` [batch, L]: ``(inputs, labels)``, labels -100 where nothing is asked.

    Per row, ``max(1, round(rate x non-special tokens))`` positions without replacement; of those, each
    becomes <mask> with chance 0.8, a uniformly drawn non-special token with chance 0.1, or stays (0.1).
    A kept or replaced token is still a label: the model cannot tell which inputs to trust, so it must
    model every position (why BERT does it)."""
    special = special_ids(tok)
    vocab = vocab or len(tok)
    ordinary = np.setdiff1d(np.arange(vocab), special)
    inputs, labels = ids.copy(), np.full_like(ids, -100)
    for r in range(ids.shape[0]):
        cand = np.flatnonzero(~np.isin(ids[r], special))
        if len(cand) == 0:
            continue
        k = max(1, int(round(rate * len(cand))))
        pos = rng.choice(cand, size=k, replace=False)
        labels[r, pos] = ids[r, pos]
        u = rng.random(k)
        inputs[r, pos[u < MASK_SHARE]] = tok.mask_token_id
        rnd = pos[(u >= MASK_SHARE) & (u < MASK_SHARE + RANDOM_SHARE)]
        inputs[r, rnd] = rng.choice(ordinary, size=len(rnd))
    return inputs, labels


def batch_at(stream: np.ndarray, tok, cfg: TrainConfig, step: int, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """Step ``step``'s batch: windows of L_tr - 1 stream tokens plus ``</s>``, masked; a function of (seed, step)."""
    n = cfg.train_length - 1
    if len(stream) <= n:
        raise ValueError(f"the training text has {len(stream)} tokens: fewer than one sequence of {cfg.train_length}")
    rng = np.random.default_rng([cfg.seed, step])
    starts = rng.integers(0, len(stream) - n, size=cfg.batch_size)
    ids = np.stack([np.append(stream[s : s + n], tok.eos_token_id) for s in starts])
    return mask_batch(ids, tok, rng, rate)


def masked_loss(model, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the labelled positions only; the head runs on those rows alone (see the module docstring)."""
    hidden = model.model(input_ids=inputs).last_hidden_state
    sel = labels != -100
    logits = model.decoder(model.head(hidden[sel]))
    return torch.nn.functional.cross_entropy(logits.float(), labels[sel])


def evaluate(
    model,
    tok,
    lengths: list[int],
    sequences: int,
    train_length: int,
    seed: int = 0,
    rate: float | None = None,
    batch_size: int = 16,
) -> dict[int, dict]:
    """Held-out masked-token accuracy (a fraction) and perplexity per length at tau = 1, by :mod:`core.experiments.mlm`.

    Sequences of seeds ``seed..`` from the corpus' eval pool, masked positions drawn by seed: what
    ``python -m core mlm`` scores, so the card and the table measure the same thing."""
    from core.models import Loaded, ModelSpec
    from core.runs import mlm_pass as mlm

    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    loaded = Loaded(ModelSpec("training", "", train_length, "bundled"), model, tok, dev, torch.float32)
    out = {}
    try:
        for n in lengths:
            masked = [mlm.sequence(loaded, n, seed + i, rate or mlm.MASK_RATE)[1] for i in range(sequences)]
            count, correct, nll = 0, 0, 0.0
            for b in range(0, len(masked), batch_size):
                s = mlm.score(loaded, masked[b : b + batch_size])
                count, correct, nll = count + s.masked, correct + s.correct, nll + s.nll
            out[n] = {
                "tokens": n,
                "accuracy": round(correct / count, 4),
                "perplexity": round(math.exp(nll / count), 3),
                "masked": count,
                "sequences": sequences,
            }
    finally:
        model.train(was)
    return out


def train(
    cfg: TrainConfig,
    out: str | Path,
    reuse_tokenizer: str | Path | None = None,
    quiet: bool = False,
    evaluate_at_end: bool = True,
    device: str | None = None,
) -> dict:
    """Train a rotary masked-LM encoder and save it to ``out`` (weights, config, tokenizer, card, recipe).

    Same schedule as the T5 trainer (AdamW, linear warmup, cosine decay to 10 %, gradient clipping), so
    the two families differ in model and objective only. Returns the card."""
    from tqdm import tqdm

    from core.runs import mlm_pass  # noqa: F401  now, not at the first evaluation: one snapshot of the code for the whole run

    opts = options(cfg)
    if cfg.init_from:
        raise ValueError("init_from is not supported for the rope family yet: train it from scratch")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    tok = get_tokenizer(reuse_tokenizer)
    stream = token_stream(tok, opts["pool"], cfg.seed)
    model = build_model(cfg, tok)
    tok.save_pretrained(out)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(dev).train()
    opt, sched = optimizer(model, cfg)
    t0, losses, history = time.time(), [], []
    rate = float(opts["mask_rate"])
    bar = tqdm(total=cfg.steps, desc=f"train {cfg.name}", file=sys.stderr, disable=quiet)
    try:
        for step in range(cfg.steps):
            inputs, labels = (torch.from_numpy(a).to(dev) for a in batch_at(stream, tok, cfg, step, rate))
            loss = masked_loss(model, inputs, labels)
            losses.append(loss.item())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.3f}")
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                history.append(
                    {
                        "step": step + 1,
                        "loss": round(sum(losses[-50:]) / len(losses[-50:]), 4),
                        **_held_out(model, tok, cfg, cfg.eval_docs, rate),
                        "minutes": round((time.time() - t0) / 60, 2),
                    }
                )
                bar.write(json.dumps(history[-1]))
                _save(model, out, cfg, history, t0, final=False, losses=losses)
    finally:
        bar.close()
    final = _held_out(model, tok, cfg, max(cfg.eval_docs, FINAL_SEQUENCES), rate) if evaluate_at_end else {}
    history.append(
        {
            "step": cfg.steps,
            "loss": round(sum(losses[-50:]) / max(1, len(losses[-50:])), 4),
            **final,
            "minutes": round((time.time() - t0) / 60, 2),
        }
    )
    return _save(model, out, cfg, history, t0, final=True, losses=losses)


def _held_out(model, tok, cfg: TrainConfig, sequences: int, rate: float) -> dict:
    """The card's metric at L_tr: ``masked_accuracy`` (fraction), ``masked_perplexity``, ``masked`` positions;
    ``eval_error`` instead when the evaluation fails (an evaluation is a side look: the run goes on).

    Not named ``accuracy``: a T5 card's ``accuracy`` is a ``{task: percent}`` dict that the bundled-model
    regression tests replay per task."""
    if not sequences:
        return {}
    try:
        r = evaluate(model, tok, [cfg.train_length], sequences, cfg.train_length, rate=rate)[cfg.train_length]
    except Exception as err:  # noqa: BLE001  a side look must not throw away the training (as the T5 trainer)
        print(
            f"warning: held-out evaluation skipped ({type(err).__name__}: {err}); the weights are saved",
            file=sys.stderr,
        )
        return {"eval_error": f"{type(err).__name__}: {err}"}
    return {
        "tokens": r["tokens"],
        "masked_accuracy": r["accuracy"],
        "masked_perplexity": r["perplexity"],
        "masked": r["masked"],
        "sequences": r["sequences"],
    }


def _save(model, out: Path, cfg: TrainConfig, history: list[dict], t0: float, final: bool, losses: list[float]) -> dict:
    """Weights (safetensors), config, card and recipe; written at every evaluation and at the end."""
    model.save_pretrained(out, safe_serialization=True)
    dev = next(model.parameters()).device
    machine = (
        f"{platform.machine()} {os.cpu_count()} CPU cores, torch {torch.__version__} threads {torch.get_num_threads()}"
    )
    if dev.type == "cuda":
        machine = f"{torch.cuda.get_device_name(dev)} (float32), {machine}"
    opts = options(cfg)
    w = max(1, len(losses) // 50)
    card = {
        "name": cfg.name,
        "family": ROPE,
        "train_length": cfg.train_length,
        "tasks": ["mlm"],
        "summary": f"ModernBERT masked-LM, {cfg.encoder_layers} layers x {cfg.num_heads} heads, hidden {cfg.d_model}, "
        f"RoPE theta {opts['rope_theta']:g}"
        + (f", cosine attention s={cfg.cosine_scale:g}" if cfg.cosine_scale else "")
        + f", trained here at L_tr={cfg.train_length} tokens ({opts['mask_rate']:.0%} masked)",
        "default": False,
        "finished": final,
        "steps_done": history[-1]["step"] if history else 0,
        "parameters": sum(p.numel() for p in model.parameters()),
        "metrics": history[-1] if history else {},
        "history": history,
        "minutes": round((time.time() - t0) / 60, 2),
        "machine": machine,
        "seed": cfg.seed,
        "threads": torch.get_num_threads(),
        "config": asdict(cfg),
        "loss_window": w,
        "loss_curve": [round(sum(losses[i : i + w]) / len(losses[i : i + w]), 4) for i in range(0, len(losses), w)],
    }
    (out / "card.json").write_text(json.dumps(card, indent=2))
    (out / "train_config.json").write_text(json.dumps([asdict(cfg)], indent=1))
    return card
