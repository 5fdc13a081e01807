"""Syntax colours for fenced code blocks in answers: Pygments lexes, Qt formats apply.

Why Pygments' lexers and not its formatters: a formatter writes HTML (or ANSI), and answers
never go through HTML (raw HTML stays off, see :mod:`markdown`). Here a lexer only splits
the code into tokens; :func:`highlight_runs` turns them into ``(start, end, style)`` runs
that :mod:`markdown` applies as ``QTextCharFormat`` merges on the code block's own text, so
the text itself (what "Copy code block" copies) is never touched.

The lexer comes from the fence's info string only (```` ```python ````). No language, or one
Pygments does not know, means no colours: ``guess_lexer`` is slow (it tries every lexer)
and often wrong on short snippets, and wrong colours read worse than none.

Lexing is cached by ``(language, code)``: while an answer streams, a closed code block that
is still in the re-rendered tail is rendered again at every display frame, and each of
those renders reuses the first lexing. The colours fit the app's dark code background
(:data:`markdown.CODE_BACKGROUND`); the app has no light theme.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.token import (
    Comment,
    Error,
    Generic,
    Keyword,
    Name,
    Number,
    Operator,
    String,
    Token,
    _TokenType,
)
from pygments.util import ClassNotFound

from moescope.gui import theme

MAX_CODE_CHARS = 60_000
"""Longer code blocks stay plain: Pygments' regex lexers are linear on ordinary code, but an
answer is untrusted text and a pathological block must not stall the GUI thread."""


@dataclass(frozen=True)
class Style:
    """How one kind of token looks: a foreground colour, optionally bold or italic."""

    colour: str
    bold: bool = False
    italic: bool = False


# One Dark-like hues, each with a contrast ratio of at least 4.5 (WCAG AA) on the code
# background; ``test_markdown`` checks that. Plain names, punctuation and operators keep
# the body text colour, so the coloured tokens stand out instead of everything shouting.
STYLES: dict[_TokenType, Style] = {
    Keyword: Style("#c792ea"),
    Keyword.Constant: Style("#e5a06e"),
    Keyword.Type: Style("#e5c07b"),
    Operator.Word: Style("#c792ea"),
    Name.Builtin: Style("#56b6c2"),
    Name.Builtin.Pseudo: Style("#e5a06e"),
    Name.Function: Style("#61afef"),
    Name.Class: Style("#e5c07b"),
    Name.Namespace: Style("#e5c07b"),
    Name.Decorator: Style("#e5c07b"),
    Name.Exception: Style("#e5c07b"),
    Name.Tag: Style("#ef7b84"),
    Name.Attribute: Style("#e5a06e"),
    Name.Variable: Style("#ef7b84"),
    Name.Constant: Style("#e5a06e"),
    Name.Label: Style("#61afef"),
    String: Style("#98c379"),
    String.Escape: Style("#56b6c2"),
    String.Interpol: Style("#56b6c2"),
    String.Regex: Style("#56b6c2"),
    Number: Style("#e5a06e"),
    Comment: Style(theme.MUTED, italic=True),
    Comment.Preproc: Style("#c792ea"),
    Comment.PreprocFile: Style("#98c379"),
    Generic.Heading: Style("#61afef", bold=True),
    Generic.Subheading: Style("#61afef", bold=True),
    Generic.Deleted: Style("#ef7b84"),
    Generic.Inserted: Style("#98c379"),
    Generic.Prompt: Style(theme.MUTED),
    Generic.Output: Style(theme.MUTED),
    Generic.Emph: Style(theme.TEXT, italic=True),
    Generic.Strong: Style(theme.TEXT, bold=True),
    Error: Style(theme.TEXT),  # what a lexer cannot place (often its own gap): not red
}

Run = tuple[int, int, Style]
"""``(start, end, style)``: characters ``start``..``end`` of the code look like ``style``."""


@lru_cache(maxsize=128)
def lexer_for(language: str) -> Lexer | None:
    """The Pygments lexer for a fence's info string, or None when there is none.

    Cached per name: a miss in Pygments' own table scans the installed packages' plugin
    entry points, far too slow to repeat on every render of a ```` ```output ```` block.
    The lexer keeps the text exactly as given (no stripped or added newlines), so token
    offsets are offsets into the block.
    """
    name = language.strip().lower()
    if not name:
        return None
    try:
        return get_lexer_by_name(name, stripnl=False, stripall=False, ensurenl=False,
                                 tabsize=0)
    except (ClassNotFound, ValueError):
        return None


def style_for(token: _TokenType) -> Style | None:
    """The style of ``token`` or of its closest styled parent (None: body text)."""
    while token is not Token:
        style = STYLES.get(token)
        if style is not None:
            return style
        token = token.parent
    return None


@lru_cache(maxsize=64)
def highlight_runs(language: str, code: str) -> tuple[Run, ...]:
    """The coloured runs of ``code`` written in ``language``; empty when it stays plain.

    Whitespace is never a run and neighbouring tokens of one style are joined, so a block
    gets a few merges per line rather than one per token. Should a lexer's tokens ever not
    add up to the code (they always do for the built-in lexers), the block stays plain
    rather than coloured at the wrong places.
    """
    lexer = lexer_for(language)
    if lexer is None or not code.strip() or len(code) > MAX_CODE_CHARS:
        return ()
    runs: list[Run] = []
    offset = 0
    for token, value in lexer.get_tokens(code):
        start, offset = offset, offset + len(value)
        style = style_for(token)
        if style is None or not value.strip():
            continue
        if runs and runs[-1][2] == style and not code[runs[-1][1]:start].strip():
            runs[-1] = (runs[-1][0], offset, style)
        else:
            runs.append((start, offset, style))
    if offset != len(code) or any(end > len(code) for _, end, _ in runs):
        return ()
    return tuple(runs)
