"""Words for counts, the same in every front end: "1 token", "2 tokens"."""

from __future__ import annotations


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``n`` and ``noun`` as one says it: ``plural(1, "earliest message")`` is "1 earliest
    message", ``plural(3, "earliest message")`` "3 earliest messages"; ``nouns`` where the
    plural is not the noun and an s ("1 GGUF model", "2 GGUF models" need none; "1 entry",
    "2 entries" do)."""
    return f"{n} {noun if n == 1 else (nouns if nouns is not None else noun + 's')}"
