"""Assistant answers as Markdown: Qt's own parser (md4c), then a pass that fits the dark chat.

Why Qt's parser and not a Markdown package: it is already here (no new dependency), it
builds a ``QTextDocument`` directly (no HTML round trip) and it runs in C++, a few ms for a
long answer. What it produces is restyled here: code blocks go into a padded frame with a
subtle background, keep their whitespace, wrap long lines at the view's width (a line that
did not wrap would widen, and scroll sideways, the whole transcript) and are coloured by
:mod:`highlight` when their fence names a language; tables get a visible grid, headings are
sized for a chat rather than a page. Raw HTML is not interpreted and images
are never loaded (an answer must not make the app read files or reach the network); an
image becomes a link, and links open only when clicked (the view decides, not this module).
"""

from __future__ import annotations

from functools import cache

from PySide6.QtGui import (
    QColor,
    QFont,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextDocumentFragment,
    QTextFormat,
    QTextFrame,
    QTextFrameFormat,
    QTextTable,
)

from moescope.gui import theme
from moescope.gui.chat.highlight import Style, highlight_runs

_Feature = QTextDocument.MarkdownFeature
HARD_SOFT_BREAKS = 0x8000
"""md4c's ``MD_FLAG_HARD_SOFT_BREAKS``: Qt hands the feature bits to md4c unchanged. A model's
single newlines are meant as line breaks (poems, addresses, "Step 1 … / Step 2 …"); plain
Markdown would join them into one line. ``test_markdown`` checks the flag still works."""
FEATURES = (_Feature.MarkdownDialectGitHub | _Feature.MarkdownNoHTML
            | _Feature(HARD_SOFT_BREAKS))
"""GitHub dialect (tables, strikethrough, task lists, autolinks) without raw HTML: a model
writing ``<b>`` or ``<img src=…>`` shows those characters instead of formatting or loading."""

BODY_MARGIN = 4.0
"""Left/right margin of every answer block, the same as the view's plain-text messages."""
CODE_BACKGROUND = "#23262c"
CODE_BORDER = "#33373f"
INLINE_CODE_BACKGROUND = "#2c3038"
TABLE_BORDER = "#3a3f47"
HEADING_SIZE = {1: 2, 2: 1}
"""``FontSizeAdjustment`` per heading level (Qt's own +3 for ``#`` is a page title, too big
next to chat text); deeper levels stay body size, bold."""
QUOTE_INDENT = 14.0

_CODE = QTextFormat.Property.BlockCodeLanguage
_QUOTE = QTextFormat.Property.BlockQuoteLevel


def is_code_block(block: QTextBlock) -> bool:
    """True for a line of a fenced or indented code block (Qt marks both with a language)."""
    return block.blockFormat().hasProperty(_CODE)


