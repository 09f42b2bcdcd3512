"""What a page works from: the run's :class:`~core.values.choice.Choice` plus its page state, one value.

The sidebar resolves the model and the document (:func:`ui.sidebar.sidebar`), the temperature controls resolve
the Choice (:func:`ui.tau_controls.temperature_controls`), and every page and view reads both from one
:class:`PageState`. Why it holds the Choice whole and reads no part of it again (no ``ctx.tau`` beside
``ctx.choice.tau``): the Choice is the one value a pass carries to the attention; a page state that copied its
parts was one more container to keep in step (the old ``Context`` and ``Temperature``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from core.data import tasks
from core.mechanics.run_pass import Pass
from core.models import Loaded
from core.runs.settings import DocumentRequest
from core.values.choice import Choice
from core.values.schedule import Schedule

#: Adaptive temperature's tau in words, after "tau = " (the sidebar, the scrubber's note): a tau per query row set
#: inside each pass from the row itself, so no number (its base 1, what a slider shows, is not its tau).
ADAPTIVE_TEXT = "adaptive: 1 / beta(H) per query row, H its own entropy at tau = 1"


@dataclass(frozen=True)
class PageState:
    """The page's run and where it stands: the model (``loaded``, and the reference it was loaded by), the
    document (its request, the document itself, its length in tokens), the run's ``choice`` (method, resolved
    schedule, targets, CosScale, position scheme, the method's own number), the person's own slider tau
    (``tau_input``: kept while another method shows its resolved one) and what the resolution said
    (``tau_info``)."""

    loaded: Loaded
    model_ref: str
    request: DocumentRequest
    document: tasks.Document
    tokens: int
    choice: Choice
    tau_input: float
    tau_info: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def train_length(self) -> int:
        return self.loaded.train_length

    @property
    def ratio(self) -> float:
        return self.tokens / self.train_length

    @property
    def tau_mean(self) -> float:
        return self.choice.tau.mean(self.tokens)

    def tau_text(self, schedule: Any = None) -> str:
        """The schedule after "tau = ": '0.812', 'per row (mean 0.912)', 'per layer 0.90, 0.80 (mean 0.850)', or
        adaptive temperature's :data:`ADAPTIVE_TEXT` (its base 1 is not its tau)."""
        s = Schedule.of(self.choice.tau if schedule is None else schedule)
        if s.adaptive:
            return ADAPTIVE_TEXT
        if s.rows is not None:
            return f"per row (mean {s.mean(self.tokens):.3f})"
        a = np.asarray(s)
        if a.ndim == 0:
            return f"{float(a):.3f}"
        return "per layer " + ", ".join(f"{v:.2f}" for v in a.reshape(len(a), -1).mean(1)) + f" (mean {a.mean():.3f})"

    def with_choice(self, choice: Choice, tau_input: float, info: dict) -> "PageState":
        """This page state with the temperature controls' resolved choice (:func:`ui.tau_controls.temperature_controls`)."""
        return replace(self, choice=choice, tau_input=tau_input, tau_info=info)

    def pair(self, tau: Any = None, method: str | None = None, **how: Any) -> tuple[Choice, Pass]:
        """What a pass needs, as its two values: the page's :class:`~core.values.choice.Choice` as it is (or with
        ``tau`` / ``method`` changed) and a :class:`~core.mechanics.run_pass.Pass` of ``how``'s parts (None leaves a
        part at its default)."""
        parts = {k: v for k, v in dict(tau=tau, method=method).items() if v is not None}
        return (self.choice.with_(**parts) if parts else self.choice), Pass(
            **{k: v for k, v in how.items() if v is not None}
        )
