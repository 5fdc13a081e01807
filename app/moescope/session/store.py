"""Chat history in SQLite: several chats, their messages, and the answer being written.

Why SQLite in WAL mode with one commit per streamed token: a crash or a killed process must
lose at most the token in flight, never the conversation. WAL makes each small commit
cheap (no fsync with ``synchronous=NORMAL``; the OS still has the page after a SIGKILL),
and readers never block the writer. The schema carries a version (``PRAGMA user_version``)
and ordered migrations, so a newer app opens an older database in place.

Damage is looked for cheaply. SQLite's full integrity check reads the whole file (a
database of 2,000 chats of 200 messages, 160 MB, took seconds from a cold disk at every
start), so it runs only where damage may have come from outside SQLite's own writes: when
the file is not as the last clean close left it (no ``chats.sqlite3.clean`` stamp, which
each open consumes and each clean close writes, or one that does not match the file's
size, times and inode: a crash, a kill, a copy, another program's write), when a ``-wal``
file is left over, or when SQLite reported damage while the database was in use (any
connection of ours then leaves ``chats.sqlite3.check`` beside it, removed by the next
passing check). Otherwise the open reads only the header and the schema, which a file of
something else fails at once.

The window's :class:`ChatStore` is used from the GUI thread only. The decode thread
appends the answer's tokens through its own connection (:class:`AnswerWriter`), each before
the next token is decoded: the GUI thread gets tokens in batches, some time later.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moescope.model.reasoning import split_reasoning
from moescope.util.errors import MoEScopeError
from moescope.util.files import write_atomic

log = logging.getLogger(__name__)

GENERATING = "generating"
DONE = "done"
STOPPED = "stopped"
INTERRUPTED = "interrupted"
"""Message statuses: an answer is ``generating`` while tokens stream in; one left in that
state by a killed process becomes ``interrupted`` at the next start."""


MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: chats and their messages
    (
        """CREATE TABLE chats (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '',
            model TEXT NOT NULL DEFAULT '',
            created REAL NOT NULL,
            updated REAL NOT NULL)""",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            created REAL NOT NULL)""",
        "CREATE INDEX messages_by_chat ON messages(chat_id, position)",
    ),
    # 2: per-answer status and stats (streaming saves, the stats line under answers)
    (
        "ALTER TABLE messages ADD COLUMN status TEXT NOT NULL DEFAULT 'done'",
        "ALTER TABLE messages ADD COLUMN stats TEXT",
        "CREATE INDEX chats_by_title ON chats(title COLLATE NOCASE)",
    ),
    # 3: each chat's sampling settings (JSON; NULL: a chat from before, none saved yet)
    (
        "ALTER TABLE chats ADD COLUMN sampling TEXT",
    ),
    # 4: the answers a crash left generating, found at each start without reading every
    # message (a partial index: it holds only those rows)
    (
        "CREATE INDEX messages_generating ON messages(status) WHERE status = 'generating'",
    ),
)
"""``MIGRATIONS[i]`` upgrades a database at schema version ``i`` to ``i + 1``; each runs in
one transaction with its version bump (statements one by one: ``executescript`` would
commit half-way)."""
SCHEMA_VERSION = len(MIGRATIONS)


class UnreadableChatsError(sqlite3.DatabaseError, MoEScopeError):
    """A chat database this MoEScope must not open (a newer schema, or no schema of ours):
    a ``sqlite3.DatabaseError``, so whoever opens the store and words its database's errors
    (the window, before it starts) words this one too, without a traceback."""


class CorruptChatsError(sqlite3.DatabaseError, MoEScopeError):
    """The chat database's file is damaged (SQLite's integrity check found a fault): its
    own class, so that the window moves it aside (:mod:`.store_repair`) instead of
    advising to make a folder writable."""


CLEAN_SUFFIX = ".clean"
"""Beside the database: how its file looked after the last clean close (JSON)."""
CHECK_SUFFIX = ".check"
"""Beside the database: SQLite reported damage while it was in use; check it fully."""

SQLITE_CORRUPT = 11
SQLITE_NOTADB = 26
"""SQLite's primary result codes for a damaged file and for one that is not a database."""


