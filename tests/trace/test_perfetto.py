"""The Perfetto export: valid trace-event JSON whose token slices add up to the session."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from numbers import Real
from pathlib import Path
from typing import Any

import pytest

from moescope.cache.native import FETCH, SUBSTITUTE
from moescope.trace import read_trace, write_perfetto

RecordFn = Callable[..., Path]

PHASES = {"B", "E", "X", "i", "I", "C", "M", "b", "e", "n", "s", "t", "f", "P", "O", "N", "D"}


def assert_trace_event_json(doc: Any) -> None:
    """The JSON Object form of the Trace Event Format (the one ui.perfetto.dev and
    chrome://tracing load): ``traceEvents`` is a list of events, each with a name, a known
    phase, integer pid/tid, a numeric timestamp (metadata excepted), a non-negative ``dur``
    on complete events, a valid scope on instants, and object ``args``."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    for ev in doc["traceEvents"]:
        assert isinstance(ev, dict), ev
        assert isinstance(ev.get("name"), str), ev
        assert ev.get("ph") in PHASES, ev
        assert isinstance(ev.get("pid"), int) and isinstance(ev.get("tid"), int), ev
        if ev["ph"] != "M":
            assert isinstance(ev.get("ts"), Real) and math.isfinite(ev["ts"]), ev
            assert ev["ts"] >= 0, ev
        if ev["ph"] == "X":
            assert isinstance(ev.get("dur"), Real) and ev["dur"] >= 0, ev
        if ev["ph"] == "i":
            assert ev.get("s", "t") in ("g", "p", "t"), ev
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "thread_name", "process_sort_index",
                                  "thread_sort_index", "process_labels"), ev
            assert isinstance(ev.get("args"), dict), ev
        if "args" in ev:
            assert isinstance(ev["args"], dict), ev


@pytest.mark.usefixtures("engine_required")
def test_the_perfetto_export_is_trace_event_json_whose_token_slices_sum_to_the_session(
        record: RecordFn, tmp_path: Path) -> None:
    trace = read_trace(record("qwen3moe", tokens=20, answers=2, switch_at=7))
    out = write_perfetto(trace, tmp_path / "p.json")
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert_trace_event_json(doc)

    events = doc["traceEvents"]
    tokens = [e for e in events if e["ph"] == "X" and e["cat"] in ("prefill", "decode")]
    assert len(tokens) == len(trace.tokens)
    durations = [e["dur"] for e in tokens]
    assert durations == pytest.approx([t.seconds * 1e6 for t in trace.tokens], rel=1e-12)
    assert math.fsum(durations) == pytest.approx(trace.total_seconds * 1e6, rel=1e-12)
    for a, b in itertools.pairwise(tokens):  # end to end, in order
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"], rel=1e-12)

    rows = trace.events()
    fetches = int((rows["action"][:, :4] == FETCH).sum())
    substitutions = int((rows["action"][:, :4] == SUBSTITUTE).sum())
    assert substitutions > 0
    assert sum(e.get("cat") == "fetch" for e in events) == fetches
    assert sum(e.get("cat") == "substitute" for e in events) == substitutions
    copies = [e for e in events if e["ph"] == "X" and e["cat"] == "copy"]
    assert copies and sum(e["dur"] for e in copies if e["name"] == "sync copies") == sum(
        t.timings["sync_copy_us"] for t in trace.tokens if t.timings)
    assert any(e.get("cat") == "change" for e in events)
