"""What a model folder must hold, checked before anything in it is trusted: safetensors only (no pickle is
ever unpickled), a config that matches the weights, and a tokenizer that serves the model.

No pickle is ever unpickled: before anything is read, :func:`check_weight_files`
works out which weight files transformers would open (an index's shards, a
config's ``transformers_weights``, a distributed-checkpoint layout) and refuses
the folder unless every one is a plain file name ending in ``.safetensors``
whose header parses as safetensors. A ``pytorch_model.bin``, ``.pt``, ``.ckpt``,
``.pth``, ``.msgpack`` or ``.h5`` is never opened, whatever an index says.

The config must match the weights: layer and head counts and sizes are whole
numbers of at least 1, the encoder and decoder hold as many blocks as the config
declares, every tensor has the shape the config gives it, and none is missing or
unexpected. A mismatch is one line, checked on the safetensors headers and an
empty (meta-device) model before any memory is spent (:func:`check_config_matches`,
then :func:`_check_loading_info` on what transformers reports).

A folder also needs tokenizer files (:data:`TOKENIZER_FILES`), unless the load
names another tokenizer. Why: without them transformers builds T5's tokenizer
with an empty vocabulary that turns every word into ``<unk>``, and the model
then answers nonsense with no error. A loaded tokenizer must also encode a plain
sentence without ``<unk>`` and fit the model's vocabulary (:func:`_check_tokenizer`).
"""

from __future__ import annotations

import copy
import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import torch

from core.errors import ModelLoadError, UserError
from core.mechanics import attention
from core.models.names import _short, _shown
from core.values.validation import read_json

#: The weight files a folder is loaded from, one of them at least (an index names its shards).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
#: Files one of which a folder's tokenizer needs (ByT5 needs only tokenizer_config.json).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
)

#: Weight formats transformers or torch can read that are not safetensors (pickles above all): never opened.
NOT_SAFETENSORS = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".msgpack", ".h5", ".gguf", ".npz", ".joblib")
#: transformers' distributed-checkpoint layout: when one file matches, it reads every ``*.safetensors`` in the folder.
_DISTRIBUTED = re.compile(r"shard-[0-9]{5}-model-[0-9]{5}-of-[0-9]{5}\.safetensors")
#: The largest safetensors header read (the format's own limit): a bigger one is not a safetensors file.
_MAX_HEADER = 100_000_000


def _refuse(src: str, why: str, app_why: str | None = None) -> ModelLoadError:
    return ModelLoadError(
        f"Model folder '{src}' {why}. Only safetensors weights are loaded (no pickle is ever read).",
        app=f"Model folder '{_shown(src)}' {app_why or why}. Only safetensors weights are loaded.",
    )


def _plain_safetensors_name(name: object, index: bool = False) -> bool:
    """A bare file name (no folder part, no ``..``) ending in ``.safetensors`` (or ``.safetensors.index.json``)."""
    ends = (".safetensors", ".safetensors.index.json") if index else (".safetensors",)
    return (
        isinstance(name, str)
        and name.endswith(ends)
        and "/" not in name
        and "\\" not in name
        and name not in (".", "..")
        and "\x00" not in name
    )


def _read_index(path: Path, folder: Path, src: str) -> list[str]:
    """The shard names of a safetensors index, each a plain ``*.safetensors`` name (else a one-line refusal)."""
    try:
        raw = read_json(path, "Weight index")
    except UserError as err:
        raise _refuse(
            src,
            f"has an unreadable {path.name} ({str(err).split(': ', 1)[-1][:120]})",
            f"has an unreadable {path.name}",
        ) from None
    wmap = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise _refuse(src, f"has a {path.name} without a weight_map")
    bad = [v for v in wmap.values() if not _plain_safetensors_name(v)]
    if bad:
        bad = bad[0]
        raise _refuse(
            src,
            f"has a {path.name} that points at {_short(str(bad))!r}, which is not a "
            "safetensors file in the folder; it is not opened",
        )
    return sorted(set(wmap.values()))


