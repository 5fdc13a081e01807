"""llama.cpp's GBNF parser (``llama_grammar_parser::parse`` in ``llama-grammar.cpp``),
rewritten to say why a grammar does not parse before llama.cpp sees it.

llama.cpp prints a failed parse, and the whole grammar after it, with ``fprintf`` to the
process's stderr (not through its log callback), and answers only "no grammar". Parsed
here first, a bad grammar never reaches it: the reason is llama.cpp's own message, and
no file descriptor is redirected to catch it (which lost or misattributed whatever other
threads wrote to stderr meanwhile). The parse is the same one step for step (what
llama.cpp accepts, this accepts), without building the rules; it is iterative (groups
nest as deep as :data:`~moescope.engine.grammar.MAX_GROUP_DEPTH` allows, deeper than
Python's recursion). Two things it refuses that llama.cpp would not: token references
(``<...>``, ``!<...>``: they need the vocabulary, and no grammar here writes them) and a
repetition ``{m,n}`` with ``n`` below ``m`` (llama.cpp counts ``n - m`` down from
2**64: it never returns)."""

from __future__ import annotations

import re

MAX_REPETITION_THRESHOLD = 2000
"""llama.cpp's bound on a repetition's count, and on the rules one writes out."""
_NO_MAX = 2**64 - 1
_ESCAPE = r'\\(?:x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[trn\\"\[\]-])'
_CHAR = rf"(?:[^\]\\]|{_ESCAPE})"
_LITERAL = re.compile(rf'"(?:[^"\\]|{_ESCAPE})*"')
_CLASS = re.compile(rf"\[\^?(?:{_CHAR}(?:-{_CHAR})?)*\]")
"""What the parser's loops take without an error, a literal and a class each; where
these do not match, the loops themselves say where and why (the fast way is the same
text: a ``-`` a range does not take is a member the next step takes)."""
_NAME = re.compile(r"[a-zA-Z0-9-]+")
_SPACE = re.compile(r"(?:[ \t]|#[^\r\n]*)*")
_SPACE_NEWLINES = re.compile(r"(?:[ \t\r\n]|#[^\r\n]*)*")


class GbnfError(Exception):
    """Why llama.cpp's parser would refuse a grammar (its message)."""


def parse_error(text: str) -> str | None:
    """Why llama.cpp's parser would refuse ``text`` (its message, the place it names
    shortened), or None where it parses and defines a ``root`` rule."""
    try:
        _Parser(text).parse()
    except GbnfError as err:
        return str(err)
    return None


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")


def _hex(c: str) -> bool:
    return _is_digit(c) or "a" <= c <= "f" or "A" <= c <= "F"


class _Frame:
    """One ``parse_alternates`` in progress: a rule's body (``group`` None) or a
    group's, whose parent sequence resumes after it."""

    __slots__ = ("group", "has_item", "n_prev", "nested")

    def __init__(self, nested: bool, group: int | None) -> None:
        self.nested = nested
        self.group = group
        """The symbols there were before the group (llama.cpp's ``n_rules_before``)."""
        self.has_item = False
        """Whether the sequence has an item a repetition can apply to."""
        self.n_prev = 1


