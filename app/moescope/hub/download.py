"""Download a model into the models folder: resumable, checked, never half-visible.

A 50 GB download breaks: the bytes go to ``NAME.gguf.incomplete`` beside the destination
(a name the model reader refuses, :data:`~moescope.model.gguf_info.PARTIAL_SUFFIXES`),
a broken connection is resumed from where it stopped with a range request (a few times
on its own, and again by running the same download later), and only when every byte is
there and its sha256 is the one the Hub lists is the file renamed to its real name. Free
space is checked before the first byte; a hash mismatch deletes the bad bytes.

One download of a model at a time: a second MoEScope (another window, ``moescope pull``)
would share the ``.incomplete`` file, cut it back to what it had checked while the first
wrote on past that, and the first would put a file with a zero-filled gap in place (its
sha256 was of the bytes it received, not of the disk). So a download holds an advisory
lock on ``NAME.gguf.lock`` beside the first part (removed at the end; a crash releases it
with the process), and a second one is refused at once with the holder's process id.
Before the rename the file on disk is checked too: its size, and (where the file system
can tell) that no hole was cut into it; a file with a hole is hashed again from the disk.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]
try:
    import msvcrt
except ImportError:
    msvcrt = None  # type: ignore[assignment]

import httpx2

from moescope.cache.budget import format_bytes
from moescope.hub.errors import (
    DiskFullError,
    DownloadBusy,
    DownloadCancelled,
    DownloadInterrupted,
    HashMismatchError,
    HubError,
)
from moescope.hub.remote import (
    HubClient,
    RemoteFile,
    RemoteModel,
    check_repo_id,
    range_mismatch,
)
from moescope.model.gguf_info import PARTIAL_SUFFIXES

INCOMPLETE = ".incomplete"
LOCK = ".lock"
"""Beside a model's first part while it downloads: the lock one download holds."""
_MSVCRT_LOCK_AT = 1 << 20
"""Where Windows locks a byte of the lock file (past the process id, which stays readable)."""
CHUNK = 1 << 20
SPEED_WINDOW_S = 5.0
PROGRESS_EVERY_S = 0.1


@dataclass(frozen=True)
class Progress:
    """How far a download is: bytes of the whole model (all its parts)."""

    file: str
    done: int
    total: int
    speed: float
    """Bytes per second over the last few seconds (0 before there is a measure)."""
    stage: str = "downloading"
    """``checking`` while an earlier partial file is hashed before resuming."""

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0

    @property
    def eta(self) -> float | None:
        return (self.total - self.done) / self.speed if self.speed > 0 else None

    def line(self) -> str:
        """``1.2 GiB of 4.5 GiB (27%), 85.0 MiB/s, 0:40 left``."""
        text = (f"{format_bytes(self.done)} of {format_bytes(self.total)} "
                f"({self.fraction:.0%})")
        if self.stage != "downloading":
            return f"{self.stage} {text}"
        if self.speed > 0:
            text += f", {format_bytes(int(self.speed))}/s"
        if self.eta is not None:
            text += f", {format_duration(self.eta)} left"
        return text


def format_duration(seconds: float) -> str:
    s = int(min(max(seconds, 0), 359_999))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else \
        f"{s // 60}:{s % 60:02d}"


NAME_MAX = 255
"""The longest file name (in bytes) the usual file systems take; a file's name in the
repository plus :data:`INCOMPLETE` must fit, or every look at it fails (ENAMETOOLONG)."""