def code_text(cursor: QTextCursor) -> str:
    """The code block at ``cursor`` as plain text, every line and space as written."""
    frame = cursor.currentFrame()
    select = QTextCursor(cursor.document())
    select.setPosition(frame.firstPosition())
    select.setPosition(frame.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
    return select.selection().toPlainText()


def render_markdown(text: str, *, open_fence: bool = False) -> QTextDocument:
    """``text`` parsed and styled, in a document of its own (not laid out: cheap).

    ``open_fence``: ``text`` ends inside a code fence that is still streaming. Its block,
    the last one, stays plain until the fence closes: it grows at every frame, and lexing
    it again each time would make the cost of a frame grow with the block.
    """
    doc = QTextDocument()
    doc.setUndoRedoEnabled(False)
    doc.setMarkdown(text, FEATURES)
    _style(doc, highlight_last=not open_fence)
    return doc


def markdown_fragment(text: str, *, open_fence: bool = False) -> QTextDocumentFragment:
    """``text`` as a fragment to insert at the end of a block of another document.

    Qt merges a fragment's first block into the block it is inserted at, dropping that
    block's format (a heading would become a plain line, a first list item would leave its
    list); a block that follows a separator keeps its format. So the fragment starts with
    an empty block: it is what merges, and the answer's blocks follow, every one intact.
    An answer that opens with a table or code already starts with one (Qt keeps an empty
    line before a frame); a second would only add space. ``open_fence``: as for
    :func:`render_markdown`.
    """
    doc = render_markdown(text, open_fence=open_fence)
    if doc.begin().length() > 1:
        QTextCursor(doc).insertBlock()
    return QTextDocumentFragment(doc)


# ---------------------------------------------------------------------------- styling
def _style(doc: QTextDocument, *, highlight_last: bool = True) -> None:
    # structure edits first (they shift block numbers), then formats, then code frames from
    # the last one back (a frame inserts blocks only at and after its own lines)
    _replace_images(doc)
    for table in [f for f in doc.rootFrame().childFrames() if isinstance(f, QTextTable)]:
        _style_table(table)
    code_runs: list[tuple[int, int]] = []
    block = doc.begin()
    while block.isValid():
        if is_code_block(block):
            if code_runs and code_runs[-1][1] == block.blockNumber() - 1:
                code_runs[-1] = (code_runs[-1][0], block.blockNumber())
            else:
                code_runs.append((block.blockNumber(), block.blockNumber()))
        else:
            _style_text_block(block)
        block = block.next()
    for n, (first, last) in enumerate(reversed(code_runs)):
        _frame_code(doc, first, last, highlight=highlight_last or n > 0)
    _collapse_frame_spacers(doc)


def _collapse_frame_spacers(doc: QTextDocument) -> None:
    """Qt keeps an empty line before and after every frame (code block, table); Markdown
    never makes an empty paragraph, so every empty top-level line is such a spacer and is
    flattened (the frames' own margins space them)."""
    spacer = QTextBlockFormat()
    spacer.setLineHeight(1, QTextBlockFormat.LineHeightTypes.FixedHeight.value)
    tiny = QTextCharFormat()
    tiny.setFontPointSize(1)
    it = doc.rootFrame().begin()
    while not it.atEnd():
        block = it.currentBlock()
        it += 1
        if block.isValid() and block.length() == 1 and not block.textList():
            cursor = QTextCursor(block)
            cursor.setBlockFormat(spacer)
            cursor.setBlockCharFormat(tiny)


def _style_text_block(block: QTextBlock) -> None:
    """Margins, heading sizes, quote colour, inline-code background, link underline."""
    fmt = block.blockFormat()
    in_table = QTextCursor(block).currentTable() is not None
    if not in_table:
        left = fmt.leftMargin()
        if fmt.hasProperty(_QUOTE):
            left = QUOTE_INDENT * fmt.intProperty(_QUOTE)
        fmt.setLeftMargin(left + BODY_MARGIN)
        fmt.setRightMargin(BODY_MARGIN)
    level = fmt.headingLevel()
    if level:
        fmt.setTopMargin(10)
        fmt.setBottomMargin(4)
    QTextCursor(block).setBlockFormat(fmt)
    changes: list[tuple[int, int, QTextCharFormat]] = []
    it = block.begin()
    while not it.atEnd():
        frag = it.fragment()
        it += 1
        cf = frag.charFormat()
        change = QTextCharFormat()
        changed = False
        if level:
            change.setProperty(QTextFormat.Property.FontSizeAdjustment,
                               HEADING_SIZE.get(level, 0))
            changed = True
        if fmt.hasProperty(_QUOTE):
            change.setForeground(QColor(theme.MUTED))
            changed = True
        if cf.hasProperty(QTextFormat.Property.FontFixedPitch):
            change.setBackground(QColor(INLINE_CODE_BACKGROUND))
            changed = True
        if cf.isAnchor():
            change.setFontUnderline(True)
            title, href = cf.toolTip(), cf.anchorHref()
            change.setToolTip(f"{title} — {href}" if title and title != href else href)
            changed = True
        if changed:
            changes.append((frag.position(), frag.position() + frag.length(), change))
    cursor = QTextCursor(block.document())
    for start, end, change in changes:  # after the walk: merging splits fragments
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(change)


def _style_table(table: QTextTable) -> None:
    """A thin grid, a bold header row on a panel background, cells with some air."""
    fmt = table.format()
    fmt.setBorder(1)
    fmt.setBorderBrush(QColor(TABLE_BORDER))
    fmt.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
    fmt.setBorderCollapse(True)
    fmt.setCellSpacing(0)
    fmt.setCellPadding(4)
    fmt.setLeftMargin(BODY_MARGIN)
    fmt.setTopMargin(4)
    fmt.setBottomMargin(4)
    table.setFormat(fmt)
    for row in range(table.rows()):
        for col in range(table.columns()):
            cell = table.cellAt(row, col)
            if cell.row() != row or cell.column() != col:
                continue  # covered by a merged cell
            _drop_leading_empty_block(cell.firstCursorPosition(), cell.lastPosition())
            if row == 0:
                cell_fmt = cell.format()
                cell_fmt.setBackground(QColor(theme.PANEL))
                cell.setFormat(cell_fmt)
                cursor = cell.firstCursorPosition()
                cursor.setPosition(cell.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
                bold = QTextCharFormat()
                bold.setFontWeight(QFont.Weight.Bold)
                cursor.mergeCharFormat(bold)


def _drop_leading_empty_block(cursor: QTextCursor, last: int) -> None:
    """Qt's importer leaves an empty line at the top of a table's first cell when the table
    follows a code block; it would push that cell's text down."""
    block = cursor.block()
    if block.length() == 1 and block.position() + 1 <= last and block.next().isValid():
        keep = block.next().blockFormat()
        cursor.deleteChar()  # the separator: the next block's text joins this empty one
        cursor.setBlockFormat(keep)


def _frame_code(doc: QTextDocument, first: int, last: int, *, highlight: bool = True) -> None:
    """Put code lines ``first``..``last`` in a padded frame with a background, coloured
    for their fence's language unless ``highlight`` is False.

    A block background would touch the text (block margins lie outside it); a frame has
    padding. Long lines wrap at the view's width (at a space, or anywhere in a long word):
    a line that does not wrap widens the document, and the whole transcript, prose
    included, then scrolls sideways. Wrapping is layout only: the text, and so what "Copy
    code block" copies, keeps its lines as written.
    """
    start, end = doc.findBlockByNumber(first), doc.findBlockByNumber(last)
    outer = start.blockFormat()
    indent = outer.leftMargin() + outer.indent() * doc.indentWidth()
    inner = [doc.findBlockByNumber(n).blockFormat() for n in range(first, last + 1)]
    frame_fmt = QTextFrameFormat()
    frame_fmt.setBackground(QColor(CODE_BACKGROUND))
    frame_fmt.setBorder(1)
    frame_fmt.setBorderBrush(QColor(CODE_BORDER))
    frame_fmt.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
    frame_fmt.setPadding(6)
    frame_fmt.setLeftMargin(indent + BODY_MARGIN)
    frame_fmt.setRightMargin(BODY_MARGIN)
    frame_fmt.setTopMargin(4)
    frame_fmt.setBottomMargin(4)
    cursor = QTextCursor(start)
    cursor.setPosition(end.position() + end.length() - 1, QTextCursor.MoveMode.KeepAnchor)
    frame: QTextFrame = cursor.insertFrame(frame_fmt)
    _drop_empty_line_before(frame)
    # insertFrame gives the moved lines fresh block formats: put the code ones back
    block = doc.findBlock(frame.firstPosition())
    for fmt in inner:
        if not block.isValid() or block.position() > frame.lastPosition():
            break
        fmt.setNonBreakableLines(False)
        fmt.setLeftMargin(0)
        fmt.setRightMargin(0)
        fmt.setTopMargin(0)
        fmt.setBottomMargin(0)
        fmt.setIndent(0)
        QTextCursor(block).setBlockFormat(fmt)
        block = block.next()
    if highlight and inner:
        _highlight_code(frame, inner[0].stringProperty(_CODE))


def _highlight_code(frame: QTextFrame, language: str) -> None:
    """Colour the code in ``frame`` as ``language`` (see :mod:`highlight`).

    Formats are merged onto the existing characters, never by inserting text or HTML: the
    code's text stays exactly as parsed, and its monospace font is kept.
    """
    doc = frame.document()
    lines: list[str] = []
    block = doc.findBlock(frame.firstPosition())
    while block.isValid() and block.position() <= frame.lastPosition():
        lines.append(block.text())
        block = block.next()
    runs = highlight_runs(language, "\n".join(lines))  # a block separator is one position
    base = frame.firstPosition()
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()  # one change notification for the block, not one per token
    for start, end, style in runs:
        cursor.setPosition(base + start)
        cursor.setPosition(base + end, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(_char_format(style))
    cursor.endEditBlock()


@cache
def _char_format(style: Style) -> QTextCharFormat:
    """The format merged for ``style`` (built once per style; merging only reads it)."""
    fmt = QTextCharFormat()
    fmt.setForeground(QColor(style.colour))
    if style.bold:
        fmt.setFontWeight(QFont.Weight.Bold)
    if style.italic:
        fmt.setFontItalic(True)
    return fmt


def _drop_empty_line_before(frame: QTextFrame) -> None:
    """``insertFrame`` leaves the first code line's block behind, empty, before the frame;
    merge it into the paragraph above (a frame after a frame needs it, and keeps it)."""
    doc = frame.document()
    root = doc.rootFrame()
    empty = doc.findBlock(frame.firstPosition() - 1)
    above = empty.previous()
    if (empty.length() == 1 and above.isValid()
            and QTextCursor(empty).currentFrame() == root
            and QTextCursor(above).currentFrame() == root):
        QTextCursor(empty).deletePreviousChar()


def _replace_images(doc: QTextDocument) -> None:
    """An image becomes a link to its address: nothing is loaded while rendering."""
    block = doc.begin()
    found: list[tuple[int, str, str]] = []
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            cf = frag.charFormat()
            if cf.isImageFormat():
                image = cf.toImageFormat()
                alt = image.stringProperty(QTextFormat.Property.ImageAltText)
                found.append((frag.position(), image.name(), alt))
            it += 1
        block = block.next()
    for position, src, alt in reversed(found):
        cursor = QTextCursor(doc)
        cursor.setPosition(position)
        cursor.setPosition(position + 1, QTextCursor.MoveMode.KeepAnchor)
        link = QTextCharFormat()
        link.setAnchor(True)
        link.setAnchorHref(src)
        link.setForeground(QColor(theme.ACCENT))
        link.setFontUnderline(True)
        link.setToolTip(src)
        cursor.insertText(f"[image: {alt or src}]", link)
