"""Run ``moescope`` commands on hostile inputs, thousands of times, each isolated and bounded.

A fuzzer must see what a user would see: the exit status, stderr, a signal, a hang, or a
runaway allocation, without one bad input taking the test run (or the machine) with it.
A fresh ``python -m moescope`` per input costs about a second of imports (numpy, gguf,
llama-cpp-python), far more than most inputs take, so :class:`ForkRunner` starts one
worker process that imports the CLI once and forks a child per input. The child gets
resource limits (address space, CPU seconds, file size, no core file) and its own stdout
and stderr files before it calls :func:`moescope.cli.main`; the worker enforces a wall
timeout and reports how the child ended. :func:`classify` turns that into one of
:data:`OUTCOMES`.

The worker is ``python -m moescope_testing.forkrun``: requests and replies are JSON lines
on two private pipes, so nothing a child prints can corrupt them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUTCOMES = ("ok", "error", "bad-error", "traceback", "abort", "hang", "memory")
"""``ok``: exit 0. ``error``: a nonzero exit with one ``moescope: error:`` line on stderr.
``bad-error``: a nonzero exit without exactly that (no message, several, or one asking for
a bug report). ``traceback``: Python's traceback on stderr. ``abort``: a signal (ggml's
``abort``, a segfault, SIGBUS) or a ``moescope: fatal:`` line. ``hang``: past the wall or
CPU limit. ``memory``: an allocation refused by the address-space limit, or a peak RSS
over the memory limit. Only the first two are acceptable."""
ACCEPTABLE = ("ok", "error")

DEFAULT_MEMORY = 4 << 30
"""Extra address space a child may map beyond the worker's own (thread stacks and glibc
arenas count here, so this is far above what a tiny model needs)."""
DEFAULT_RSS = 1 << 30
"""Peak resident memory above which a run counts as ``memory``: tiny inputs need tens of
MiB, so anything near this is an allocation sized by a hostile number."""
_READ_CAP = 64 << 10
_ARGPARSE_ERROR = re.compile(r"^moescope( [a-z-]+)?: error: ")
_NOTE_PREFIXES = ("moescope: note:", "moescope: warning:", "moescope: budget ")


@dataclass(frozen=True)
class RunResult:
    """How one child ended."""

    argv: tuple[str, ...]
    returncode: int | None  # None when it ended by a signal
    signal: int | None
    timed_out: bool
    seconds: float
    max_rss: int  # bytes
    stdout: str
    stderr: str

    @property
    def outcome(self) -> str:
        return classify(self)


def classify(r: RunResult, rss_limit: int = DEFAULT_RSS) -> str:
    """One of :data:`OUTCOMES` for ``r``."""
    err = r.stderr
    if r.timed_out or r.signal in (signal.SIGXCPU, signal.SIGKILL):
        return "hang"
    if ("MemoryError" in err or "bad_alloc" in err or "Cannot allocate memory" in err
            or r.max_rss > rss_limit):
        return "memory"
    if "Traceback (most recent call last)" in err:
        return "traceback"
    if r.signal is not None or "moescope: fatal:" in err:
        return "abort"
    if r.returncode == 0:
        return "ok"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if len(lines) == 1 and _ARGPARSE_ERROR.match(lines[0]) \
            and not lines[0].startswith("moescope: error:"):  # a subcommand's option
        return "error"
    errors = [ln for ln in lines if ln.startswith("moescope: error:")]
    others = [ln for ln in lines if not ln.startswith(("moescope: error:", *_NOTE_PREFIXES))]
    if len(errors) == 1 and not others and lines[-1] is errors[0] and "bug" not in errors[0]:
        return "error"
    return "bad-error"


class ForkRunner:
    """A worker that imports MoEScope once and runs each command in a fresh fork.

    >>> with ForkRunner() as runner:                                  # doctest: +SKIP
    ...     runner.run(["info", "model.gguf"]).outcome
    'ok'
    """

    def __init__(self, *, timeout: float = 30.0, cpu_seconds: int = 20,
                 memory: int = DEFAULT_MEMORY, scratch: str | os.PathLike[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.timeout = timeout
        self.cpu_seconds = cpu_seconds
        self.memory = memory
        self._tmp = tempfile.TemporaryDirectory(prefix="moescope-fork-", dir=scratch)
        self.scratch = Path(self._tmp.name)
        self._env = env
        self._proc: subprocess.Popen[bytes] | None = None
        self._req_w: int | None = None
        self._rep_r: Any = None

    def __enter__(self) -> ForkRunner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the worker (imports take a second or two, once)."""
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        env = dict(os.environ if self._env is None else self._env)
        env.pop("PYTHONFAULTHANDLER", None)  # a fault is a signal here, reported as an abort
        # OpenMP threads reserve glibc's default 8 MiB stack each: 512 threads (the most
        # --threads allows) would fill the address-space limit with stacks they never use
        env.setdefault("OMP_STACKSIZE", "1M")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moescope_testing.forkrun", str(req_r), str(rep_w)],
            pass_fds=(req_r, rep_w), stdin=subprocess.DEVNULL, env=env)
        os.close(req_r)
        os.close(rep_w)
        self._req_w = req_w
        self._rep_r = os.fdopen(rep_r, "rb")
        ready = self._rep_r.readline()
        if not ready.startswith(b'{"ready"'):
            self.stop()
            raise RuntimeError(f"the fork worker did not start: {ready!r}")

    def run(self, argv: Sequence[str], *, cwd: str | os.PathLike[str] | None = None,
            stdin: bytes = b"", timeout: float | None = None) -> RunResult:
        """Run ``moescope ARGV`` in a fresh fork of the worker; restarts a dead worker."""
        if self._proc is None or self._proc.poll() is not None:
            self.stop()
            self.start()
        assert self._req_w is not None
        stdin_path = self.scratch / "stdin"
        stdin_path.write_bytes(stdin)
        request = {"argv": list(argv), "cwd": str(cwd or self.scratch),
                   "scratch": str(self.scratch), "stdin": str(stdin_path),
                   "timeout": timeout or self.timeout, "cpu": self.cpu_seconds,
                   "memory": self.memory}
        os.write(self._req_w, (json.dumps(request) + "\n").encode())
        line = self._rep_r.readline()
        if not line:
            self.stop()
            raise RuntimeError("the fork worker died")
        reply = json.loads(line)
        return RunResult(argv=tuple(argv), returncode=reply["returncode"],
                         signal=reply["signal"], timed_out=reply["timed_out"],
                         seconds=reply["seconds"], max_rss=reply["max_rss"],
                         stdout=reply["stdout"], stderr=reply["stderr"])

    def close(self) -> None:
        """Stop the worker and remove the scratch folder."""
        self.stop()
        self._tmp.cleanup()

    def stop(self) -> None:
        """Stop the worker (the next :meth:`run` starts another); the scratch folder stays."""
        if self._req_w is not None:
            with contextlib.suppress(OSError):
                os.close(self._req_w)
            self._req_w = None
        if self._rep_r is not None:
            self._rep_r.close()
            self._rep_r = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


