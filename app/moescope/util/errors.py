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
