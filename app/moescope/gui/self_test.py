"""``moescope --self-test``: prove that this installation's window works, end to end.

A packaged build (``make dist``) can import fine and still fail once a window opens: a
missing Qt platform plugin, the engine's shared libraries not next to ``llama_cpp``, the
demo model not bundled, Pygments' lexers (imported by name at run time) left out. Each
of those only shows when the real thing runs, so this does the real thing, headless:

1. open the real main window (``QT_QPA_PLATFORM=offscreen`` unless the caller chose a
   platform, e.g. ``xcb`` under Xvfb to check the X11 plugin), and check that the style
   sheet was applied and the SVG window icon renders (Qt's SVG plugins are bundled);
2. load the demo model through the real worker thread and engine;
3. send a message and wait for the answer's tokens (a few, seeded);
4. render a Markdown answer with ``python``, ``js`` and ``bash`` code blocks the way the
   chat view does and check each gets syntax colours;
5. print one ``moescope self-test: OK ...`` line and return 0, or one ``FAILED`` line that
   says which step broke and return 1. A step that never finishes fails at the timeout.

Chats and settings go to a temporary data directory, so the user's profile is never
touched. Tests run it too (``tests/gui/test_self_test.py``), so it cannot rot between
releases.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import (
    QEventLoop,
    QMessageLogContext,
    QTimer,
    QtMsgType,
    qInstallMessageHandler,
)
from PySide6.QtGui import QTextDocument, QTextFormat
from PySide6.QtWidgets import QApplication

from moescope.gui.app import create_app
from moescope.gui.chat.highlight import lexer_for
from moescope.gui.chat.markdown import is_code_block, render_markdown
from moescope.gui.main_window import MainWindow
from moescope.gui.theme import style_sheet_path
from moescope.gui.worker import LoadRequest
from moescope.session.snapshots import AnswerSummary, ModelSummary
from moescope.util import paths
from moescope.util.resources import demo_model_path, frozen_base, resources_dir

DEFAULT_TIMEOUT_S = 120.0
"""Generous: the demo model loads and answers in about a second, but a cold start of a
frozen bundle on a slow disk unpacks nothing yet still reads ~200 MB of libraries."""
WATCHDOG_GRACE_S = 30.0
"""After the timeout, how long the event loop gets to report it before a watchdog thread
dumps every thread's stack and ends the process (the GUI thread itself may be stuck)."""
PROMPT = "Say hello"
TOKENS = 8
SEED = 3
BUDGET = "25%"
POLICY = "quality-first"
CODE_SAMPLES: dict[str, str] = {
    "python": "def slots(budget: int) -> int:\n    return budget // 2  # half",
    "js": "const x = 'a'; // note\nfunction f() { return 1; }",
    "bash": 'for f in *.txt; do\n  echo "$f"  # note\ndone',
}
"""Fence languages whose lexers Pygments imports by name: the ones a frozen app most
likely lacks when ``pygments.lexers`` was not collected."""
MIN_COLOURS = 2
OFFSCREEN_NOISE = "This plugin does not support propagateSizeHints()"
"""What the offscreen platform says for every top-level window: harmless, not a finding,
and it would bury the one result line."""


class SelfTestError(Exception):
    """A step failed; the message says which and why (one line for the terminal)."""


@dataclass
class Outcome:
    """What the steps found, for the summary line."""

    resources: str = ""
    model: ModelSummary | None = None
    answer: AnswerSummary | None = None
    colours: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


class SelfTestWindow(MainWindow):
    """The real window, except that an error fails the test instead of opening a modal
    dialog that nobody can close offscreen (and that would hang until the timeout)."""

    def __init__(self) -> None:
        self.errors: list[str] = []  # before MainWindow.__init__, which may report
        self.warnings: list[str] = []
        super().__init__()

    def show_error(self, title: str, message: str) -> None:
        self.errors.append(f"{title}: {message}")

    def show_warning(self, title: str, message: str) -> None:
        self.warnings.append(f"{title}: {message}")


