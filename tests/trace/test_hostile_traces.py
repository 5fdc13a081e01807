"""Hostile traces: a real trace (decided by the native core) mutated the ways a fuzzing pass
found to crash or stall the reader and the replay. Each must end quickly in one
``TraceFormatError`` line naming the file, the line and the field, and ``moescope replay``
must print that line and exit 2, never a traceback."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moescope.cache.policy import Policy
from moescope.cli import main
from moescope.sim.replay import decision_mismatches, replay
from moescope.trace import (
    MAX_BLANK_LINES,
    MAX_LINE_BYTES,
    MAX_STEP_SLACK,
    Trace,
    TraceFormatError,
    policy_to_json,
    read_trace,
)
from moescope_testing.traces import core_trace

Edit = Callable[[dict[str, Any]], None]
TOKEN_LINE = 3
"""The line of token 1 (line 1 is the header, line 2 token 0, the prefill)."""


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return core_trace(tmp_path_factory.mktemp("hostile") / "core.jsonl")


def _edit_line(source: Path, dest: Path, line: int, edit: Edit) -> Path:
    lines = source.read_text().splitlines()
    obj = json.loads(lines[line - 1])
    edit(obj)
    lines[line - 1] = json.dumps(obj)
    dest.write_text("\n".join(lines) + "\n")
    return dest


def _set(*path: Any, value: Any) -> Edit:
    """An edit that sets the field at ``path`` (keys and list indices) to ``value``."""
    def edit(obj: dict[str, Any]) -> None:
        target: Any = obj
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


def _apply(*path: Any, fn: Callable[[Any], Any]) -> Edit:
    def edit(obj: dict[str, Any]) -> None:
        target: Any = obj
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = fn(target[path[-1]])
    return edit


def _policy(**changes: Any) -> dict[str, Any]:
    return policy_to_json(Policy.preset("quality-first")) | changes


HEADER: dict[str, tuple[Edit, str]] = {
    "negative n_layers": (_set("model", "n_layers", value=-1),
                          r"model\.n_layers -1 is outside 1\.\.1024"),
    "2^31 experts": (_set("model", "n_expert", value=2**31),
                     r"model\.n_expert 2147483648 is outside 1\.\.8192"),
    "2^63 layers": (_set("model", "n_layers", value=2**63),
                    r"model\.n_layers 9223372036854775808 is outside"),
    "2^64 top-k": (_set("model", "top_k", value=2**64),
                   r"model\.top_k 18446744073709551616 is outside"),
    "huge geometry": (lambda h: h["model"].update(n_layers=1024, n_expert=8192),
                      r"1024 layers x 8192 experts is more than"),
    "moe_layers object": (_set("model", "moe_layers", value={"1": 1}),
                          r"model\.moe_layers is an object, not a list"),
    "moe_layers nested": (_set("model", "moe_layers", value=[[1], [2]]),
                          r"model\.moe_layers\[0\] is a list of 1, not an integer"),
    "bytes negative": (_set("model", "bytes_per_expert", value=[-1, 5]),
                       r"model\.bytes_per_expert\[0\] -1 is outside"),
    "initial_state list": (_set("initial_state", value=[]),
                           r"initial_state is a list of 0, not an object"),
    "initial step 1e12": (_set("initial_state", "step", value=10**12),
                          r"initial_state\.step 1000000000000 is outside 0\.\.1048576"),
    "initial step float": (_set("initial_state", "step", value=1e12),
                           r"initial_state\.step is 1000000000000\.0, not an integer"),
    "half_life 1e-300": (_set("policy", "half_life", value=1e-300),
                         r"policy: half_life must be between"),
    "theta as text": (_set("policy", "theta", value="0.1"),
                      r"policy\.theta is '0\.1', not a number"),
    "policy list": (_set("policy", value=[]), r"policy is a list of 0, not an object"),
    "slots 2^63": (_set("slots_per_layer", value=2**63),
                   r"slots_per_layer 9223372036854775808 is outside"),
}

TOKEN: dict[str, tuple[Edit, str]] = {
    "events object": (_set("events", value={}), r"events is an object, not a list"),
    "event step 1e12": (_set("events", 0, "step", value=10**12),
                        r"events\[0\]\.step 1000000000000 is beyond step"),
    "k 2^31": (_set("events", 0, "k", value=2**31),
               r"events\[0\]\.k 2147483648 is not the model's top-k 4"),
    "layer 1e12": (_set("events", 1, "layer", value=10**12),
                   r"events\[1\]\.layer 1000000000000 is not a MoE layer"),
    "negative weight": (_set("events", 0, "weights", 0, value=-0.5),
                        r"events\[0\]\.weights\[0\] -0\.5 is not a normalized weight"),
    "negative mass": (_set("events", 1, "substituted_mass", value=-1.0),
                      r"events\[1\]\.substituted_mass -1\.0 is not a substituted weight"),
    "action 7": (_set("events", 0, "action", 2, value=7),
                 r"events\[0\]\.action\[2\] 7 is not an action"),
    "slot -1": (_set("events", 0, "slots", 0, value=-1),
                r"events\[0\]\.slots\[0\] -1 is not a slot \(0\.\.5\)"),
    "slot 1e9": (_set("events", 0, "slots", 3, value=10**9),
                 r"events\[0\]\.slots\[3\] 1000000000 is not a slot \(0\.\.5\)"),
    "expert 16": (_set("events", 1, "ids", 1, value=16),
                  r"events\[1\]\.ids\[1\] 16 is not an expert \(0\.\.15\)"),
    "expert 2^64": (_set("events", 0, "ids", 0, value=2**64),
                    r"events\[0\]\.ids\[0\] 18446744073709551616 is outside the 64-bit"),
    "duplicate ids": (_apply("events", 0, "ids", fn=lambda ids: [ids[0]] * len(ids)),
                      r"events\[0\]\.ids names expert \d+ twice"),
    "nested ids": (_apply("events", 0, "ids", fn=lambda ids: [[i] for i in ids]),
                   r"events\[0\]\.ids\[0\] is a list of 1, not an integer"),
    "counts disagree": (_apply("events", 0, "n_hit", fn=lambda n: n + 1),
                        r"events\[0\]\.n_hit \d+ does not match the row's actions"),
    "routes object": (_set("routes", value={"0": 1}), r"routes is an object, not a list"),
    "nested route ids": (_apply("routes", 0, "ids", fn=lambda ids: [[i] for i in ids]),
                         r"routes\[0\]\.ids\[0\] is a list of 1, not an integer"),
    "short route": (_apply("routes", 1, "ids", fn=lambda ids: ids[:3]),
                    r"routes\[1\]\.ids is a list of 3, expected a list of 4"),
    "negative gate weight": (_set("routes", 0, "weights", 1, value=-2.0),
                             r"routes\[0\]\.weights\[1\] -2\.0 is not a gate weight"),
    "duplicate route ids": (_apply("routes", 0, "ids", fn=lambda ids: [ids[1]] * len(ids)),
                            r"routes\[0\]\.ids names expert \d+ twice"),
    "timings list": (_set("timings", value=[]), r"timings is a list of 0, not an object"),
    "timings 2^70": (_set("timings", value={"route_us": 2**70}),
                     r"timings\.route_us 1180591620717411303424 is outside"),
    "policy change half_life": (_set("changes", value=[{"kind": "policy", "policy":
                                                        _policy(half_life=1e-300)}]),
                                r"changes\[0\]\.policy: half_life must be between"),
    "slots change 2^40": (_set("changes", value=[{"kind": "slots", "slots": 2**40}]),
                          r"a budget change to 1099511627776 slots is outside"),
    "negative prefetch count": (_set("prefetch", value=[[1, -1, 0]]),
                                r"prefetch\[0\] prefetches -1 is outside"),
    "token id 2^63": (_set("token_id", value=2**63), r"token_id 9223372036854775808 is outside"),
    "no type": (lambda d: d.pop("type"), r"bad record: type is null, not a record type"),
}


def _expect(path: Path, line: int, says: str) -> None:
    with pytest.raises(TraceFormatError, match=rf"^{path.name}: line {line}: .*{says}"):
        read_trace(path)


@pytest.mark.parametrize("name", list(HEADER))
def test_a_hostile_header_is_refused_naming_its_field(good: Path, tmp_path: Path,
                                                      name: str) -> None:
    edit, says = HEADER[name]
    _expect(_edit_line(good, tmp_path / "bad.jsonl", 1, edit), 1, says)


@pytest.mark.parametrize("name", list(TOKEN))
def test_a_hostile_token_is_refused_naming_its_field(good: Path, tmp_path: Path,
                                                     name: str) -> None:
    edit, says = TOKEN[name]
    _expect(_edit_line(good, tmp_path / "bad.jsonl", TOKEN_LINE, edit), TOKEN_LINE, says)


def test_steps_may_not_go_back(good: Path, tmp_path: Path) -> None:
    bad = _edit_line(good, tmp_path / "bad.jsonl", TOKEN_LINE + 1,
                     _set("events", 0, "step", value=0))
    _expect(bad, TOKEN_LINE + 1, r"events\[0\]\.step 0 goes back \(after step 1\)")


def _raw_edit(source: Path, dest: Path, line: int, old: str, new: str) -> Path:
    lines = source.read_text().splitlines()
    assert old in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    dest.write_text("\n".join(lines) + "\n")
    return dest


@pytest.mark.parametrize(("new", "says"), [
    ('"seconds":NaN', r"not valid JSON \(NaN is not a number a trace can hold\)"),
    ('"seconds":-Infinity', r"not valid JSON \(-Infinity is not a number"),
    ('"seconds":1e999', r"bad token record: seconds inf is outside 0\.\.1e\+09"),
    ('"events":' + "[" * 100_000 + "]" * 100_000 + ',"x":', r"not valid JSON \(nested deeper"),
    ('"events":' + "[" * 500 + "]" * 500 + ',"x":', r"events\[0\] is a list of 1, not an object"),
])
def test_json_that_python_would_choke_on_is_one_line(good: Path, tmp_path: Path, new: str,
                                                    says: str) -> None:
    old = '"seconds":0.001' if "seconds" in new else '"events":'
    if "events" in new:  # the trace's own events move to a field the reader ignores
        new = new.replace(',"x":', ',"old_events":')
    _expect(_raw_edit(good, tmp_path / "bad.jsonl", TOKEN_LINE, old, new), TOKEN_LINE, says)


# --------------------------------------------------------------------------- volume


def _gzip_with(path: Path, head: bytes, filler: bytes, count: int) -> Path:
    """``head``, then ``filler`` ``count`` times, compressed as one gzip stream (in chunks:
    the inflated file is never held in memory)."""
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(head)
        for _ in range(count):
            f.write(filler)
    return path


def test_a_gzip_of_newlines_ends_after_a_bounded_number_of_lines(good: Path,
                                                                  tmp_path: Path) -> None:
    header = good.read_bytes().split(b"\n", 1)[0] + b"\n"
    bomb = _gzip_with(tmp_path / "bomb.jsonl.gz", header, b"\n" * (1 << 20), 64)  # 64 MiB
    calls: list[int] = []
    with pytest.raises(TraceFormatError,
                       match=rf"line {MAX_BLANK_LINES + 2}: more than {MAX_BLANK_LINES} "
                             r"blank lines"):
        read_trace(bomb, progress=lambda done, size: calls.append(done) is None)
    assert len(calls) <= MAX_BLANK_LINES + 2  # stopped early, not after 64 Mi lines


def test_an_endless_line_ends_at_the_line_cap(good: Path, tmp_path: Path) -> None:
    header = good.read_bytes().split(b"\n", 1)[0] + b"\n"
    chunks = MAX_LINE_BYTES // (1 << 20) + 8
    bomb = _gzip_with(tmp_path / "line.jsonl.gz", header, b" " * (1 << 20), chunks)
    with pytest.raises(TraceFormatError, match=r"line 2 is longer than 64 MiB"):
        read_trace(bomb)


def test_records_of_unknown_types_are_skipped_only_within_reason(good: Path,
                                                                 tmp_path: Path) -> None:
    lines = good.read_text().splitlines()
    few = tmp_path / "few.jsonl"
    few.write_text("\n".join([lines[0], '{"type": "newer"}', *lines[1:]]) + "\n")
    assert len(read_trace(few).tokens) == 8  # a newer minor version's record
    many = tmp_path / "many.jsonl"
    many.write_text("\n".join([lines[0], *['{"type": "newer"}'] * 3000]) + "\n")
    _expect(many, 1026, r"records of unknown types")


# --------------------------------------------------------------------------- gzip


@pytest.fixture(scope="module")
def good_gz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return core_trace(tmp_path_factory.mktemp("hostile-gz") / "core.jsonl.gz", n_tokens=12)


def _flip(source: Path, dest: Path, offset: int, mask: int = 0x55) -> Path:
    data = bytearray(source.read_bytes())
    data[offset] ^= mask
    dest.write_bytes(bytes(data))
    return dest


def test_a_bad_crc_is_a_corrupt_stream_not_a_cut_off_session(good_gz: Path,
                                                             tmp_path: Path) -> None:
    bad = _flip(good_gz, tmp_path / "crc.jsonl.gz", len(good_gz.read_bytes()) - 6, 1)
    with pytest.raises(TraceFormatError, match=r"^crc\.jsonl\.gz: corrupt gzip stream at line "
                                               r"\d+ .*CRC check failed"):
        read_trace(bad)


@pytest.mark.parametrize("where", [0.2, 0.4, 0.5, 0.6, 0.8])
def test_corruption_in_the_middle_is_a_corrupt_stream(good_gz: Path, tmp_path: Path,
                                                      where: float) -> None:
    offset = int(len(good_gz.read_bytes()) * where)
    bad = _flip(good_gz, tmp_path / "mid.jsonl.gz", offset)
    with pytest.raises(TraceFormatError, match=r"^mid\.jsonl\.gz: corrupt gzip stream at line"):
        read_trace(bad)


def test_garbage_after_the_stream_is_corrupt(good_gz: Path, tmp_path: Path) -> None:
    bad = tmp_path / "tail.jsonl.gz"
    bad.write_bytes(good_gz.read_bytes() + b"not gzip at all")
    with pytest.raises(TraceFormatError, match=r"corrupt gzip stream at line 15 .*Not a gzipped"):
        read_trace(bad)


@pytest.mark.parametrize("keep", [0.3, 0.55, 0.9, 0.999])
def test_a_stream_cut_off_still_reads_as_a_cut_off_session(good_gz: Path, tmp_path: Path,
                                                           keep: float) -> None:
    data = good_gz.read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: int(len(data) * keep)])
    trace = read_trace(cut)
    whole = read_trace(good_gz)
    assert trace.truncated and 0 < len(trace.tokens) <= len(whole.tokens)
    assert trace.end is None or keep > 0.99  # a cut in the trailer keeps every record
    for a, b in zip(trace.tokens, whole.tokens, strict=False):
        assert a.events.tobytes() == b.events.tobytes()


def test_the_cli_says_corrupt_in_one_line_and_cut_off_in_a_note(
        good_gz: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _flip(good_gz, tmp_path / "crc.jsonl.gz", len(good_gz.read_bytes()) - 6, 1)
    assert main(["replay", str(bad), "-p", "recorded"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("moescope: error: crc.jsonl.gz: corrupt gzip stream at line ")
    data = good_gz.read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: int(len(data) * 0.7)])
    assert main(["replay", str(cut), "-p", "recorded"]) == 0
    assert "the session was cut off" in capsys.readouterr().err


def test_a_corrupt_deflate_block_is_not_taken_for_the_end_of_the_file(tmp_path: Path) -> None:
    """zlib's own error (an invalid block), not only the CRC, is a corrupt stream."""
    trace = core_trace(tmp_path / "t.jsonl", n_tokens=4)
    deflate = zlib.compressobj(wbits=31)
    data = deflate.compress(trace.read_bytes()) + deflate.flush()
    data = data[:10] + b"\xff" * 4 + data[14:]  # the first block's header: type 3, invalid
    (tmp_path / "b.jsonl.gz").write_bytes(data)
    with pytest.raises(TraceFormatError, match=r"corrupt gzip stream at line 1 .*invalid"):
        read_trace(tmp_path / "b.jsonl.gz")


