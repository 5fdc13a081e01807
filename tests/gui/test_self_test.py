"""``moescope --self-test``: the packaged app's end-to-end check, run here from source so it
cannot rot between bundle builds (``make dist`` runs it inside the frozen bundle).

Real window, real worker thread, real engine and the demo model, offscreen.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from moescope import cli
from moescope.gui import self_test
from moescope.util import paths

ROOT = Path(__file__).resolve().parents[2]


def test_help_documents_the_self_test(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--self-test" in out and "--self-test-timeout" in out


def test_self_test_passes_and_prints_one_ok_line(engine_required: None,
                                                 tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", MOESCOPE_DATA_DIR=str(profile))
    env.pop("MOESCOPE_RESOURCES", None)
    done = subprocess.run([sys.executable, "-m", "moescope", "--self-test",
                           "--self-test-timeout", "60"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("moescope self-test: OK"), done.stdout
    line = lines[0]
    assert "source, Qt platform offscreen | style sheet + SVG icon" in line
    assert "moescope-demo-qwen3moe.gguf (quality-first @ 16/64 slots)" in line
    assert f"{self_test.TOKENS} tokens at" in line, "the demo model answers in full"
    assert all(f"{lang} " in line for lang in self_test.CODE_SAMPLES)
    assert "propagateSizeHints" not in done.stderr, "offscreen noise is filtered"
    assert not profile.exists(), "chats and settings went to a temporary folder"


def test_subcommand_and_self_test_do_not_mix(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--self-test", "info", "x.gguf"]) == cli.EXIT_USAGE
    assert "--self-test takes no subcommand" in capsys.readouterr().err


def test_no_model_fails_with_a_clear_line(qapp: Any, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MOESCOPE_RESOURCES", str(tmp_path / "empty"))
    assert self_test.run_self_test(timeout_s=30) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("moescope self-test: FAILED: no model")


def test_missing_resources_fail_before_the_model_loads(
        qapp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from moescope.util.resources import DEMO_MODEL_NAME, demo_model_path

    demo = demo_model_path()
    assert demo is not None
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / DEMO_MODEL_NAME).symlink_to(demo)  # a model, but no style.qss
    monkeypatch.setenv("MOESCOPE_RESOURCES", str(tmp_path))
    assert self_test.run_self_test(timeout_s=30) == 1
    assert "FAILED: resources: no style sheet (style.qss)" in capsys.readouterr().err


def test_timeout_fails_and_names_the_step(engine_required: None, qapp: Any,
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.ENV_DATA_DIR, "/nonexistent-profile")
    assert self_test.run_self_test(timeout_s=0.001) == 1
    err = capsys.readouterr().err
    # the step is whichever was under way: on a busy machine the load's queued signal may
    # be handled before the timer's event
    assert re.search(r"^moescope self-test: FAILED: timed out after 0\.001 s while "
                     r"(loading the model|generating)$", err, re.M), err
    assert os.environ[paths.ENV_DATA_DIR] == "/nonexistent-profile", "restored afterwards"


def test_missing_lexers_and_plain_code_fail_the_colour_check(
        qapp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(self_test.check_code_colours()) == {"python", "js", "bash"}
    monkeypatch.setattr(self_test, "CODE_SAMPLES", {"text": "just words, no syntax"})
    with pytest.raises(self_test.SelfTestError, match="a text code block got 0 colour"):
        self_test.check_code_colours()
    monkeypatch.setattr(self_test, "lexer_for", lambda _language: None)
    with pytest.raises(self_test.SelfTestError, match="no lexer for 'text'"):
        self_test.check_code_colours()