def is_corruption(err: BaseException) -> bool:
    """``err`` says the database file itself is damaged (not a permission, a lock, a full
    disk or a schema this MoEScope does not read)."""
    if isinstance(err, CorruptChatsError):
        return True
    if not isinstance(err, sqlite3.DatabaseError) or isinstance(err, UnreadableChatsError):
        return False
    code = getattr(err, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB)
    text = str(err).lower()
    return "file is not a database" in text or "malformed" in text


@dataclass
class ChatMessage:
    """One message as stored; ``stats`` is the answer's numbers (AnswerStats fields)."""

    id: int
    chat_id: int
    position: int
    role: str
    content: str
    status: str = DONE
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class Chat:
    id: int
    title: str
    system_prompt: str = ""
    model: str = ""
    updated: float = 0.0
    sampling: dict[str, Any] = field(default_factory=dict)
    """The chat's sampling settings as the window saved them (temperature, top-p, top-k,
    max tokens, seed, thinking, whether they follow the model's recommendation); empty for
    a chat none were saved for (one from before they were kept per chat)."""


class ChatStore:
    """The chat database; every write is committed before the method returns.

    ``recover``: mark the answers a crash left ``generating`` as interrupted. Only the one
    process that owns the data folder may (the window holding its lock): another one's
    answer being written looks exactly like a crashed one, and would be marked cut off
    under it."""

    def __init__(self, path: str | Path, *, recover: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.checked = ""
        """How the file was checked at open: "full" (SQLite's integrity check) or
        "header" (it was as the last clean close left it: the header and schema read)."""
        clean = _take_clean_stamp(self.path)  # before connecting: that may make a -wal
        self._db = _connect(str(self.path))
        self._db.row_factory = sqlite3.Row
        try:  # a file that is not a database fails here, a damaged one at the check
            self._check(clean)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except BaseException:
            self._db.close()
            raise
        _watch(self._db, self.path)
        self.recovered = self._recover() if recover else 0

    # ------------------------------------------------------------------ schema
    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _check(self, clean: bool) -> None:
        """SQLite's quick integrity check (its first fault) unless the file is as the last
        clean close left it (``clean``) and no damage was reported since: a damaged page
        found now is said at the start, not as a failure to save in the middle of an
        answer. A clean file gets its header and schema read (a file of something else,
        or a header overwritten, fails there)."""
        marker = Path(f"{self.path}{CHECK_SUFFIX}")
        if clean and not marker.exists():
            self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()
            self.checked = "header"
            return
        self.checked = "full"
        row = self._db.execute("PRAGMA quick_check(1)").fetchone()
        if row is None or row[0] != "ok":
            fault = " ".join(str(row[0]).split())[:160] if row is not None else "no answer"
            raise CorruptChatsError(f"integrity check: {fault}")
        with contextlib.suppress(OSError):
            marker.unlink(missing_ok=True)

    def _migrate(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:
            raise UnreadableChatsError(f"written by a newer MoEScope (chat schema {version}; "
                                       f"this one reads up to {SCHEMA_VERSION}); update "
                                       "MoEScope to open it")
        if version < 0:  # user_version is any 32-bit integer: MIGRATIONS[-1] would run
            raise UnreadableChatsError(f"not a MoEScope chat database (schema {version})")
        for step in range(version, SCHEMA_VERSION):
            with self._tx():
                for statement in MIGRATIONS[step]:
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version={step + 1}")

    def _recover(self) -> int:
        """Answers cut off by a crash keep their text and are marked interrupted (the
        literal status: the planner then uses the partial index of schema 4)."""
        cur = self._db.execute(f"UPDATE messages SET status='{INTERRUPTED}' "
                               f"WHERE status='{GENERATING}'")
        return cur.rowcount

    def _tx(self) -> _Transaction:
        return _Transaction(self._db)

    def close(self) -> None:
        """Close; the last connection to a sound database leaves the clean stamp that
        lets the next open skip the full check."""
        self._db.close()
        _write_clean_stamp(self.path)

    # ------------------------------------------------------------------ chats
    def create_chat(self, title: str = "New chat", system_prompt: str = "",
                    model: str = "", sampling: Mapping[str, Any] | None = None) -> Chat:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO chats(title, system_prompt, model, sampling, created, updated) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (title, system_prompt, model, _sampling_json(sampling), now, now))
        return Chat(id=int(cur.lastrowid or 0), title=title, system_prompt=system_prompt,
                    model=model, updated=now, sampling=dict(sampling or {}))

    def chats(self, search: str = "") -> list[Chat]:
        """Chats, most recently updated first; ``search`` keeps those whose title or any
        message contains it (case-insensitive)."""
        pattern = f"%{_escape_like(search)}%"
        rows = self._db.execute(
            "SELECT * FROM chats WHERE title LIKE ?1 ESCAPE '\\' COLLATE NOCASE "
            "OR EXISTS (SELECT 1 FROM messages WHERE messages.chat_id = chats.id "
            "AND messages.content LIKE ?1 ESCAPE '\\' COLLATE NOCASE) "
            "ORDER BY updated DESC, id DESC", (pattern,))
        return [_chat(r) for r in rows]

    def chat(self, chat_id: int) -> Chat | None:
        r = self._db.execute("SELECT * FROM chats WHERE id=?", (chat_id,)).fetchone()
        return None if r is None else _chat(r)

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._db.execute("UPDATE chats SET title=? WHERE id=?", (title, chat_id))

    def set_system_prompt(self, chat_id: int, text: str) -> None:
        self._db.execute("UPDATE chats SET system_prompt=? WHERE id=?", (text, chat_id))

    def set_sampling(self, chat_id: int, sampling: Mapping[str, Any]) -> None:
        """Save the chat's sampling settings (a JSON object of plain values)."""
        self._db.execute("UPDATE chats SET sampling=? WHERE id=?",
                         (_sampling_json(sampling), chat_id))

    def set_model(self, chat_id: int, model: str) -> None:
        self._db.execute("UPDATE chats SET model=? WHERE id=?", (model, chat_id))

    def delete_chat(self, chat_id: int) -> None:
        self._db.execute("DELETE FROM chats WHERE id=?", (chat_id,))

    def _touch(self, chat_id: int) -> None:
        self._db.execute("UPDATE chats SET updated=? WHERE id=?", (time.time(), chat_id))

    # ------------------------------------------------------------------ messages
    def messages(self, chat_id: int) -> list[ChatMessage]:
        rows = self._db.execute(
            "SELECT * FROM messages WHERE chat_id=? ORDER BY position", (chat_id,))
        return [ChatMessage(id=r["id"], chat_id=r["chat_id"], position=r["position"],
                            role=r["role"], content=_stored_text(r["content"]),
                            status=r["status"], stats=_stored_stats(r["stats"]))
                for r in rows]

    def add_message(self, chat_id: int, role: str, content: str,
                    status: str = DONE) -> ChatMessage:
        with self._tx():
            r = self._db.execute(
                "SELECT COALESCE(MAX(position), -1) + 1 FROM messages WHERE chat_id=?",
                (chat_id,)).fetchone()
            position = int(r[0])
            cur = self._db.execute(
                "INSERT INTO messages(chat_id, position, role, content, status, created) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (chat_id, position, role, content, status, time.time()))
            self._touch(chat_id)
        return ChatMessage(id=int(cur.lastrowid or 0), chat_id=chat_id, position=position,
                           role=role, content=content, status=status)

    def append_text(self, message_id: int, text: str) -> None:
        """Append streamed text to an answer: one statement, committed at once."""
        self._db.execute("UPDATE messages SET content = content || ? WHERE id=?",
                         (text, message_id))

    def append_texts(self, message_id: int, texts: Sequence[str]) -> None:
        """Append several tokens, each its own committed statement (autocommit), so a
        kill between two of them keeps every earlier token."""
        self._db.executemany("UPDATE messages SET content = content || ? WHERE id=?",
                             [(t, message_id) for t in texts])

    def finish_message(self, message_id: int, status: str,
                       stats: dict[str, Any] | None = None) -> None:
        self._db.execute("UPDATE messages SET status=?, stats=? WHERE id=?",
                         (status, json.dumps(stats) if stats else None, message_id))

    def delete_messages_from(self, chat_id: int, position: int) -> None:
        """Drop the message at ``position`` and everything after it (regenerate, edit)."""
        self._db.execute("DELETE FROM messages WHERE chat_id=? AND position>=?",
                         (chat_id, position))

    # ------------------------------------------------------------------ branch, import
    def add_chat(self, title: str, system_prompt: str, model: str,
                 messages: Sequence[tuple[str, str, str, dict[str, Any]]],
                 sampling: Mapping[str, Any] | None = None) -> Chat:
        """A new chat holding ``messages`` (role, content, status, stats), written in one
        transaction: an import or a branch is there whole or not at all."""
        now = time.time()
        with self._tx():
            cur = self._db.execute(
                "INSERT INTO chats(title, system_prompt, model, sampling, created, updated) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (title, system_prompt, model, _sampling_json(sampling), now, now))
            chat_id = int(cur.lastrowid or 0)
            self._db.executemany(
                "INSERT INTO messages(chat_id, position, role, content, status, stats, "
                "created) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(chat_id, i, role, content, status, json.dumps(stats) if stats else None,
                  now) for i, (role, content, status, stats) in enumerate(messages)])
        return Chat(id=chat_id, title=title, system_prompt=system_prompt, model=model,
                    updated=now, sampling=dict(sampling or {}))

    def branch_chat(self, chat_id: int, position: int, title: str) -> Chat:
        """A new chat with ``chat_id``'s messages up to and including ``position`` (its
        system prompt, model and sampling settings too); the original is unchanged."""
        chat = self.chat(chat_id)
        if chat is None:
            raise KeyError(chat_id)
        kept = [(m.role, m.content, INTERRUPTED if m.status == GENERATING else m.status,
                 m.stats) for m in self.messages(chat_id) if m.position <= position]
        return self.add_chat(title, chat.system_prompt, chat.model, kept, chat.sampling)

    # ------------------------------------------------------------------ export
    def export_json(self, chat_id: int) -> str:
        chat = self.chat(chat_id)
        if chat is None:
            raise KeyError(chat_id)
        doc = {
            "title": chat.title, "system_prompt": chat.system_prompt, "model": chat.model,
            "messages": [_message_json(m) for m in self.messages(chat_id)],
        }
        return json.dumps(doc, indent=2, ensure_ascii=False)

    def export_markdown(self, chat_id: int) -> str:
        chat = self.chat(chat_id)
        if chat is None:
            raise KeyError(chat_id)
        return chat_markdown(chat, self.messages(chat_id))


class AnswerWriter:
    """Appends an answer's tokens from the decode thread, one committed statement each, so
    a killed process loses at most the token being decoded (the window's store would save
    them only once the GUI thread has handled their batch).

    Its own connection, because sqlite connections belong to the thread that opened them.
    It opens an existing database only (the window's :class:`ChatStore` created and
    migrated it) and never runs ``_recover``, which would mark the answer being written
    as interrupted.
    """

    def __init__(self, path: str | Path, busy_timeout_s: float = 5.0) -> None:
        self.path = Path(path)
        if not self.path.is_file():  # never create a database that the window does not use
            raise FileNotFoundError(f"no chat database at {self.path}")
        self._db = _connect(f"{self.path.resolve().as_uri()}?mode=rw", uri=True,
                            timeout=busy_timeout_s, check_same_thread=True)
        _watch(self._db, self.path)
        self._db.execute("PRAGMA synchronous=NORMAL")

    def append(self, message_id: int, text: str) -> None:
        """Append one token's text to the answer, committed at once (autocommit)."""
        self._db.execute("UPDATE messages SET content = content || ? WHERE id=?",
                         (text, message_id))

    def close(self) -> None:
        self._db.close()


class _WatchedCursor(sqlite3.Cursor):
    """A cursor that tells its connection when SQLite reports damage (at a statement or
    at any row read), so that the next start checks the whole file."""

    def execute(self, sql: str, parameters: Any = (), /) -> _WatchedCursor:
        try:
            return super().execute(sql, parameters)
        except sqlite3.DatabaseError as err:
            _noted(self.connection, err)
            raise

    def executemany(self, sql: str, seq: Any, /) -> _WatchedCursor:
        try:
            return super().executemany(sql, seq)
        except sqlite3.DatabaseError as err:
            _noted(self.connection, err)
            raise

    def fetchone(self) -> Any:
        try:
            return super().fetchone()
        except sqlite3.DatabaseError as err:
            _noted(self.connection, err)
            raise

    def fetchall(self) -> list[Any]:
        try:
            return super().fetchall()
        except sqlite3.DatabaseError as err:
            _noted(self.connection, err)
            raise

    def __next__(self) -> Any:
        try:
            return super().__next__()
        except sqlite3.DatabaseError as err:
            _noted(self.connection, err)
            raise


class _WatchedConnection(sqlite3.Connection):
    """A connection whose statements run on :class:`_WatchedCursor`."""

    on_damage: Callable[[], None] | None = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        return self.cursor(_WatchedCursor).execute(sql, parameters)

    def executemany(self, sql: str, seq: Any, /) -> sqlite3.Cursor:
        return self.cursor(_WatchedCursor).executemany(sql, seq)


def _noted(connection: sqlite3.Connection, err: sqlite3.DatabaseError) -> None:
    on_damage = getattr(connection, "on_damage", None)
    if on_damage is not None and is_corruption(err):
        on_damage()


def _connect(target: str, **kw: Any) -> _WatchedConnection:
    """A watched connection to ``target`` (a path or a ``file:`` URI); see :func:`_watch`."""
    db = sqlite3.connect(target, isolation_level=None, factory=_WatchedConnection, **kw)
    assert isinstance(db, _WatchedConnection)
    return db


def _watch(db: sqlite3.Connection, path: Path) -> None:
    """From now on, damage ``db`` meets leaves the marker that makes the next open of
    ``path`` check the whole file (an open that fails is answered then and there)."""
    if isinstance(db, _WatchedConnection):
        db.on_damage = lambda: mark_for_check(path)


def mark_for_check(path: Path) -> None:
    """SQLite reported damage in ``path``: its next open runs the full integrity check
    (and the stamp of a clean close is not written meanwhile)."""
    marker = Path(f"{path}{CHECK_SUFFIX}")
    if marker.exists():
        return
    log.warning("the chat database %s reported damage; it is checked at the next start",
                path)
    with contextlib.suppress(OSError):
        marker.touch()
    with contextlib.suppress(OSError):
        Path(f"{path}{CLEAN_SUFFIX}").unlink(missing_ok=True)


def _file_state(path: Path) -> dict[str, int]:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "ino": st.st_ino, "dev": st.st_dev}


