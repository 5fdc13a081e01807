"""Session traces: what the expert cache did, token by token, in a file you can replay.

Every number MoEScope shows must be recomputable offline (ARCHITECTURE.md, "Where numbers
come from"), and the router-logit simulator must be able to replay a chat under other
policies and budgets. Both need a record of the session, so this package defines one:

* a **header**: the model (file name, metadata hash, experts, top-k, bytes one copy
  moves per layer), the budget, slots and policy at the start, software and machine;
* one **token** record per generated token: wall time, phase, the policy or budget changes
  that took effect at that token, the core's event rows for every routed layer, optionally
  the router inputs (full probabilities, raw gate weights, ids) that make a replay exact,
  the engine's copy timings spent on it, PSR's prefetch counters (the core keeps them
  only as cumulative layer stats, with no event row, so without them a reopened trace
  could not show prefetch accuracy), and, only for the MoE layers where the event rows do
  not explain it (a PSR prefetch, a budget shrink), the real resident mask
  (:mod:`moescope.cache.residency`), so a reopened trace draws exactly what the live panel
  drew;
* an optional **end** record (a crash simply leaves it out).

Version 2 is columnar: an Arrow IPC stream (``.arrows``), written and flushed token by
token so that a crash loses at most the token being written, or Parquet (``.parquet``, what
the window records), the same rows compacted from such a stream (its journal) when the
session closes, in the background for the window (:mod:`.compactor`). Version 1, JSON Lines
(optionally gzip), is still read and written. :func:`read_trace` (:mod:`.reader`) validates
every record, names the token or line of a bad one, and accepts a cut-off last token.
:func:`to_perfetto` (:mod:`.perfetto`) turns a trace into Chrome/Perfetto trace-event JSON
(open it in ui.perfetto.dev). The schema is documented in ``docs/trace-format.md`` and
versioned by :data:`TRACE_VERSION`.

The package is engine-agnostic on purpose (``trace`` sits below ``engine`` in the layers):
:class:`TraceRecorder` (:mod:`.recorder`) takes any object shaped like the Engine
(:class:`RouteSource`) and any object shaped like its ``TokenStats`` (:class:`TokenLike`).

Modules: :mod:`.schema` (records and their JSON form), :mod:`.writer` (the file, written
off the decode thread), :mod:`.recorder` (reads the engine per token), :mod:`.reader` and
:mod:`.validate` (reading, every field bounded), :mod:`.arrow_format` (version 2, an Arrow
stream) and :mod:`.parquet_format` (version 2 compacted to Parquet when a session closes),
:mod:`.compactor` (finishing Parquet traces off the user's path),
:mod:`.perfetto` and :mod:`.tokens_csv` (exports), :mod:`.names` (the suffix the app
records in, :data:`RECORD_SUFFIX`, and every one the reader opens, :data:`TRACE_SUFFIXES`).
"""

from moescope.trace.names import RECORD_SUFFIX, TRACE_SUFFIXES
from moescope.trace.perfetto import to_perfetto, write_perfetto
from moescope.trace.reader import (
    MAX_BLANK_LINES,
    MAX_LINE_BYTES,
    MAX_UNKNOWN_RECORDS,
    ReadProgress,
    TraceReadCancelled,
    read_trace,
)
from moescope.trace.recorder import (
    RouteSource,
    TokenLike,
    TraceRecorder,
    header_for,
    machine_info,
    software_versions,
)
from moescope.trace.schema import (
    ANSWER_NOW_NOTE,
    PREDICTED_KEEP,
    TIMING_KEYS,
    TRACE_FORMAT,
    TRACE_VERSION,
    Change,
    RouteBlock,
    RouterInput,
    TokenRecord,
    Trace,
    TraceFormatError,
    TraceHeader,
    TraceModel,
    policy_to_json,
    rank_predictions,
)
from moescope.trace.validate import MAX_STEP_SLACK, policy_from_json
from moescope.trace.writer import TraceWriter

__all__ = [
    "ANSWER_NOW_NOTE",
    "MAX_BLANK_LINES",
    "MAX_LINE_BYTES",
    "MAX_STEP_SLACK",
    "MAX_UNKNOWN_RECORDS",
    "PREDICTED_KEEP",
    "RECORD_SUFFIX",
    "TIMING_KEYS",
    "TRACE_FORMAT",
    "TRACE_SUFFIXES",
    "TRACE_VERSION",
    "Change",
    "ReadProgress",
    "RouteBlock",
    "RouteSource",
    "RouterInput",
    "TokenLike",
    "TokenRecord",
    "Trace",
    "TraceFormatError",
    "TraceHeader",
    "TraceModel",
    "TraceReadCancelled",
    "TraceRecorder",
    "TraceWriter",
    "header_for",
    "machine_info",
    "policy_from_json",
    "policy_to_json",
    "rank_predictions",
    "read_trace",
    "software_versions",
    "to_perfetto",
    "write_perfetto",
]
