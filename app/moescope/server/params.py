"""Request bodies of the OpenAI endpoints, checked and bounded before any work starts.

Every field a client sends is read here, type-checked and clamped or refused (400 naming
the field), so the generation code only ever sees sane values: no NaN temperature, no
``max_tokens`` of a billion, no ten thousand stop strings. Fields the server does not
implement but that clients send with neutral values (``n: 1``, ``verbosity:
"medium"``) pass; any other value is refused rather than silently ignored
(``web_search_options`` whatever its value), so a client never believes it got what it
asked for when it did not. Unknown extra fields are ignored, as llama-server does: clients
add vendor fields freely; so are OpenAI's fields that are bookkeeping or hints and change
no answer (``user``, ``metadata``, ``store``, ``service_tier``, ``prompt_cache_key``,
``safety_identifier``, ``prediction``).

``response_format`` (JSON output) is read here; its schema is bounded and turned into a
grammar when the request is prepared (``Service``), still before anything waits. So are
``tools`` (bounded here: count, names, description and schema sizes), ``tool_choice`` and
``parallel_tool_calls``; whether the model's template can call them, and the grammar that
forces a call, are the ``Service``'s.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from moescope.server.errors import ApiError, bad_param

MAX_MESSAGES = 2048
MAX_STOP = 16
"""OpenAI allows 4, but Continue sends its whole list (often more) to any server other
than OpenAI's own; llama-server takes any number. Bounded all the same."""
MAX_STOP_CHARS = 256
MAX_TOP_LOGPROBS = 20
"""Chat's ``top_logprobs`` bound, OpenAI's (``engine.logprobs.MAX_TOP``)."""
MAX_COMPLETION_LOGPROBS = 5
"""A text completion's ``logprobs`` bound, OpenAI's."""
THINKING_EFFORTS = ("none", "minimal", "low", "medium", "high")
"""OpenAI's ``reasoning_effort`` values: "none" is thinking off, "minimal" the least effort
a template has (gpt-oss's "low"), the rest as they are."""
_EFFORT_SETTING = {"none": "off", "minimal": "low"}
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOOL_CALLS = 128
"""Tool calls in one assistant message of the history (OpenAI's limit on tools)."""
MAX_TOOL_NAME = 256
"""Longest function name or call id in the history (OpenAI's names: 64 characters)."""


@dataclass
class Limits:
    """The server's bounds on what one request may ask for."""

    max_tokens: int = 2048
    """Most tokens one answer may have; a larger ``max_tokens`` is clamped to it."""
    max_body_bytes: int = 4 << 20


@dataclass
class GenerationParams:
    """What both endpoints share: sampling, length, stops, streaming."""

    model: str | None
    max_tokens: int | None
    """Asked for (clamped to the server's limit); None: until the limit or the context."""
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repeat_penalty: float
    frequency_penalty: float
    presence_penalty: float
    seed: int | None
    stop: list[str]
    stream: bool
    include_usage: bool
    output: OutputFormat | None = None
    """JSON output asked for (``response_format``); None: free text."""
    logprobs: int | None = None
    """Log-probabilities asked for, with this many alternatives per token; None: none."""
    xtc_probability: float = 0.0
    """llama-server's XTC fields (``engine.Sampling``); 0: off."""
    xtc_threshold: float = 0.1
    mirostat: int = 0
    """llama-server's mirostat fields: 0 off, 1 or 2."""
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    logit_bias: dict[int, float] | None = None
    """Token ids to numbers added to their logits (OpenAI's ``logit_bias``); None: none."""


@dataclass
class OutputFormat:
    """A ``response_format`` other than text: any JSON object, or JSON that a schema
    allows."""

    kind: str
    """``json_object`` or ``json_schema``."""
    schema: dict[str, Any] | None = None


@dataclass
class ChatParams(GenerationParams):
    messages: list[dict[str, Any]] = field(default_factory=list)
    """Role and content of each message; an assistant's ``tool_calls`` and a tool's
    ``tool_call_id`` too, where sent (the chat template shows them, or the request is
    refused: ``Service.prepare_chat``)."""
    thinking: str = "default"
    """The template's thinking switch (``model.reasoning.THINKING_SETTINGS``), from
    ``reasoning_effort`` or ``chat_template_kwargs.enable_thinking``."""
    tools: list[dict[str, Any]] | None = None
    """Function tools, OpenAI's shape, checked (their parameters bounded)."""
    tool_choice: str = "none"
    """``none``, ``auto``, ``required`` or ``function:NAME``."""
    parallel_tool_calls: bool = True


