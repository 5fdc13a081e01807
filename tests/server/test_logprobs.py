"""Log-probabilities (chat's ``logprobs``/``top_logprobs``, a text completion's
``logprobs: N``) through the openai client over loopback: the model's numbers for the
tokens of the answer, streamed and whole alike; bounds refused in one line naming the
field; requests that do not ask are answered as before."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
from server_helpers import Server

from moescope_testing.vocab import THINKING_CHAT_TEMPLATE

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MODEL = "moescope-demo-qwen3moe"
HELLO = [{"role": "user", "content": "Hello, how are you today?"}]
PROMPT = "def main():"


def _chat(server: Server, stream: bool, **kwargs: object) -> tuple[str, list, str]:  # type: ignore[type-arg]
    """(content, logprobs.content entries, finish_reason), whole or gathered from a stream."""
    c = server.client()
    args = dict(model=MODEL, messages=HELLO, max_tokens=24, temperature=0, logprobs=True)
    args.update(kwargs)
    if not stream:
        r = c.chat.completions.create(**args)  # type: ignore[call-overload]
        choice = r.choices[0]
        return choice.message.content, choice.logprobs.content, choice.finish_reason
    chunks = [ch for ch in c.chat.completions.create(**args, stream=True)  # type: ignore[call-overload]
              if ch.choices]
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    entries = [e for ch in chunks if ch.choices[0].logprobs is not None
               for e in ch.choices[0].logprobs.content or []]
    return text, entries, chunks[-1].choices[0].finish_reason


def _same(a: list, b: list) -> None:  # type: ignore[type-arg]
    """The same tokens with the same numbers, to float noise: a second request decodes
    its prompt's last token again from the KV cache, alone rather than in the batch, and
    the logits may differ in their last bits."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x.token, x.bytes) == (y.token, y.bytes)
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
        assert [(t.token, t.bytes) for t in x.top_logprobs] == \
            [(t.token, t.bytes) for t in y.top_logprobs]
        assert [t.logprob for t in x.top_logprobs] == \
            pytest.approx([t.logprob for t in y.top_logprobs], abs=1e-4)


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_chat_tokens_are_the_answer_with_the_likeliest_logprob(
        server: Server, stream: bool) -> None:
    text, entries, finish = _chat(server, stream, top_logprobs=5)
    assert finish == "length" and len(entries) == 24
    assert "".join(e.token for e in entries) == text
    for e in entries:
        assert e.logprob <= 0.0 and math.isfinite(e.logprob)
        assert bytes(e.bytes).decode("utf-8") == e.token
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True)
        # temperature 0: the sampled token is the likeliest (raw logits, no penalty)
        assert e.logprob == max(tops) == e.top_logprobs[0].logprob
        assert e.top_logprobs[0].token == e.token
        assert all(bytes(t.bytes).decode("utf-8") == t.token for t in e.top_logprobs)


def test_streamed_logprobs_equal_the_whole_ones(server: Server) -> None:
    whole = _chat(server, False, top_logprobs=3, max_tokens=30)
    streamed = _chat(server, True, top_logprobs=3, max_tokens=30)
    assert streamed[0] == whole[0]
    _same(streamed[1], whole[1])


