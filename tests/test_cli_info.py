"""``moescope info`` prints what a user needs to size the expert cache, and any bad input
gets exactly one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.cli.commands import command_names
from moescope_testing.cgroups import memory_cgroup, memory_hierarchy


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_info_prints_layout_bytes_and_hash(tiny_moe: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["info", str(tiny_moe)], capsys)
    assert code == 0 and err == ""
    assert "qwen3moe" in out
    assert "2 (MoE: 0-1)" in out
    assert "16 per layer, top-4" in out
    assert "6.38 KiB per layer" in out  # 3 x 64 x 32 q8_0 weights
    assert "gate 2.12 KiB q8_0" in out and "down 2.12 KiB q8_0" in out
    assert "204.0 KiB" in out  # 2 layers x 16 experts x 6528 B
    assert "non-expert" in out and "sha256:" in out
    assert "thinking" not in out  # ChatML without a switch


def test_info_names_the_thinking_switch_and_the_parts_of_a_split_model(
        synth_model: Callable[..., Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from moescope_testing import preset, write_synth_model
    from moescope_testing.vocab import HYBRID_THINKING_CHAT_TEMPLATE

    code, out, _ = _run(["info", str(synth_model(
        "qwen3moe", chat_template=HYBRID_THINKING_CHAT_TEMPLATE))], capsys)
    assert code == 0
    assert "chat template switch: off/on/low/medium/high" in out
    first = write_synth_model(tmp_path / "m.gguf", preset("tiny", "qwen3moe"), parts=2)
    code, out, _ = _run(["info", str(first.with_name("m-00002-of-00002.gguf"))], capsys)
    assert code == 0 and "m-00001-of-00002.gguf" in out and "in 2 files)" in out


def test_info_with_a_percentage_budget_prints_slots_and_residency(
    tiny_moe: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = _run(["info", str(tiny_moe), "--budget", "25%"], capsys)
    assert code == 0
    assert "4 slots per layer of 16 (25.0% resident)" in out


def test_info_with_a_byte_budget_that_is_too_small_explains_the_clamp(
    tiny_moe: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = _run(["info", str(tiny_moe), "--budget", "1KiB"], capsys)
    assert code == 0
    assert "4 slots per layer" in out and "top-k" in out


def test_info_shows_dense_leading_layers(synth_model: Callable[..., Path],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["info", str(synth_model("deepseek2"))], capsys)
    assert code == 0 and "3 (MoE: 1-2; dense: 0)" in out


def test_info_json_is_machine_readable(tiny_moe: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["info", str(tiny_moe), "--json", "--budget", "50%"], capsys)
    data = json.loads(out)
    assert code == 0
    assert data["n_expert"] == 16 and data["top_k"] == 4
    assert data["budget"]["slots_per_layer"] == 8


def _assert_one_line_error(code: int, out: str, err: str) -> None:
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("moescope: error: ")
    assert "Traceback" not in err


@pytest.mark.parametrize("kind", ["random", "truncated_data", "truncated_header", "empty",
                                  "bad_magic", "bad_version"])
def test_broken_files_exit_2_with_one_line(broken_file: Callable[[str], Path], kind: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(*_run(["info", str(broken_file(kind))], capsys))


def test_missing_file_exits_2_with_one_line(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["info", str(tmp_path / "missing.gguf")], capsys)
    _assert_one_line_error(code, out, err)
    assert "no such file" in err


def test_dense_model_exits_2_with_one_line(dense_model: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["info", str(dense_model)], capsys)
    _assert_one_line_error(code, out, err)
    assert "no routed experts" in err


def test_bad_budget_exits_2_with_one_line(tiny_moe: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(*_run(["info", str(tiny_moe), "--budget", "lots"], capsys))


def test_usage_errors_return_2_instead_of_raising(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["info"], capsys)
    # one line, as every other error (argparse printed its usage block first), saying
    # where the usage is
    assert code == 2 and err == ("moescope info: error: the following arguments are "
                                 "required: MODEL.gguf (see: moescope info --help)\n")
    # an unknown option: named by the subcommand it was given to, whose help lists options
    code, _, err = _run(["generate", "--bogus"], capsys)
    assert code == 2 and err == ("moescope generate: error: unrecognized arguments: --bogus "
                                 "(see: moescope generate --help)\n")
    code, _, err = _run(["trace", "compact", "x.arrows", "-z"], capsys)
    assert code == 2 and err.endswith("(see: moescope trace compact --help)\n")


def test_help_lists_the_info_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--help"], capsys)
    assert code == 0 and "info" in out
    assert command_names()[0] == "info"


def test_no_subcommand_without_a_gui_says_so_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # a display to open on
    monkeypatch.setitem(sys.modules, "moescope.gui.app", None)  # makes the import fail
    _assert_one_line_error(*_run([], capsys))


def test_no_subcommand_launches_the_gui(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # a display to open on
    fake = types.ModuleType("moescope.gui.app")
    calls: list[bool] = []
    fake.run_app = lambda: calls.append(True) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "moescope.gui.app", fake)
    assert main([]) == 0 and calls == [True]


def test_a_model_alone_opens_it_in_the_window(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str],
                                              tiny_moe: Path, tmp_path: Path) -> None:
    """``moescope MODEL.gguf``, as llama.cpp's and LM Studio's users type it, was refused
    as an invalid subcommand though the window takes a model from its arguments."""
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # a display to open on
    fake = types.ModuleType("moescope.gui.app")
    models: list[str | None] = []
    fake.run_app = lambda model=None: models.append(model) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "moescope.gui.app", fake)
    assert main([str(tiny_moe)]) == 0
    assert models == [str(tiny_moe)]
    assert main(["info", str(tmp_path / "missing.gguf")]) == 2  # a subcommand stays one
    capsys.readouterr()
    # a missing file is named in one line (the window would open its last model instead)
    assert main([str(tmp_path / "missing.gguf")]) == 2
    assert models == [str(tiny_moe)]
    err = capsys.readouterr().err
    assert err == f"moescope: error: {tmp_path / 'missing.gguf'}: no such model file\n"
    (tmp_path / "folder.gguf").mkdir()  # a directory is named as one, not as missing
    assert main([str(tmp_path / "folder.gguf")]) == 2
    err = capsys.readouterr().err
    assert err == f"moescope: error: {tmp_path / 'folder.gguf'}: is a directory, not a GGUF " \
                  "model file\n"
    assert models == [str(tiny_moe)]


def test_python_dash_m_cli_runs_info_in_a_fresh_process(tiny_moe: Path,
                                                         broken_file: Callable[[str], Path],
                                                         ) -> None:
    ok = subprocess.run([sys.executable, "-m", "moescope.cli", "info", str(tiny_moe),
                         "--budget", "25%"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "4 slots per layer" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "moescope", "info",
                          str(broken_file("truncated_data"))],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stdout == "" and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_info_says_what_loading_would_keep_in_ram_here(
        tiny_moe: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["info", str(tiny_moe)], capsys)
    line = next(x for x in out.splitlines() if x.startswith("memory"))
    assert code == 0 and "512-token context" in line  # the model's own, below 4096
    assert line.endswith(": every expert in RAM by default")  # a tiny model fits anywhere
    code, out, _ = _run(["info", str(tiny_moe), "--json"], capsys)
    memory = json.loads(out)["memory"]
    assert memory["ram_experts_per_layer"] == 16
    assert 0 < memory["needs_bytes"] < memory["available_bytes"]


@pytest.mark.skipif(memory_hierarchy() is None,
                    reason="needs root and a writable memory cgroup hierarchy")
def test_info_in_a_small_cgroup_names_its_limit_and_the_default_ram_tier(
        synth_model: Callable[..., Path]) -> None:
    model = synth_model("qwen3moe", "copy-bound", n_layers=1, n_expert=64)  # ~110 MB
    with memory_cgroup(300 << 20) as group:
        procs = group / "cgroup.procs"
        run = subprocess.run(
            [sys.executable, "-m", "moescope", "info", str(model)],
            preexec_fn=lambda: procs.write_text(str(os.getpid())),
            capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    line = next(x for x in run.stdout.splitlines() if x.startswith("memory"))
    assert f"(memory cgroup /{group.name}: limit 300.0 MiB)" in line
    assert "experts per layer stay in RAM, the others are read from the file" in line
