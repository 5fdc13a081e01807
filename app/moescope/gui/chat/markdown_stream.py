"""A streaming answer rendered as Markdown at the end of the transcript, cheaply.

Markdown cannot be appended token by token (a ``*`` may open emphasis, a line of ``|`` may
become a table once the next line arrives), so the answer's region is parsed again when the
view flushes. To keep that cost flat however long the answer grows, the text is split at
the last point where what came before can no longer change: a blank line outside a code
fence followed by a line that starts a new top-level block (not indented, not a list
item). Everything before it is rendered once and frozen; only the tail after it is parsed
again. An unfinished code fence stays in the tail, where md4c renders it as a code block
running to the end of the answer, so it never swallows text outside the answer.

Code blocks are syntax-coloured once they are closed: a block in the frozen part is
coloured once, when it is frozen; a closed block still in the tail reuses its first lexing
(:func:`highlight.highlight_runs` is cached); the block of a fence still open at the end
stays plain until its closing fence arrives, so a long block streaming in is not lexed
again at every frame.

When the answer ends the view renders it again as a whole, so rare constructs that look
across a freeze point (a link whose reference definition comes later) come out right.
"""

from __future__ import annotations

import re

from PySide6.QtGui import QTextCursor, QTextDocument

from moescope.gui.chat.markdown import markdown_fragment

_FENCE = re.compile(r"[ \t]*(`{3,}|~{3,})(.*)")
_LIST_ITEM = re.compile(r"(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)")
_DIGITS = re.compile(r"\d{1,9}")


def _starts_block(line: str, complete: bool, in_list: bool) -> bool:
    """True when ``line``, after a blank line, surely starts a new top-level block."""
    if line[0] in " \t":
        return False  # a list item's continuation or an indented code block
    if _LIST_ITEM.match(line):
        return not in_list  # a new list, or the next item of a list that may be loose
    return complete or not _DIGITS.fullmatch(line)  # "12" may still become "12. item"


def _next_fence(fence: str, line: str) -> str:
    """The code fence open after ``line`` ("" for none), given ``fence``, the one before."""
    match = _FENCE.fullmatch(line)
    if fence:
        closes = (match is not None and match.group(1)[0] == fence[0]
                  and len(match.group(1)) >= len(fence) and not match.group(2).strip())
        return "" if closes else fence
    if match and not (match.group(1)[0] == "`" and "`" in match.group(2)):
        return match.group(1)
    return ""


def stable_length(text: str) -> int:
    """How many leading characters of a growing answer can be rendered for good."""
    return _scan(text)[0]


def _scan(text: str) -> tuple[int, bool]:
    """:func:`stable_length`, and whether ``text`` ends inside an open code fence.

    The last line counts for the fence even when unfinished: a closing fence that md4c
    already closes there is taken as closed (the block is then coloured, as the final render
    will colour it); should more characters turn it into a code line, the block is simply
    plain again at the next render.
    """
    stable = 0
    position = 0
    fence = ""  # the opening run while inside a fenced code block
    after_blank = False
    in_list = False  # a top-level list has started and nothing has ended it yet
    lines = text.split("\n")
    for number, line in enumerate(lines):
        start, position = position, position + len(line) + 1
        complete = number < len(lines) - 1
        if (not fence and after_blank and line.strip()
                and _starts_block(line, complete, in_list)):
            stable = start
        if not complete:
            fence = _next_fence(fence, line)
            break
        if fence:
            fence = _next_fence(fence, line)
            after_blank = not fence  # a closed code block cannot be continued
            continue
        if line[:1] not in ("", " ", "\t"):  # a top-level line: a list starts or ends here
            if _LIST_ITEM.match(line):
                in_list = True
            elif after_blank:
                in_list = False
        fence = _next_fence(fence, line)
        after_blank = not fence and not line.strip()
    return stable, bool(fence)


class LiveMarkdown:
    """The streaming answer's region: from ``start`` (the end of its header line) to the end
    of ``doc``. Call :meth:`update` with the whole text so far."""

    def __init__(self, doc: QTextDocument, start: int) -> None:
        self.doc = doc
        self.text = ""
        self.frozen = 0
        """Characters of :attr:`text` rendered for good."""
        self.tail_start = start
        """Document position where the re-rendered tail begins."""

    def update(self, text: str) -> None:
        """Render ``text`` (the previous text plus what streamed in since)."""
        self.text = text
        stable, open_fence = _scan(text[self.frozen:])
        cut = self.frozen + stable
        cursor = QTextCursor(self.doc)
        cursor.beginEditBlock()  # one layout pass, one repaint: no flicker
        cursor.setPosition(self.tail_start)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        if cut > self.frozen:
            cursor.insertFragment(markdown_fragment(text[self.frozen:cut]))
            self.frozen = cut
            self.tail_start = cursor.position()
        tail = text[cut:]
        if tail.strip():
            # an open fence never precedes the cut, so it is the tail's, and its last block
            cursor.insertFragment(markdown_fragment(tail, open_fence=open_fence))
        cursor.endEditBlock()
