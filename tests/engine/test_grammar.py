"""Grammars (JSON output) on the real engine with the demo model: the answer follows the
grammar; grammars llama.cpp would abort, overflow its stack on or print on are refused in
one line before generation; a grammar the vocabulary cannot spell ends the answer, not
the process."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.engine import Engine, Sampling
from moescope.engine.grammar import (
    MAX_GROUP_DEPTH,
    GrammarError,
    json_object_grammar,
    schema_grammar,
)
from moescope.util.resources import demo_model_path
from moescope_testing import ensure_wide_vocab_model

ASK = [{"role": "user", "content": "Write some Python code."}]


@pytest.fixture
def demo(engine: Callable[..., Engine]) -> Engine:
    return engine(demo_model_path(), policy="exact", n_ctx=512)


def _answer(e: Engine, grammar: str, max_tokens: int = 200, temperature: float = 0.0) -> str:
    s = Sampling(temperature=temperature, max_tokens=max_tokens, seed=3,
                 grammar=e.compile_grammar(grammar))
    return "".join(t.text for t in e.generate(ASK, s))


def test_a_json_object_grammar_gives_a_json_object(demo: Engine) -> None:
    text = _answer(demo, json_object_grammar())
    assert demo.last_answer.stop_reason == "eos"
    assert isinstance(json.loads(text), dict)


def test_a_schema_grammar_gives_what_the_schema_allows(demo: Engine) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"},
                                               "ok": {"type": "boolean"}},
              "required": ["n", "ok"]}
    value = json.loads(_answer(demo, schema_grammar(schema)))
    assert set(value) == {"n", "ok"}
    assert isinstance(value["n"], int) and isinstance(value["ok"], bool)


def test_a_grammar_the_vocabulary_cannot_spell_ends_the_answer_not_the_process(
        demo: Engine) -> None:
    # no token's text can hold a NUL: after "a" nothing is allowed; llama.cpp would
    # abort accepting whatever the sampler then picked
    for temperature in (0.0, 1.0):
        text = _answer(demo, 'root ::= "a" "\\x00"', temperature=temperature)
        assert text == "a"
        assert demo.last_answer.stop_reason == "grammar"
    assert _answer(demo, json_object_grammar()).startswith("{")  # and the engine goes on


def test_a_grammar_constrains_one_answer(demo: Engine) -> None:
    s = Sampling(temperature=0, max_tokens=5, grammar=demo.compile_grammar(json_object_grammar()))
    list(demo.generate(ASK, s))
    with pytest.raises(GrammarError, match="one answer"):
        list(demo.generate(ASK, s))


@pytest.mark.parametrize(("grammar", "why"), [
    ("root ::= foo", "Undefined rule identifier 'foo'"),
    ('root ::= root "a"', "left recursion"),
    ("this is no grammar", "expecting ::="),
    ("root ::= " + '("a" ' * (MAX_GROUP_DEPTH + 1) + ")" * (MAX_GROUP_DEPTH + 1),
     f"at most {MAX_GROUP_DEPTH}"),
    # 20,000 nested groups overflow llama.cpp's recursive parser (a segfault)
    ("root ::= " + '("a" ' * 20_000 + ")" * 20_000, "nests 20000 groups"),
])
def test_a_bad_grammar_is_refused_in_one_line_and_prints_nothing(
        demo: Engine, capfd: pytest.CaptureFixture[str], grammar: str, why: str) -> None:
    with pytest.raises(GrammarError, match=why) as err:
        demo.compile_grammar(grammar)
    assert "\n" not in str(err.value)
    out, errors = capfd.readouterr()
    assert "error parsing grammar" not in out + errors


def test_schema_bounds_come_before_the_converter() -> None:
    for schema, why in [
        ({"type": "array", "minItems": 10**12}, "too many repetitions"),
        ({"$ref": "https://example.com/s.json"}, "only local"),
        ({"enum": list(range(1001))}, "more than 1000"),
        ([], "must be a JSON object"),
    ]:
        with pytest.raises(GrammarError, match=why):
            schema_grammar(schema)


PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}
ODD = {"type": "object",  # tokens the model would hardly pick by itself
       "properties": {"k": {"type": "string", "pattern": "^[QZX]{4}-[0-9]{2}$"},
                      "e": {"enum": ["ÿ獃", "\t\t"]}},
       "required": ["k", "e"]}
SETTINGS = [dict(temperature=0.0), dict(temperature=0.8, top_k=40, seed=5),
            dict(temperature=1.0, top_k=8, repeat_penalty=1.5, seed=11)]


def _tokens(e: Engine, grammar: str, top_first: bool, max_tokens: int,
            **settings: float) -> tuple[list[int], int]:
    """The answer's token ids, and how many tokens were masked from the likeliest ones."""
    g = e.compile_grammar(grammar)
    g.top_first = top_first
    s = Sampling(max_tokens=max_tokens, grammar=g, **settings)  # type: ignore[arg-type]
    return [t.token_id for t in e.generate(ASK, s)], g.top_steps


def _same_answers(e: Engine, max_tokens: int) -> int:
    """Every grammar and sampling setting answers token for token as masking the whole
    vocabulary does; returns how many tokens were masked from the likeliest alone."""
    top_steps = 0
    for grammar in (json_object_grammar(), schema_grammar(PERSON), schema_grammar(ODD)):
        for settings in SETTINGS:
            fast, steps = _tokens(e, grammar, True, max_tokens, **settings)
            full, _ = _tokens(e, grammar, False, max_tokens, **settings)
            assert fast == full, (grammar[:40], settings)
            top_steps += steps
    return top_steps


def test_masking_the_likeliest_tokens_first_answers_as_the_whole_vocabulary(
        demo: Engine) -> None:
    assert _same_answers(demo, 60) > 0


def test_masking_the_likeliest_tokens_first_on_a_qwen3_sized_vocabulary(
        engine: Callable[..., Engine], synth_dir: Path) -> None:
    # 151,936 tokens of real text: checking each against the grammar is what costs
    big = engine(ensure_wide_vocab_model(synth_dir), policy="exact", n_ctx=512)
    assert _same_answers(big, 30) > 0


def test_without_top_k_or_with_a_penalty_below_one_every_token_is_checked(
        demo: Engine) -> None:
    # the sampler chain then weighs every allowed token: no shortcut is exact
    for settings in (dict(temperature=0.8, top_k=0, seed=1),
                     dict(temperature=0.0, repeat_penalty=0.9)):
        fast, steps = _tokens(demo, json_object_grammar(), True, 20, **settings)
        assert steps == 0
        assert fast == _tokens(demo, json_object_grammar(), False, 20, **settings)[0]
