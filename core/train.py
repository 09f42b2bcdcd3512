"""Train the bundled models: small T5s that learn retrieval at a short L_tr, reproducibly.

``python -m core train --out assets/models/NAME [--config FILE.json] [--steps N] ...``

``FILE.json`` holds one config or a list of them (stages: each starts from the
previous stage's weights; the default model is trained that way).

The model is transformers' own ``T5ForConditionalGeneration`` (learned
relative position bias, 32 buckets, max distance 128: exactly the mechanism
the paper studies), run through our ``aligned`` attention so a cosine-attention
variant (``logits = s * cos(q, k) + bias``) trains with the same code.
Documents come from :mod:`core.tasks`, generated on the fly in a background
process (varied haystacks from :mod:`core.corpus`' training pool, random needle
depth, lengths up to L_tr). A length curriculum grows the longest document
from ``min_length`` to ``train_length``: without it the copy solution is found
much later (see shared/notes/feasibility.md).

Everything is seeded; the config, the final metrics, the time it took and the
machine are written to ``card.json`` next to the weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from queue import Empty, Full

import numpy as np
import torch

from core import tasks
from core.errors import UserError

EVAL_SEED = 1_000_000  # evaluation seeds start here: never used in training


@dataclass
class TrainConfig:
    name: str = "retrieval-t5"
    # Defaults = the shipped default model (assets/models/retrieval-t5/train_config.json).
    tasks: dict[str, float] = field(default_factory=lambda: {"passkey": 0.3, "line": 0.3, "topic": 0.1, "multidoc": 0.15, "code": 0.15})
    train_length: int = 256
    min_length: int = 40
    curriculum_steps: int = 1500
    first_tasks: dict[str, float] | None = field(default_factory=lambda: {"passkey": 1.0})  # the first `first_steps` steps
    first_steps: int = 1200
    corpus_haystack: float = 0.5  # share of passkey/topic/multidoc docs with corpus paragraphs as haystack
    # per-task options for tasks.make, e.g. {"line": {"labels": "classic"}}: the
    # default model's early stages ran on the classic line labels
    task_options: dict[str, dict] = field(default_factory=dict)
    line_answer: str = "number"  # "label": line targets name the line first (tasks.target says why)
    # Attention supervision, per task: weight of a loss that asks the decoder's
    # lookup heads to put their cross-attention on the needle (the asked line)
    # while the answer is written (needle_attention_loss says how and why), e.g. {"line": 0.3}.
    needle_attention: dict[str, float] = field(default_factory=dict)
    # Per task: the chance that a training document's needle is the last unit,
    # right before the question, e.g. {"line": 0.25}. A uniform depth puts the
    # needle there in only about 1 in 16 line documents (the edges get half a
    # place's share), and that place is where the line model misses most
    # (research/line_misses.py); this gives it more of the gradient.
    last_needle: dict[str, float] = field(default_factory=dict)
    vocab_size: int = 2048
    d_model: int = 128
    d_kv: int = 32
    d_ff: int = 256
    num_heads: int = 4
    encoder_layers: int = 3
    decoder_layers: int = 1
    cosine_scale: float | None = None  # set: train with cosine attention at this s
    steps: int = 5000
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 500
    eval_docs: int = 20
    threads: int = 0  # 0: torch's default
    workers: int = 1  # producer processes making batches (step order, hence the result, does not depend on it)
    default: bool = False  # mark as the app's default model
    init_from: str | None = None  # start from these weights (a saved model folder) instead of random
    # blocks init_from lacks (a layer more): "fresh" (random, as the shipped recipe's
    # stages grew them) or "identity" (zero output projections: the grown model
    # first computes exactly what the source did; see identity_blocks)
    new_blocks: str = "fresh"

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def load_stages(path: str | Path) -> list[TrainConfig]:
    """A training config file: one object (one run) or a list of objects (stages).

    Why stages: the default model was grown, not trained in one go (a pass-key
    curriculum first, then a second decoder layer, then more line data). A list
    keeps that whole recipe in the one ``train_config.json`` next to the weights,
    so one command retrains it; each stage after the first starts from the
    previous stage's weights (its own ``init_from`` is ignored)."""
    d = json.loads(Path(path).read_text())
    items = d if isinstance(d, list) else [d]
    if not items or not all(isinstance(x, dict) for x in items):
        raise ValueError(f"{path}: expected a JSON object or a non-empty list of objects (training stages)")
    return [TrainConfig.from_dict(x) for x in items]


_FIXED_SIZES = ("d_kv",)  # a stage cannot change this (heads would be cut anew)
_GROWABLE = ("num_heads", "encoder_layers", "decoder_layers", "d_model", "d_ff")  # a stage may raise these (grow_state, fresh blocks)


