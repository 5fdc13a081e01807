"""JSON output (``response_format``) through the openai client over loopback: the answer
is JSON, a schema's JSON; a schema or grammar that cannot be used is a 400 naming
``response_format`` in one line, and the server lives on (llama.cpp aborts or overflows
its stack on some grammars: none reaches it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import openai
import pytest
from server_helpers import Server

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MODEL = "moescope-demo-qwen3moe"
ASK = [{"role": "user", "content": "Write some Python code."}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}


def _person_format() -> dict:  # type: ignore[type-arg]
    return {"type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


def _is_person(value: object) -> bool:
    return (isinstance(value, dict) and set(value) <= {"name", "age"}
            and isinstance(value.get("name"), str)
            and isinstance(value.get("age"), int) and not isinstance(value.get("age"), bool))


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_object_answer_parses_as_json(server: Server, stream: bool) -> None:
    client = server.client()
    kwargs = dict(model=MODEL, messages=ASK, max_tokens=200, temperature=0,
                  response_format={"type": "json_object"})
    if stream:
        chunks = list(client.chat.completions.create(**kwargs, stream=True))  # type: ignore[call-overload]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        r = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert finish == "stop", text
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_json_schema_answer_validates_against_the_schema(server: Server,
                                                           temperature: float) -> None:
    r = server.client().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=300, temperature=temperature, seed=7,
        response_format=_person_format())  # type: ignore[arg-type]
    text = r.choices[0].message.content or ""
    if r.choices[0].finish_reason == "length":  # a cut answer is a prefix, as OpenAI's
        assert text.startswith("{")
        return
    assert _is_person(json.loads(text)), text


def test_streamed_schema_answer_equals_the_whole_one(server: Server) -> None:
    client = server.client()
    kwargs = dict(model=MODEL, messages=ASK, max_tokens=100, temperature=0,
                  response_format=_person_format())
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(**kwargs, stream=True))  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert _is_person(json.loads(streamed))


def test_text_completions_take_a_response_format_too(server: Server) -> None:
    r = server.client().completions.create(
        model=MODEL, prompt="def main():", max_tokens=100, temperature=0,
        extra_body={"response_format": _person_format()})
    assert _is_person(json.loads(r.choices[0].text)), r.choices[0].text


def test_a_text_response_format_changes_nothing(server: Server) -> None:
    client = server.client()
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=20,
                                           temperature=0)
    text = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=20,
                                          temperature=0, response_format={"type": "text"})
    assert text.choices[0].message.content == plain.choices[0].message.content


TREE = {"type": "object",
        "properties": {"name": {"type": "string", "maxLength": 10},
                       "children": {"type": "array", "items": {"$ref": "#"},
                                    "maxItems": 3}},
        "required": ["name", "children"], "additionalProperties": False}
"""A tree: each node's children are trees (``$ref`` to the root)."""


def _is_tree(value: object) -> int:
    """The depth of ``value`` if it is a TREE (1: a leaf), else 0."""
    if not (isinstance(value, dict) and set(value) == {"name", "children"}
            and isinstance(value["name"], str) and len(value["name"]) <= 10
            and isinstance(value["children"], list) and len(value["children"]) <= 3):
        return 0
    depths = [_is_tree(child) for child in value["children"]]
    return 0 if 0 in depths else 1 + max(depths, default=0)


@pytest.mark.parametrize("schema", [TREE, {"$defs": {"Node": TREE}, "$ref": "#/$defs/Node"}],
                         ids=["root", "root-ref-to-defs"])
def test_a_recursive_schema_gives_its_trees(server: Server, schema: dict) -> None:  # type: ignore[type-arg]
    """``"$ref": "#"`` (the root, recursively): every answer is a tree as the schema says,
    nested where the model nests (the grammar's rule for the root recurs). The root may
    itself be a ``$ref`` (pydantic's recursive models)."""
    depths = []
    for seed in range(6):
        r = server.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Write a tree."}],
            max_tokens=300, temperature=1.0, seed=seed,
            response_format=_schema(schema))  # type: ignore[arg-type]
        text = r.choices[0].message.content or ""
        if r.choices[0].finish_reason == "length":
            assert text.startswith("{")
            continue
        depths.append(_is_tree(json.loads(text)))
        assert depths[-1], text
    assert len(depths) >= 3 and max(depths) >= 2, depths
    assert _is_tree({"name": "a", "children": [{"name": "b", "children": [1]}]}) == 0


def _schema(schema: object) -> dict:  # type: ignore[type-arg]
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


