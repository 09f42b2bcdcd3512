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


def digits(n: int) -> int:
    """How many decimal digits ``n`` has (its sign aside), counted without writing it out: Python refuses to write
    a whole number of over 4,300 digits (``sys.get_int_max_str_digits``)."""
    n = abs(n)
    d = int(n.bit_length() * 0.30102999566398120)  # log10(2): the count is d or d + 1
    return max(1, d + 1 if n >= 10**d else d)


def shown(value: object, width: int = 40) -> str:
    """``value`` as a message quotes it: its ``repr`` cut to ``width`` characters, and a whole number too long for
    that as its count of digits (``a 5,000-digit number``). Why: an error must stay one short line whatever was
    typed, and ``repr`` of a huge int raises instead of writing it."""
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value.bit_length() > 3 * width
        and digits(value) >= width
    ):
        return f"a {'negative ' if value < 0 else ''}{digits(value):,}-digit number"
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


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