def check_stages(cfgs: list[TrainConfig]) -> None:
    """Refuse a recipe whose stages cannot chain, before any of it trains.

    Why: a staged recipe runs for hours; a stage that changes ``d_kv`` or shrinks
    the head count would otherwise fail (or, for ``d_kv``, silently regroup
    heads) only when its turn comes; so would a misspelt ``new_blocks``. The
    first stage is checked against its ``init_from`` folder's ``config.json``
    the same way."""
    def sizes(c: TrainConfig) -> dict:
        return {k: getattr(c, k) for k in _FIXED_SIZES + _GROWABLE}

    prev: dict | None = None
    if cfgs and cfgs[0].init_from:
        src = Path(cfgs[0].init_from)
        if not (src / "model.safetensors").exists() or not (src / "config.json").exists():
            raise ValueError(f"init_from {src}: no model.safetensors and config.json there")
        c = json.loads((src / "config.json").read_text())  # T5Config's names for our fields
        prev = {k: c.get(k) for k in ("d_model", "d_kv", "d_ff", "num_heads")}
        prev |= {"encoder_layers": c.get("num_layers"), "decoder_layers": c.get("num_decoder_layers", c.get("num_layers"))}
    for k, cfg in enumerate(cfgs):
        cur, where = sizes(cfg), f"stage {k + 1}" if len(cfgs) > 1 else "this config"
        if cfg.new_blocks not in ("fresh", "identity"):
            raise ValueError(f"{where}: new_blocks must be 'fresh' or 'identity', got {cfg.new_blocks!r}")
        if prev is not None:
            for key in _FIXED_SIZES:
                if prev.get(key) != cur[key]:
                    raise ValueError(f"{where} has other sizes than the weights it starts from: {key} {cur[key]}, not {prev.get(key)}")
            for key in _GROWABLE:
                if prev.get(key) is not None and cur[key] < prev[key]:
                    raise ValueError(f"{where}: {key} {cur[key]} is below the weights it starts from ({prev[key]}); stages may only grow")
        prev = cur


def taught_tasks(cfgs: list[TrainConfig]) -> list[str]:
    """Every task some stage taught (``first_tasks`` too), in first-taught order.

    Why: a card's task list drives what the results bench and the regression
    tests ask of the model, and a model knows every task it was taught, not
    only the last stage's mix."""
    return list(dict.fromkeys(t for c in cfgs for t in [*(c.first_tasks or {}), *c.tasks]))


def stage_dir(out: str | Path, k: int, stages_dir: str | Path = "runs") -> Path:
    """Where stage ``k`` (all but the last) of a staged run is saved: under ``stages_dir``
    (git-ignored ``runs/`` by default), never beside ``out``: a folder with a card
    in ``assets/models/`` would be registered as a bundled model."""
    return Path(stages_dir) / f"{Path(out).name}.stage{k}"


def source_recipe(init_from: str | None) -> tuple[list[dict], list[dict]]:
    """The recipe (config dicts) and stage summaries that made the weights in ``init_from``.

    Why: a model continued from another (say the bundled default) is only
    reproducible with the source's own recipe in front of the new stages, and
    only honest about its cost with the source's minutes counted; a folder that
    ``train`` wrote keeps both (``train_config.json``, ``card.json``), so the
    continued model inherits them. A folder without a card gives nothing (nor
    does a staged card without its ``train_config.json``: the card keeps only
    the last stage's config): the recipe then starts at its ``init_from``."""
    src = Path(init_from) if init_from else None
    if src is None or not (src / "card.json").is_file():
        return [], []
    card = json.loads((src / "card.json").read_text())
    if (src / "train_config.json").is_file():
        recipe = json.loads((src / "train_config.json").read_text())
        return (recipe if isinstance(recipe, list) else [recipe]), card.get("stages") or [stage_summary(card)]
    if card.get("stages"):
        return [], []
    return [card["config"]], [stage_summary(card)]


def train_stages(cfgs: list[TrainConfig], out: str | Path, reuse_tokenizer: str | Path | None = None,
                 quiet: bool = False, device: str | None = None, evaluate_at_end: bool = True,
                 stages_dir: str | Path = "runs") -> dict:
    """Train ``cfgs`` in turn, each from the previous one's weights; the last lands in ``out``.

    Returns the last stage's card with ``stages`` (steps, minutes and metrics of
    each stage), ``minutes_total`` and ``tasks`` (every stage's, in first-taught
    order) added, so the card says what the whole
    recipe cost. Only the last stage runs the final 100-document evaluation.
    When the first stage starts from a folder ``train`` wrote, that folder's
    stages come first (``source_recipe``). ``out/train_config.json`` gets the
    whole recipe, so ``--config out/train_config.json`` retrains it."""
    check_stages(cfgs)
    recipe, stages = source_recipe(cfgs[0].init_from)
    prev, card = None, {}
    for k, cfg in enumerate(cfgs):
        last = k == len(cfgs) - 1
        target = Path(out) if last else stage_dir(out, k, stages_dir)
        if prev is not None:
            cfg.init_from = str(prev)
        if not quiet and len(cfgs) > 1:
            print(f"stage {k + 1}/{len(cfgs)} -> {target}", file=sys.stderr)
        card = train(cfg, target, reuse_tokenizer=reuse_tokenizer if prev is None else prev, quiet=quiet,
                     evaluate_at_end=last and evaluate_at_end, device=device, lineage=(recipe, stages))
        recipe, stages = source_recipe(target)
        prev = target
    return card