@dataclass
class CompletionParams(GenerationParams):
    prompt: str = ""


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not lo <= value <= hi:
        raise bad_param(name, f"{name} must be a number from {lo:g} to {hi:g}, got "
                              f"{_short(value)}")
    return float(value)


def _integer(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():  # 100.0: a whole number still
        value = int(value)  # (llama-server takes it; clients that compute it send it)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise bad_param(name, f"{name} must be a whole number from {lo} to {hi}, got "
                              f"{_short(value)}")
    return value


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_param(name, f"{name} must be true or false, got {_short(value)}")
    return value


def _text(value: str, param: str) -> str:
    """``value``, refused if it is not Unicode text: JSON's ``\\ud800`` escapes decode to
    lone UTF-16 surrogates, which no tokenizer (nor a UTF-8 log line) takes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise bad_param(param, f"{param} has a lone UTF-16 surrogate "
                               f"({value[err.start]!r} at character {err.start}); send "
                               "text as valid Unicode") from None
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _neutral(body: dict[str, Any], name: str, allowed: tuple[Any, ...], what: str) -> None:
    """Refuse a feature the server does not have unless its value asks for nothing."""
    value = body.get(name)
    # ``True == 1`` and ``False == 0`` in Python: ``n: true`` must not pass as ``n: 1``,
    # nor ``echo: 0`` as ``echo: false``
    if value is not None and (value not in allowed
                              or isinstance(value, bool) != isinstance(allowed[0], bool)):
        raise bad_param(name, f"{name} is not supported by this server ({what})")


def _stops(body: dict[str, Any]) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_param("stop", "stop must be a string or a list of strings")
    if len(stops) > MAX_STOP:
        raise bad_param("stop", f"at most {MAX_STOP} stop sequences, got {len(stops)}")
    if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise bad_param("stop", f"each stop sequence must have 1 to {MAX_STOP_CHARS} "
                                "characters")
    return [_text(s, "stop") for s in stops]


def _common(body: dict[str, Any], limits: Limits,
            defaults: Mapping[str, float] | None = None) -> dict[str, Any]:
    rec = defaults or {}
    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise bad_param("model", "model must be a string")
        _text(model, "model")
    names = ("max_completion_tokens", "max_tokens")
    name = next((n for n in names if body.get(n) is not None), "max_tokens")
    max_tokens = _integer(body, name, 1, (1 << 31) - 1)  # a C int, then the server limit
    if max_tokens is not None:
        max_tokens = min(max_tokens, limits.max_tokens)
    seed = _integer(body, "seed", -(1 << 63), (1 << 64) - 1)
    _neutral(body, "n", (1,), "one choice per request")
    _neutral(body, "best_of", (1,), "one choice per request")
    _neutral(body, "grammar", ("",), "use response_format with a json_schema")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_param("stream_options", "stream_options must be an object")
    if not isinstance((options or {}).get("include_usage", False), bool | None):
        raise bad_param("stream_options", "stream_options.include_usage must be true or "
                                          f"false, got {_short(options['include_usage'])}")
    stream = _flag(body, "stream")
    if options is not None and not stream:  # OpenAI's 400, in its words
        raise bad_param("stream_options", "stream_options is only allowed when stream is "
                                          "true")
    return {
        "model": model,
        "max_tokens": max_tokens,
        # a field left out takes the model's recommended value (its GGUF's
        # general.sampling.*, as llama-server does), else llama-server's default
        "temperature": _number(body, "temperature", rec.get("temperature", 0.8), 0.0, 2.0),
        "top_p": _number(body, "top_p", rec.get("top_p", 0.95), 0.0, 1.0),
        # 0: off (every token), as llama-server reads it; absent: llama.cpp's default 40
        "top_k": int(rec.get("top_k", 40)) if (top_k := _integer(body, "top_k", 0, 1 << 20))
        is None else top_k,
        "min_p": _number(body, "min_p", rec.get("min_p", 0.05), 0.0, 1.0),
        "repeat_penalty": _number(body, "repeat_penalty", rec.get("repeat_penalty", 1.0),
                                  0.0, 10.0),
        # OpenAI's range; llama.cpp's penalties sampler subtracts them from the logits of
        # the tokens the answer has sampled (its last 64)
        "frequency_penalty": _number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        "presence_penalty": _number(body, "presence_penalty", 0.0, -2.0, 2.0),
        # a negative seed (llama-server's front ends send -1) is a random one; any other
        # folds into llama.cpp's 32 bits without 0xFFFFFFFF (its LLAMA_DEFAULT_SEED,
        # "random each run"), so every seed given reproduces
        "seed": None if seed is None or seed < 0 else seed % 0xFFFFFFFF,
        "stop": _stops(body),
        # llama-server's XTC and mirostat fields, its defaults (off) where neither the
        # request nor the model says; the bounds are the engine's (SAMPLING_BOUNDS)
        **_xtc_mirostat(body, rec),
        "stream": stream,
        "include_usage": stream and bool((options or {}).get("include_usage")),
        "output": _output(body),
        "logit_bias": _logit_bias(body),
    }


def _logit_bias(body: dict[str, Any]) -> dict[int, float] | None:
    """OpenAI's ``logit_bias``: token ids (as JSON keys, strings of digits) to numbers
    from -100 to 100, at most ``MAX_LOGIT_BIAS`` of them; the ids are checked against the
    model's vocabulary when the request is prepared."""
    from moescope.engine.engine import LOGIT_BIAS, MAX_LOGIT_BIAS

    value = body.get("logit_bias")
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise bad_param("logit_bias", "logit_bias must be an object of token ids to numbers")
    if len(value) > MAX_LOGIT_BIAS:
        raise bad_param("logit_bias", f"logit_bias has {len(value)} tokens; at most "
                                      f"{MAX_LOGIT_BIAS}")
    out: dict[int, float] = {}
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 9):
            raise bad_param("logit_bias", f"logit_bias keys are token ids (whole numbers "
                                          f"from 0), got {_short(key)}")
        if isinstance(bias, bool) or not isinstance(bias, int | float) \
                or not math.isfinite(bias) or not -LOGIT_BIAS <= bias <= LOGIT_BIAS:
            raise bad_param("logit_bias", f"logit_bias values must be numbers from "
                                          f"{-LOGIT_BIAS:g} to {LOGIT_BIAS:g}, got "
                                          f"{_short(bias)} for token {key}")
        out[int(key)] = float(bias)
    return out


