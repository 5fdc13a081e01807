"""`moescope chat`: a scripted conversation through the real engine on a tiny model.

Stdin is a pipe here, so chat reads one message per line. A spy around ``Engine.generate``
records what the engine was asked each turn (messages, policy, slots) without changing it.
"""

from __future__ import annotations

import io
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from moescope.cli import main
from moescope.engine import Engine
from moescope.trace import RECORD_SUFFIX

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("engine_required")]

FAST = ["--n", "6", "--threads", "1", "--seed", "3"]


@dataclass
class Turn:
    """One call of ``Engine.generate`` as chat made it."""

    messages: list[dict[str, str]]
    prompt: str
    policy: str
    slots: int
    text: str = ""
    n_tokens: int = 0
    stop_reason: str = ""
    answer_start: str = ""


@dataclass
class Spy:
    turns: list[Turn] = field(default_factory=list)
    loads: int = 0


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    """Records every answer the engine generated and every model load."""
    seen = Spy()
    generate, load = Engine.generate, Engine.load

    def spy_generate(self: Engine, prompt: Any, sampling: Any = None,
                     **kw: Any) -> Iterator[Any]:
        messages = [{"role": m.role, "content": m.content} for m in prompt]
        turn = Turn(messages, self.format_chat(prompt), self.policy_name, self.slots_per_layer,
                    answer_start=kw.get("answer_start", ""))
        seen.turns.append(turn)
        for tok in generate(self, prompt, sampling, **kw):
            turn.text += tok.text
            yield tok
        turn.n_tokens = self.last_answer.n_tokens
        turn.stop_reason = self.last_answer.stop_reason

    def spy_load(self: Engine, *args: Any, **kwargs: Any) -> Any:
        seen.loads += 1
        return load(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", spy_generate)
    monkeypatch.setattr(Engine, "load", spy_load)
    return seen


def interrupt_first_answer(monkeypatch: pytest.MonkeyPatch, spy: Spy, after_index: int) -> None:
    """Ctrl+C (a real SIGINT) right after token ``after_index`` of the first answer, through
    the spied ``Engine.generate`` (which keeps recording the turns)."""
    spied = Engine.generate

    def interrupted(self: Engine, prompt: Any, sampling: Any = None,
                    **kw: Any) -> Iterator[Any]:
        for tok in spied(self, prompt, sampling, **kw):
            yield tok
            if len(spy.turns) == 1 and tok.index == after_index:
                signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(Engine, "generate", interrupted)


def chat(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
         model: Path, script: str, *extra: str) -> tuple[int, str, str]:
    """Run ``moescope chat MODEL`` with ``script`` on stdin; (exit code, stdout, stderr)."""
    monkeypatch.setattr("sys.stdin", io.StringIO(script))
    code = main(["chat", str(model), *FAST, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def summaries(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("[") and "tok/s" in line]


def test_second_turn_sees_the_whole_conversation(
        synth_model: Callable[..., Path], spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = chat(monkeypatch, capsys, synth_model("qwen3moe"),
                        "How are you?\nAnd the weather?\n", "--system", "Be brief.")
    assert code == 0
    assert len(spy.turns) == 2
    first, second = spy.turns
    assert first.text, "the first answer is empty; pick another --seed"
    assert first.messages == [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "How are you?"}]
    assert second.messages == [*first.messages,
                               {"role": "assistant", "content": first.text},
                               {"role": "user", "content": "And the weather?"}]
    # the template really got two user turns and the first answer between them
    assert second.prompt.count("<|im_start|>user") == 2
    assert second.prompt.index("How are you?") < second.prompt.index(first.text) \
        < second.prompt.index("And the weather?")
    assert first.text in out and second.text in out
    lines = summaries(out)
    assert len(lines) == 2
    for part in ("tok/s", "hit", "substituted", "mass/tok", "quality-first @ 4/16 slots"):
        assert part in lines[0]


def test_policy_and_budget_apply_live_between_turns(
        synth_model: Callable[..., Path], spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    script = "Hello\n/policy speed-first\n/budget 50%\nHello again\n/stats\n"
    code, out, err = chat(monkeypatch, capsys, synth_model("qwen3moe"), script,
                          "--policy", "exact", "--budget", "25%")
    assert code == 0, err
    assert [(t.policy, t.slots) for t in spy.turns] == [("exact", 4), ("speed-first", 8)]
    assert spy.loads == 1  # one model load: the change was live
    assert len(spy.turns[1].messages) == 3  # ... and the conversation was kept
    assert "policy speed-first · 4/16 slots per layer" in out
    assert "budget 50% · 8/16 slots per layer (50.0% resident)" in out
    assert "speed-first @ 8/16 slots" in summaries(out)[1]
    stats = [line for line in out.splitlines() if " answer" in line and "tok/s" in line]
    assert stats[0].startswith("[session]") and "2 answers" in stats[0]
    assert any(line.strip().startswith("[exact]") for line in stats)
    assert any(line.strip().startswith("[speed-first]") for line in stats)


def test_bad_policy_or_budget_is_a_hint_and_changes_nothing(
        synth_model: Callable[..., Path], spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    script = "/policy fastest\n/budget lots\nHi\n"
    code, _, err = chat(monkeypatch, capsys, synth_model("qwen3moe"), script)
    assert code == 0
    assert "unknown policy 'fastest'" in err and "cannot read budget 'lots'" in err
    assert [(t.policy, t.slots) for t in spy.turns] == [("quality-first", 4)]


def test_reset_starts_a_new_conversation(
        synth_model: Callable[..., Path], spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    script = "First\n/reset\nSecond\n/system Talk like a pirate.\nThird\n"
    code, out, _ = chat(monkeypatch, capsys, synth_model("qwen3moe"), script)
    assert code == 0
    assert "new conversation" in out
    assert spy.turns[1].messages == [{"role": "user", "content": "Second"}]
    assert spy.turns[2].messages[0] == {"role": "system", "content": "Talk like a pirate."}
    assert spy.turns[2].messages[-1] == {"role": "user", "content": "Third"}
    assert [m["content"] for m in spy.turns[2].messages if m["role"] == "user"] == \
        ["Second", "Third"]


def test_compare_answers_the_last_message_under_each_policy_and_scores_the_chat(
        synth_model: Callable[..., Path], spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    script = ("/compare\nHello\n/compare speed-first, substitute-all score\n/policy\n"
              "Again\n")
    code, out, err = chat(monkeypatch, capsys, synth_model("qwen3moe"), script)
    assert code == 0
    assert "send a message first" in err  # nothing to compare before a message
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("policy "))
    table = lines[header:header + 4]
    assert table[0].split()[-2:] == ["chat", "perplexity"]
    assert [row.split()[0] for row in table[1:]] == ["exact", "speed-first", "substitute-all"]
    assert table[1].split()[-1] == "reference"
    assert "%" in table[3].split()[-3] and table[3].split()[-1].endswith("]")
    assert "the chat scored over" in out
    # the comparison answered "Hello" again, under Exact first; the chat goes on after it
    compare_turns = spy.turns[1:4]
    assert [t.messages[-1]["content"] for t in compare_turns] == ["Hello"] * 3
    assert spy.turns[-1].messages[-1]["content"] == "Again"
    assert [m["content"] for m in spy.turns[-1].messages if m["role"] == "user"] == \
        ["Hello", "Again"]
    assert "policy quality-first" in out  # the user's policy is back


def test_compare_is_refused_while_recording(
        synth_model: Callable[..., Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = chat(monkeypatch, capsys, synth_model("qwen3moe"), "Hello\n/compare\n",
                        "--trace", str(tmp_path / "t.jsonl"))
    assert code == 0 and "not while recording" in err


def test_a_full_disk_stops_recording_and_the_chat_goes_on(
        synth_model: Callable[..., Path], tmp_path: Path, spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The trace's disk fills up during the first answer (ENOSPC from the writer thread):
    recording stops with a message, the trace so far reads back, and the chat goes on; the
    command still exits with status 1, so a script does not take the trace for whole."""
    import errno

    from moescope import trace as trace_module

    real_init = trace_module.TraceWriter.__init__

    def small_disk(self: Any, *args: Any, **kw: Any) -> None:
        real_init(self, *args, **kw)
        raw, room = self._raw, [6000]

        def write(data: bytes) -> int:
            if len(data) > room[0]:
                raw_write(data[:room[0]])
                room[0] = 0
                raise OSError(errno.ENOSPC, "No space left on device")
            room[0] -= len(data)
            return int(raw_write(data))

        raw_write = raw.write
        self._raw = type("Full", (), {"write": staticmethod(write),
                                      "flush": raw.flush, "close": raw.close,
                                      "closed": property(lambda _s: raw.closed),
                                      "fileno": raw.fileno})()

    monkeypatch.setattr(trace_module.TraceWriter, "__init__", small_disk)
    path = tmp_path / "full.jsonl"
    code, out, err = chat(monkeypatch, capsys, synth_model("qwen3moe"), "Hello\nAgain\n",
                          "--trace", str(path))
    assert code == 1
    assert err.count("recording stopped") == 1 and "No space left on device" in err
    assert [t.messages[-1]["content"] for t in spy.turns] == ["Hello", "Again"]
    assert len(summaries(out)) == 2
    from moescope.trace import read_trace

    trace = read_trace(path)
    assert trace.truncated and 0 < len(trace.tokens) < 12


def test_unknown_command_gets_a_one_line_hint_and_quit_stops_reading(
        synth_model: Callable[..., Path], spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    script = "/frobnicate now\n//not a command\n/quit\nnever sent\n"
    code, _, err = chat(monkeypatch, capsys, synth_model("qwen3moe"), script)
    assert code == 0
    hints = [line for line in err.splitlines() if "frobnicate" in line]
    assert len(hints) == 1 and "/help" in hints[0]
    assert [t.messages[-1]["content"] for t in spy.turns] == ["/not a command"]


def test_ctrl_c_stops_the_answer_and_keeps_it(
        synth_model: Callable[..., Path], spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGINT after the fifth token stops that answer only; the chat goes on, and leaves
    SIGINT's handler as it found it (Python's default, or ignored where the tests were
    started in the background, as by nohup)."""
    before = signal.getsignal(signal.SIGINT)
    interrupt_first_answer(monkeypatch, spy, after_index=4)
    code, out, _ = chat(monkeypatch, capsys, synth_model("qwen3moe"),
                        "Tell me a story\nGo on\n", "--n", "40")
    assert code == 0
    first, second = spy.turns
    assert first.stop_reason == "stopped"
    assert first.n_tokens == 5 and "stop: stopped" in summaries(out)[0]
    assert first.text, "nothing printable in 5 tokens; pick another --seed"
    assert second.messages[1] == {"role": "assistant", "content": first.text}
    assert second.stop_reason != "stopped"
    assert signal.getsignal(signal.SIGINT) is before


def test_a_conversation_too_long_for_the_context_is_refused_and_the_chat_goes_on(
        synth_model: Callable[..., Path], spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    long = " ".join(["word"] * 200)
    code, _, err = chat(monkeypatch, capsys, synth_model("qwen3moe"),
                        f"{long}\n/reset\nShort\n", "--ctx", "64")
    assert code == 1  # the script goes on, and its exit status says a message failed
    assert "does not fit the context" in err and "/reset" in err
    assert spy.turns[-1].messages == [{"role": "user", "content": "Short"}]


def test_a_scripted_chat_whose_message_got_no_answer_exits_nonzero(
        synth_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``echo hi | moescope chat --ctx 2`` printed its error and exited 0."""
    code, out, err = chat(monkeypatch, capsys, synth_model("qwen3moe"),
                          " ".join(["word"] * 40) + "\n", "--ctx", "16")
    assert code == 1 and "does not fit the context of 16 tokens" in err
    assert not summaries(out)
    code, out, err = chat(monkeypatch, capsys, synth_model("qwen3moe"), "/policy nope\nHi\n")
    assert code == 0 and "unknown policy" in err  # a command's mistake is said, not failed


@pytest.mark.parametrize("bad", ["missing", "random", "truncated_data"])
def test_bad_model_file_fails_like_generate(
        bad: str, broken_file: Callable[[str], Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nope.gguf" if bad == "missing" else broken_file(bad)
    code, _, err = chat(monkeypatch, capsys, path, "Hi\n")
    generate_code = main(["generate", str(path), "--n", "2"])
    generate_err = capsys.readouterr().err
    assert code == generate_code == 2
    assert err == generate_err and len(err.strip().splitlines()) == 1


def test_dense_model_chats_with_the_cache_off_like_generate(
        dense_model: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = chat(monkeypatch, capsys, dense_model, "Hi\n/budget 50%\n")
    assert code == 0
    assert "loaded with the expert cache off" in err
    assert "cache off" in summaries(out)[0]
    assert "the expert cache is off" in err.splitlines()[-1]


@pytest.mark.parametrize("suffix", sorted({".jsonl", RECORD_SUFFIX}))
def test_trace_of_a_chat_with_live_changes_replays_exactly(
        synth_model: Callable[..., Path], tmp_path: Path, suffix: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from moescope.sim import decision_mismatches, replay
    from moescope.trace import read_trace

    path = tmp_path / f"chat{suffix}"
    script = "Hello\n/policy speed-first\n/budget 50%\nHello again\n"
    code, _, _ = chat(monkeypatch, capsys, synth_model("qwen3moe"), script,
                      "--trace", str(path))
    assert code == 0
    assert list(tmp_path.iterdir()) == [path]  # finished before the command returned
    trace = read_trace(path)
    assert {t.answer for t in trace.tokens} == {0, 1}
    changes = [c.kind for t in trace.tokens for c in t.changes]
    assert "policy" in changes and "slots" in changes
    result = replay(trace, None, None, keep_events=True)
    assert result.events is not None
    assert decision_mismatches(trace.events(), result.events) == []


def test_a_thinking_models_thoughts_stay_out_of_scripts_and_the_next_turn(
        synth_model: Callable[..., Path], spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from moescope_testing.vocab import THINKING_CHAT_TEMPLATE

    model = synth_model("qwen3moe", chat_template=THINKING_CHAT_TEMPLATE)
    code, out, _ = chat(monkeypatch, capsys, model, "Hi\nAgain\n")
    assert code == 0 and len(spy.turns) == 2
    first, second = spy.turns
    assert first.prompt.endswith("<think>\n") and first.text.strip()
    # the tiny model never closes <think>: all thoughts, so no answer goes back
    assert second.messages == [{"role": "user", "content": "Hi"},
                               {"role": "user", "content": "Again"}]
    # a script gets answers only (the summary lines aside: a thought of one letter, cut
    # short where the model writes <|im_start|>, is in them)
    shown = "\n".join(line for line in out.splitlines() if line not in summaries(out))
    assert first.text.strip() not in shown


def test_the_terminal_prints_thoughts_dim_then_the_answer() -> None:
    from moescope.cli.terminal import AnswerPrinter

    raw = "<|channel|>analysis<|message|>Two and two.<|start|>assistant<|channel|>final" \
          "<|message|>It is 4."
    out = io.StringIO()
    printer = AnswerPrinter(out, show_thoughts=True)
    for i in range(0, len(raw), 2):
        printer.feed(raw[i:i + 2])
    assert printer.finish() == "It is 4."
    text = out.getvalue()
    assert "<|" not in text
    assert text.replace("\x1b[0m\x1b[2m", "") == \
        "\x1b[2mthinking: Two and two.\x1b[0m\n\nIt is 4."


def test_a_long_conversation_keeps_going_without_its_earliest_turns(
        synth_model: Callable[..., Path], spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    lines = "".join(f"Question {i}: " + "tell me more " * 6 + "\n" for i in range(6))
    code, out, err = chat(monkeypatch, capsys, synth_model("qwen3moe"), lines,
                          "--ctx", "160", "--n", "8")
    assert code == 0 and "does not fit" not in err
    assert len(spy.turns) == 6 and all(t.n_tokens for t in spy.turns)
    assert "earliest messages were left out" in out


def test_thinking_switch_in_the_cli(
        synth_model: Callable[..., Path], spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from moescope_testing.vocab import HYBRID_THINKING_CHAT_TEMPLATE

    prompts: list[str] = []
    format_chat = Engine.format_chat
    monkeypatch.setattr(Engine, "format_chat", lambda self, m, thinking="default": (
        prompts.append(format_chat(self, m, thinking)) or prompts[-1]))
    hybrid = synth_model("qwen3moe", chat_template=HYBRID_THINKING_CHAT_TEMPLATE)
    code, _, err = chat(monkeypatch, capsys, hybrid, "Hi\n", "--thinking", "off")
    assert code == 0 and "thinking setting" not in err
    assert prompts[-1].endswith("<think>\n\n</think>\n\n")
    code, _, err = chat(monkeypatch, capsys, synth_model("qwen3moe"), "Hi\n",
                        "--thinking", "high")
    assert code == 0 and "has no 'high' thinking setting; it is ignored" in err
    assert "Reasoning:" not in prompts[-1]


def test_ctrl_c_while_thinking_means_answer_now(
        synth_model: Callable[..., Path], spy: Spy, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A thinking model (its template opens <think>; the tiny model never closes it):
    SIGINT after four thoughts closes them and the same answer goes on; the next turn
    gets that answer without the thoughts."""
    from moescope.trace import ANSWER_NOW_NOTE, read_trace
    from moescope_testing.vocab import THINKING_CHAT_TEMPLATE

    interrupt_first_answer(monkeypatch, spy, after_index=3)
    model = synth_model("qwen3moe", chat_template=THINKING_CHAT_TEMPLATE)
    trace = tmp_path / "chat.jsonl"
    # seed 1: the first answer thinks past four tokens (with seed 3 the tiny model writes
    # <|im_start|> after one, which now ends the answer)
    code, out, _ = chat(monkeypatch, capsys, model, "Hi\nAgain\n", "--n", "12",
                        "--seed", "1", "--trace", str(trace))
    assert code == 0
    thinking, answering, second = spy.turns
    # the trace notes where the continued answer began (its closing text is not a token)
    noted = [(t.answer, t.position) for t in read_trace(trace).tokens
             if any(c.text == ANSWER_NOW_NOTE for c in t.changes)]
    assert noted == [(1, 0)]
    assert thinking.stop_reason == "stopped" and thinking.n_tokens == 4
    assert answering.answer_start == thinking.text + "\n</think>\n\n" \
        or answering.answer_start == thinking.text + "</think>\n\n"
    assert answering.n_tokens > 0 and answering.stop_reason != "stopped"
    assert "answer now" in out
    answer = answering.text.lstrip()
    assert second.messages[1] == {"role": "assistant", "content": answer}
    assert "</think>" not in out and thinking.text.strip() not in out


def test_policy_guard_in_chat(synth_model: Callable[..., Path],
                              monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    """``/policy guard:target=2%``: the guard takes over (audits on), the summary line
    gives its estimate, and ``/policy`` names its setting."""
    code, out, err = chat(monkeypatch, capsys, synth_model("qwen3moe"),
                          "/policy guard:target=2%:every=2\nHello\n/policy\n"
                          "/policy guard:target=90%\n")
    assert code == 0
    assert "policy guard" in out and "quality cost +" in out
    assert "expected on the model's own text" in out
    assert "policy guard 2% (bonus " in out
    assert "guard target must be between" in err


def test_a_line_that_is_not_utf8_is_said_and_the_chat_goes_on(
        synth_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A Latin-1 byte on stdin arrives as a lone surrogate (``surrogateescape``): the
    tokenizer's UnicodeEncodeError ended the chat with a traceback. The line is refused in
    one line, the next one answered, and a script learns (exit 1) a message went unsent."""
    code, out, err = chat(monkeypatch, capsys, synth_model("qwen3moe"),
                          "caf\udce9\n/system \udcff\nHi\n")
    assert code == 1, err
    assert "Traceback" not in err
    assert "the line is not UTF-8 text (byte 0xe9 at character 4); not sent" in err
    assert "the line is not UTF-8 text (byte 0xff at character 9); not sent" in err
    assert len(summaries(out)) == 1  # "Hi" was answered


@pytest.mark.parametrize(("argv", "option"), [
    (["generate", "--prompt", "caf\udce9", "--n", "1"], "--prompt"),
    (["bench", "--prompt", "caf\udce9", "--tokens", "2", "--runs", "1"], "--prompt"),
    (["chat", "--system", "caf\udce9"], "--system"),
])
def test_a_text_argument_that_is_not_utf8_is_one_line_before_loading(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
        option: str) -> None:
    """``--prompt $'caf\\xe9'`` was a UnicodeEncodeError traceback after the model loaded."""
    code = main([argv[0], str(tmp_path / "never-read.gguf"), *argv[1:]])
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"moescope: error: {option} is not UTF-8 text (byte 0xe9 at character 4)\n"


def test_compare_takes_a_bounded_list_without_repeats(
        synth_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``/compare psr,psr,...`` ran one greedy answer per name, as many as were typed."""
    many = ",".join(f"threshold:theta=0.{i:03d}" for i in range(65))
    code, _, err = chat(monkeypatch, capsys, synth_model("qwen3moe"),
                        f"Hi\n/compare psr,psr\n/compare {many}\n")
    assert code == 0, err
    assert "/compare names psr more than once" in err
    assert "/compare names 65 policies; at most 64" in err


def test_ram_auto_chooses_the_ram_tier_again_and_says_why(
        synth_model: Callable[..., Path], spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``/ram auto`` chooses as ``--ram-budget auto`` does at load, from the memory available
    now, and prints the choice and its one-line reason; it was refused as a budget
    ("cannot read budget 'auto'"). The tiny model fits: every expert goes back into RAM,
    the tier filled (its experts stayed in the file at the explicit 25%), live."""
    script = "/help\n/ram\n/ram auto\nHi\n/ram 50%\n/ram AUTO\n"
    code, out, err = chat(monkeypatch, capsys, synth_model("qwen3moe"), script,
                          "--ram-budget", "25%")
    assert code == 0, err
    assert "cannot read budget" not in err and "Traceback" not in err
    assert "auto: what fits the memory available now, as at load" in out  # /help
    lines = out.splitlines()
    assert "RAM budget 25% · 4/16 experts per layer in RAM" in lines
    assert lines.count("RAM budget auto · 16/16 experts per layer") == 2
    notes = [line for line in lines if line.startswith("note: ")]
    assert len(notes) == 2
    for note in notes:
        assert "needs about" in note and "is available" in note
        assert note.endswith("all 16 experts per layer stay in RAM")
    assert "RAM budget 50% · 8/16 experts per layer" in lines
    assert spy.loads == 1 and len(spy.turns) == 1


def test_ram_auto_on_a_model_loaded_whole_keeps_the_tier_off(
        synth_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Loaded with every expert in RAM (the default auto on a small model): ``/ram auto``
    leaves the tier off, as the load chose, and says so."""
    code, out, err = chat(monkeypatch, capsys, synth_model("qwen3moe"), "/ram auto\n")
    assert code == 0, err
    lines = out.splitlines()
    assert "RAM budget auto · RAM tier off: every expert in host memory" in lines
    assert any(line.startswith("note: ") and "all 16 experts per layer stay in RAM" in line
               for line in lines)


def test_compare_scoring_a_chat_of_one_block_says_it_has_no_interval(
        synth_model: Callable[..., Path], spy: Spy,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The chat's interval resamples blocks of 32 tokens: a chat of one block printed
    ``-2.89% [-2.89, -2.89]``, an interval of no width that read as certainty."""
    from moescope.engine.compare import SCORE_BLOCK

    code, out, _ = chat(monkeypatch, capsys, synth_model("qwen3moe"),
                        "Hi\n/compare psr score\n", "--n", "2")
    assert code == 0
    scored = int(out.split("the chat scored over ")[1].split()[0])
    assert 0 < scored <= SCORE_BLOCK, "the chat is longer than one block; shorten it"
    row = next(line for line in out.splitlines() if line.startswith("psr "))
    assert row.endswith("% (no interval)") and "[" not in row
    assert "too few for an interval" in out


def test_a_ram_budget_that_holds_every_expert_is_echoed_with_the_tier_off(
        synth_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``/ram 24GiB`` on a model loaded whole said only "RAM tier off: ...", not which
    budget it had taken (``/ram auto`` and a budget that leaves experts in the file did)."""
    code, out, err = chat(monkeypatch, capsys, synth_model("qwen3moe"),
                          "/ram 24GiB\n/ram 100%\n/ram\n")
    assert code == 0, err
    lines = out.splitlines()
    assert "RAM budget 24GiB · RAM tier off: every expert in host memory" in lines
    assert "RAM budget 100% · RAM tier off: every expert in host memory" in lines
    assert "RAM tier off: every expert in host memory" in lines  # /ram alone: the state
