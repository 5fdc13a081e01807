"""Raw grammars that recurse on the left are refused naming the rule, and a schema's
``$ref`` names the subschema JSON Schema reads it as: against the ``$id`` around it, and
never a rule of the same name written for something else."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from moescope.engine import Engine, Sampling
from moescope.engine.grammar import GrammarError, left_recursion, schema_grammar
from moescope.util.resources import demo_model_path

ASK = [{"role": "user", "content": "Write some JSON."}]


@pytest.fixture
def demo(engine: Callable[..., Engine]) -> Engine:
    return engine(demo_model_path(), policy="exact", n_ctx=512)


def _values(e: Engine, schema: dict, seeds: range = range(3)) -> list:  # type: ignore[type-arg]
    """Answers (parsed) under ``schema``'s grammar, sampled at a few seeds."""
    out = []
    for seed in seeds:
        s = Sampling(temperature=1.0, max_tokens=200, seed=seed,
                     grammar=e.compile_grammar(schema_grammar(schema)))
        text = "".join(t.text for t in e.generate(ASK, s))
        assert e.last_answer.stop_reason == "eos", text
        out.append(json.loads(text))
    return out


@pytest.mark.parametrize(("grammar", "says"), [
    ('root ::= expr\nexpr ::= term | expr "+" term\nterm ::= [0-9]+',
     "rule 'expr' is left-recursive (expr -> expr before any text)"),
    ('root ::= a\na ::= b "x" | "y"\nb ::= a "z"',
     "rule 'a' is left-recursive (a -> b -> a before any text)"),
    ('root ::= list\nlist ::= ( item "," )* list | item\nitem ::= [a-z]',
     "rule 'list' is left-recursive (list -> list before any text)"),
    ('root ::= "b" | x\nx ::= ""? root "a"', "rule 'root' is left-recursive (root -> x -> "),
    # b may be empty only by way of c: llama.cpp missed this one and never returned
    ('root ::= s\ns ::= b s "x" | "y"\nb ::= c\nc ::= "z" | ',
     "rule 's' is left-recursive"),
    ('root ::= s\ns ::= x{0,3} s "!" | "y"\nx ::= "a"', "rule 's' is left-recursive"),
])
def test_left_recursion_is_refused_naming_the_rule(demo: Engine, grammar: str,
                                                   says: str) -> None:
    """It was "llama.cpp refused the grammar: left recursion or an empty rule"."""
    assert says in (left_recursion(grammar) or "")
    with pytest.raises(GrammarError) as err:
        demo.compile_grammar(grammar)
    assert str(err.value).startswith(f"llama.cpp refused the grammar: {says}")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("grammar", [
    'root ::= "x" root | "y"',
    'root ::= expr\nexpr ::= term ("+" term)*\nterm ::= [0-9]+ | "(" expr ")"',
    'root ::= x{1,3} root | "."\nx ::= "a"',
    'root ::= a\na ::= b? "x" a | "y"\nb ::= "z"',
    'root ::= s\ns ::= c s | "y"\nc ::= "z" | "w"',
    'root ::= "[" ( root ( "," root )* )? "]" | "0" # comment ::= root root',
])
def test_right_recursion_and_recursion_after_text_pass(demo: Engine, grammar: str) -> None:
    assert left_recursion(grammar) is None
    demo.compile_grammar(grammar).close()  # llama.cpp builds it


def test_a_ref_inside_a_subschema_with_an_id_is_read_against_that_id(demo: Engine) -> None:
    """``#/$defs/B`` inside ``$defs.A`` (whose ``$id`` makes it a resource of its own) is
    A's ``B`` (an integer), not the root's (a string): it was a KeyError from the
    converter."""
    schema = {"$id": "https://example.org/root",
              "$defs": {"A": {"$id": "https://example.org/a",
                              "$defs": {"B": {"type": "integer"}},
                              "type": "object", "properties": {"b": {"$ref": "#/$defs/B"}},
                              "required": ["b"], "additionalProperties": False},
                        "B": {"type": "string", "maxLength": 6}},
              "type": "object", "properties": {
                  "a": {"$ref": "a"},  # relative to the root's $id: A
                  "c": {"$ref": "https://example.org/a#/$defs/B"},
                  "d": {"$ref": "#/$defs/B"}},
              "required": ["a", "c", "d"], "additionalProperties": False}
    for value in _values(demo, schema):
        assert isinstance(value["a"]["b"], int) and isinstance(value["c"], int)
        assert isinstance(value["d"], str)


