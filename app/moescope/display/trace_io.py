"""Session traces in the window: the shared format of :mod:`moescope.trace`.

The worker records every answer with ``trace.TraceRecorder`` (on the decode thread,
the only one allowed to read the engine), so a GUI session is a normal MoEScope trace: the
simulator can replay it and ``moescope replay`` reads it. This module does the GUI's part:
export a copy (plus Perfetto JSON), and turn a trace back into the snapshots the cache
panel draws, through the same :class:`CacheModel` code as a live session.

Residency is rebuilt from the event rows (what a token hit, fetched, used as a substitute,
admitted or evicted) by :class:`moescope.cache.residency.Residency`, the same code the
recorder runs, and corrected by the real masks the recorder wrote where the rows do not
explain it (PSR prefetches, budget shrinks): every reopened token's resident mask is the
one the live panel read. A trace written before those masks has none; after a budget
*shrink* its residency keeps the most recently used experts, a guess, until the cache
turns over (:attr:`ReopenedTrace.approximate_from`), and PSR's unused prefetches are
missing from it.

PSR's prefetch counters come from the trace's own per-token record (the core writes no
event row for a prefetch), and a token carries them in its snapshot only when its policy
prefetched, exactly the live worker's rule, so the panel shows prefetch accuracy when and
as it did live. A trace from before the counters has none: its accuracy is unknown, and
:attr:`ReopenedTrace.prefetch_unrecorded` says for how many prefetching tokens.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
import numpy.typing as npt

from moescope.cache.prefetch import PrefetchSummary, summarize
from moescope.cache.residency import Residency
from moescope.display.cache_model import CacheModel, prefetch_text
from moescope.display.whatif_model import cost_model_choices
from moescope.model.reasoning import answer_begins
from moescope.session.snapshots import ModelSummary, TokenSnapshot
from moescope.trace import (
    ANSWER_NOW_NOTE,
    Change,
    ReadProgress,
    TokenRecord,
    Trace,
    TraceFormatError,
    TraceReadCancelled,
    read_trace,
)
from moescope.trace.arrow_format import ColumnToken
from moescope.trace.names import (
    JOURNAL_SUFFIX,
    RECORD_SUFFIX,
    TRACE_SUFFIXES,
    journal_path,
    live_trace_file,
    session_stem,
    trace_suffix,
    with_trace_suffix,
)
from moescope.trace.perfetto import dump_perfetto
from moescope.trace.tokens_csv import dump_tokens_csv
from moescope.util.errors import MoEScopeError
from moescope.util.files import StagedOutputs, check_output

T = TypeVar("T")

KEEP_TRACES = 20
"""Recorded sessions kept in the data directory (older ones are deleted at start and
before each new session; see :class:`TraceLimits`)."""


@dataclass(frozen=True)
class TraceLimits:
    """How much disk the recorded sessions may take: traces are on by default, and at a
    large model's geometry (48 MoE layers x 512 experts) one token with router inputs is
    about 89 kB (Parquet; 112 kB in the journal it is recorded to, an Arrow stream; 170 kB
    as JSON Lines), so a long chat writes gigabytes unless something bounds it. The limits
    count the journal's bytes while a session records."""

    keep: int = KEEP_TRACES
    """At most this many sessions are kept (the newest)."""
    session_bytes: int = 2 << 30
    """A session's recording stops once its trace reaches this size (the chat goes on)."""
    total_bytes: int = 8 << 30
    """All kept sessions together, the one being recorded included."""


def new_trace_path(directory: Path, model_path: str) -> Path:
    """Where the worker records a new session, in :data:`RECORD_SUFFIX`'s format: named by
    time and model, and never the name of an existing session, whatever its format (two
    sessions can start in one second: a reload, a comparison)."""
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{Path(model_path).stem}"
    name, n = stem, 1
    while _session_exists(directory, name):
        n += 1
        name = f"{stem}-{n}"
    return directory / f"{name}{RECORD_SUFFIX}"


NEW_NAME_TRIES = 10
"""Names :func:`open_new_session` tries before it gives up."""


def open_new_session(directory: Path, model_path: str, open_at: Callable[[Path], T]) -> T:
    """``open_at(path)`` (a recorder, say) for a new session at :func:`new_trace_path`, and
    at the next free name if another process's session took that one meanwhile: two
    windows on one traces folder starting sessions of one model in the same second pick the
    same name, and the one that creates its journal second would otherwise not record."""
    from moescope.trace.parquet_format import JournalExistsError

    for _ in range(NEW_NAME_TRIES - 1):
        with contextlib.suppress(JournalExistsError):
            return open_at(new_trace_path(directory, model_path))
    return open_at(new_trace_path(directory, model_path))


