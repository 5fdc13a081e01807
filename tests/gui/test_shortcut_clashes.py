"""No two controls of one window answer the same key, and Help ▸ Keyboard shortcuts lists
each key once, under the window it works in (new-user review, window rev 5: "Go to VRAM
budget" was listed twice, Alt+B and Alt+V; Alt+K for both "API key" and "Thinking"; Alt+A
for both "Go to Address" and "Answer now", which are in different windows, with nothing to
say so). The walk reads the real widgets, not the dialog's own rows."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import load
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (
    QAbstractButton,
    QGroupBox,
    QLabel,
    QMenu,
    QMenuBar,
    QTabBar,
    QWidget,
)


def mnemonic(text: str) -> str | None:
    """"Alt+X" for a text with an ``&X`` mark, else None."""
    plain = text.replace("&&", "")
    i = plain.find("&")
    return f"Alt+{plain[i + 1].upper()}" if 0 <= i < len(plain) - 1 else None


def window_keys(window: QWidget) -> dict[str, list[str]]:
    """Every key that acts in ``window`` (its own widgets, not another window's): the
    shortcuts of its actions and its menus' titles, the mnemonics of its buttons, tabs,
    group boxes and labels with a buddy; ``{key: [what, ...]}``."""
    keys: dict[str, list[str]] = defaultdict(list)

    def own(widget: QWidget) -> bool:
        return widget.window() is window

    actions = set(window.actions())
    for widget in [window, *window.findChildren(QWidget)]:
        if own(widget) and not isinstance(widget, QMenu):
            actions.update(widget.actions())
    for bar in window.findChildren(QMenuBar):
        if own(bar):
            for action in bar.actions():
                key = mnemonic(action.text())
                if key:
                    keys[key].append(f"menu {action.text()}")
                if action.menu() is not None:
                    actions.update(_menu_actions(action.menu()))
    for action in actions:
        for seq in action.shortcuts():
            keys[seq.toString(QKeySequence.SequenceFormat.PortableText)].append(
                f"action {action.text()}")
    for button in window.findChildren(QAbstractButton):
        if own(button) and (key := mnemonic(button.text())):
            keys[key].append(f"button {button.text()}")
    for box in window.findChildren(QGroupBox):
        if own(box) and (key := mnemonic(box.title())):
            keys[key].append(f"group {box.title()}")
    for tabs in window.findChildren(QTabBar):
        if own(tabs):
            for i in range(tabs.count()):
                if key := mnemonic(tabs.tabText(i)):
                    keys[key].append(f"tab {tabs.tabText(i)}")
    for label in window.findChildren(QLabel):
        if own(label) and label.buddy() is not None and (key := mnemonic(label.text())):
            keys[key].append(f"label {label.text()}")
    return keys


def _menu_actions(menu: QMenu) -> list[Any]:
    out = []
    for action in menu.actions():
        out.append(action)
        if action.menu() is not None:
            out.extend(_menu_actions(action.menu()))
    return out


def menu_clashes(menu: QMenu) -> list[tuple[str, list[str]]]:
    """Letters two items of one menu share (each menu, its submenus too)."""
    letters: dict[str, list[str]] = defaultdict(list)
    out = []
    for action in menu.actions():
        if not action.isSeparator() and (key := mnemonic(action.text())):
            letters[key].append(action.text())
        if action.menu() is not None:
            out.extend(menu_clashes(action.menu()))
    return out + [(k, v) for k, v in letters.items() if len(v) > 1]


@pytest.fixture
def window(make_window: Any, qtbot: Any, demo: Path) -> Any:
    w = make_window()
    load(qtbot, w, demo, budget="25%", policy="quality-first", n_ctx=512)
    return w


def _open_every_window(window: Any, demo: Path) -> list[QWidget]:
    """The main window and the windows a user opens from it: Serve API, Get models,
    Compare policies, Open model, Preferences (the dialogs built as their menu items
    build them, not run)."""
    from moescope.gui.dialogs.compare import CompareDialog
    from moescope.gui.dialogs.open_model import OpenModelDialog
    from moescope.gui.hub import show_get_models
    from moescope.gui.preferences import Preferences, PreferencesDialog
    from moescope.model.gguf_info import read_model_info

    window.serve.show_panel()
    hub = show_get_models(window)
    compare = CompareDialog(window.client, window.model,
                            [{"role": "user", "content": "Hi"}], parent=window)
    opener = OpenModelDialog(read_model_info(demo), parent=window)
    prefs = PreferencesDialog(Preferences(), lambda _p: None, parent=window)
    return [window, window.serve.panel, hub, compare, opener, prefs]


def test_no_window_has_two_controls_on_one_key(window: Any, demo: Path) -> None:
    """Alt+U moved the keyboard to the cache controls' RAM budget or pressed the chat
    settings' Use, whichever Qt chose; every other key of each window is its own."""
    found = {}
    for top in _open_every_window(window, demo):
        clashes = {k: v for k, v in window_keys(top).items() if len(v) > 1}
        if clashes:
            found[top.windowTitle()] = clashes
    assert found == {}
    keys = window_keys(window)
    assert keys["Alt+U"] == ["label RAM b&udget"]
    assert keys["Alt+A"] == ["button &Answer now"]
    assert keys["Alt+K"] == ["label Thin&king"]


def test_no_menu_has_two_items_on_one_letter(window: Any) -> None:
    found = []
    for bar in window.findChildren(QMenuBar):
        for action in bar.actions():
            if action.menu() is not None:
                found.extend(menu_clashes(action.menu()))
    assert found == []


def test_the_shortcuts_list_is_grouped_by_window_each_line_once(
        window: Any, qtbot: Any, demo: Path) -> None:
    """With the serve panel and Get models open, their keys are listed under their own
    titles, not among the main window's; no line is listed twice."""
    from moescope.gui.dialogs.shortcuts import sections

    others = _open_every_window(window, demo)[1:]
    dialog = window.show_shortcuts()
    qtbot.waitExposed(dialog)
    table = dialog.table
    groups: dict[str, list[tuple[str, str]]] = {}
    title = ""
    for r in range(table.rowCount()):
        if table.columnSpan(r, 0) == 2:
            title = table.item(r, 0).text()
            assert title not in groups  # each window once
            groups[title] = []
        else:
            groups[title].append((table.item(r, 0).text(), table.item(r, 1).text()))
    assert next(iter(groups)) == "Main window"
    for rows in groups.values():
        assert len(rows) == len(set(rows))  # no line twice
        assert len({what for what, _ in rows}) == len(rows)
    main = dict(groups["Main window"])
    assert main["Go to VRAM budget"] == "Alt+V" and main["Go to Thinking"] == "Alt+K"
    assert "Go to Address" not in main and "Go to API key" not in main
    serve = dict(groups[window.serve.panel.windowTitle()])
    assert serve["Go to Address"] == "Alt+A" and serve["Go to API key"] == "Alt+K"
    hub = dict(groups[others[1].windowTitle()])
    assert hub["Go to VRAM budget"] == "Alt+B"
    # the dialog shows what sections() gives, and every window with a key is there
    assert [t for t, _ in sections([], window)][1:] == list(groups)[1:]
    dialog.close()
