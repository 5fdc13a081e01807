"""Writing a user's file so that a failure loses nothing and nothing else is destroyed.

An export that fails halfway (a full disk, a folder that vanished) must neither leave a
half-written file behind nor destroy the file it was replacing: a regular file is written
to a temporary file beside it and renamed over it only once complete. Whatever else sits
at the path is respected: a symlink is written through (the file it points to is replaced,
the link stays a link), a FIFO or a character device (``/dev/null``) is written directly,
``-`` means standard output, a path naming one of the process's descriptors
(``/dev/stdout``, ``/dev/fd/3``) is written through that descriptor (``>> log`` appends,
a pipe is a pipe), and nothing that is not a regular file is ever replaced. An output
that is the same file as one of the command's inputs (the model being read, the trace
being replayed) is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

from moescope.util.errors import MoEScopeError

STDOUT = "-"
"""The output path that means standard output."""

PathLike = str | os.PathLike[str]


class OutputPathError(MoEScopeError, OSError):
    """An output path that must not be written (an input, a folder, a block device).

    An ``OSError`` too, so that callers that report failed writes (``err.strerror``) report
    this one the same way; ``str()`` is one sentence for the CLI."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def is_stdout(dest: PathLike) -> bool:
    """Whether ``dest`` is standard output: ``-``, or a path naming this process's
    descriptor 1 (``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1``)."""
    return descriptor_of(dest) == 1


_FD_DIRS = ("/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/")
_MAX_LINKS = 40


def descriptor_of(dest: PathLike) -> int | None:
    """The open descriptor of this process a path names, or None: ``-`` is 1,
    ``/dev/stdout`` and ``/dev/stderr`` 1 and 2, ``/dev/fd/N`` and ``/proc/self/fd/N``
    (or ``/proc/PID/fd/N`` with our PID) N, also through a chain of symlinks. Such a path
    is written through the descriptor (its offset and flags: ``>> file`` appends), never
    by opening what the descriptor's link points to (which, for ``> out.txt``, would
    replace out.txt, and for a pipe does not exist)."""
    text = os.fspath(dest)
    if text == STDOUT:
        return 1
    if not text:
        return None
    p = os.path.abspath(text)
    own = (*_FD_DIRS, f"/proc/{os.getpid()}/fd/")
    for _ in range(_MAX_LINKS):
        if p in ("/dev/stdout", "/dev/stderr"):
            return 1 if p == "/dev/stdout" else 2
        for d in own:
            if p.startswith(d) and p[len(d):].isdigit() and len(p) - len(d) <= 9:
                return int(p[len(d):])
        try:
            link = os.readlink(p)
        except (OSError, ValueError):
            return None
        p = os.path.normpath(os.path.join(os.path.dirname(p), link))
    return None


def _write_descriptor(fd: int, fill: Callable[[IO[bytes]], None]) -> None:
    """``fill`` writing into descriptor ``fd`` (a duplicate: closing it leaves ``fd``
    open), after what Python buffered for it."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            if stream.fileno() == fd:
                stream.flush()
    with os.fdopen(os.dup(fd), "wb") as f:
        fill(f)


def same_file(a: PathLike, b: PathLike) -> bool:
    """Whether ``a`` and ``b`` are one file (device and inode, symlinks followed); False
    when either does not exist."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def refuse_inputs(dest: PathLike, inputs: Iterable[PathLike]) -> None:
    """Raise :class:`OutputPathError` if ``dest`` is the same file as one of ``inputs``:
    ``--trace model.gguf`` would truncate the model while it is mapped."""
    fd = descriptor_of(dest)
    try:
        st = os.fstat(fd) if fd is not None else os.stat(dest)
    except (OSError, ValueError):
        return  # not there yet: it cannot be an input
    if not stat.S_ISREG(st.st_mode):
        return  # a device or FIFO given twice is not overwritten by a write
    for source in inputs:
        try:
            ss = os.stat(source)
        except (OSError, ValueError):
            continue
        if (st.st_dev, st.st_ino) == (ss.st_dev, ss.st_ino):
            name = os.fspath(source)
            also = "" if os.fspath(dest) == name else f" ({name})"
            raise OutputPathError(errno.EINVAL, f"is an input of this command{also}; "
                                                "refusing to overwrite it", os.fspath(dest))