def _session_exists(directory: Path, stem: str) -> bool:
    return any((directory / f"{stem}{s}").exists() or journal_path(directory / f"{stem}{s}")
               .exists() for s in TRACE_SUFFIXES)


def prune_traces(directory: Path, limits: TraceLimits = TraceLimits(),
                 room: int = 0, keep: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """Delete the oldest recorded sessions until at most ``limits.keep`` are left and they
    take at most ``limits.total_bytes`` minus ``room`` (the room a session about to start
    may take); returns the files deleted. A session is every trace file of one name, in any
    format the reader opens (an older ``.jsonl`` too), a journal included; other files are
    never touched, and files that vanish meanwhile are skipped.

    Live sessions are never deleted (they count as kept): those of ``keep`` (any of a
    session's file names: the one being recorded, the journals being compacted) and any
    whose journal another writer or compaction holds (:func:`lock_journal`: another
    window's)."""
    sessions: dict[str, list[tuple[float, int, Path]]] = {}
    try:
        entries = list(directory.iterdir())
    except OSError:  # no folder yet (nothing recorded), or unreadable: nothing to prune
        return []
    live = {session_stem(Path(p).name) for p in keep} - {None}
    for p in entries:
        stem = session_stem(p.name)
        if stem is None:
            continue
        with contextlib.suppress(OSError):
            st = p.lstat()
            if stat.S_ISREG(st.st_mode):
                sessions.setdefault(stem, []).append((st.st_mtime, st.st_size, p))
    order = sorted(sessions.items(), key=lambda kv: max(f[0] for f in kv[1]), reverse=True)
    budget = max(0, limits.total_bytes - room)
    kept_bytes = sum(f[1] for stem, files in order if stem in live for f in files)
    gone = []
    for n, (stem, files) in enumerate(order):
        if stem in live:
            continue
        size = sum(f[1] for f in files)
        if n < limits.keep and kept_bytes + size <= budget:
            kept_bytes += size
            continue
        if _in_use(files):
            continue
        for _, _, p in files:
            with contextlib.suppress(OSError):
                p.unlink(missing_ok=True)
                gone.append(p)
    return gone


def _in_use(files: list[tuple[float, int, Path]]) -> bool:
    """Whether a session's journal is locked by a live writer or compaction."""
    from moescope.trace.parquet_format import lock_journal

    for _, _, p in files:
        if p.name.endswith(JOURNAL_SUFFIX):
            lock = lock_journal(p)
            if lock is None:
                return p.exists()
            os.close(lock)
    return False


EXPORT_STAGES: tuple[tuple[str, float], ...] = (
    ("copying", 0.25), ("reading", 0.15), ("writing the Perfetto timeline", 0.5),
    ("writing the tokens CSV", 0.1))
"""An export's stages, in order, each with its share of the whole (for one progress bar;
rough shares of a long trace's export time: the timeline took two thirds of 0.6 s for a
67 MB Arrow trace whose copy was in the page cache)."""
ExportProgress = Callable[[str, int, int], bool]
"""``progress(stage, done, total)`` as an export goes (``stage`` from
:data:`EXPORT_STAGES`; bytes while copying and reading, tokens after); False cancels it
(:class:`ExportCancelled`)."""
_COPY_CHUNK = 1 << 20


class ExportCancelled(MoEScopeError):
    """An export stopped by its ``progress`` callback; nothing was written."""


def export_session(recorded: Path, dest: Path,
                   progress: ExportProgress | None = None) -> tuple[Path, Path, Path]:
    """Copy a trace to ``dest`` and write Perfetto JSON and a per-token CSV next to it;
    returns the three paths. ``recorded`` is the live session's trace or any trace file
    opened in a trace window: both GUI exports (File ▸ Export trace, the trace window's
    Export) come here, so they write the same files under the same rules.

    The copy keeps the recorded file's format, so its name gets that format's suffix
    (``dest``'s own trace suffix, if any, is replaced: a name must not say JSON Lines over
    an Arrow stream); a session still being recorded to a journal exports the journal, an
    Arrow stream. All three outputs are checked before anything is written (none may be the
    trace itself, a folder or a device: ``OutputPathError``), and the three are written
    together or not at all (:class:`moescope.util.files.StagedOutputs`: ``OSError`` for a
    full disk, :class:`ExportCancelled` when ``progress`` says stop, at any stage, leave
    every output as it was); a session with no token yet is ``TraceFormatError`` and
    writes nothing.

    Safe while recording continues: the recorder flushes whole records, and a reader drops
    a half-written last one. The Perfetto and CSV files are made from the copy, so the
    three agree.
    """
    try:
        return _export(recorded, dest, progress)
    except FileNotFoundError:
        if not recorded.exists():
            raise
        return _export(recorded, dest, progress)  # the journal was finished meanwhile


def export_targets(recorded: Path, dest: Path) -> tuple[Path, Path, Path]:
    """The three files :func:`export_session` would write for ``dest``: the copy (named with
    the recorded format's suffix), its Perfetto JSON and its tokens CSV. A save dialog
    confirms only the name typed, so the window asks about these before replacing any."""
    suffix = trace_suffix(live_trace_file(recorded).name)
    target = with_trace_suffix(dest, suffix) if suffix is not None else dest
    return (target, *_companions(target, suffix))


def _export(recorded: Path, dest: Path,
            progress: ExportProgress | None) -> tuple[Path, Path, Path]:
    source = live_trace_file(recorded)
    if nothing_recorded(source):
        raise TraceFormatError(f"{source.name}: nothing recorded yet (a session's trace "
                               "begins with its first token)")
    target, perfetto, csv = export_targets(recorded, dest)
    for out in (target, perfetto, csv):  # before anything is written: all or none
        check_output(out, [source])
    copying, reading, timeline, table = (name for name, _ in EXPORT_STAGES)

    def report(stage: str) -> Callable[[int, int], bool]:
        def hook(done: int, total: int) -> bool:
            if progress is not None and not progress(stage, done, total):
                raise ExportCancelled("the export was cancelled; nothing was written")
            return True
        return hook

    with StagedOutputs([source]) as staged:
        with open(source, "rb") as src:
            size = os.fstat(src.fileno()).st_size
            copy = staged.stage(target, lambda f: _copy(src, f, size, report(copying)))
        try:
            trace = read_trace(copy, report(reading))
        except TraceReadCancelled:
            raise ExportCancelled("the export was cancelled; nothing was written") from None
        except TraceFormatError as err:  # the copy is the trace's bytes: the trace is bad,
            # so its error names the trace, not the temporary (nor the output, which it read
            # as a fault of what was being written)
            text = str(err).replace(str(copy), str(source)).replace(copy.name, source.name)
            raise TraceFormatError(text) from None
        staged.stage(perfetto, lambda f: dump_perfetto(trace, f, report(timeline)))
        staged.stage(csv, lambda f: dump_tokens_csv(trace, f, report(table)))
        staged.commit()
    return target, perfetto, csv


def _copy(src: BinaryIO, out: BinaryIO, size: int, hook: Callable[[int, int], bool]) -> None:
    """Copy ``src`` to ``out`` in chunks, telling ``hook`` the bytes done of ``size`` (a
    file still being recorded may grow meanwhile: the copy ends where it was opened)."""
    done = 0
    while done < size:
        chunk = src.read(min(_COPY_CHUNK, size - done))
        if not chunk:
            break
        out.write(chunk)
        done += len(chunk)
        hook(done, size)


def _companions(target: Path, suffix: str | None) -> tuple[Path, Path]:
    """The Perfetto JSON and per-token CSV written next to an exported trace."""
    stem = target.name[:-len(suffix)] if suffix is not None else target.stem
    return (target.with_name(f"{stem}.perfetto.json"),
            target.with_name(f"{stem}.tokens.csv"))


def nothing_recorded(path: Path) -> bool:
    """Whether ``path`` is an empty file: a session's journal before its first token (an
    Arrow stream's header goes out with its first batch), which no reader opens."""
    try:
        st = path.stat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == 0


def read_session(path: str | Path, progress: ReadProgress | None = None) -> Trace:
    """Read a session's trace from whatever is on disk (:func:`live_trace_file`: the
    finished file, else its journal). A journal compacted and removed while it was being
    opened (the reader opens a file more than once) is read again from the finished file:
    a background compaction's rename is never an error to a reader."""
    source = live_trace_file(path)
    try:
        return read_trace(source, progress)
    except (OSError, TraceFormatError):
        again = live_trace_file(path)
        if again == source or source.exists():
            raise
        return read_trace(again, progress)


@dataclass
class ReopenedTrace:
    model: ModelSummary
    tokens: list[TokenSnapshot]
    """The tokens as the live window had them; only the last keeps its ``resident`` mask
    (the heatmap's), the others' are in :meth:`resident` (8 times smaller: a 10,000-token
    trace of Qwen3-Next's shape held 246 MB of them)."""
    trace: Trace
    packed_resident: npt.NDArray[np.uint8] | None = None
    """Each token's residency after it, as bits (tokens x MoE layers x experts / 8)."""
    approximate_from: int | None = None
    """First step whose rebuilt residency is approximate: a budget shrink in a trace
    written before the recorder wrote resident masks (None for every newer trace)."""
    prefetch: PrefetchSummary | None = None
    """PSR over every token whose policy prefetched and whose counters were recorded;
    None when there is none (no policy prefetched, or the trace predates the counters)."""
    prefetch_unrecorded: int = 0
    """Tokens whose policy prefetched but whose trace line has no counters (an older
    trace): their prefetch accuracy is unknown, not zero."""
    cache: CacheModel | None = None
    """The cache panel's numbers, every token accounted (:func:`account`, where the trace
    was read); None: the window accounts them."""
    cost_choices: dict[str, str | None] | None = None
    """:func:`~moescope.display.whatif_model.cost_model_choices` of the trace, likewise."""

    def resident(self, i: int) -> npt.NDArray[np.bool_]:
        """Which experts were resident after token ``i`` (MoE layers x experts)."""
        if self.packed_resident is None:
            raise ValueError("this trace was opened without its residency")
        return np.unpackbits(self.packed_resident[i], axis=1, count=self.model.n_expert,
                             bitorder="little").astype(np.bool_)


def account(reopened: ReopenedTrace) -> ReopenedTrace:
    """``reopened`` with what its window shows worked out: the cache panel's numbers and
    the what-if's cost models (their calibration). The opener does this on its own thread,
    not the window's (0.4 s of a 10,000-token trace's opening)."""
    cache = CacheModel()
    cache.reset(reopened.model)
    cache.add_many(reopened.tokens)
    return replace(reopened, cache=cache, cost_choices=cost_model_choices(reopened.trace))


def reopen(path: str | Path, progress: ReadProgress | None = None) -> ReopenedTrace:
    """Read a trace and rebuild the snapshots the panel draws (``TraceFormatError``).

    ``progress(bytes_read, file_bytes)`` hears how the read goes and may stop it
    (returning False raises ``TraceReadCancelled``), also while the snapshots are rebuilt.
    A session still being recorded to a journal (a format finished at close) reads from
    the journal.
    """
    trace = read_session(path, progress)
    size = trace.path.stat().st_size if trace.path is not None else 0
    h = trace.header
    m = h.model
    row_bytes = int(sum(m.bytes_per_expert))
    model = ModelSummary(
        path=str(trace.path or path), name=m.name or m.file_name,
        architecture=m.architecture, n_expert=m.n_expert, top_k=m.top_k,
        moe_layers=tuple(m.moe_layers), slot_row_bytes=row_bytes,
        total_expert_bytes=row_bytes * m.n_expert, non_expert_bytes=m.non_expert_bytes,
        cache_enabled=True, slots_per_layer=h.slots_per_layer,
        policy=h.policy.name or "custom", n_ctx=0)
    residency = Residency(m.moe_layers, m.n_expert, h.slots_per_layer)
    approximate_from: int | None = None
    policy = h.policy
    unrecorded = 0
    tokens: list[TokenSnapshot] = []
    begins = _answer_begins(trace)
    packed = np.zeros((len(trace.tokens), *residency.resident.shape[:1],
                       (m.n_expert + 7) // 8), np.uint8)
    for i, rec in enumerate(trace.tokens):
        step = rec.index + 1
        if progress is not None and step % 256 == 0 and not progress(size, size):
            raise TraceReadCancelled(f"{Path(path).name}: opening the trace was cancelled")
        for change in rec.changes:
            if change.kind == "policy" and change.policy is not None:
                policy = change.policy
        rows = _rows_of(rec)
        # the recorder's own rebuild, then its masks
        shrunk = residency.advance_token(rec, rows() if callable(rows) else rows)
        if rec.resident is not None:
            residency.apply_masks(rec.resident)
        elif shrunk:  # an older trace: the shrink's evictions were not recorded
            approximate_from = approximate_from or step
        # the live worker's rule: counters only while the token's policy prefetches
        show = policy.prefetch != 0 and rec.prefetches is not None
        tokens.append(TokenSnapshot(
            step=step, index=rec.position, text=rec.text, seconds=rec.seconds,
            policy=rec.policy, slots_per_layer=rec.slots_per_layer, n_prompt_tokens=0,
            n_ctx=0, events=rows, resident=None,
            changes=(*(c.label for c in rec.changes if not _answer_now(c)),
                     *(("answer",) if rec.index in begins else ())),
            ttft=rec.seconds if rec.position == 0 else None,
            prefetches=rec.prefetches if show else None,
            prefetch_hits=rec.prefetch_hits if show else None, audit=rec.audit))
        packed[i] = np.packbits(residency.resident, axis=1, bitorder="little")
        if policy.prefetch != 0 and rec.prefetches is None:
            unrecorded += 1
    if tokens:  # the heatmap's: the last token's, whole
        tokens[-1] = replace(tokens[-1], resident=residency.resident.copy())
    counted = [(t.prefetches, t.prefetch_hits) for t in tokens
               if t.prefetches is not None and t.prefetch_hits is not None]
    return ReopenedTrace(model=model, tokens=tokens, trace=trace, packed_resident=packed,
                         approximate_from=approximate_from,
                         prefetch=summarize(counted) if counted else None,
                         prefetch_unrecorded=unrecorded)


def _rows_of(rec: TokenRecord) -> npt.NDArray[Any] | Callable[[], npt.NDArray[Any]]:
    """A reopened token's event rows for its snapshot: laid out when read from a version-2
    trace's columns (the window holds every token, and looks at a few tokens' rows at a
    time), else the record's own."""
    return rec.rows_when_read() if isinstance(rec, ColumnToken) else rec.events


def _answer_now(change: Change) -> bool:
    return change.kind == "note" and change.text == ANSWER_NOW_NOTE


def _answer_begins(trace: Trace) -> set[int]:
    """Token indices where a thinking model's answer began: the live panel marks them
    ("answer"), so the reopened one does too. An answer that "Answer now" cut short was
    continued by a second generation after a closing text the tokens do not contain; its
    first token carries a note saying so (traces from before that note leave it unmarked)."""
    by_answer: dict[int, list[tuple[int, str]]] = {}
    out = set()
    for rec in trace.tokens:
        by_answer.setdefault(rec.answer, []).append((rec.index, rec.text))
        if any(_answer_now(c) for c in rec.changes):
            out.add(rec.index)
    for tokens in by_answer.values():
        at = answer_begins([text for _, text in tokens])
        if at is not None:
            out.add(tokens[at][0])
    return out


PREFETCH_SESSION_TIP = (
    "Prefetch accuracy (PSR) over the whole recorded session: of the experts prefetched "
    "while the policy prefetched, the share the router then used before they were evicted. "
    "/token: experts prefetched per token, all layers together.")
"""Tooltip of the trace window's session-wide prefetch line."""


def _decoded(trace: Trace) -> bool:
    return any(t.phase == "decode" for t in trace.tokens)


def tokens_text(trace: Trace) -> str:
    """The trace window's token count: ``1 token, none decoded`` for a session stopped
    after its prompt (its one token came out of the prefill), ``N tokens`` otherwise."""
    n = len(trace.tokens)
    text = f"{n} token{'' if n == 1 else 's'}"
    return text if _decoded(trace) or not n else f"{text}, none decoded"


def prefetch_overview(reopened: ReopenedTrace) -> str:
    """The trace window's prefetch line: accuracy and rate over the session's prefetching
    tokens, "not recorded" for an older trace of a prefetching policy, "" (hidden) when no
    token's policy prefetched: the live panel's rule, over the whole session. A trace of a
    prefetching policy with no decoded token says so: PSR prefetches while decoding, and
    "prefetch accuracy – · 0.0/token" over its prefill read as a measurement."""
    summary, missing = reopened.prefetch, reopened.prefetch_unrecorded
    if (summary is not None or missing) and not _decoded(reopened.trace):
        return ("PSR: no token was decoded, so nothing was prefetched (PSR prefetches "
                "while decoding; the trace holds only the prefill)")
    if summary is not None:
        n = summary.tokens
        text = f"PSR, {n} prefetching token{'' if n == 1 else 's'}: {prefetch_text(summary)}"
        if missing:
            text += (f" ({missing} more prefetching token{'' if missing == 1 else 's'} "
                     "not recorded)")
        return text
    if missing:
        return ("PSR: prefetch accuracy not recorded (this trace was written before "
                "MoEScope recorded prefetch counters)")
    return ""
