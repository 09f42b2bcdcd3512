"""Errors a person can act on.

Everything the library refuses for a reason the user can fix derives from
:class:`UserError` (itself a ``ValueError``), so the CLI prints the message
and exits 2, and the app shows it in the page, never a traceback.
"""


class UserError(ValueError):
    """Bad input or an impossible request; the message says what to do."""


class ModelLoadError(UserError):
    """A model could not be loaded (unknown, unreachable, not T5-family, not safetensors)."""


class InputTooLong(UserError):
    """The document needs more memory than this machine has free."""


class NumericalError(UserError):
    """NaN or inf appeared in the attention (typically fp16 overflow in T5)."""