def _xtc_mirostat(body: dict[str, Any], rec: Mapping[str, float]) -> dict[str, Any]:
    from moescope.engine.engine import SAMPLING_BOUNDS, Sampling

    out: dict[str, Any] = {}
    for name, (lo, hi) in SAMPLING_BOUNDS.items():
        default = rec.get(name, getattr(Sampling, name))
        if isinstance(lo, int):
            value = _integer(body, name, int(lo), int(hi))
            out[name] = int(default) if value is None else value
        else:
            out[name] = _number(body, name, float(default), lo, hi)
    return out


def _output(body: dict[str, Any]) -> OutputFormat | None:
    """``response_format`` as OpenAI spells it (``{"type": "json_object"}``, ``{"type":
    "json_schema", "json_schema": {"name", "schema", "strict"}}``), also llama-server's
    ``{"type": "json_object", "schema": {...}}`` and top-level ``json_schema``."""
    fmt = body.get("response_format")
    if fmt is None and body.get("json_schema") is not None:
        fmt = {"type": "json_object", "schema": body["json_schema"]}
    if fmt is None:
        return None
    def refuse(message: str) -> ApiError:
        return bad_param("response_format", f"response_format: {message}")
    if not isinstance(fmt, dict):
        raise refuse('must be an object, e.g. {"type": "json_object"}')
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = fmt.get("schema")
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise refuse('json_schema must be an object: {"name": ..., "schema": {...}}')
        name, strict = spec.get("name"), spec.get("strict")
        if name is not None and (not isinstance(name, str) or len(name) > 64):
            raise refuse("json_schema.name must be a string of at most 64 characters")
        if strict is not None and not isinstance(strict, bool):
            raise refuse("json_schema.strict must be true or false")
        schema = spec.get("schema")
        if schema is None:
            raise refuse("json_schema.schema is required (the JSON Schema of the answer)")
    else:
        raise refuse(f"type must be text, json_object or json_schema, got {_short(kind)}")
    if schema is not None and not isinstance(schema, dict):
        raise refuse(f"the schema must be a JSON object, got {type(schema).__name__}")
    return OutputFormat(kind=kind, schema=schema)


