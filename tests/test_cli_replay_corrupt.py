"""A trace whose values disagree with its own header (a corrupt or hand-edited file) is
refused by the reader with the line named, so every consumer (``moescope replay``, the
trace window, the CSV) is spared it: not a NativeError or ValueError traceback from the
core halfway through a sweep, not an index error in the views, not a silent table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from moescope.cli import main

RecordFn = Callable[..., Path]


def _edit(source: Path, dest: Path, header: Callable[[dict[str, Any]], None] | None = None,
          token: Callable[[dict[str, Any]], None] | None = None) -> Path:
    lines = []
    for line in source.read_text(encoding="utf-8").splitlines():
        obj = json.loads(line)
        if obj["type"] == "header" and header is not None:
            header(obj)
        if obj["type"] == "token" and token is not None:
            token(obj)
        lines.append(json.dumps(obj))
    dest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dest


def _routes(d: dict[str, Any], key: str, value: Any) -> None:
    for route in d.get("routes", []):
        route[key] = value


def _events(d: dict[str, Any], key: str, value: Any) -> None:
    for event in d["events"]:
        event[key] = [value] * len(event[key])


CORRUPTIONS: dict[str, tuple[dict[str, Any], str]] = {
    "router ids": ({"token": lambda d: _routes(d, "ids", [999] * 4)},
                   "expert ids outside 0..15"),
    "event ids": ({"token": lambda d: _events(d, "ids", 999)},
                  "events[0].ids[0] 999 is not an expert (0..15)"),
    "used ids": ({"token": lambda d: _events(d, "used_ids", -1)},
                 "events[0].used_ids[0] -1 is not an expert (0..15)"),
    "predicted layer": ({"token": lambda d: _routes(d, "next_layer", 99)},
                        "prediction for layer 99"),
    "predicted ids": ({"token": lambda d: _routes(d, "predicted", [77])},
                      "predicted ids out of range"),
    "slot change": ({"token": lambda d: d.__setitem__(
        "changes", [{"kind": "slots", "slots": -5}])}, "budget change to -5 slots"),
    "header slots": ({"header": lambda d: d.__setitem__("slots_per_layer", 0)},
                     "slots_per_layer 0 is outside"),
    # what a fuzzing pass found (issue 14): each was a traceback, an endless loop or silent
    "negative layers": ({"header": lambda d: d["model"].__setitem__("n_layers", -3)},
                        "model.n_layers -3 is outside"),
    "initial step 1e12": ({"header": lambda d: d["initial_state"].__setitem__("step", 10**12)},
                          "initial_state.step 1000000000000 is outside"),
    "half-life 1e-300": ({"header": lambda d: d["policy"].__setitem__("half_life", 1e-300)},
                         "policy: half_life must be between"),
    "event step 1e12": ({"token": lambda d: [e.__setitem__("step", 10**12)
                                             for e in d["events"]]},
                        "events[0].step 1000000000000 is beyond step"),
    "slot -1": ({"token": lambda d: _events(d, "slots", -1)},
                "events[0].slots[0] -1 is not a slot"),
    "action 9": ({"token": lambda d: _events(d, "action", 9)},
                 "events[0].action[0] 9 is not an action"),
    "duplicate ids": ({"token": lambda d: _events(d, "ids", 3)},
                      "events[0].ids names expert 3 twice"),
    "routes object": ({"token": lambda d: d.__setitem__("routes", {"row": 0})},
                      "routes is an object, not a list"),
    "timings 2^63": ({"token": lambda d: d.__setitem__("timings", {"wait_us": 2**63})},
                     "timings.wait_us 9223372036854775808 is outside"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_a_trace_that_contradicts_its_header_is_one_line(
        record: RecordFn, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        name: str) -> None:
    edits, says = CORRUPTIONS[name]
    trace = _edit(record("qwen3moe", policy="psr"), tmp_path / "corrupt.jsonl", **edits)
    code = main(["replay", str(trace), "-p", "recorded,exact,psr", "-b", "recorded,50%"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.startswith("moescope: error: corrupt.jsonl: line ") and says in err
    assert ("bad token record" in err) != ("bad header record" in err)