class _Parser:
    def __init__(self, text: str) -> None:
        self.src = text.split("\x00", 1)[0]  # llama.cpp reads a C string
        self.symbols: dict[str, int] = {}
        self.defined: set[int] = set()
        self.referenced: list[str] = []

    def fail(self, what: str, at: int | None = None) -> GbnfError:
        if at is None:
            return GbnfError(what)
        rest = " ".join(self.src[at:at + 40].split())
        return GbnfError(f"{what} at {rest or 'the end'}"
                         f"{'...' if len(self.src) > at + 40 else ''}")

    def char(self, i: int) -> str:
        return self.src[i] if i < len(self.src) else ""

    def symbol(self, name: str) -> int:
        return self.symbols.setdefault(name, len(self.symbols))

    def generate(self, base: str) -> int:
        n = len(self.symbols)
        self.symbols[f"{base}_{n}"] = n
        self.defined.add(n)
        return n

    def space(self, i: int, newline_ok: bool) -> int:
        match = (_SPACE_NEWLINES if newline_ok else _SPACE).match(self.src, i)
        return match.end() if match else i

    def name(self, i: int) -> int:
        match = _NAME.match(self.src, i)
        if match is None:
            raise self.fail("expecting name", i)
        return match.end()

    def parse_char(self, i: int) -> int:
        c = self.char(i)
        if c == "\\":
            e = self.char(i + 1)
            size = {"x": 2, "u": 4, "U": 8}.get(e)
            if size is not None:
                j = i + 2
                while j < i + 2 + size and self.char(j) and _hex(self.char(j)):
                    j += 1
                if j != i + 2 + size:
                    raise self.fail(f"expecting {size} hex chars", i + 2)
                return j
            if e in ("t", "r", "n", "\\", '"', "[", "]", "-"):
                return i + 2
            raise self.fail("unknown escape", i)
        if c:
            return i + 1
        raise self.fail("unexpected end of input")

    def parse(self) -> None:
        i = self.space(0, True)
        while i < len(self.src):
            i = self.rule(i)
        for name in self.referenced:
            if self.symbols[name] not in self.defined:
                raise self.fail(f"Undefined rule identifier '{name}'")
        if self.symbols.get("root") not in self.defined:
            raise self.fail("grammar does not contain a 'root' symbol")

    def rule(self, i: int) -> int:
        end = self.name(i)
        name = self.src[i:end]
        i = self.space(end, False)
        if self.src[i:i + 3] != "::=":
            raise self.fail("expecting ::=", i)
        self.defined.add(self.symbol(name))
        i = self.alternates(self.space(i + 3, True), name)
        c = self.char(i)
        if c == "\r":
            i += 2 if self.char(i + 1) == "\n" else 1
        elif c == "\n":
            i += 1
        elif c:
            raise self.fail("expecting newline or end", i)
        return self.space(i, True)

    def alternates(self, i: int, name: str) -> int:
        """``parse_alternates`` of a rule's body, its groups on a stack of frames."""
        stack = [_Frame(False, None)]
        while True:
            frame = stack[-1]
            i, group = self.sequence(i, name, frame)
            if group:  # a "(": its alternates first, then this sequence goes on
                before = len(self.symbols)
                self.generate(name)
                stack.append(_Frame(True, before))
                continue
            if self.char(i) == "|":
                i = self.space(i + 1, True)
                frame.has_item, frame.n_prev = False, 1
                continue
            stack.pop()
            if frame.group is None:
                return i
            if self.char(i) != ")":
                raise self.fail("expecting ')'", i)
            parent = stack[-1]
            parent.n_prev = max(1, len(self.symbols) - frame.group)
            parent.has_item = True
            i = self.space(i + 1, parent.nested)

    def sequence(self, i: int, name: str, frame: _Frame) -> tuple[int, bool]:
        """``parse_sequence`` up to its end or a group's ``(`` (True: the group's
        alternates come next, after the ``(`` and its space)."""
        nested = frame.nested
        while i < len(self.src):
            c = self.src[i]
            fast = _LITERAL.match(self.src, i) if c == '"' \
                else _CLASS.match(self.src, i) if c == "[" else None
            if fast:
                frame.has_item, frame.n_prev = True, 1
                i = self.space(fast.end(), nested)
            elif c == '"':
                i += 1
                while self.char(i) != '"':
                    if not self.char(i):
                        raise self.fail("unexpected end of input")
                    i = self.parse_char(i)
                frame.has_item, frame.n_prev = True, 1
                i = self.space(i + 1, nested)
            elif c == "[":
                i += 1
                if self.char(i) == "^":
                    i += 1
                while self.char(i) != "]":
                    if not self.char(i):
                        raise self.fail("unexpected end of input")
                    i = self.parse_char(i)
                    if self.char(i) == "-" and self.char(i + 1) != "]":
                        if not self.char(i + 1):
                            raise self.fail("unexpected end of input")
                        i = self.parse_char(i + 1)
                frame.has_item, frame.n_prev = True, 1
                i = self.space(i + 1, nested)
            elif c in ("<", "!"):
                raise self.fail("token references (<...>) are not supported here", i)
            elif c in _WORD:
                end = self.name(i)
                ref = self.src[i:end]
                self.symbol(ref)
                self.referenced.append(ref)
                frame.has_item, frame.n_prev = True, 1
                i = self.space(end, nested)
            elif c == "(":
                return self.space(i + 1, True), True
            elif c == ".":
                frame.has_item, frame.n_prev = True, 1
                i = self.space(i + 1, nested)
            elif c in ("*", "+", "?"):
                i = self.space(i + 1, nested)
                low, high = {"*": (0, _NO_MAX), "+": (1, _NO_MAX), "?": (0, 1)}[c]
                self.repeat(frame, name, low, high, i)
            elif c == "{":
                i = self.space(i + 1, nested)
                if not _is_digit(self.char(i)):
                    raise self.fail("expecting an int", i)
                end = self.number_end(i)
                low = self.number(i, end)
                i = self.space(end, nested)
                high = _NO_MAX
                if self.char(i) == "}":
                    high = low
                    i = self.space(i + 1, nested)
                elif self.char(i) == ",":
                    i = self.space(i + 1, nested)
                    if _is_digit(self.char(i)):
                        end = self.number_end(i)
                        high = self.number(i, end)
                        i = self.space(end, nested)
                    if self.char(i) != "}":
                        raise self.fail("expecting '}'", i)
                    i = self.space(i + 1, nested)
                else:
                    raise self.fail("expecting ','", i)
                if low > MAX_REPETITION_THRESHOLD:
                    raise self.fail("number of repetitions exceeds sane defaults, please "
                                    "reduce the number of repetitions")
                if high != _NO_MAX and high > MAX_REPETITION_THRESHOLD:
                    high = _NO_MAX
                if high < low:
                    raise self.fail(f"a repetition {{{low},{high}}} has its maximum below "
                                    "its minimum")
                self.repeat(frame, name, low, high, i)
            else:
                break
        return i, False

    def number_end(self, i: int) -> int:
        while _is_digit(self.char(i)):
            i += 1
        return i

    def number(self, i: int, end: int) -> int:
        value = int(self.src[i:end])
        if value > _NO_MAX:  # std::stoull throws std::out_of_range
            raise self.fail("stoull")
        return value

    def repeat(self, frame: _Frame, name: str, low: int, high: int, at: int) -> None:
        """``handle_repetitions``: what it checks, and the symbols it makes."""
        if not frame.has_item:
            raise self.fail("expecting preceding item to */+/?/{", at)
        no_max = high == _NO_MAX
        total = high if not no_max and high > 0 else low if low > 0 else 1
        if frame.n_prev * total > MAX_REPETITION_THRESHOLD:
            raise self.fail("number of rules that are going to be repeated multiplied by "
                            "the new repetition exceeds sane defaults, please reduce the "
                            "number of repetitions or rule complexity")
        n_opt = 1 if no_max else high - low
        for _ in range(n_opt):
            self.generate(name)
        frame.has_item = low > 0 or n_opt > 0
        frame.n_prev *= total