def lineage_entries(cfg: TrainConfig, card: dict, lineage: tuple[list[dict], list[dict]]) -> tuple[list[dict], list[dict]]:
    """The recipe and stage summaries of a run with ``cfg``, after the ``lineage`` it continues.

    Why a function of its own: ``_save`` writes them at every save, not only
    when a run ends, so any folder ``train`` leaves behind (a stage of a
    staged run, a halfway save) can be continued without losing the stages
    that made it. Stages after the first drop ``init_from``: each starts from
    the one before it (``load_stages``)."""
    earlier_recipe, earlier_stages = lineage
    mine = asdict(cfg)
    summary = stage_summary(card)
    if earlier_recipe:
        mine.pop("init_from", None)
    if earlier_stages:
        summary["init_from"] = "previous stage"
    return earlier_recipe + [mine], earlier_stages + [summary]


def _check_per_task(name: str, values: dict, what: str, high: float) -> None:
    """A ``{task: number}`` config field: known tasks, numbers in [0, high]; fails before training starts."""
    for task, v in values.items():
        if task not in tasks.TASKS or isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= high:
            raise ValueError(f"{name} wants {{task: {what}}} with tasks from {list(tasks.TASKS)}, got {task!r}: {v!r}")


def stage_summary(card: dict) -> dict:
    """What a staged card keeps of one stage's own card."""
    c = card["config"]
    return {"steps": card["steps_done"], "minutes": card["minutes"], "machine": card["machine"],
            "layers": f"{c['encoder_layers']}+{c['decoder_layers']}", "heads": c.get("num_heads"), "tasks": c["tasks"], "lr": c["lr"],
            "init_from": c.get("init_from"), "metrics": card["metrics"]}


def build_model(cfg: TrainConfig, vocab_size: int):
    """A fresh T5 with the config's sizes (our attention; cosine mode if asked)."""
    from transformers import T5Config, T5ForConditionalGeneration

    from core import attention  # noqa: F401  registers "aligned"

    tcfg = T5Config(
        vocab_size=vocab_size, d_model=cfg.d_model, d_kv=cfg.d_kv, d_ff=cfg.d_ff,
        num_layers=cfg.encoder_layers, num_decoder_layers=cfg.decoder_layers, num_heads=cfg.num_heads,
        relative_attention_num_buckets=32, relative_attention_max_distance=128,
        dropout_rate=0.0, feed_forward_proj="relu", tie_word_embeddings=True,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, n_positions=cfg.train_length,
    )
    if cfg.cosine_scale:
        tcfg.cosine_attention = True
        tcfg.cosine_scale = float(cfg.cosine_scale)
    tcfg._attn_implementation = attention.ATTN_NAME
    torch.manual_seed(cfg.seed)
    model = T5ForConditionalGeneration(tcfg)
    model.config._attn_implementation = attention.ATTN_NAME
    return model


