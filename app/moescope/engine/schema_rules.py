"""Grammar rules for the JSON-schema keywords llama-cpp-python's converter accepts but does
not enforce, written here so that they hold (:mod:`moescope.engine.grammar` uses them):
numbers' bounds, integers' ``multipleOf``, and which ``enum``/``const`` values a schema's
other keywords allow.

A rule here is the body of a GBNF rule, as the converter writes its own: JSON text, then
``space``. Numbers are exact decimal values (a bound as JSON wrote it: ``0.1`` is one
tenth, not the binary float nearest it)."""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from functools import lru_cache
from typing import Any

MAX_INTEGER_DIGITS = 16
"""Digits of an integer the grammar writes (as the converter's ``integer``: 16), and of a
bounded number's integer part and fraction each."""
INTEGER_LIMIT = 10**MAX_INTEGER_DIGITS - 1
MAX_MULTIPLES = 1000
"""Values of a ``multipleOf`` within its bounds that a grammar lists (as a tree of their
digits): at most as many as an enum may have."""
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def integer_range(node: dict[str, Any]) -> tuple[int, int]:
    """The integers an integer schema's bounds allow, from and to (of at most
    :data:`MAX_INTEGER_DIGITS` digits); empty where the first exceeds the second."""
    low, high = -INTEGER_LIMIT, INTEGER_LIMIT
    if "minimum" in node:
        low = max(low, math.ceil(json_decimal(node["minimum"])))
    if "exclusiveMinimum" in node:
        low = max(low, math.floor(json_decimal(node["exclusiveMinimum"])) + 1)
    if "maximum" in node:
        high = min(high, math.floor(json_decimal(node["maximum"])))
    if "exclusiveMaximum" in node:
        high = min(high, math.ceil(json_decimal(node["exclusiveMaximum"])) - 1)
    return low, high


def integer_range_rule(low: int, high: int) -> str:
    """A GBNF rule's body for the integers from ``low`` to ``high`` as JSON writes them
    (no leading zeros, no ``-0``), then ``space``: one alternative per digit count and
    sign, each a choice digit by digit (:func:`_digit_range`)."""
    assert low <= high
    parts = []
    if low < 0:  # the magnitudes of low..min(high, -1)
        parts.append(f'"-" ({" | ".join(_natural_range(max(1, -high), -low))})')
    if high >= 0:
        parts.extend(_natural_range(max(low, 0), high))
    return f"({' | '.join(parts)}) space"


def _natural_range(low: int, high: int) -> list[str]:
    """Alternatives for the numbers from ``low`` to ``high`` (both from 0), one for each
    digit count."""
    out = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        first = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        out.append(_digit_range(str(first), str(min(high, 10**digits - 1))))
    return out


def _digit_range(low: str, high: str) -> str:
    """The digit strings of ``low``'s length from ``low`` to ``high``: their common
    prefix, then at the first digit that differs, ``low``'s digit followed by what
    reaches up to all nines, the digits between followed by any digits, and ``high``'s
    digit followed by what runs from all zeros (``123..456``: ``"1" ("2" [3-9] | [3-9]
    [0-9]) | [2-3] [0-9]{2} | "4" ...``)."""
    same = 0
    while same < len(low) and low[same] == high[same]:
        same += 1
    if same == len(low):
        return f'"{low}"'
    head = f'"{low[:same]}" ' if same else ""
    a, b, rest_low, rest_high = low[same], high[same], low[same + 1:], high[same + 1:]
    n = len(rest_low)
    any_rest = "" if n == 0 else " [0-9]" if n == 1 else f" [0-9]{{{n}}}"
    from_zeros, to_nines = rest_low == "0" * n, rest_high == "9" * n
    first = a if from_zeros else chr(ord(a) + 1)
    last = b if to_nines else chr(ord(b) - 1)
    parts = []
    if not from_zeros:
        parts.append(f'"{a}" ({_digit_range(rest_low, "9" * n)})')
    if first <= last:
        parts.append(f"[{first}{'-' + last if last != first else ''}]{any_rest}")
    if not to_nines:
        parts.append(f'"{b}" ({_digit_range("0" * n, rest_high)})')
    return head + (parts[0] if len(parts) == 1 else f"({' | '.join(parts)})")


def json_decimal(value: int | float) -> Decimal:
    """A bound as JSON wrote it (``0.1``: one tenth; Python's shortest repr of a float
    is the number the JSON text had)."""
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


