"""What a run asks for, as one small serialisable object.

:class:`Settings` is the contract between the app's export, the CLI
(``--settings FILE``), sweeps and :func:`core.apply`: the model, the document
request, how tau is chosen (method, criterion) and the schedule it resolved
to at the length it was chosen at. A length-dependent method can be resolved
again at another length (:func:`core.calibration.resolve`); a fixed schedule is
used as is.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from core import tasks
from core.attention import ENCODER, KINDS
from core.errors import UserError
from core.temperature import CRITERIA, METHODS

SCHEMA = "attention-alignment-explorer/settings@1"


@dataclass(frozen=True)
class DocumentRequest:
    """A document to build: a generated task, or the user's own text with an optional needle."""

    task: str = "passkey"
    tokens: int | None = None  # None: the model's L_tr
    depth: float = 0.5
    seed: int = 0
    text: str | None = None  # task "text" only
    needle: str | None = None
    question: str | None = None
    expected: str | None = None

    def build(self, tokenizer, train_length: int) -> tasks.Document:
        """Make the document (raises UserError on empty text, bad depth, too few tokens)."""
        if not 0.0 <= self.depth <= 1.0:
            raise UserError(f"Needle depth must be between 0 and 1 (0-100 %), got {self.depth}")
        try:
            if self.task == "text":
                if not self.text or not self.text.strip():
                    raise UserError("The text is empty: paste some text (or upload a .txt file) first.")
                return tasks.from_text(
                    self.text, tokenizer, needle=self.needle, question=self.question,
                    expected=self.expected, depth=self.depth, seed=self.seed,
                )
            if self.task not in tasks.TASKS:
                raise UserError(f"Unknown task '{self.task}'; choose from {', '.join(tasks.TASKS + ('text',))}")
            return tasks.make(self.task, tokenizer, int(self.tokens or train_length), depth=self.depth, seed=self.seed)
        except UserError:
            raise
        except ValueError as err:
            raise UserError(str(err)) from None


@dataclass(frozen=True)
class Settings:
    """A chosen temperature and where it was chosen (the exported JSON)."""

    model: str | None = None
    train_length: int | None = None
    method: str = "none"
    tau: float | list | None = None  # the schedule: number, per layer, or per layer and head
    criterion: str = "pmax"
    targets: tuple[str, ...] = (ENCODER,)
    cosine_scale: float | None = None
    chosen_at: int | None = None  # tokens of the document tau was resolved on
    document: DocumentRequest = field(default_factory=DocumentRequest)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UserError(f"Unknown method '{self.method}'; choose from {', '.join(METHODS)}")
        if self.criterion not in CRITERIA:
            raise UserError(f"Unknown criterion '{self.criterion}'; choose from {', '.join(CRITERIA)}")
        bad = [t for t in self.targets if t not in KINDS]
        if bad:
            raise UserError(f"Unknown attention target(s) {bad}; choose from {', '.join(KINDS)}")
        if self.method == "fixed" and self.tau is None:
            raise UserError("Method 'fixed' needs a tau")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["targets"] = list(self.targets)
        return {"schema": SCHEMA, **d}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: dict) -> "Settings":
        if d.get("schema", SCHEMA) != SCHEMA:
            raise UserError(f"Settings file schema '{d.get('schema')}' is not '{SCHEMA}'")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known - {"schema"}
        if unknown:
            raise UserError(f"Unknown settings key(s): {', '.join(sorted(unknown))}")
        d = {k: v for k, v in d.items() if k in known}
        doc = d.get("document") or {}
        doc_known = {f.name for f in fields(DocumentRequest)}
        if set(doc) - doc_known:
            raise UserError(f"Unknown document key(s): {', '.join(sorted(set(doc) - doc_known))}")
        d["document"] = DocumentRequest(**doc)
        if "targets" in d:
            d["targets"] = tuple(d["targets"])
        return cls(**d)

    @classmethod
    def load(cls, path: str | Path) -> "Settings":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except FileNotFoundError:
            raise UserError(f"Settings file not found: {path}") from None
        except json.JSONDecodeError as err:
            raise UserError(f"Settings file {path} is not valid JSON: {err}") from None
        except TypeError as err:
            raise UserError(f"Settings file {path} has a bad value: {err}") from None
