"""The Logs tab: long lines appended while it is hidden (the startup's, a leftover trace
finished) must not leave it scrolled to their far right when it is first shown."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QLabel, QTabWidget

from moescope.gui.widgets.logs_view import LogsView


def test_the_logs_open_at_the_left_edge_and_the_newest_line(qtbot: Any) -> None:
    tabs = QTabWidget()
    qtbot.addWidget(tabs)
    tabs.resize(400, 200)
    tabs.addTab(QLabel("cache"), "Cache")
    view = LogsView()
    tabs.addTab(view, "Logs")
    tabs.show()
    for i in range(40):
        view.append_line(f"21:15:{i:02d} INFO    moescope.trace: " + "long " * 60)
    tabs.setCurrentWidget(view)
    qtbot.wait(20)
    across, down = view.horizontalScrollBar(), view.verticalScrollBar()

    def newest_in_view() -> bool:
        return view.cursorRect().top() >= 0 and \
            view.cursorRect().bottom() <= view.viewport().height()

    assert across.maximum() > 0 and across.value() == 0  # the time stamps in view
    assert down.value() > 0 and newest_in_view()
    view.append_line("21:16:00 INFO    moescope.gui: " + "more " * 60)
    qtbot.wait(20)
    assert across.value() == 0 and newest_in_view()
    assert view.textCursor().block().text().startswith("21:16:00")
