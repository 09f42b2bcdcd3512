"""Which models we know, and loading any T5-family or rotary (ModernBERT) model with our attention.

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

Every network wait is bounded, and no lock is held across one. The probe's
connect waits at most 1.5 s; a download then runs in a worker thread that the
loader watches, and when the hub sends nothing for :data:`HUB_WAIT_S` (20 s)
the load stops with one line naming the host (a server that accepts and never
answers would otherwise hold the caller for minutes: huggingface_hub reads the
repo's metadata with no timeout and retries the rest). The download happens
before any lock is taken, and one download of a repo is shared by every load
that needs it; the local load that follows holds only that model's own lock, so
a stalled hub never delays a session that opens a folder or the bundled model.
Only the files a load reads are downloaded: config, card, tokenizer and
safetensors files, never a pickle.

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
empty (meta-device) model before any memory is spent; transformers' own
multi-line load report never reaches stderr.

Two families (:data:`core.attention.FAMILIES`): T5's encoder-decoder with a learned relative
bias (``AutoModelForSeq2SeqLM``), and bidirectional rotary encoders with a masked-LM head
(``model_type`` ``modernbert``, ``AutoModelForMaskedLM``; ``Loaded.family`` "rope"). Why
ModernBERT among transformers' rotary encoders: its attention goes through ``AttentionInterface``
(RoFormer computes its softmax inline and cannot be handed our attention), keys have as many heads
as queries (EuroBERT's grouped keys would need repeating first), it has a masked-LM head, and its
config holds transformers' ``rope_parameters``, where position schemes (PI, NTK, YaRN) live. Both
families pass the same checks: safetensors only, the config against the weights, the tokenizer
(a rotary encoder's must also have a mask token).

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

import copy
import json
import logging
import os
import re
import socket
import struct
import threading
from collections import OrderedDict
from contextlib import contextmanager
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Strict, ValidationError

from core import attention  # noqa: F401  (registers the "aligned" attention)
from core import relative_bias
from core.errors import ModelLoadError, UserError
from core.validation import Str, TrainLength, one_line, read_json, validate

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "models"
T5_FAMILY = attention.FAMILIES[attention.T5]
ROPE_FAMILY = attention.FAMILIES[attention.ROPE]


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
    if lt is None and isinstance(raw, dict) and raw.get("model_type") in ROPE_FAMILY:
        # a rotary encoder's positions are not learned: the longest it was trained at is its max_position_embeddings
        lt = raw.get("max_position_embeddings")
        return None if lt is None else validate(TrainLength, lt, f"Model config {config}: max_position_embeddings")
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


def _is_dir(path: str | Path) -> bool:
    """``path`` (``~`` expanded) is a folder; False for a name the OS cannot even look up.

    Why not ``Path.is_dir``: it raises OSError for a name over the system's limit
    (ENAMETOOLONG, 255 bytes a component) and ValueError for a NUL, and a model
    name typed in the app's box or ``?model=`` may be either.
    """
    try:
        return Path(path).expanduser().is_dir()
    except (OSError, ValueError):
        return False


#: A hub id as the hub spells them: ``owner/name``, each part 1-96 letters, digits, ``-``, ``_`` or ``.``.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
#: How many characters of a name a message repeats (a 260-character name would drown the line).
_SHOWN_CHARS = 80


def _short(name: str) -> str:
    """``name`` cut to :data:`_SHOWN_CHARS` characters for a message, its control characters escaped."""
    text = str(name).encode("unicode_escape").decode("ascii")
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + f"… ({len(name)} characters)"


def is_hub_id(name: str) -> bool:
    """``name`` can be a hub id (``owner/name`` as the hub allows them: no ``--`` or ``..``)."""
    return bool(_HUB_ID.fullmatch(name)) and "--" not in name and ".." not in name


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
    if _is_dir(source):
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


#: The longest the loader waits on the hub without receiving a byte, in seconds (after the 1.5 s connect probe of
#: :func:`hub_reachable`). A download that keeps receiving may take as long as it needs; one that stalls this long
#: stops with one line naming the host. huggingface_hub's own timeouts do not bound it: its metadata request has none
#: (a server that accepts and never answers holds it for good), and the file requests are retried.
HUB_WAIT_S = 20.0
#: How often the loader looks at a download's progress, in seconds.
_POLL_S = 0.25
#: Files of a hub repo that a load reads (anything else, pickled weights above all, is never downloaded).
_HUB_EXTRA_FILES = ("config.json", "generation_config.json", "card.json", "special_tokens_map.json", "added_tokens.json")


def _hub_endpoint() -> str:
    """The hub's base URL as the environment says now (``HF_ENDPOINT``; huggingface_hub froze it at import)."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _hub_file_wanted(name: str) -> bool:
    """A repo file a load reads: at the top level, and config, card, tokenizer or safetensors."""
    return "/" not in name and (name in _HUB_EXTRA_FILES or name in TOKENIZER_FILES
                                or name.endswith((".safetensors", ".safetensors.index.json")))


