"""Names shared by the hub tests: the stand-in Hub's repositories, its fixture type, and a
real `moescope pull` in another process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import moescope
from moescope.util import paths
from moescope_testing.hub_server import HubServer, Pause, file_key

REPO = "test-org/Tiny-MoE-GGUF"
SPLIT_REPO = "test-org/Split-MoE-GGUF"
BIG_REPO = "test-org/Big-MoE-GGUF"
GATED_REPO = "test-org/Gated-MoE-GGUF"
GATED_TOKEN = "hf_test_token_allowed"


@dataclass
class Hub:
    server: HubServer
    tiny: Path
    """The local copy of the Q8_0 file, to compare downloads and headers with."""
    split_first: Path
    big: Path


CHILD_TIMEOUT_S = 60
"""How long a child `moescope pull` may take to start, get going or finish (never timed)."""


def wait_for(condition: Callable[[], bool], what: str,
             timeout: float = CHILD_TIMEOUT_S) -> None:
    """Poll until ``condition()`` (a stuck child fails the test instead of hanging it)."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def pull_process(*args: str) -> subprocess.Popen[str]:
    """A real ``moescope pull ARGS`` in a process of its own, in the ``hub`` fixture's
    environment (endpoint, models folder), with this checkout's code."""
    app = str(Path(moescope.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (app, os.environ.get("PYTHONPATH")) if p))
    return subprocess.Popen([sys.executable, "-m", "moescope", "pull", *args], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@dataclass
class HeldPull:
    process: subprocess.Popen[str]
    pause: Pause
    """Set ``pause.go`` to let the download go on."""
    partial: Path
    final: Path


@contextmanager
def held_pull(hub: Hub, held_at: int = 100_000) -> Iterator[HeldPull]:
    """``moescope pull REPO:Q8_0`` in another process, downloading: the stand-in Hub holds
    its response once ``held_at`` bytes are written to the ``.incomplete`` file. Let go and
    ended (killed if still running) on the way out."""
    pause = hub.server.pause(file_key(REPO, "Tiny-MoE-Q8_0.gguf"), range=None, at=held_at)
    final = Path(os.environ[paths.ENV_MODELS_DIR]) / REPO / "Tiny-MoE-Q8_0.gguf"
    held = HeldPull(pull_process(f"{REPO}:Q8_0"), pause,
                    final.with_name(final.name + ".incomplete"), final)
    try:
        wait_for(lambda: held.process.poll() is not None or (
            pause.reached.is_set() and held.partial.is_file()
            and held.partial.stat().st_size == held_at), "the first pull to get going")
        assert held.process.poll() is None, held.process.communicate()
        yield held
    finally:
        pause.go.set()
        if held.process.poll() is None:
            held.process.kill()
        held.process.communicate()
