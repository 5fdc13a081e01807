"""``eval --text`` reads at most what the tokens asked for can take: a huge file, or
``/dev/zero``, is neither read whole into memory nor tokenized whole, and bad text is one
line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.util.errors import MoEScopeError
from moescope_testing.forkrun import ForkRunner

SynthModel = Callable[..., Path]


@pytest.mark.usefixtures("engine_required")
def test_eval_of_dev_zero_reads_a_bounded_head(synth_model: SynthModel,
                                               tmp_path: Path) -> None:
    """``--text /dev/zero`` read the device until memory ran out (a MemoryError traceback,
    or the machine's memory): now a head of it is scored, within a 1 GiB resident limit."""
    model = synth_model("qwen3moe")
    with ForkRunner(timeout=120.0, cpu_seconds=90, scratch=tmp_path) as runner:
        r = runner.run(["eval", str(model), "--text", "/dev/zero", "--tokens", "4",
                        "--policies", "exact", "--budgets", "25%", "--bootstrap", "0",
                        "--threads", "1"])
    assert r.outcome in ("ok", "error"), (r.outcome, r.stderr[-2000:])


def test_the_head_stops_before_a_character_cut_at_the_limit(tmp_path: Path) -> None:
    from moescope.cli.commands.eval import read_text_head

    text = tmp_path / "t.txt"
    text.write_text("ab" + "é" * 10, encoding="utf-8")  # é is two bytes
    assert read_text_head(text, 5) == "abé"  # byte 5 is half an é: left out
    assert read_text_head(text, 6) == "abéé"
    assert read_text_head(text, 1000) == "ab" + "é" * 10


def test_bad_text_is_one_line_naming_the_file(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from moescope.cli.commands.eval import read_text_head

    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9 au lait")
    with pytest.raises(MoEScopeError, match=r"latin1.txt: not UTF-8 text \(byte 3\)"):
        read_text_head(bad, 1000)
    with pytest.raises(MoEScopeError, match="is a folder, not a text file"):
        read_text_head(tmp_path, 1000)
    assert main(["eval", "--text", str(tmp_path), "--tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Errno" not in err, err