class Interval:
    """The numbers a schema's bounds allow: ``low`` to ``high``, each end in or out,
    within what the grammar writes (:data:`MAX_INTEGER_DIGITS` digits before the point:
    ``-10**16 < x < 10**16``)."""

    def __init__(self, node: dict[str, Any]) -> None:
        edge = Decimal(10**MAX_INTEGER_DIGITS)
        self.low, self.low_in = -edge, False
        self.high, self.high_in = edge, False
        for key, inclusive in (("minimum", True), ("exclusiveMinimum", False)):
            if key in node:
                v = json_decimal(node[key])
                if v > self.low or (v == self.low and not inclusive):
                    self.low, self.low_in = v, inclusive
        for key, inclusive in (("maximum", True), ("exclusiveMaximum", False)):
            if key in node:
                v = json_decimal(node[key])
                if v < self.high or (v == self.high and not inclusive):
                    self.high, self.high_in = v, inclusive

    def holds(self, value: Decimal) -> bool:
        above = value > self.low or (self.low_in and value == self.low)
        below = value < self.high or (self.high_in and value == self.high)
        return above and below


def number_range_rule(node: dict[str, Any]) -> str | None:
    """A GBNF rule's body for the numbers within a schema's bounds (:class:`Interval`) as
    JSON writes them without an exponent (no leading zeros, no ``-0``, at most
    :data:`MAX_INTEGER_DIGITS` digits after the point), then ``space``; None where no
    such number is within them."""
    r = Interval(node)
    parts = []
    if r.high > 0 or (r.high == 0 and r.high_in):  # written without a sign
        low, low_in = (r.low, r.low_in) if r.low >= 0 else (Decimal(0), True)
        parts += _magnitudes(low, low_in, r.high, r.high_in)
    if r.low < 0:  # "-" and a magnitude above 0 (never "-0" or "-0.0")
        low, low_in = (-r.high, r.high_in) if r.high < 0 else (Decimal(0), False)
        negative = _magnitudes(low, low_in, -r.low, r.low_in)
        if negative:
            parts.append(f'"-" ({" | ".join(negative)})')
    return f"({' | '.join(parts)}) space" if parts else None


def _fraction_digits(value: Decimal) -> str:
    """The digits after the point of ``value`` (from 0 to 1), without trailing zeros."""
    text = format(value, "f")
    return text.partition(".")[2].rstrip("0")


def _magnitudes(low: Decimal, low_in: bool, high: Decimal, high_in: bool) -> list[str]:
    """Alternatives for the numbers from ``low`` to ``high`` (both from 0) written without
    a sign: an integer part, then a fraction (:func:`_fraction`) that depends on whether
    the integer part is ``low``'s, ``high``'s or one between."""
    if low > high or (low == high and not (low_in and high_in)):
        return []
    first, last = int(low), int(high)
    frac_low, frac_high = _fraction_digits(low - first), _fraction_digits(high - last)
    out = []

    def add(integer: str, fraction: tuple[str | None, bool]) -> None:
        digits, bare = fraction
        if digits is None:
            if bare:
                out.append(integer)
        else:
            out.append(f'{integer} ("." {digits}){"?" if bare else ""}')

    if first == last:
        add(f'"{first}"', _fraction(frac_low, low_in, frac_high, high_in,
                                    MAX_INTEGER_DIGITS))
        return out
    add(f'"{first}"', _fraction(frac_low, low_in, None, False, MAX_INTEGER_DIGITS))
    if first + 1 <= last - 1:
        between = _natural_range(first + 1, last - 1)
        add(between[0] if len(between) == 1 else f"({' | '.join(between)})",
            _fraction("", True, None, False, MAX_INTEGER_DIGITS))
    add(f'"{last}"', _fraction("", True, frac_high, high_in, MAX_INTEGER_DIGITS))
    return out


def _digits_class(a: int, b: int) -> str:
    return f'"{a}"' if a == b else f"[{a}-{b}]"


def _any_digits(n: int) -> str:
    return "[0-9]" if n == 1 else f"[0-9]{{1,{n}}}"


