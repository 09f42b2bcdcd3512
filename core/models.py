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
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch

from core import attention  # noqa: F401  (registers the "aligned" attention)
from core.errors import ModelLoadError

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


def bundled_specs(root: Path = ASSETS) -> list[ModelSpec]:
    """The models shipped in ``assets/models/<name>/`` (each with a ``card.json``); may be none."""
    out = []
    if root.is_dir():
        for card in sorted(root.glob("*/card.json")):
            info = json.loads(card.read_text())
            out.append(
                ModelSpec(card.parent.name, str(card.parent), int(info["train_length"]), "bundled", info.get("summary", ""))
            )
    return out


def registry() -> dict[str, ModelSpec]:
    """Every known model by name, bundled ones first; hub ids resolve too (see :func:`resolve`)."""
    specs = bundled_specs() + _hub_specs()
    return {s.name: s for s in specs}


def default_model() -> str | None:
    """The app's and CLI's default: the bundled model whose card says ``"default": true``
    (else the first bundled one), or None when none ship."""
    b = bundled_specs()
    flagged = [s for s in b if json.loads((Path(s.source) / "card.json").read_text()).get("default")]
    return (flagged or b)[0].name if b else None


def _folder_train_length(path: Path) -> int | None:
    """L_tr from ``card.json`` next to the weights, else the config's ``n_positions``; None if neither says."""
    card = path / "card.json"
    lt = json.loads(card.read_text()).get("train_length") if card.exists() else None
    if lt is None and (path / "config.json").exists():
        lt = json.loads((path / "config.json").read_text()).get("n_positions")
    return int(lt) if lt is not None else None


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


def _not_here(repo_id: str, why: str) -> ModelLoadError:
    short = repo_id.rstrip("/").split("/")[-1]
    return ModelLoadError(
        f"Model '{repo_id}' is not on this machine and {why}: download it where there is internet "
        f"(`hf download {repo_id} --local-dir ./{short}`) and pass that folder (--model ./{short}, or the app's "
        f"'hub id or folder' box), or set HF_HOME to a Hugging Face cache that holds it (looked in {hub_cache_dir()})."
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
        raise _not_here(source, f"offline mode is on ({flag}){partial}")
    if not hub_reachable():
        host = _hub_address()[0]
        raise _not_here(source, f"the Hugging Face hub ({host}) cannot be reached{partial}")
    return source, False


def resolve(name: str, train_length: int | None = None) -> ModelSpec:
    """Registry name, hub id or local folder -> :class:`ModelSpec`.

    Unknown hub ids and folders get L_tr from ``train_length`` or, failing that,
    from a ``card.json`` next to the weights or the config's
    ``n_positions`` (T5 configs carry 512).
    """
    if not name or not str(name).strip():
        raise ModelLoadError("No model given. Pass a registry name, a hub id or a local folder.")
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
        if train_length < 2:
            raise ModelLoadError("train_length must be at least 2 tokens")
        spec = ModelSpec(spec.name, spec.source, int(train_length), spec.kind, spec.note)
    return spec


def pick_device(requested: str | None = None) -> tuple[torch.device, torch.dtype]:
    """CUDA + bf16 when present (fp16 overflows in T5), else CPU + fp32."""
    if requested in (None, "", "auto"):
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(requested)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("CUDA was requested but no GPU is available; use --device cpu")
    return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float32)


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


_CACHE: dict[tuple[str, str, int], Loaded] = {}
_LOCK = threading.Lock()


def load(name: str | ModelSpec, device: str | None = None, train_length: int | None = None) -> Loaded:
    """Load (once) a T5-family model with the ``aligned`` attention; see the module docstring."""
    spec = name if isinstance(name, ModelSpec) else resolve(name, train_length)
    if isinstance(name, ModelSpec) and train_length is not None:
        spec = resolve(spec.source, train_length)
    dev, dtype = pick_device(device)
    key = (spec.source, str(dev), spec.train_length)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = _load_uncached(spec, dev, dtype)
        return _CACHE[key]


def _load_uncached(spec: ModelSpec, dev: torch.device, dtype: torch.dtype) -> Loaded:
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
            f"(--model ./{Path(src).name}, or the app's 'hub id or folder' box)."
        ) from None
    if config.model_type not in T5_FAMILY:
        raise ModelLoadError(
            f"'{src}' is a '{config.model_type}' model, not T5-family ({', '.join(T5_FAMILY)}): "
            "the temperature method needs T5's relative-position-bias attention."
        )
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
        tokenizer = AutoTokenizer.from_pretrained(where, **opts)
    except Exception as err:  # noqa: BLE001
        raise ModelLoadError(
            f"Could not load the weights or tokenizer of '{src}' ({type(err).__name__}: {str(err).splitlines()[0][:200]}). "
            "Only safetensors weights are accepted; pass a local folder holding config.json, model.safetensors and tokenizer files."
        ) from None
    model.to(dev).eval()
    return Loaded(spec=spec, model=model, tokenizer=tokenizer, device=dev, dtype=dtype)