def get_tokenizer(cfg: TrainConfig, reuse: str | Path | None = None):
    """Reuse a saved tokenizer (all bundled models share one), or train the BPE of :mod:`core.tokenizer`."""
    from transformers import AutoTokenizer

    if reuse and (Path(reuse) / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(str(reuse))
    from core.tokenizer import train_tokenizer, training_texts

    return train_tokenizer(training_texts(), vocab_size=cfg.vocab_size)


def _max_len(cfg: TrainConfig, step: int) -> int:
    if step >= cfg.curriculum_steps:
        return cfg.train_length
    f = step / max(1, cfg.curriculum_steps)
    return int(cfg.min_length + f * (cfg.train_length - cfg.min_length))


def sample_document(cfg: TrainConfig, tokenizer, rng: random.Random, max_len: int, step: int = 10**9) -> tasks.Document:
    """One training document. The first ``first_steps`` steps draw from ``first_tasks`` only:
    passkey alone teaches the copy skill fastest (short documents, one needle),
    and the other tasks reuse it once it exists."""
    mix = cfg.first_tasks if (cfg.first_tasks and step < cfg.first_steps) else cfg.tasks
    names, weights = zip(*mix.items())
    task = rng.choices(names, weights)[0]
    n = rng.randint(min(cfg.min_length, max_len), max_len)
    haystack = "corpus-train" if (task in ("passkey", "topic", "multidoc") and rng.random() < cfg.corpus_haystack) else "default"
    seed = rng.randrange(EVAL_SEED)
    depth = rng.random()
    last = cfg.last_needle.get(task, 0.0)
    if last and rng.random() < last:  # no extra draw otherwise: old recipes replay
        depth = 1.0
    while True:  # early in the curriculum some tasks cannot fit yet: grow until they do
        try:
            return tasks.make(task, tokenizer, n, depth=depth, seed=seed, haystack=haystack,
                              **cfg.task_options.get(task, {}))
        except ValueError:
            if n > 4 * cfg.train_length:
                raise
            n = int(n * 1.25) + 8


def _batches(cfg: TrainConfig, tokenizer_dir: str, queue, worker: int, stop, parent: int) -> None:
    """Producer process ``worker`` of ``cfg.workers``: the tokenised batches of steps
    ``worker, worker + workers, ...``. Each step's documents depend only on the
    seed and the step, so the trainer gets the same data whatever the worker count.

    A failure is sent to the trainer as ``("error", message)`` (else the trainer
    would wait forever on the queue), and a producer whose trainer was killed
    (its parent pid changed) stops instead of lingering as an orphan."""
    from transformers import AutoTokenizer

    def unwanted() -> bool:
        if stop.is_set() or os.getppid() != parent:
            # Nobody will read what is still buffered: without this, exit joins the queue's
            # feeder thread, which is blocked writing a batch larger than the pipe's buffer.
            queue.cancel_join_thread()
            return True
        return False

    try:
        torch.set_num_threads(1)
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        for step in range(worker, cfg.steps, max(1, cfg.workers)):
            if unwanted():
                return
            rng = random.Random(cfg.seed * 1_000_003 + step)
            docs = [sample_document(cfg, tok, rng, _max_len(cfg, step), step) for _ in range(cfg.batch_size)]
            enc = tok([d.text for d in docs], padding=True, return_tensors="pt",
                      return_offsets_mapping=bool(cfg.needle_attention))
            lab = tok([tasks.target(d, cfg.line_answer) for d in docs], padding=True, return_tensors="pt").input_ids
            lab[lab == tok.pad_token_id] = -100
            needle = None
            if cfg.needle_attention:
                needle = (needle_token_mask(enc.offset_mapping.numpy(), [d.needle_span for d in docs]),
                          np.array([cfg.needle_attention.get(d.task, 0.0) for d in docs], dtype=np.float32))
            # numpy, not torch: torch tensors cross processes as shared-memory handles
            # that die with the producer
            item = (step, enc.input_ids.numpy(), enc.attention_mask.numpy(), lab.numpy(), needle)
            while True:  # a full queue must not keep an orphan alive: re-check the trainer every few s
                try:
                    queue.put(item, timeout=5)
                    break
                except Full:
                    if unwanted():
                        return
    except Exception as err:  # documents that cannot be made: a config problem, reported in one line
        queue.put(("error", f"{type(err).__name__}: {err}"))
        return
    queue.put(None)


def eval_documents(tokenizer, cfg: TrainConfig, task: str, n_docs: int, length: int) -> list[tasks.Document]:
    """The evaluation documents of one task: fresh seeds (>= EVAL_SEED), half on eval haystacks.

    The same in every process: the depths come from a generator seeded with a
    digest of the task's name (Python's ``hash`` of a str is salted per
    process, which once made every run's evaluation documents differ)."""
    salt = int(hashlib.sha1(task.encode()).hexdigest(), 16) % 1000
    rng = random.Random(EVAL_SEED + salt)
    return [tasks.make(task, tokenizer, length, depth=rng.random(), seed=EVAL_SEED + i,
                       haystack="corpus-eval" if (task in ("passkey", "topic", "multidoc") and i % 2) else "default",
                       **cfg.task_options.get(task, {}))
            for i in range(n_docs)]


def evaluate(model, tokenizer, cfg: TrainConfig, n_docs: int, length: int | None = None) -> dict[str, float]:
    """Accuracy per task on fresh seeds (>= EVAL_SEED) at ``length`` (default L_tr), eval haystacks."""
    from core import engine
    from core.models import Loaded, ModelSpec

    model.eval()
    length = length or cfg.train_length
    device = next(model.parameters()).device
    loaded = Loaded(ModelSpec(cfg.name, "", cfg.train_length, "bundled"), model, tokenizer, device, torch.float32)
    out = {}
    for task in cfg.tasks:
        res = engine.run_batch(loaded, eval_documents(tokenizer, cfg, task, n_docs, length), batch_size=16)
        out[task] = 100.0 * sum(bool(r.correct) for r in res) / len(res)
    model.train()
    return out


def _try_evaluate(model, tokenizer, cfg: TrainConfig, n_docs: int) -> dict:
    """``{"accuracy": ...}``, or ``{"accuracy": {}, "eval_error": why}`` when the engine refuses.

    Why: an evaluation is a side look, and the engine may refuse it for a
    passing reason (free memory is low while another process runs); that must
    not throw away an hour of training, so the step's record says why instead."""
    try:
        return {"accuracy": evaluate(model, tokenizer, cfg, n_docs)}
    except UserError as err:
        model.train()
        return {"accuracy": {}, "eval_error": str(err)}


def train(cfg: TrainConfig, out: str | Path, reuse_tokenizer: str | Path | None = None, quiet: bool = False,
          evaluate_at_end: bool = True, device: str | None = None,
          lineage: tuple[list[dict], list[dict]] = ([], [])) -> dict:
    """Train and save to ``out``; returns the card (metrics included).

    ``lineage``: the recipe and stage summaries of what ``cfg.init_from`` holds
    (``source_recipe``); every save writes them, with this run after them, to
    ``out/train_config.json`` and the card (``lineage_entries``).

    ``device``: "cpu", "cuda" or None (CUDA when present). Training runs in
    float32 on either: the models are small, and the app runs them in float32
    on the CPU, so there is no precision gap between training and use."""
    import multiprocessing as mp

    from tqdm import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    tokenizer = get_tokenizer(cfg, reuse_tokenizer)
    tasks.check_line_answer(cfg.line_answer)
    _check_per_task("needle_attention", cfg.needle_attention, "weight >= 0", math.inf)
    _check_per_task("last_needle", cfg.last_needle, "chance in [0, 1]", 1.0)
    check_stages([cfg])  # before reading any weights; e.g. another d_kv: equal shapes would load, heads cut anew
    for task, opts in cfg.task_options.items():  # a bad option fails here, not deep in a producer
        try:
            tasks.make(task, tokenizer, cfg.train_length, **opts)
        except ValueError as e:
            raise ValueError(f"task_options[{task!r}]: {e}") from None
    tokenizer.save_pretrained(out)
    model = build_model(cfg, len(tokenizer))
    if cfg.init_from:
        from safetensors.torch import load_file

        state = load_file(str(Path(cfg.init_from) / "model.safetensors"))
        state = grow_state(state, model.state_dict())
        try:
            missing, unexpected = model.load_state_dict(state, strict=False)
        except RuntimeError as err:  # tensor shapes differ: another d_model, d_ff, heads...
            first = next((ln.strip() for ln in str(err).splitlines() if "size mismatch" in ln), str(err).splitlines()[0])
            raise ValueError(f"--init-from {cfg.init_from} has other sizes than this config: {first}") from None
        # Tied embeddings, and blocks the source does not have (e.g. a second
        # decoder layer), may be missing: they start fresh. Anything else must match.
        src_blocks = {_block(k) for k in state} - {None}
        odd = [k for k in missing if not k.endswith("embed_tokens.weight") and k != "lm_head.weight"
               and _block(k) in src_blocks | {None}]
        if unexpected or odd:
            raise ValueError(f"--init-from {cfg.init_from} does not match this config ({odd[:3]} {unexpected[:3]})")
        if cfg.new_blocks == "identity":
            identity_blocks(model, {_block(k) for k in missing} - src_blocks - {None})
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model.to(dev).train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        f = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * f))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    ctx = mp.get_context("spawn")
    workers = max(1, cfg.workers)
    queue, stop = ctx.Queue(maxsize=8 * workers), ctx.Event()
    producers = [ctx.Process(target=_batches, args=(cfg, str(out), queue, w, stop, os.getpid()), daemon=True) for w in range(workers)]
    for pr in producers:
        pr.start()
    pending: dict[int, tuple] = {}  # batches that arrived ahead of their step
    finished = 0
    t0 = time.time()
    losses: list[float] = []
    history: list[dict] = []
    bar = tqdm(total=cfg.steps, desc=f"train {cfg.name}", file=sys.stderr, disable=quiet)
    tap = CrossAttentionTap(model) if cfg.needle_attention else None
    looks: list[float] = []  # the needle-attention loss, apart from `losses` (the LM loss)
    try:
        for step in range(cfg.steps):
            while step not in pending:
                try:
                    item = queue.get(timeout=30)
                except Empty:
                    if not any(pr.is_alive() for pr in producers):
                        raise RuntimeError(f"training data producers died before step {step}") from None
                    continue
                if item is not None and item[0] == "error":
                    raise ValueError(f"training data producer failed: {item[1]}")
                if item is None:
                    finished += 1
                    if finished == workers:
                        raise RuntimeError(f"producers stopped before step {step}")
                    continue
                pending[item[0]] = item[1:]
            ids, mask, lab, needle = pending.pop(step)
            ids, mask, lab = (torch.from_numpy(a).to(dev) for a in (ids, mask, lab))
            loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
            losses.append(loss.item())
            if tap is not None:
                look = needle_attention_loss(tap.logits(), mask.bool(), torch.from_numpy(needle[0]).to(dev),
                                             torch.from_numpy(needle[1]).to(dev), lab != -100)
                looks.append(look.item())
                loss = loss + look
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(loss=f"{sum(losses[-50:]) / len(losses[-50:]):.3f}", L=int(ids.shape[1]),
                            **({"look": f"{sum(looks[-50:]) / len(looks[-50:]):.3f}"} if looks else {}))
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
                history.append({"step": step + 1, "loss": sum(losses[-50:]) / len(losses[-50:]),
                                **({"needle_attention": sum(looks[-50:]) / len(looks[-50:])} if looks else {}),
                                **_try_evaluate(model, tokenizer, cfg, cfg.eval_docs),
                                "minutes": round((time.time() - t0) / 60, 2)})
                bar.write(json.dumps(history[-1]))
                _save(model, out, cfg, history, t0, final=False, lineage=lineage)
    finally:
        if tap is not None:
            tap.remove()
        stop.set()
        for pr in producers:
            pr.join(timeout=5)
            if pr.is_alive():
                pr.terminate()
        bar.close()
    final = _try_evaluate(model, tokenizer, cfg, max(cfg.eval_docs, 100)) if evaluate_at_end else {"accuracy": {}}
    if "eval_error" in final and not quiet:
        print(f"warning: final evaluation skipped ({final['eval_error']}); the weights are saved, "
              f"evaluate them with bench/results.py or the card's test", file=sys.stderr)
    history.append({"step": cfg.steps, "loss": sum(losses[-50:]) / max(1, len(losses[-50:])), **final,
                    "minutes": round((time.time() - t0) / 60, 2)})
    return _save(model, out, cfg, history, t0, final=True, losses=losses, looks=looks, lineage=lineage)


