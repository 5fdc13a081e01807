"""How an answer's reasoning appears in the transcript (the split is ``model.reasoning``).

A thinking model can spend hundreds of tokens before its answer. While it thinks, the
thoughts stream in muted text under a "Thinking…" line, so the user sees that the model
works (and can stop it); once the answer begins they fold into one line, "▸ Thought for
4.2 s", so the answer is what the eye lands on. The line is a link: clicking it unfolds the
thoughts of that message (the view renders it again; its key includes the state).
"""

from __future__ import annotations

from PySide6.QtGui import QColor, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument

from moescope.gui import theme

REASONING_SCHEME = "moescope"
"""Links ``moescope:reasoning/<message id>`` toggle a message's reasoning (never opened)."""


def reasoning_href(message_id: int) -> str:
    return f"{REASONING_SCHEME}:reasoning/{message_id}"


def message_id_of(href: str) -> int | None:
    """The message id of a reasoning toggle link, else None."""
    prefix = f"{REASONING_SCHEME}:reasoning/"
    if not href.startswith(prefix):
        return None
    try:
        return int(href[len(prefix):])
    except ValueError:
        return None


def header_text(*, expanded: bool, thinking: bool = False, seconds: float | None = None,
                tokens: int | None = None, cut_short: bool = False) -> str:
    """"Thinking…" while it streams, else "▸ Thought for 4.2 s · 312 tokens" (and "cut
    short" when "Answer now" ended the thoughts)."""
    if thinking:
        return "Thinking…"
    arrow = "▾" if expanded else "▸"
    parts = [f"Thought for {seconds:.1f} s" if seconds is not None else "Thoughts"]
    if tokens:
        parts.append(f"{tokens} tokens")
    if cut_short:
        parts.append("cut short")
    return f"{arrow} {' · '.join(parts)}"


def _header_format(href: str = "") -> QTextCharFormat:
    f = QTextCharFormat()
    f.setForeground(QColor(theme.MUTED))
    f.setFontItalic(True)
    if href:
        f.setAnchor(True)
        f.setAnchorHref(href)
        f.setToolTip("Show or hide what the model thought before answering")
    return f


def _body_format() -> QTextCharFormat:
    f = QTextCharFormat()
    f.setForeground(QColor(theme.MUTED))
    return f


def _block(left: float = 4) -> QTextBlockFormat:
    b = QTextBlockFormat()
    b.setTopMargin(2)
    b.setLeftMargin(left)
    b.setRightMargin(4)
    return b


def insert_reasoning(cursor: QTextCursor, reasoning: str, *, header: str, href: str = "",
                     expanded: bool = True) -> None:
    """The header line at ``cursor`` (a new block), then the thoughts when ``expanded``,
    as plain text: thoughts are drafts, not Markdown worth rendering."""
    cursor.insertBlock(_block(), _header_format(href))
    cursor.insertText(header)
    if expanded and reasoning:
        cursor.insertBlock(_block(14), _body_format())
        cursor.insertText(reasoning)


class LiveReasoning:
    """The streaming answer's thoughts: from ``start`` to the end of ``doc``.

    While the model thinks, new thoughts are appended (no re-layout of what is shown);
    :meth:`fold` replaces the region with the one-line summary when the answer begins.
    """

    def __init__(self, doc: QTextDocument, start: int) -> None:
        self.doc = doc
        self.start = start
        self.shown = ""
        self.folded = False
        cursor = QTextCursor(doc)
        cursor.setPosition(start)
        insert_reasoning(cursor, "", header=header_text(expanded=True, thinking=True))
        cursor.insertBlock(_block(14), _body_format())

    def update(self, reasoning: str) -> None:
        """Show ``reasoning`` (the whole text so far); appends what is new."""
        if self.folded or reasoning == self.shown:
            return
        cursor = QTextCursor(self.doc)
        if reasoning.startswith(self.shown):
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText(reasoning[len(self.shown):])
        else:  # the split changed what it shows (whitespace trimmed at the end)
            cursor.setPosition(self._body_start())
            cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
            cursor.insertText(reasoning)
        self.shown = reasoning

    def _body_start(self) -> int:
        block = self.doc.findBlock(self.start).next().next()  # header, then the body
        return block.position()

    def fold(self, seconds: float, *, keep: bool = True) -> int:
        """Collapse to "▸ Thought for …" (``keep`` False: there were no thoughts, as when
        a harmony answer opens straight on its final channel; remove the region);
        returns where the answer continues."""
        cursor = QTextCursor(self.doc)
        cursor.setPosition(self.start)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        if keep:
            insert_reasoning(cursor, "", header=header_text(expanded=False, seconds=seconds),
                             expanded=False)
        self.folded = True
        return cursor.position()
