"""The documents: each step's training batch (task mix, length curriculum), made by producer
processes in the background, and the fixed evaluation documents (seeds from ``EVAL_SEED``)."""

from __future__ import annotations

import hashlib
import os
import random
from queue import Full

import numpy as np
import torch

from core.data import tasks
from core.training.config import TrainConfig
from core.training.supervision import copy_needle, needle_token_mask

EVAL_SEED = 1_000_000  # evaluation seeds start here: never used in training


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
    haystack = (
        "corpus-train"
        if (task in ("passkey", "topic", "multidoc") and rng.random() < cfg.corpus_haystack)
        else "default"
    )
    if task == tasks.LM:  # language modelling: its wide training pool (never the held-out eval pool)
        haystack = "lm-train"
    seed = rng.randrange(EVAL_SEED)
    depth = rng.random()
    last = cfg.last_needle.get(task, 0.0)
    if last and rng.random() < last:  # no extra draw otherwise: old recipes replay
        depth = 1.0
    while True:  # early in the curriculum some tasks cannot fit yet: grow until they do
        try:
            return tasks.make(
                task, tokenizer, n, depth=depth, seed=seed, haystack=haystack, **cfg.task_options.get(task, {})
            )
        except ValueError:
            if n > 4 * cfg.train_length:
                raise
            n = int(n * 1.25) + 8


#: ``prctl`` option (linux/prctl.h): the signal this process gets when the thread that made it dies.
PR_SET_PDEATHSIG = 1
#: Seconds between the portable watchdog's looks at the parent pid (where ``prctl`` is missing).
WATCH_EVERY_S = 0.5


def die_with(parent: int) -> str:
    """Make this process end when ``parent`` (the trainer that started it) dies, by design rather than by polling
    between batches (issue 47, point 6: under load a producer making a large batch outlived its SIGKILLed trainer
    by more than 30 s). Returns how: ``"pdeathsig"`` or ``"watchdog"``.

    On Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the kernel kills this process the moment its parent dies, even
    mid-batch or blocked writing a pipe (nothing of ours runs, nothing needs to: the queue's reader is gone). The
    parent may already have died before the call: the parent pid is checked after it. Elsewhere (or if ``prctl``
    fails), a daemon thread looks at the parent pid every :data:`WATCH_EVERY_S` s and ends the process with
    ``os._exit`` (no exit handlers: they would join the queue's feeder thread, stuck on a full pipe)."""
    import signal
    import sys
    import threading

    how = "watchdog"
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
                how = "pdeathsig"
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # died before the call: nobody will read what this would make
        os._exit(0)
    if how == "watchdog":

        def watch() -> None:
            import time

            while os.getppid() == parent:
                time.sleep(WATCH_EVERY_S)
            os._exit(0)

        threading.Thread(target=watch, name="producer-watchdog", daemon=True).start()
    return how


def _batches(cfg: TrainConfig, tokenizer_dir: str, queue, worker: int, stop, parent: int) -> None:
    """Producer process ``worker`` of ``cfg.workers``: the tokenised batches of steps
    ``worker, worker + workers, ...``. Each step's documents depend only on the
    seed and the step, so the trainer gets the same data whatever the worker count.

    A failure is sent to the trainer as ``("error", message)`` (else the trainer
    would wait forever on the queue), and a producer whose trainer was killed
    ends at once (:func:`die_with`), whatever it is doing, instead of lingering
    as an orphan; the parent-pid checks below are for a trainer that stops it
    normally (``stop``)."""
    die_with(parent)  # first: the kernel ends this process when its trainer dies, whatever it is doing
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
            enc = tok(
                [d.text for d in docs],
                padding=True,
                return_tensors="pt",
                return_offsets_mapping=bool(cfg.needle_attention),
            )
            lab = _labels(tok, docs, cfg.line_answer)
            needle = None
            if cfg.needle_attention:
                needle = needle_targets(cfg, docs, enc.offset_mapping.numpy(), lab.shape[1])
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


def needle_targets(
    cfg: TrainConfig, docs: list[tasks.Document], offsets: np.ndarray, answer_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """What the needle-attention loss asks of one batch: ``(needle, weight)``.

    ``needle`` is ``[B, S]`` (each document's needle span) unless a
    language-modelling document is supervised, then ``[B, T, S]``
    (:func:`core.training.supervision.copy_needle`: each continuation token's
    earlier copy). ``weight`` is the task's ``needle_attention`` weight, 0 for a
    language-modelling document without a copy (nothing to look at). A batch
    without supervised lm documents keeps the ``[B, S]`` form, so the recipes
    trained before copy supervision existed replay exactly."""
    spans = needle_token_mask(offsets, [d.needle_span for d in docs])
    has_copy = [d.task != tasks.LM or bool(d.meta.get("repeat")) for d in docs]
    weight = np.array([cfg.needle_attention.get(d.task, 0.0) * ok for d, ok in zip(docs, has_copy)], dtype=np.float32)
    if cfg.needle_attention.get(tasks.LM, 0.0) and any(d.task == tasks.LM for d in docs):
        return copy_needle(offsets, docs, answer_tokens, spans), weight
    return spans, weight


def _labels(tok, docs: list[tasks.Document], line_answer: str) -> torch.Tensor:
    """The decoder's targets, padding = -100: the answer text of a retrieval document, the continuation's
    ids (no end-of-sequence token: the sequence goes on) of a language-modelling one."""
    if not any(d.task == tasks.LM for d in docs):  # as before LM existed: old recipes replay exactly
        lab = tok([tasks.target(d, line_answer) for d in docs], padding=True, return_tensors="pt").input_ids
        lab[lab == tok.pad_token_id] = -100
        return lab
    rows = [
        tasks.continuation_ids(d) if d.task == tasks.LM else tok(tasks.target(d, line_answer)).input_ids for d in docs
    ]
    lab = torch.full((len(rows), max(map(len, rows))), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        lab[i, : len(r)] = torch.tensor(r)
    return lab


def eval_documents(tokenizer, cfg: TrainConfig, task: str, n_docs: int, length: int) -> list[tasks.Document]:
    """The evaluation documents of one task: fresh seeds (>= EVAL_SEED), half on eval haystacks.

    The same in every process: the depths come from a generator seeded with a
    digest of the task's name (Python's ``hash`` of a str is salted per
    process, which once made every run's evaluation documents differ)."""
    salt = int(hashlib.sha1(task.encode()).hexdigest(), 16) % 1000
    rng = random.Random(EVAL_SEED + salt)
    return [
        tasks.make(
            task,
            tokenizer,
            length,
            depth=rng.random(),
            seed=EVAL_SEED + i,
            haystack="corpus-eval" if (task in ("passkey", "topic", "multidoc") and i % 2) else "default",
            **cfg.task_options.get(task, {}),
        )
        for i in range(n_docs)
    ]