class _Download:
    """One hub download in flight, shared by every load that needs the same repo.

    ``last`` is when the hub last sent something (a byte of a file, a file done,
    the file list); the loaders waiting on it give up when it is older than
    :data:`HUB_WAIT_S`, and a loader that arrives later fails at once.
    """

    def __init__(self, repo_id: str, endpoint: str, cache_dir: Path) -> None:
        self.repo_id, self.endpoint, self.cache_dir = repo_id, endpoint, cache_dir
        self.last = time.monotonic()
        self.done = threading.Event()
        self.folder: Path | None = None
        self.error: BaseException | None = None

    def tick(self) -> None:
        self.last = time.monotonic()

    def run(self) -> None:
        """The worker thread: the file list, then each wanted file into the hub cache (its snapshot folder)."""
        try:
            from huggingface_hub import HfApi, hf_hub_download
            from huggingface_hub.utils import tqdm as hub_tqdm

            download = self

            class Progress(hub_tqdm):  # each chunk received counts as the hub answering
                def update(self, n=1):
                    download.tick()
                    return super().update(n)

            info = HfApi(endpoint=self.endpoint).model_info(self.repo_id, timeout=HUB_WAIT_S)
            self.tick()
            names = sorted(s.rfilename for s in (info.siblings or []) if _hub_file_wanted(s.rfilename))
            for name in names:
                path = hf_hub_download(self.repo_id, name, cache_dir=str(self.cache_dir), endpoint=self.endpoint,
                                       etag_timeout=HUB_WAIT_S, tqdm_class=Progress)
                self.tick()
                self.folder = Path(path).parent
            if self.folder is None:
                self.error = ModelLoadError(
                    f"The hub's copy of '{self.repo_id}' holds none of config.json, model.safetensors or tokenizer "
                    "files: only safetensors weights are loaded.")
        except BaseException as err:  # noqa: BLE001 - handed to the waiting loaders, who word it
            self.error = err
        finally:
            self.done.set()
            with _LOCK:
                if _DOWNLOADS.get(self.key) is self:
                    del _DOWNLOADS[self.key]

    @property
    def key(self) -> tuple[str, str, str]:
        return self.endpoint, self.repo_id, str(self.cache_dir)


_DOWNLOADS: dict[tuple[str, str, str], _Download] = {}