def model_paths(folder: str | os.PathLike[str], model: RemoteModel) -> list[Path]:
    """Where each file of ``model`` lands: ``FOLDER/OWNER/NAME/PATH-IN-REPO``; a name
    that cannot be a file here (``..``, a control character, too long) is one
    :class:`HubError`."""
    base = Path(folder).joinpath(*check_repo_id(model.repo_id).split("/"))
    out = []
    for f in model.files:
        parts = PurePosixPath(f.path).parts
        if not parts or any(p in ("", ".", "..") or "\\" in p or "\0" in p for p in parts) \
                or PurePosixPath(f.path).is_absolute() \
                or any(ord(c) < 32 or ord(c) == 127 for c in f.path):
            raise HubError(f"{f.path!r}: not a safe file name; not downloaded")
        longest = max(len(os.fsencode(p)) for p in parts) + len(INCOMPLETE)
        if longest > NAME_MAX:
            raise HubError(f"{f.path[:60]!r}...: a name in it is too long for a file here "
                           f"(over {NAME_MAX - len(INCOMPLETE)} bytes); not downloaded")
        out.append(base.joinpath(*parts))
    return out


def is_downloaded(folder: str | os.PathLike[str], model: RemoteModel) -> bool:
    return all(p.is_file() and not p.is_symlink() and p.stat().st_size == f.size
               for p, f in zip(model_paths(folder, model), model.files, strict=True))


def local_models(folder: str | os.PathLike[str]) -> list[Path]:
    """Finished models under ``folder``: ``*.gguf`` files, the first part of a split one,
    never a partial download."""
    root = Path(folder)
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.rglob("*.gguf")):
        name = p.name.lower()
        if name.endswith(PARTIAL_SUFFIXES) or name.startswith("mmproj") or p.is_symlink():
            continue
        if "-of-" in name and not name.rsplit("-of-", 1)[0].endswith("-00001"):
            continue
        if p.is_file():
            out.append(p)
    return out


class _Meter:
    """Speed over a sliding window, and a throttle for progress callbacks."""

    def __init__(self, total: int, report: Callable[[Progress], None] | None) -> None:
        self.total = total
        self.report = report
        self.samples: deque[tuple[float, int]] = deque()
        self.last = 0.0

    def __call__(self, file: str, done: int, *, force: bool = False,
                 stage: str = "downloading") -> None:
        now = time.monotonic()
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > SPEED_WINDOW_S:
            self.samples.popleft()
        if self.report is None or not (force or now - self.last >= PROGRESS_EVERY_S):
            return
        self.last = now
        t0, d0 = self.samples[0]
        speed = (done - d0) / (now - t0) if now - t0 > 0.2 and done > d0 else 0.0
        self.report(Progress(file=file, done=done, total=self.total, speed=speed, stage=stage))

    def restart_window(self) -> None:
        self.samples.clear()


def download_model(client: HubClient, model: RemoteModel, folder: str | os.PathLike[str], *,
                   on_progress: Callable[[Progress], None] | None = None,
                   cancel: threading.Event | None = None, retries: int = 3) -> Path:
    """Download every file of ``model`` into ``folder`` and return the path to open (the
    first part). Resumes partial files; raises :class:`HubError` subclasses, keeping the
    partial bytes except after a hash mismatch."""
    if not model.complete:
        raise HubError(f"{model.describe()}: cannot download a split model with parts "
                       f"missing on the Hub")
    targets = model_paths(folder, model)
    for path in targets:
        _check_target(path)
    if all(p.is_file() and p.stat().st_size == f.size
           for f, p in zip(model.files, targets, strict=True)):
        # every file is in place (a file gets its name only once checked): nothing to
        # write, so no lock either (the folder may be read-only)
        meter = _Meter(model.size, on_progress)
        meter(model.files[-1].path, model.size, force=True)
        return targets[0]
    targets[0].parent.mkdir(parents=True, exist_ok=True)
    with _download_lock(targets[0], model):  # the files are looked at only once it is held
        todo = [(f, p) for f, p in zip(model.files, targets, strict=True)
                if not (p.is_file() and p.stat().st_size == f.size)]
        _check_space(targets[0].parent, todo, model)
        meter = _Meter(model.size, on_progress)
        done_before = model.size - sum(f.size for f, _ in todo)
        for f, path in todo:
            path.parent.mkdir(parents=True, exist_ok=True)
            _download_file(client, model, f, path, meter, done_before, cancel, retries)
            done_before += f.size
    meter(model.files[-1].path, model.size, force=True)
    return targets[0]


