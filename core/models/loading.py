"""``load(name | hub id | folder) -> Loaded``: a T5-family or rotary (ModernBERT) model with our attention,
loaded once per process and kept in a bounded cache.

``load(spec)`` accepts a registry name (``flan-t5-base``), a hub id
(``google/flan-t5-base``) or a local folder, loads safetensors only with
``trust_remote_code=False``, and returns a :class:`~core.models.loaded.Loaded` bundle that carries
what the rest of the library needs to know (training length L_tr, heads,
head size, device, dtype, attention mode). Loaded models are cached per
(source, device, L_tr, tokenizer, dtype): Streamlit sessions, the CLI and sweeps share one copy.
The order of a load: the name becomes a spec (:mod:`core.models.catalog`), the device
and precision are chosen (:mod:`core.models.device`), a hub id's files are fetched with no
lock held (:mod:`core.models.hub`), then, under that model's own lock, every file is checked
before it is trusted (:mod:`core.models.safety`) and the model is read with ``local_files_only``.
transformers' own multi-line load report never reaches stderr: the checks say the same in one line.

Two families (:data:`core.mechanics.attention.FAMILIES`): T5's encoder-decoder with a learned relative
bias (``AutoModelForSeq2SeqLM``), and bidirectional rotary encoders with a masked-LM head
(``model_type`` ``modernbert``, ``AutoModelForMaskedLM``; ``Loaded.family`` "rope"). Why
ModernBERT among transformers' rotary encoders: its attention goes through ``AttentionInterface``
(RoFormer computes its softmax inline and cannot be handed our attention), keys have as many heads
as queries (EuroBERT's grouped keys would need repeating first), it has a masked-LM head, and its
config holds transformers' ``rope_parameters``, where position schemes (PI, NTK, YaRN) live. Both
families pass the same checks: safetensors only, the config against the weights, the tokenizer
(a rotary encoder's must also have a mask token). A third, decoder-only causal LMs (``model_type`` ``llama``,
``mistral``, ``qwen2``, ``qwen3``, ``gemma2``, ``phi3``, ``gpt_oss``: ``AutoModelForCausalLM``, ``Loaded.family``
"decoder"), passes the same checks (their ``model.layers.N`` stack, query heads in whole key/value groups).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

import torch

from core.errors import ModelLoadError, UserError
from core.mechanics import (
    attention,  # (importing it registers the "aligned" attention)
    patches,
)
from core.models import install
from core.models.catalog import ROPE_FAMILY, T5_FAMILY, ModelSpec, registry, resolve
from core.models.device import pick_device
from core.models.hub import local_copy
from core.models.loaded import Loaded
from core.models.names import APP_MODEL_BOX, _is_dir, _short, _shown, is_hub_id
from core.models.safety import (
    _LAYOUT,
    TOKENIZER_FILES,
    _check_loading_info,
    _check_tokenizer,
    _has_tokenizer,
    check_config_matches,
    check_weight_files,
)

#: Models kept loaded in the process, least recently used dropped first: a server whose people try many models
#: must not keep every one of them (a Flan-T5-base is 1 GB). The app's own ``st.cache_resource`` holds as many.
MAX_MODELS = 4
_CACHE: "OrderedDict[tuple[str, str, int, str, str], Loaded]" = OrderedDict()
#: Guards ``_CACHE`` and ``_KEY_LOCKS``; held only for a dict operation, never across a load or a network wait
#: (hub downloads have their own lock, :data:`core.models.hub._LOCK`, held as briefly).
_LOCK = threading.Lock()
#: One lock per model being loaded (cache key -> [lock, users]): two sessions opening the same model load it once,
#: while loads of other models go on. Dropped when its last user leaves, so the dict stays as small as the loads.
_KEY_LOCKS: dict[tuple, list] = {}


@contextmanager
def _model_lock(key: tuple):
    """Hold the lock of one model's load (see ``_KEY_LOCKS``)."""
    with _LOCK:
        entry = _KEY_LOCKS.setdefault(key, [threading.Lock(), 0])
        entry[1] += 1
    try:
        with entry[0]:
            yield
    finally:
        with _LOCK:
            entry[1] -= 1
            if entry[1] == 0 and _KEY_LOCKS.get(key) is entry:
                del _KEY_LOCKS[key]


def _cached(key: tuple) -> Loaded | None:
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
        return hit