# --------------------------------------------------------------------------- steps


def _shift_steps(source: Path, dest: Path, by: int, first_line: int,
                 initial: int | None = None) -> Path:
    lines = source.read_text().splitlines()
    for i in range(len(lines)):
        obj = json.loads(lines[i])
        if i == 0 and initial is not None:
            obj["initial_state"]["step"] = initial
        if obj["type"] == "token" and i + 1 >= first_line:
            for e in obj["events"]:
                e["step"] += by
        lines[i] = json.dumps(obj)
    dest.write_text("\n".join(lines) + "\n")
    return dest


def test_a_gap_in_the_steps_is_walked(good: Path, tmp_path: Path) -> None:
    """Rows missing between tokens (steps jump by 5000): the reader accepts it, and the
    replay walks the gap (warning that rows are missing) to the recorded steps."""
    trace = read_trace(_shift_steps(good, tmp_path / "gap.jsonl", 5000, TOKEN_LINE))
    result = replay(trace, keep_events=True)
    assert result.events is not None
    assert any("jumps from step 0 to 5001" in w for w in result.warnings)
    np.testing.assert_array_equal(result.events["step"], trace.events()["step"])


def test_a_late_start_replays_exactly_from_its_initial_step(good: Path,
                                                            tmp_path: Path) -> None:
    """A recording that began at step 5000 (the initial_state says so) replays from there,
    row for row, walking the first 5000 steps at once."""
    trace = read_trace(_shift_steps(good, tmp_path / "late.jsonl", 5000, 2, initial=5000))
    result = replay(trace, keep_events=True)
    assert result.events is not None and not result.warnings
    assert decision_mismatches(trace.events(), result.events) == []