def test_refs_to_defs_of_one_name_and_a_property_of_that_name_stay_apart(
        demo: Engine) -> None:
    """The converter named a ``$ref``'s rule by the pointer's last part and took any rule
    of that name: ``b`` answered A's ``B`` (``{"x": 1}``), and the list's items the
    property ``item``'s object."""
    obj = {"type": "object", "additionalProperties": False}
    schema = {"$defs": {"A": {"$defs": {"B": {**obj, "properties": {"x": {"type": "integer"}},
                                              "required": ["x"]}}},
                        "B": {**obj, "properties": {"y": {"type": "boolean"}},
                              "required": ["y"]},
                        "item": {**obj, "properties": {"z": {"type": "null"}},
                                 "required": ["z"]}},
              **obj, "properties": {
                  "a": {"$ref": "#/$defs/A/$defs/B"}, "b": {"$ref": "#/$defs/B"},
                  "item": {**obj, "properties": {"q": {"type": "boolean"}},
                           "required": ["q"]},
                  "list": {"type": "array", "items": {"$ref": "#/$defs/item"},
                           "minItems": 1, "maxItems": 1}},
              "required": ["a", "b", "item", "list"]}
    for value in _values(demo, schema):
        assert set(value["a"]) == {"x"} and set(value["b"]) == {"y"}
        assert set(value["item"]) == {"q"} and value["list"] == [{"z": None}]


def test_a_root_ref_to_a_recursive_definition_works(demo: Engine) -> None:
    """pydantic's self-referencing model: ``{"$defs": {"Node": ...}, "$ref":
    "#/$defs/Node"}``. The converter resolves no ``$ref`` beside a root ``$ref``: the
    ``$ref`` inside ``Node`` was a KeyError."""
    schema = {"$defs": {"Node": {"type": "object", "additionalProperties": False,
                                 "properties": {"kids": {"type": "array", "maxItems": 1,
                                                         "items": {"$ref": "#/$defs/Node"}}},
                                 "required": ["kids"]}},
              "$ref": "#/$defs/Node"}
    for value in _values(demo, schema):
        while value["kids"]:
            value = value["kids"][0]
        assert value == {"kids": []}


@pytest.mark.parametrize(("schema", "says"), [
    ({"$defs": {"A": {"$id": "a.json", "type": "object",
                      "properties": {"b": {"$ref": "#/$defs/B"}}},
                "B": {"type": "string"}}, "$ref": "#/$defs/A"},
     r"\$defs.A.properties.b.\$ref '#/\$defs/B' points to nothing in the schema \(read "
     r"against its \$id, it is #/\$defs/A/\$defs/B\)"),
    ({"$defs": {"A": {"type": "integer"}}, "$ref": "#nowhere"},
     r"schema.\$ref '#nowhere' names no \$anchor of the schema"),
    ({"$id": "https://example.org/s", "$ref": "https://example.org/other#/x"},
     "only local \\$ref"),
])
def test_a_ref_that_cannot_be_resolved_is_one_line(schema: dict, says: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(GrammarError, match=says) as err:
        schema_grammar(schema)
    assert "\n" not in str(err.value)


def test_an_anchor_names_its_subschema() -> None:
    by_anchor = schema_grammar({"$defs": {"N": {"$anchor": "num", "type": "integer"}},
                                "type": "array", "items": {"$ref": "#num"}})
    by_pointer = schema_grammar({"$defs": {"N": {"type": "integer"}},
                                 "type": "array", "items": {"$ref": "#/$defs/N"}})
    assert by_anchor == by_pointer


def test_an_id_of_any_scheme_rebases_the_refs_inside_it() -> None:
    """A ``urn:`` ``$id`` (urljoin leaves ``#/...`` as it is against one) rebases as an
    ``https:`` one does."""
    def schema(own_id: str) -> dict:  # type: ignore[type-arg]
        return {"$defs": {"A": {"$id": own_id, "$defs": {"B": {"type": "integer"}},
                                "type": "object", "properties": {"b": {"$ref": "#/$defs/B"}},
                                "required": ["b"]},
                          "B": {"type": "string"}},
                "$ref": "#/$defs/A"}
    grammar = schema_grammar(schema("urn:example:a"))
    assert grammar == schema_grammar(schema("https://example.org/a"))
    assert "B ::= integer" in grammar.splitlines()