def _take_clean_stamp(path: Path) -> bool:
    """Whether ``path`` is as the last clean close left it (its stamp matches, no ``-wal``
    has frames); the stamp is removed either way, so that a crash of this session cannot
    leave one behind."""
    stamp = Path(f"{path}{CLEAN_SUFFIX}")
    try:
        saved = json.loads(stamp.read_text(encoding="utf-8"))
        written = os.stat(stamp).st_mtime_ns
    except (OSError, ValueError):
        saved = None
    with contextlib.suppress(OSError):
        stamp.unlink(missing_ok=True)
    if not isinstance(saved, dict) or not _after(written, saved):
        return False
    try:
        wal = os.stat(f"{path}-wal").st_size
    except FileNotFoundError:
        wal = 0
    except OSError:
        return False
    try:
        return wal == 0 and saved == _file_state(path)
    except OSError:
        return False


def _write_clean_stamp(path: Path) -> None:
    """After the last connection closed (SQLite then folds the ``-wal`` into the file and
    removes it): record how the file looks. Not while a ``-wal`` is left (another
    connection is open: its writes would come later) nor after damage was reported."""
    if (os.path.lexists(f"{path}-wal") or os.path.lexists(f"{path}{CHECK_SUFFIX}")
            or not path.is_file()):
        return
    stamp = Path(f"{path}{CLEAN_SUFFIX}")
    try:
        state = _file_state(path)
        for _ in range(STAMP_TRIES):
            write_atomic(stamp, json.dumps(state))
            if _after(os.stat(stamp).st_mtime_ns, state):
                return
            time.sleep(STAMP_WAIT_S)  # the file system's clock has not moved on yet
        stamp.unlink()  # it never did (a 2 s clock): no stamp, the next start checks
    except OSError as err:  # a read-only folder: the next start checks the whole file
        log.info("could not write %s: %s", stamp, err)


