"""Test support for traces: a recorded trace as an older MoEScope would have written it."""

from __future__ import annotations

import json
from pathlib import Path


def as_older_trace(source: Path, dest: Path, *fields: str) -> int:
    """Copy the trace ``source`` to ``dest`` without the token fields ``fields`` (fields a
    later version added: older traces must still open). Returns how many token lines had
    at least one of them."""
    lines, stripped = [], 0
    for line in source.read_text(encoding="utf-8").splitlines():
        obj = json.loads(line)
        if obj.get("type") == "token":
            stripped += any([obj.pop(f, None) is not None for f in fields])
        lines.append(json.dumps(obj))
    dest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return stripped
