"""Reading a chat back from our own JSON export (File ▸ Export chat as JSON).

A chat file comes from anywhere (a colleague, a download, a hand edit), so it is read as
untrusted input: the file's size, the number of messages and every field's length are
bounded before anything is stored, only the roles and statuses the app writes are taken,
and an answer's stats keep only plain numbers and short strings (the line under an answer
is built from them). Every refusal is one line naming the file's fault
(:class:`ChatImportError`); nothing is stored unless the whole file is valid.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moescope.session.store import DONE, GENERATING, INTERRUPTED, STOPPED

MAX_IMPORT_BYTES = 32 * 1024 * 1024
"""A long chat with thoughts exports to a few MB; 32 MiB leaves room and bounds memory."""
MAX_MESSAGES = 20_000
MAX_MESSAGE_CHARS = 4_000_000
MAX_TITLE_CHARS = 500
MAX_SYSTEM_PROMPT_CHARS = 1_000_000
MAX_MODEL_CHARS = 4_096
MAX_STATS_KEYS = 64
MAX_STAT_STRING = 2_000
MAX_STAT_LIST = 32
MAX_STAT_NUMBER = 1e15
LIST_STATS = frozenset({"policies"})
"""The stats that are lists (of policy names); every other one is a plain value."""
ROLES = ("user", "assistant")
STATUSES = (DONE, STOPPED, INTERRUPTED)


class ChatImportError(ValueError):
    """Why a chat file cannot be imported, in one line."""


@dataclass(frozen=True)
class ImportedMessage:
    role: str
    content: str
    status: str = DONE
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportedChat:
    title: str
    system_prompt: str = ""
    model: str = ""
    messages: tuple[ImportedMessage, ...] = ()


def read_chat_file(path: str | Path) -> ImportedChat:
    """The chat in the JSON file at ``path``; :class:`ChatImportError` when it is not one
    (unreadable, too large, not our export's shape)."""
    p = Path(path)
    try:
        if not p.is_file():
            raise ChatImportError(f"{p.name} is not a regular file")
        with p.open("rb") as f:
            data = f.read(MAX_IMPORT_BYTES + 1)
    except OSError as err:
        raise ChatImportError(f"cannot read {p.name}: {err.strerror or err}") from None
    if len(data) > MAX_IMPORT_BYTES:
        raise ChatImportError(f"{p.name} is larger than {MAX_IMPORT_BYTES // 2**20} MiB; "
                              "a chat export is far smaller")
    return parse_chat_json(data)


def parse_chat_json(data: bytes | str) -> ImportedChat:
    """The chat in ``data`` (our JSON export), validated field by field."""
    if len(data) > MAX_IMPORT_BYTES:
        raise ChatImportError(f"the file is larger than {MAX_IMPORT_BYTES // 2**20} MiB")
    try:
        text = data.decode("utf-8-sig") if isinstance(data, bytes) else data
    except UnicodeDecodeError as err:
        raise ChatImportError(f"not UTF-8 text (byte {err.start})") from None
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as err:
        raise ChatImportError(f"not valid JSON: {err.msg} at line {err.lineno}, "
                              f"column {err.colno}") from None
    except (ValueError, RecursionError) as err:
        raise ChatImportError(f"not a chat export: {_first_line(err)}") from None
    if not isinstance(doc, dict):
        raise ChatImportError("not a chat export: the top level is not a JSON object")
    messages = doc.get("messages")
    if not isinstance(messages, list):
        raise ChatImportError("not a chat export: it has no \"messages\" list")
    if len(messages) > MAX_MESSAGES:
        raise ChatImportError(f"{len(messages)} messages: more than the {MAX_MESSAGES} "
                              "a chat may have")
    title = _text(doc, "title", MAX_TITLE_CHARS, "the title").strip() or "Imported chat"
    return ImportedChat(
        title=" ".join(title.split()),
        system_prompt=_text(doc, "system_prompt", MAX_SYSTEM_PROMPT_CHARS,
                            "the system prompt"),
        model=_text(doc, "model", MAX_MODEL_CHARS, "the model name"),
        messages=tuple(_message(m, i + 1) for i, m in enumerate(messages)))


def _message(m: object, n: int) -> ImportedMessage:
    if not isinstance(m, dict):
        raise ChatImportError(f"message {n} is not a JSON object")
    role = m.get("role")
    if role not in ROLES:
        raise ChatImportError(f"message {n} has role {_show(role)}; expected "
                              f"{' or '.join(ROLES)}")
    content = _text(m, "content", MAX_MESSAGE_CHARS, f"message {n}'s text")
    status = m.get("status", DONE)
    if status == GENERATING:  # exported while it was being written: cut off there
        status = INTERRUPTED
    if status not in STATUSES:
        raise ChatImportError(f"message {n} has status {_show(status)}; expected one of "
                              f"{', '.join(STATUSES)}")
    stats = m.get("stats") or {}
    if not isinstance(stats, dict):
        raise ChatImportError(f"message {n}'s stats are not a JSON object")
    return ImportedMessage(role=str(role), content=content, status=str(status),
                           stats=_stats(stats) if role == "assistant" else {})


def _text(doc: dict[str, Any], key: str, limit: int, what: str) -> str:
    value = doc.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ChatImportError(f"{what} is not a string")
    if len(value) > limit:
        raise ChatImportError(f"{what} has {len(value)} characters, more than {limit}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ChatImportError(f"{what} holds a lone surrogate (\\u escape): not text") \
            from None
    return value


def _stats(stats: dict[str, Any]) -> dict[str, Any]:
    """An answer's numbers, keeping only what the app itself writes there: bounded finite
    numbers, booleans, short strings and short lists of them; anything else is dropped
    (the line under the answer then says less, it never fails)."""
    out: dict[str, Any] = {}
    for key, value in list(stats.items())[:MAX_STATS_KEYS]:
        if not isinstance(key, str) or len(key) > 64:
            continue
        if key in LIST_STATS:
            if isinstance(value, list) and all(isinstance(v, str) and len(v) <= 64
                                               for v in value[:MAX_STAT_LIST]):
                out[key] = value[:MAX_STAT_LIST]
        elif (v := _scalar(value)) is not _DROP:
            out[key] = v
    return out


_DROP = object()


def _scalar(value: object) -> object:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):  # compared as an integer: math.isfinite(10**400) raised
        return value if abs(value) <= MAX_STAT_NUMBER else _DROP
    if isinstance(value, float):
        ok = math.isfinite(value) and abs(value) <= MAX_STAT_NUMBER
        return value if ok else _DROP
    if isinstance(value, str) and len(value) <= MAX_STAT_STRING:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return _DROP
        return value
    return _DROP


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not standard JSON")


def _show(value: object) -> str:
    text = json.dumps(value, ensure_ascii=True) if _jsonable(value) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _jsonable(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__