# --------------------------------------------------------------------------- the worker

def _vm_size() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _child(req: dict[str, Any], out: str, err: str) -> None:
    """In the fork: limits, files, then the CLI. Never returns."""
    rc = 1
    try:
        os.setpgid(0, 0)
        os.chdir(req["cwd"])
        fd_in = os.open(req["stdin"], os.O_RDONLY)
        fd_out = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        fd_err = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd_in, 0)
        os.dup2(fd_out, 1)
        os.dup2(fd_err, 2)
        for fd in (fd_in, fd_out, fd_err):
            os.close(fd)
        memory = _vm_size() + int(req["memory"])
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        cpu = int(req["cpu"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 2))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 20, 256 << 20))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it up
        from moescope.cli import main

        try:
            rc = int(main(req["argv"]) or 0)
        except SystemExit as stop:
            code = stop.code
            rc = code if isinstance(code, int) else (0 if code is None else 1)
        except BaseException:  # what an uncaught exception would print
            traceback.print_exc()
            rc = 1
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
    finally:
        os._exit(rc & 0xFF)


def _read(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(_READ_CAP).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _serve_one(req: dict[str, Any]) -> dict[str, Any]:
    scratch = Path(req["scratch"])
    out, err = scratch / "stdout", scratch / "stderr"
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(req, str(out), str(err))
    pidfd = os.pidfd_open(pid)
    timed_out = False
    try:
        ready, _, _ = select.select([pidfd], [], [], float(req["timeout"]))
        if not ready:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
    finally:
        os.close(pidfd)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # anything the child left behind
    seconds = time.monotonic() - start
    return {
        "returncode": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "timed_out": timed_out, "seconds": seconds, "max_rss": usage.ru_maxrss * 1024,
        "stdout": _read(out), "stderr": _read(err),
    }


def serve(req_fd: int, rep_fd: int) -> None:
    """The worker's loop: import once, then one fork per request line."""
    import moescope.cli
    from moescope.cli.commands import load_commands

    moescope.cli.build_parser()
    load_commands()
    # what generate, chat and replay import when they run (loading the shared library
    # starts no thread, so forking after it is safe)
    for module in ("moescope.engine", "moescope.sim.sweep", "llama_cpp",
                   "llama_cpp.llama_chat_format"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    requests = os.fdopen(req_fd, "rb")
    replies = os.fdopen(rep_fd, "wb", buffering=0)
    replies.write(b'{"ready": true}\n')
    for line in requests:
        reply = _serve_one(json.loads(line))
        replies.write((json.dumps(reply) + "\n").encode())


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