def check_output(dest: PathLike, inputs: Iterable[PathLike] = ()) -> None:
    """Refuse, before any work, an output that cannot or must not be written: one of the
    inputs, a folder, a block device or socket, a file in a folder that does not exist or
    is not writable. Symlinks are judged by what they point to; a path naming one of this
    process's descriptors (:func:`descriptor_of`) needs it open."""
    if os.fspath(dest) == STDOUT:
        return
    refuse_inputs(dest, inputs)
    fd = descriptor_of(dest)
    if fd is not None:
        try:
            os.fstat(fd)
        except OSError:
            raise OutputPathError(errno.EBADF, f"names descriptor {fd}, which is not open",
                                  os.fspath(dest)) from None
        return
    target = resolve_output(dest)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        folder = target.parent
        if not folder.is_dir():
            raise OutputPathError(errno.ENOENT, f"folder {folder} does not exist",
                                  os.fspath(dest)) from None
        if not os.access(folder, os.W_OK):
            raise OutputPathError(errno.EACCES, f"cannot write in folder {folder}",
                                  os.fspath(dest)) from None
        _probe_folder(folder, dest)
        return
    except OSError as err:
        raise OutputPathError(err.errno or errno.EIO, f"cannot write ({err.strerror})",
                              os.fspath(dest)) from None
    if stat.S_ISDIR(st.st_mode):
        raise OutputPathError(errno.EISDIR, "is a folder; give a file name", os.fspath(dest))
    if stat.S_ISREG(st.st_mode):
        if not st.st_mode & 0o222 or not os.access(target, os.W_OK):  # root too: no bits
            raise OutputPathError(errno.EACCES, "is read-only; not replaced (make it "
                                                "writable to replace it)", os.fspath(dest))
        if not os.access(target.parent, os.W_OK):
            raise OutputPathError(errno.EACCES, f"cannot write in folder {target.parent}",
                                  os.fspath(dest))
        _probe_folder(target.parent, dest)
    elif not (stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)):
        raise OutputPathError(errno.EINVAL, "is a block device or socket; not written",
                              os.fspath(dest))


def _probe_folder(folder: Path, dest: PathLike) -> None:
    """Create and remove a temporary file in ``folder``, where a regular output's temporary
    goes: a folder that takes no new files though its permissions say it would (``/proc``,
    a read-only mount seen by root, a full inode table) is refused before any work, and
    in words that name the output and the folder, not only ``No such file or directory``."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".moescope-probe.", suffix=".part", dir=folder)
    except OSError as err:
        raise _no_new_files(folder, dest, err) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)


def _no_new_files(folder: Path, dest: PathLike, err: OSError) -> OutputPathError:
    """The error for a folder in which a temporary file could not be created."""
    return OutputPathError(err.errno or errno.EIO, f"folder {folder} does not take new "
                                                   f"files ({err.strerror or err})",
                           os.fspath(dest))


NAME_MAX = 255
"""The longest file name, in bytes, of the usual file systems."""
LONGEST_PATH = 4095
"""The longest path, in bytes, Linux opens (``PATH_MAX``, 4096, counts the closing NUL)."""
_TEMP_EXTRA = len("..") + 8 + len(".part")
"""What a temporary's name adds to its target's: two dots, tempfile's 8 random characters
and the suffix."""


def temp_prefix(name: str) -> str:
    """``.NAME.``, the start of a temporary's name beside ``NAME``, with ``NAME`` cut (on
    a character boundary) so that the whole temporary's name fits :data:`NAME_MAX`: an
    output named with 241 to 255 bytes, a valid name, was refused as "folder does not
    take new files (File name too long)"."""
    raw = os.fsencode(name)
    room = NAME_MAX - _TEMP_EXTRA
    if len(raw) > room:
        try:
            raw.decode("utf-8")
            name = raw[:room].decode("utf-8", "ignore")  # a character cut in two: dropped
        except UnicodeDecodeError:  # not UTF-8 (surrogate-escaped): any byte is a character
            name = os.fsdecode(raw[:room])
    return f".{name}."