def test_each_streamed_chunk_carries_its_own_tokens(server: Server) -> None:
    with server.http() as h, h.stream("POST", "/v1/chat/completions", json={
            "messages": HELLO, "max_tokens": 12, "temperature": 0, "logprobs": True,
            "top_logprobs": 2, "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    for ch in chunks:
        for choice in ch["choices"]:
            if "content" not in choice["delta"] or choice["finish_reason"]:
                continue
            content = choice["logprobs"]["content"]
            assert "".join(e["token"] for e in content) == choice["delta"]["content"]
            assert all(len(e["top_logprobs"]) == 2 for e in content)


def test_top_logprobs_zero_gives_the_sampled_tokens_only(server: Server) -> None:
    _, entries, _ = _chat(server, False, top_logprobs=0, max_tokens=8, temperature=0.9,
                          seed=4)
    assert len(entries) == 8
    assert all(e.top_logprobs == [] and e.logprob <= 0 for e in entries)
    _, entries, _ = _chat(server, False, max_tokens=8)  # top_logprobs left out: 0
    assert len(entries) == 8 and all(e.top_logprobs == [] for e in entries)


def test_a_stop_sequence_keeps_the_tokens_that_show_in_the_answer(server: Server) -> None:
    full, entries, _ = _chat(server, False, max_tokens=24)
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip() and len(stop) == 3
    for stream in (False, True):
        text, cut, finish = _chat(server, stream, max_tokens=24, stop=[stop])
        assert finish == "stop" and text == full[:full.index(stop)]
        joined = "".join(e.token for e in cut)
        assert joined.startswith(text)  # the last token may reach into the stop sequence
        assert len("".join(e.token for e in cut[:-1])) < len(text) or not text
        _same(cut, entries[:len(cut)])


@pytest.mark.parametrize("stream", [False, True])
def test_text_completion_logprobs_in_the_legacy_columns(server: Server, stream: bool) -> None:
    c = server.client()
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, logprobs=3)
    if stream:
        chunks = [ch for ch in c.completions.create(**args, stream=True)  # type: ignore[call-overload]
                  if ch.choices]
        text = "".join(ch.choices[0].text for ch in chunks)
        cols: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],  # type: ignore[type-arg]
                                 "text_offset": []}
        for ch in chunks:
            if ch.choices[0].logprobs is not None:
                for k, v in ch.choices[0].logprobs.model_dump().items():
                    cols[k] += v
    else:
        r = c.completions.create(**args)  # type: ignore[call-overload]
        text, cols = r.choices[0].text, r.choices[0].logprobs.model_dump()
    tokens = cols["tokens"]
    assert len(tokens) == 20 and "".join(tokens) == text
    offsets = [len(PROMPT) + len("".join(tokens[:i])) for i in range(len(tokens))]
    assert cols["text_offset"] == offsets  # from the prompt's start, as OpenAI's
    for tok, lp, top in zip(tokens, cols["token_logprobs"], cols["top_logprobs"],
                            strict=True):
        assert lp <= 0 and tok in top and top[tok] == lp == max(top.values())
        assert 3 <= len(top) <= 4  # the 3 likeliest and, always, the sampled token


def test_text_completion_streamed_and_whole_agree_and_logprobs_0(server: Server) -> None:
    c = server.client()
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0.7, seed=11,
                logprobs=0)
    whole = c.completions.create(**args).choices[0].logprobs  # type: ignore[call-overload]
    assert whole is not None and len(whole.tokens) == 16
    assert all(top == {t: lp} for t, lp, top in zip(whole.tokens, whole.token_logprobs,
                                                     whole.top_logprobs, strict=True))
    got: dict[str, list] = {}  # type: ignore[type-arg]
    for ch in c.completions.create(**args, stream=True):  # type: ignore[call-overload]
        if ch.choices and ch.choices[0].logprobs is not None:
            for k, v in ch.choices[0].logprobs.model_dump().items():
                got.setdefault(k, []).extend(v)
    want = whole.model_dump()
    assert (got["tokens"], got["text_offset"]) == (want["tokens"], want["text_offset"])
    assert got["token_logprobs"] == pytest.approx(want["token_logprobs"], abs=1e-4)


def test_the_sum_of_a_greedy_completions_logprobs_is_finite(server: Server) -> None:
    """What scoring scripts do: the sequence's log-likelihood and perplexity."""
    r = server.client().completions.create(model=MODEL, prompt="ROMEO:", max_tokens=32,
                                           temperature=0, logprobs=1)
    lps = r.choices[0].logprobs.token_logprobs
    total = sum(lps)
    assert len(lps) == 32 and math.isfinite(total) and total < 0
    assert 1.0 < math.exp(-total / len(lps)) < 4096  # perplexity within the vocabulary


@pytest.mark.parametrize("stream", [False, True])
def test_requests_without_logprobs_are_answered_as_before(server: Server,
                                                          stream: bool) -> None:
    with server.http() as h:
        for path, body in (("/v1/chat/completions", {"messages": HELLO}),
                           ("/v1/completions", {"prompt": PROMPT}),
                           ("/v1/chat/completions", {"messages": HELLO, "logprobs": False,
                                                     "top_logprobs": 0}),
                           ("/v1/completions", {"prompt": PROMPT, "logprobs": None})):
            r = h.post(path, json={**body, "max_tokens": 6, "stream": stream})
            assert r.status_code == 200, r.text
            if not stream:
                assert r.json()["choices"][0]["logprobs"] is None
            else:
                chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                          if line.startswith("data: {")]
                assert chunks and all("logprobs" not in choice for ch in chunks
                                      for choice in ch["choices"])