def code_colours(doc: QTextDocument) -> int:
    """How many distinct foreground colours the document's code blocks have."""
    colours: set[str] = set()
    block = doc.begin()
    while block.isValid():
        if is_code_block(block):
            it = block.begin()
            while not it.atEnd():
                fmt = it.fragment().charFormat()
                if fmt.hasProperty(QTextFormat.Property.ForegroundBrush):
                    colours.add(fmt.foreground().color().name())
                it += 1
        block = block.next()
    return len(colours)


def check_resources(app: QApplication) -> str:
    """The style sheet is applied and the window icon renders; raises otherwise."""
    if style_sheet_path() is None or not app.styleSheet():
        raise SelfTestError(f"resources: no style sheet (style.qss) in {resources_dir()}")
    if app.windowIcon().pixmap(32, 32).isNull():
        raise SelfTestError("resources: the window icon does not render (icons/moescope.svg "
                            "or Qt's SVG icon plugin missing)")
    return "style sheet + SVG icon"


def check_code_colours() -> dict[str, int]:
    """Colours per fence language in a rendered Markdown answer; raises when one is plain."""
    found: dict[str, int] = {}
    for language, code in CODE_SAMPLES.items():
        if lexer_for(language) is None:
            raise SelfTestError(f"syntax colours: Pygments has no lexer for {language!r} "
                                "(pygments.lexers missing from this build?)")
        doc = render_markdown(f"Here it is:\n\n```{language}\n{code}\n```\n\nDone.")
        found[language] = code_colours(doc)
        if found[language] < MIN_COLOURS:
            raise SelfTestError(f"syntax colours: a {language} code block got "
                                f"{found[language]} colour(s), expected {MIN_COLOURS}+")
    return found


@contextmanager
def temporary_data_dir() -> Iterator[Path]:
    """``MOESCOPE_DATA_DIR`` in a fresh temporary folder for the duration, then restored."""
    before = os.environ.get(paths.ENV_DATA_DIR)
    with tempfile.TemporaryDirectory(prefix="moescope-self-test-") as tmp:
        os.environ[paths.ENV_DATA_DIR] = tmp
        try:
            yield Path(tmp)
        finally:
            if before is None:
                os.environ.pop(paths.ENV_DATA_DIR, None)
            else:
                os.environ[paths.ENV_DATA_DIR] = before


@contextmanager
def quiet_offscreen() -> Iterator[None]:
    """Qt's messages go to stderr as usual, less :data:`OFFSCREEN_NOISE`."""

    def handler(kind: QtMsgType, context: QMessageLogContext, message: str) -> None:
        if message != OFFSCREEN_NOISE:
            (previous or _to_stderr)(kind, context, message)

    previous = qInstallMessageHandler(handler)
    try:
        yield
    finally:
        qInstallMessageHandler(previous)


def _to_stderr(_kind: QtMsgType, _context: QMessageLogContext, message: str) -> None:
    print(message, file=sys.stderr)


def run_self_test(timeout_s: float = DEFAULT_TIMEOUT_S, model: Path | None = None, *,
                  watchdog: bool = False) -> int:
    """Run the steps in the module docstring; print the result line, return 0 or 1.

    ``watchdog``: also arm a thread that ends the process if even the timeout cannot be
    reported (the CLI sets it; tests leave it off, pytest-timeout covers them).
    """
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    started = time.perf_counter()
    if watchdog:
        faulthandler.dump_traceback_later(timeout_s + WATCHDOG_GRACE_S, exit=True)
    try:
        outcome = _run(timeout_s, model)
    except SelfTestError as err:
        print(f"moescope self-test: FAILED: {err}", file=sys.stderr)
        return 1
    finally:
        if watchdog:
            faulthandler.cancel_dump_traceback_later()
    print(summary_line(outcome, time.perf_counter() - started))
    return 0