HOSTILE = [
    ("not an object", "text/plain"),
    ("a list", [1, 2]),
    ("a json_schema without schema", {"type": "json_schema", "json_schema": {"name": "x"}}),
    ("an unknown type", {"type": "xml"}),
    ("a non-object schema", _schema([{"type": "string"}])),
    ("a boolean schema", _schema(True)),
    ("an unknown keyword", _schema({"not": {"type": "string"}})),
    ("an unknown type name", _schema({"type": "frob"})),
    ("a root that is a $ref to itself", _schema({"$ref": "#"})),
    ("recursion to the root before any text", _schema({"anyOf": [{"$ref": "#"},
                                                                 {"type": "integer"}]})),
    ("a $ref loop", _schema({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}})),
    ("a remote $ref", _schema({"$ref": "https://example.com/schema.json"})),
    ("a huge enum", _schema({"enum": [f"v{i}" for i in range(5000)]})),
    ("an empty enum", _schema({"enum": []})),
    ("a gigantic minItems", _schema({"type": "array", "minItems": 10**12})),
    ("a maxLength nesting past the parser's stack", _schema({"type": "string",
                                                             "maxLength": 50_000})),
    ("nested pattern repetitions", _schema({"type": "string",
                                            "pattern": "^((((a{99}){99}){99}){99})$"})),
    ("a pattern that is not anchored", _schema({"type": "string", "pattern": "[a-"})),
    ("deep nesting", _schema(json.loads('{"type":"array","items":' * 40 + "{}" + "}" * 40))),
    ("a schema over 64 KiB", _schema({"type": "object", "description": "x" * 70_000})),
    ("a string enum", _schema({"enum": "abc"})),
    ("a string required", _schema({"type": "object", "required": "a",
                                   "properties": {"a": {"type": "string"}}})),
    ("required naming no property", _schema({"type": "object", "required": ["b"],
                                             "properties": {"a": {"type": "string"}}})),
    ("a list for properties", _schema({"type": "object", "properties": []})),
    ("a number as a property's schema", _schema({"type": "object",
                                                 "properties": {"a": 5}})),
    ("a boolean as a property's schema", _schema({"type": "object",
                                                  "properties": {"a": False}})),
    ("a number for items", _schema({"type": "array", "items": 5})),
    ("a number for additionalProperties", _schema({"type": "object",
                                                   "additionalProperties": 5})),
    ("a number in a type list", _schema({"type": ["string", 5]})),
    ("an empty type list", _schema({"type": []})),
    ("an empty anyOf", _schema({"anyOf": []})),
    ("a number for a pattern", _schema({"type": "string", "pattern": 5})),
    ("a fractional maxLength", _schema({"type": "string", "maxLength": 1.5})),
    ("a boolean maxLength", _schema({"type": "string", "maxLength": True})),
    ("a negative minLength", _schema({"type": "string", "minLength": -1})),
    ("minLength above maxLength", _schema({"type": "string", "minLength": 5,
                                           "maxLength": 2})),
    ("minItems above maxItems", _schema({"type": "array", "items": {"type": "integer"},
                                         "minItems": 3, "maxItems": 1})),
    ("minimum above maximum", _schema({"type": "integer", "minimum": 10, "maximum": 1})),
    ("a string minimum", _schema({"type": "integer", "minimum": "a"})),
    ("draft 4's boolean exclusiveMinimum", _schema({"type": "integer", "minimum": 0,
                                                    "exclusiveMinimum": True})),
    ("a bad keyword deep inside", _schema({"type": "object", "properties": {"a": {
        "type": "array", "items": {"type": "object", "properties": {"b": {
            "type": "string", "maxLength": -3}}}}}})),
    ("an allOf of strings", _schema({"allOf": [{"type": "string"}, {"minLength": 2}]})),
    ("an allOf on a string", _schema({"type": "string", "allOf": [{"minLength": 2}]})),
    ("a strict that is not a boolean", {"type": "json_schema",
                                        "json_schema": {"schema": PERSON, "strict": "yes"}}),
]


