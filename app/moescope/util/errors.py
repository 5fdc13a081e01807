"""Typed errors that carry one human-readable sentence.

Every error a user can cause (a wrong path, a file that is not a model, a budget that does
not parse) is raised as a subclass of :class:`MoEScopeError`. Front ends (CLI, GUI) catch
that one base class and show ``str(err)`` as a single line; anything else is a bug and is
allowed to surface with its traceback.
"""

from __future__ import annotations


class MoEScopeError(Exception):
    """Base class for errors whose message is meant for the user, not for a developer."""


class ModelFileNotFoundError(MoEScopeError):
    """The model path does not exist or is not a regular readable file."""


class ModelFormatError(MoEScopeError):
    """The file is not a GGUF model, or it is truncated or corrupt."""


class NotMoEError(MoEScopeError):
    """The model is a valid GGUF but has no routed experts, so there is nothing to cache."""


class BudgetError(MoEScopeError):
    """A VRAM budget string could not be parsed or is out of range."""


_UNSEEN = frozenset(("Cc", "Cf", "Cs", "Zl", "Zp"))
"""Unicode categories shown escaped in a message line: controls (a newline, ESC), format
characters (a right-to-left override), lone surrogates (a name not in UTF-8), separators."""


def one_line(text: str) -> str:
    """``text`` with every character that would not read as itself on a terminal written
    as its escape (``\\n``, ``\\x1b``, ``\\u202e``): a message names files and values the
    user or a file chose, and a name holding a newline printed a second ``moescope: error:``
    line of its choosing, an ESC sequence recoloured the terminal. A byte of a file name
    that is not UTF-8 (Python's lone surrogate) is written as the byte, ``\\xff``, as
    traces, the server and the window write it (``util.words.utf8_name``)."""
    import unicodedata

    if text.isprintable():
        return text

    def escape(ch: str) -> str:
        if 0xDC80 <= ord(ch) <= 0xDCFF:  # surrogateescape's byte 0x80-0xff
            return f"\\x{ord(ch) - 0xDC00:02x}"
        return ch.encode("unicode_escape", "backslashreplace").decode("ascii")

    return "".join(escape(ch) if unicodedata.category(ch) in _UNSEEN else ch for ch in text)