def test_json_output_reports_the_json_tokens(server: Server) -> None:
    """With a grammar the token was sampled from the masked distribution; the number is
    still the model's own (so it need not be the likeliest), and the tokens are the JSON."""
    text, entries, _ = _chat(server, False, max_tokens=40, top_logprobs=2,
                             response_format={"type": "json_object"})
    assert text.startswith("{") and "".join(e.token for e in entries) == text
    assert all(math.isfinite(e.logprob) and e.logprob <= 0 for e in entries)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": "3"}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2.5}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 5}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": "yes"}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
    ("/v1/completions", {"logprobs": 6}, "logprobs"),
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"logprobs": 2, "echo": True}, "echo"),
    ("/v1/completions", {"logprobs": 2, "top_logprobs": 2}, "top_logprobs"),
])
def test_bounds_are_refused_in_one_line_naming_the_field(server: Server, path: str,
                                                         body: dict, param: str) -> None:  # type: ignore[type-arg]
    base = {"messages": HELLO} if "chat" in path else {"prompt": PROMPT}
    with server.http() as h:
        r = h.post(path, json={**base, **body, "max_tokens": 4})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "\n" not in err["message"]
    assert err["type"] == "invalid_request_error"


def test_the_openai_client_gets_a_bad_request_naming_the_field(server: Server) -> None:
    with pytest.raises(openai.BadRequestError, match="top_logprobs must be a whole number "
                                                     "from 0 to 20, got 30"):
        server.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4,
                                                logprobs=True, top_logprobs=30)
    with pytest.raises(openai.BadRequestError, match="from 0 to 5, got 6"):
        server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4,
                                           logprobs=6)


@pytest.fixture
def thinker(server_factory: Callable[..., Server], synth_model: Callable[..., Path]) -> Server:
    model = synth_model("qwen3moe", expert_type="q8_0", chat_template=THINKING_CHAT_TEMPLATE)
    return server_factory("--ctx", "512", "--policy", "exact", model=model)


def test_a_thinking_models_thoughts_have_no_logprobs(thinker: Server) -> None:
    """Only the content's tokens are reported (OpenAI's reasoning models report none of
    their thoughts); this random model never closes its thought."""
    c = thinker.client()
    [model] = [m.id for m in c.models.list().data]
    r = c.chat.completions.create(model=model, messages=HELLO, max_tokens=20, seed=1,
                                  logprobs=True, top_logprobs=2)
    assert r.choices[0].message.model_extra.get("reasoning_content")
    assert r.choices[0].message.content == "" and r.choices[0].logprobs.content == []


@pytest.fixture
def random_model(server_factory: Callable[..., Server], tiny_moe: Path) -> Server:
    return server_factory("--ctx", "512", "--policy", "exact", model=tiny_moe)


def test_tokens_that_cut_a_character_are_written_as_bytes(random_model: Server) -> None:
    """A random model writes byte tokens that are half a character: ``token`` is
    ``bytes:\\xNN…`` (OpenAI's spelling), ``bytes`` the raw bytes; every token is
    reported, streamed as whole, and the bytes are the answer's."""
    c = random_model.client()
    [model] = [m.id for m in c.models.list().data]
    args = dict(model=model, messages=HELLO, max_tokens=60, temperature=2.0, seed=9,
                logprobs=True, top_logprobs=3)
    r = c.chat.completions.create(**args)  # type: ignore[call-overload]
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens == 60
    cut = 0
    for t in [*entries, *(alt for e in entries for alt in e.top_logprobs)]:
        raw = bytes(t.bytes)
        try:
            assert t.token == raw.decode("utf-8")
        except UnicodeDecodeError:
            cut += 1
            assert t.token == "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
    assert cut > 0, "no byte token in this answer: pick another seed"
    text = b"".join(bytes(e.bytes) for e in entries).decode("utf-8", "replace")
    assert text.startswith(r.choices[0].message.content)
    chunks = [ch for ch in c.chat.completions.create(**args, stream=True)  # type: ignore[call-overload]
              if ch.choices and ch.choices[0].logprobs is not None]
    streamed = [e for ch in chunks for e in ch.choices[0].logprobs.content]
    _same(streamed, entries)
