"""Tool calls (OpenAI's function calling) in the format a model's chat template teaches it.

The tools go to the template (its Jinja ``tools`` variable), which writes them into the
system prompt in its own way, and tells the model how to call one. This module says which
format a template uses (:func:`template_format`), reads the calls out of an answer as it
streams (:class:`ToolCallStream`) and writes the grammar that makes an answer a call
(:func:`call_grammar`, for ``tool_choice: "required"`` or a named function).

Formats:

- **Hermes** (Qwen2.5, QwQ, Qwen3, Qwen3-Next, and the many fine-tunes that copied it):
  ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``, one block per call.
  Read, and forced by a grammar.
- **Qwen3-Coder XML** (Qwen3.5, Qwen3-Coder, Qwen3-Coder-Next): ``<tool_call>\\n
  <function=f>\\n<parameter=p>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>``,
  a string parameter's value as raw text, any other as JSON (:func:`parse_xml`). Read,
  and forced by a grammar (:func:`xml_call_grammar`) where each string parameter is free
  text or an enum (a string's pattern, length or format cannot be forced in raw text).
- **GLM-4.5's** (GLM-4.5, 4.6, 4.7): ``<tool_call>f\\n<arg_key>p</arg_key>\\n
  <arg_value>v</arg_value>\\n</tool_call>``, values as in Qwen3-Coder's; read and forced
  the same way.
- **gpt-oss's harmony**: a ``commentary`` message to ``functions.f`` (``<|channel|>
  commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>``), one per answer,
  taken out of the raw answer before its thoughts are split off
  (:class:`HarmonyCallStream`); forced by :func:`harmony_call_grammar`.
- Any other (Llama 3's, Mistral's...): refused in one line (:data:`REFUSED`), as a
  template without ``tools`` is: the server would not know a call from an answer.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from moescope.engine.grammar import schema_refs
from moescope.util.errors import MoEScopeError

HERMES = "hermes"
XML = "qwen3-coder"
GLM = "glm"
READ = (HERMES, XML, GLM, "harmony")
"""The formats this module reads."""
OPEN, CLOSE = "<tool_call>", "</tool_call>"

_READ_WORDS = ("it reads Hermes/Qwen JSON, Qwen3-Coder XML, GLM-4.5 and gpt-oss harmony "
               "calls")
REFUSED = {
    "none": "this model's chat template has no tool support (it never reads tools), so "
            "the model cannot call one; send tool_choice \"none\" or leave tools out",
    "other": "this model's chat template calls tools in a format this server does not read "
             f"({_READ_WORDS}); send tool_choice \"none\"",
}
"""Why a request with tools is refused, by the template's format."""