def _check_target(path: Path) -> None:
    """A download never replaces a symlink, a device or a folder."""
    for p in (path, path.with_name(path.name + INCOMPLETE), path.with_name(path.name + LOCK)):
        if p.is_symlink() or (p.exists() and not p.is_file()):
            raise HubError(f"{p}: exists and is not a regular file; not replaced")


LOOK_RETRIES = 10
LOOK_RETRY_S = 0.005
"""A lock found taken is asked for again this many times, this far apart, before the
download is refused: :func:`download_holder` (the window polls it every second) holds it
shared for an instant, and a download starting then was refused as busy."""


@contextlib.contextmanager
def _download_lock(first: Path, model: RemoteModel) -> Iterator[None]:
    """Hold ``FIRST.lock`` (an exclusive advisory lock, never waited for) while ``model``
    downloads, or raise :class:`DownloadBusy` naming the process that holds it. The file
    holds the holder's process id and is removed when the download ends, however it ends;
    a lock file left by a crash is free (its lock died with its process) and is taken."""
    if fcntl is None and msvcrt is None:
        yield
        return
    path = first.with_name(first.name + LOCK)
    for _ in range(100):  # a holder that finishes between our open and lock removes the file
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOINHERIT", 0), 0o644)
        except OSError as err:
            raise HubError(f"cannot write {path}: {err.strerror}") from None
        try:
            locked = _try_lock(fd)
            for _ in range(LOOK_RETRIES):  # a look (download_holder) lets go within a ms
                if locked:
                    break
                time.sleep(LOOK_RETRY_S)
                locked = _try_lock(fd)
        except BaseException:
            os.close(fd)
            raise
        if not locked:
            holder = LockHolder(_read_pid(fd))
            os.close(fd)
            raise DownloadBusy(f"{model.name} is already being downloaded by "
                               f"{holder.who()}: let that download finish (or cancel it "
                               f"there), then try again") from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
        except OSError:
            same = False
        if same:
            break
        os.close(fd)
    else:
        raise HubError(f"cannot take the download lock {path}: it keeps being replaced")
    try:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        if msvcrt is not None and fcntl is None:  # Windows cannot remove an open file
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
        else:  # removed while still held, so nobody can take a file on its way out
            with contextlib.suppress(OSError):
                path.unlink()
            os.close(fd)


@dataclass(frozen=True)
class LockHolder:
    """A download holding a model's lock: the process id its lock file names, if any."""

    pid: int | None

    def who(self) -> str:
        """"another MoEScope (process 1234)"."""
        return "another MoEScope" + (f" (process {self.pid})" if self.pid is not None else "")