def _mkstemp_beside(target: Path, dest: PathLike, folder: Path | None = None
                    ) -> tuple[int, str]:
    """A temporary ``.NAME.*.part`` in ``folder`` (default: beside ``target``; ``NAME``
    cut to fit, :func:`temp_prefix`); its failure names ``dest``, not the temporary's name
    that the user never gave."""
    folder = target.parent if folder is None else folder
    try:
        return tempfile.mkstemp(prefix=temp_prefix(target.name), suffix=".part", dir=folder)
    except OSError as err:
        raise _no_new_files(folder, dest, err) from None


def resolve_output(dest: PathLike) -> Path:
    """Where a write to ``dest`` lands: the final target of a symlink chain (which need
    not exist yet), else ``dest`` itself."""
    p = Path(dest)
    try:
        link = stat.S_ISLNK(os.lstat(p).st_mode)
    except (OSError, ValueError):  # missing, or a name too long: the caller's stat says
        return p
    return Path(os.path.realpath(p)) if link else p


def _regular_or_missing(target: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(target).st_mode)
    except FileNotFoundError:
        return True


def _atomic(dest: PathLike, fill: Callable[[IO[bytes]], None],
            inputs: Iterable[PathLike]) -> Path:
    if os.fspath(dest) == STDOUT:
        out = sys.stdout
        out.flush()
        fill(out.buffer)
        out.buffer.flush()
        return Path(STDOUT)
    inputs = list(inputs)
    check_output(dest, inputs)
    fd = descriptor_of(dest)
    if fd is not None:  # /dev/stdout and the like: into the descriptor, as it is
        _write_descriptor(fd, fill)
        return Path(dest)
    target = resolve_output(dest)
    if not _regular_or_missing(target):  # a FIFO or character device: write into it
        fd = os.open(target, os.O_WRONLY | os.O_NOCTTY)
        with os.fdopen(fd, "wb") as f:
            fill(f)
        return Path(dest)
    fd, tmp = _mkstemp_beside(target, dest)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(target))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return Path(dest)


def open_stream(dest: PathLike, inputs: Iterable[PathLike] = ()) -> IO[bytes]:
    """Open ``dest`` to be written as it goes (a trace recorded token by token), by the
    same rules as :func:`write_atomic` except that a regular file is truncated and written
    in place (a crash keeps what was written). ``-`` is a duplicate of standard output,
    so closing the stream leaves ``sys.stdout`` open."""
    if os.fspath(dest) == STDOUT:
        sys.stdout.flush()
        return os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    check_output(dest, inputs)
    fd = descriptor_of(dest)
    if fd is not None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                if stream.fileno() == fd:
                    stream.flush()
        return os.fdopen(os.dup(fd), "wb")
    target = resolve_output(dest)
    if _regular_or_missing(target):
        return open(target, "wb")
    fd = os.open(target, os.O_WRONLY | os.O_NOCTTY)
    return os.fdopen(fd, "wb")


