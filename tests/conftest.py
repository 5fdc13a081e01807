"""Shared fixtures: real (tiny) GGUF files, written once per test session."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from moescope.trace import TraceRecorder
from moescope_testing import ensure_synth_model, preset, write_broken_file


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for every synthetic model of the session."""
    return tmp_path_factory.mktemp("synth-models")


@pytest.fixture(scope="session")
def synth_model(synth_dir: Path) -> Callable[..., Path]:
    """Factory: ``synth_model("olmoe", expert_type="q8_0")`` -> path of a cached model.

    Same arguments, same file: each distinct spec is written once per session.
    """

    def make(arch: str = "qwen3moe", preset_name: str = "tiny", **overrides: Any) -> Path:
        return ensure_synth_model(synth_dir, preset(preset_name, arch, **overrides))

    return make


@pytest.fixture(scope="session")
def tiny_moe(synth_model: Callable[..., Path]) -> Path:
    """The default tiny qwen3moe model with q8_0 experts."""
    return synth_model("qwen3moe", expert_type="q8_0")


@pytest.fixture(scope="session")
def dense_model(synth_model: Callable[..., Path]) -> Path:
    """A tiny dense qwen3 model (no experts)."""
    return synth_model("qwen3")


@pytest.fixture(scope="session")
def broken_file(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory: ``broken_file("truncated_data")`` -> path (kinds: moescope_testing.BROKEN_KINDS)."""
    directory = tmp_path_factory.mktemp("broken-models")
    cache: dict[str, Path] = {}

    def make(kind: str) -> Path:
        if kind not in cache:
            cache[kind] = write_broken_file(directory / f"{kind}.gguf", kind)
        return cache[kind]

    return make


# --- sessions recorded from the real engine (trace, simulator and GUI tests) ---

PROMPT = "The quick brown fox jumps over the lazy dog, again and again and again."
"""Longer than 8 tokens, so prefill keeps llama.cpp's path (only its last layer is routed)."""


def _engine_available() -> str | None:
    try:
        from moescope.engine.bindings import is_patched

        return None if is_patched() else "the patched engine is not installed (make engine)"
    except Exception as err:  # an engine built before llama_moe_cache_last_route
        return f"the installed engine is unusable for traces: {err}"


@pytest.fixture(scope="session")
def engine_required() -> None:
    reason = _engine_available()
    if reason is not None:
        pytest.skip(reason)


RecordFn = Callable[..., Path]
SEEDS = (3, 7)
"""Sampling seeds that run 40 tokens without an end-of-text on every synthetic model."""


@pytest.fixture(scope="session")
def record(engine_required: None, synth_model: Callable[..., Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordFn]:
    """``record(arch, name=..., policy=..., budget=..., tokens=..., switch_at=...)`` -> the
    path of a trace of one answer (two if ``answers=2``), recorded from the engine. Each
    distinct request is recorded once per session (prefill dominates the cost).

    ``switch_at`` asks for ``switch_policy`` and ``switch_budget`` after that many tokens,
    through the engine's thread-safe requests, as the GUI does while an answer streams.
    """
    from moescope.engine import Engine, Sampling

    engines: list[Any] = []
    made: dict[tuple[Any, ...], Path] = {}
    tmp_path = tmp_path_factory.mktemp("traces")

    def make(arch: str = "qwen3moe", *, name: str = "trace.jsonl", policy: str =
             "quality-first", budget: str = "25%", tokens: int = 24, answers: int = 1,
             switch_at: int | None = None, switch_policy: str = "speed-first",
             switch_budget: str = "50%", router_inputs: str | None = "f32",
             prompt: str = PROMPT) -> Path:
        key = (arch, name, policy, budget, tokens, answers, switch_at, switch_policy,
               switch_budget, router_inputs, prompt)
        if key in made:
            return made[key]
        engine = Engine()
        engines.append(engine)
        engine.load(synth_model(arch), budget=budget, policy=policy, n_ctx=256, n_threads=1)
        path = tmp_path / f"{len(made)}-{name}"
        recorder = TraceRecorder.for_engine(path, engine, router_inputs=router_inputs)
        for answer in range(answers):
            sampling = Sampling(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0,
                                repeat_penalty=1.0, max_tokens=tokens, seed=SEEDS[answer])
            for stats in engine.generate(prompt, sampling):
                recorder.record(stats, engine)
                if switch_at is not None and stats.index + 1 == switch_at and answer == 0:
                    engine.request_policy(switch_policy)
                    engine.request_budget(switch_budget)
            recorder.end_answer(engine)  # the step that chose EOS, if the answer ended so
            prompt += " And then the dog woke up and ran off into the woods, barking."
        recorder.close(stop_reason=engine.last_answer.stop_reason)
        engine.close()
        made[key] = path
        return path

    yield make
    for engine in engines:
        engine.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """How many engine tests ran on which backend (`make test` runs them on the CPU build and
    on the Vulkan build over lavapipe); appended to $MOESCOPE_TEST_SUMMARY when set."""
    import os

    from moescope.engine.backend import engine_build

    outcomes: dict[str, set[str]] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            if nodeid.startswith("tests/engine/"):
                outcomes.setdefault(outcome, set()).add(nodeid)
    if not outcomes:
        return
    backend = engine_build().backend or "unknown"
    device = os.environ.get("GGML_VK_VISIBLE_DEVICES")
    where = f"{backend} build" + (f" (Vulkan device {device})" if device and
                                  backend == "vulkan" else "")
    counts = ", ".join(f"{len(ids)} {name}" for name, ids in outcomes.items())
    line = f"engine tests on the {where}: {counts}"
    terminalreporter.write_line(line)
    path = os.environ.get("MOESCOPE_TEST_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
