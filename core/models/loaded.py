"""A loaded model and what the engine and the views need to know of it: family, sizes, device, precision."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from core.mechanics import attention
from core.models.catalog import ModelSpec, read_card


@dataclass
class Loaded:
    """A model ready for :func:`core.runs.engine.run`, with what the views need to describe it."""

    spec: ModelSpec
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype

    @property
    def config(self):
        return self.model.config

    @property
    def train_length(self) -> int:
        return self.spec.train_length

    @property
    def family(self) -> str:
        """``"t5"`` (relative bias, encoder-decoder), ``"rope"`` (rotary encoder, masked-LM head) or ``"decoder"``
        (a decoder-only causal LM: Llama, Mistral, Qwen, Gemma 2, Phi-3, gpt-oss): what the engine, the views and
        :mod:`core.experiments.mlm` branch on."""
        return attention.family_of(self.config.model_type) or attention.T5

    @property
    def seq2seq(self) -> bool:
        """Has a decoder that generates answers (T5); a rotary encoder only fills masked tokens."""
        return self.family == attention.T5

    @property
    def decoder_only(self) -> bool:
        """A decoder-only causal LM: one attention, its causal self-attention (:data:`core.kinds.DECODER`), which
        reads the document (the prompt) and generates the answer with a KV cache."""
        return self.family == attention.CAUSAL_LM

    @property
    def encoder(self) -> torch.nn.Module:
        """The module whose forward gives ``last_hidden_state`` of the document: T5's encoder stack, a masked-LM
        model's base model (``get_encoder()`` returns the masked-LM model itself, whose output has no hidden states)."""
        return self.model.get_encoder() if self.seq2seq else self.model.base_model

    @property
    def n_layers(self) -> int:
        return int(self.config.num_layers) if self.seq2seq else int(self.config.num_hidden_layers)

    @property
    def n_heads(self) -> int:
        return int(self.config.num_heads) if self.seq2seq else int(self.config.num_attention_heads)

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads: fewer than :attr:`n_heads` on a grouped-query decoder (SmolLM2: 3 for 9), else as many."""
        if self.decoder_only:
            return int(getattr(self.config, "num_key_value_heads", None) or self.n_heads)
        return self.n_heads

    @property
    def d_kv(self) -> int:
        """Head dimension (InfoScale's d): T5's ``d_kv``; ModernBERT's ``hidden_size / heads``, as its attention uses;
        a decoder-only model's ``head_dim`` when its config has one, else ``hidden_size / heads``."""
        if self.decoder_only and getattr(self.config, "head_dim", None):
            return int(self.config.head_dim)
        return int(self.config.d_kv) if self.seq2seq else int(self.config.hidden_size) // self.n_heads

    @property
    def cosine(self) -> bool:
        return bool(getattr(self.config, "cosine_attention", False))

    @property
    def cosine_scale(self) -> float | None:
        return float(self.config.cosine_scale) if self.cosine else None

    @property
    def language_model(self) -> bool:
        """Trained to continue text (an LM-adapted T5, or a card whose only task is "lm"): its document is an
        LM sequence and its score a perplexity, where a retrieval model's is an answer."""
        if self.spec.kind == "t5-lm-adapt":
            return True
        if not self.seq2seq:  # a masked-LM encoder continues nothing
            return False
        folder = Path(self.spec.source)
        card = read_card(folder) if self.spec.source and folder.is_dir() else None
        return card is not None and card.tasks == ["lm"]

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def describe(self) -> dict:
        """Plain facts for the sidebar and ``--json`` output."""
        return {
            "name": self.spec.name,
            "source": self.spec.source,
            "family": self.family,
            "train_length": self.train_length,
            "parameters": self.n_params,
            "layers": self.n_layers,
            "heads": self.n_heads,
            **({"kv_heads": self.n_kv_heads} if self.decoder_only else {}),
            "d_kv": self.d_kv,
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "attention": f"cosine (s={self.cosine_scale:g})" if self.cosine else "dot product",
        }