def _content(message: dict[str, Any], i: int) -> str:
    """A message's text: a string, or a list of text parts (what newer clients send).
    Required, as OpenAI requires it, of every message but an assistant's (which may carry
    tool calls or a refusal instead)."""
    content = message.get("content")
    if content is None:
        if message.get("role") != "assistant":
            raise bad_param(f"messages[{i}].content", f"content is required in a "
                                                      f"{message.get('role')} message")
        return ""
    if isinstance(content, str):
        return _text(content, f"messages[{i}].content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise bad_param(f"messages[{i}].content",
                                "only text content parts are supported (no images, audio "
                                "or files)")
            texts.append(part["text"])
        return _text("".join(texts), f"messages[{i}].content")
    raise bad_param(f"messages[{i}].content", "content must be a string or a list of "
                                              "text parts")


def _tool_calls(value: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` as OpenAI spells them (``[{"id", "type":
    "function", "function": {"name", "arguments"}}]``), checked, for the chat template
    (``Service`` then checks that the template shows them)."""
    param = f"messages[{i}].tool_calls"
    if not isinstance(value, list):
        raise bad_param(param, "tool_calls must be a list of calls")
    if len(value) > MAX_TOOL_CALLS:
        raise bad_param(param, f"at most {MAX_TOOL_CALLS} tool calls in a message, got "
                               f"{len(value)}")
    calls = []
    for j, call in enumerate(value):
        where = f"{param}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise bad_param(where, 'each tool call must be {"id": ..., "type": "function", '
                                   '"function": {"name": ..., "arguments": ...}}')
        name, arguments, call_id = function.get("name"), function.get("arguments"), \
            call.get("id")
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_TOOL_NAME:
            raise bad_param(where, f"function.name must be a string of 1 to {MAX_TOOL_NAME} "
                                   "characters")
        if not isinstance(arguments, str):
            raise bad_param(where, "function.arguments must be a string (the arguments as "
                                   "JSON text)")
        if call_id is not None and (not isinstance(call_id, str)
                                    or len(call_id) > MAX_TOOL_NAME):
            raise bad_param(where, f"id must be a string of at most {MAX_TOOL_NAME} "
                                   "characters")
        calls.append({"id": _text(call_id or f"call_{i}_{j}", where), "type": "function",
                      "function": {"name": _text(name, where),
                                   "arguments": _text(arguments, where)}})
    return calls


def chat_params(body: Any, limits: Limits,
                defaults: Mapping[str, float] | None = None) -> ChatParams:
    """Check a ``/v1/chat/completions`` body; ``defaults``: the model's recommended
    sampling (:func:`moescope.model.sampling_defaults.model_sampling`) for fields left
    out."""
    if not isinstance(body, dict):
        raise bad_param("body", "the request body must be a JSON object")
    common = _common(body, limits, defaults)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_param("messages", "messages must be a non-empty list" + (
            " (a raw prompt goes to POST /v1/completions)"
            if raw is None and "prompt" in body else ""))
    if len(raw) > MAX_MESSAGES:
        raise bad_param("messages", f"at most {MAX_MESSAGES} messages, got {len(raw)}")
    if body.get("functions"):
        raise bad_param("functions", "functions (OpenAI's deprecated function calling) is "
                                     "not supported; send them as tools")
    if body.get("function_call") not in (None, "none", "auto"):
        raise bad_param("function_call", f"function_call {_short(body['function_call'])} "
                                         "(the deprecated form) is not supported; send "
                                         "tools and tool_choice")
    tools = _tools(body)
    choice = _tool_choice(body, tools)
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise bad_param("parallel_tool_calls", "parallel_tool_calls must be true or false, "
                                               f"got {_short(parallel)}")
    if tools and choice != "none" and common["output"] is not None:
        raise bad_param("response_format", "response_format and tools together are not "
                                           "supported: ask for one (or send tool_choice "
                                           "\"none\")")
    _neutral(body, "verbosity", ("medium",), "no verbosity setting; the model answers as "
                                             "it does")
    if body.get("web_search_options") is not None:
        raise bad_param("web_search_options", "web_search_options is not supported by this "
                                              "server (it has no web search)")
    modalities = body.get("modalities")
    if body.get("audio") is not None or modalities not in (None, [], ["text"]):
        raise bad_param("audio" if body.get("audio") is not None else "modalities",
                        "audio output is not supported by this server (text only: "
                        'modalities ["text"])')
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise bad_param(f"messages[{i}]", "each message must be an object")
        role = m.get("role")
        if role not in ROLES:
            raise bad_param(f"messages[{i}].role", f"role must be one of {', '.join(ROLES)}; "
                                                   f"got {_short(role)}")
        message: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                   "content": _content(m, i)}
        if m.get("function_call") is not None:
            raise bad_param(f"messages[{i}].function_call",
                            "function_call (the deprecated form) is not supported in "
                            "messages; send the call as tool_calls")
        if m.get("tool_calls") is not None:
            if role != "assistant":
                raise bad_param(f"messages[{i}].tool_calls", "only an assistant message "
                                                             f"has tool_calls, not a {role} one")
            calls = _tool_calls(m["tool_calls"], i)
            if calls:
                message["tool_calls"] = calls
        if role == "tool":
            call_id = m.get("tool_call_id")
            if call_id is not None:
                if not isinstance(call_id, str) or len(call_id) > MAX_TOOL_NAME:
                    raise bad_param(f"messages[{i}].tool_call_id", "tool_call_id must be a "
                                    f"string of at most {MAX_TOOL_NAME} characters")
                message["tool_call_id"] = _text(call_id, f"messages[{i}].tool_call_id")
        messages.append(message)
    logprobs = _chat_logprobs(body)
    if tools and choice != "none" and logprobs is not None:
        raise bad_param("logprobs", "logprobs with tools is not supported (send tool_choice "
                                    "\"none\" or leave logprobs out)")
    return ChatParams(**common, messages=messages, thinking=_thinking(body),
                      logprobs=logprobs, tools=tools or None, tool_choice=choice,
                      parallel_tool_calls=parallel)


MAX_TOOL_DESCRIPTION = 16 << 10
"""Characters of a tool's description."""


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``tools`` as OpenAI spells them (``[{"type": "function", "function": {"name",
    "description", "parameters", "strict"}}]``), checked and bounded: at most
    ``MAX_TOOLS``, names as OpenAI allows them (``^[a-zA-Z0-9_-]{1,64}$``) and not twice,
    each ``parameters`` an object schema of bounded size and depth (the grammar's
    bounds; it is checked whole when a call is forced)."""
    from moescope.engine.grammar import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH
    from moescope.engine.tool_calls import MAX_TOOLS, NAME

    raw = body.get("tools")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad_param("tools", "tools must be a list of "
                                 '{"type": "function", "function": {"name": ...}}')
    if len(raw) > MAX_TOOLS:
        raise bad_param("tools", f"at most {MAX_TOOLS} tools, got {len(raw)}")
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function":
            raise bad_param(where, f'{where} must be {{"type": "function", "function": '
                                   '{"name": ..., "parameters": {...}}} (only function tools '
                                   "are supported)")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise bad_param(f"{where}.function.name", f"{where}.function.name must match "
                            f"^[a-zA-Z0-9_-]{{1,64}}$, got {_short(name)}")
        if name in names:
            raise bad_param(f"{where}.function.name", f"two tools are named {name!r}")
        names.add(name)
        description = function.get("description")
        if description is not None and (not isinstance(description, str)
                                        or len(description) > MAX_TOOL_DESCRIPTION):
            raise bad_param(f"{where}.function.description", f"{where}.function.description "
                            f"must be a string of at most {MAX_TOOL_DESCRIPTION} characters")
        strict = function.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_param(f"{where}.function.strict", "strict must be true or false")
        params = function.get("parameters")
        param = f"{where}.function.parameters"
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise bad_param(param, f"{param} must be a JSON schema (an object)")
        if params.get("type", "object") != "object":
            raise bad_param(param, f"{param} must describe an object (type \"object\"), got "
                                   f"type {_short(params.get('type'))}")
        try:
            size = len(json.dumps(params, separators=(",", ":")))
        except (ValueError, RecursionError):
            raise bad_param(param, f"{param} nests too deeply") from None
        if size > MAX_SCHEMA_BYTES:
            raise bad_param(param, f"{param} has {size} bytes; at most {MAX_SCHEMA_BYTES}")
        if _depth(params) > MAX_SCHEMA_DEPTH:
            raise bad_param(param, f"{param} nests deeper than {MAX_SCHEMA_DEPTH} levels")
        entry: dict[str, Any] = {"name": _text(name, where)}
        if description is not None:
            entry["description"] = _text(description, f"{where}.function.description")
        entry["parameters"] = params
        out.append({"type": "function", "function": entry})
    return out


def _depth(value: Any) -> int:
    """How deep objects and arrays nest in ``value`` (without recursion)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            items = node.values() if isinstance(node, dict) else node
            stack.extend((v, depth + 1) for v in items if isinstance(v, dict | list))
    return deepest


def _tool_choice(body: dict[str, Any], tools: list[dict[str, Any]]) -> str:
    """``tool_choice``: ``none``, ``auto`` (the default with tools), ``required``, or a
    function's name (from ``{"type": "function", "function": {"name": ...}}``, which
    must be among ``tools``)."""
    choice = body.get("tool_choice")
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise bad_param("tool_choice", "tool_choice 'required' asks for a function call, "
                                           "and the request has no tools")
        return "none" if not tools else str(choice)
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or choice.get("type") != "function":
        raise bad_param("tool_choice", 'tool_choice must be "none", "auto", "required" or '
                                       '{"type": "function", "function": {"name": ...}}, got '
                                       f"{_short(choice)}")
    if name not in {t["function"]["name"] for t in tools}:
        raise bad_param("tool_choice", f"tool_choice names {_short(name)}, which is not among "
                                       "the tools" if tools else "tool_choice asks for a "
                                       "function call, and the request has no tools")
    return f"function:{name}"


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    """``logprobs: true`` with ``top_logprobs`` alternatives (0..20), as OpenAI's chat
    reads them; ``top_logprobs`` above 0 without ``logprobs: true`` is refused, as OpenAI
    refuses it (0 asks for nothing and passes)."""
    on = body.get("logprobs")
    if on is None or on is False or (type(on) is int and on == 0):
        on = False
    elif on is not True:
        raise bad_param("logprobs", f"logprobs must be true or false, got {_short(on)} "
                                    "(top_logprobs says how many alternatives)")
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if not on:
        if top:
            raise bad_param("top_logprobs", "top_logprobs needs logprobs: true")
        return None
    return top or 0


def _thinking(body: dict[str, Any]) -> str:
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in THINKING_EFFORTS:
            raise bad_param("reasoning_effort", f"reasoning_effort must be one of "
                                                f"{', '.join(THINKING_EFFORTS)}")
        return _EFFORT_SETTING.get(effort, effort)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return "default"
    if not isinstance(kwargs, dict):
        raise bad_param("chat_template_kwargs", "chat_template_kwargs must be an object")
    enable = kwargs.get("enable_thinking")
    if enable is None:
        return "default"
    if not isinstance(enable, bool):
        raise bad_param("chat_template_kwargs", "enable_thinking must be true or false")
    return "on" if enable else "off"


def completion_params(body: Any, limits: Limits,
                      defaults: Mapping[str, float] | None = None) -> CompletionParams:
    """Check a ``/v1/completions`` body (one text prompt); ``defaults`` as
    :func:`chat_params`'."""
    if not isinstance(body, dict):
        raise bad_param("body", "the request body must be a JSON object")
    common = _common(body, limits, defaults)
    if common["max_tokens"] is None:
        common["max_tokens"] = min(16, limits.max_tokens)  # OpenAI's default here
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_param("prompt", "prompt is required" + (
            " (chat messages go to POST /v1/chat/completions)" if "messages" in body else ""))
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad_param("prompt", "prompt must be one string (token lists and batches of "
                                  "prompts are not supported)")
    _neutral(body, "echo", (False,), "the prompt is not echoed")
    _neutral(body, "suffix", ("",), "no insertion")
    _neutral(body, "top_logprobs", (0,), "a text completion's logprobs is the number of "
                                         "alternatives")
    logprobs = None if body.get("logprobs") is False else \
        _integer(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
    return CompletionParams(**common, prompt=_text(prompt, "prompt"), logprobs=logprobs)