STAMP_TRIES = 10
STAMP_WAIT_S = 0.005
"""How long a clean close waits, at most, for the file system's clock to tick past the
database's last write (a few milliseconds: its timestamps are coarse)."""


def _after(written_ns: int, state: dict[str, Any]) -> bool:
    """The stamp was written on a later tick of the file system's clock than the file's
    last change: a write after the stamp gets a newer time than the stamp records (in the
    same tick it could keep the same time, size and inode, and pass for clean)."""
    try:
        return written_ns > max(int(state["mtime_ns"]), int(state["ctime_ns"]))
    except (KeyError, TypeError, ValueError):
        return False


def _chat(r: sqlite3.Row) -> Chat:
    return Chat(id=r["id"], title=_stored_text(r["title"]),
                system_prompt=_stored_text(r["system_prompt"]), model=_stored_text(r["model"]),
                updated=r["updated"], sampling=stored_sampling(r["sampling"]))


def _sampling_json(sampling: Mapping[str, Any] | None) -> str | None:
    return json.dumps(dict(sampling), allow_nan=False) if sampling else None


def stored_sampling(raw: object) -> dict[str, Any]:
    """A chat's stored sampling settings, or none ({}): a cell that is not a JSON object
    (NULL for a chat from before they were saved, or one edited or damaged outside the
    app) leaves the chat with the settings a new chat starts with, not unopenable. Each
    value is checked again where it is used."""
    return _stored_stats(raw)