def download_holder(folder: str | os.PathLike[str], model: RemoteModel) -> LockHolder | None:
    """Who downloads ``model`` into ``folder`` now (the holder of its lock: another process,
    or another download of this one), or None where nobody does (no lock file, a free one
    left by a crash, a file system without locks). A look, never a wait: the lock is asked
    for shared and let go at once (a download starting in that instant asks again a few
    times, :data:`LOOK_RETRIES`); the window polls this, so it stays cheap: one open."""
    if fcntl is None and msvcrt is None:
        return None
    try:
        first = model_paths(folder, model)[0]
    except HubError:
        return None
    path = first.with_name(first.name + LOCK)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOINHERIT", 0))
    except OSError:  # no download of it, or one we could not look at: not refused here
        return None
    try:
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            else:
                os.lseek(fd, _MSVCRT_LOCK_AT, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_NBRLCK, 1)
                os.lseek(fd, _MSVCRT_LOCK_AT, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        except (BlockingIOError, PermissionError):
            return LockHolder(_read_pid(fd))
        except OSError as err:
            if err.errno in (errno.EACCES, errno.EAGAIN, errno.EWOULDBLOCK, errno.EDEADLK):
                return LockHolder(_read_pid(fd))
            return None  # ENOLCK, EOPNOTSUPP...: no locking here, so nobody is refused
        return None
    finally:
        os.close(fd)


def _try_lock(fd: int) -> bool:
    """Lock ``fd`` without waiting: False if another open file holds it. A file system
    without locks (some network ones) is downloaded into unlocked, as before locks."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            os.lseek(fd, _MSVCRT_LOCK_AT, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except (BlockingIOError, PermissionError):
        return False
    except OSError as err:  # ENOLCK, EOPNOTSUPP...: no locking here
        return err.errno not in (errno.EACCES, errno.EAGAIN, errno.EWOULDBLOCK, errno.EDEADLK)
    return True


def _read_pid(fd: int) -> int | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 32).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _check_space(folder: Path, todo: list[tuple[RemoteFile, Path]], model: RemoteModel
                 ) -> None:
    needed = 0
    for f, p in todo:
        part = p.with_name(p.name + INCOMPLETE)
        have = part.stat().st_size if part.is_file() else 0
        needed += f.size - min(have, f.size)
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise DiskFullError(f"not enough free space for {model.name}: it needs "
                            f"{format_bytes(needed)} more in {folder}, which has "
                            f"{format_bytes(free)} free")


class _Hashes:
    """The sha256 (LFS) and git blob id of the bytes so far, fed in order."""

    def __init__(self, f: RemoteFile) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.git = hashlib.sha1(f"blob {f.size}\0".encode()) if f.git_oid else None

    def update(self, data: bytes | memoryview) -> None:
        self.sha.update(data)
        if self.git is not None:
            self.git.update(data)

    def mismatch(self) -> str | None:
        if self.f.sha256 and self.sha.hexdigest() != self.f.sha256:
            return f"sha256 {self.sha.hexdigest()[:12]}… instead of {self.f.sha256[:12]}…"
        if self.f.git_oid and self.git is not None and self.git.hexdigest() != self.f.git_oid:
            return f"git id {self.git.hexdigest()[:12]}… instead of {self.f.git_oid[:12]}…"
        return None


def _download_file(client: HubClient, model: RemoteModel, f: RemoteFile, path: Path,
                   meter: _Meter, before: int, cancel: threading.Event | None,
                   retries: int) -> None:
    part = path.with_name(path.name + INCOMPLETE)
    fd = os.open(part, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "r+b", buffering=0) as out:  # a full disk fails at its write
        offset = os.fstat(out.fileno()).st_size
        if offset > f.size:
            offset = 0
        hashes = _Hashes(f)
        out.seek(0)
        checked = 0
        while checked < offset:  # resuming: the hash needs the bytes already here
            block = out.read(min(CHUNK, offset - checked))
            if not block:
                break
            hashes.update(block)
            checked += len(block)
            meter(f.path, before + checked, stage="checking")
        offset = checked
        out.truncate(offset)
        meter.restart_window()
        state = _State(offset, hashes)
        failures = 0
        furthest = offset
        while state.offset < f.size:
            if cancel is not None and cancel.is_set():
                raise DownloadCancelled(f"download of {model.name} cancelled; the partial "
                                        f"file is kept for resuming")
            try:
                _fetch(client, model, f, out, state, meter, before, cancel, part)
            except (httpx2.TransportError, DownloadInterrupted) as err:
                # only bytes past the furthest point reached count as progress: a server
                # whose file is shorter than listed answers the resume with 416, the
                # download starts over, stops at the same byte, and looped for ever
                failures = 1 if state.offset > furthest else failures + 1
                furthest = max(furthest, state.offset)
                if failures > retries:
                    raise DownloadInterrupted(
                        f"connection lost at {format_bytes(state.offset)} of "
                        f"{format_bytes(f.size)} of {f.path} ({str(err)[:120] or 'closed'}): "
                        f"run the download again to resume") from None
                time.sleep(min(0.25 * 2 ** failures, 4.0))
            except OSError as err:
                if err.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise DiskFullError(f"the disk filled up while writing {path.name} in "
                                        f"{path.parent}: free some space and download again "
                                        f"to resume") from None
                raise HubError(f"cannot write {part}: {err.strerror}") from None
        hashes = state.hashes
        bad = hashes.mismatch()
        if bad is not None:
            out.close()
            with contextlib.suppress(OSError):
                part.unlink()
            raise HashMismatchError(f"{f.path}: the downloaded bytes are not the Hub's "
                                    f"({bad}); the bad file was deleted: download again")
        os.fsync(out.fileno())
        bad = _changed_on_disk(out, f, lambda n: meter(f.path, before + n, stage="checking"))
        if bad is not None:
            out.close()
            with contextlib.suppress(OSError):
                part.unlink()
            raise HashMismatchError(f"{f.path}: the file on disk is not what was downloaded "
                                    f"({bad}; did another program write to {part.name}?); "
                                    f"the bad file was deleted: download again")
    os.replace(part, path)


def _changed_on_disk(out: BinaryIO, f: RemoteFile, report: Callable[[int], None]
                     ) -> str | None:
    """Why the file as it lies on disk is not the one that was hashed, or None. Cheap: its
    size, and whether a hole was cut into it (a truncation written past leaves one, where
    the file system can tell); only a file with a hole (a file system that makes zeros
    holes, or one cut into) is read back and hashed again."""
    size = os.fstat(out.fileno()).st_size
    if size != f.size:
        return f"{size} bytes instead of {f.size}"
    try:
        hole = os.lseek(out.fileno(), 0, os.SEEK_HOLE) if hasattr(os, "SEEK_HOLE") else size
    except OSError:
        hole = size
    if hole >= size:
        return None
    hashes = _Hashes(f)
    out.seek(0)
    done = 0
    while block := out.read(CHUNK):
        hashes.update(block)
        done += len(block)
        report(done)
    return hashes.mismatch()


@dataclass
class _State:
    offset: int
    hashes: _Hashes


def _fetch(client: HubClient, model: RemoteModel, f: RemoteFile, out: BinaryIO,
           state: _State, meter: _Meter, before: int, cancel: threading.Event | None,
           part: Path) -> None:
    """One GET from ``state.offset`` on, written and hashed as it comes (both start over
    when the server sends the whole file instead of the range); returns early only when
    cancelled."""
    out.seek(state.offset)
    out.truncate(state.offset)
    headers = {"Accept-Encoding": "identity"}
    if state.offset:
        headers["Range"] = f"bytes={state.offset}-"
    url = client.file_url(model.repo_id, f.path, model.revision)
    with client.stream(url, what=f"{model.repo_id}/{f.path}", headers=headers) as response:
        if response.status_code == 416:  # nothing past offset: all here, or start over
            if state.offset != f.size:
                _restart(out, f, state)
            return
        if response.status_code == 206:
            bad = range_mismatch(response.headers.get("Content-Range"), state.offset,
                                 f.path, f.size)
            if bad is not None:  # nothing of it is written; what is on disk stays
                kept = (f"the {format_bytes(state.offset)} already downloaded are kept in "
                        f"{part.name}: run the download again to resume, or delete that "
                        f"file to download from the start" if state.offset else
                        "nothing was written")
                raise HubError(f"{bad}; not downloaded: {kept}")
        elif state.offset:
            _restart(out, f, state)
        for chunk in response.iter_bytes():
            if cancel is not None and cancel.is_set():
                return
            if state.offset + len(chunk) > f.size:
                raise HubError(f"{f.path}: the server sent more than the {f.size} bytes the "
                               f"Hub lists")
            view = memoryview(chunk)
            while view:
                view = view[out.write(view) or 0:]
            state.hashes.update(chunk)
            state.offset += len(chunk)
            meter(f.path, before + state.offset)
    if state.offset < f.size:
        raise DownloadInterrupted("the server closed the connection early")


def _restart(out: BinaryIO, f: RemoteFile, state: _State) -> None:
    out.seek(0)
    out.truncate(0)
    state.offset, state.hashes = 0, _Hashes(f)