def _tree_bytes(folder: Path) -> int:
    """Bytes under ``folder`` (a download's cache folder): growth there also counts as the hub answering."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _hub_failed(repo_id: str, err: BaseException) -> ModelLoadError:
    """The one line for a download that ended in an error (not found, refused, timed out)."""
    if isinstance(err, ModelLoadError):
        return err
    host, port = _hub_address()
    kind = type(err).__name__
    if "Timeout" in kind or isinstance(err, TimeoutError):
        return _stalled(repo_id)
    if kind in ("RepositoryNotFoundError", "GatedRepoError", "RevisionNotFoundError"):
        return _not_here(repo_id, f"the Hugging Face hub ({host}) has no model '{repo_id}' that it lets us read ({kind})",
                         f"the Hugging Face hub has no model '{repo_id}' that it lets us read")
    first = (str(err).splitlines() or [""])[0][:160]  # the CLI's line may name the URL; the app's names no server detail
    return _not_here(repo_id, f"its download from the Hugging Face hub ({host}:{port}) failed ({kind}: {first})",
                     f"its download from the Hugging Face hub failed ({kind})")


def _stalled(repo_id: str) -> ModelLoadError:
    host, port = _hub_address()
    why = f"the Hugging Face hub at {host}:{port} sent nothing for {HUB_WAIT_S:g} s"
    return _not_here(repo_id, why, f"the Hugging Face hub ({host}) sent nothing for {HUB_WAIT_S:g} s")


def fetch(repo_id: str) -> Path:
    """Download what a load of hub repo ``repo_id`` reads into the hub cache; its snapshot folder.

    Bounded: the download runs in a daemon worker thread, and this returns or
    raises a one-line :class:`ModelLoadError` as soon as the hub has sent
    nothing for :data:`HUB_WAIT_S` seconds (a worker stuck on a silent server is
    left to end on its own). No lock is held while waiting, and loads of the
    same repo share one download.
    """
    cache = hub_cache_dir()
    endpoint = _hub_endpoint()
    with _LOCK:
        dl = _DOWNLOADS.get((endpoint, repo_id, str(cache)))
        if dl is None:
            dl = _Download(repo_id, endpoint, cache)
            _DOWNLOADS[dl.key] = dl
            threading.Thread(target=dl.run, daemon=True, name=f"hub-download {repo_id}"[:60]).start()
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    size = -1
    while not dl.done.wait(_POLL_S):
        now_size = _tree_bytes(repo_dir)
        if now_size != size:
            if size >= 0:
                dl.tick()
            size = now_size
        if time.monotonic() - dl.last > HUB_WAIT_S:
            raise _stalled(repo_id)
    if dl.error is not None:
        raise _hub_failed(repo_id, dl.error) from None
    assert dl.folder is not None
    return dl.folder



def local_copy(source: str) -> str:
    """A folder holding ``source``: itself, its complete cached snapshot, or a bounded download (:func:`fetch`)."""
    where, local = locate(source)
    return where if local else str(fetch(where))


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
        if _is_dir(path):
            spec = ModelSpec(path.name, str(path.resolve()), int(_folder_train_length(path) or 512), "custom")
        elif "/" in name and not name.startswith((".", "/", "~")):
            if not is_hub_id(name):
                raise ModelLoadError(
                    f"Unknown model '{_short(name)}': not a folder on this machine and not a hub id (owner/name, "
                    "each part at most 96 letters, digits, '-', '_' or '.').")
            snap = cached_snapshot(name)
            lt = _folder_train_length(snap) if snap else None
            note = "hub id not in the registry: " + ("L_tr from the cached copy" if lt else "L_tr assumed 512")
            spec = ModelSpec(name, name, int(lt or 512), "custom", note)
        else:
            known = ", ".join(list(reg)[:6])
            raise ModelLoadError(
                f"Unknown model '{_short(name)}': not a registry name, not a hub id (owner/name), not a folder. "
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
    def family(self) -> str:
        """``"t5"`` (relative bias, encoder-decoder) or ``"rope"`` (rotary encoder, masked-LM head): what the
        engine, the views and :mod:`core.mlm` branch on."""
        return attention.family_of(self.config.model_type) or attention.T5

    @property
    def seq2seq(self) -> bool:
        """Has a decoder that generates answers (T5); a rotary encoder only fills masked tokens."""
        return self.family == attention.T5

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
    def d_kv(self) -> int:
        """Head dimension (InfoScale's d): T5's ``d_kv``; ModernBERT's ``hidden_size / heads``, as its attention uses."""
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
            "d_kv": self.d_kv,
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "attention": f"cosine (s={self.cosine_scale:g})" if self.cosine else "dot product",
        }


