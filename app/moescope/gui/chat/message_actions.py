"""The links on each message's header line: Copy, Edit (your messages) and Branch.

The transcript is one ``QTextBrowser`` document (no widget per message, so a long chat
stays one cheap document), so a message's buttons are links in its header line, as the
reasoning toggle is: ``moescope:copy/3`` acts on the fourth message shown. Copy gives the
message's source (the model's Markdown, without its thoughts; your text as typed); Edit puts
one of your messages back in the box, and sending replaces it and everything after it;
Branch starts a new chat holding the conversation up to that message.
"""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor

from moescope.gui import theme

SCHEME = "moescope"
COPY, EDIT, BRANCH = "copy", "edit", "branch"
ACTIONS = {"user": (COPY, EDIT, BRANCH), "assistant": (COPY, BRANCH)}
"""The links each role's header gets (an answer is regenerated, not edited)."""
LABELS = {COPY: "Copy", EDIT: "Edit", BRANCH: "Branch"}
TIPS = {
    COPY: "Copy this message's text (an answer's Markdown source, without its thinking)",
    EDIT: "Edit this message: sending it again replaces it and every message after it",
    BRANCH: "Start a new chat with the conversation up to this message (this one is kept)",
}


def action_href(action: str, index: int) -> str:
    return f"{SCHEME}:{action}/{index}"


def action_of(href: str) -> tuple[str, int] | None:
    """(action, message index) of a message link, else None."""
    scheme, _, rest = href.partition(":")
    action, _, index = rest.partition("/")
    if scheme != SCHEME or action not in LABELS or not index.isdigit():
        return None
    return action, int(index)


def _link_format(action: str, index: int) -> QTextCharFormat:
    f = QTextCharFormat()
    f.setForeground(QColor(theme.MUTED))
    f.setFontWeight(QFont.Weight.Normal)
    f.setFontPointSize(theme.SMALL_PT + 0.5)
    f.setAnchor(True)
    f.setAnchorHref(action_href(action, index))
    f.setToolTip(TIPS[action])
    return f


def insert_actions(cursor: QTextCursor, role: str, index: int) -> None:
    """The role's links after its name on the header line at ``cursor``."""
    actions = ACTIONS.get(role, ())
    if not actions:
        return
    gap = QTextCharFormat()
    gap.setFontWeight(QFont.Weight.Normal)
    gap.setForeground(QColor(theme.MUTED))
    gap.setFontPointSize(theme.SMALL_PT + 0.5)
    cursor.insertText("    ", gap)
    for i, action in enumerate(actions):
        if i:
            cursor.insertText("  ·  ", gap)
        cursor.insertText(LABELS[action], _link_format(action, index))
