"""Errors a person can act on.

Everything the library refuses for a reason the user can fix derives from
:class:`UserError` (itself a ``ValueError``), so the CLI prints the message
and exits 2, and the app shows it in the page, never a traceback.

One error, two readers: ``str(err)`` is the command line's wording (it may
name flags such as ``--tokens`` and the paths the user typed), and
:attr:`UserError.app_text` is the app's, which speaks of the app's controls
(the model box, the Length in tokens box) and never shows a path of the
server. Raise with both where the two differ::

    raise UserError("Use a shorter document (--tokens).", app="Use a shorter document (the Length in tokens box).")

Without ``app=`` both readers get the same text.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input or an impossible request; the message says what to do.

    ``app``: the same message for the app, where the command-line text
    mentions flags or server paths (see the module docstring).
    """

    def __init__(self, *args: object, app: str | None = None) -> None:
        super().__init__(*args)
        self.app = app  # in __dict__: pickled with the error (Ray actors, worker processes)

    @property
    def app_text(self) -> str:
        """The message for the app: its own wording when one was given, else the command line's."""
        return self.app if self.app else str(self)


class ModelLoadError(UserError):
    """A model could not be loaded (unknown, unreachable, not T5-family, not safetensors)."""


class InputTooLong(UserError):
    """The document needs more memory than this machine has free."""


class NumericalError(UserError):
    """NaN or inf appeared in the attention (typically fp16 overflow in T5)."""