@pytest.mark.parametrize(("what", "fmt"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_schema_that_cannot_be_used_is_400_naming_response_format(
        server: Server, what: str, fmt: object) -> None:
    for path, body in (("/v1/chat/completions", {"messages": ASK}),
                       ("/v1/completions", {"prompt": "x"})):
        for stream in (False, True):
            with server.http() as h:
                r = h.post(path, json={**body, "response_format": fmt, "stream": stream,
                                       "max_tokens": 5})
            assert r.status_code == 400, (what, r.text)
            err = r.json()["error"]
            assert err["param"] == "response_format", err
            assert err["message"].startswith("response_format: "), err
            assert "\n" not in err["message"] and len(err["message"]) < 300, err
            assert "Traceback" not in err["message"]
    assert server.alive(), server.log
    assert "error parsing grammar" not in server.log  # llama.cpp's print is kept in


@pytest.mark.parametrize(("schema", "says"), [
    ({"enum": "abc"}, "enum must be a non-empty list"),
    ({"type": "object", "properties": {"a": 5}}, "properties.a must be a schema"),
    ({"type": "array", "items": {"type": "object", "properties": {"b": {
        "type": "string", "maxLength": -3}}}}, "items.properties.b.maxLength must be"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength must be at most"),
    ({"type": "object", "required": ["b"], "properties": {"a": {}}}, "required names 'b'"),
    ({"type": ["string", 5]}, "type must be one of"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "allOf is supported only"),
])
def test_a_malformed_schema_is_named_in_json_schema_terms(server: Server, schema: object,
                                                          says: str) -> None:
    """The converter's own failures read as Python (``AttributeError: 'int' object has no
    attribute 'get'``), and some malformed schemas it took its own way (a string enum as
    its letters) and constrained the answer to what nobody asked for."""
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=5,
            response_format=_schema(schema))  # type: ignore[arg-type]
    message = caught.value.response.json()["error"]["message"]
    assert says in message, message
    assert "Error:" not in message and "object has no attribute" not in message, message


@pytest.mark.parametrize("pattern", ["^a]$", "^[a]]$", "^(a})$", "^x{2}}$"])
def test_a_stray_bracket_in_a_pattern_is_400_not_a_hung_server(server: Server,
                                                                pattern: str) -> None:
    """llama-cpp-python's converter loops forever on a ``]`` or ``}`` outside a class or
    a quantifier; it runs on the event loop, so one such request hung every client."""
    import httpx2 as httpx

    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=20.0) as h:
        r = h.post("/v1/chat/completions", json={
            "messages": ASK, "max_tokens": 5,
            "response_format": _schema({"type": "string", "pattern": pattern})})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "response_format" and "unmatched" in err["message"], err
        assert h.get("/health").status_code == 200
    ok = server.client().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=20, temperature=0,
        response_format=_schema({"type": "string", "pattern": r"^[a-z\]]{1,3}$"}))  # type: ignore[arg-type]
    assert (ok.choices[0].message.content or "").startswith('"')


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_pattern_with_a_top_level_alternation_answers_a_json_string(server: Server,
                                                                        seed: int) -> None:
    """The converter wrote ``^yes|no$`` as ``"\"" "yes" | "no" "\""``: the answer could
    be ``"yes`` (no closing quote) or ``no"``, not JSON."""
    r = server.client().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=10, seed=seed, temperature=1.0,
        response_format=_schema({"type": "string", "pattern": "^yes|no$"}))  # type: ignore[arg-type]
    text = r.choices[0].message.content or ""
    assert json.loads(text) in ("yes", "no"), text


def _sampled(server: Server, content: str, schema: object, max_tokens: int,
             temperature: float) -> Iterator[Any]:
    """The answers at four seeds, sampled from the whole vocabulary (top-k and min-p
    off) under ``schema``'s grammar: what sampling can reach, not only the likeliest."""
    client = server.client()
    for seed in range(4):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": content}],
            max_tokens=max_tokens, seed=seed, temperature=temperature, top_p=1.0,
            extra_body={"top_k": 0, "min_p": 0.0},
            response_format=_schema(schema))  # type: ignore[arg-type]
        yield r.choices[0]


@pytest.mark.parametrize("pattern", [r"^.{4}$", r"^[^@]{1,6}@[^@]{1,6}$",
                                     r"^\d{3}-\d{2}$", r"^\w{2,5}$"])
def test_a_pattern_answer_is_a_json_string_the_pattern_matches(server: Server,
                                                               pattern: str) -> None:
    """The converter copied ``.`` and ``[^@]`` between the string's quotes as they are,
    so the answer could hold a bare ``"``, backslash or newline (not JSON); and it passed
    ``\\d`` and ``\\w`` to llama.cpp, which refused the grammar."""
    import re

    for choice in _sampled(server, 'Say "hi" \\ "\n"', {"type": "string", "pattern": pattern},
                           40, 1.5):
        text = choice.message.content or ""
        assert choice.finish_reason == "stop", text
        value = json.loads(text)
        assert isinstance(value, str) and re.fullmatch(pattern[1:-1], value), text


@pytest.mark.parametrize("pattern", ['^a"b$', r"^\\$", r"^a\nb$", '^["a]$', r"^\bx$"])
def test_a_pattern_that_needs_a_json_escape_is_400(server: Server, pattern: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=5,
            response_format=_schema({"type": "string", "pattern": pattern}))  # type: ignore[arg-type]
    message = caught.value.response.json()["error"]["message"]
    assert "pattern" in message and "not supported" in message, message


BOUNDED = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3,
                                                 "maximum": 17}},
           "required": ["n"]}


