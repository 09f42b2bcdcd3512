"""What one training run is: :class:`TrainConfig` (sizes, data mix, curriculum, schedule,
supervision, where to start from) and :func:`load_stages`, which reads a config file (one run,
or a list of stages)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from core.data import tasks


@dataclass
class TrainConfig:
    name: str = "retrieval-t5"
    # Defaults = the shipped default model (assets/models/retrieval-t5/train_config.json).
    tasks: dict[str, float] = field(
        default_factory=lambda: {"passkey": 0.3, "line": 0.3, "topic": 0.1, "multidoc": 0.15, "code": 0.15}
    )
    train_length: int = 256
    min_length: int = 40
    curriculum_steps: int = 1500
    first_tasks: dict[str, float] | None = field(
        default_factory=lambda: {"passkey": 1.0}
    )  # the first `first_steps` steps
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
    dropout: float = 0.0  # T5's dropout_rate; the LM model uses some (its corpus is small)
    steps: int = 5000
    # > 0: stop after this many minutes of training (then evaluate and save as usual; the card's
    # steps_done and "stopped" say where). A lent GPU is held for minutes, not hours: a run sized by
    # a guess must still end with weights saved and a card that says how far it got.
    max_minutes: float = 0.0
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
    # "t5" (the retrieval and LM models above) or "rope": a ModernBERT masked-LM encoder trained by
    # core.training.mlm (it reads the sizes, schedule and seed above, and its own options from `mlm`)
    family: str = "t5"
    mlm: dict[str, object] = field(default_factory=dict)  # rope only: core.training.mlm.MLM_DEFAULTS

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


def _check_per_task(name: str, values: dict, what: str, high: float) -> None:
    """A ``{task: number}`` config field: known tasks, numbers in [0, high]; fails before training starts."""
    for task, v in values.items():
        if task not in tasks.GENERATED or isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= high:
            raise ValueError(
                f"{name} wants {{task: {what}}} with tasks from {list(tasks.GENERATED)}, got {task!r}: {v!r}"
            )
