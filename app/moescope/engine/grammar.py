"""Constrained output: JSON schemas turned into GBNF grammars and compiled for the loaded
vocabulary, checked so that no request can take the process down.

llama.cpp's grammar code is unforgiving. Its parser descends recursively into nested
groups (about 17,000 levels overflow an 8 MiB stack: a segfault), prints a failed parse
(and the whole grammar) to stderr, and its sampler ends the process (``GGML_ABORT`` or an
uncaught C++ exception through the C API) when a token the grammar does not allow is
accepted, which happens once the grammar allows no token of the vocabulary at all. So:

- a schema is bounded (bytes, nesting, the repetitions it asks for) before llama-cpp-
  python's converter (``json_schema_to_gbnf``) turns it into a grammar, and only local
  ``$ref`` pass (the converter would fetch ``https://`` ones when run under ``-O``);
- the grammar text is bounded (bytes, group nesting) before llama.cpp parses it, and it is
  parsed here first (:mod:`moescope.engine.gbnf`, llama.cpp's parser step for step), in
  the request's thread: a bad grammar is a :class:`GrammarError` (one line, llama.cpp's
  reason) before anything generates, and never reaches llama.cpp's parser, which would
  print it and the whole grammar to the process's stderr;
- during generation the grammar is not a member of llama-cpp-python's sampler chain (whose
  accept would abort): a logits processor masks the candidates with it, and the engine
  accepts each sampled token itself (:meth:`Grammar.accept`). When no candidate is left
  (the vocabulary cannot spell what the grammar needs) the processor lets only the end of
  generation through and marks the grammar :attr:`Grammar.dead_end`: the answer ends
  there instead of the process.

Checking every token of the vocabulary is what costs: tens of milliseconds a token for
Qwen3's 151,936 (bench/grammar_bench.py; a 4,096-token vocabulary: under 1 ms). So, as
llama.cpp's own sampler does in spirit, the mask checks the likeliest tokens first (the 16
with the highest logits, then 256, then 4,096) and keeps only those the grammar allows
when that provably samples what masking the whole vocabulary would: the sampler chain
after the mask (llama-cpp-python's: repeat penalty, then greedy, or top-k before anything
random) sees the same candidates in the same order. Otherwise (a grammar that wants what
the model does not, sampling without top-k) the whole vocabulary is checked, as before:
the answer is token for token the same either way (:meth:`Grammar.claim`).
"""

from __future__ import annotations

import ctypes
import json
import math
import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from moescope.engine.gbnf import parse_error
from moescope.engine.schema_rules import (
    BOUNDS,
    MAX_INTEGER_DIGITS,
    MAX_MULTIPLES,
    integer_range,
    integer_range_rule,
    json_type_of,
    misfit,
    multiples,
    multiples_rule,
    number_range_rule,
)
from moescope.util.errors import MoEScopeError

MAX_SCHEMA_BYTES = 64 << 10
"""A schema's size as compact JSON."""
MAX_SCHEMA_DEPTH = 32
"""Nested objects and arrays of a schema (ten levels of properties take 21)."""
MAX_REPEAT_COST = 4 << 20
"""Grammar text a schema's repetitions (``minLength``, ``maxItems``, ``{m,n}`` in a
``pattern``...) may make, estimated from above before converting: the converter writes a
repetition out in full, so ``"minItems": 10**9`` would take gigabytes."""
MAX_GRAMMAR_BYTES = 2 << 20
MAX_GROUP_DEPTH = 1000
"""Nested groups in a grammar: llama.cpp parses them recursively (an 8 MiB stack overflows
at about 17,000; a Windows thread's 1 MiB at about 2,000). ``"maxLength": 1000`` nests
1,000."""
MAX_ALTERNATIVES = 1000
"""Enum values and anyOf/oneOf branches in a schema (OpenAI's own limit for enums): each
is a parse stack the grammar checks every candidate token against, every token (5,000
took a 4,096-token vocabulary from 300 to 8 tokens/s)."""
TOP_TIERS = (16, 256, 4096)
"""How many of the likeliest tokens the mask checks first, then next, before the whole
vocabulary."""
_REPEAT_KEYS = ("minLength", "maxLength", "minItems", "maxItems")
_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


class GrammarError(MoEScopeError):
    """A schema or grammar that cannot constrain an answer (one line, says why)."""


