"""Open the chat database; a damaged one is moved aside, never deleted, and replaced.

Why: a ``chats.sqlite3`` that SQLite finds damaged (a disk fault, a copy cut short, a file
of something else under its name) stopped the window at every start, with advice about
permissions that did not apply. The window's owner (the process holding the data folder's
lock) instead renames it and its ``-wal``/``-shm`` files to a new name beside it
(``chats.sqlite3.corrupt-YYYYmmdd-HHMMSS``; an existing file is never replaced), starts an
empty database, and copies into it the chats the old file still reads whole. Nothing is
lost: the old file stays for a repair tool.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from moescope.session.store import (
    GENERATING,
    INTERRUPTED,
    ChatStore,
    _stored_stats,
    _stored_text,
    is_corruption,
    stored_sampling,
)

log = logging.getLogger(__name__)

SIDE_FILES = ("", "-wal", "-shm")
"""The database and SQLite's files beside it: moved together (a ``-wal`` left behind would
be replayed into the new database)."""


@dataclass(frozen=True)
class OpenedStore:
    """The chat store, and where a damaged database went (None: it was not damaged)."""

    store: ChatStore
    moved_to: Path | None = None
    fault: str = ""
    salvaged: int = 0
    """Chats read whole from the damaged file and copied into the new one."""

    def notice(self) -> str:
        """One line for the user ("" when nothing was moved)."""
        if self.moved_to is None:
            return ""
        kept = (f"{self.salvaged} chat{'s' if self.salvaged != 1 else ''} it still held "
                f"whole {'are' if self.salvaged != 1 else 'is'} copied into a new one"
                if self.salvaged else "MoEScope starts with an empty chat list")
        return (f"The chat database {self.store.path.name} was damaged: {self.fault}; it "
                f"is kept as {self.moved_to} and {kept}.")


def open_chat_store(path: str | Path, *, recover: bool = True,
                    repair: bool = True) -> OpenedStore:
    """:class:`ChatStore` at ``path``; when SQLite finds it damaged and ``repair``, move it
    aside (:func:`move_aside`), copy what it still reads (:func:`salvage`) into a new one.
    Other errors (permissions, a newer schema) are raised as they are. ``repair`` only in
    the data folder's owner: another MoEScope may have the file open."""
    path = Path(path)
    try:
        return OpenedStore(ChatStore(path, recover=recover))
    except sqlite3.DatabaseError as err:
        if not repair or not is_corruption(err):
            raise
        fault = " ".join(str(err).split())[:160]
    moved = move_aside(path)
    log.info("chat database %s is damaged (%s): moved to %s", path, fault, moved)
    store = ChatStore(path, recover=recover)
    return OpenedStore(store, moved, fault, salvage(moved, store))


def move_aside(path: Path, stamp: str | None = None) -> Path:
    """Rename ``path`` (and its ``-wal``, ``-shm``) to ``<name>.corrupt-<stamp>`` beside it
    (``stamp``: the local time, ``YYYYmmdd-HHMMSS``), with ``-2``, ``-3``… where that name
    is taken: no existing file is replaced."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    n = 1
    while True:
        base = path.with_name(f"{path.name}.corrupt-{stamp}" + (f"-{n}" if n > 1 else ""))
        if not any(os.path.lexists(f"{base}{s}") for s in SIDE_FILES):
            try:
                _rename_no_replace(path, base)
            except FileExistsError:  # taken since the look: the next name
                n += 1
                continue
            break
        n += 1
    for side in SIDE_FILES[1:]:
        if os.path.lexists(f"{path}{side}"):
            _rename_no_replace(Path(f"{path}{side}"), Path(f"{base}{side}"))
    return base


def _rename_no_replace(src: Path, dst: Path) -> None:
    """Rename without replacing ``dst``: a hard link then an unlink (``rename`` replaces
    silently); where the file system has no hard links, a rename after a look."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV,
                             errno.EMLINK):
            raise
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "exists", str(dst)) from None
        os.rename(src, dst)
        return
    os.unlink(src)


def salvage(damaged: Path, store: ChatStore) -> int:
    """Copy into ``store`` each chat of ``damaged`` (opened read-only) that reads whole,
    oldest first (the newest ends on top); a chat any read of which fails is left out
    (it stays in the damaged file). Returns how many were copied."""
    try:
        old = sqlite3.connect(f"{damaged.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return 0
    copied = 0
    try:
        try:
            columns = {r[1] for r in old.execute("PRAGMA table_info(chats)")}
            sampling = "sampling" if "sampling" in columns else "NULL"  # older than schema 3
            chats = old.execute(f"SELECT id, title, system_prompt, model, {sampling} "
                                "FROM chats ORDER BY updated, id").fetchall()
        except sqlite3.Error:
            return 0
        for chat_id, title, system_prompt, model, settings in chats:
            try:
                rows = old.execute("SELECT role, content, status, stats FROM messages "
                                   "WHERE chat_id=? ORDER BY position", (chat_id,)).fetchall()
                messages = [(_stored_text(role), _stored_text(content),
                             INTERRUPTED if status == GENERATING else _stored_text(status),
                             _stored_stats(stats)) for role, content, status, stats in rows]
                store.add_chat(_stored_text(title) or "Recovered chat",
                               _stored_text(system_prompt), _stored_text(model), messages,
                               stored_sampling(settings))
            except (sqlite3.Error, ValueError) as err:
                log.warning("chat %s of the damaged database not copied: %s", chat_id, err)
                continue
            copied += 1
    finally:
        old.close()
    return copied
