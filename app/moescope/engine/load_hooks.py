"""What MoEScope hooks into llama.cpp while a model loads.

llama-cpp-python's ``Llama()`` is one blocking call that says little: it turns every
failure into "Failed to load model from file", sends llama.cpp's log (which says why) to
/dev/null, reports no progress, and cannot be stopped. Loading an 80B model into pinned
memory takes minutes, so a user must see it advance and be able to cancel it (or close
the window) without waiting. These hooks recover each of those from llama.cpp's own C
interface, for the duration of one load.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from moescope.util.errors import MoEScopeError


class LoadCancelled(MoEScopeError):
    """The load was cancelled (``Engine.cancel_load``); nothing is loaded."""


@contextlib.contextmanager
def load_progress(report: Callable[[float], None], cancel: threading.Event
                  ) -> Iterator[None]:
    """During the ``Llama()`` call in this block: llama.cpp's own loading progress goes to
    ``report`` (0..1, as it reads the tensors), and ``cancel`` being set aborts the load
    at its next progress step (llama.cpp frees what it had; ``Llama()`` then raises).

    llama-cpp-python has no argument for ``progress_callback``, so the model params are
    given one just before ``llama_model_load_from_file`` (the way bench/gpu_check.py sets
    ``-ot``'s tensor overrides).
    """
    from llama_cpp import llama_cpp as low

    interrupted = threading.Event()

    def on_progress(fraction: float, _user_data: Any) -> bool:
        try:  # nothing may raise into C: ctypes would print it and carry on
            report(float(fraction))
            return not cancel.is_set()
        except KeyboardInterrupt:  # Ctrl+C in a terminal: end the load, then say so
            interrupted.set()
            return False
        except Exception:
            return not cancel.is_set()

    callback = low.llama_progress_callback(on_progress)  # referenced until the load ends
    original = low.llama_model_load_from_file

    def load(path_model: bytes, params: Any) -> Any:
        params.progress_callback = callback
        params.progress_callback_user_data = None
        return original(path_model, params)

    low.llama_model_load_from_file = load
    try:
        yield
    except BaseException:
        if interrupted.is_set():  # the load failed because Ctrl+C stopped it
            raise KeyboardInterrupt from None
        raise
    finally:
        low.llama_model_load_from_file = original
    if interrupted.is_set():  # Ctrl+C during the last step: the load finished anyway
        raise KeyboardInterrupt


def first_line(err: BaseException) -> str:
    """The first line of an exception's text (or its type), short enough for one line."""
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:200]


def is_template_error(err: BaseException) -> bool:
    """A Jinja error raised while llama-cpp-python compiles the GGUF's chat template."""
    try:
        from jinja2 import TemplateError
    except ImportError:  # pragma: no cover - llama_cpp depends on jinja2
        return False
    return isinstance(err, TemplateError)


_ERROR_LEVEL = 4  # GGML_LOG_LEVEL_ERROR in ggml.h (llama_cpp._logger still says 3)
_CONT_LEVEL = 5  # GGML_LOG_LEVEL_CONT: continues the previous message
_GENERIC_ERRORS = ("failed to load model", "failed to create llama_context")


@contextlib.contextmanager
def llama_errors() -> Iterator[list[str]]:
    """Collect llama.cpp's error-level log lines while loading.

    llama-cpp-python turns every load failure into "Failed to load model from file" and
    sends llama.cpp's log (which says why: an unknown architecture, a tensor of the wrong
    shape, a buffer that could not be allocated) to /dev/null. A log callback of our own
    keeps the error lines for the message; everything is still passed on to
    llama-cpp-python's callback, so ``MOESCOPE_DEBUG`` shows the same log as before.
    """
    import llama_cpp
    from llama_cpp import _logger

    errors: list[str] = []
    previous = _logger.llama_log_callback
    last = [0]

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator,misc]
    def collect(level: int, text: bytes, user_data: Any) -> None:
        if level == _ERROR_LEVEL or (level == _CONT_LEVEL and last[0] == _ERROR_LEVEL):
            line = text.decode("utf-8", errors="replace").strip()
            if line:
                errors.append(line)
        if level != _CONT_LEVEL:
            last[0] = level
        previous(level, text, user_data)

    llama_cpp.llama_log_set(collect, ctypes.c_void_p(0))
    try:
        yield errors
    finally:
        llama_cpp.llama_log_set(previous, ctypes.c_void_p(0))


def load_message(path: Path, n_ctx: int, error: str, log: Sequence[str]) -> str:
    """One sentence on why llama.cpp refused ``path``: its own first specific error line
    (minus the function names it prefixes), and what to try for a context that did not
    fit in memory."""
    reasons = [line for line in log
               if not any(line.lower().endswith(g) for g in _GENERIC_ERRORS)]
    reason = reasons[0] if reasons else error
    for prefix in ("llama_model_load: error loading model: ",):
        reason = reason.removeprefix(prefix)
    reason = reason[:300]
    if "llama_context" in error:
        return (f"llama.cpp could not create a context of {n_ctx} tokens for {path.name} "
                f"({reason}); try a smaller context")
    return f"llama.cpp could not load {path.name}: {reason}"


_abort_hook: Any = None
_loading_file: list[str] = []
"""The model file llama.cpp is reading right now (for the abort message), if any."""


@contextlib.contextmanager
def loading(path: Path) -> Iterator[None]:
    """Mark ``path`` as being loaded, so a failed check names it and blames the file."""
    _loading_file.append(path.name)
    try:
        yield
    finally:
        _loading_file.pop()


def report_native_aborts() -> None:
    """Have llama.cpp's failed internal checks (``GGML_ASSERT``) say what failed.

    Such a check ends the process (ggml calls ``abort``), and it comes from a model file
    whose numbers disagree with each other (a duplicated vocabulary entry, say) more
    often than from a bug. ggml prints its message to stderr, which is /dev/null while a
    model loads, so the process died without a word. This hook writes one line to the
    process's original stderr first; the process still ends (nothing can resume after a
    failed check), but the user learns which check, and, during a load, which file.
    """
    global _abort_hook
    if _abort_hook is not None:
        return
    try:
        from llama_cpp import _ggml

        setter = _ggml.libggml.ggml_set_abort_callback
        fd = os.dup(2)  # stderr as it is now, before any load redirects it
    except (ImportError, AttributeError, OSError):  # an older ggml: keep its own message
        return
    callback_type = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
    once = threading.Lock()  # several ggml threads may fail the same check at once

    def on_abort(message: bytes | None) -> None:
        if not once.acquire(blocking=False):
            return
        text = (message or b"").decode("utf-8", errors="replace").strip()
        if _loading_file:
            why = (f"while loading {_loading_file[-1]}; the file is probably corrupt or made "
                   f"for another llama.cpp version")
        else:
            why = "; please report this as a MoEScope bug, with the model and what you did"
        with contextlib.suppress(OSError):
            os.write(fd, f"moescope: fatal: llama.cpp stopped on a failed internal check "
                         f"({text}) {why}\n".encode())

    _abort_hook = callback_type(on_abort)  # kept referenced: ggml holds a raw pointer
    setter.restype = ctypes.c_void_p
    setter.argtypes = [callback_type]
    setter(_abort_hook)