#: Models kept loaded in the process, least recently used dropped first: a server whose people try many models
#: must not keep every one of them (a Flan-T5-base is 1 GB). The app's own ``st.cache_resource`` holds as many.
MAX_MODELS = 4
_CACHE: "OrderedDict[tuple[str, str, int, str, str], Loaded]" = OrderedDict()
#: Guards ``_CACHE``, ``_KEY_LOCKS`` and ``_DOWNLOADS``; held only for a dict operation, never across a load or a
#: network wait (it once was held for a whole download, and every other session's load waited on a stalled hub).
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


def load(name: str | ModelSpec, device: str | None = None, train_length: int | None = None,
         tokenizer: str | None = None, dtype: str | None = None) -> Loaded:
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
        raise ModelLoadError("--tokenizer is empty: name a registry model, a hub id or a folder",
                             app="The tokenizer's name is empty: name a registry model, a hub id or a folder.")
    key = (spec.source, str(dev), spec.train_length, tok_ref, str(precision))
    hit = _cached(key)
    if hit is not None:
        return hit
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


# --- what a folder's weights are, checked before anything is read -------------------

#: Weight formats transformers or torch can read that are not safetensors (pickles above all): never opened.
NOT_SAFETENSORS = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".msgpack", ".h5", ".gguf", ".npz", ".joblib")
#: transformers' distributed-checkpoint layout: when one file matches, it reads every ``*.safetensors`` in the folder.
_DISTRIBUTED = re.compile(r"shard-[0-9]{5}-model-[0-9]{5}-of-[0-9]{5}\.safetensors")
#: The largest safetensors header read (the format's own limit): a bigger one is not a safetensors file.
_MAX_HEADER = 100_000_000


def _refuse(src: str, why: str, app_why: str | None = None) -> ModelLoadError:
    return ModelLoadError(f"Model folder '{src}' {why}. Only safetensors weights are loaded (no pickle is ever read).",
                          app=f"Model folder '{_shown(src)}' {app_why or why}. Only safetensors weights are loaded.")


def _plain_safetensors_name(name: object, index: bool = False) -> bool:
    """A bare file name (no folder part, no ``..``) ending in ``.safetensors`` (or ``.safetensors.index.json``)."""
    ends = (".safetensors", ".safetensors.index.json") if index else (".safetensors",)
    return (isinstance(name, str) and name.endswith(ends) and "/" not in name and "\\" not in name
            and name not in (".", "..") and "\x00" not in name)


def _read_index(path: Path, folder: Path, src: str) -> list[str]:
    """The shard names of a safetensors index, each a plain ``*.safetensors`` name (else a one-line refusal)."""
    try:
        raw = read_json(path, "Weight index")
    except UserError as err:
        raise _refuse(src, f"has an unreadable {path.name} ({str(err).split(': ', 1)[-1][:120]})",
                      f"has an unreadable {path.name}") from None
    wmap = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise _refuse(src, f"has a {path.name} without a weight_map")
    bad = [v for v in wmap.values() if not _plain_safetensors_name(v)]
    if bad:
        bad = bad[0]
        raise _refuse(src, f"has a {path.name} that points at {_short(str(bad))!r}, which is not a "
                                   "safetensors file in the folder; it is not opened")
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
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
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
            raise _refuse(src, f"has a config.json whose transformers_weights names {_short(str(explicit))!r}, "
                                       "which is not a safetensors file in the folder; it is not opened")
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
_POSITIVE_FIELDS = ("num_layers", "num_decoder_layers", "num_heads", "d_model", "d_kv", "d_ff", "vocab_size",
                    "relative_attention_num_buckets", "relative_attention_max_distance")