def _mode_for(target: Path) -> int:
    """The permissions a file written to ``target`` gets: those of the file it replaces
    (a private ``0600`` export stayed private only until it was written again: the new
    one was ``0644``), else the usual ``0666`` less the umask."""
    try:
        st = os.stat(target)
    except OSError:
        return 0o666 & ~_umask()
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` would, for a moment,
    for every thread); 0o022 where /proc does not say."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as f:
            line = next(x for x in f if x.startswith("Umask:"))
        return int(line.split()[1], 8)
    return 0o022


def write_atomic(dest: PathLike, data: str | bytes, *,
                 inputs: Iterable[PathLike] = ()) -> Path:
    """Write ``data`` (text as UTF-8) to ``dest``, all or nothing for a regular file
    (``OSError`` on failure, with ``dest`` as it was); ``dest`` must not be one of
    ``inputs`` (:class:`OutputPathError`)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return _atomic(dest, lambda f: f.write(raw), inputs)


def fill_atomic(dest: PathLike, fill: Callable[[IO[bytes]], None], *,
                inputs: Iterable[PathLike] = ()) -> Path:
    """Have ``fill`` write ``dest`` through a file object, all or nothing for a regular file
    (a temporary ``.NAME.*.part`` beside it, synced, then renamed over it): for writers
    that stream their output (a Parquet file) rather than hand over bytes."""
    return _atomic(dest, fill, inputs)


def copy_atomic(src: PathLike, dest: PathLike, *, inputs: Iterable[PathLike] = ()) -> Path:
    """Copy ``src`` to ``dest``, all or nothing (``OSError`` on failure); ``dest`` must
    not be ``src`` itself nor one of ``inputs``."""
    def fill(f: IO[bytes]) -> None:
        with open(src, "rb") as s:
            shutil.copyfileobj(s, f, 1 << 20)
    return _atomic(dest, fill, [src, *inputs])


class StagedOutputs:
    """Several outputs that appear together or not at all: each is written whole to a
    temporary file beside it (synced), and only :meth:`commit` renames them all over their
    targets. Until then nothing at any output path has changed, so a failure, or a user
    who cancels (an export that takes minutes), leaves every output as it was; leaving
    the ``with`` block without a commit removes the temporaries.

    Outputs are judged as :func:`write_atomic` judges them (never an input, a folder or a
    block device; a symlink is written through); a FIFO or character device gets its
    bytes at commit time, from a temporary in the system's temporary folder. A rename
    that fails within the commit (the folder removed between two of them) can leave the
    earlier outputs renamed: each is still a whole file.
    """

    def __init__(self, inputs: Iterable[PathLike] = ()) -> None:
        self.inputs = list(inputs)
        # temporary, target, regular, the descriptor it names (/dev/stderr) or None
        self._staged: list[tuple[Path, Path, bool, int | None]] = []

    def __enter__(self) -> StagedOutputs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()

    def stage(self, dest: PathLike, fill: Callable[[IO[bytes]], None]) -> Path:
        """Have ``fill`` write what ``dest`` will hold; returns the temporary file (which
        may be read back until the commit)."""
        if is_stdout(dest):
            raise OutputPathError(errno.EINVAL, "standard output cannot take several "
                                                "files; give a file name", os.fspath(dest))
        check_output(dest, self.inputs)
        descriptor = descriptor_of(dest)  # written through it at commit, as a device is
        target = Path(dest) if descriptor is not None else resolve_output(dest)
        regular = descriptor is None and _regular_or_missing(target)
        folder = target.parent if regular else Path(tempfile.gettempdir())
        fd, name = _mkstemp_beside(target, dest, folder)
        tmp = Path(name)
        self._staged.append((tmp, target, regular, descriptor))  # first: discard() removes it
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(target) if regular else 0o600)
        return tmp

    def commit(self) -> None:
        """Put every staged file in place (the temporaries are gone after)."""
        staged, self._staged = self._staged, []
        try:
            while staged:
                tmp, target, regular, descriptor = staged[0]
                if regular:
                    os.replace(tmp, target)
                elif descriptor is not None:
                    with open(tmp, "rb") as src:
                        _write_descriptor(descriptor,
                                          lambda out, src=src: shutil.copyfileobj(src, out,
                                                                                  1 << 20))
                    os.unlink(tmp)
                else:
                    fd = os.open(target, os.O_WRONLY | os.O_NOCTTY)
                    with os.fdopen(fd, "wb") as out, open(tmp, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
                    os.unlink(tmp)
                staged.pop(0)
        finally:
            self._staged = staged + self._staged  # what was not put in place: discarded

    def discard(self) -> None:
        """Remove the temporaries not committed (every output stays as it was)."""
        staged, self._staged = self._staged, []
        for tmp, _, _, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
