"""A small byte-level BPE tokenizer for the bundled tiny T5 models.

Why this shape:
- Byte-level (GPT-2 style byte alphabet): any Unicode text, emoji and CJK
  included, encodes without unknown tokens and decodes back exactly, which the
  "your own text" view needs.
- Every digit is its own token (``Digits(individual_digits=True)``): copying a
  5-digit key is then a 5-step copy of single tokens, which a tiny model can
  learn; merged digit chunks ("482", "13") would make keys hard to copy and
  length-dependent.
- T5 conventions: ``<pad>`` id 0 (also the decoder start token), ``</s>`` id 1
  appended to every sequence, ``<unk>`` id 2 (never produced for real text).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

__all__ = ["SPECIAL_TOKENS", "train_tokenizer", "training_texts", "wrap"]

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2


def _build_backend() -> Tokenizer:
    """An untrained BPE pipeline: digits split, then byte-level, no prefix space.

    ``add_prefix_space=False`` keeps the text exact (a leading space is
    encoded only when the text has one); the post-processor is a plain
    template, not ByteLevel's, so offsets are never trimmed and cover the
    leading space a token carries (the span of " key" includes its space).
    """
    backend = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


def wrap(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a trained backend for transformers, with the T5 special tokens.

    ``clean_up_tokenization_spaces=False``: the default clean-up rewrites
    " ." to "." on decode and would break exact round trips.
    ``split_special_tokens=True``: a user text that literally contains
    "</s>" is encoded as text (and decodes back), not as end-of-sequence.
    """
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        split_special_tokens=True,
        model_max_length=1_000_000,  # length is the point of this project; never truncate or warn
        padding_side="right",
    )


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE on ``texts`` and return a transformers tokenizer.

    The full byte alphabet is always in the vocabulary (so ``vocab_size`` must
    be at least 3 + 256); ``save_pretrained`` + ``AutoTokenizer.from_pretrained``
    round-trip it.
    """
    minimum = len(SPECIAL_TOKENS) + 256
    if vocab_size < minimum:
        raise ValueError(f"vocab_size must be >= {minimum} (specials + 256 bytes), got {vocab_size}")
    backend = _build_backend()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(iter(texts), trainer=trainer)
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert backend.token_to_id(token) == token_id, "special tokens must have ids 0, 1, 2"
    backend.post_processor = processors.TemplateProcessing(
        single="$A </s>",
        pair="$A </s> $B </s>",
        special_tokens=[("</s>", backend.token_to_id("</s>"))],
    )
    return wrap(backend)


def training_texts(
    docs_per_task: int = 60,
    corpus: bool = True,
    seed: int = 0,
    tokens: int = 384,
) -> Iterator[str]:
    """Texts to train the vocabulary on: the corpus paragraphs plus task documents.

    Why task documents: the vocabulary must cover the words the tasks use
    ("REGISTER_CONTENT", "pass key", "def", invented names), or those would
    be split into many byte tokens and waste context. Documents are made with
    a throwaway byte-level tokenizer (only their length depends on it), at
    several depths and seeds, with both the classic and corpus haystacks.
    """
    from core.data import corpus as corpus_module
    from core.data import tasks

    if corpus:
        yield from corpus_module.paragraphs()
    counter = _ByteCounter()
    for task, i in itertools.product(tasks.TASKS, range(docs_per_task)):
        haystack = ("default", "corpus-train")[i % 2] if task in ("passkey", "topic", "multidoc") else "default"
        doc = tasks.make(
            task,
            counter,
            tokens=tokens,
            depth=(i % 11) / 10,
            seed=seed * 100_003 + i,
            haystack=haystack,
        )
        yield doc.text + " " + doc.expected


class _ByteCounter:
    """Minimal tokenizer stand-in (one token per ~4 characters) for sizing
    training documents before any real tokenizer exists."""

    def __call__(self, text, add_special_tokens: bool = True):  # noqa: ANN001 - duck-typed like HF
        extra = 1 if add_special_tokens else 0
        if isinstance(text, str):
            return {"input_ids": [0] * ((len(text) + 3) // 4 + extra)}
        return {"input_ids": [[0] * ((len(t) + 3) // 4 + extra) for t in text]}
