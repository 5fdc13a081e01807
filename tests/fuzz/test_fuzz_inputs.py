"""Property-based fuzzing (issue 14): hostile GGUF files, traces and arguments, generated
from their schemas and by byte-level mutation (:mod:`moescope_testing.fuzzgen`), end in
success or in one ``moescope: error:`` line with a nonzero exit; never a traceback, an
abort, a hang or a runaway allocation. Each input runs in a fork of one worker under
address-space, CPU and wall limits (:mod:`moescope_testing.forkrun`).

Examples are few and derandomized (the same inputs on every run, no example database), so
this stays a bounded part of ``make test``; ``bench/fuzz_campaign.py`` (``make fuzz``)
draws tens of thousands from the same strategies.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz_helpers import explain
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moescope_testing import fuzzgen
from moescope_testing.forkrun import ACCEPTABLE, ForkRunner

pytestmark = pytest.mark.slow

FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


def _engine_ready() -> bool:
    try:
        from moescope.engine.bindings import is_patched

        return bool(is_patched())
    except Exception:
        return False


def _check(runner: ForkRunner, argv: list[str], cwd: Path) -> None:
    r = runner.run(argv, cwd=cwd)
    assert r.outcome in ACCEPTABLE, explain(r)


@settings(FUZZ, max_examples=100)
@given(data=st.data())
def test_info_survives_generated_gguf_files(fork_runner: ForkRunner,
                                            gguf_docs: list[fuzzgen.GGUFDoc],
                                            data: st.DataObject) -> None:
    _, raw = data.draw(fuzzgen.gguf_files(gguf_docs), label="gguf")
    path = fork_runner.scratch / "fuzz.gguf"
    path.write_bytes(raw)
    _check(fork_runner, ["info", path.name, "--budget", "25%"], fork_runner.scratch)


@pytest.mark.engine
@pytest.mark.skipif(not _engine_ready(), reason="the patched engine is not installed")
@settings(FUZZ, max_examples=20)
@given(data=st.data())
def test_generate_survives_generated_gguf_files(fork_runner: ForkRunner,
                                                gguf_docs: list[fuzzgen.GGUFDoc],
                                                data: st.DataObject) -> None:
    """The model-load path: llama.cpp must never see a value it aborts on."""
    base = data.draw(st.sampled_from(gguf_docs), label="base")
    doc = data.draw(fuzzgen.gguf_schema_mutation(base), label="mutation")
    path = fork_runner.scratch / "fuzz.gguf"
    path.write_bytes(fuzzgen.encode_doc(doc))
    _check(fork_runner, ["generate", path.name, "--n", "1", "--prompt", "Hi"],
           fork_runner.scratch)


@settings(FUZZ, max_examples=120)
@given(data=st.data())
def test_replay_survives_generated_traces(fork_runner: ForkRunner,
                                          trace_docs: list[fuzzgen.TraceDoc],
                                          data: st.DataObject) -> None:
    _, raw, suffix = data.draw(fuzzgen.trace_files(trace_docs, bombs=False), label="trace")
    for old in fork_runner.scratch.glob("fuzz.jsonl*"):
        old.unlink()
    path = fork_runner.scratch / f"fuzz{suffix}"
    path.write_bytes(raw)
    _check(fork_runner, ["replay", path.name], fork_runner.scratch)


@pytest.mark.parametrize("kind", fuzzgen.BOMBS)
def test_replay_of_a_gzip_bomb_ends_in_one_line(fork_runner: ForkRunner,
                                                fuzz_bases: tuple[list[Path], list[Path]],
                                                kind: str) -> None:
    """A small gzip that inflates to 64 MiB of newlines, an 80 MiB line, or half a
    million unknown records is refused early, not walked for minutes."""
    header = Path(fuzz_bases[1][0]).read_text("utf-8").splitlines()[0].encode()
    path = fork_runner.scratch / "bomb.jsonl.gz"
    path.write_bytes(fuzzgen.bomb(kind, header))
    r = fork_runner.run(["replay", path.name], cwd=fork_runner.scratch)
    assert r.outcome == "error", explain(r)


@settings(FUZZ, max_examples=20)
@given(data=st.data())
def test_commands_survive_generated_arguments(fork_runner: ForkRunner,
                                              fuzz_bases: tuple[list[Path], list[Path]],
                                              data: st.DataObject) -> None:
    models, traces = fuzz_bases
    argv = data.draw(fuzzgen.cli_args(str(models[0]), str(traces[0]), engine=_engine_ready()),
                     label="argv")
    _check(fork_runner, argv, fork_runner.scratch)


def test_the_runner_tells_every_failure_apart(fork_runner: ForkRunner, tmp_path: Path) -> None:
    """The classifier itself: a traceback, an abort, a hang and a runaway allocation are
    each seen as such (else a green fuzz run would prove nothing)."""
    from moescope_testing.forkrun import RunResult, classify

    def result(rc: int | None = 1, sig: int | None = None, err: str = "",
               timed_out: bool = False, rss: int = 0) -> RunResult:
        return RunResult((), rc, sig, timed_out, 0.0, rss, "", err)

    assert classify(result(0)) == "ok"
    assert classify(result(2, err="moescope: note: x\nmoescope: error: bad\n")) == "error"
    assert classify(result(2, err="moescope: error: a\nmoescope: error: b\n")) == "bad-error"
    assert classify(result(1, err="\nlibgomp: Thread creation failed\n")) == "bad-error"
    assert classify(result(2, err="moescope: error: please report a MoEScope bug")) \
        == "bad-error"
    assert classify(result(2, err="moescope info: error: unrecognized arguments: -x (see: "
                                  "moescope info --help)\n")) == "error"
    # argparse's usage block before it was more than one line
    assert classify(result(2, err="usage: moescope info [-h]\n    [--json]\n"
                                  "moescope info: error: unrecognized arguments: -x\n")) \
        == "bad-error"
    assert classify(result(1, err="Traceback (most recent call last):\n  x\nKeyError")) \
        == "traceback"
    assert classify(result(None, sig=6)) == "abort"
    assert classify(result(1, err="moescope: fatal: llama.cpp stopped")) == "abort"
    assert classify(result(None, sig=9, timed_out=True)) == "hang"
    assert classify(result(1, err="MemoryError")) == "memory"
    assert classify(result(0, rss=2 << 30)) == "memory"
    # and the worker really reports them: a missing file is one line, a bad option too
    r = fork_runner.run(["info", str(tmp_path / "missing.gguf")])
    assert r.outcome == "error" and "no such file" in r.stderr, explain(r)
    # a real trace whose replay takes far longer than the wall limit (a missing file fails
    # too fast to be killed: how fast depends on what the command checks first)
    from moescope_testing.traces import synthetic_trace

    trace = synthetic_trace(tmp_path / "x.arrows", n_tokens=40, slots=26)
    r = fork_runner.run(["replay", str(trace)], timeout=0.001)
    assert r.outcome == "hang" and r.timed_out, explain(r)  # the wall limit kills it
    r = fork_runner.run(["info", "--no-such-option"])
    assert r.outcome == "error" and r.stderr.startswith("moescope info: error:"), explain(r)
