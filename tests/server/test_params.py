"""Request fields read where no sampling run could tell them apart (the HTTP paths are
tested over loopback in the other files)."""

from __future__ import annotations

from moescope.server.params import Limits, chat_params, completion_params

ASK = {"messages": [{"role": "user", "content": "hi"}]}


def test_top_k_zero_turns_it_off_as_llama_server_reads_it() -> None:
    """``top_k: 0`` was read as absent (40): a client asking for every token got 40."""
    assert chat_params(ASK, Limits()).top_k == 40
    assert chat_params({**ASK, "top_k": 0}, Limits()).top_k == 0
    assert chat_params({**ASK, "top_k": 7}, Limits()).top_k == 7
    assert completion_params({"prompt": "hi", "top_k": 0}, Limits()).top_k == 0


def test_openais_newer_reasoning_efforts_are_read() -> None:
    """"none" and "minimal" (OpenAI's newer values) were a 400: "none" is thinking off,
    "minimal" the least effort a template offers."""
    efforts = {e: chat_params({**ASK, "reasoning_effort": e}, Limits()).thinking
               for e in ("none", "minimal", "low", "medium", "high")}
    assert efforts == {"none": "off", "minimal": "low", "low": "low", "medium": "medium",
                       "high": "high"}
