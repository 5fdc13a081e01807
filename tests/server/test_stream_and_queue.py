"""The pieces under the server without HTTP: the answer stream and the engine's queue."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moescope.engine.logprobs import TokenLogprob
from moescope.model.reasoning import split_reasoning
from moescope.server.service import LogprobTrack, TextStream
from moescope.session.turns import EngineQueue, QueueFull, TurnCancelled, TurnState


def _feed(stream: TextStream, pieces: list[str]) -> tuple[str, str]:
    r = c = ""
    for p in pieces:
        dr, dc = stream.feed(p)
        r, c = r + dr, c + dc
        if stream.stopped:
            break
    dr, dc = stream.finish()
    return r + dr, c + dc


def test_a_stop_sequence_cut_across_tokens_is_held_back_then_dropped() -> None:
    s = TextStream(["END"], split=False)
    assert s.feed("hello E") == ("", "hello ")  # "E" may begin the stop
    assert s.feed("N") == ("", "")
    assert s.feed("Dless") == ("", "")
    assert s.stopped and s.text == "hello "
    s = TextStream(["END"], split=False)
    assert _feed(s, ["hello E", "nd", " ok"]) == ("", "hello End ok")
    assert not s.stopped


def test_thoughts_and_answer_split_as_they_stream() -> None:
    s = TextStream([], prefix="<think>\n")
    r, c = _feed(s, ["I am ", "thinking", "</th", "ink>", "\n\nThe answer", " is 4"])
    assert (r, c) == ("I am thinking", "The answer is 4")
    assert s.parts() == ("I am thinking", "The answer is 4")
    s = TextStream(["answer"], prefix="<think>\n")
    assert _feed(s, ["hmm</think>", "the ans", "wer is"]) == ("hmm", "the ")


def test_the_queue_runs_one_turn_at_a_time_in_order() -> None:
    q = EngineQueue(capacity=2)
    first = q.join("a")
    assert first.state is TurnState.RUNNING
    second, third = q.join("b"), q.join("c")
    with pytest.raises(QueueFull):
        q.join("d")
    assert q.position(third) == 2
    order: list[str] = []

    def run(turn) -> None:  # type: ignore[no-untyped-def]
        assert q.wait(turn, timeout=10)
        order.append(turn.who)
        q.leave(turn)

    threads = [threading.Thread(target=run, args=(t,)) for t in (third, second)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    assert order == []
    q.leave(first)
    for t in threads:
        t.join(5)
    assert order == ["b", "c"]
    assert q.running is None and q.join_if_idle("x") is not None


def test_a_cancelled_turn_gives_its_place_and_wakes_its_waiter() -> None:
    q = EngineQueue(capacity=1)
    running = q.join("a")
    waiting = q.join("b")
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(q.wait(waiting)))
    t.start()
    q.cancel(waiting)
    t.join(5)
    assert woke == [False]
    assert q.waiting() == []
    q.join("c")  # the place is free again
    q.leave(running)
    with pytest.raises(TurnCancelled), q.turn("d", timeout=0.01):
        pass
    assert q.join_if_idle("e") is None  # "c" runs now


def test_plain_and_non_thinking_answers_stream_each_piece_as_it_comes() -> None:
    s = TextStream([], split=False)
    assert [s.feed(p) for p in ["a", "</thi", "nk>b"]] == [("", "a"), ("", "</thi"),
                                                         ("", "nk>b")]
    assert s.finish() == ("", "") and s.text == "a</think>b" and s.parts() == ("", s.text)
    s = TextStream([])  # a chat answer that cannot be a thought once it starts with "<b"
    assert s.feed("  ") == ("", "")  # blank: a thought may open next
    assert s.feed("<") == ("", "")  # may open <think>
    assert s.feed("b>Hi</thi") == ("", "  <b>Hi</thi")
    assert s.feed("nk>") == ("", "nk>")
    assert s.parts() == ("", "  <b>Hi</think>")
    s = TextStream([], prefix="<think>\n")  # a thinking template: always split
    assert _feed(s, ["x", "</think>", "y"]) == ("x", "y")


# streamed pieces of a thinking or plain answer, with or without stop sequences
_streams = given(pieces=st.lists(st.sampled_from(
    ["a", " ", "\n", "<", "think>", "</", "think", ">", "<think>", "</think>", "<|channel|>",
     "analysis", "final", "<|message|>", "<|start|>", "assistant", "END", "E", "ND", "x y"]),
    max_size=30), stops=st.sampled_from([[], ["END"], ["nk>", "a a"]]),
    split=st.booleans(), prefix=st.sampled_from(["", "<think>\n"]))


@settings(max_examples=1000, deadline=None, derandomize=True)
@_streams
def test_the_streamed_deltas_add_up_to_the_whole_answer(pieces: list[str], stops: list[str],
                                                        split: bool, prefix: str) -> None:
    """Whatever the pieces, the streamed deltas are the whole answer's split, in order
    (nothing sent is taken back), and text after a stop sequence never goes out."""
    s = TextStream(stops, prefix=prefix if split else "", split=split)
    reasoning, content = _feed(s, pieces)
    whole = "".join(pieces)
    cut = min((i for i in (whole.find(x) for x in stops) if i >= 0), default=len(whole))
    assert s.text == whole[:cut]
    expected = split_reasoning((prefix if split else "") + whole[:cut]) if split else None
    if expected is None:
        assert (reasoning, content) == ("", whole[:cut])
    else:
        assert (reasoning, content) == (expected.reasoning, expected.answer)
    assert s.parts() == ((expected.reasoning, expected.answer) if expected else
                         ("", whole[:cut]))


@settings(max_examples=1000, deadline=None, derandomize=True)
@_streams
def test_the_logprob_tokens_are_those_that_show_in_the_content(
        pieces: list[str], stops: list[str], split: bool, prefix: str) -> None:
    """Each token's log-probability goes out once, in order, with the delta whose content
    first shows its text; the tokens sent are those whose text is in the content (the
    first may begin before it, after a thought; the last may reach into a stop sequence)."""
    s = TextStream(stops, prefix=prefix if split else "", split=split)
    track = LogprobTrack()
    sent = []
    content = ""
    for i, piece in enumerate(pieces):
        _, c = s.feed(piece)
        track.add(piece, TokenLogprob(-float(i), piece.encode(), ()))
        got = track.release(s.content_span())
        assert not got or c  # tokens go out with content only
        sent += got
        content += c
        if s.stopped:
            break
    _, c = s.finish()
    sent += track.release(s.content_span(), last=not s.stopped)
    content += c
    order = [-t.logprob.logprob for t in sent]
    assert order == sorted(set(order))  # each once, in order
    texts = [t.logprob.piece.decode() for t in sent]
    joined = "".join(texts)
    if not content:
        assert not sent
    elif content in "".join(pieces):  # harmony may join two final channels: not one run
        assert joined.find(content) < len(texts[0]) and content in joined
        assert len(joined) - len(texts[-1]) < joined.find(content) + len(content)
        assert [t.offset for t in sent[1:]] == \
            [len("".join(texts[:k])) - joined.find(content) for k in range(1, len(texts))]