def json_object_grammar() -> str:
    """Any JSON object (OpenAI's ``json_object`` response format)."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return str(JSON_GBNF)


def schema_grammar(schema: Any) -> str:
    """The GBNF grammar of the JSON values ``schema`` allows; :class:`GrammarError` for a
    schema that is not an object, is too large, or that the converter refuses (whatever
    it raises)."""
    recursive = False
    if isinstance(schema, dict):
        try:  # a copy, whose patterns may be grouped
            schema = json.loads(json.dumps(schema))
        except (ValueError, RecursionError):
            raise GrammarError("the schema nests too deeply") from None
        recursive = any(node["$ref"] == "#" for node in _rebase_refs(schema))
    for node in check_schema(schema):
        node["pattern"] = _grouped(_json_safe(node["pattern"]))
    if recursive:  # after the checks, whose messages name the places the client wrote
        schema = _root_as_def(schema)
    try:
        text = _convert(schema)
    except RecursionError:
        raise GrammarError("the schema nests too deeply to turn into a grammar") from None
    except GrammarError:
        raise
    except Exception as err:  # the converter asserts, KeyErrors, TypeErrors...
        raise GrammarError(f"the schema cannot be turned into a grammar: "
                           f"{_one_line(f'{type(err).__name__}: {err}')}") from None
    check_grammar(text)
    if recursive and left_recursion(text) is not None:
        raise GrammarError('a $ref "#" recurses to the root schema before any JSON text '
                           '(the root is a $ref "#", or an anyOf/oneOf/allOf holding one): '
                           "it describes no JSON value")
    return str(text)


_SCHEMA_MAP_KEYS = ("properties", "patternProperties", "$defs", "definitions",
                    "dependentSchemas")
_SCHEMA_KEYS = ("items", "additionalProperties", "additionalItems", "not", "if", "then",
                "else", "contains", "propertyNames", "unevaluatedItems",
                "unevaluatedProperties", "contentSchema")
_SCHEMA_LIST_KEYS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


ROOT_DEF = "moescope-root"
"""The name of the root schema under ``$defs`` when a ``$ref`` recurses to it (``#``)."""


def _root_as_def(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema``, whose ``$ref`` (made pointers from its root by :func:`_rebase_refs`)
    include ``#``, the root itself (a tree whose children are trees), moved under
    ``$defs`` with every pointer with it: the converter resolves only ``#/...``, and a
    ``$ref`` to a ``$defs`` entry becomes a rule that may recur (``#`` was a 400)."""
    stack: list[Any] = [schema]
    while stack:  # every $ref, wherever it is: they all point from the root
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
                node["$ref"] = f"#/$defs/{ROOT_DEF}{ref[1:]}"
            stack.extend(v for k, v in node.items() if k not in ("enum", "const"))
    return {"$defs": {ROOT_DEF: schema}, "$ref": f"#/$defs/{ROOT_DEF}"}


def _rebase_refs(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ``$ref`` of ``schema`` made a pointer from its root, in place, as JSON Schema
    reads it: against the ``$id`` of the nearest subschema around it that has one (a
    ``#/$defs/B`` inside ``{"$id": "https://x/a", "$defs": {"B": ...}}`` is that
    subschema's ``B``, not the root's), and a ``$ref`` to such an ``$id`` (``a`` or
    ``https://x/a#/properties/b``) or to an anchor (``$anchor``, or an ``$id`` of
    ``#name``) is the subschema it names. The converter resolved every ``#/...`` against
    the root: the wrong subschema, or a KeyError. A ``$ref`` that points to nothing in the
    schema is refused here, naming it; one to another document is left to
    :func:`check_schema`, which refuses it. Returns the subschemas that have a
    ``$ref``."""
    from urllib.parse import urldefrag, urljoin

    def own_id(node: dict[str, Any], base: str) -> str | None:
        value = node.get("$id")
        if isinstance(value, str) and value and not value.startswith("#"):
            return str(urldefrag(urljoin(base, value))[0])
        return None

    root_base = own_id(schema, "") or ""
    resources: dict[str, list[str]] = {root_base: []}
    anchors: dict[tuple[str, str], list[str]] = {}
    refs: list[tuple[dict[str, Any], list[str], str]] = []
    stack: list[tuple[Any, list[str], str]] = [(schema, [], "")]
    while stack:
        node, path, base = stack.pop()
        if not isinstance(node, dict):
            continue
        resource = own_id(node, base) if path else root_base
        if resource is not None:
            base = resource
            resources.setdefault(base, path)
        for key in ("$anchor", "$id"):
            name = node.get(key)
            if isinstance(name, str) and (key == "$anchor" or name.startswith("#")):
                anchors.setdefault((base, name.lstrip("#")), path)
        if isinstance(node.get("$ref"), str):
            refs.append((node, path, base))
        for key in _SCHEMA_MAP_KEYS:
            if isinstance(node.get(key), dict):
                stack.extend((v, [*path, key, k], base) for k, v in node[key].items())
        for key in _SCHEMA_KEYS:
            if isinstance(node.get(key), dict):
                stack.append((node[key], [*path, key], base))
        for key in _SCHEMA_LIST_KEYS:
            if isinstance(node.get(key), list):
                stack.extend((v, [*path, key, str(i)], base) for i, v in enumerate(node[key]))
    for node, path, base in refs:
        ref = node["$ref"]
        # a fragment alone is the current resource's, whatever its $id's scheme (urljoin
        # leaves "#/..." as it is against a urn:)
        doc, fragment = (base, ref[1:]) if ref.startswith("#") \
            else urldefrag(urljoin(base, ref))
        if doc not in resources:
            continue  # another document's: check_schema refuses it
        if fragment and not fragment.startswith("/"):
            target = anchors.get((doc, fragment))
            if target is None:
                raise GrammarError(f"{_where(path)}.$ref {_short(ref)} names no $anchor of "
                                   "the schema")
            fragment = ""
        else:
            target = resources[doc]
        if any("/" in part or "~" in part for part in target):
            raise GrammarError(f"{_where(path)}.$ref {_short(ref)}: a $ref through a key "
                               "holding '/' or '~' is not supported")
        pointer = "#" + "".join(f"/{part}" for part in target) + fragment
        if _local_target(schema, pointer) is None:
            read = f" (read against its $id, it is {pointer})" if pointer != ref else ""
            raise GrammarError(f"{_where(path)}.$ref {_short(ref)} points to nothing in the "
                               f"schema{read}")
        node["$ref"] = pointer
    return [node for node, _, _ in refs]


def _where(path: list[str]) -> str:
    """A subschema's place as messages name it (``properties.age``), ``schema`` for the
    root."""
    return ".".join(path) or "schema"


def _convert(schema: dict[str, Any]) -> str:
    """llama-cpp-python's ``json_schema_to_gbnf``, with the keywords it accepts but does
    not enforce enforced (what cannot be, :func:`_check_values` refused before):

    - an integer's or a number's bounds: the digit strings of its range
      (:func:`~moescope.engine.schema_rules.integer_range_rule`,
      :func:`~moescope.engine.schema_rules.number_range_rule`), a whole ``multipleOf``
      the tree of its multiples within them (the converter wrote any number);
    - a list of types: each type with the schema's other keywords, as alternatives (the
      converter made each a bare ``{"type": ...}``), or the schema's ``enum``/``const``
      (already kept to the values of those types);
    - ``minProperties``/``maxProperties`` of an object whose properties are all listed:
      how many of its optional properties it takes (:func:`_counted_object`).

    A schema with ``$ref``, ``anyOf`` or ``oneOf`` is the converter's: it reads nothing
    else there."""
    from llama_cpp.llama_grammar import (
        PRIMITIVE_RULES,
        RESERVED_NAMES,
        BuiltinRule,
        SchemaConverter,
    )

    class Converter(SchemaConverter):  # type: ignore[misc]
        def visit(self, node: Any, name: str) -> Any:
            if not isinstance(node, dict) or any(k in node for k in _FIRST):
                return super().visit(node, name)
            rule = name + "-" if name in RESERVED_NAMES else name or "root"
            if node.get("items") == {}:  # any items (the converter took {} for none given)
                node = {**node, "items": {"type": list(_ANY_TYPE)}}
            kind = node.get("type")
            if isinstance(kind, list):
                rest = {k: v for k, v in node.items() if k != "type"}
                if "const" in node or "enum" in node:
                    return super().visit(rest, name)
                members = [{**rest, "type": t} for t in kind]
                return self._add_rule(rule, self._generate_union_rule(name, members))
            if "const" in node or "enum" in node:
                return super().visit(node, name)
            if kind in ("integer", "number"):
                body = _numeric_rule(node)
                if body is not None:
                    return self._add_rule(rule, body)
            if kind in (None, "object") and "properties" in node and _counted(node):
                return self._add_rule(rule, _counted_object(self, node, name))
            if kind in (None, "string") and node.get("format") == "ipv4" \
                    and "pattern" not in node:
                return self._add_rule(rule, _IPV4)
            if kind == "string" and not any(k in node for k in ("pattern", "format")) \
                    and max(node.get("minLength", 0), node.get("maxLength", 0)) > _SPLIT:
                return self._add_rule(rule, _long_string(self, node))
            return super().visit(node, name)

        def _build_object_rule(self, properties: Any, required: Any, name: str,
                               additional_properties: Any) -> str:
            """The converter's, with an extra property's key none of the listed names
            (:func:`_other_key`; it was any string: ``{"a": "x"}`` passed as an extra
            where ``a`` must be an integer), a comma before the extras that follow an
            optional property (the converter wrote none: ``{"a":1"b":2}``, and
            ``{"a":1}`` was no answer at all), and extras of any type where
            ``additionalProperties`` is true or ``{}`` (the converter's were objects)."""
            prefix = f"{name}{'-' if name else ''}"
            kv = _property_rules(self, properties, prefix)
            firsts = [kv[p] for p, _ in properties if p in required]
            optional = [p for p, _ in properties if p not in required]
            if additional_properties is True or isinstance(additional_properties, dict):
                extra = f"{prefix}additional"
                free = additional_properties is True or not additional_properties
                value = self.visit({"type": list(_ANY_TYPE)} if free
                                   else additional_properties, f"{extra}-value")
                key = _other_key(self, f"{extra}-name", [p for p, _ in properties]) \
                    if properties else self._add_primitive("string", PRIMITIVE_RULES["string"])
                kv["*"] = self._add_rule(f"{extra}-kv", f'{key} ":" space {value}')
                optional.append("*")
            rule = '"{" space ' + ' "," space '.join(firsts)
            if optional:

                def chain(keys: list[str], first_optional: bool) -> str:
                    k, *rest = keys
                    more = f'( "," space {kv[k]} )'
                    if first_optional:
                        out = more + ("*" if k == "*" else "?")
                    else:
                        out = kv[k] + (f" {more}*" if k == "*" else "")
                    if rest:
                        out += " " + self._add_rule(f"{prefix}{k}-rest", chain(rest, True))
                    return out

                alternatives = " | ".join(chain(optional[i:], False)
                                          for i in range(len(optional)))
                rule += f' ( "," space ( {alternatives} ) )?' if firsts \
                    else f" ( {alternatives} )?"
            return rule + ' "}" space'

        def _resolve_ref(self, ref: str) -> str:
            """The rule of a ``$ref``'s target, named once per ``$ref``: the converter
            named it by the pointer's last part and took any rule of that name as the
            target's, so ``#/$defs/A/$defs/B`` and ``#/$defs/B`` were one rule (the
            first resolved), and a ``$ref`` to ``#/$defs/item`` was the rule of a
            property ``item`` written before it: answers the schema does not allow."""
            names: dict[str, str] = self.__dict__.setdefault("_ref_rules", {})
            name = names.get(ref)
            if name is not None:  # resolved, or being resolved (a recursive schema)
                return name
            base = re.sub(r"[^a-zA-Z0-9-]+", "-", ref.split("/")[-1]) or "ref"
            name, i = base, 0
            taken = set(names.values())
            while name in self._rules or name in RESERVED_NAMES or name in taken:
                i += 1
                name = f"{base}-{i}"
            names[ref] = name
            rule = self.visit(self._refs[ref], name)
            if rule != name and name not in self._rules:  # a primitive: named as asked
                self._rules[name] = rule
            return name

        def _add_primitive(self, name: str, rule: Any) -> Any:
            if name == "char":  # the converter's let a string hold raw control characters
                rule = BuiltinRule(_JSON_CHAR, [])
            elif name == "date":  # the converter's allowed 2023-02-31
                rule = BuiltinRule(_DATE, [])
            return super()._add_primitive(name, rule)

    converter = Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    # every $ref's target known before the converter reads them: it resolves none in a
    # subschema that has a $ref itself (a root $ref's target, pydantic's recursive models
    # and the root moved under $defs, kept theirs unresolved: a KeyError)
    for node in schema_refs(schema):
        ref = node["$ref"]
        if ref.startswith("#/"):
            target = _local_target(schema, ref)
            if target is not None:
                converter._refs[ref] = target
    converter.visit(converter.resolve_refs(schema, "stdin"), "")
    return str(converter.format_grammar())


_SPLIT = 500
"""A string's length bound above which its characters are written as GBNF repetitions
(``char{0,500}``, which llama.cpp expands itself), not the converter's nested groups: a
``maxLength`` of 2,083 (pydantic's ``HttpUrl``) nested 2,082 groups, past
:data:`MAX_GROUP_DEPTH`."""


MAX_STRING_LENGTH = 4096
"""The largest ``minLength``/``maxLength`` a string's grammar writes out (llama.cpp makes
a rule of each repetition: ``maxLength: 50000`` took minutes to compile)."""


def _long_string(converter: Any, node: dict[str, Any]) -> str:
    """A string of ``minLength`` to ``maxLength`` characters as repetitions of at most
    :data:`_SPLIT` each (below llama.cpp's bound of 2,000 on one): ``char{a,500}
    char{b,500}...``, whose lengths add up to every length in the range and no other."""
    from llama_cpp.llama_grammar import PRIMITIVE_RULES

    low, high = int(node.get("minLength", 0)), node.get("maxLength")
    if max(low, high or 0) > MAX_STRING_LENGTH:
        key = "maxLength" if (high or 0) > MAX_STRING_LENGTH else "minLength"
        raise GrammarError(f"a string's {key} above {MAX_STRING_LENGTH} is not supported "
                           f"(got {node[key]})")
    char = converter._add_primitive("char", PRIMITIVE_RULES["char"])
    parts = []
    while (high is None and low > _SPLIT) or (high is not None and high > 0):
        top = _SPLIT if high is None else min(high, _SPLIT)
        least = min(low, top)
        parts.append(f"{char}{{{least},{top}}}")
        low -= least
        if high is not None:
            high -= top
    if high is None:
        parts.append(f"{char}{{{low},}}")
    return '"\\"" ' + " ".join(parts) + ' "\\"" space'


_JSON_CHAR = (r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] '
              r'[0-9a-fA-F] [0-9a-fA-F])')
"""A character of a JSON string: the converter's ``char`` without the control
characters (a raw tab or newline in a string is not JSON: the answer failed to parse)."""
_PLAIN_EXCLUDED = '"\\\\\\x7F\\x00-\\x1F'
"""What a JSON string's character without an escape is not, as a class's members."""


def _other_key(converter: Any, base: str, names: list[str]) -> str:
    """A rule's name for the key of an extra property beside the listed ``names``: a JSON
    string of characters without escapes that is none of them (a trie of the names:
    at each prefix, a character no name continues it with and then any, or one a name
    does and the rest from there; the prefix itself only where it is no name).
    Iterative, children before their parent: a name may be long."""
    char = converter._add_rule("key-char", f"[^{_PLAIN_EXCLUDED}]")
    trie: dict[Any, Any] = {}
    for name in names:
        if any(c in '"\\' or ord(c) < 0x20 or c == "\x7f" for c in name):
            continue  # written with an escape: a key without one is never it
        node = trie
        for c in name:
            node = node.setdefault(c, {})
        node[None] = {}
    rules: dict[int, str] = {}
    count = 0
    stack: list[tuple[dict[Any, Any], bool]] = [(trie, False)]
    while stack:
        node, ready = stack.pop()
        children = sorted(c for c in node if c is not None)
        if not ready:
            stack.append((node, True))
            stack.extend((node[c], False) for c in children)
            continue
        members = "".join("\\" + c if c in "]-" else c for c in children)
        alternatives = [f"[^{_PLAIN_EXCLUDED}{members}] {char}*"]
        alternatives += [f'"{c}" {rules[id(node[c])]}' for c in children]
        body = f"({' | '.join(alternatives)}){'' if None in node else '?'}"
        rules[id(node)] = converter._add_rule(f"{base}-key-{count}", body)
        count += 1
    return f'"\\"" {rules[id(trie)]} "\\"" space'


_OCTET = '("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9])'
_IPV4 = '"\\"" ' + ' "." '.join([_OCTET] * 4) + ' "\\"" space'
"""An IPv4 address as JSON Schema's ``ipv4`` format (RFC 2673's dotted-quad): four
numbers from 0 to 255, without leading zeros."""
_DATE = ('[0-9] [0-9] [0-9] [0-9] "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [1-2] [0-9] '
         '| "3" [0-1]) | ("0" [469] | "11") "-" ("0" [1-9] | [1-2] [0-9] | "30") | "02-" '
         '("0" [1-9] | "1" [0-9] | "2" [0-8])) | ([0-9] [0-9] ("0" [48] | [2468] [048] | '
         '[13579] [26]) | ([02468] [048] | [13579] [26]) "00") "-02-29"')
"""A date as RFC 3339's ``full-date``: each month's days, and February's 29th in leap
years only (a year divisible by 4, and by 400 where by 100)."""
_ANY_TYPE = ("object", "array", "string", "number", "boolean", "null")
"""Every JSON value's type: what an empty schema of items allows."""
_FIRST = ("$ref", "anyOf", "oneOf")
"""Keywords the converter reads before anything else of a schema (and then nothing
else)."""


def _numeric_rule(node: dict[str, Any]) -> str | None:
    """The rule of an integer or number schema with bounds or ``multipleOf`` (checked
    by :func:`_check_values`); None where the converter's own will do."""
    step = node.get("multipleOf")
    whole = node["type"] == "integer" or step is not None
    if step is not None and int(step) > 1:
        return multiples_rule(*multiples(node, int(step)), int(step))
    if whole and (step is not None or any(k in node for k in BOUNDS)):
        return integer_range_rule(*integer_range(node))
    if any(k in node for k in BOUNDS):
        return number_range_rule(node)
    return None


def _extra_properties(node: dict[str, Any]) -> bool:
    """Whether the converter lets an object schema have properties it does not list."""
    if "properties" in node or ("additionalProperties" in node
                                and node["additionalProperties"] is not True):
        return node.get("additionalProperties") is True \
            or isinstance(node.get("additionalProperties"), dict)
    return "allOf" not in node


def _counted(node: dict[str, Any]) -> bool:
    """Whether ``minProperties``/``maxProperties`` say more than an object schema's
    ``required`` and ``properties`` do."""
    required = len(set(node.get("required", [])))
    listed = len(node.get("properties", {})) if isinstance(node.get("properties"), dict) \
        else 0
    most = node.get("maxProperties")
    if node.get("minProperties", 0) > required:
        return True
    return most is not None and (_extra_properties(node) or most < listed)


def _property_rules(converter: Any, properties: list[tuple[str, Any]], prefix: str
                    ) -> dict[str, str]:
    """Each listed property's ``"name": value`` rule, as the converter names it."""
    kv = {}
    for prop, sub in properties:
        value = converter.visit(sub, f"{prefix}{prop}")
        kv[prop] = converter._add_rule(
            f"{prefix}{prop}-kv",
            f'{converter._format_literal(json.dumps(prop))} space ":" space {value}')
    return kv


def _counted_object(converter: Any, node: dict[str, Any], name: str) -> str:
    """An object schema's rule, as the converter writes it (its required properties,
    then its optional ones in order, each at most once), taking only as many optional
    properties as ``minProperties`` and ``maxProperties`` leave: one rule for each
    optional property and how many more may and must come after it."""
    properties = list(node["properties"].items())
    required = set(node.get("required", []))
    prefix = f"{name}{'-' if name else ''}"
    kv = _property_rules(converter, properties, prefix)
    firsts = [kv[p] for p, _ in properties if p in required]
    optional = [kv[p] for p, _ in properties if p not in required]
    least = max(0, node.get("minProperties", 0) - len(firsts))
    most = len(optional) if node.get("maxProperties") is None \
        else node["maxProperties"] - len(firsts)
    memo: dict[tuple[int, int, int, bool], tuple[str | None, bool]] = {}

    def rest(i: int, least: int, most: int, comma: bool) -> tuple[str | None, bool]:
        """Optional properties from the ``i``-th on, from ``least`` to ``most`` of
        them: a rule's name for one or more (None: none will do), and whether none
        will do."""
        most = min(most, len(optional) - i)
        key = (i, least, most, comma)
        if key in memo:
            return memo[key]
        if least > most:
            memo[key] = None, False
            return memo[key]
        if most == 0:
            memo[key] = None, True
            return memo[key]
        branches = []
        taken, bare = rest(i + 1, max(0, least - 1), most - 1, True)
        head = ('"," space ' if comma else "") + optional[i]
        branches.append(head + (f" ({taken}){'?' if bare else ''}" if taken else "")
                        if taken or bare else None)
        skipped, empty = rest(i + 1, least, most, comma)
        if skipped:
            branches.append(skipped)
        body = " | ".join(b for b in branches if b)
        rule = converter._add_rule(f"{prefix}more-{i}-{least}-{most}-{int(comma)}", body) \
            if body else None
        memo[key] = rule, empty
        return memo[key]

    taken, bare = rest(0, least, most, bool(firsts))
    tail = f" ({taken}){'?' if bare else ''}" if taken else ""
    return '"{" space ' + ' "," space '.join(firsts) + tail + ' "}" space'


def check_schema(schema: Any) -> list[dict[str, Any]]:
    """The bounds of :func:`schema_grammar`, checked without recursion; returns the
    subschemas that have a ``pattern``."""
    if not isinstance(schema, dict):
        raise GrammarError(f"the schema must be a JSON object, got {type(schema).__name__}")
    try:
        size = len(json.dumps(schema, separators=(",", ":")))
    except (ValueError, RecursionError):
        raise GrammarError("the schema nests too deeply") from None
    if size > MAX_SCHEMA_BYTES:
        raise GrammarError(f"the schema has {size} bytes; at most {MAX_SCHEMA_BYTES}")
    patterned = _check_keywords(schema)
    cost = alternatives = 0
    stack: list[tuple[Any, int, int]] = [(schema, 1, 0)]  # node, depth, key characters
    while stack:
        node, depth, chars = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise GrammarError(f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        if isinstance(node, list):
            stack.extend((v, depth + 1, chars) for v in node if isinstance(v, dict | list))
            continue
        for key, value in node.items():
            if key == "$ref" and not (isinstance(value, str) and value.startswith("#")):
                raise GrammarError(f"only local $ref (#/...) are supported, got "
                                   f"{_short(value)}")
            name = chars + len(key) + 64  # rule names grow with the path's keys
            if key in ("enum", "anyOf", "oneOf") and isinstance(value, list):
                alternatives += len(value)
                if alternatives > MAX_ALTERNATIVES:
                    raise GrammarError(f"the schema has more than {MAX_ALTERNATIVES} enum "
                                       "values and anyOf/oneOf branches")
            if key in _REPEAT_KEYS and isinstance(value, int):
                cost += max(value, 0) * name
            elif key == "pattern" and isinstance(value, str):
                cost += _pattern_repeats(value) * (name + len(value))
            if isinstance(value, dict | list):
                stack.append((value, depth + 1, chars + len(key) + 1))
        if cost > MAX_REPEAT_COST:
            raise GrammarError("the schema asks for too many repetitions (minLength, "
                               "maxLength, minItems, maxItems, {m,n} in patterns) to "
                               "turn into a grammar")
    return patterned


_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
_COUNTS = (("minLength", "maxLength"), ("minItems", "maxItems"),
           ("minProperties", "maxProperties"))
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def _check_keywords(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The keywords the converter reads, of the types JSON Schema gives them, and bounds
    that some value can meet: the converter would otherwise fail with a bare Python error
    (``'int' object has no attribute 'get'``) or, worse, read a wrong type its own way
    (``"enum": "abc"`` as three letters, ``"required": "ab"`` as two names) and constrain
    the answer to something the client never asked for. Without recursion (the depth is
    bounded after). Returns the subschemas that have a ``pattern``."""
    patterned: list[dict[str, Any]] = []
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict):
            where = path or "the schema"
            raise GrammarError(f"{where} must be a schema (a JSON object), got "
                               f"{_short(node)}")

        def bad(key: str, what: str, node: dict[str, Any] = node,
                path: str = path) -> GrammarError:
            return GrammarError(f"{path + '.' if path else ''}{key} must be {what}, got "
                                f"{_short(node[key])}")

        kind = node.get("type")
        if kind is not None:
            kinds = kind if isinstance(kind, list) else [kind]
            if not kinds or not all(isinstance(k, str) and k in _TYPES for k in kinds):
                raise bad("type", f"one of {', '.join(_TYPES)} (or a non-empty list of "
                                  "them)")
        if "enum" in node and (not isinstance(node["enum"], list) or not node["enum"]):
            raise bad("enum", "a non-empty list of values")
        required = node.get("required")
        if required is not None:
            if not isinstance(required, list) \
                    or not all(isinstance(name, str) for name in required):
                raise bad("required", "a list of property names")
            props = node.get("properties")
            missing = [n for n in required if not isinstance(props, dict) or n not in props]
            if missing:
                raise GrammarError(f"{path + '.' if path else ''}required names "
                                   f"{_short(missing[0])}, which properties does not "
                                   "define (the grammar is built from properties)")
        for key in ("pattern", "format"):
            if key in node and not isinstance(node[key], str):
                raise bad(key, "a string")
        _unknown_format(node)
        if isinstance(node.get("pattern"), str):
            _check_pattern(node["pattern"], f"{path + '.' if path else ''}pattern")
            patterned.append(node)
        for low, high in _COUNTS:
            for key in (low, high):
                value = node.get(key)
                if key in node and (isinstance(value, bool) or not isinstance(value, int)
                                    or value < 0):
                    raise bad(key, "a whole number from 0")
            if isinstance(node.get(low), int) and isinstance(node.get(high), int) \
                    and node[low] > node[high]:
                raise bad(low, f"at most {high} ({node[high]})")
        for key in BOUNDS:
            value = node.get(key)
            if key in node and (isinstance(value, bool) or not isinstance(value, int | float)
                                or (isinstance(value, float) and not math.isfinite(value))):
                raise bad(key, "a number")
        if isinstance(node.get("minimum"), int | float) \
                and isinstance(node.get("maximum"), int | float) \
                and node["minimum"] > node["maximum"]:
            raise bad("minimum", f"at most maximum ({node['maximum']})")
        _check_supported(node, path, schema)
        _check_values(node, path)
        if "allOf" in node and not _merges_objects(node):
            raise GrammarError(f"{path + '.' if path else ''}allOf is supported only to "
                               "merge objects' properties (each part an object schema "
                               "with properties or a $ref); the converter would turn "
                               "the others into an object")
        prefix = path + "." if path else ""
        for key in _SCHEMA_MAPS:
            if key in node:
                if not isinstance(node[key], dict):
                    raise bad(key, "an object of schemas")
                stack.extend((v, f"{prefix}{key}.{name}") for name, v in node[key].items())
        for key in _SCHEMA_LISTS:
            if key in node:
                if not isinstance(node[key], list) or not node[key]:
                    raise bad(key, "a non-empty list of schemas")
                stack.extend((v, f"{prefix}{key}[{i}]") for i, v in enumerate(node[key]))
        for key in ("items", "additionalProperties"):
            value = node.get(key)
            if isinstance(value, list) and key == "items":  # draft 4's tuple form
                stack.extend((v, f"{prefix}{key}[{i}]") for i, v in enumerate(value))
            elif isinstance(value, dict):
                stack.append((value, f"{prefix}{key}"))
            elif key in node and not isinstance(value, bool):
                raise bad(key, "a schema or a boolean")
    return patterned


_ANNOTATIONS = frozenset({
    "title", "description", "examples", "default", "$comment", "$schema", "$id", "$anchor",
    "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding",
    "contentSchema", "discriminator", "nullable", "$defs", "definitions"})
"""Keywords that constrain nothing the grammar writes: annotations, definitions (checked
where they are referenced), OpenAPI's ``discriminator`` (the branches say it) and
``nullable`` (it only widens what the grammar allows)."""
_ENFORCED = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "items",
    "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format",
    *BOUNDS, "multipleOf", "minProperties", "maxProperties", "uniqueItems", "anyOf",
    "oneOf", "allOf", "$ref"})
"""Keywords the grammar enforces (where :func:`_check_supported` and
:func:`_check_values` let them through) or refuses in their own words."""
FORMATS = ("date", "time", "date-time", "uuid", "ipv4")
"""String formats the grammar enforces as they are defined (``uuid1`` to ``uuid5`` as
``uuid``)."""
FORMAT_PATTERNS = {
    "email": (r"^[A-Za-z0-9_%+-][A-Za-z0-9._%+-]{0,30}@[A-Za-z0-9-]{1,30}[.][a-z]{2,6}$",
              6, 69),
    "uri": (r"^https?://[A-Za-z0-9-]{1,40}([.][a-z]{2,6})?(/[A-Za-z0-9._~%/-]{0,40})?$",
            8, 96),
}
"""Formats the grammar narrows to a plain form that meets them, with the shortest and the
longest string the form allows: an address ``name@domain.tld``; an ``http(s)://host/path``
URI, which pydantic's ``HttpUrl`` and ``AnyUrl`` both take. ``url`` and ``iri`` are read
as ``uri``, ``idn-email`` as ``email``. The form applies where no ``pattern`` is beside
the format and any ``minLength``/``maxLength`` holds every string of it (pydantic's
``HttpUrl`` has 1 and 2,083); otherwise the format is ignored, as any other is."""
_FORMAT_ALIASES = {"url": "uri", "iri": "uri", "idn-email": "email"}


def _unknown_format(node: dict[str, Any]) -> None:
    """A ``format`` the grammar does not enforce, as llama-server reads it: ignored (the
    string follows its other keywords), or, for an email address or a URI, the pattern of
    :data:`FORMAT_PATTERNS` (its lengths within the schema's, which it then replaces)."""
    fmt = node.get("format")
    if not isinstance(fmt, str) or fmt in FORMATS or re.fullmatch(r"uuid[1-5]", fmt):
        return
    del node["format"]
    form = FORMAT_PATTERNS.get(_FORMAT_ALIASES.get(fmt, fmt))
    if form is None or node.get("type", "string") != "string" \
            or any(key in node for key in ("pattern", "enum", "const")):
        return
    pattern, shortest, longest = form
    low, high = node.get("minLength", 0), node.get("maxLength", longest)
    if isinstance(low, int) and isinstance(high, int) and low <= shortest \
            and high >= longest:
        node.pop("minLength", None)
        node.pop("maxLength", None)
        node["pattern"] = pattern
_MEMBER_KEYWORDS = {"object": ("properties", "additionalProperties"),
                    "array": ("items", "prefixItems", "additionalItems"),
                    "string": ("format",)}
"""Keywords that :func:`~moescope.engine.schema_rules.misfit` does not check an
``enum``'s or ``const``'s values against, by the values' type."""


def _check_supported(node: dict[str, Any], path: str, root: dict[str, Any]) -> None:
    """Every keyword of ``node`` is one the grammar enforces here or an annotation
    (:data:`_ANNOTATIONS`), else a :class:`GrammarError` naming it: the converter skips
    what it does not read, and the answer could break the schema silently."""
    prefix = path + "." if path else ""

    def refuse(key: str, why: str) -> GrammarError:
        return GrammarError(f"{prefix}{key} is not supported: {why}")

    for key in node:
        if key not in _ENFORCED and key not in _ANNOTATIONS and not (
                key == "additionalItems" and isinstance(node.get("items"), list)):
            raise refuse(key, "the grammar cannot enforce it (drop it and check in the "
                              "client)")
    for first in ("$ref", "anyOf", "oneOf", "allOf"):
        if first in node:
            allowed = {"type"} if first == "allOf" else set()
            for key in node:
                if key != first and key not in _ANNOTATIONS and key not in allowed:
                    raise refuse(key, f"beside {first} the grammar follows only the "
                                      f"{first} (move it into the subschemas)")
    if "allOf" in node and _merges_objects(node):
        _check_merged(node, path, root)
    if isinstance(node.get("oneOf"), list) and all(isinstance(b, dict) for b in node["oneOf"]):
        _check_one_of(node["oneOf"], prefix, root)
    kind = node.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind} if kind else set()
    if "const" in node and "enum" in node:
        if not any(_json_equal(node["const"], v) for v in node["enum"]):
            raise GrammarError(f"{path or 'the schema'} allows no value: its const "
                               f"{_short(node['const'])} is not one of its enum values")
        del node["enum"]
    if "const" in node or "enum" in node:
        values = [node["const"]] if "const" in node else node["enum"]
        key = "const" if "const" in node else "enum"
        for value in values:
            if misfit(value, node) is not None:
                continue
            for member in _MEMBER_KEYWORDS.get(_json_kind(value), ()):
                if member in node:
                    raise refuse(member, f"beside {key} its values are not checked "
                                         f"against it (list only values that meet it, "
                                         f"and drop {member})")
        return
    strings = not kinds or "string" in kinds
    if strings:
        shape = "pattern" if "pattern" in node else "format" if "format" in node else None
        for key in ("minLength", "maxLength"):
            if shape and key in node:
                raise refuse(key, f"beside {shape} the grammar follows only the {shape}")
        if "pattern" in node and "format" in node:
            raise refuse("format", "beside pattern the grammar follows only the pattern")
    if not kinds or "array" in kinds:
        items = node.get("items")
        tuple_items = items if isinstance(items, list) else node.get("prefixItems") \
            if isinstance(node.get("prefixItems"), list) and items in (None, False) else None
        if "prefixItems" in node and items not in (None, False):
            raise refuse("prefixItems", "beside items the grammar follows only the items")
        if isinstance(tuple_items, list):
            n = len(tuple_items)
            for key in ("minItems", "maxItems"):
                bound = node.get(key)
                if isinstance(bound, int) and (n < bound if key == "minItems" else n > bound):
                    raise refuse(key, f"the grammar writes the {n} items of "
                                      f"{'items' if isinstance(items, list) else 'prefixItems'}"
                                      ", no more or fewer")


def _json_kind(value: Any) -> str:
    return "object" if isinstance(value, dict) else "array" if isinstance(value, list) \
        else "string" if isinstance(value, str) else "other"


def _json_equal(a: Any, b: Any) -> bool:
    """Equal as JSON values (``1`` and ``1.0`` too)."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _check_merged(node: dict[str, Any], path: str, root: dict[str, Any]) -> None:
    """An ``allOf`` the converter merges into one object, as it reads it: of each part
    (or its ``$ref``'s target, or each branch of its ``anyOf``) only ``properties``, all
    of them required (the branches' all optional), and no property beside them. So a
    part may hold nothing else that constrains (``additionalProperties``, bounds...), a
    branch no ``required`` (the answer might meet no branch), and no property may come
    from two places (the answer would hold its key twice)."""
    prefix = path + "." if path else ""
    seen: dict[str, str] = {}

    def part(sub: Any, where: str, branch: bool) -> None:
        ref = sub.get("$ref") if isinstance(sub, dict) else None
        if isinstance(ref, str):
            sub, where = _local_target(root, ref), f"{where} ($ref {ref})"
        if not isinstance(sub, dict):
            raise GrammarError(f"{where} must be an object schema to merge in allOf")
        if "anyOf" in sub and not branch and ref is None:  # (a target's it does not read)
            for i, b in enumerate(sub["anyOf"]):
                part(b, f"{where}.anyOf[{i}]", True)
            return
        allowed = {"type", "properties"} | (set() if branch else {"required"})
        for key in sub:
            if key not in allowed and key not in _ANNOTATIONS:
                raise GrammarError(f"{where}.{key} is not supported in allOf: the "
                                   "converter merges only the parts' properties")
        if sub.get("type") not in (None, "object") or "properties" not in sub:
            raise GrammarError(f"{where} must be an object schema with properties to "
                               "merge in allOf")
        for name in sub["properties"]:
            if name in seen:
                raise GrammarError(f"{where}.properties.{name} is defined in "
                                   f"{seen[name]} too: allOf merges each property once")
            seen[name] = where

    for i, sub in enumerate(node["allOf"]):
        part(sub, f"{prefix}allOf[{i}]", False)


def _check_one_of(branches: list[dict[str, Any]], prefix: str, root: dict[str, Any]) -> None:
    """The converter reads ``oneOf`` as ``anyOf``: an answer that two branches match
    would pass. So every two branches must provably exclude each other
    (:func:`_disjoint`), as a discriminated union's do."""
    resolved = [_resolved(root, b) for b in branches]
    for i in range(1, len(resolved)):
        for j in range(i):
            if not _disjoint(root, resolved[j], resolved[i]):
                raise GrammarError(
                    f"{prefix}oneOf[{j}] and {prefix}oneOf[{i}] could both match: oneOf "
                    "is enforced only where its branches exclude each other (different "
                    "types, or different const/enum values of a property both require); "
                    "use anyOf")


def _resolved(root: dict[str, Any], node: Any) -> Any:
    """``node``, or what its ``$ref`` (and theirs, a few deep) points to."""
    for _ in range(MAX_SCHEMA_DEPTH):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
            return node
        node = _local_target(root, node["$ref"])
    return None


def _kinds(node: dict[str, Any]) -> set[str] | None:
    """The JSON types a schema's values may have, as far as ``type``, ``const`` or
    ``enum`` say (an integer is a number too); None where they do not say."""
    if "type" in node:
        kind = node["type"]
        kinds = set(kind) if isinstance(kind, list) else {kind}
        return kinds | {"integer"} if "number" in kinds else kinds
    values = [node["const"]] if "const" in node else node.get("enum")
    if isinstance(values, list):
        return set().union(*(json_type_of(v) for v in values))
    return None


def _disjoint(root: dict[str, Any], a: Any, b: Any) -> bool:
    """Whether no value can meet both schemas, as far as their types, their
    ``const``/``enum`` values, or those of a property both require tell."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    ka, kb = _kinds(a), _kinds(b)
    if ka is not None and kb is not None and not ka & kb:
        return True
    va = [a["const"]] if "const" in a else a.get("enum")
    vb = [b["const"]] if "const" in b else b.get("enum")
    if isinstance(va, list) and isinstance(vb, list) \
            and not any(_json_equal(x, y) for x in va for y in vb):
        return True
    pa, pb = a.get("properties"), b.get("properties")
    if not (isinstance(pa, dict) and isinstance(pb, dict)):
        return False
    both = set(a.get("required") or []) & set(b.get("required") or [])
    return any(_disjoint(root, _resolved(root, pa.get(name)), _resolved(root, pb.get(name)))
               for name in sorted(both))


def schema_refs(*roots: Any) -> Iterator[dict[str, Any]]:
    """Every object in JSON schemas ``roots`` whose ``$ref`` is local text ("#..."), found
    in the schemas' own words (an ``enum``'s or a ``const``'s values are data, never read).
    A caller may change a node's ``$ref`` as it gets it."""
    stack: list[Any] = list(roots)
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                yield node
            stack.extend(v for k, v in node.items() if k not in ("enum", "const"))


def _local_target(root: dict[str, Any], ref: str) -> Any:
    """What a local ``$ref`` (``#/$defs/A``) points to in ``root``; None where nothing."""
    target: Any = root
    for sel in ref.split("#", 1)[-1].split("/")[1:]:
        sel = sel.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or sel not in target:
            return None
        target = target[sel]
    return target


def _check_values(node: dict[str, Any], path: str) -> None:
    """Keywords the converter accepts but does not enforce, as :func:`_convert` enforces
    them, or a :class:`GrammarError` naming the keyword where it cannot: a value that
    breaks them must never be the answer. Keeps an ``enum`` to the values its schema's
    other keywords allow (the converter writes them all)."""
    where = path or "the schema"
    prefix = path + "." if path else ""
    step = node.get("multipleOf")
    if "multipleOf" in node and (isinstance(step, bool) or not isinstance(step, int | float)
                                 or not math.isfinite(step) or step <= 0):
        raise GrammarError(f"{prefix}multipleOf must be a number above 0, got "
                           f"{_short(step)}")
    if "uniqueItems" in node and not isinstance(node["uniqueItems"], bool):
        raise GrammarError(f"{prefix}uniqueItems must be true or false, got "
                           f"{_short(node['uniqueItems'])}")
    if any(k in node for k in _FIRST):
        return  # the converter reads nothing else here
    if "const" in node or "enum" in node:
        key = "const" if "const" in node else "enum"
        values = [node["const"]] if key == "const" else node["enum"]
        kept = [v for v in values if misfit(v, node) is None]
        if not kept:
            raise GrammarError(f"{where} allows none of its {key} values: "
                               f"{_short(values[0])} does not meet its "
                               f"{misfit(values[0], node)}")
        if key == "enum":
            node["enum"] = kept
        return
    kind = node.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind} if kind else set()
    bounds = ", ".join(f"{k} {node[k]}" for k in BOUNDS if k in node)
    if kinds & {"integer", "number"} and "multipleOf" in node:
        if not float(step).is_integer():
            raise GrammarError(f"{prefix}multipleOf {step} is not supported: only a whole "
                               "number is enforced (of a fraction, decimal and binary "
                               "arithmetic disagree on what is a multiple)")
        if int(step) > 1:
            _, count = multiples(node, int(step))
            if count == 0:
                raise GrammarError(f"{where} allows no multiple of {int(step)} (of at "
                                   f"most {MAX_INTEGER_DIGITS} digits) within {bounds}")
            if count > MAX_MULTIPLES:
                raise GrammarError(f"{prefix}multipleOf {int(step)} is enforced only "
                                   f"where minimum and maximum leave at most "
                                   f"{MAX_MULTIPLES} multiples; these leave {count}")
    if bounds and ("integer" in kinds or ("number" in kinds and "multipleOf" in node)):
        low, high = integer_range(node)
        if low > high:
            raise GrammarError(f"{where} allows no integer (of at most "
                               f"{MAX_INTEGER_DIGITS} digits, as the grammar writes "
                               f"them) within {bounds}")
    if bounds and "number" in kinds and number_range_rule(node) is None:
        raise GrammarError(f"{where} allows no number (of at most {MAX_INTEGER_DIGITS} "
                           f"digits either side of the point) within {bounds}")
    arrays = "array" in kinds or (not kinds and ("items" in node or "prefixItems" in node))
    if node.get("uniqueItems") is True and arrays \
            and not (isinstance(node.get("maxItems"), int) and node["maxItems"] <= 1):
        raise GrammarError(f"{prefix}uniqueItems is not supported: a grammar cannot keep "
                           "an array's items distinct (drop it and check in the client)")
    objects = "object" in kinds or (not kinds and any(
        k in node for k in ("properties", "additionalProperties", "allOf")))
    if objects and _counted(node):
        listed = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        required = len(set(node.get("required", [])))
        least, most = node.get("minProperties", 0), node.get("maxProperties")
        key = "minProperties" if least > required else "maxProperties"
        if _extra_properties(node) or "allOf" in node:
            raise GrammarError(f"{prefix}{key} is enforced only for an object whose "
                               "properties are all listed (properties, and "
                               "additionalProperties false or absent)")
        if least > len(listed) or (most is not None and most < required):
            raise GrammarError(f"{where} allows no object: it lists {len(listed)} "
                               f"properties ({required} required) for minProperties "
                               f"{least}" + (f", maxProperties {most}"
                                             if most is not None else ""))


class _Token(NamedTuple):
    """A piece of a ``pattern`` as llama-cpp-python's converter reads it."""

    kind: str
    """``escape`` (a backslash and the character after it; alone at the end), ``class``
    (``[...]``), ``open`` and ``close`` (a group's parentheses), ``alternation`` (``|``),
    ``quantifier`` (``*``, ``+``, ``?`` or a ``{...}``) or ``literal`` (any other
    character, a stray ``]`` or ``}`` too)."""
    text: str
    """As written, a class's or ``{...}``'s closing bracket included where it has one."""
    at: int
    """Where it starts in the pattern."""
    closed: bool = True
    """A class or ``{...}`` that has its closing bracket (the others: True)."""

    def inner(self) -> str:
        """A class's members or a ``{...}``'s content: the text between the brackets."""
        return self.text[1:-1] if self.closed else self.text[1:]


_SINGLE = {"(": "open", ")": "close", "|": "alternation", "*": "quantifier",
           "+": "quantifier", "?": "quantifier"}


def _pattern_tokens(pattern: str, members: bool = False) -> Iterator[_Token]:
    """The tokens of ``pattern``, scanned as the converter does: a backslash takes the
    next character along, ``[`` runs to the next unescaped ``]`` and ``{`` to the next
    ``}`` (or each to the end). ``members``: ``pattern`` is a character class's
    members (:meth:`_Token.inner`), escapes and literals only."""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            yield _Token("escape", pattern[i:i + 2], i)
            i += 2
        elif members:
            yield _Token("literal", c, i)
            i += 1
        elif c in "[{":
            j = i + 1
            close = "]" if c == "[" else "}"
            while j < n and pattern[j] != close:
                j += 2 if c == "[" and pattern[j] == "\\" else 1
            closed = j < n
            end = j + 1 if closed else n
            yield _Token("class" if c == "[" else "quantifier", pattern[i:end], i, closed)
            i = end
        else:
            yield _Token(_SINGLE.get(c, "literal"), c, i)
            i += 1


def _check_pattern(pattern: str, where: str) -> None:
    """Refuse a ``]`` or ``}`` outside a character class or a ``{m,n}``: the converter
    reads it as neither a literal nor syntax and loops on it forever (``^a]$`` hung the
    request, and with it the server's event loop, at 100% CPU). And a ``{m,n}`` with
    ``n`` below ``m``, which is no regular expression (the converter wrote ``a{3,1}`` as
    ``aaa``)."""
    for token in _pattern_tokens(pattern):
        if token.kind == "literal" and token.text in "]}":
            c = token.text
            raise GrammarError(f"{where} has an unmatched {c!r} at character {token.at} "
                               f"(write \\{c} for the character itself)")
        if token.kind == "quantifier" and token.text[0] == "{":
            m = _QUANTIFIER.fullmatch(token.text)
            if m and m.group(2) and int(m.group(2)) < int(m.group(1)):
                raise GrammarError(f"{where} has {token.text} at character {token.at}: "
                                   "its maximum is below its minimum (not a regular "
                                   "expression)")


_UNSAFE = '"\\\\\\x00-\\x1F'
"""What a JSON string cannot hold unescaped, as a character class's members."""
_SHORTHANDS = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " "}
"""Shorthand classes as members of a class (llama.cpp's grammars have none; ``\\s``
keeps to the space, the one whitespace a JSON string holds unescaped)."""


def _json_safe(pattern: str) -> str:
    """``pattern`` rewritten so that the converter's grammar writes only what a JSON
    string holds unescaped. The converter copies a pattern's characters between the
    string's quotes as they are: ``.`` and ``[^@]`` allowed ``"``, ``\\`` and newlines
    (the answer ``"a"b"`` is not JSON), and it passed ``\\d``, ``\\w``, ``\\s`` on as
    escapes llama.cpp refuses ("left recursion or an empty rule"). So ``.`` and a negated
    class exclude those characters, the shorthands become classes (``\\D``, ``\\W``,
    ``\\S`` negated ones), and a pattern that can only match them (a literal ``"``, an
    escaped backslash, ``\\n``...) is refused: the answer would need an escape sequence
    the pattern does not spell."""
    def refuse(what: str) -> GrammarError:
        return GrammarError(f"pattern: {what} is not supported (a JSON string writes it "
                            "as an escape sequence, which the grammar cannot follow)")

    out: list[str] = []
    for token in _pattern_tokens(pattern):
        text = token.text
        if token.kind == "escape" and len(text) == 2:
            e = text[1]
            if e in _SHORTHANDS:
                out.append(f"[{_SHORTHANDS[e]}]")
            elif e.lower() in _SHORTHANDS:
                out.append(f"[^{_SHORTHANDS[e.lower()]}{_UNSAFE}]")
            elif e.isalnum() or e in '"\\':
                raise refuse(f"the escape \\{e}")
            else:
                out.append(text)
        elif token.kind == "class":
            out.append(_json_safe_class(token.inner(), refuse))
        elif token.kind == "quantifier" and text[0] == "{":  # its content as a pattern
            out.append("{" + _json_safe(token.inner()) + ("}" if token.closed else ""))
        elif text == '"':
            raise refuse('a literal "')
        elif text == ".":
            out.append(f"[^{_UNSAFE}]")
        else:
            if ord(text[0]) < 0x20:
                raise refuse(f"the control character {text!r}")
            out.append(text)
    return "".join(out)


def _json_safe_class(members: str, refuse: Callable[[str], GrammarError]) -> str:
    """A character class (its members, between the brackets) as :func:`_json_safe`
    writes it."""
    negated = members.startswith("^")
    body: list[str] = []
    for token in _pattern_tokens(members[negated:], members=True):
        m = token.text
        if len(m) == 2:  # an escape
            e = m[1]
            if e in _SHORTHANDS:
                body.append(_SHORTHANDS[e])
            elif e.isalnum() or e == "\\":
                raise refuse(f"the escape \\{e} in a character class")
            else:
                body.append(m)
        elif m == '"' or ord(m) < 0x20:
            raise refuse(f"{m!r} in a character class")
        else:
            body.append(m)
    text = "".join(body)
    return f"[^{_UNSAFE}{text}]" if negated else f"[{text}]"


def _grouped(pattern: str) -> str:
    """``^a|b$`` as ``^(a|b)$``: the converter takes what lies between the anchors as the
    whole string but writes a top-level ``|`` unbracketed between the quotes, so the
    grammar allowed ``"a`` or ``b"`` (not JSON). Grouped, it allows ``"a"`` or ``"b"``,
    which the pattern matches either way."""
    if not (pattern.startswith("^") and pattern.endswith("$")):
        return pattern  # the converter refuses it, with its own message
    body = pattern[1:-1]
    depth = 0
    for token in _pattern_tokens(body):
        if token.kind == "open":
            depth += 1
        elif token.kind == "close":
            depth -= 1
        elif token.kind == "alternation" and depth == 0:
            return f"^({body})$"
    return pattern


def _merges_objects(node: dict[str, Any]) -> bool:
    """Whether an ``allOf`` is what the converter reads it as: the properties of object
    schemas (or of a ``$ref`` to one, or of an ``anyOf``'s), merged into one object (as
    pydantic writes a model that inherits). Of anything else it builds an object all the
    same: ``allOf: [{"type": "string"}, ...]`` answered ``{}``."""
    parts = node["allOf"]
    if node.get("type") not in (None, "object") or not isinstance(parts, list):
        return False
    return all(isinstance(p, dict) and p.get("type") in (None, "object")
               and any(k in p for k in ("properties", "$ref", "anyOf")) for p in parts)


def _pattern_repeats(pattern: str) -> int:
    """An upper bound of how many times the converter writes a pattern's parts out: the
    product of its ``{m,n}`` counts (as if all were nested; one in a character class
    counts too)."""
    product = 1
    for token in _pattern_tokens(pattern):
        if token.kind not in ("quantifier", "class"):
            continue
        for low, high in _QUANTIFIER.findall(token.text):
            product *= max(int(low), int(high or 0)) + 1
            if product > MAX_REPEAT_COST:
                return product
    return product


def check_grammar(text: str) -> None:
    """Bounds llama.cpp's parser needs: size, and nesting of groups (outside literals and
    character classes)."""
    if len(text) > MAX_GRAMMAR_BYTES:
        raise GrammarError(f"the grammar has {len(text)} characters; at most "
                           f"{MAX_GRAMMAR_BYTES}")
    depth = deepest = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"[":
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and text[i] != close:
                i += 2 if text[i] == "\\" else 1
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
        i += 1
    if deepest > MAX_GROUP_DEPTH:
        raise GrammarError(f"the grammar nests {deepest} groups; at most {MAX_GROUP_DEPTH} "
                           "(a maxLength or maxItems above about 1000?)")


_GBNF_TOKEN = re.compile(r"""
    (?P<skip>(?:\s|\#[^\r\n]*)+)
  | (?P<defines>::=)
  | (?P<literal>"(?:[^"\\]|\\.)*")
  | (?P<cls>\[(?:[^\]\\]|\\.)*\])
  | (?P<name>[a-zA-Z0-9-]+)
  | (?P<rep>[*+?]|\{\s*\d*\s*(?:,\s*\d*\s*)?\})
  | (?P<other>.)""", re.VERBOSE | re.DOTALL)


def left_recursion(text: str) -> str | None:
    """Why ``text`` (a grammar llama.cpp's parser takes: :func:`gbnf.parse_error` passed
    it) is left-recursive, naming the rule, or None. llama.cpp refuses a rule that can
    reach itself before any text ("left recursion or an empty rule" was all that got
    through), and, where the way back runs through a rule that is empty only by way of
    another (``a ::= b``, ``b ::= "x" |``), it misses the recursion and never returns from
    building the grammar. Groups and repetitions are rules of their own here, as llama.cpp
    makes them; nothing recurses (groups nest up to :data:`MAX_GROUP_DEPTH`)."""
    # Each rule: alternatives of items (rule index or None for text, may be empty, text
    # that is empty); rule 0.. are named, the groups come after their rule's name.
    names: list[str] = []
    alternatives: list[list[list[tuple[int | None, bool]]]] = []
    index: dict[str, int] = {}

    def rule(name: str, group: bool = False) -> int:
        if group or name not in index:
            alternatives.append([[]])
            names.append(name)
            if not group:
                index[name] = len(names) - 1
            return len(names) - 1
        return index[name]

    tokens = [(m.lastgroup, m.group()) for m in _GBNF_TOKEN.finditer(text)
              if m.lastgroup != "skip"]
    stack: list[int] = []
    for i, (kind, value) in enumerate(tokens):
        if kind == "name" and i + 1 < len(tokens) and tokens[i + 1][0] == "defines":
            r = rule(value)
            alternatives[r] = [[]]  # a rule defined again: the last definition holds
            stack = [r]
        elif not stack or kind == "defines":
            continue
        elif kind == "other" and value == "|":
            alternatives[stack[-1]].append([])
        elif kind == "other" and value == "(":
            stack.append(rule(names[stack[0]], group=True))
        elif kind == "other" and value == ")" and len(stack) > 1:
            inner = stack.pop()
            alternatives[stack[-1]][-1].append((inner, False))
        elif kind == "rep" and alternatives[stack[-1]][-1]:
            optional = value in "*?" or re.match(r"\{\s*0*\s*[,}]", value) is not None
            target, empty = alternatives[stack[-1]][-1][-1]
            alternatives[stack[-1]][-1][-1] = (target, empty or optional)
        elif kind == "name":
            alternatives[stack[-1]][-1].append((rule(value), False))
        else:  # text: a literal (empty: matches nothing), a class, "."
            alternatives[stack[-1]][-1].append((None, value == '""'))
    n = len(names)
    # Which rules may match no text: a worklist, linear in the grammar's size.
    empty = [False] * n
    waiting: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    left: dict[tuple[int, int], int] = {}
    ready: list[int] = []
    for r in range(n):
        for a, items in enumerate(alternatives[r]):
            if any(t is None and not e for t, e in items):
                continue
            refs = [t for t, e in items if t is not None and not e]
            left[(r, a)] = len(refs)
            for t in refs:
                waiting[t].append((r, a))
            if not refs:
                ready.append(r)
    while ready:
        r = ready.pop()
        if empty[r]:
            continue
        empty[r] = True
        for key in waiting[r]:
            left[key] -= 1
            if left[key] == 0:
                ready.append(key[0])
    # The rules each rule may start with (before any text), then a cycle among them.
    starts: list[list[int]] = [[] for _ in range(n)]
    for r in range(n):
        for items in alternatives[r]:
            for t, e in items:
                if t is not None:
                    starts[r].append(t)
                if not (e or (t is not None and empty[t])):
                    break
    state = [0] * n  # 0 unseen, 1 on the path, 2 done
    for root in range(n):
        if state[root]:
            continue
        path, edges = [root], [iter(starts[root])]
        state[root] = 1
        while path:
            nxt = next(edges[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                edges.pop()
            elif state[nxt] == 1:
                cycle = [*path[path.index(nxt):], nxt]
                shown: list[str] = []
                for r in cycle:  # groups share their rule's name: said once
                    if not shown or names[r] != shown[-1] or r == nxt:
                        shown.append(names[r])
                return (f"rule '{names[nxt]}' is left-recursive ({' -> '.join(shown)} "
                        f"before any text): llama.cpp takes no left recursion; write it as a "
                        f'repetition, e.g. list ::= item ("," item)*')
            elif state[nxt] == 0:
                state[nxt] = 1
                path.append(nxt)
                edges.append(iter(starts[nxt]))
    return None


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _short(value: Any) -> str:
    return _one_line(repr(value), 40)


class Grammar:
    """One answer's grammar, compiled for a vocabulary: its parse state moves with every
    accepted token, so it serves one generation (the engine claims it)."""

    def __init__(self, vocab: Any, n_vocab: int, text: str, eog: npt.NDArray[np.bool_]) -> None:
        from llama_cpp import llama_cpp as low

        self.text = text
        self._low = low
        self._ptr: Any = None
        reason = parse_error(text)  # llama.cpp's parser would print it to fd 2
        if reason is None:
            reason = left_recursion(text)  # llama.cpp misses some, and then never returns
        if reason is not None:
            raise GrammarError(f"llama.cpp refused the grammar: {_one_line(reason)}")
        ptr = low.llama_sampler_init_grammar(vocab, text.encode("utf-8"), b"root")
        if not ptr:  # it parsed: what llama.cpp checks after (its log says which)
            raise GrammarError("llama.cpp refused the grammar: left recursion or an "
                               "empty rule")
        self._ptr = ptr
        self._n_vocab = n_vocab
        self._eog = eog
        self._candidates = (low.llama_token_data * n_vocab)()
        self._view = np.ctypeslib.as_array(self._candidates)
        self._view["id"] = np.arange(n_vocab, dtype=np.int32)  # ids, in vocabulary order
        self._array = low.llama_token_data_array(
            data=self._candidates, size=n_vocab, selected=-1, sorted=False)
        self._sampling: _ChainAfterMask | None = None
        self._seen = np.zeros(n_vocab, dtype=bool)
        self.top_first = True
        """Check the likeliest tokens first where that is provably exact (False: always the
        whole vocabulary; the answer is the same, slower)."""
        self.top_steps = 0
        """Tokens masked from the likeliest candidates alone (the rest: the whole
        vocabulary)."""
        self.full_steps = 0
        self.claimed = False
        self.dead_end = False
        """No candidate was left: only the end of generation was allowed through."""
        self.failed: str | None = None
        """Why masking went wrong (the processor never raises into llama.cpp)."""

    def claim(self, *, temperature: float | None = None, top_k: int = 0,
              repeat_penalty: float = 1.0, penalty_last_n: int = 0,
              frequency_penalty: float = 0.0, presence_penalty: float = 0.0) -> None:
        """Take the grammar for one answer, with the settings of the sampler chain that
        runs after :meth:`mask` (llama-cpp-python's ``Llama.generate``: repeat,
        frequency and presence penalties over the last ``penalty_last_n`` sampled
        tokens; then greedy at temperature 0, else top-k, top-p, min-p, temperature and
        a random draw). Given them, the mask may check the likeliest tokens first; without
        (``temperature`` None) it checks the whole vocabulary every token, as it does
        under a frequency or presence penalty (which the proof below does not model)."""
        if self.claimed:
            raise GrammarError("a grammar constrains one answer; compile it again")
        self.claimed = True
        if temperature is not None and frequency_penalty == 0 and presence_penalty == 0:
            self._sampling = _ChainAfterMask(self._n_vocab, float(temperature), int(top_k),
                                             float(repeat_penalty), int(penalty_last_n))

    def mask(self, _input_ids: Any, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The logits processor: disallowed tokens to -inf. ``logits`` are the candidates
        in vocabulary order (the first sampler of the chain sees them so)."""
        try:
            if self._ptr is None or self.failed:
                return logits
            if logits.shape != (self._n_vocab,):
                self.failed = f"{logits.shape[0]} candidates for {self._n_vocab} tokens"
                return logits
            if self.top_first and self._sampling is not None \
                    and self._mask_top(_input_ids, logits):
                self.top_steps += 1
                return logits
            self.full_steps += 1
            logit = self._view["logit"]
            logit[:] = logits
            self._array.size = self._n_vocab
            self._array.selected = -1
            self._array.sorted = False
            self._low.llama_sampler_apply(self._ptr, ctypes.byref(self._array))
            if not np.isfinite(logit).any():
                self.dead_end = True
                logit[self._eog] = 0.0
            logits[:] = logit
        except Exception as err:  # a ctypes callback must not raise
            self.failed = f"{type(err).__name__}: {err}"
        return logits

    def _mask_top(self, input_ids: Any, logits: npt.NDArray[np.float32]) -> bool:
        """Mask ``logits`` from the likeliest tokens alone when the sampler chain after the
        mask then provably picks what it would from the whole vocabulary masked; False
        (``logits`` untouched) when it does not.

        The chain's repeat penalty (at least 1, as checked) only lowers a logit: a
        token outside the ``n`` likeliest ends at most at ``tau``, the highest logit
        outside them. An allowed token among them ends at least at ``floor``: its logit
        penalized if it is among the last ``penalty_last_n`` tokens (a superset of the
        chain's window, which holds sampled tokens only), else as it is. So greedy picks
        the same token when some ``floor`` exceeds ``tau`` (ties among the candidates
        break by position, the same in both arrays); top-k keeps the same tokens in the
        same order when ``k`` floors exceed ``tau`` and no two candidates can end equal
        (the chain's sort breaks ties by position in the whole array), and everything
        after top-k sees only those."""
        chain = self._sampling
        assert chain is not None
        tiers = [n for n in TOP_TIERS if 0 < chain.need <= n < self._n_vocab]
        if not tiers or np.isnan(logits).any():
            return False
        window = chain.window(input_ids)
        ids: list[npt.NDArray[np.int32]] = []
        vals: list[npt.NDArray[np.float32]] = []
        seen = self._seen
        try:
            for n in tiers:
                tier, tau = _likeliest(logits, n)
                fresh = tier[~seen[tier]]
                seen[fresh] = True
                allowed_ids, allowed_vals = self._allowed(fresh, logits[fresh])
                ids.append(allowed_ids)
                vals.append(allowed_vals)
                all_ids, all_vals = np.concatenate(ids), np.concatenate(vals)
                if chain.exact(all_ids, all_vals, tau, window):
                    logits.fill(-np.inf)
                    logits[all_ids] = all_vals
                    return True
            return False
        finally:
            seen[:] = False

    def _allowed(self, ids: npt.NDArray[Any], logits: npt.NDArray[np.float32]
                 ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]:
        """The tokens of ``ids`` the grammar allows now, with their logits."""
        n = len(ids)
        view = self._view[:n]
        view["id"] = ids
        view["logit"] = logits
        self._array.size = n
        self._array.selected = -1
        self._array.sorted = False
        try:
            self._low.llama_sampler_apply(self._ptr, ctypes.byref(self._array))
        finally:
            self._array.size = self._n_vocab
            self._view["id"][:n] = np.arange(n, dtype=np.int32)  # vocabulary order again
        ok = np.isfinite(view["logit"])
        return ids[ok].astype(np.int32), logits[ok]

    def allows(self, token: int) -> bool:
        """Whether the grammar allows ``token`` now, without sampling (the parse state
        moves only with :meth:`accept`)."""
        ids, _ = self._allowed(np.array([token], dtype=np.int32),
                               np.zeros(1, dtype=np.float32))
        return len(ids) == 1

    def complete(self) -> bool:
        """Whether what the grammar has accepted is a whole answer (it allows the end of
        generation now)."""
        ends = np.flatnonzero(self._eog)
        return bool(len(ends)) and self.allows(int(ends[0]))

    def accept(self, token: int) -> None:
        """Advance past ``token``, which :meth:`mask` allowed (never an end of
        generation: the caller stops there)."""
        if self._ptr is not None and not self.dead_end:
            self._low.llama_sampler_accept(self._ptr, token)

    def close(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._low.llama_sampler_free(ptr)

    def __del__(self) -> None:
        self.close()


def _likeliest(logits: npt.NDArray[np.float32], n: int
               ) -> tuple[npt.NDArray[np.intp], np.float32]:
    """At most ``n`` of the tokens with the highest logits (no NaN among them), and a
    bound on the logits of the rest: the highest of them or more. A threshold from every
    ``step``-th logit picks some 2n tokens in one pass (``np.argpartition`` of the whole
    vocabulary takes several times as long); the n highest of them are exact."""
    step = max(1, len(logits) // 4096)
    sample = np.sort(logits[::step])
    threshold = sample[max(0, len(sample) - -(-2 * n // step))]
    tier = np.flatnonzero(logits >= threshold)
    if len(tier) <= n:  # the rest are below the threshold
        return tier, np.nextafter(threshold, np.float32(-np.inf))
    tier_logits = logits[tier]
    order = np.argpartition(tier_logits, len(tier) - n - 1)
    return tier[order[len(tier) - n:]], tier_logits[order[len(tier) - n - 1]]


class _ChainAfterMask:
    """What llama-cpp-python's sampler chain does after the logits processor, as far as
    :meth:`Grammar._mask_top` needs to know it."""

    def __init__(self, n_vocab: int, temperature: float, top_k: int, repeat_penalty: float,
                 penalty_last_n: int) -> None:
        self._recent = np.zeros(n_vocab, dtype=bool)
        self.greedy = temperature == 0
        # how many allowed candidates decide the pick: greedy one; sampling top-k's k
        # (without top-k, or at a negative temperature, every allowed token counts)
        self.need = 1 if self.greedy else top_k if temperature > 0 and top_k > 0 else 0
        self.penalized = penalty_last_n > 0 and repeat_penalty != 1.0
        if self.penalized and not repeat_penalty >= 1.0:
            self.need = 0  # a penalty below 1 raises logits: nothing is provable
        self.penalty = np.float32(repeat_penalty)
        self.last_n = penalty_last_n

    def window(self, input_ids: Any) -> npt.NDArray[np.int32]:
        """Tokens the repeat penalty may hit (a superset of the chain's window)."""
        if not self.penalized or input_ids is None:
            return np.empty(0, dtype=np.int32)
        window = np.asarray(input_ids[-self.last_n:], dtype=np.int32)
        return window[(window >= 0) & (window < len(self._recent))]

    def exact(self, ids: npt.NDArray[np.int32], vals: npt.NDArray[np.float32],
              tau: np.float32, window: npt.NDArray[np.int32]) -> bool:
        """Whether masking to the allowed candidates ``ids`` (logits ``vals``) samples
        what masking the whole vocabulary does, every token outside them having a logit
        of at most ``tau``."""
        if len(ids) < self.need:
            return False
        if len(window):  # np.isin would make a table of the whole vocabulary
            self._recent[window] = True
            hit = self._recent[ids]
            self._recent[window] = False
        else:
            hit = np.zeros(len(ids), dtype=bool)
        # what the penalty makes of a logit, as llama.cpp computes it (float32)
        penalized = np.where(vals <= 0, vals * self.penalty, vals / self.penalty
                             ).astype(np.float32)
        floor = np.where(hit, penalized, vals)
        if self.greedy:
            return bool(floor.max() > tau)
        if np.count_nonzero(floor > tau) < self.need:
            return False
        # no two candidates may end equal, whichever of them the penalty hits
        ends = np.concatenate([vals, penalized[hit]])
        owner = np.concatenate([np.arange(len(ids)), np.flatnonzero(hit)])
        order = np.argsort(ends, kind="stable")
        ends, owner = ends[order], owner[order]
        same = (ends[1:] == ends[:-1]) & (owner[1:] != owner[:-1])
        return not bool(same.any())
