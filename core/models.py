"""Which models we know, and loading any T5-family model with our attention.

``load(spec)`` accepts a registry name (``flan-t5-base``), a hub id
(``google/flan-t5-base``) or a local folder, loads safetensors only with
``trust_remote_code=False``, and returns a :class:`Loaded` bundle that carries
what the rest of the library needs to know (training length L_tr, heads,
head size, device, dtype, attention mode). Loaded models are cached per
(source, device): Streamlit sessions, the CLI and sweeps share one copy.

Hub ids are looked up in the local Hugging Face cache first (``HF_HUB_CACHE``,
else ``HF_HOME/hub``, read when ``load`` runs) and a complete cached copy is
loaded from its snapshot folder without touching the network. Only when
nothing usable is cached is the hub asked: at once refused when
``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` is set, else after one short
reachability probe (about 1.5 s), so an offline machine says what is missing
right away instead of retrying for half a minute.

Device policy: CUDA with bfloat16 when a GPU is present (T5 overflows to NaN
in float16), otherwise CPU with float32.

What a folder must hold, checked before anything is trusted: ``card.json``
(when present) is validated by :class:`Card` (``train_length`` a whole number
of 2..``MAX_LENGTH`` tokens); tokenizer files (:data:`TOKENIZER_FILES`),
unless ``load(..., tokenizer=NAME|FOLDER)`` names one. Why: without them
transformers builds T5's tokenizer with an empty vocabulary that turns every
word into ``<unk>``, and the model then answers nonsense with no error. A
loaded tokenizer must also encode a plain sentence without ``<unk>`` and fit
the model's vocabulary.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections import OrderedDict
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Strict, ValidationError

from core import attention  # noqa: F401  (registers the "aligned" attention)
from core.errors import ModelLoadError, UserError
from core.validation import Str, TrainLength, one_line, read_json, validate

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "models"
T5_FAMILY = ("t5", "mt5", "umt5")


@dataclass(frozen=True)
class ModelSpec:
    """A model we know: where it comes from and its training length L_tr."""

    name: str
    source: str  # hub id or local folder
    train_length: int
    kind: str  # "flan-t5" | "t5-lm-adapt" | "codet5p" | "bundled" | "custom"
    note: str = ""

    @property
    def bundled(self) -> bool:
        return self.kind == "bundled"


def _hub_specs() -> list[ModelSpec]:
    specs = []
    for size in ("small", "base", "large", "xl", "xxl"):
        specs.append(ModelSpec(f"flan-t5-{size}", f"google/flan-t5-{size}", 512, "flan-t5", "Flan-T5, trained at 512 tokens"))
    for size in ("small", "base", "large", "xl", "xxl"):
        specs.append(ModelSpec(f"t5-v1_1-{size}-lm-adapt", f"google/t5-v1_1-{size}-lm-adapt", 512, "t5-lm-adapt"))
        specs.append(ModelSpec(f"t5-{size}-lm-adapt", f"google/t5-{size}-lm-adapt", 512, "t5-lm-adapt"))
    for size in ("220m", "220m-py", "770m", "770m-py"):
        specs.append(ModelSpec(f"codet5p-{size}", f"Salesforce/codet5p-{size}", 768, "codet5p", "CodeT5+, trained at 768 tokens"))
    return specs


class Card(BaseModel):
    """The fields of a ``card.json`` we rely on (the rest, e.g. training history, is kept but unchecked)."""

    model_config = ConfigDict(extra="allow")
    train_length: TrainLength | None = None
    summary: Str = ""
    default: Annotated[bool, Strict()] = False
    tasks: list[Str] = []  # what it was trained on; ["lm"]: a language model (Loaded.language_model)


def read_card(folder: Path) -> Card | None:
    """The validated ``card.json`` of ``folder``, None when there is none; a bad card is a one-line ModelLoadError."""
    path = Path(folder) / "card.json"
    if not path.exists():
        return None
    try:
        return Card.model_validate(read_json(path, "Model card"))
    except ValidationError as err:
        raise ModelLoadError(f"Model card {path}: {one_line(err)}",
                             app=f"The card.json of model folder '{path.parent.name}' is not valid: {one_line(err)}") from None
    except UserError as err:  # the app's text names the folder, not the server's path to it
        app = str(err).replace(f"Model card {path}", f"The card.json of model folder '{path.parent.name}'")
        raise ModelLoadError(str(err), app=app.replace(str(path), "card.json")) from None


def bundled_specs(root: Path = ASSETS) -> list[ModelSpec]:
    """The models shipped in ``assets/models/<name>/`` (each with a ``card.json``); may be none."""
    out = []
    if root.is_dir():
        for path in sorted(root.glob("*/card.json")):
            card = read_card(path.parent)
            if card is None or card.train_length is None:
                raise ModelLoadError(f"Model card {path} has no train_length",
                                     app=f"The bundled model '{path.parent.name}' has a card.json without train_length")
            out.append(ModelSpec(path.parent.name, str(path.parent), card.train_length, "bundled", card.summary))
    return out


def registry() -> dict[str, ModelSpec]:
    """Every known model by name, bundled ones first; hub ids resolve too (see :func:`resolve`)."""
    specs = bundled_specs() + _hub_specs()
    return {s.name: s for s in specs}


def default_model() -> str | None:
    """The app's and CLI's default: the bundled model whose card says ``"default": true``
    (else the first bundled one), or None when none ship."""
    b = bundled_specs()
    flagged = [s for s in b if read_card(Path(s.source)).default]
    return (flagged or b)[0].name if b else None


def _folder_train_length(path: Path) -> int | None:
    """L_tr from ``card.json`` next to the weights, else the config's ``n_positions``; None if neither says."""
    card = read_card(path)
    if card is not None and card.train_length is not None:
        return card.train_length
    config = path / "config.json"
    if not config.is_file():
        return None
    raw = read_json(config, "Model config")
    lt = raw.get("n_positions") if isinstance(raw, dict) else None
    return None if lt is None else validate(TrainLength, lt, f"Model config {config}: n_positions")


