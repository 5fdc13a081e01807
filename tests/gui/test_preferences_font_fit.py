"""Preferences grows with a larger font applied from it (Apply): every row, the wrapped
note under the folders included, keeps the height it needs (new-user review: at 12 pt on
1366x768 the note was cut off under the Data folder row until the dialog was reopened)."""

from __future__ import annotations

from typing import Any

from moescope.gui.preferences.dialog import PreferencesDialog


def test_applying_a_larger_font_keeps_every_row_whole(make_window: Any, font_pt: Any,
                                                     qtbot: Any) -> None:
    window = make_window()
    window.resize(1366, 768)
    font_pt(window, 9)
    dialog = window.show_preferences()
    assert isinstance(dialog, PreferencesDialog)
    qtbot.waitExposed(dialog)
    before = dialog.height()
    dialog.font_pt.setValue(14)
    dialog.apply_button.click()
    note = dialog.profile_note
    layout = dialog.layout()
    qtbot.waitUntil(lambda: dialog.height() >= layout.totalHeightForWidth(dialog.width()),
                    timeout=5_000)
    assert dialog.height() > before
    # the note has the lines its text needs at its width, and lies inside the dialog
    assert note.height() >= note.heightForWidth(note.width())
    bottom = note.mapTo(dialog, note.rect().bottomLeft()).y()
    assert bottom <= dialog.height()
    dialog.close()