@pytest.mark.parametrize("temperature", [0.0, 1.0, 1.5])
def test_an_integer_answer_keeps_within_the_schema_bounds(server: Server,
                                                          temperature: float) -> None:
    """The converter accepted ``minimum``/``maximum`` on an integer and wrote any
    integer: the answer could be 0 or 5000."""
    for choice in _sampled(server, "Pick a number: 0, 2 or 5000?", BOUNDED, 40, temperature):
        text = choice.message.content or ""
        assert choice.finish_reason == "stop", text
        value = json.loads(text)
        assert set(value) == {"n"} and type(value["n"]) is int, text
        assert 3 <= value["n"] <= 17, text


def test_integer_bounds_no_integer_meets_are_400(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=5, response_format=_schema(
                {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4}))  # type: ignore[arg-type]
    error = caught.value.response.json()["error"]
    assert error["param"] == "response_format"
    assert "allows no integer" in error["message"], error


MEASURED = {"type": "object", "required": ["x", "level", "note"], "properties": {
    "x": {"type": "number", "minimum": 2.5, "exclusiveMaximum": 7.25},
    "level": {"type": ["integer", "null"], "multipleOf": 5, "minimum": 5, "maximum": 50},
    "note": {"type": ["string", "null"], "maxLength": 4}}}


@pytest.mark.parametrize("temperature", [1.0, 1.5])
def test_a_number_answer_keeps_within_the_schema_bounds(server: Server,
                                                        temperature: float) -> None:
    """A number's bounds, a multipleOf and every type's keywords in a list of types
    were accepted and not enforced: ``x`` could be 0 and ``note`` any string."""
    whole = []
    for choice in _sampled(server, "Numbers: 0, 1.5, 99 or 7.3?", MEASURED, 80, temperature):
        text = choice.message.content or ""
        if choice.finish_reason == "length":  # a prefix, checked token by token
            continue
        value = json.loads(text, parse_float=Decimal)
        assert set(value) == {"x", "level", "note"}, text
        assert Decimal("2.5") <= Decimal(value["x"]) < Decimal("7.25"), text
        assert value["level"] is None or (type(value["level"]) is int
                                          and value["level"] % 5 == 0
                                          and 5 <= value["level"] <= 50), text
        assert value["note"] is None or (isinstance(value["note"], str)
                                         and len(value["note"]) <= 4), text
        whole.append(text)
    assert len(whole) >= 2, whole  # most answers end within max_tokens


@pytest.mark.parametrize(("schema", "says"), [
    ({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                "uniqueItems": True}}},
     "properties.tags.uniqueItems is not supported"),
    ({"type": "number", "multipleOf": 0.1, "maximum": 1}, "multipleOf 0.1 is not supported"),
    ({"type": "object", "minProperties": 1}, "minProperties is enforced only for an object"),
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
     "patternProperties is not supported"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "maxLength is not supported: "
     "beside pattern"),
    ({"type": "string", "if": {"maxLength": 2}, "then": {"pattern": "^a*$"}},
     "if is not supported"),
    ({"$defs": {"S": {"type": "string"}}, "$ref": "#/$defs/S", "maxLength": 2},
     "maxLength is not supported: beside $ref"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "enum": [{"a": "x"}]},
     "properties is not supported: beside enum"),
])
def test_a_keyword_a_grammar_cannot_enforce_is_400_naming_it(server: Server, schema: object,
                                                              says: str) -> None:
    """Accepted and not enforced, the answer could break the schema silently."""
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=5,
            response_format=_schema(schema))  # type: ignore[arg-type]
    error = caught.value.response.json()["error"]
    assert error["param"] == "response_format" and error["type"] == "invalid_request_error"
    assert says in error["message"] and "\n" not in error["message"], error


def test_an_allof_merging_objects_still_works(server: Server) -> None:
    """pydantic writes a model that inherits as an allOf of $refs and properties."""
    schema = {"$defs": {"Base": {"type": "object", "properties": {"name": {"type": "string"}},
                                 "required": ["name"]}},
              "allOf": [{"$ref": "#/$defs/Base"},
                        {"properties": {"age": {"type": "integer"}}, "required": ["age"]}]}
    r = server.client().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=100, temperature=0,
        response_format=_schema(schema))  # type: ignore[arg-type]
    assert _is_person(json.loads(r.choices[0].message.content or ""))


def test_a_raw_grammar_is_refused_not_ignored(server: Server) -> None:
    with pytest.raises(openai.BadRequestError, match="grammar"):
        server.client().chat.completions.create(model=MODEL, messages=ASK, max_tokens=5,
                                                extra_body={"grammar": "root ::= \"a\""})


def test_the_server_answers_after_the_hostile_schemas(server: Server) -> None:
    r = server.client().chat.completions.create(model=MODEL, messages=ASK, max_tokens=100,
                                                temperature=0,
                                                response_format=_person_format())  # type: ignore[arg-type]
    assert _is_person(json.loads(r.choices[0].message.content or ""))
    assert server.alive()
    assert "Traceback" not in server.log
