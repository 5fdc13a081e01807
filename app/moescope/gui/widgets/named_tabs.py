"""Tab widgets a screen reader can name: the widget, its tab bar and each tab.

A QTabWidget's tab bar is a widget of its own that takes the keyboard focus; without a
name a screen reader says just "tab bar" (or nothing) when it gets there.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtWidgets import QTabWidget


def name_tabs(tabs: QTabWidget, name: str, tips: Sequence[str]) -> None:
    """Names ``tabs`` and its tab bar after ``name``; each tab gets its title as its
    accessible name (without the & of its mnemonic) and the tooltip of ``tips`` where it
    has none yet (a tooltip set before, e.g. why a tab is off, stays)."""
    if len(tips) != tabs.count():
        raise ValueError(f"{name}: {len(tips)} tooltips for {tabs.count()} tabs")
    tabs.setAccessibleName(name)
    bar = tabs.tabBar()
    bar.setAccessibleName(f"{name} tabs")
    for i, tip in enumerate(tips):
        bar.setAccessibleTabName(i, tabs.tabText(i).replace("&&", "\0").replace(
            "&", "").replace("\0", "&"))
        if not tabs.tabToolTip(i):
            tabs.setTabToolTip(i, tip)