#: The same for a rotary encoder (ModernBERT's names).
_ROPE_POSITIVE_FIELDS = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")
#: Per family: the positive fields, the stacks as (weight-name prefix, layer-count field), the auto class.
_LAYOUT = {
    attention.T5: (_POSITIVE_FIELDS, (("encoder.block", "num_layers"), ("decoder.block", "num_decoder_layers")),
                   "AutoModelForSeq2SeqLM"),
    attention.ROPE: (_ROPE_POSITIVE_FIELDS, (("model.layers", "num_hidden_layers"),), "AutoModelForMaskedLM"),
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
    and its hidden size must split evenly into heads.
    """
    import transformers

    family = attention.family_of(getattr(config, "model_type", None)) or attention.T5
    positive, stacks, auto = _LAYOUT[family]

    def refuse(why: str) -> ModelLoadError:
        return ModelLoadError(f"The config.json of '{src}' does not match its weights: {why}.",
                              app=f"The config.json of model '{_shown(src)}' does not match its weights: {why}.")

    for field in positive:
        value = getattr(config, field, None)
        if value is None and field == "num_decoder_layers":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise refuse(f"{field} is {_short(repr(value))}, where a whole number of at least 1 is needed")
    if family == attention.ROPE and config.hidden_size % config.num_attention_heads:
        raise refuse(f"hidden_size {config.hidden_size} does not split into {config.num_attention_heads} heads")
    for prefix, field in stacks:
        stack = prefix.split(".")[0] if family == attention.T5 else "encoder"
        declared = int(getattr(config, field) or getattr(config, stacks[0][1]))
        stored = _blocks(shapes, prefix)
        if stored != set(range(declared)):
            raise refuse(f"it declares {declared} {stack} layers ({field}) and the weights hold {len(stored)}")
    try:
        with torch.device("meta"):  # a copy: building may set attributes (the attention) on the config it is given
            skeleton = getattr(transformers, auto).from_config(copy.deepcopy(config))
    except Exception as err:  # noqa: BLE001 - whatever a config transformers cannot build raises
        raise refuse(f"no model can be built from it ({type(err).__name__}: {(str(err).splitlines() or [''])[0][:120]})") from None
    wanted = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
    for name in sorted(shapes):
        if name in wanted and wanted[name] != shapes[name]:
            raise refuse(f"{name} is {list(shapes[name])} in the weights and {list(wanted[name])} by the config")


def _check_loading_info(info: dict, src: str) -> None:
    """What transformers found on loading (after its own tied and ignored weights): nothing missing, unexpected,
    mismatched or in error, else one line (a missing weight would run with random values)."""
    parts = []
    for key, label in (("missing_keys", "missing"), ("unexpected_keys", "unexpected"),
                       ("mismatched_keys", "of the wrong shape"), ("error_msgs", "in error")):
        items = sorted(str(k) for k in (info.get(key) or ()))
        if items:
            more = f" and {len(items) - 2} more" if len(items) > 2 else ""
            parts.append(f"{len(items)} {label} ({', '.join(_short(i) for i in items[:2])}{more})")
    if parts:
        why = "weights " + "; ".join(parts)
        raise ModelLoadError(f"The weights of '{src}' do not match its config.json: {why}.",
                             app=f"The weights of model '{_shown(src)}' do not match its config.json: {why}.")


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
    if _is_dir(path):
        if not _has_tokenizer(path):
            raise ModelLoadError(f"Tokenizer folder '{ref}' has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...)")
        return str(path), {"local_files_only": True}
    spec = registry().get(ref)
    source = spec.source if spec else ref
    if spec is None and not is_hub_id(ref):
        raise ModelLoadError(f"Unknown tokenizer '{_short(ref)}': not a folder, a registry name or a hub id (owner/name)")
    return local_copy(source), {"local_files_only": True}  # a hub id is downloaded first, bounded (see fetch)


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


def _load_uncached(spec: ModelSpec, dev: torch.device, dtype: torch.dtype, tokenizer: str | None = None, *,
                   where: str | None = None, tok_where: str | None = None) -> Loaded:
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
    family = attention.family_of(config.model_type)
    if family is None:
        why = (f"not T5-family ({', '.join(T5_FAMILY)}) nor a rotary masked-LM encoder ({', '.join(ROPE_FAMILY)}): "
               "the temperature method needs an attention that runs through ours")
        raise ModelLoadError(f"'{src}' is a '{config.model_type}' model, {why}.",
                             app=f"'{_shown(src)}' is a '{config.model_type}' model, {why}.")
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
                "into its folder.")
    model.to(dev).eval()
    relative_bias.install(model)  # T5's bias as one vector per head (core.relative_bias): no [H, L, L] per pass
    return Loaded(spec=spec, model=model, tokenizer=tok, device=dev, dtype=dtype)