def needle_token_mask(offsets: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """``[batch, tokens]``: True where a token's characters overlap its document's
    needle span. ``offsets`` is the fast tokenizer's ``offset_mapping``; special
    tokens and padding have empty offsets and are never part of a needle."""
    a, b = offsets[..., 0], offsets[..., 1]
    start = np.array([s for s, _ in spans])[:, None]
    end = np.array([e for _, e in spans])[:, None]
    return (b > a) & (b > start) & (a < end)


class CrossAttentionTap:
    """The decoder's cross-attention logits of the last forward, with their gradient.

    Forward hooks on each cross-attention's ``q`` and ``k`` projections (the
    model never knows who listens). Our attention function hands torch's fused
    kernel the softmax and never holds the probabilities; recomputing the
    cross-attention logits is cheap (answer tokens x document tokens)."""

    def __init__(self, model) -> None:
        from core.attention import logit_operands

        self._operands = logit_operands
        self._q: dict[int, torch.Tensor] = {}
        self._k: dict[int, torch.Tensor] = {}
        self._handles = []
        cfg = model.config
        self._cosine = float(cfg.cosine_scale) if getattr(cfg, "cosine_attention", False) else None
        first = model.decoder.block[0].layer[1].EncDecAttention
        self._heads, self._d_kv, self._scaling = first.n_heads, first.key_value_proj_dim, getattr(first, "scaling", 1.0)
        for i, block in enumerate(model.decoder.block):
            att = block.layer[1].EncDecAttention
            self._handles.append(att.q.register_forward_hook(lambda m, i_, out, i=i: self._q.__setitem__(i, out)))
            self._handles.append(att.k.register_forward_hook(lambda m, i_, out, i=i: self._k.__setitem__(i, out)))

    def logits(self) -> list[torch.Tensor]:
        """Per decoder layer, ``[batch, heads, answer tokens, document tokens]`` (no mask applied)."""
        out = []
        for i in sorted(self._q):
            q, k = self._q[i], self._k[i]
            q = q.view(*q.shape[:2], self._heads, self._d_kv).transpose(1, 2)
            k = k.view(*k.shape[:2], self._heads, self._d_kv).transpose(1, 2)
            q, k = self._operands(q, k, self._scaling, self._cosine)
            out.append(q @ k.transpose(-1, -2))
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def needle_log_shares(logits: list[torch.Tensor], enc_mask: torch.Tensor, needle: torch.Tensor) -> torch.Tensor:
    """``[B, heads of all layers, T]``: log of the attention share each head gives the needle.

    ``logits`` per layer ``[B, H, T, S]`` (:meth:`CrossAttentionTap.logits`);
    ``enc_mask``/``needle`` ``[B, S]`` bool. A document with no needle token
    gets ``-inf``."""
    shares = []
    for lg in logits:
        logp = lg.float().masked_fill(~enc_mask[:, None, None, :], float("-inf")).log_softmax(-1)
        shares.append(logp.masked_fill(~needle[:, None, None, :], float("-inf")).logsumexp(-1))
    return torch.cat(shares, 1)


LOOKUP_SHARE = 0.5  # a head that gives the needle at least this share on a batch is a lookup head


def needle_attention_loss(logits: list[torch.Tensor], enc_mask: torch.Tensor, needle: torch.Tensor,
                          weight: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """Minus the log of the share of attention the lookup heads give the needle,
    averaged over the answer's tokens and the lookup heads, weighted per document.

    Why: the bundled model's line misses are lookups gone soft. Its decoder
    already has heads that find the asked line (about 0.8 of their mass on it
    when the answer is right, about 0.3 when it is wrong: docs/line-retrieval.md, "Attention
    supervision"); the LM loss sharpens them only through the right digits.
    This loss asks for the lookup itself, at training time only.

    The lookup heads are found on each batch, not named: those whose mean
    share on the needle (detached) is at least ``LOOKUP_SHARE``; if none is,
    the best one. The others (one must read the question first) are left free.
    A max over heads would not do: on almost every document some head (one that
    always looks at a fixed place, say) happens to sit on the needle.

    ``logits``: per layer ``[B, H, T, S]``; ``enc_mask``/``needle`` ``[B, S]``
    bool; ``weight`` ``[B]``; ``answer`` ``[B, T]`` bool (the label tokens)."""
    needle = needle | ~needle.any(1, keepdim=True)  # no needle (weight 0): a finite dummy
    log_share = needle_log_shares(logits, enc_mask, needle)
    tokens = answer[:, None, :].float()
    per_head = -(log_share * tokens).sum(2) / tokens.sum(2).clamp(min=1)  # [B, heads]
    used = weight > 0
    with torch.no_grad():
        mean_share = (log_share.exp() * tokens).sum(2) / tokens.sum(2).clamp(min=1)
        mean_share = mean_share[used].mean(0) if used.any() else mean_share.mean(0)
        lookup = mean_share >= LOOKUP_SHARE
        if not lookup.any():
            lookup = mean_share == mean_share.max()
    per_doc = per_head[:, lookup].mean(1)
    return (per_doc * weight).sum() / used.sum().clamp(min=1)


# Tensors that write into the residual stream (attention ``o``, feed-forward
# ``wo``) or are it (the tied embedding): where they grow, they start at zero,
# so the grown model computes what its source did. Everything else that grows
# (q, k, v, wi, position biases) takes the target's fresh initialisation there:
# a random reader of zeros adds nothing, and it hands the zero writers a
# gradient (zero on both sides would be a saddle that training never leaves).
_ZERO_WHERE_GROWN = (".o.weight", ".wo.weight", "shared.weight", "embed_tokens.weight", "lm_head.weight")


def grow_state(state: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fit a smaller source state (fewer heads, a narrower ``d_model`` or ``d_ff``)
    into ``target``'s shapes, keeping its function.

    Why: a stage can then add room (heads for a new skill, width for more
    labels to tell apart) without losing what the model learned; retraining
    from scratch costs hours on a CPU. Every source tensor keeps the leading
    block of its grown tensor (old heads keep their slots, old units their
    rows); see ``_ZERO_WHERE_GROWN`` for what fills the rest. A wider
    ``d_model`` pads the residual stream with zeros, which shrinks the mean
    square that T5's RMS norms divide by (by d_src / d_dst): each norm's weight
    is scaled by sqrt(d_src / d_dst) to undo it, except the decoder's final
    norm, whose output the tied head scales by d_model ** -0.5, which moves by
    the inverse factor. Tensors that would shrink, or differ in rank, are left
    alone (loading then fails with a clear size message)."""
    out = dict(state)
    for key, src in state.items():
        dst = target.get(key)
        if dst is None or dst.shape == src.shape or dst.ndim != src.ndim or any(a > b for a, b in zip(src.shape, dst.shape)):
            continue
        grown = torch.zeros_like(dst) if key.endswith(_ZERO_WHERE_GROWN) else dst.clone()
        grown[tuple(slice(0, n) for n in src.shape)] = src
        out[key] = grown.to(src.dtype)
    d_src = state["shared.weight"].shape[1] if "shared.weight" in state else 0
    d_dst = target["shared.weight"].shape[1] if "shared.weight" in target else 0
    if d_src and d_dst > d_src:
        for key in out:
            if key.endswith("layer_norm.weight") and key != "decoder.final_layer_norm.weight":
                out[key] = out[key] * math.sqrt(d_src / d_dst)
    return out


def identity_blocks(model, blocks: set[str]) -> None:
    """Zero the output projections (attention ``o``, feed-forward ``wo``) of ``blocks``.

    Why: a T5 block adds its outputs to the residual stream, so a block whose
    output projections are zero is the identity, and a layer grown this way
    keeps what the source model computes (like ``grow_state`` for heads and width).
    A random fresh layer instead scrambles the stream, and the first steps
    are spent recovering skills the source had. Gradients still reach the
    zero projections (their inputs are not zero), so the layer starts learning
    at once."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if _block(name) in blocks and name.endswith((".o.weight", ".wo.weight")):
                p.zero_()


def _block(key: str) -> str | None:
    """"encoder.block.2.layer.0..." -> "encoder.block.2"; None for tensors outside the blocks."""
    parts = key.split(".")
    return ".".join(parts[:3]) if len(parts) > 3 and parts[1] == "block" else None


def _save(model, out: Path, cfg: TrainConfig, history: list[dict], t0: float, final: bool, losses=None,
          looks=None, lineage: tuple[list[dict], list[dict]] = ([], [])) -> dict:
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(decoder_start_token_id=0, eos_token_id=1, pad_token_id=0,
                                               max_new_tokens=tasks.MAX_ANSWER_TOKENS)
    model.save_pretrained(out, safe_serialization=True)
    dev = next(model.parameters()).device
    machine = f"{platform.machine()} {os.cpu_count()} CPU cores, torch {torch.__version__} threads {torch.get_num_threads()}"
    if dev.type == "cuda":
        machine = f"{torch.cuda.get_device_name(dev)} (float32), {machine}, {cfg.workers} data workers"
    card = {
        "name": cfg.name,
        "train_length": cfg.train_length,
        "tasks": taught_tasks([cfg]),
        "summary": f"T5 {cfg.encoder_layers}+{cfg.decoder_layers} layers, {cfg.num_heads} heads, d_model {cfg.d_model}"
                   + (f", cosine attention s={cfg.cosine_scale:g}" if cfg.cosine_scale else "")
                   + f", trained here at L_tr={cfg.train_length} tokens",
        "default": cfg.default,
        "finished": final,
        "steps_done": history[-1]["step"] if history else 0,
        "parameters": sum(p.numel() for p in model.parameters()),
        "metrics": history[-1] if history else {},
        "history": history,
        "minutes": round((time.time() - t0) / 60, 2),
        "machine": machine,
        "config": asdict(cfg),
    }
    if losses is not None:
        w = max(1, len(losses) // 50)
        card["loss_window"] = w
        card["loss_curve"] = [round(sum(losses[i:i + w]) / len(losses[i:i + w]), 4) for i in range(0, len(losses), w)]
        if looks:  # the needle-attention loss, same windows (one value per step, like losses)
            card["needle_attention_curve"] = [round(sum(looks[i:i + w]) / len(looks[i:i + w]), 4)
                                              for i in range(0, len(looks), w)]
    recipe, stages = lineage_entries(cfg, card, lineage)
    if len(stages) > 1:
        card["tasks"] = taught_tasks([TrainConfig.from_dict(d) for d in recipe])
        card["stages"] = stages
        card["minutes_total"] = round(sum(st["minutes"] for st in stages), 2)
    (out / "card.json").write_text(json.dumps(card, indent=2))
    (out / "train_config.json").write_text(json.dumps(recipe, indent=1))
    return card


def search_cosine_scale(cfg: TrainConfig, scales: list[float], steps: int, out: str | Path,
                        reuse_tokenizer: str | Path | None = None) -> dict[float, float]:
    """Pick CosScale's s by short pilot runs: mean loss of the last 20 % of ``steps`` per s.

    Cosine logits are bounded by s (plus the bias), so s sets how sharp
    attention can get at all: too small and the key cannot be singled out,
    too large and training is as brittle as unscaled dot products. A pilot of
    a few hundred steps separates the candidates cheaply.
    """
    results = {}
    for sc in scales:
        pilot = TrainConfig(**{**asdict(cfg), "cosine_scale": float(sc), "steps": steps, "eval_every": 0,
                               "curriculum_steps": steps, "name": f"pilot-s{sc:g}"})
        card = train(pilot, Path(out) / f"pilot-s{sc:g}", reuse_tokenizer=reuse_tokenizer, quiet=True, evaluate_at_end=False)
        tail = card["loss_curve"][-max(1, len(card["loss_curve"]) // 5):]
        results[float(sc)] = round(sum(tail) / len(tail), 4)
        print(json.dumps({"cosine_scale": sc, "final_loss": results[float(sc)]}), file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m core train", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder, e.g. assets/models/passkey-t5")
    p.add_argument("--config", help="JSON with TrainConfig fields, or a list of them: stages, each from the previous one's weights")
    p.add_argument("--tokenizer", help="reuse the tokenizer of this folder")
    p.add_argument("--stages-dir", default="runs", help="where a staged config keeps its intermediate stages (default: runs/)")
    for f in fields(TrainConfig):
        if f.type in ("int", "float", "str", "float | None", "str | None") and f.name != "name":
            p.add_argument(f"--{f.name.replace('_', '-')}", type=float if "float" in f.type else (int if f.type == "int" else str))
    p.add_argument("--name")
    p.add_argument("--cosine-search", help="comma list of s: pilot runs pick CosScale's s (see --pilot-steps)")
    p.add_argument("--pilot-steps", type=int, default=400)
    p.add_argument("--device", help="cpu | cuda (default: CUDA when present); training is float32 on both")
    args = p.parse_args(argv)
    cfgs = load_stages(args.config) if args.config else [TrainConfig()]
    for cfg in cfgs:  # command-line values apply to every stage
        for f in fields(TrainConfig):
            v = getattr(args, f.name, None)
            if v is not None:
                setattr(cfg, f.name, v)
    cfg_note = {}
    if args.cosine_search:
        if len(cfgs) > 1:
            raise ValueError("--cosine-search picks s for a one-stage config; set cosine_scale in each stage instead")
        scales = [float(x) for x in args.cosine_search.split(",")]
        found = search_cosine_scale(cfgs[0], scales, args.pilot_steps, Path(args.out).parent / "pilots", args.tokenizer)
        cfgs[0].cosine_scale = min(found, key=found.get)
        cfg_note = {"cosine_search": {str(k): v for k, v in found.items()}, "pilot_steps": args.pilot_steps}
    card = train_stages(cfgs, args.out, reuse_tokenizer=args.tokenizer, device=args.device, stages_dir=args.stages_dir)
    if cfg_note:
        card.update(cfg_note)
        (Path(args.out) / "card.json").write_text(json.dumps(card, indent=2))
    print(json.dumps({"out": args.out, "metrics": card["metrics"], "minutes": card.get("minutes_total", card["minutes"])}))
    return 0