def _safetensors_header(path: Path, folder: Path, src: str) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors file's header (8-byte length, then JSON; no tensor data is read).

    Refuses, in one line, a file that is not safetensors whatever its name says.
    """
    not_it = _refuse(src, f"has a {path.name} that is not a safetensors file")
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            size = os.fstat(f.fileno()).st_size
            if len(head) < 8:
                raise not_it
            (n,) = struct.unpack("<Q", head)
            if n < 2 or n > min(_MAX_HEADER, size - 8):
                raise not_it
            raw = json.loads(f.read(n).decode("utf-8"))
    except OSError as err:
        raise _refuse(src, f"has a {path.name} that cannot be read ({err.strerror or type(err).__name__})") from None
    except (ValueError, RecursionError):  # JSON or UTF-8
        raise not_it from None
    if not isinstance(raw, dict):
        raise not_it
    shapes = {}
    for name, meta in raw.items():
        if name == "__metadata__":
            continue
        shape = meta.get("shape") if isinstance(meta, dict) else None
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise not_it
        shapes[name] = tuple(shape)
    return shapes


def check_weight_files(folder: str | Path, src: str | None = None) -> dict[str, tuple[int, ...]]:
    """The tensors (name -> shape) of the weight files transformers would read from ``folder``, each checked to be
    safetensors before anything else is read; a one-line :class:`ModelLoadError` otherwise.

    Why ours and not transformers' choice: with ``use_safetensors=True`` it still
    opens whatever a ``model.safetensors.index.json`` (or a config's
    ``transformers_weights``) names, and anything not ending in ``.safetensors``
    goes to ``torch.load``, a pickle. The files are picked as transformers 5
    picks them (a distributed-checkpoint layout first, then ``transformers_weights``,
    ``model.safetensors``, ``model.safetensors.index.json``); every safetensors
    index present must name only safetensors files; each file read must parse
    as safetensors. Pickles beside safetensors weights (a full ``hf download``)
    are left alone: they are never opened.
    """
    folder = Path(folder)
    src = src or str(folder)
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError as err:
        raise _refuse(src, f"cannot be listed ({err.strerror or type(err).__name__})") from None
    for name in names:
        if name.endswith(".safetensors.index.json"):
            _read_index(folder / name, folder, src)
    explicit = None
    if "config.json" in names:
        try:
            raw = read_json(folder / "config.json", "Model config")
        except UserError:
            raw = None  # AutoConfig says what is wrong with it, in its own line
        explicit = raw.get("transformers_weights") if isinstance(raw, dict) else None
    if any(_DISTRIBUTED.fullmatch(n) for n in names):
        files = [n for n in names if n.endswith(".safetensors")]
    elif explicit is not None:
        if not _plain_safetensors_name(explicit, index=True) or not (folder / explicit).is_file():
            raise _refuse(
                src,
                f"has a config.json whose transformers_weights names {_short(str(explicit))!r}, "
                "which is not a safetensors file in the folder; it is not opened",
            )
        files = _read_index(folder / explicit, folder, src) if explicit.endswith(".json") else [explicit]
    elif "model.safetensors" in names:
        files = ["model.safetensors"]
    elif "model.safetensors.index.json" in names:
        files = _read_index(folder / "model.safetensors.index.json", folder, src)
    else:
        pickles = [n for n in names if n.endswith(NOT_SAFETENSORS)]
        seen = f" (its {', '.join(pickles[:3])} {'is' if len(pickles) == 1 else 'are'} never opened)" if pickles else ""
        raise _refuse(src, f"has no {WEIGHT_FILES[0]} or {WEIGHT_FILES[1]}{seen}")
    shapes: dict[str, tuple[int, ...]] = {}
    for name in files:
        if not (folder / name).is_file():
            raise _refuse(src, f"lacks the weight file {_short(name)!r} that its index names")
        shapes.update(_safetensors_header(folder / name, folder, src))
    return shapes


#: Config fields that count or size something: a whole number of at least 1 each (0 layers ends in IndexError).
_POSITIVE_FIELDS = (
    "num_layers",
    "num_decoder_layers",
    "num_heads",
    "d_model",
    "d_kv",
    "d_ff",
    "vocab_size",
    "relative_attention_num_buckets",
    "relative_attention_max_distance",
)
#: The same for a rotary encoder (ModernBERT's names).
_ROPE_POSITIVE_FIELDS = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")
#: The same for a decoder-only causal LM (Llama's names; ``num_key_value_heads`` may be absent: as many as queries).
_DECODER_POSITIVE_FIELDS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
)
#: Fields that may be absent (None): the declared decoder depth of T5 (its encoder's), a decoder-only model's
#: key/value heads (its query heads), its head size (hidden size / heads).
_OPTIONAL_FIELDS = ("num_decoder_layers", "num_key_value_heads", "head_dim")
#: Per family: the positive fields, the stacks as (weight-name prefix, layer-count field), the auto class.
_LAYOUT = {
    attention.T5: (
        _POSITIVE_FIELDS,
        (("encoder.block", "num_layers"), ("decoder.block", "num_decoder_layers")),
        "AutoModelForSeq2SeqLM",
    ),
    attention.ROPE: (_ROPE_POSITIVE_FIELDS, (("model.layers", "num_hidden_layers"),), "AutoModelForMaskedLM"),
    attention.CAUSAL_LM: (_DECODER_POSITIVE_FIELDS, (("model.layers", "num_hidden_layers"),), "AutoModelForCausalLM"),
}


def _blocks(shapes: dict[str, tuple[int, ...]], stack: str) -> set[int]:
    """The layer numbers stored under ``stack`` (a weight-name prefix: ``encoder.block``, ``model.layers``)."""
    found = set()
    for name in shapes:
        m = re.match(rf"{re.escape(stack)}\.(\d+)\.", name)
        if m:
            found.add(int(m.group(1)))
    return found


def check_config_matches(config: Any, shapes: dict[str, tuple[int, ...]], src: str) -> None:
    """Refuse, in one line and before any memory is spent, a config that the weights do not fit.

    The sizes must be whole numbers of at least 1; the encoder and decoder must
    hold blocks 0..N-1 for the N the config declares (a fourth declared layer
    over three stored would run with random weights); and every stored tensor
    must have the shape the config gives it (checked on an empty meta-device
    model, so a huge ``d_ff`` allocates nothing). Family-aware (:data:`_LAYOUT`):
    a rotary encoder's fields and ``model.layers.N`` stack are checked the same way,
    and its hidden size must split evenly into heads; a decoder-only causal LM's likewise (``model.layers.N``), its
    query heads into whole groups of key/value heads.
    """
    import transformers

    family = attention.family_of(getattr(config, "model_type", None)) or attention.T5
    positive, stacks, auto = _LAYOUT[family]

    def refuse(why: str) -> ModelLoadError:
        return ModelLoadError(
            f"The config.json of '{src}' does not match its weights: {why}.",
            app=f"The config.json of model '{_shown(src)}' does not match its weights: {why}.",
        )

    for field in positive + (("head_dim",) if family == attention.CAUSAL_LM else ()):
        value = getattr(config, field, None)
        if value is None and field in _OPTIONAL_FIELDS:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise refuse(f"{field} is {_short(repr(value))}, where a whole number of at least 1 is needed")
    if family == attention.ROPE and config.hidden_size % config.num_attention_heads:
        raise refuse(f"hidden_size {config.hidden_size} does not split into {config.num_attention_heads} heads")
    if family == attention.CAUSAL_LM:  # grouped-query attention: each key/value head serves a whole group of queries
        heads, kv = (
            config.num_attention_heads,
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        )
        if heads % kv:
            raise refuse(f"num_attention_heads {heads} does not split into {kv} key/value groups (num_key_value_heads)")
        if getattr(config, "head_dim", None) is None and config.hidden_size % heads:
            raise refuse(f"hidden_size {config.hidden_size} does not split into {heads} heads")
    for prefix, field in stacks:
        stack = (
            prefix.split(".")[0]
            if family == attention.T5
            else "decoder"
            if family == attention.CAUSAL_LM
            else "encoder"
        )
        declared = int(getattr(config, field) or getattr(config, stacks[0][1]))
        stored = _blocks(shapes, prefix)
        if stored != set(range(declared)):
            raise refuse(f"it declares {declared} {stack} layers ({field}) and the weights hold {len(stored)}")
    try:
        with torch.device("meta"):  # a copy: building may set attributes (the attention) on the config it is given
            skeleton = getattr(transformers, auto).from_config(copy.deepcopy(config))
    except Exception as err:  # noqa: BLE001 - whatever a config transformers cannot build raises
        raise refuse(
            f"no model can be built from it ({type(err).__name__}: {(str(err).splitlines() or [''])[0][:120]})"
        ) from None
    wanted = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    for name in sorted(shapes):
        if name in wanted and wanted[name] != shapes[name]:
            raise refuse(f"{name} is {list(shapes[name])} in the weights and {list(wanted[name])} by the config")


def _check_loading_info(info: dict, src: str) -> None:
    """What transformers found on loading (after its own tied and ignored weights): nothing missing, unexpected,
    mismatched or in error, else one line (a missing weight would run with random values)."""
    parts = []
    for key, label in (
        ("missing_keys", "missing"),
        ("unexpected_keys", "unexpected"),
        ("mismatched_keys", "of the wrong shape"),
        ("error_msgs", "in error"),
    ):
        items = sorted(str(k) for k in (info.get(key) or ()))
        if items:
            more = f" and {len(items) - 2} more" if len(items) > 2 else ""
            parts.append(f"{len(items)} {label} ({', '.join(_short(i) for i in items[:2])}{more})")
    if parts:
        why = "weights " + "; ".join(parts)
        raise ModelLoadError(
            f"The weights of '{src}' do not match its config.json: {why}.",
            app=f"The weights of model '{_shown(src)}' do not match its config.json: {why}.",
        )


def _has_weights(folder: Path) -> bool:
    return any((folder / f).is_file() for f in WEIGHT_FILES)


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in TOKENIZER_FILES)


#: A plain sentence a model's tokenizer must encode into known words.
_PROBE = "the pass key is 12345. remember it, then answer the question."


def _check_tokenizer(tokenizer: Any, src: str, vocab_size: int) -> None:
    """Refuse a tokenizer that cannot serve this model: no words (all ``<unk>``), or ids past its embedding."""
    ids = tokenizer(_PROBE, add_special_tokens=False)["input_ids"]
    unk = getattr(tokenizer, "unk_token_id", None)
    if not ids or (unk is not None and 4 * sum(i == unk for i in ids) >= len(ids)):
        raise ModelLoadError(
            f"The tokenizer of '{src}' does not know plain English words (they become <unk>): its vocabulary is "
            "missing or empty. Copy the model's tokenizer files into the folder, or name one with --tokenizer NAME|FOLDER.",
            app=f"The tokenizer of model '{_shown(src)}' does not know plain English words (they become <unk>): its "
            "vocabulary is missing or empty. Copy the model's tokenizer files into its folder.",
        )
    size = int(getattr(tokenizer, "vocab_size", None) or len(tokenizer))  # base vocabulary, without added specials
    if size > vocab_size or max(ids) >= vocab_size:
        raise ModelLoadError(
            f"The tokenizer for '{src}' has {size:,} tokens but the model's vocabulary has only "
            f"{vocab_size:,}: it belongs to another model. Name the right one with --tokenizer NAME|FOLDER.",
            app=f"The tokenizer of model '{_shown(src)}' has {size:,} tokens but the model's vocabulary has only "
            f"{vocab_size:,}: it belongs to another model. Copy the model's own tokenizer files into its folder.",
        )
