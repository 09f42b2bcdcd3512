"""Which models we know, and loading any T5-family model with our attention.

``load(spec)`` accepts a registry name (``flan-t5-base``), a hub id
(``google/flan-t5-base``) or a local folder, loads safetensors only with
``trust_remote_code=False``, and returns a :class:`Loaded` bundle that carries
what the rest of the library needs to know (training length L_tr, heads,
head size, device, dtype, attention mode). Loaded models are cached per
(source, device): Streamlit sessions, the CLI and sweeps share one copy.

Device policy: CUDA with bfloat16 when a GPU is present (T5 overflows to NaN
in float16), otherwise CPU with float32.
"""

from __future__ import annotations

import json
import os
import threading
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
            card = path / "card.json"
            lt = json.loads(card.read_text()).get("train_length") if card.exists() else None
            if lt is None and (path / "config.json").exists():
                lt = json.loads((path / "config.json").read_text()).get("n_positions")
            spec = ModelSpec(path.name, str(path.resolve()), int(lt or 512), "custom")
        elif "/" in name and not name.startswith((".", "/", "~")):
            spec = ModelSpec(name, name, 512, "custom", "hub id not in the registry: L_tr assumed 512")
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
    local = Path(src).is_dir()
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    try:
        config = AutoConfig.from_pretrained(src, trust_remote_code=False, local_files_only=local or offline)
    except Exception as err:  # noqa: BLE001 - many hub/network error types; all mean "not reachable"
        raise ModelLoadError(
            f"Could not load model '{src}': {'the folder has no usable config.json' if local else 'no local copy and the hub is unreachable'}. "
            f"Download it on a machine with internet (e.g. `hf download {src} --local-dir ./{Path(src).name}`) "
            f"and pass that folder (--model ./{Path(src).name}, or the app's 'hub id or folder' box). [{type(err).__name__}]"
        ) from None
    if config.model_type not in T5_FAMILY:
        raise ModelLoadError(
            f"'{src}' is a '{config.model_type}' model, not T5-family ({', '.join(T5_FAMILY)}): "
            "the temperature method needs T5's relative-position-bias attention."
        )
    try:
        model = AutoModelForSeq2SeqLM.from_pretrained(
            src,
            config=config,
            dtype=dtype,
            use_safetensors=True,
            trust_remote_code=False,
            attn_implementation=attention.ATTN_NAME,
            local_files_only=local or offline,
        )
        tokenizer = AutoTokenizer.from_pretrained(src, local_files_only=local or offline)
    except Exception as err:  # noqa: BLE001
        raise ModelLoadError(
            f"Could not load the weights or tokenizer of '{src}' ({type(err).__name__}: {str(err).splitlines()[0][:200]}). "
            "Only safetensors weights are accepted; pass a local folder holding config.json, model.safetensors and tokenizer files."
        ) from None
    model.to(dev).eval()
    return Loaded(spec=spec, model=model, tokenizer=tokenizer, device=dev, dtype=dtype)
