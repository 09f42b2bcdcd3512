"""Which models we know (the hub's T5 families and the bundled ones, each with its training length L_tr),
the default one, and how a typed name (registry name, hub id or folder) becomes a :class:`ModelSpec`.

A bundled model is a folder ``assets/models/<name>/`` with a ``card.json``; a
card is validated by :class:`Card` before anything in it is trusted
(``train_length`` a whole number of 2..``MAX_LENGTH`` tokens). A folder or hub id
outside the registry takes L_tr from its card, else its config (``n_positions``,
or a rotary encoder's ``max_position_embeddings``), else 512.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Strict, ValidationError

from core.errors import ModelLoadError, UserError
from core.mechanics import attention
from core.models import install
from core.models.hub_cache import cached_snapshot
from core.models.names import APP_MODEL_BOX, _is_dir, _short, is_hub_id
from core.values.validation import Str, TrainLength, one_line, read_json, validate

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "models"
T5_FAMILY = attention.FAMILIES[attention.T5]
ROPE_FAMILY = attention.FAMILIES[attention.ROPE]


@dataclass(frozen=True)
class ModelSpec:
    """A model we know: where it comes from and its training length L_tr."""

    name: str
    source: str  # hub id or local folder
    train_length: int
    kind: str  # "flan-t5" | "t5-lm-adapt" | "codet5p" | "bundled" | "fetched" | "custom"
    note: str = ""

    @property
    def bundled(self) -> bool:
        return self.kind == "bundled"


def _hub_specs() -> list[ModelSpec]:
    specs = []
    for size in ("small", "base", "large", "xl", "xxl"):
        specs.append(
            ModelSpec(f"flan-t5-{size}", f"google/flan-t5-{size}", 512, "flan-t5", "Flan-T5, trained at 512 tokens")
        )
    for size in ("small", "base", "large", "xl", "xxl"):
        specs.append(ModelSpec(f"t5-v1_1-{size}-lm-adapt", f"google/t5-v1_1-{size}-lm-adapt", 512, "t5-lm-adapt"))
        specs.append(ModelSpec(f"t5-{size}-lm-adapt", f"google/t5-{size}-lm-adapt", 512, "t5-lm-adapt"))
    for size in ("220m", "220m-py", "770m", "770m-py"):
        specs.append(
            ModelSpec(f"codet5p-{size}", f"Salesforce/codet5p-{size}", 768, "codet5p", "CodeT5+, trained at 768 tokens")
        )
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
        raise ModelLoadError(
            f"Model card {path}: {one_line(err)}",
            app=f"The card.json of model folder '{path.parent.name}' is not valid: {one_line(err)}",
        ) from None
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
                raise ModelLoadError(
                    f"Model card {path} has no train_length",
                    app=f"The bundled model '{path.parent.name}' has a card.json without train_length",
                )
            out.append(ModelSpec(path.parent.name, str(path.parent), card.train_length, "bundled", card.summary))
    return out


def fetched_specs() -> list[ModelSpec]:
    """The models installed on first use from the package index (:mod:`core.models.install`), whether or not they
    are installed yet: each is its folder in the user's cache, which :func:`core.models.loading.load` verifies
    against its card (or says how to fetch it) before anything is read."""
    return [
        ModelSpec(f.name, str(install.folder(f.name)), f.train_length, "fetched", f.summary)
        for f in install.FETCHABLE.values()
    ]


def registry() -> dict[str, ModelSpec]:
    """Every known model by name: bundled ones first, then the hub's, then those fetched on first use (last, so
    the first non-bundled name stays one the hub serves); hub ids resolve too (see :func:`resolve`)."""
    specs = bundled_specs() + _hub_specs() + fetched_specs()
    return {s.name: s for s in specs}


def default_model() -> str | None:
    """The app's and CLI's default: the bundled model whose card says ``"default": true``
    (else the first bundled one), or None when none ship."""
    b = bundled_specs()
    flagged = [s for s in b if read_card(Path(s.source)).default]
    return (flagged or b)[0].name if b else None


def _folder_train_length(path: Path) -> int | None:
    """L_tr from ``card.json`` next to the weights, else the config: T5's ``n_positions``; a rotary encoder's
    ``max_position_embeddings`` (its positions are not learned: the longest it was trained at); a decoder-only LM's
    original context before any rope scaling its config ships (``original_max_position_embeddings`` of its
    ``rope_parameters`` / ``rope_scaling``, as Llama 3.1 stretches 8,192 to 131,072), else its
    ``max_position_embeddings``. None if none of them says."""
    card = read_card(path)
    if card is not None and card.train_length is not None:
        return card.train_length
    config = path / "config.json"
    if not config.is_file():
        return None
    raw = read_json(config, "Model config")
    if not isinstance(raw, dict):
        return None
    family = attention.family_of(raw.get("model_type"))
    field, lt = "n_positions", raw.get("n_positions")
    if lt is None and family == attention.CAUSAL_LM:
        for key in ("rope_parameters", "rope_scaling"):
            scaling = raw.get(key)
            if isinstance(scaling, dict) and scaling.get("original_max_position_embeddings") is not None:
                field, lt = f"{key}.original_max_position_embeddings", scaling["original_max_position_embeddings"]
                break
    if lt is None and family in (attention.ROPE, attention.CAUSAL_LM):
        field, lt = "max_position_embeddings", raw.get("max_position_embeddings")
    return None if lt is None else validate(TrainLength, lt, f"Model config {config}: {field}")


def resolve(name: str, train_length: int | None = None) -> ModelSpec:
    """Registry name, hub id or local folder -> :class:`ModelSpec`.

    Unknown hub ids and folders get L_tr from ``train_length`` or, failing that,
    from a ``card.json`` next to the weights or the config's
    ``n_positions`` (T5 configs carry 512).
    """
    if not name or not str(name).strip():
        raise ModelLoadError(
            "No model given. Pass a registry name, a hub id or a local folder.",
            app="No model given: choose one in the sidebar's Model box, or type a hub id or a local "
            f"folder in {APP_MODEL_BOX}.",
        )
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
                    "each part at most 96 letters, digits, '-', '_' or '.')."
                )
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