def load(
    name: str | ModelSpec,
    device: str | None = None,
    train_length: int | None = None,
    tokenizer: str | None = None,
    dtype: str | None = None,
) -> Loaded:
    """Load (once) a T5-family or rotary masked-LM model with the ``aligned`` attention; see the module docstring.

    ``tokenizer``: a registry name, hub id or folder whose tokenizer to use
    instead of the model folder's own (needed when the folder has none).
    ``dtype``: float32 or bfloat16 instead of the device's default (see :func:`pick_device`).
    """
    spec = name if isinstance(name, ModelSpec) else resolve(name, train_length)
    if isinstance(name, ModelSpec) and train_length is not None:
        spec = resolve(spec.source, train_length)
    dev, precision = pick_device(device, dtype)
    tok_ref = str(tokenizer).strip() if tokenizer is not None else ""
    if tokenizer is not None and not tok_ref:
        raise ModelLoadError(
            "--tokenizer is empty: name a registry model, a hub id or a folder",
            app="The tokenizer's name is empty: name a registry model, a hub id or a folder.",
        )
    key = (spec.source, str(dev), spec.train_length, tok_ref, str(precision))
    hit = _cached(key)
    if hit is not None:
        return hit
    if spec.kind == "fetched":  # installed from the package index: every file against its card, else one line
        install.verify(spec.name, Path(spec.source))  # (not installed: how to fetch it; nothing is downloaded here)
    # Network first, with no lock held (each wait bounded: see fetch); then this model's lock for the local load.
    where = local_copy(spec.source)
    tok_where = _tokenizer_source(tok_ref)[0] if tok_ref else None
    with _model_lock(key):
        hit = _cached(key)
        if hit is not None:
            return hit
        loaded = _load_uncached(spec, dev, precision, tok_ref or None, where=where, tok_where=tok_where)
        with _LOCK:
            _CACHE[key] = loaded
            while len(_CACHE) > MAX_MODELS:
                _CACHE.popitem(last=False)
        return loaded


class _QuietLoadReport(logging.Filter):
    """Keeps transformers' multi-line LOAD REPORT off stderr for the loads this module runs (their threads are in
    ``threads``): :func:`_check_loading_info` says the same in one line. Other code's loads keep their report."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.thread in self.threads and "LOAD REPORT" in str(record.msg))


_QUIET = _QuietLoadReport()
logging.getLogger("transformers.modeling_utils").addFilter(_QUIET)


@contextmanager
def _quiet_load_report():
    me = threading.get_ident()
    _QUIET.threads.add(me)
    try:
        yield
    finally:
        _QUIET.threads.discard(me)


def _tokenizer_source(ref: str) -> tuple[str, dict]:
    """Where ``--tokenizer`` loads from: a folder, a registry model's source, or a (cached or reachable) hub id."""
    path = Path(ref).expanduser()
    if _is_dir(path):
        if not _has_tokenizer(path):
            raise ModelLoadError(
                f"Tokenizer folder '{ref}' has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...)"
            )
        return str(path), {"local_files_only": True}
    spec = registry().get(ref)
    source = spec.source if spec else ref
    if spec is None and not is_hub_id(ref):
        raise ModelLoadError(
            f"Unknown tokenizer '{_short(ref)}': not a folder, a registry name or a hub id (owner/name)"
        )
    return local_copy(source), {"local_files_only": True}  # a hub id is downloaded first, bounded (see fetch)