# --- the local Hugging Face cache and the hub --------------------------------

_TRUE = {"1", "ON", "YES", "TRUE"}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache as the environment says *now*.

    Same precedence as ``huggingface_hub.constants`` (``HF_HUB_CACHE``, legacy
    ``HUGGINGFACE_HUB_CACHE``, ``HF_HOME/hub``, ``XDG_CACHE_HOME/huggingface/hub``,
    ``~/.cache/huggingface/hub``), but read at call time: those constants are
    frozen when huggingface_hub is imported.
    """
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        raw = env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]
    else:
        home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
        raw = os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(raw)))


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` asks for no network."""
    return any(os.environ.get(v, "").strip().upper() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def cached_snapshot(repo_id: str, revision: str = "main") -> Path | None:
    """The snapshot folder of ``repo_id`` in the local hub cache when it holds a
    ``config.json`` (``models--org--name/snapshots/<hash>/`` via ``refs/<revision>``), else None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        hit = try_to_load_from_cache(repo_id, "config.json", cache_dir=str(hub_cache_dir()), revision=revision)
    except Exception:  # noqa: BLE001 - a malformed id or unreadable cache simply means "not cached"
        return None
    return Path(hit).parent if isinstance(hit, str) else None


def _has_weights(folder: Path) -> bool:
    return any((folder / f).is_file() for f in WEIGHT_FILES)


def _hub_address() -> tuple[str, int]:
    """Host and port a hub request would connect to first: the HTTPS proxy if one is set, else the endpoint."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    parsed = urllib.parse.urlsplit(endpoint)
    host = parsed.hostname or "huggingface.co"
    port = parsed.port or (80 if parsed.scheme == "http" else 443)
    proxy = urllib.request.getproxies().get(parsed.scheme or "https")
    if proxy and not urllib.request.proxy_bypass(host):
        p = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        if p.hostname:
            return p.hostname, p.port or (443 if p.scheme == "https" else 80)
    return host, port


_REACH: dict[tuple[str, int], tuple[float, bool]] = {}
_REACH_TTL = 30.0


def hub_reachable(timeout: float = 1.5) -> bool:
    """One TCP connect to the hub (or its proxy), bounded by ``timeout`` seconds including DNS.

    The connect runs in a daemon thread so a hanging name lookup cannot hold
    the caller longer than ``timeout``; the answer is remembered for 30 s.
    """
    addr = _hub_address()
    seen = _REACH.get(addr)
    if seen and time.monotonic() - seen[0] < _REACH_TTL:
        return seen[1]
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection(addr, timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    worker = threading.Thread(target=probe, daemon=True, name="hub-probe")
    worker.start()
    worker.join(timeout + 0.2)
    ok = bool(result and result[0])
    _REACH[addr] = (time.monotonic(), ok)
    return ok


#: Where the app's messages send a person to name a model (the sidebar's free-text model box, ui.sidebar.OTHER_HINT).
APP_MODEL_BOX = "the sidebar's '…or a hub id / local folder' box"


def _not_here(repo_id: str, why: str, app_why: str | None = None) -> ModelLoadError:
    short = repo_id.rstrip("/").split("/")[-1]
    return ModelLoadError(
        f"Model '{repo_id}' is not on this machine and {why}: download it where there is internet "
        f"(`hf download {repo_id} --local-dir ./{short}`) and pass that folder (--model ./{short}, or the app's "
        f"'hub id or folder' box), or set HF_HOME to a Hugging Face cache that holds it (looked in {hub_cache_dir()}).",
        app=f"Model '{repo_id}' is not on this machine and {app_why or why}: download it on a machine with internet, "
            f"copy its folder onto this machine and type that folder in {APP_MODEL_BOX}.",
    )


def locate(source: str) -> tuple[str, bool]:
    """Where to load ``source`` from: ``(folder, True)`` for a local folder or a complete
    cached hub snapshot, ``(hub id, False)`` when it must be downloaded and the hub answers.

    Raises :class:`ModelLoadError` at once (no retries) when a hub id has no
    usable local copy and offline mode is on or the hub cannot be reached.
    """
    if Path(source).is_dir():
        return source, True
    snap = cached_snapshot(source)
    if snap is not None and _has_weights(snap):
        return str(snap), True
    partial = f" (the cached copy in {snap} has no {WEIGHT_FILES[0]})" if snap is not None else ""
    if hub_offline():
        flag = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE else "TRANSFORMERS_OFFLINE"
        raise _not_here(source, f"offline mode is on ({flag}){partial}", "the app runs offline")
    if not hub_reachable():
        host = _hub_address()[0]
        raise _not_here(source, f"the Hugging Face hub ({host}) cannot be reached{partial}",
                        f"the Hugging Face hub ({host}) cannot be reached from it")
    return source, False


def resolve(name: str, train_length: int | None = None) -> ModelSpec:
    """Registry name, hub id or local folder -> :class:`ModelSpec`.

    Unknown hub ids and folders get L_tr from ``train_length`` or, failing that,
    from a ``card.json`` next to the weights or the config's
    ``n_positions`` (T5 configs carry 512).
    """
    if not name or not str(name).strip():
        raise ModelLoadError("No model given. Pass a registry name, a hub id or a local folder.",
                             app="No model given: choose one in the sidebar's Model box, or type a hub id or a local "
                                 f"folder in {APP_MODEL_BOX}.")
    name = str(name).strip()
    reg = registry()
    spec = reg.get(name) or next((s for s in reg.values() if s.source == name), None)
    if spec is None:
        path = Path(name).expanduser()
        if path.is_dir():
            spec = ModelSpec(path.name, str(path.resolve()), int(_folder_train_length(path) or 512), "custom")
        elif "/" in name and not name.startswith((".", "/", "~")):
            snap = cached_snapshot(name)
            lt = _folder_train_length(snap) if snap else None
            note = "hub id not in the registry: " + ("L_tr from the cached copy" if lt else "L_tr assumed 512")
            spec = ModelSpec(name, name, int(lt or 512), "custom", note)
        else:
            known = ", ".join(list(reg)[:6])
            raise ModelLoadError(
                f"Unknown model '{name}': not a registry name, not a hub id (owner/name), not a folder. "
                f"Known names include {known}."
            )
    if train_length is not None:
        lt = validate(TrainLength, train_length, "train_length")
        spec = ModelSpec(spec.name, spec.source, lt, spec.kind, spec.note)
    return spec


_DEVICE = re.compile(r"(auto|cpu|cuda(:\d{1,3})?)")


def check_device(requested: str | None) -> str | None:
    """``requested`` if it names a device we run on (auto, cpu, cuda, cuda:N), else a one-line ModelLoadError."""
    if requested in (None, ""):
        return None
    if not isinstance(requested, str) or not _DEVICE.fullmatch(requested.strip().lower()):
        raise ModelLoadError(f"Unknown device {str(requested)[:40]!r}: use cpu, cuda, cuda:N or auto")
    return requested.strip().lower()


#: Precisions a model may run in, by the names users type. float16 is absent on purpose: T5's
#: activations overflow it (NaN after a few layers), which is why a GPU gets bfloat16.
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def check_dtype(requested: str | None) -> torch.dtype | None:
    """The torch dtype ``requested`` names (float32/fp32, bfloat16/bf16, auto), else a one-line ModelLoadError."""
    if requested in (None, "", "auto"):
        return None
    key = str(requested).strip().lower()
    if key in ("float16", "fp16", "half"):
        raise ModelLoadError("float16 is refused: T5 overflows in it (NaN); use bfloat16 or float32")
    if key not in DTYPES:
        raise ModelLoadError(f"Unknown dtype {str(requested)[:40]!r}: use float32, bfloat16 or auto")
    return DTYPES[key]


def pick_device(requested: str | None = None, dtype: str | None = None) -> tuple[torch.device, torch.dtype]:
    """CUDA + bf16 when present (fp16 overflows in T5), else CPU + fp32; ``dtype`` overrides the precision.

    Why an override: bfloat16 keeps 8 bits of mantissa, so a GPU run's Pmax and
    accuracies differ slightly from a CPU run's; float32 on a GPU reproduces
    CPU tables (bench/results.py --dtype float32) at GPU speed."""
    requested = check_device(requested)
    if requested in (None, "auto"):
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(requested)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("CUDA was requested but no GPU is available; use --device cpu",
                             app="CUDA was requested but this machine has no GPU available.")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ModelLoadError(f"There is no GPU {dev.index} (this machine has {torch.cuda.device_count()}); use --device cuda",
                             app=f"There is no GPU {dev.index} (this machine has {torch.cuda.device_count()}).")
    chosen = check_dtype(dtype)
    return dev, chosen or (torch.bfloat16 if dev.type == "cuda" else torch.float32)


@dataclass
class Loaded:
    """A model ready for :func:`core.engine.run`, with what the views need to describe it."""

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
    def n_layers(self) -> int:
        return int(self.config.num_layers)

    @property
    def n_heads(self) -> int:
        return int(self.config.num_heads)

    @property
    def d_kv(self) -> int:
        return int(self.config.d_kv)

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
            "train_length": self.train_length,
            "parameters": self.n_params,
            "layers": self.n_layers,
            "heads": self.n_heads,
            "d_kv": self.d_kv,
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "attention": f"cosine (s={self.cosine_scale:g})" if self.cosine else "dot product",
        }


#: Models kept loaded in the process, least recently used dropped first: a server whose people try many models
#: must not keep every one of them (a Flan-T5-base is 1 GB). The app's own ``st.cache_resource`` holds as many.
MAX_MODELS = 4
_CACHE: "OrderedDict[tuple[str, str, int, str, str], Loaded]" = OrderedDict()
_LOCK = threading.Lock()


def load(name: str | ModelSpec, device: str | None = None, train_length: int | None = None,
         tokenizer: str | None = None, dtype: str | None = None) -> Loaded:
    """Load (once) a T5-family model with the ``aligned`` attention; see the module docstring.

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
        raise ModelLoadError("--tokenizer is empty: name a registry model, a hub id or a folder",
                             app="The tokenizer's name is empty: name a registry model, a hub id or a folder.")
    key = (spec.source, str(dev), spec.train_length, tok_ref, str(precision))
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = _load_uncached(spec, dev, precision, tok_ref or None)
            while len(_CACHE) > MAX_MODELS:
                _CACHE.popitem(last=False)
        _CACHE.move_to_end(key)
        return _CACHE[key]


# --- tokenizers ------------------------------------------------------------------

#: Files one of which a folder's tokenizer needs (ByT5 needs only tokenizer_config.json).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model", "vocab.json", "vocab.txt")
_PROBE = "the pass key is 12345. remember it, then answer the question."


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in TOKENIZER_FILES)


def _tokenizer_source(ref: str) -> tuple[str, dict]:
    """Where ``--tokenizer`` loads from: a folder, a registry model's source, or a (cached or reachable) hub id."""
    path = Path(ref).expanduser()
    if path.is_dir():
        if not _has_tokenizer(path):
            raise ModelLoadError(f"Tokenizer folder '{ref}' has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...)")
        return str(path), {"local_files_only": True}
    spec = registry().get(ref)
    source = spec.source if spec else ref
    if spec is None and ("/" not in ref or ref.startswith((".", "/", "~"))):
        raise ModelLoadError(f"Unknown tokenizer '{ref}': not a folder, a registry name or a hub id (owner/name)")
    where, local = locate(source)
    return where, ({"local_files_only": True} if local else {"cache_dir": str(hub_cache_dir())})


def _shown(src: str) -> str:
    """How the app's messages name a model source: a local folder by its own name (never the server's path to it)."""
    path = Path(src).expanduser()
    return path.name or src if path.is_absolute() or src.startswith((".", "~")) else src


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


def _load_uncached(spec: ModelSpec, dev: torch.device, dtype: torch.dtype, tokenizer: str | None = None) -> Loaded:
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

    src = spec.source
    where, local = locate(src)  # raises at once when a hub id is neither cached nor reachable
    folder = Path(src).is_dir()
    # Hub downloads go to (and cached snapshots come from) the cache the environment names now.
    opts = {"local_files_only": True} if local else {"cache_dir": str(hub_cache_dir())}
    try:
        config = AutoConfig.from_pretrained(where, trust_remote_code=False, **opts)
    except Exception as err:  # noqa: BLE001 - many hub/network error types
        what = "the folder has no usable config.json" if folder else f"its config could not be read ({type(err).__name__})"
        raise ModelLoadError(
            f"Could not load model '{src}': {what}. Download it on a machine with internet "
            f"(e.g. `hf download {src} --local-dir ./{Path(src).name}`) and pass that folder "
            f"(--model ./{Path(src).name}, or the app's 'hub id or folder' box).",
            app=(f"Could not load the model in folder '{_shown(src)}': it has no usable config.json. Type a folder "
                 f"that holds config.json, model.safetensors and the tokenizer files in {APP_MODEL_BOX}, or choose "
                 "a model in the Model box." if folder else
                 f"Could not load model '{src}': {what}. Download it on a machine with internet, copy its folder "
                 f"onto this machine and type that folder in {APP_MODEL_BOX}."),
        ) from None
    if config.model_type not in T5_FAMILY:
        raise ModelLoadError(
            f"'{src}' is a '{config.model_type}' model, not T5-family ({', '.join(T5_FAMILY)}): "
            "the temperature method needs T5's relative-position-bias attention.",
            app=f"'{_shown(src)}' is a '{config.model_type}' model, not T5-family ({', '.join(T5_FAMILY)}): "
                "the temperature method needs T5's relative-position-bias attention.",
        )
    if tokenizer is None and local and not _has_tokenizer(Path(where)):
        raise ModelLoadError(
            f"Model folder '{src}' has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): copy the "
            "model's tokenizer into it, or name one with --tokenizer NAME|FOLDER.",
            app=f"Model folder '{_shown(src)}' has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): copy "
                "the model's tokenizer files into it.",
        )
    tok_where, tok_opts = _tokenizer_source(tokenizer) if tokenizer is not None else (where, opts)
    try:
        model = AutoModelForSeq2SeqLM.from_pretrained(
            where,
            config=config,
            dtype=dtype,
            use_safetensors=True,
            trust_remote_code=False,
            attn_implementation=attention.ATTN_NAME,
            **opts,
        )
        tok = AutoTokenizer.from_pretrained(tok_where, **tok_opts)
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
    model.to(dev).eval()
    return Loaded(spec=spec, model=model, tokenizer=tok, device=dev, dtype=dtype)