def test_a_trace_built_in_memory_cannot_make_the_replay_walk_for_hours(good: Path) -> None:
    trace = read_trace(good)
    far = Trace(header=trace.header, tokens=trace.tokens, path=good)
    far.tokens[3].events["step"] += 10**12
    far.tokens[4:] = []
    with pytest.raises(TraceFormatError, match="outside what its records can reach"):
        replay(far)


def test_the_core_made_trace_replays_exactly(good: Path) -> None:
    """The mutations above start from a trace the replay reproduces row for row."""
    trace = read_trace(good)
    result = replay(trace, keep_events=True)
    assert result.events is not None and not result.warnings
    assert decision_mismatches(trace.events(), result.events) == []
    assert trace.header.initial_step == 0 and int(trace.events()["step"].max()) == 7
    assert MAX_STEP_SLACK >= 1 << 16 and np.all(np.diff(trace.events()["step"]) >= 0)


@pytest.mark.parametrize("case", [*(("header", n) for n in HEADER), *(("token", n) for n in TOKEN)])
def test_replay_prints_each_as_one_line_and_exits_2(good: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    case: tuple[str, str]) -> None:
    where, name = case
    edit, _ = (HEADER if where == "header" else TOKEN)[name]
    bad = _edit_line(good, tmp_path / "bad.jsonl", 1 if where == "header" else TOKEN_LINE,
                     edit)
    assert main(["replay", str(bad), "-p", "recorded,exact,psr", "-b", "recorded,50%"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"moescope: error: bad.jsonl: line {1 if where == 'header' else 3}: ")


@pytest.mark.parametrize(("name", "said"), [("x.parquet", "not a Parquet file"),
                                            ("x.ARROWS", "not an Arrow stream")])
def test_junk_named_as_a_binary_trace_says_what_it_is_not(tmp_path: Path, name: str,
                                                          said: str) -> None:
    """A text file named .parquet or .arrows was read as JSON Lines and refused as "line 1:
    not valid JSON", which sends a user looking for JSON in a binary format."""
    p = tmp_path / name
    p.write_bytes(b"hello, not a trace\n")
    with pytest.raises(TraceFormatError, match=f"^{name}: {said}, so not a MoEScope trace$"):
        read_trace(p)
    assert p.read_bytes() == b"hello, not a trace\n"
    p.write_bytes(b'{"type": "header"}\n')  # JSON Lines (x.PARQUET recorded it once):
    with pytest.raises(TraceFormatError) as err:  # read as such
        read_trace(p)
    assert said not in str(err.value)


@pytest.mark.parametrize(("suffix", "said"), [(".parquet", "not a Parquet file"),
                                              (".arrows", "not an Arrow stream")])
@pytest.mark.parametrize("n_bytes", [1, 2, 3])
def test_a_binary_trace_cut_within_its_magic_says_what_it_is_not(
        tmp_path: Path, suffix: str, said: str, n_bytes: int) -> None:
    """A .parquet or .arrows cut to 1-3 bytes (shorter than its 4-byte magic) was read as
    JSON Lines: "not a MoEScope trace (its first line is not a JSON record: ...)"."""
    p = tmp_path / f"x{suffix}"
    p.write_bytes((b"PAR1" if suffix == ".parquet" else b"\xff\xff\xff\xff")[:n_bytes])
    with pytest.raises(TraceFormatError, match=f"^x{suffix}: {said}, so not a MoEScope "
                                               "trace$"):
        read_trace(p)


@pytest.mark.parametrize("argv", [["replay"], ["trace", "compact"]])
def test_a_fifo_or_a_device_as_the_trace_is_one_line_not_a_hang(argv: list[str],
                                                                 tmp_path: Path) -> None:
    """A FIFO given as the trace blocked ``replay`` and ``trace compact`` in its open until
    something wrote to it (forever, for a mistyped name); ``/dev/zero`` was read to the
    64 MiB line cap. Both are refused, by what they are, before being opened."""
    import os

    from moescope_testing.forkrun import ForkRunner

    fifo = tmp_path / "session.arrows"
    os.mkfifo(fifo)
    with ForkRunner(timeout=20.0, cpu_seconds=20, scratch=tmp_path) as runner:
        for path, what in ((fifo, "a FIFO (named pipe)"), (Path("/dev/zero"), "a device")):
            r = runner.run([*argv, str(path)])
            assert r.outcome == "error", (r.outcome, r.stderr[-1000:])
            assert r.stderr == (f"moescope: error: {path}: {what}, not a regular file; a "
                                "trace is read from a file\n")


@pytest.mark.skipif(__import__("os").name != "posix", reason="advisory locks (flock)")
def test_trace_compact_leaves_alone_a_journal_a_live_session_records(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``moescope trace compact NAME.parquet.journal.arrows`` while a session (another
    window, a ``chat --trace``) was recording to it compacted it and removed it: every
    token after was lost, and the session's own compaction found no journal."""
    from trace_helpers import psr_header

    from moescope.trace.parquet_format import ParquetTraceWriter

    path = tmp_path / "s.parquet"
    writer = ParquetTraceWriter(path, psr_header())
    journal = writer.journal
    before = journal.read_bytes()
    for argv in (["trace", "compact", str(journal)],
                 ["trace", "compact", "--keep", str(journal), str(tmp_path / "o.parquet")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err == (f"moescope: error: {journal}: a session is recording to it (or "
                       "compacting it) now; not compacted: run this again once it has "
                       "ended\n")
    assert journal.read_bytes() == before and not path.exists()
    assert not (tmp_path / "o.parquet").exists()
    writer.close()  # the session's own compaction still finds its journal
    assert path.is_file() and not journal.exists()


@pytest.mark.skipif(__import__("os").name != "posix", reason="advisory locks (flock)")
def test_recording_to_a_name_a_live_session_records_says_so_not_compact_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``generate --trace s.parquet`` while another session records s.parquet: the advice
    was "a session cut off? `moescope trace compact` finishes it", for a live journal."""
    from trace_helpers import psr_header

    from moescope.trace.parquet_format import ParquetTraceWriter

    path = tmp_path / "s.parquet"
    writer = ParquetTraceWriter(path, psr_header())
    assert main(["generate", str(tmp_path / "never-read.gguf"), "--trace", str(path)]) == 2
    assert capsys.readouterr().err == (f"moescope: error: {writer.journal}: a session is "
                                       "recording to this name now; give another name\n")
    writer.close()
    left = tmp_path / "t.parquet.journal.arrows"  # a leftover (no lock): compact it
    left.write_bytes(b"a killed session's tokens")
    assert main(["generate", str(tmp_path / "never-read.gguf"), "--trace",
                 str(tmp_path / "t.parquet")]) == 2
    assert "a session cut off?" in capsys.readouterr().err


@pytest.mark.skipif(__import__("sys").platform != "linux", reason="names of any bytes")
def test_binary_traces_whose_names_are_not_utf8_read_and_compact(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file name with a byte 0xff (valid on Linux; Python holds it as a surrogate):
    pyarrow encodes a str path as UTF-8, so such an .arrows or .parquet trace was "not a
    readable Arrow trace ('utf-8' codec can't encode character '\\udcff' ...)"."""
    import os
    import subprocess
    import sys

    from moescope.trace.peek import peek_trace

    arrows = core_trace(tmp_path / os.fsdecode(b"\xff.arrows"))
    parquet = tmp_path / os.fsdecode(b"\xfe.parquet")
    # a UTF-8 locale's strict standard output (en_US.UTF-8): printing the name written
    # was a UnicodeEncodeError traceback once the file was written
    r = subprocess.run([sys.executable, "-m", "moescope", "trace", "compact", "--keep",
                        os.fsencode(arrows), os.fsencode(parquet)], capture_output=True,
                       env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"}, check=False)
    assert r.returncode == 0 and r.stderr == b"", r.stderr[-2000:]
    assert r.stdout.startswith(os.fsencode(parquet) + b": ")
    n = len(read_trace(core_trace(tmp_path / "t.jsonl")).tokens)
    for p in (arrows, parquet):
        assert len(read_trace(p).tokens) == n
        assert peek_trace(p) is not None
        assert main(["replay", str(p), "--policy", "exact"]) == 0, capsys.readouterr().err