def _load_uncached(
    spec: ModelSpec,
    dev: torch.device,
    dtype: torch.dtype,
    tokenizer: str | None = None,
    *,
    where: str | None = None,
    tok_where: str | None = None,
) -> Loaded:
    """Load ``spec`` from the local folder ``where`` (its :func:`local_copy`; fetched here when not given).

    Nothing here touches the network: a hub id was downloaded (bounded) before,
    so every read is ``local_files_only`` and no lock is held across a network wait.
    """
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    src = spec.source
    where = where or local_copy(src)  # raises at once when a hub id is neither cached nor reachable
    folder = _is_dir(src)
    opts = {"local_files_only": True}
    try:
        config = AutoConfig.from_pretrained(where, trust_remote_code=False, **opts)
    except Exception as err:  # noqa: BLE001 - many hub/network error types
        what = (
            "the folder has no usable config.json" if folder else f"its config could not be read ({type(err).__name__})"
        )
        raise ModelLoadError(
            f"Could not load model '{src}': {what}. Download it on a machine with internet "
            f"(e.g. `hf download {src} --local-dir ./{Path(src).name}`) and pass that folder "
            f"(--model ./{Path(src).name}, or the app's 'hub id or folder' box).",
            app=(
                f"Could not load the model in folder '{_shown(src)}': it has no usable config.json. Type a folder "
                f"that holds config.json, model.safetensors and the tokenizer files in {APP_MODEL_BOX}, or choose "
                "a model in the Model box."
                if folder
                else f"Could not load model '{src}': {what}. Download it on a machine with internet, copy its folder "
                f"onto this machine and type that folder in {APP_MODEL_BOX}."
            ),
        ) from None
    family = attention.family_of(config.model_type)
    if family is not None and family not in _LAYOUT:  # a family our attention serves, not yet one the loader reads
        why = (
            "a decoder-only model: its attention runs through ours (core.runs.apply puts a tau on it), but "
            "loading one here (tasks, views, probes on a decoder) is not there yet"
        )
        raise ModelLoadError(
            f"'{src}' is a '{config.model_type}' model, {why}.",
            app=f"'{_shown(src)}' is a '{config.model_type}' model, {why}.",
        )
    if family is None:
        why = (
            f"not T5-family ({', '.join(T5_FAMILY)}), a rotary masked-LM encoder ({', '.join(ROPE_FAMILY)}) nor a "
            f"decoder-only LM ({', '.join(attention.FAMILIES[attention.CAUSAL_LM])}): "
            "the temperature method needs an attention that runs through ours"
        )
        raise ModelLoadError(
            f"'{src}' is a '{config.model_type}' model, {why}.",
            app=f"'{_shown(src)}' is a '{config.model_type}' model, {why}.",
        )
    if tokenizer is None and not _has_tokenizer(Path(where)):
        raise ModelLoadError(
            f"Model folder '{src}' has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): copy the "
            "model's tokenizer into it, or name one with --tokenizer NAME|FOLDER.",
            app=f"Model folder '{_shown(src)}' has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): copy "
            "the model's tokenizer files into it.",
        )
    if tok_where is None:
        tok_where = _tokenizer_source(tokenizer)[0] if tokenizer is not None else where
    shapes = check_weight_files(where, src)  # before any weight is read: safetensors only, whatever an index says
    check_config_matches(config, shapes, src)
    try:
        with _quiet_load_report():
            model, info = getattr(transformers, _LAYOUT[family][2]).from_pretrained(
                where,
                config=config,
                dtype=dtype,
                use_safetensors=True,
                trust_remote_code=False,
                attn_implementation=attention.ATTN_NAME,
                output_loading_info=True,
                ignore_mismatched_sizes=True,  # reported by _check_loading_info in one line, not raised after a report
                **opts,
            )
        _check_loading_info(info, src)
        tok = AutoTokenizer.from_pretrained(tok_where, **opts)
    except ModelLoadError:
        raise
    except Exception as err:  # noqa: BLE001
        first = (str(err).splitlines() or [""])[0][:200]
        raise ModelLoadError(
            f"Could not load the weights or tokenizer of '{src}' ({type(err).__name__}: {first}). "
            "Only safetensors weights are accepted; pass a local folder holding config.json, model.safetensors and tokenizer files.",
            app=f"Could not load the weights or tokenizer of '{_shown(src)}' ({type(err).__name__}). Only safetensors "
            f"weights are accepted: type a folder holding config.json, model.safetensors and the tokenizer files "
            f"in {APP_MODEL_BOX}.",
        ) from None
    _check_tokenizer(tok, tokenizer or src, int(config.vocab_size))
    if family == attention.ROPE and getattr(tok, "mask_token_id", None) is None:
        raise ModelLoadError(
            f"The tokenizer of '{src}' has no mask token: a masked-LM encoder is read by filling masked tokens. "
            "Copy the model's own tokenizer files into the folder, or name one with --tokenizer NAME|FOLDER.",
            app=f"The tokenizer of model '{_shown(src)}' has no mask token: copy the model's own tokenizer files "
            "into its folder.",
        )
    model.to(dev).eval()
    if family == attention.ROPE:  # a rotary config its own attention cannot apply: one line, before any pass
        from core.values import positions

        try:
            positions.check_rotation(model.config, positions.rotary_frequency_counts(model))
        except ModelLoadError:
            raise
        except UserError as err:
            raise ModelLoadError(f"Model '{src}': {err}", app=f"Model '{_shown(src)}': {err}") from None
    # Every patch of the model, in one place (core.mechanics.patches): T5's bias as one vector per head (no
    # [H, L, L] per pass); a rotary model's rotary modules reading the pass's position scheme from the call.
    patches.patch(model, rotary=attention.current_positions if family == attention.ROPE else None)
    if not attention.served_by_us(model):
        import transformers as _t

        raise ModelLoadError(
            f"transformers {_t.__version__} runs the attention of '{src}' ({type(model).__name__}) without this "
            "tool's attention function, so tau would change nothing; install the transformers range in "
            "requirements.txt (tested: 5.17 and 5.24).",
            app=f"This installation's transformers ({_t.__version__}) runs the model's attention without the app's "
            "attention function, so tau would change nothing: install the transformers version in "
            "requirements.txt.",
        )
    return Loaded(spec=spec, model=model, tokenizer=tok, device=dev, dtype=dtype)