def _stored_stats(raw: object) -> dict[str, Any]:
    """An answer's stored stats, or none: a row whose stats are not a JSON object (a
    database edited or damaged outside the app) loses its stats line, not its chat (one
    bad row made ``messages`` raise, and the whole chat could not be opened)."""
    if not raw:
        return {}
    try:
        stats = json.loads(raw)
    except (TypeError, ValueError, RecursionError):
        return {}
    return stats if isinstance(stats, dict) else {}


def _stored_text(raw: object) -> str:
    """A message's stored text as a string: SQLite keeps whatever was written to a column,
    and bytes (or a number) written there by another tool are shown, not raised on."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return "" if raw is None else str(raw)


def _message_json(m: ChatMessage) -> dict[str, Any]:
    """A message for the JSON export: the raw content as stored, and for an answer with
    thoughts also ``reasoning`` and ``answer`` split out, so a script need not parse tags."""
    out: dict[str, Any] = {"role": m.role, "content": m.content, "status": m.status,
                           "stats": m.stats}
    if m.role == "assistant":
        split = split_reasoning(m.content)
        if split.has_reasoning:
            out["reasoning"], out["answer"] = split.reasoning, split.answer
    return out


def chat_markdown(chat: Chat, messages: Sequence[ChatMessage]) -> str:
    """A chat as Markdown: a heading per message, the stats line in italics."""
    out = [f"# {chat.title}", ""]
    if chat.model:
        out += [f"Model: `{chat.model}`", ""]
    if chat.system_prompt:
        out += ["## System", "", chat.system_prompt, ""]
    for m in messages:
        content = m.content
        if m.role == "assistant":
            split = split_reasoning(m.content)
            if split.has_reasoning:  # folded, as the app shows it (GitHub renders it so)
                content = (f"<details><summary>Thinking</summary>\n\n{split.reasoning}\n\n"
                           f"</details>\n\n{split.answer}")
        out += [f"## {m.role.capitalize()}", "", content, ""]
        if m.stats.get("summary"):
            out += [f"*{m.stats['summary']}*", ""]
    return "\n".join(out)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class _Transaction:
    """``BEGIN``/``COMMIT`` around a group of statements (autocommit otherwise)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