def summary_line(outcome: Outcome, seconds: float) -> str:
    """``moescope self-test: OK | ...``: every step's evidence on one line."""
    m, a = outcome.model, outcome.answer
    assert m is not None and a is not None
    cache = (f"{m.policy} @ {m.slots_per_layer}/{m.n_expert} slots" if m.cache_enabled
             else "cache off")
    colours = ", ".join(f"{lang} {n}" for lang, n in outcome.colours.items())
    where = "frozen bundle" if frozen_base() is not None else "source"
    notes = f" | {len(outcome.warnings)} warning(s)" if outcome.warnings else ""
    return (f"moescope self-test: OK | {where}, Qt platform "
            f"{os.environ.get('QT_QPA_PLATFORM', '?')} | {outcome.resources} | "
            f"{Path(m.path).name} ({cache}) | "
            f"{a.n_tokens} tokens at {a.tokens_per_second:.0f} tok/s via the worker | "
            f"code colours: {colours} | {seconds:.1f} s{notes}")


def _run(timeout_s: float, model: Path | None) -> Outcome:
    path = model or demo_model_path()
    if path is None or not Path(path).is_file():
        raise SelfTestError(f"no model: {path or 'no demo model in resources/models/'}")
    with temporary_data_dir(), quiet_offscreen():
        app = create_app([sys.argv[0] if sys.argv else "moescope"])
        window = SelfTestWindow()
        try:
            window.show()
            resources = check_resources(app)
            outcome = _drive(window, Path(path), timeout_s)
            outcome.resources = resources
            return outcome
        finally:
            window.close()  # stops the worker thread and frees the engine


def _drive(window: SelfTestWindow, model: Path, timeout_s: float) -> Outcome:
    """Load, ask, check; every step is started by the signal that ends the previous one."""
    outcome = Outcome(warnings=window.warnings)
    loop = QEventLoop()
    state = {"step": "loading the model", "error": ""}

    def over() -> bool:
        """After a failure or success: late signals (the window's close delivers the
        stopped answer's) must neither fail a passed test nor start another step."""
        return bool(state["error"]) or state["step"] == "done"

    def fail(message: str) -> None:
        if not over():
            state["error"] = message
            loop.exit(1)

    def loaded(summary: ModelSummary) -> None:
        if over():
            return
        outcome.model = summary
        state["step"] = "generating"
        window.chat_settings.max_tokens.setValue(TOKENS)
        window.chat_settings.seed.setValue(SEED)
        if not window.chat.send(PROMPT):
            fail("generating: the chat did not accept the message")

    def answered(summary: AnswerSummary) -> None:
        if over():
            return
        outcome.answer = summary
        if summary.stop_reason == "error" or summary.n_tokens < 1:
            fail(f"generating: {summary.n_tokens} tokens, stop: {summary.stop_reason}")
            return
        messages = window.store.messages(window.chat.chat_id or -1)
        if not messages or messages[-1].role != "assistant" or not messages[-1].content:
            fail("generating: the answer was not stored")
            return
        state["step"] = "checking syntax colours"
        try:
            outcome.colours = check_code_colours()
        except SelfTestError as err:
            fail(str(err))
            return
        state["step"] = "done"
        loop.exit(0)

    def check_errors() -> None:
        if window.errors:
            fail(f"{state['step']}: {window.errors[0]}")

    window.modelLoaded.connect(loaded)
    window.modelFailed.connect(lambda message: fail(f"loading {model.name}: {message}"))
    window.chat.answerFinished.connect(answered)
    errors = QTimer(window)
    errors.timeout.connect(check_errors)
    errors.start(50)
    timer = QTimer(window)
    timer.setSingleShot(True)
    timer.timeout.connect(lambda: fail(f"timed out after {timeout_s:g} s while "
                                       f"{state['step']}"))
    timer.start(int(timeout_s * 1000))
    if not window.load_model(LoadRequest(str(model), budget=BUDGET, policy=POLICY,
                                         n_ctx=512)):
        raise SelfTestError(f"loading {model.name}: the window refused to start a load")
    code = loop.exec()
    timer.stop()
    errors.stop()
    if code != 0 or state["error"]:
        raise SelfTestError(state["error"] or f"{state['step']}: event loop ended ({code})")
    return outcome