TAGS = {
    "hermes": (OPEN, CLOSE),
    "qwen3-coder": (OPEN, CLOSE),
    "glm": (OPEN, CLOSE, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    "harmony": ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"),
}
"""The tags each format's calls are read by: where one is a control token of the
vocabulary, the server writes its text (the engine writes a control token as none)."""


class ToolCallError(MoEScopeError):
    """Tools that cannot be called on this model, or a grammar that cannot force them."""


def template_format(template: str | None) -> str:
    """The tool-call format of a chat template: one of :data:`READ`, or a key of
    :data:`REFUSED` (``none`` where the template never reads ``tools``)."""
    if not template or not re.search(r"\btools\b", template):
        return "none"
    if "<|channel|>" in template or "<|call|>" in template:
        return "harmony"
    if OPEN not in template or "<invoke" in template or "<tool_calls>" in template:
        return "other"  # MiniMax's <invoke>, Apriel's list, Seed's <seed:tool_call>...
    if "<arg_key>" in template:
        return GLM
    if "<function=" in template and "<parameter=" in template:
        return XML
    return HERMES


@dataclass
class ToolCall:
    name: str
    arguments: str
    """The arguments as JSON text (OpenAI's ``function.arguments``)."""
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    def openai(self, index: int | None = None) -> dict[str, Any]:
        """The call as OpenAI writes it in ``message.tool_calls`` (with ``index``: in a
        streamed ``delta.tool_calls``)."""
        out: dict[str, Any] = {} if index is None else {"index": index}
        out.update({"id": self.id, "type": "function",
                    "function": {"name": self.name, "arguments": self.arguments}})
        return out


def parse_hermes(body: str, names: Iterable[str]) -> ToolCall | None:
    """The call a ``<tool_call>`` block holds (``{"name": ..., "arguments": {...}}``,
    ``arguments`` also as JSON text, or ``parameters``), or None where it is not one: not
    JSON, not an object, or a function that is not among ``names``."""
    try:
        obj = json.loads(body.strip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return None
    if not isinstance(name, str) or name not in set(names) or not isinstance(args, dict):
        return None
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


class ToolCallStream:
    """An answer's content with its Hermes tool calls taken out, as it streams.

    :meth:`feed` takes each new piece of the content and returns the text to send as
    content now and the calls completed now. Text that may begin ``<tool_call>`` is held
    back until it is known not to, and so is white space (the blank lines before a call
    are not content); a block is sent as a call once its ``</tool_call>`` closes it and
    ``parse`` reads it (:func:`parse_hermes`, :func:`parse_xml`), else as the content it
    is. With ``parallel`` False
    the answer is :attr:`done` after its first call (the caller stops generating)."""

    def __init__(self, parse: Callable[[str], ToolCall | None],
                 parallel: bool = True) -> None:
        self.parse = parse
        """A ``<tool_call>`` block's body to its call (None: it is not one)."""
        self.parallel = parallel
        self.calls: list[ToolCall] = []
        self.content = ""
        """The content sent so far."""
        self.done = False
        self._pending = ""
        self._inside = False

    def feed(self, piece: str) -> tuple[str, list[ToolCall]]:
        if self.done:
            return "", []
        self._pending += piece
        out, calls = "", []
        while True:
            if self._inside:
                end = self._pending.find(CLOSE)
                if end < 0:
                    break
                body, self._pending = self._pending[:end], self._pending[end + len(CLOSE):]
                self._inside = False
                call = self.parse(body)
                if call is None:
                    out += OPEN + body + CLOSE
                    continue
                calls.append(call)
                self.calls.append(call)
                if not self.parallel:
                    self.done = True
                    self._pending = ""
                    break
                continue
            start = self._pending.find(OPEN)
            if start >= 0:
                before = self._pending[:start]
                if before.strip():  # the words before a call, without the blank lines
                    out += before.rstrip()
                self._pending = self._pending[start + len(OPEN):]
                self._inside = True
                continue
            held = _held(self._pending)
            text = self._pending[:len(self._pending) - held]
            if text.strip():
                out += text
                self._pending = self._pending[len(text):]
            break
        self.content += out
        return out, calls

    def finish(self) -> str:
        """The content held back, now that the answer is over: an unclosed block is the
        text it is (a call cut short by the length limit is no call); white space at the
        end goes only where no call was made."""
        rest = (OPEN if self._inside else "") + self._pending
        self._pending, self._inside = "", False
        if self.done or (self.calls and not rest.strip()):
            return ""
        self.content += rest
        return rest


def _held(text: str) -> int:
    """Length of the tail of ``text`` to hold back: what may begin ``<tool_call>``, and
    the white space before it (or at the end)."""
    k = next((k for k in range(min(len(OPEN) - 1, len(text)), 0, -1)
              if OPEN.startswith(text[-k:])), 0)
    body = text[:len(text) - k]
    return k + len(body) - len(body.rstrip())


MAX_TOOLS = 128
"""Tools in one request (OpenAI's limit)."""
NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
"""A function's name, as OpenAI allows it."""


def _hoisted(tools: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each function's parameters schema (a copy) and one ``$defs`` for them all: each
    function's ``$defs``/``definitions`` moved there under names of their own, with its
    ``$ref`` rewritten to them (a ``$ref`` elsewhere, such as ``#``, is a
    :class:`ToolCallError`)."""
    out, defs = [], {}
    for i, tool in enumerate(tools):
        params = copy.deepcopy(tool["function"].get("parameters") or {"type": "object"})
        moved: dict[str, str] = {}
        for key in ("$defs", "definitions"):
            if isinstance(params.get(key), dict):
                for name, value in params.pop(key).items():
                    new = f"t{i}-{re.sub(r'[^a-zA-Z0-9-]+', '-', name)}-{len(defs)}"
                    moved[f"#/{key}/{name}"] = f"#/$defs/{new}"
                    defs[new] = value
        for node in schema_refs(params, *(defs[m.rsplit("/", 1)[1]] for m in moved.values())):
            ref = node["$ref"]
            target = next((new + ref[len(old):] for old, new in moved.items()
                           if ref == old or ref.startswith(old + "/")), None)
            if target is None:
                raise ToolCallError(f"tools[{i}].function.parameters: $ref {ref!r} "
                                    "points outside the function's $defs")
            node["$ref"] = target
        out.append(params)
    return out, defs


def call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema of one Hermes call to any of ``tools`` (OpenAI's shape, checked):
    ``{"name": <const>, "arguments": <the function's parameters>}``, one branch per
    function, their ``$defs`` at the root (:func:`_hoisted`)."""
    params, defs = _hoisted(tools)
    branches = [{"type": "object",
                 "properties": {"name": {"const": tool["function"]["name"]},
                                "arguments": p},
                 "required": ["name", "arguments"], "additionalProperties": False}
                for tool, p in zip(tools, params, strict=True)]
    schema: dict[str, Any] = branches[0] if len(branches) == 1 else {"anyOf": branches}
    if defs:
        schema = {**schema, "$defs": defs}
    return schema


def call_grammar(tools: list[dict[str, Any]], parallel: bool) -> str:
    """GBNF of an answer that is a Hermes call to one of ``tools`` (its arguments as the
    function's ``parameters`` allow), or, with ``parallel``, one or more calls.
    :class:`~moescope.engine.grammar.GrammarError` where a schema cannot be enforced."""
    from moescope.engine.grammar import schema_grammar

    text = schema_grammar(call_schema(tools))
    text = re.sub(r"^root ::=", "tool-call ::=", text, flags=re.M)
    one = r'"<tool_call>\n" tool-call "\n</tool_call>"'
    root = f"root ::= {one}" + (f" ( \"\\n\" {one} )*" if parallel else "")
    return root + "\n" + text


def parser(fmt: str, tools: list[dict[str, Any]]) -> Callable[[str], ToolCall | None]:
    """How a ``<tool_call>`` block of format ``fmt`` (one of :data:`READ`) is read, for
    ``tools``."""
    if fmt == HERMES:
        names = frozenset(t["function"]["name"] for t in tools)
        return lambda body: parse_hermes(body, names)
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    if fmt == "glm":
        return lambda body: parse_glm(body, schemas)
    return lambda body: parse_xml(body, schemas)


_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def parse_xml(body: str, schemas: dict[str, dict[str, Any]]) -> ToolCall | None:
    """The call a Qwen3-Coder ``<tool_call>`` block holds (``<function=f>`` with its
    ``<parameter=p>`` values), or None where it is not one (no function, one not among
    ``schemas``, text outside the parameters). A value is read as its parameter's type
    wants: raw text for a string (one newline after the opening tag and one before the
    closing one are the format's), else JSON, else the text."""
    m = _FUNCTION.fullmatch(body)
    properties = _named_properties(m, schemas)
    if m is None or properties is None:
        return None
    name = m[1].strip()
    args: dict[str, Any] = {}
    if _PARAMETER.sub("", m[2]).strip():
        return None
    for p in _PARAMETER.finditer(m[2]):
        key, raw = p[1].strip(), p[2]
        raw = raw[1:] if raw.startswith("\n") else raw
        raw = raw[:-1] if raw.endswith("\n") else raw
        schema = properties.get(key)
        args[key] = raw if _is_text(schema) else _json_or_text(raw)
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


def _named_properties(m: re.Match[str] | None,
                      schemas: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The ``properties`` of the function a parsed block names (its first group), {} where
    its schema has none; None where the block did not parse or names no function among
    ``schemas``."""
    if m is None or m[1].strip() not in schemas:
        return None
    properties = schemas[m[1].strip()].get("properties")
    return properties if isinstance(properties, dict) else {}


_GLM = re.compile(r"\s*([^<\n]+?)\s*((?:<arg_key>.*?</arg_key>\s*<arg_value>.*?</arg_value>"
                  r"\s*)*)", re.S)
_GLM_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def parse_glm(body: str, schemas: dict[str, dict[str, Any]]) -> ToolCall | None:
    """The call a GLM-4.5 ``<tool_call>`` block holds (the function's name, then
    ``<arg_key>k</arg_key><arg_value>v</arg_value>`` pairs), or None where it is not one.
    A value is read as :func:`parse_xml` reads one."""
    m = _GLM.fullmatch(body)
    properties = _named_properties(m, schemas)
    if m is None or properties is None:
        return None
    name = m[1].strip()
    args: dict[str, Any] = {}
    for key, raw in _GLM_PAIR.findall(m[2]):
        key = key.strip()
        args[key] = raw if _is_text(properties.get(key)) else _json_or_text(raw)
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


def _is_text(schema: Any) -> bool:
    """Whether a parameter's value is written as raw text: its type is ``string`` (or a
    list holding it and no other type but null)."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if isinstance(kind, list):
        return "string" in kind and set(kind) <= {"string", "null"}
    return kind == "string" or (kind is None and isinstance(schema.get("enum"), list)
                                and all(isinstance(v, str) for v in schema["enum"]))


def _json_or_text(raw: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return raw


_ANNOTATIONS = {"title", "description", "examples", "default", "$comment", "deprecated",
                "readOnly", "writeOnly"}


def _literal(text: str) -> str:
    """``text`` as a GBNF literal."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif ord(c) < 0x20 or c == "\x7f":
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


_TAGGED = {
    XML: ("Qwen3-Coder's XML", r'"<tool_call>\n" xml-call "\n</tool_call>"',
          '"<function=" {name} ">\\n" {body} "</function>"',
          '"<parameter=" {key} ">\\n" {value} "\\n</parameter>\\n"'),
    "glm": ("GLM-4.5's XML", r'"<tool_call>" xml-call "</tool_call>"',
            '{name} "\\n" {body}',
            '"<arg_key>" {key} "</arg_key>\\n<arg_value>" {value} "</arg_value>\\n"'),
}
"""How each tagged format writes a call: its name in messages, a block, a function with
its parameters, a parameter with its value (GBNF)."""


def xml_call_grammar(tools: list[dict[str, Any]], parallel: bool, fmt: str = XML) -> str:
    """GBNF of an answer that is a call in ``fmt`` (Qwen3-Coder's XML, or GLM-4.5's
    ``<arg_key>``/``<arg_value>`` pairs) to one of ``tools``, or, with
    ``parallel``, one or more: each required parameter once, the optional ones maybe, in
    the schema's order, no other; a string parameter's value raw text without ``<`` (or
    one of its enum's values), any other the JSON its schema allows (the converter's
    rules, :func:`~moescope.engine.grammar.schema_grammar`).
    :class:`ToolCallError` for what raw text cannot be held to (a string's pattern,
    length or format) or a ``$ref``; :class:`~moescope.engine.grammar.GrammarError` for
    a schema that cannot be enforced."""
    words, block, function_rule, parameter_rule = _TAGGED[fmt]
    values: dict[str, Any] = {}
    functions = []
    for i, tool in enumerate(tools):
        function = tool["function"]
        params = function.get("parameters") or {}
        where = f"tools[{i}].function.parameters"
        if "$ref" in json.dumps(params):
            raise ToolCallError(f"{where}: a $ref cannot be forced in {words} calls")
        properties = params.get("properties") or {}
        required = set(params.get("required") or ())
        parts = []
        for j, (key, schema) in enumerate(properties.items()):
            if not isinstance(key, str) or not key or any(c in key for c in "<>\n"):
                raise ToolCallError(f"{where}: the parameter name {key!r} cannot be written "
                                    f"in {words}")
            if _is_text(schema):
                extra = set(schema) - _ANNOTATIONS - {"type", "enum"}
                if extra:
                    raise ToolCallError(f"{where}.properties.{key}: a string's "
                                        f"{sorted(extra)[0]} cannot be forced in raw text "
                                        f"({words} calls)")
                value = " | ".join(_literal(v) for v in schema["enum"]) \
                    if isinstance(schema.get("enum"), list) else "xml-text"
                value = f"( {value} )"
            else:  # a placeholder for the converter's rule of the value
                value = f"@v{i}x{j}@"
                values[f"v{i}x{j}"] = schema if isinstance(schema, dict) else {}
            one = parameter_rule.format(key=_literal(key), value=value)
            parts.append(one if key in required else f"( {one} )?")
        functions.append(function_rule.format(name=_literal(function["name"]),
                                              body=" ".join(parts)))
    call = f"xml-call ::= {' | '.join(f'( {f} )' for f in functions)}"
    lines = ["xml-text ::= [^<]*"]
    if values:
        rules, text = _value_rules(values)
        lines.append(text)
        for key, rule in rules.items():
            call = call.replace(f"@{key}@", rule)
    lines.insert(0, call)
    root = f"root ::= {block}" + (f" ( \"\\n\" {block} )*" if parallel else "")
    return "\n".join([root, *lines])


def _value_rules(values: dict[str, Any],
                 defs: dict[str, Any] | None = None) -> tuple[dict[str, str], str]:
    """Rules of JSON values, each as its schema of ``values`` allows (``defs``: the
    ``$defs`` their ``$ref`` point to): one object of them all turned into a grammar (the
    converter names each value's rule; its root is renamed ``json-values`` and left
    unused); the rule of each key, and the grammar's text."""
    from moescope.engine.grammar import schema_grammar

    schema: dict[str, Any] = {"type": "object", "required": list(values),
                              "properties": values}
    if defs:
        schema["$defs"] = defs
    text = schema_grammar(schema)
    text = re.sub(r"^root ::=", "json-values ::=", text, flags=re.M)
    rules = {}
    for key in values:
        kv = re.search(rf'^{key}-kv ::= "\\"{key}\\"" space ":" space (\S+)$', text, flags=re.M)
        if kv is None:
            raise ToolCallError(f"the converter wrote no rule for a value ({key})")
        rules[key] = kv[1]
    return rules, text


HARMONY = "harmony"
_START, _CHANNEL, _MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
_RECIPIENT = re.compile(r"to=functions\.([A-Za-z0-9_-]+)")


class HarmonyCallStream:
    """gpt-oss's tool call taken out of its raw answer (before the reasoning split), as
    it streams: a message whose header (from ``<|start|>`` or ``<|channel|>`` to
    ``<|message|>``) names a recipient ``to=functions.NAME`` is a call, its message the
    arguments (JSON), up to ``<|call|>``, which ends generation. :meth:`feed` returns the
    raw text to pass on (a header is held back until it is whole); :meth:`finish` the rest
    and the call (none where its arguments are no JSON object or the function is not among
    ``names``: then the text goes on as it was)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        self.calls: list[ToolCall] = []
        self._pending = ""
        self._name: str | None = None
        self._header = ""
        self._args = ""
        self._first = True
        self._added = False
        """A ``<|start|>`` put before the answer's first header, not the model's."""

    def feed(self, piece: str) -> str:
        if self._name is not None:
            self._args += piece
            return ""
        self._pending += piece
        out = ""
        if self._first:  # the prompt ended "<|start|>assistant": a header may go on here
            head = self._pending.lstrip()
            if len(head) < 3 and "to=".startswith(head):
                return ""
            self._first = False
            if head.startswith("to="):
                self._pending = _START + self._pending  # its header, whole
                self._added = True
        while True:
            starts = [i for i in (self._pending.find(_START), self._pending.find(_CHANNEL))
                      if i >= 0]
            if not starts:
                held = next((k for k in range(min(len(_CHANNEL) - 1, len(self._pending)), 0,
                                              -1)
                             if _START.startswith(self._pending[-k:])
                             or _CHANNEL.startswith(self._pending[-k:])), 0)
                out += self._pending[:len(self._pending) - held]
                self._pending = self._pending[len(self._pending) - held:]
                return out
            i = min(starts)
            end = self._pending.find(_MESSAGE, i)
            if end < 0:  # the header is still arriving
                out += self._pending[:i]
                self._pending = self._pending[i:]
                return out
            end += len(_MESSAGE)
            header = self._pending[i:end]
            m = _RECIPIENT.search(header)
            if m is not None:
                out += self._pending[:i]
                self._name, self._header = m[1], self._own(header)
                self._args, self._pending = self._pending[end:], ""
                return out
            out += self._own(self._pending[:end])
            self._pending = self._pending[end:]

    def finish(self) -> str:
        rest, self._pending = self._own(self._pending), ""
        if self._name is None:
            return rest
        try:
            args = json.loads(self._args)
        except (ValueError, RecursionError):
            args = None
        if self._name in self.names and isinstance(args, dict):
            self.calls.append(ToolCall(self._name, json.dumps(args, ensure_ascii=False)))
            return rest
        return rest + self._header + self._args

    def _own(self, text: str) -> str:
        """``text`` without the ``<|start|>`` put before the first header, if it begins
        there."""
        if self._added:
            self._added = False
            return text.removeprefix(_START)
        return text


def harmony_call_grammar(tools: list[dict[str, Any]]) -> str:
    """GBNF of a gpt-oss answer that is a call to one of ``tools``: a ``commentary``
    message to ``functions.NAME`` whose arguments are JSON the function's parameters
    allow (gpt-oss calls one function per answer)."""
    params, defs = _hoisted(tools)
    values = {f"v{i}": p for i, p in enumerate(params)}
    rules, text = _value_rules(values, defs)
    calls = " | ".join(f'( {_literal(t["function"]["name"])} " <|constrain|>json<|message|>" '
                       f'{rules[f"v{i}"]} )' for i, t in enumerate(tools))
    return f'root ::= "<|channel|>commentary to=functions." ( {calls} )\n{text}'
