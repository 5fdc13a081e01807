"""Words for counts, the same in every front end: "1 token", "2 tokens"."""

from __future__ import annotations


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``n`` and ``noun`` as one says it: ``plural(1, "earliest message")`` is "1 earliest
    message", ``plural(3, "earliest message")`` "3 earliest messages"; ``nouns`` where the
    plural is not the noun and an s ("1 GGUF model", "2 GGUF models" need none; "1 entry",
    "2 entries" do)."""
    return f"{n} {noun if n == 1 else (nouns if nouns is not None else noun + 's')}"


def utf8_name(name: str) -> str:
    """A file name as UTF-8 text for whatever must show or store it (a trace's header, the
    server's model id, the window's titles): each byte of it that is not UTF-8 (which
    Python holds as a lone surrogate, ``surrogateescape``) written as its escape,
    ``\\xff``; a UTF-8 name as it is. JSON Lines, Arrow and Parquet metadata carry UTF-8
    only: the surrogate could not be written (a trace's recording failed), or was written
    as JSON's ``\\udcff`` and broke whatever printed the name read back; Qt drops it."""
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no file system byte gives: its escape
        raw = name.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace")
