"""The context meter's words: how many tokens of the context window a chat uses.

The meter tries its forms widest first and shows the first that fits its width
(:func:`meter_texts`): "context 131072 / 131072", "131072 / 131072", then the short
numbers of :func:`compact_tokens` ("context 262k / 1.0M", "262k / 1.0M"). The meter's
least width has room for the short forms only (a context of a million tokens has
seven-digit numbers that the exact forms could never fit); where the meter has more, the
exact numbers show.
"""

from __future__ import annotations

EMPTY = "no model loaded"
EMPTY_SHORT = "no model"
""":data:`EMPTY` where the meter is too narrow for it."""
LEAST_WIDTH_TEXTS = (EMPTY_SHORT, "9999 / 9999", "999k / 999k", "9.9M / 9.9M", "999M / 999M")
"""The meter is never narrower than the widest of these texts: :data:`EMPTY_SHORT` and
the short forms' widest (:func:`compact_tokens` is at most four characters and a unit)."""
FULL_WIDTH_TEXT = "context 000000 / 000000"
"""The meter asks for this much where its row has room."""


def compact_tokens(n: int) -> str:
    """``n`` tokens in at most four characters plus a unit: 512, 4096, 33k, 262k, 1.0M,
    12M, 1.5G. Rounded to the nearest, never up to "1000k" (that is "1.0M")."""
    n = max(0, int(n))
    if n < 10_000:
        return str(n)
    for unit, size in (("k", 1_000), ("M", 1_000_000), ("G", 1_000_000_000)):
        if round(n / size, 1) < 10:
            return f"{n / size:.1f}{unit}"
        if round(n / size) < 1000 or unit == "G":
            return f"{round(n / size)}{unit}"
    raise AssertionError("unreachable")


def meter_texts(used: int, n_ctx: int) -> list[str]:
    """The meter's text forms for ``used`` of ``n_ctx`` tokens, widest (most exact) first;
    :data:`EMPTY` or :data:`EMPTY_SHORT` where no model is loaded (``n_ctx`` 0)."""
    if n_ctx <= 0:
        return [EMPTY, EMPTY_SHORT]
    used = min(max(0, used), n_ctx)
    exact = f"{used} / {n_ctx}"
    short = f"{compact_tokens(used)} / {compact_tokens(n_ctx)}"
    return [f"context {exact}", exact, f"context {short}", short]


def exact_text(used: int, n_ctx: int) -> str:
    """The meter's tooltip line: the exact numbers and the share, whatever the meter shows."""
    if n_ctx <= 0:
        return "No model loaded: no context window"
    used = min(max(0, used), n_ctx)
    return f"{used:,} of {n_ctx:,} tokens of context in use ({used / n_ctx:.0%})"
