"""The ``moescope`` command: the desktop window by default, headless subcommands otherwise.

``moescope`` alone opens the GUI; ``moescope info|generate|chat|...`` run without Qt. Each
subcommand lives in its own module under :mod:`moescope.cli.commands` (see there for how to
add one). User mistakes (a missing file, a file that is not a model, a bad budget) are
raised as :class:`~moescope.util.errors.MoEScopeError` and reported here as one line on
stderr with exit status 2, never as a traceback (a newline or an ESC in a name it holds is
shown escaped: :func:`~moescope.util.errors.one_line`).

Imports inside functions are deliberate in this package (and only here): a subcommand
module imports the engine, numpy-heavy code or Qt in its ``run``, not at the top, so that
``moescope --help`` and a mistyped argument answer at once instead of loading llama.cpp,
numpy's heavier users and Qt first.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from moescope import __version__
from moescope.cli.commands import command_names, load_commands
from moescope.cli.options import check_range
from moescope.util.errors import MoEScopeError, one_line

EXIT_USAGE = 2
SELF_TEST_TIMEOUT_S = (1.0, 3600.0)
"""``--self-test-timeout``'s bounds: a second to an hour (Qt's timer takes no more than
about 24 days, and a NaN or a negative wait meant a traceback or an instant 'timed out')."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line, as every other error of the CLI is
    (argparse printed its whole usage block first: 5-8 lines for a mistyped number); the
    line says where the usage is. Subcommands' parsers are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse takes an argument for an option's value only when it does not start
        # with "-", or is a plain negative number ("-5", "-.5"): so `--budget -5GiB` was
        # "expected one argument", not the budget's own error. A "-" then a digit (or ".")
        # is a value: no option of ours is spelt so.
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {one_line(message)} "
                              f"(see: {self.prog} --help)\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """As argparse's, but an unknown option is named by the subcommand it was given
        to (``moescope generate --bogus`` pointed at ``moescope --help``)."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self._innermost(parsed).error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed

    def _innermost(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                sub = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(sub, _Parser):
                    return sub._innermost(parsed)
        return self


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand module registered."""
    parser = _Parser(
        prog="moescope",
        description="Chat with big Mixture-of-Experts models on one consumer GPU and see "
                    "what the expert cache does. Without a subcommand, opens the window.",
    )
    parser.add_argument("--version", action="version", version=f"moescope {__version__}")
    parser.add_argument(
        "--self-test", action="store_true",
        help="check this installation and exit: open the window offscreen, load the demo "
             "model, generate a few tokens, check code colours; prints one OK line "
             "(exit 0) or what failed (exit 1)")
    lo, hi = SELF_TEST_TIMEOUT_S
    parser.add_argument("--self-test-timeout", type=float, default=120.0, metavar="S",
                        help=f"give up on --self-test after S seconds, {lo:g} to {hi:g} "
                             "(default 120)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND",
                                       help="what to do (none: open the window)")
    for module in load_commands():
        module.register(subparsers)
    return parser


def _model_argument(arg: str) -> bool:
    """``moescope X``: X names a model for the window when it ends in ``.gguf``, or is a
    path that exists and names no subcommand (``moescope ~/Downloads/model.bin`` was
    refused as "invalid choice" among the subcommands)."""
    if arg.lower().endswith(".gguf"):
        return True
    return (not arg.startswith("-") and arg not in command_names()
            and os.path.lexists(arg))


def _starts_as_gguf(path: str) -> bool:
    """The file starts with GGUF's magic, or cannot be read here (the window says why);
    a ``.gguf`` name is left to the window's own checks, as before."""
    if path.lower().endswith(".gguf"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return True


def _names_print_as_given() -> None:
    """Standard output writes a file name that is not UTF-8 (Python holds its bytes as
    surrogates) as the bytes it was: in a UTF-8 locale its errors are "strict", and
    ``moescope info $'\xff.gguf'`` or ``trace compact`` of such a name ended in a
    UnicodeEncodeError traceback after the work was done."""
    with contextlib.suppress(AttributeError, ValueError, OSError):
        if sys.stdout.errors == "strict":
            sys.stdout.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]


class _OneLine(logging.Formatter):
    """A library warning in a terminal command: ``moescope: warning: …`` on one line, as
    the command's own messages are (Python's last-resort handler printed it bare)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"moescope: {record.levelname.lower()}: {one_line(record.getMessage())}"


class _Stderr(logging.Handler):
    """To whatever ``sys.stderr`` is when a record comes (not the one at creation)."""

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed or full stderr: no one
            print(self.format(record), file=sys.stderr, flush=True)  # to tell


def _terminal_logging() -> None:
    """The library's log in a terminal command: what matters there the command says itself,
    in its own line (a recording that stopped, a trace left as its journal), and Python's
    last-resort handler printed the library's warning of it again, bare. So its warnings are
    shown only with ``MOESCOPE_DEBUG`` set, each as one prefixed line (installed once)."""
    root = logging.getLogger("moescope")
    if any(isinstance(h, _Stderr | logging.NullHandler) for h in root.handlers):
        return
    if not os.environ.get("MOESCOPE_DEBUG"):
        root.addHandler(logging.NullHandler())
        return
    handler = _Stderr(logging.WARNING)
    handler.setFormatter(_OneLine())
    root.addHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit status (the console script passes it to exit)."""
    _names_print_as_given()
    given = list(sys.argv[1:] if argv is None else argv)
    if len(given) == 1 and _model_argument(given[0]):  # `moescope MODEL.gguf`
        if not os.path.isfile(given[0]):  # the window would open its last model instead
            what = ("is a directory, not a GGUF model file" if os.path.isdir(given[0])
                    else "not a regular file" if os.path.exists(given[0])
                    else "no such model file")
            print(f"moescope: error: {one_line(given[0])}: {what}", file=sys.stderr)
            return EXIT_USAGE
        if not _starts_as_gguf(given[0]):  # the window would open on an error dialog
            print(f"moescope: error: {one_line(given[0])}: not a GGUF model file",
                  file=sys.stderr)
            return EXIT_USAGE
        return launch_gui(given[0])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, --version, or a usage error already printed
        if stop.code is None:
            return 0
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    if args.self_test:
        if args.command is not None:
            print("moescope: error: --self-test takes no subcommand", file=sys.stderr)
            return EXIT_USAGE
        try:
            check_range("--self-test-timeout", args.self_test_timeout, *SELF_TEST_TIMEOUT_S,
                        " seconds")
        except MoEScopeError as err:
            print(f"moescope: error: {err}", file=sys.stderr)
            return EXIT_USAGE
        return self_test(args.self_test_timeout)
    if args.command is None:
        return launch_gui()
    _terminal_logging()
    try:
        return int(args.func(args))
    except MoEScopeError as err:  # one line, whatever names it holds
        print(f"moescope: error: {one_line(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("moescope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `moescope info x.gguf | head -1`
        return 0


def no_display() -> str | None:
    """Why the window cannot open here, or None. On Linux with neither ``DISPLAY`` nor
    ``WAYLAND_DISPLAY`` (an SSH session, a container) Qt aborts the process with a message
    that blames missing xcb packages, and the README's advice for that message is to
    install packages. ``QT_QPA_PLATFORM`` set (offscreen, vnc…) is the user's choice."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return None
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return None
    return ("no display to open the window on (DISPLAY and WAYLAND_DISPLAY are unset): run "
            "it in a desktop session or over 'ssh -X', or use the terminal tools "
            "('moescope chat', 'moescope serve'; 'moescope --help')")


def launch_gui(model: str | None = None) -> int:
    """Open the desktop window via ``moescope.gui.app.run_app()``, with ``model`` loaded
    when one is given (else the last model, else the demo model).

    The GUI is imported by name at call time so that importing the CLI (and every headless
    subcommand) never pulls in Qt; only the default, windowed entry point does.
    """
    reason = no_display()
    if reason is not None:
        print(f"moescope: error: {reason}", file=sys.stderr)
        return EXIT_USAGE
    try:
        run_app = importlib.import_module("moescope.gui.app").run_app
    except (ImportError, AttributeError) as err:
        print(
            f"moescope: error: the desktop window is not available ({err}); "
            f"try 'moescope --help' for the command-line tools",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return int((run_app(model=model) if model is not None else run_app()) or 0)


def self_test(timeout_s: float) -> int:
    """``moescope --self-test``: :func:`moescope.gui.self_test.run_self_test`, imported by
    name for the same reason as the window (no Qt for headless commands). Exit 1, not 2,
    when Qt itself is missing: that is a broken installation, not a usage mistake."""
    try:
        run = importlib.import_module("moescope.gui.self_test").run_self_test
    except (ImportError, AttributeError) as err:
        print(f"moescope self-test: FAILED: the desktop window is not available ({err})",
              file=sys.stderr)
        return 1
    return int(run(timeout_s, watchdog=True))

