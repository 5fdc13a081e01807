"""The window with a model file whose name is not UTF-8 (byte 0xff; Python holds it as a
lone surrogate): ``moescope NAME`` segfaulted in ``QApplication(sys.argv)``; the model's
settings key could not be hashed; QSettings dropped the byte from the remembered path (the
last model was then "no longer there"); Qt shows no such name (a drop names it with
U+FFFD)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import LONG_SEED, load, send

from moescope.gui.app import qt_arguments
from moescope.gui.model_loading import found_on_disk, path_setting, setting_path
from moescope.trace import read_trace
from moescope.trace.names import live_trace_file
from moescope.util.resources import demo_model_path

HERE = Path(__file__).parent
ESCAPED = "demo-\\xff.gguf"
CHILD_TIMEOUT_S = 120


@pytest.fixture
def odd(tmp_path: Path) -> Path:
    """The demo model copied under a name with the byte 0xff."""
    demo = demo_model_path()
    if demo is None:
        pytest.skip("this checkout has no demo model")
    path = tmp_path / "models" / os.fsdecode(b"demo-\xff.gguf")
    path.parent.mkdir()
    shutil.copyfile(demo, path)
    return path


def test_moescope_name_starts_loads_chats_and_remembers_it(
        odd: Path, data_dir: Path, make_window: Any, qtbot: Any) -> None:
    """``moescope NAME`` as a user types it, in its own process (the Qt application is
    made once per process); then a second window, on the same data folder, finds it as
    the last and recent model and opens it again."""
    env = dict(os.environ, MOESCOPE_DATA_DIR=str(data_dir), QT_QPA_PLATFORM="offscreen",
               OPENBLAS_NUM_THREADS="1")
    child = subprocess.run([sys.executable, str(HERE / "window_child.py"),
                            os.fsencode(odd)], env=env, capture_output=True,
                           timeout=CHILD_TIMEOUT_S)
    assert child.returncode == 0, (child.returncode,
                                   child.stderr.decode(errors="replace")[-2000:])
    seen = json.loads(child.stdout.decode().strip().splitlines()[-1])
    assert bytes.fromhex(seen["path"]) == os.fsencode(odd)
    assert seen["recent"] == [ESCAPED]  # File ▸ Open recent, the byte written out
    assert seen["sent"] and seen["tokens"] == seen["streamed"] > 0 and seen["answer"]
    recorded = read_trace(os.fsdecode(bytes.fromhex(seen["trace"])))
    assert recorded.header.model.file_name == ESCAPED
    assert len(recorded.tokens) >= seen["tokens"]
    settings = (data_dir / "settings.ini").read_bytes()
    assert b"last_model=@ByteArray(" + os.fsencode(odd).replace(b"\xff", b"\\xff") \
        in settings

    again = make_window()
    assert again.last_model() == str(odd)
    assert again.recent_models() == [str(odd)]
    with qtbot.waitSignal(again.modelLoaded, timeout=30_000) as blocker:
        assert again.autoload()
    assert blocker.args[0].path == str(odd)
    assert again.statusBar().currentMessage() == ""  # not "no longer there"


def test_the_window_loads_it_and_an_answer_streams(odd: Path, make_window: Any,
                                                   qtbot: Any) -> None:
    w = make_window()
    summary = load(qtbot, w, odd)
    assert summary.path == str(odd)
    w.chat_settings.seed.setValue(LONG_SEED)  # a random one may end the answer at once
    answer = send(qtbot, w, "Hello there", max_tokens=6)
    assert answer.n_tokens > 0 and w.chat.tokens_received == answer.n_tokens
    assert w.store.messages(w.chat.chat_id)[-1].content
    assert [a.text() for a in w.recent_menu.actions()] == [ESCAPED]
    assert w.recent_menu.actions()[0].statusTip() == str(odd.parent / ESCAPED)
    if w.trace_path is not None:  # the session's recording (on by default)
        live = live_trace_file(w.trace_path)
        assert live is not None
        assert read_trace(live).header.model.file_name == ESCAPED


def test_a_recent_models_entry_round_trips(odd: Path, make_window: Any) -> None:
    w = make_window()
    plain = str(odd.with_name("plain.gguf"))
    w._remember_model(plain)
    w._remember_model(str(odd))
    w.settings.sync()
    from PySide6.QtCore import QSettings

    reread = QSettings(w.settings.fileName(), QSettings.Format.IniFormat)
    w.settings = reread
    assert w.recent_models() == [str(odd), plain]
    assert w.last_model() == str(odd)
    w._remember_model(str(odd))  # again: one entry, not two
    assert w.recent_models() == [str(odd), plain]


def test_settings_values() -> None:
    odd = os.fsdecode(b"/m/demo-\xff.gguf")
    assert path_setting("/m/café.gguf") == "/m/café.gguf"  # UTF-8: text, as before
    assert setting_path(path_setting(odd)) == odd
    assert setting_path("/m/a.gguf") == "/m/a.gguf"
    assert setting_path(None) == setting_path(3) == setting_path(b"") == ""


def test_qt_gets_utf8_arguments() -> None:
    argv = ["moescope", os.fsdecode(b"/m/demo-\xff.gguf"), "-platform", "offscreen", "é"]
    given = qt_arguments(argv)
    assert given == ["moescope", "/m/" + ESCAPED, "-platform", "offscreen", "é"]
    for arg in given:
        arg.encode("utf-8")  # strict


def test_a_name_qt_gives_with_ufffd_is_the_file_on_disk(
        odd: Path, make_window: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Qt's file dialog does not list such a file at all (QDir leaves out a name it cannot
    decode); a drop from a file manager gives the URL's %FF as U+FFFD."""
    from PySide6.QtCore import QDir, QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDropEvent

    assert QDir(str(odd.parent)).entryList(QDir.Filter.Files) == []
    url = QUrl("file://" + str(odd.parent) + "/demo-%FF.gguf")
    from_qt = url.toLocalFile()
    assert from_qt == str(odd.parent / "demo-\ufffd.gguf")
    assert found_on_disk(from_qt) == str(odd)
    assert found_on_disk(str(odd)) == str(odd)

    w = make_window()
    opened: list[str] = []
    monkeypatch.setattr(w, "prepare_open", lambda path: opened.append(path))
    data = QMimeData()
    data.setUrls([url])
    w.dropEvent(QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, data,
                           Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier))
    assert opened == [str(odd)]

    # two names Qt writes alike: which one is meant is not guessed (the open then says
    # in one line that there is no such file)
    shutil.copyfile(odd, odd.parent / os.fsdecode(b"demo-\xfe.gguf"))
    assert found_on_disk(from_qt) == from_qt
