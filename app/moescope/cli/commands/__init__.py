"""Subcommands of the ``moescope`` CLI, one module each, found automatically.

Every public module in this package (name not starting with ``_``) is a subcommand and
exposes ``register(subparsers)``: it adds its own parser and sets ``func``, a callable that
takes the parsed ``argparse.Namespace`` and returns an exit code. Adding a subcommand is
therefore just adding ``moescope/cli/commands/<name>.py``; no shared file needs an edit.
Modules are imported when the CLI builds its parser, so keep heavy imports (the engine)
inside ``func``. Errors meant for the user are raised as ``MoEScopeError``; the CLI prints
them as one line and exits with status 2.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

# Preferred order in `moescope --help`; subcommands not listed follow alphabetically.
HELP_ORDER: tuple[str, ...] = ("info", "pull", "generate", "chat", "eval", "replay", "bench")


def command_names() -> list[str]:
    """Names of the subcommand modules in this package, in help order."""
    found = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    rank = {name: i for i, name in enumerate(HELP_ORDER)}
    return sorted(found, key=lambda n: (rank.get(n, len(rank)), n))


def load_commands() -> list[ModuleType]:
    """Import every subcommand module."""
    return [importlib.import_module(f"{__name__}.{name}") for name in command_names()]