@lru_cache(maxsize=4096)
def _fraction(low: str, low_in: bool, high: str | None, high_in: bool, left: int
              ) -> tuple[str | None, bool]:
    """The digits ``s`` after a point (at most ``left`` of them) for which ``0.s`` lies
    from ``0.low`` to ``0.high`` (``high`` None: below 1), each end in or out: a GBNF
    expression for those of one digit or more (None: there are none), and whether no
    digits at all (the value 0) will do. Digit by digit, as comparing padded decimal
    strings: a digit above ``low``'s first frees the rest from ``low``, an equal one
    leaves the rest bound by ``low``'s rest, one below fails (and ``high`` the other
    way round)."""
    low_free = low == "" and low_in
    bare = low_free and (high is None or high != "" or high_in)
    if left == 0:
        return None, bare
    if high is None and low_free:
        return _any_digits(left), True
    if high is None and low == "":  # above 0: some digit that is not 0
        rest = "" if left == 1 else f" [0-9]{{0,{left - 1}}}"
        zeros = _fraction("", False, None, False, left - 1)[0]
        return (f"([1-9]{rest} | \"0\" {zeros})" if zeros else f"[1-9]{rest}"), False
    if high == "":
        return ((f'"0"{{1,{left}}}' if left > 1 else '"0"'), True) if high_in and low_free \
            else (None, False)
    first_low = int(low[0]) if low else 0
    first_high = int(high[0]) if high else 9
    groups: list[tuple[int, int, tuple[str | None, bool]]] = []
    for d in range(10):
        if low_free or d > first_low:
            lower: tuple[str, bool] = ("", True)
        elif d == first_low:
            lower = (low[1:], low_in)
        else:
            continue
        if high is None or d < first_high:
            upper: tuple[str | None, bool] = (None, False)
        elif d == first_high:
            upper = (high[1:], high_in)
        else:
            continue
        rest = _fraction(*lower, *upper, left - 1)
        if groups and groups[-1][1] == d - 1 and groups[-1][2] == rest:
            groups[-1] = (groups[-1][0], d, rest)
        else:
            groups.append((d, d, rest))
    alternatives = []
    for a, b, (digits, bare_rest) in groups:
        head = _digits_class(a, b)
        if digits is None:
            if bare_rest:
                alternatives.append(head)
        else:
            alternatives.append(f"{head} ({digits}){'?' if bare_rest else ''}")
    if not alternatives:
        return None, bare
    joined = alternatives[0] if len(alternatives) == 1 else f"({' | '.join(alternatives)})"
    return joined, bare


def multiples(node: dict[str, Any], step: int) -> tuple[int, int]:
    """The first and the count of the multiples of ``step`` (from 1) that an integer
    schema's bounds allow (:func:`integer_range`)."""
    low, high = integer_range(node)
    first = -(-low // step)
    count = max(0, high // step - first + 1)
    return first * step, count


def multiples_rule(first: int, count: int, step: int) -> str:
    """A GBNF rule's body for ``count`` multiples of ``step`` from ``first``, as a tree of
    their digits (one parse path at a time, however many there are), then ``space``."""
    tree: dict[str, Any] = {}
    for value in range(first, first + count * step, step):
        node = tree
        for c in str(value):
            node = node.setdefault(c, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        branches = []
        for c, child in node.items():
            if c:
                rest = emit(child)
                branches.append(f'"{c}"' + (f" {rest}" if rest else ""))
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else f"({' | '.join(branches)})"
        return f"({body})?" if "" in node else body

    return f"({emit(tree)}) space"


def json_type_of(value: Any) -> set[str]:
    """The JSON Schema types ``value`` (parsed JSON) has (an integral number both)."""
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"integer", "number"} if value.is_integer() else {"number"}
    if isinstance(value, str):
        return {"string"}
    if isinstance(value, list):
        return {"array"}
    return {"object"}


def misfit(value: Any, node: dict[str, Any]) -> str | None:
    """The keyword of ``node`` (beside its ``enum`` or ``const``) that ``value`` does not
    meet, of those the converter would not check: ``type`` and the keywords of
    ``value``'s own type (not those of its members); None where it meets them all."""
    kind = node.get("type")
    if kind is not None:
        kinds = set(kind) if isinstance(kind, list) else {kind}
        if not kinds & json_type_of(value):
            return "type"
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = json_decimal(value)
        if any(k in node for k in BOUNDS) and not Interval(node).holds(number):
            return next(k for k in BOUNDS if k in node)
        step = node.get("multipleOf")
        if isinstance(step, int | float) and step > 0 and number % json_decimal(step) != 0:
            return "multipleOf"
    elif isinstance(value, str):
        if (broken := _count_broken(node, len(value), "Length")) is not None:
            return broken
        if "pattern" in node:
            try:
                if not re.search(node["pattern"], value):
                    return "pattern"
            except re.error:
                return "pattern"
    elif isinstance(value, list):
        if (broken := _count_broken(node, len(value), "Items")) is not None:
            return broken
        if node.get("uniqueItems") is True:
            seen = [json.dumps(v, sort_keys=True) for v in value]
            if len(set(seen)) < len(seen):
                return "uniqueItems"
    elif isinstance(value, dict):
        if (broken := _count_broken(node, len(value), "Properties")) is not None:
            return broken
        if any(name not in value for name in node.get("required", [])):
            return "required"
    return None


def _count_broken(node: dict[str, Any], count: int, what: str) -> str | None:
    """``min``/``max`` + ``what`` (``Length``, ``Items``, ``Properties``), whichever
    ``count`` breaks, else None."""
    if count < node.get(f"min{what}", 0):
        return f"min{what}"
    if f"max{what}" in node and count > node[f"max{what}"]:
        return f"max{what}"
    return None
