"""The line under a finished answer: what the answer cost, said as "this answer".

The cache panel shows the last few tokens (rolling), this line the whole answer; both are
in the window at once, so each says over which tokens it measures. The line is rebuilt
from the stored numbers (not the engine's one-line summary) so a stopped answer does not
read "0.0 tok/s · 1 tokens · … stopped · stopped".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DONE = "done"
ANSWER_RATE = "answer average"
"""How the line names its tokens/s: the cache panel's is over its last few tokens only."""
DECODE_RATE_TIP = (
    "This answer: tok/s (answer average) is over the answer's whole decode, after its first "
    "token (the prompt's time: TTFT); hit rate, fetched MB and substituted share are totals "
    "over every expert selection of the answer, and the quality cost is over its audited "
    "tokens. The cache panel's tok/s (last N tokens) is over its latest decode steps only, "
    "so the two differ: a rate that rose or fell during the answer reads differently.")


def _number(stats: Mapping[str, Any], key: str) -> float | None:
    value = stats.get(key)
    return float(value) if isinstance(value, int | float) and value == value else None


def answer_line(stats: Mapping[str, Any], status: str) -> str:
    """The stats line of an answer with ``stats`` (``AnswerSummary.as_dict``) saved with
    ``status``; "" when there is nothing to say."""
    note = "" if status == DONE else status
    n_tokens = stats.get("n_tokens")
    if not isinstance(n_tokens, int):  # an older record: its one-line summary as saved
        summary = str(stats.get("summary", ""))
        if note and summary.endswith(f" · {note}"):
            note = ""
        return " · ".join(t for t in (summary, note) if t)
    names = stats.get("policies")
    policies = "/".join(str(p) for p in (names if isinstance(names, list | tuple) else ())) \
        or "–"
    parts = [f"this answer: {n_tokens} token{'s' if n_tokens != 1 else ''} under {policies}"]
    rate = _number(stats, "tokens_per_second")
    if n_tokens >= 2 and rate:
        parts.append(f"{rate:.1f} tok/s ({ANSWER_RATE})")
    ttft = _number(stats, "time_to_first_token_s")
    if n_tokens and ttft is not None:
        parts.append(f"TTFT {ttft * 1000:.0f} ms")
    if n_tokens:
        for key, fmt in (("hit_rate", "hit {:.1%}"),
                         ("fetched_mb_per_token", "fetched {:.2f} MB/token"),
                         ("substituted_fraction", "substituted {:.1%}"),
                         ("mass_per_token", "mass/token {:.3f}")):
            value = _number(stats, key)
            if value is not None:
                parts.append(fmt.format(value))
    audit = stats.get("audit")
    if isinstance(audit, str) and audit:
        parts.append(audit)
    reason = str(stats.get("stop_reason", ""))
    if status == "stopped" or reason == "stopped":
        parts.append("stopped" if n_tokens else "stopped before the first token")
    elif note:
        parts.append(note)
    elif reason and reason not in ("eos", "stop"):
        parts.append({"length": "token limit reached"}.get(reason, reason))
    dropped = str(stats.get("summary", "")).rpartition(" · ")[2]
    if "left out to fit the context" in dropped:
        parts.append(dropped)
    return " · ".join(parts)
