"""Acceptance: what llama.cpp refuses, and edge values of the load and generate
arguments, end in one sentence that says why (never a traceback, a silent abort, or a
silently different result)."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.engine import ChatTemplateError, Engine, Message, ModelLoadError, Sampling
from moescope.util.errors import MoEScopeError

RAISES_ON_SYSTEM = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _patched(tmp_path: Path, source: Path, name: str, old: bytes, new: bytes) -> Path:
    data = source.read_bytes()
    assert data.count(old) >= 1 and len(old) == len(new)
    out = tmp_path / name
    out.write_bytes(data.replace(old, new))
    return out


def test_an_unknown_architecture_is_named(synth_model: Callable[..., Path],
                                          tmp_path: Path) -> None:
    """llama-cpp-python says only "Failed to load model from file"; llama.cpp's log says
    why, and the message carries it."""
    path = _patched(tmp_path, synth_model("qwen3moe"), "unknown.gguf", b"qwen3moe", b"qwen9moe")
    with pytest.raises(ModelLoadError, match="unknown model architecture: 'qwen9moe'"):
        Engine().load(path, n_ctx=64, n_threads=1)


def test_a_chat_template_that_does_not_parse_is_one_error(
        synth_model: Callable[..., Path]) -> None:
    path = synth_model("qwen3moe", chat_template="{% for m in messages %}{{ m['content'] }}")
    with pytest.raises(ChatTemplateError, match=r"chat template .* not valid Jinja"):
        Engine().load(path, n_ctx=64, n_threads=1)


def test_a_template_that_refuses_the_conversation_is_a_user_error(
        synth_model: Callable[..., Path], engine: Callable[..., Engine]) -> None:
    e = engine(synth_model("qwen3moe", chat_template=RAISES_ON_SYSTEM))
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        list(e.generate([Message("system", "Be brief."), Message("user", "Hi")],
                        Sampling(max_tokens=2)))
    assert list(e.generate([Message("user", "Hi")], Sampling(max_tokens=2)))


def test_chat_keeps_going_when_the_template_refuses_a_system_prompt(
        synth_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import io

    path = synth_model("qwen3moe", chat_template=RAISES_ON_SYSTEM)
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello\n/system -\nHello\n"))
    code = main(["chat", str(path), "--system", "Be brief.", "--n", "3", "--ctx", "256",
                 "--threads", "1"])
    out, err = capsys.readouterr()
    # it keeps going, and a script learns that a message got no answer (exit status 1)
    assert code == 1 and "Traceback" not in err
    assert "System role not supported" in err and "/reset" not in err
    assert out.count("tokens, stop:") == 1  # the second Hello, without the system prompt


@pytest.mark.parametrize("n_ctx", [0, -5])
def test_a_context_below_one_token_is_refused_before_loading(
        synth_model: Callable[..., Path], n_ctx: int) -> None:
    with pytest.raises(MoEScopeError, match=f"context size {n_ctx} is too small"):
        Engine().load(synth_model("qwen3moe"), n_ctx=n_ctx)


@pytest.mark.parametrize("n_ctx", [2, 8])
def test_a_tiny_context_loads_and_says_the_prompt_does_not_fit(
        synth_model: Callable[..., Path], engine: Callable[..., Engine], n_ctx: int) -> None:
    """The warm-up decoded 16 tokens whatever the context: a ValueError from deep in
    llama-cpp-python for any context of 2..15 tokens."""
    e = engine(synth_model("qwen3moe"), n_ctx=n_ctx)
    with pytest.raises(MoEScopeError, match="does not fit the context"):
        list(e.generate("a prompt longer than the context", Sampling(max_tokens=2)))


def test_an_empty_prompt_starts_from_the_beginning_of_text(
        synth_model: Callable[..., Path], engine: Callable[..., Engine]) -> None:
    """The synthetic models, like Qwen3, add no BOS: an empty prompt was zero tokens and
    an AssertionError inside llama-cpp-python."""
    e = engine(synth_model("qwen3moe"))
    toks = list(e.generate("", Sampling(max_tokens=3, seed=1)))
    assert toks and e.last_answer.n_prompt_tokens == 1


@pytest.mark.parametrize("max_tokens", [0, -3])
def test_asking_for_no_tokens_is_refused(synth_model: Callable[..., Path],
                                         engine: Callable[..., Engine],
                                         max_tokens: int) -> None:
    """It used to generate one token anyway."""
    e = engine(synth_model("qwen3moe"))
    with pytest.raises(MoEScopeError, match="at least 1 token"):
        list(e.generate("Hi", Sampling(max_tokens=max_tokens)))


def test_a_failed_native_check_while_loading_says_which_file_and_check(
        synth_model: Callable[..., Path], tmp_path: Path) -> None:
    """A vocabulary with a duplicated token makes llama.cpp abort (GGML_ASSERT). The
    process cannot survive that, but it used to die without a word (stderr goes to
    /dev/null while loading). The header check now refuses such a file before llama.cpp
    reads it (tests/fuzz/test_hostile_vocab.py); it is bypassed here to reach a native
    check's failure, which any other corruption llama.cpp asserts on still meets."""
    # tokens 0 and 1 of the synthetic vocabulary are "Ā" and "ā" (2 UTF-8 bytes each)
    length = (2).to_bytes(8, "little")
    path = _patched(tmp_path, synth_model("qwen3moe"), "dup-token.gguf",
                    length + "ā".encode(), length + "Ā".encode())
    script = textwrap.dedent(f"""
        from moescope.engine import Engine
        from moescope.model import header_checks
        header_checks._check_distinct_tokens = lambda *args: None
        Engine().load({str(path)!r}, n_ctx=64, n_threads=1)
        print("LOADED")
    """)

    def no_core_dump() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, preexec_fn=no_core_dump)
    assert out.returncode != 0 and "LOADED" not in out.stdout
    assert "moescope: fatal: llama.cpp stopped on a failed internal check" in out.stderr
    assert "GGML_ASSERT" in out.stderr and "while loading dup-token.gguf" in out.stderr
