"""What the server does with a request, apart from HTTP: prompt, turn, tokens, numbers.

A request is prepared on the HTTP side (the chat template, the tokens, the checks that
give a 400 before anything waits), then takes a turn on the engine's queue
(``session.turns``) and generates on a worker thread. Tokens go out through ``emit`` as
deltas of reasoning and content; stop sequences and the thinking split are applied to
the stream here (:class:`TextStream`), so the streamed and the whole answers agree.
Listeners (the window) see every token on the decode thread, as the window's own chat
does.
"""

from __future__ import annotations

import dataclasses
import secrets
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from moescope.cache.audit import AuditEstimate, check_every
from moescope.model.reasoning import (
    HARMONY_CHANNEL,
    HARMONY_START,
    THINK_OPEN,
    held_back,
    split_reasoning,
)
from moescope.server.errors import ApiError, bad_param, busy, too_long
from moescope.server.params import (
    ChatParams,
    CompletionParams,
    GenerationParams,
    Limits,
    OutputFormat,
)
from moescope.session.turns import EngineQueue, QueueFull, Turn
from moescope.util.errors import MoEScopeError
from moescope.util.words import utf8_name

if TYPE_CHECKING:
    from moescope.engine import AnswerStats, CacheTotals, Engine, Sampling, TokenStats
    from moescope.engine.chat_tokens import ChatTokens
    from moescope.engine.grammar import Grammar
    from moescope.engine.logprobs import TokenLogprob
    from moescope.engine.tool_calls import ToolCall
    from moescope.trace.schema import Change


class TextStream:
    """The answer as a client sees it: stop sequences cut it, thinking goes apart.

    ``feed`` takes each token's text and returns what is new in the reasoning and in the
    content; text that might be the start of a stop sequence (or of a thinking marker)
    is held back until it is known not to be.

    It runs on the decode thread once per token, so the common cases cost next to
    nothing: without stop sequences and without a split (a text completion) a piece is
    its own delta, and a chat answer whose first characters cannot open a thought
    (``<think>``, harmony's markers) is all content from then on, so it is no longer
    split again each token.
    """

    def __init__(self, stops: Sequence[str], prefix: str = "", split: bool = True) -> None:
        self.stops = list(stops)
        self.prefix = prefix
        self.split = split
        self._text = ""
        self._pieces: list[str] = []
        """Pieces fed on the plain path, not yet joined into ``_text``."""
        self.stopped = False
        """A stop sequence appeared: generation should end."""
        self._sent = (0, 0)
        self._longest = max((len(s) for s in self.stops), default=0)
        self._stop_heads = {s[:n] for s in self.stops for n in range(1, len(s))}
        """Every proper prefix of a stop sequence: what a held-back tail may be."""
        self._plain = not self.stops and not split
        self._may_think = split
        """The answer could still open a thought; False once its start rules it out."""
        self._length = 0
        """Characters fed on the plain path."""
        self._content_start: int | None = None
        """Where the content begins in the generated text (after a thought), once known."""

    @property
    def text(self) -> str:
        """Generated text so far, cut at a stop sequence once one appears."""
        if self._pieces:
            self._text += "".join(self._pieces)
            self._pieces.clear()
        return self._text

    def feed(self, piece: str) -> tuple[str, str]:
        if self._plain:
            self._pieces.append(piece)
            self._length += len(piece)
            return "", piece
        if self.stopped:
            return "", ""
        start = max(0, len(self._text) - self._longest + 1)
        self._text += piece
        if self.stops:
            cut = min((i for i in (self._text.find(s, start) for s in self.stops) if i >= 0),
                      default=-1)
            if cut >= 0:
                self._text = self._text[:cut]
                self.stopped = True
                return self._delta(self._text, partial=False)
            held = self._held()
            return self._delta(self._text[:len(self._text) - held] if held else self._text,
                               partial=True)
        return self._delta(self._text, partial=True)

    def finish(self) -> tuple[str, str]:
        """Everything held back, now that no more text comes."""
        if self._plain:
            return "", ""
        return self._delta(self._text, partial=False)

    def content_span(self) -> tuple[int, int] | None:
        """Where the content sent so far lies in the generated text (the concatenated
        pieces fed, without the prefix): ``(start, end)``; None before any is sent."""
        if self._plain:
            return 0, self._length
        if self._content_start is None:
            return None
        return self._content_start, self._content_start + self._sent[1]

    def parts(self) -> tuple[str, str]:
        """(reasoning, content) of the whole answer."""
        if not self.split:
            return "", self.text
        s = split_reasoning(self.prefix + self.text)
        return s.reasoning, s.answer

    def _held(self) -> int:
        """Length of the longest tail that begins a stop sequence."""
        for n in range(min(self._longest - 1, len(self._text)), 0, -1):
            if self._text[-n:] in self._stop_heads:
                return n
        return 0

    def _delta(self, visible: str, partial: bool) -> tuple[str, str]:
        if self._may_think:
            head = (self.prefix + visible).lstrip()
            if partial and (not head or any(m.startswith(head) and m != head
                                            for m in _THOUGHT_OPENERS)):
                return "", ""  # blank or a cut marker so far: thought or answer is unknown
            if not self.prefix and not any(m.startswith(head[:len(m)])
                                           for m in _THOUGHT_OPENERS):
                self._may_think = False  # split_reasoning would give all of it as content
        if self._may_think:
            raw = self.prefix + visible
            s = split_reasoning(raw, partial=partial)
            reasoning, content = s.reasoning, s.answer
            if content and self._content_start is None:
                # the answer is the end of the text split_reasoning read: after the
                # thought, up to a marker held back at the end
                end = len(raw) - (held_back(raw) if partial else 0)
                self._content_start = max(0, end - len(content) - len(self.prefix))
        else:
            reasoning, content = "", visible
            if self._content_start is None:
                self._content_start = 0
        sent_r, sent_c = self._sent
        new_r = reasoning[sent_r:] if len(reasoning) > sent_r else ""
        new_c = content[sent_c:] if len(content) > sent_c else ""
        self._sent = (max(sent_r, len(reasoning)), max(sent_c, len(content)))
        return new_r, new_c


_THOUGHT_OPENERS = (THINK_OPEN, HARMONY_CHANNEL, HARMONY_START)
"""What an answer starts with when it thinks (``split_reasoning`` looks for nothing else
at its start)."""


@dataclass
class Job:
    """One prepared request: what to generate and how, and its way to be cancelled."""

    kind: str
    """``chat`` or ``completion``."""
    client: str
    prompt: str
    n_prompt_tokens: int
    sampling: Sampling
    stops: list[str]
    prefix: str = ""
    split: bool = False
    tokens: ChatTokens | None = None
    """A chat's prompt tokens (its users' words read as text); None: ``prompt``'s."""
    tools: list[dict[str, Any]] | None = None
    """The functions the answer may call: its content is read for calls in
    ``tool_format`` (``tool_calls.ToolCallStream``); None: no tools."""
    tool_format: str = ""
    parallel_tool_calls: bool = True
    cancelled: threading.Event = field(default_factory=threading.Event)
    generated: int = 0
    """Tokens generated so far."""
    cancelled_at: int | None = None
    """``generated`` when the client went away (None: it did not)."""

    def cancel(self) -> None:
        """The client is gone: stop after the current token (or never start)."""
        if not self.cancelled.is_set():
            self.cancelled_at = self.generated
            self.cancelled.set()


@dataclass
class SentToken:
    """A token of the content, as the response reports its log-probability."""

    offset: int
    """Where its text begins in the content (characters)."""
    logprob: TokenLogprob


@dataclass
class Delta:
    reasoning: str
    content: str
    logprobs: list[SentToken] | None = None
    """The log-probabilities of the tokens whose text this delta's content brings, when
    the request asked for them (None: it did not)."""
    tool_calls: list[ToolCall] | None = None
    """Calls completed with this delta (each whole: name, arguments, id)."""


class LogprobTrack:
    """Which tokens' log-probabilities go out with which delta: each token once, with the
    delta whose content first shows its text. Only the content's tokens are reported: a
    thinking model's thoughts have none (as OpenAI's reasoning models report none), nor
    does text after a stop sequence. A token that finishes a character begun by the one
    before goes out with it (the first one's text is empty)."""

    def __init__(self) -> None:
        self.tokens: list[tuple[int, int, TokenLogprob]] = []
        """``(start, end, logprob)`` of each token fed, in the generated text."""
        self.length = 0
        self.next = 0
        self.sent: list[SentToken] = []

    def add(self, text: str, logprob: TokenLogprob) -> None:
        start = self.length
        self.length += len(text)
        self.tokens.append((start, self.length, logprob))

    def release(self, span: tuple[int, int] | None, last: bool = False) -> list[SentToken]:
        """The tokens newly in the content span ``(start, end)``; ``last``: the answer is
        over, so tokens of no text at its very end go too."""
        if span is None:
            return []
        start, end = span
        out = []
        while self.next < len(self.tokens):
            a, b, lp = self.tokens[self.next]
            if a > end or (a == end and (b > a or not last)):
                break
            if b > start or (a == b and a >= start):
                out.append(SentToken(a - start if a > start else 0, lp))
            self.next += 1
        self.sent.extend(out)
        return out


def audit_numbers(est: AuditEstimate) -> dict[str, Any]:
    """The ``quality_cost`` of a response's ``moescope`` field: the audited perplexity cost
    of its answer (fractions, 0.0042 = +0.42%) with its 95% interval, as the window shows."""
    return {"estimate": round(est.cost, 6), "low": round(est.low, 6),
            "high": round(est.high, 6), "audits": est.n, "source": est.source,
            "meaning": est.words}


@dataclass
class RequestRecord:
    """One finished request: the server log's line and the response's extra numbers."""

    client: str
    kind: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    tokens_per_second: float
    ttft_s: float
    queued_s: float
    seconds: float
    finish_reason: str
    policy: str
    policies: list[str]
    slots_per_layer: int
    cache: CacheTotals
    reasoning: str = ""
    content: str = ""
    cancelled: bool = False
    tokens_after_cancel: int = 0
    """Tokens generated after the client went away (the one being decoded then)."""
    audit: AuditEstimate | None = None
    """The answer's audited quality cost, when audits were on (``Engine.set_audit``)."""
    logprobs: list[SentToken] | None = None
    """The content's tokens with their log-probabilities, when the request asked."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    """The calls the answer made (its content is then the text around them)."""

    @property
    def prefill_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def numbers(self) -> dict[str, Any]:
        """The ``moescope`` field of a response: the cache's work for this request."""
        c = self.cache
        return {
            "policy": self.policy, "policies": self.policies,
            "slots_per_layer": self.slots_per_layer,
            "hit_rate": round(c.hit_rate, 6),
            "substituted_fraction": round(c.substituted_fraction, 6),
            "substituted_mass": round(c.substituted_mass, 6),
            "mass_per_token": round(c.mass_per_token, 6),
            "fetched_mb": round(c.bytes_sync / 1e6, 6),
            "fetched_mb_per_token": round(c.fetched_mb_per_token, 6),
            "tok_s": round(self.tokens_per_second, 3),
            "ttft_s": round(self.ttft_s, 6),
            "queued_s": round(self.queued_s, 6),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefill_tokens": self.prefill_tokens,
            **({"quality_cost": audit_numbers(self.audit)} if self.audit else {}),
        }

    def log_line(self) -> str:
        c = self.cache
        cache = (f"hit {c.hit_rate:.1%} · mass/tok {c.mass_per_token:.3f} · "
                 if c.selections else "")
        return (f"{self.client} · {self.kind} · {self.prompt_tokens} in "
                f"({self.cached_tokens} reused) → {self.completion_tokens} out · "
                f"{self.tokens_per_second:.1f} tok/s · {cache}{'/'.join(self.policies)} · "
                f"{'cancelled' if self.cancelled else self.finish_reason}")


@dataclass
class Done:
    record: RequestRecord


@dataclass
class Failed:
    error: ApiError


Event = Delta | Done | Failed
Emit = Callable[[Event], None]


class ServeListener(Protocol):
    """What a window following the server's traffic implements (decode thread)."""

    def request_started(self, job: Job) -> None: ...

    def token(self, stats: TokenStats, job: Job) -> None: ...

    def request_finished(self, record: RequestRecord) -> None: ...

    def cache_applied(self, changes: list[Change]) -> None:
        """``/v1/moescope/cache`` applied ``changes`` while nothing generated (the
        steering thread, holding the engine's turn)."""


STEER_FIELDS = ("policy", "budget", "audit")
"""What ``POST /v1/moescope/cache`` reads; any other field is a 400 (it is MoEScope's own
endpoint, which no client sends vendor fields to: a misspelt one was ignored in silence)."""

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length",
                  "context full": "length", "stopped": "stop", "grammar": "stop"}
"""``grammar``: the answer's grammar allowed no token of the vocabulary (it cannot spell
what the schema needs): the answer ends there."""


def _parsed_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``messages`` with each tool call's ``arguments`` JSON text that holds an object
    made that object; None where no call's does."""
    import json

    changed = False
    out = []
    for m in messages:
        if "tool_calls" in m:
            calls = []
            for call in m["tool_calls"]:
                try:
                    value = json.loads(call["function"]["arguments"])
                except (ValueError, RecursionError):
                    value = None
                if isinstance(value, dict):
                    call = {**call, "function": {**call["function"], "arguments": value}}
                    changed = True
                calls.append(call)
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out if changed else None


class Service:
    """The served model: prepares requests, runs them one at a time, keeps the numbers."""

    def __init__(self, engine: Engine, queue: EngineQueue | None = None, *,
                 model_id: str | None = None, limits: Limits | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        if engine.model is None:
            raise MoEScopeError("no model is loaded")
        self.engine = engine
        self.queue = queue or EngineQueue()
        self.limits = limits or Limits()
        self.model_id = model_id or utf8_name(engine.model.path.stem)
        """The id clients see and send: the file's stem, a byte of it that is not UTF-8 (a
        name Python holds with ``surrogateescape``) written ``\\xff``, since JSON carries
        UTF-8 only."""
        self.created = int(time.time())
        self.listeners: list[ServeListener] = []
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.requests = 0
        self.tokens = 0
        from moescope.engine import CacheTotals

        self.totals: CacheTotals = CacheTotals()
        self.last: RequestRecord | None = None
        self._lock = threading.Lock()
        self._slots = engine.slots_per_layer
        self._thinking_choices = engine.thinking_choices()
        from moescope.engine.tool_calls import template_format

        self._tool_format = template_format(engine.chat_template)
        """The tool-call format of the model's chat template (``tool_calls``)."""
        self._tag_texts: dict[int, str] | None = None
        self._prefixes: dict[str, str] = {}
        from moescope.model.sampling_defaults import model_sampling

        info = engine.model.info
        self.sampling_defaults = model_sampling(info.metadata, extra=True) \
            if info is not None else {}
        """The model's recommended sampling (its GGUF's ``general.sampling.*``): what a
        request that leaves a field out gets, as from llama-server."""

    # ------------------------------------------------------------------ preparing
    def check_model(self, name: str | None) -> None:
        """404 for a model this server does not serve (its id or file name pass)."""
        model = self.engine.model
        names = {self.model_id, model.path.name, model.path.stem,
                 utf8_name(model.path.name)} if model else {self.model_id}
        if name is not None and name not in names:
            raise ApiError(404, f"the model '{name}' does not exist here; this server "
                                f"serves '{self.model_id}'", param="model",
                           code="model_not_found")

    def prepare_chat(self, p: ChatParams, client: str) -> Job:
        """Template, tokens and checks of a chat request (any thread: reads only)."""
        self.check_model(p.model)
        thinking = p.thinking if p.thinking in self._thinking_choices else "default"
        tools = p.tools if p.tools and p.tool_choice != "none" else None
        grammar = self._tool_grammar(p, tools) if tools else None
        if (p.output is not None or grammar is not None) and "off" in self._thinking_choices:
            thinking = "off"  # the grammar holds from the first token: no room for thoughts
        try:
            messages = p.messages
            if any(m["role"] == "tool" or "tool_calls" in m for m in messages):
                messages = self._tool_messages(messages, thinking)
            prompt = self.engine.format_chat(messages, thinking, tools=tools)
            # the users' and tools' words read as words: a message holding "<|im_end|>"
            # forges no turn (llama-server reads it as the token)
            tokens = self.engine.chat_tokens(messages, thinking, tools=tools)
        except MoEScopeError as err:
            raise bad_param("messages", str(err)) from None
        if thinking not in self._prefixes:
            self._prefixes[thinking] = self.engine.answer_prefix(thinking)
        job = self._job("chat", client, prompt, p, tokens, grammar)
        if p.output is None and grammar is None:
            job.prefix, job.split = self._prefixes[thinking], True
        if tools:
            job.tools, job.tool_format = tools, self._tool_format
            job.parallel_tool_calls = p.parallel_tool_calls
        return job

    def _tags(self) -> dict[int, str]:
        """The tool-call tags of the template's format that are control tokens in this
        vocabulary, by id, with their texts: the engine writes a control token as no text
        (as llama.cpp does unless asked), and llama-server reads calls from text that has
        them (it renders every token's text)."""
        if self._tag_texts is None:
            from moescope.engine.tool_calls import TAGS

            found = {}
            for tag in TAGS.get(self._tool_format, ()):
                ids = self.engine.tokenize(tag, add_bos=False, special=True)
                if len(ids) == 1 and self.engine.holds_control(tag):
                    found[ids[0]] = tag
            self._tag_texts = found
        return self._tag_texts

    def _tool_grammar(self, p: ChatParams, tools: list[dict[str, Any]]) -> Grammar | None:
        """400 for tools this model cannot call (its template has no tool support, or a
        format the server does not read, or they hold its control tokens' text); the
        grammar that makes the answer a call for ``required`` or a named function (None
        for ``auto``)."""
        import json

        from moescope.engine.grammar import GrammarError
        from moescope.engine.tool_calls import (
            HARMONY,
            HERMES,
            READ,
            REFUSED,
            ToolCallError,
            call_grammar,
            harmony_call_grammar,
            xml_call_grammar,
        )

        if self._tool_format not in READ:
            raise bad_param("tools", REFUSED[self._tool_format])
        for i, tool in enumerate(tools):
            # the template writes the tools as markup: a description holding "<|im_end|>"
            # would close the system turn
            if self.engine.holds_control(json.dumps(tool, ensure_ascii=False)):
                raise bad_param(f"tools[{i}]", f"tools[{i}] holds the text of one of this "
                                               "model's control tokens (<|im_end|>...)")
        if p.tool_choice == "auto":
            return None
        forced = tools if p.tool_choice == "required" else \
            [t for t in tools if t["function"]["name"] == p.tool_choice.split(":", 1)[1]]
        from moescope.engine.grammar import schema_grammar

        for tool in forced:  # each schema alone first: its errors name its place
            where = f"tools[{tools.index(tool)}].function.parameters"
            try:
                schema_grammar(tool["function"]["parameters"])
            except GrammarError as err:
                raise bad_param(where, f"{where}: the call cannot be forced: {err}") from None
        parallel = p.parallel_tool_calls and p.tool_choice == "required"
        try:
            return self.engine.compile_grammar(
                call_grammar(forced, parallel) if self._tool_format == HERMES
                else harmony_call_grammar(forced) if self._tool_format == HARMONY
                else xml_call_grammar(forced, parallel, self._tool_format))
        except (GrammarError, ToolCallError) as err:
            raise bad_param("tools", f"tools: the call cannot be forced: {err}") from None

    def _tool_messages(self, messages: list[dict[str, Any]],
                       thinking: str) -> list[dict[str, Any]]:
        """``messages`` as the chat template takes their tool calls: each call's
        ``arguments`` an object where they parse as one (what Hugging Face templates
        expect, as llama-server gives them: Qwen3.5's, Llama 3's, gpt-oss's...), else
        the JSON text OpenAI sends (a template that refuses objects gets the text);
        checked to show every call and tool result (:meth:`_check_tools_shown`)."""
        from moescope.engine import ChatTemplateError

        forms = [messages]
        parsed = _parsed_arguments(messages)
        if parsed is not None:
            forms.insert(0, parsed)
        refused: ChatTemplateError | None = None
        for form in forms:
            try:
                self._check_tools_shown(form, thinking)
                return form
            except ChatTemplateError as err:
                refused = refused or err
        assert refused is not None
        raise refused

    def _check_tools_shown(self, messages: list[dict[str, Any]], thinking: str) -> None:
        """400 naming the first tool call or tool result the model's chat template leaves
        out of the prompt (a plain ChatML template prints no ``tool_calls``; some skip the
        ``tool`` role): the model would answer without them, and the client would not
        know. One rendering with a mark in each call's function name and after each tool
        result tells which of them reach the prompt."""
        nonce = secrets.token_hex(6)
        marked = []
        for i, m in enumerate(messages):
            m = dict(m)
            if "tool_calls" in m:
                m["tool_calls"] = [
                    {**c, "function": {**c["function"],
                                       "name": f"{c['function']['name']}{nonce}c{i}x{j}y"}}
                    for j, c in enumerate(m["tool_calls"])]
            if m["role"] == "tool":
                m["content"] = f"{m['content']}{nonce}t{i}y"
            marked.append(m)
        text = self.engine.format_chat(marked, thinking)
        for i, m in enumerate(messages):
            for j, _ in enumerate(m.get("tool_calls", ())):
                if f"{nonce}c{i}x{j}y" not in text:
                    raise bad_param(f"messages[{i}].tool_calls",
                                    f"messages[{i}] has tool calls, and this model's chat "
                                    "template does not show tool calls: the model would "
                                    "not see them (send them as the assistant's content, "
                                    "or leave them out)")
            if m["role"] == "tool" and f"{nonce}t{i}y" not in text:
                raise bad_param(f"messages[{i}]", f"messages[{i}] is a tool result, and this "
                                                  "model's chat template leaves tool results "
                                                  "out: the model would not see it (send it "
                                                  "as a user message)")

    def prepare_completion(self, p: CompletionParams, client: str) -> Job:
        self.check_model(p.model)
        return self._job("completion", client, p.prompt, p)

    def _job(self, kind: str, client: str, prompt: str, p: GenerationParams,
             tokens: ChatTokens | None = None, grammar: Grammar | None = None) -> Job:
        from moescope.engine import Sampling

        n_ctx = self.engine.n_ctx
        if p.logit_bias and max(p.logit_bias) >= self.engine.n_vocab:
            raise bad_param("logit_bias", f"logit_bias has token {max(p.logit_bias)}; this "
                                          f"model's tokens are 0 to {self.engine.n_vocab - 1}")
        n_prompt = max(len(tokens.tokens) if tokens is not None else
                       len(self.engine.tokenize(prompt, add_bos=True, special=True)), 1)
        if n_prompt >= n_ctx:
            raise too_long("messages" if kind == "chat" else "prompt",
                           f"the prompt has {n_prompt} tokens; this model's context holds "
                           f"{n_ctx}, with room for at least one token of answer")
        sampling = Sampling(
            temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, min_p=p.min_p,
            repeat_penalty=p.repeat_penalty, frequency_penalty=p.frequency_penalty,
            presence_penalty=p.presence_penalty, xtc_probability=p.xtc_probability,
            xtc_threshold=p.xtc_threshold, mirostat=p.mirostat,
            mirostat_tau=p.mirostat_tau, mirostat_eta=p.mirostat_eta,
            max_tokens=p.max_tokens or self.limits.max_tokens,
            seed=secrets.randbits(32) if p.seed is None else p.seed,
            grammar=self._grammar(p.output) if grammar is None else grammar,
            logprobs=p.logprobs, logit_bias=p.logit_bias)
        return Job(kind=kind, client=client, prompt=prompt, n_prompt_tokens=n_prompt,
                   sampling=sampling, stops=p.stop, tokens=tokens)

    def _grammar(self, output: OutputFormat | None) -> Grammar | None:
        """The answer's grammar, compiled now (in the request's thread, before it waits):
        a schema or grammar that cannot be used is a 400 here, never a failed answer."""
        if output is None:
            return None
        from moescope.engine.grammar import GrammarError, json_object_grammar, schema_grammar

        try:
            text = (json_object_grammar() if output.schema is None
                    else schema_grammar(output.schema))
            return self.engine.compile_grammar(text)
        except GrammarError as err:
            raise bad_param("response_format", f"response_format: {err}") from None

    def join(self, client: str) -> Turn:
        """A place in the queue, or 503 when it is full."""
        try:
            return self.queue.join(client)
        except QueueFull as err:
            raise busy(retry_after_s=max(1, len(self.queue.waiting())), message=str(err)) \
                from None

    # ------------------------------------------------------------------ generating
    def run(self, job: Job, turn: Turn, emit: Emit) -> RequestRecord | None:
        """Wait for ``turn``, generate ``job`` and emit its deltas, then a :class:`Done`
        (or :class:`Failed`). Runs on a worker thread; the turn is left at the end."""
        try:
            if not self.queue.wait(turn) or job.cancelled.is_set():
                return None
            return self._generate(job, turn, emit)
        except MoEScopeError as err:
            emit(Failed(ApiError(400, str(err))))
        except Exception as err:  # a bug: logged whole here, one line for the client
            import traceback

            self.log(f"{job.client} · internal error: {traceback.format_exc()}")
            emit(Failed(ApiError(500, f"internal error: {type(err).__name__}",
                                 type="server_error")))
        finally:
            self.queue.leave(turn)
        return None

    def _generate(self, job: Job, turn: Turn, emit: Emit) -> RequestRecord:
        engine = self.engine
        stream = TextStream(job.stops, job.prefix, job.split)
        track = LogprobTrack() if job.sampling.logprobs is not None else None
        calls = harmony = tags = None
        if job.tools is not None:
            from moescope.engine.tool_calls import (
                HARMONY,
                HarmonyCallStream,
                ToolCallStream,
                parser,
            )

            tags = self._tags()
            if job.tool_format == HARMONY:  # taken out of the raw text, before the split
                harmony = HarmonyCallStream(t["function"]["name"] for t in job.tools)
            else:
                calls = ToolCallStream(parser(job.tool_format, job.tools),
                                       job.parallel_tool_calls)
        for listener in self.listeners:
            listener.request_started(job)
        for tok in engine.generate(job.tokens if job.tokens is not None else job.prompt,
                                   job.sampling):
            job.generated += 1
            for listener in self.listeners:
                listener.token(tok, job)
            text = tok.text if tags is None else tags.get(tok.token_id, tok.text)
            reasoning, content = stream.feed(text if harmony is None else harmony.feed(text))
            made = None
            if calls is not None:
                content, made = calls.feed(content)
            if track is not None and tok.logprob is not None:
                track.add(tok.text, tok.logprob)
            if reasoning or content or made:
                emit(Delta(reasoning, content, None if track is None
                           else track.release(stream.content_span()), made or None))
            if stream.stopped or job.cancelled.is_set() or (calls is not None and calls.done):
                engine.stop()
        made = None
        if harmony is not None:
            reasoning, content = stream.feed(harmony.finish())
            if reasoning or content:
                emit(Delta(reasoning, content))
            made = harmony.calls
        reasoning, content = stream.finish()
        if calls is not None:
            content, made = calls.feed(content)
            content += calls.finish()
        lps = None if track is None else track.release(stream.content_span(),
                                                       last=not stream.stopped)
        if reasoning or content or lps or made:
            emit(Delta(reasoning, content, lps, made or None))
        a = engine.last_answer
        self._slots = engine.slots_per_layer
        record = self._record(job, turn, a, stream)
        if calls is not None:
            record.content = calls.content
        made_calls = calls.calls if calls is not None else harmony.calls \
            if harmony is not None else []
        if made_calls:
            record.tool_calls = list(made_calls)
            record.finish_reason = "tool_calls"
        if track is not None:
            record.logprobs = track.sent
        with self._lock:
            self.requests += 1
            self.tokens += a.n_tokens
            self.totals.add(a.cache)
            self.last = record
        for listener in self.listeners:
            listener.request_finished(record)
        self.log(record.log_line())
        emit(Done(record))
        return record

    def _record(self, job: Job, turn: Turn, a: AnswerStats,
                stream: TextStream) -> RequestRecord:
        finish = "stop" if stream.stopped else FINISH_REASONS.get(a.stop_reason, "stop")
        reasoning, content = stream.parts()
        return RequestRecord(
            client=job.client, kind=job.kind, prompt_tokens=a.n_prompt_tokens,
            cached_tokens=a.n_cached_tokens, completion_tokens=a.n_tokens,
            tokens_per_second=a.tokens_per_second, ttft_s=a.time_to_first_token_s,
            queued_s=turn.waited_s, seconds=a.seconds, finish_reason=finish,
            policy=a.policies[-1] if a.policies else self.engine.policy_name,
            policies=list(a.policies), slots_per_layer=self._slots,
            cache=dataclasses.replace(a.cache), reasoning=reasoning, content=content,
            cancelled=job.cancelled_at is not None,
            tokens_after_cancel=(a.n_tokens - job.cancelled_at
                                 if job.cancelled_at is not None else 0),
            audit=a.audit)

    # ------------------------------------------------------------------ the cache
    def cache_state(self) -> dict[str, Any]:
        """``GET /v1/moescope/cache``: the policy, the budget, totals since the start."""
        from moescope.cache.guard import GUARD
        from moescope.cache.policy import PRESET_NAMES

        engine = self.engine
        model = engine.model
        plan = model.plan if model is not None else None
        with self._lock:
            t = dataclasses.replace(self.totals)
            last = None if self.last is None else {
                **self.last.numbers(), "client": self.last.client,
                "completion_tokens": self.last.completion_tokens,
                "finish_reason": self.last.finish_reason,
                "cancelled": self.last.cancelled,
                "tokens_after_cancel": self.last.tokens_after_cancel}
            requests, tokens = self.requests, self.tokens
        running = self.queue.running
        return {
            "object": "moescope.cache",
            "model": self.model_id,
            "cache_enabled": bool(model is not None and model.cache_enabled),
            "policy": engine.policy_name,
            "audit_every": engine.audit_every,
            "presets": [*PRESET_NAMES, GUARD],  # all this endpoint's "policy" takes
            "budget": plan.budget.text if plan is not None else None,
            "slots_per_layer": self._slots,
            "n_expert": plan.n_expert if plan is not None else None,
            "top_k": plan.top_k if plan is not None else None,
            "totals": {
                "requests": requests, "tokens": tokens,
                "hit_rate": round(t.hit_rate, 6),
                "substituted_fraction": round(t.substituted_fraction, 6),
                "substituted_mass": round(t.substituted_mass, 6),
                "fetched_mb": round(t.bytes_sync / 1e6, 6),
            },
            "last_request": last,
            "queue": {"running": running.who if running is not None else None,
                      "waiting": len(self.queue.waiting()),
                      "capacity": self.queue.capacity},
        }

    def steer(self, body: Any) -> dict[str, Any]:
        """``POST /v1/moescope/cache`` with ``policy`` and/or ``budget``: queued on the
        engine, applied now when it is idle, else before the running answer's next
        token. A budget the cache cannot take is a 400 and the previous one stays.

        ``policy`` is read as ``serve --policy`` reads it (the guard included), and
        ``budget`` as ``--budget`` (a whole number is that many slots per layer)."""
        from moescope.cache.budget import plan_for_model
        from moescope.cache.guard import parse_live_policy

        if not isinstance(body, dict):
            raise bad_param("body", "the request body must be a JSON object")
        unknown = [key for key in body if key not in STEER_FIELDS]
        if unknown:  # {"policy": "exact", "budgett": "50%"} changed the policy alone
            # written as it was sent: a lone surrogate (\ud800) cannot be encoded back
            name = unknown[0][:40].encode("utf-8", "backslashreplace").decode("utf-8")
            raise bad_param(name, f"unknown field '{name}': this endpoint takes "
                                  f"{', '.join(STEER_FIELDS)}")
        spec, budget, audit = body.get("policy"), body.get("budget"), body.get("audit")
        if spec is None and budget is None and audit is None:
            raise bad_param("policy", "give a policy (e.g. speed-first), a budget "
                                      "(e.g. 25%, 512MiB, 16) and/or an audit period "
                                      "(e.g. 16; 0 off)")
        if audit is not None:
            try:
                check_every(audit, "audit")
            except MoEScopeError as err:
                raise bad_param("audit", str(err)) from None
            if audit and (self.engine.model is None or not self.engine.model.cache_enabled):
                raise bad_param("audit", "the expert cache is off for this model; there is "
                                         "nothing to audit")
        policy = None
        if spec is not None:
            if not isinstance(spec, str) or len(spec) > 200:
                raise bad_param("policy", "policy must be a preset name, preset:key=value "
                                          "(e.g. threshold:theta=0.3) or guard:target=1%")
            try:
                policy = parse_live_policy(spec)
            except MoEScopeError as err:
                raise bad_param("policy", str(err)) from None
        model = self.engine.model
        if budget is not None:
            if isinstance(budget, int) and not isinstance(budget, bool):
                budget = str(budget)  # slots per layer, as --budget 16 reads
            if not isinstance(budget, str) or len(budget) > 40:
                raise bad_param("budget", "budget must be a string (25%, 512MiB, 16) or a "
                                          "whole number of slots per layer")
            if model is None or not model.cache_enabled or model.info is None:
                raise bad_param("budget", "the expert cache is off for this model; there "
                                          "is no budget")
            try:
                plan_for_model(model.info, budget)
            except MoEScopeError as err:
                raise bad_param("budget", str(err)) from None
        if policy is not None:
            self.engine.request_policy(policy)
        if budget is not None:
            self.engine.request_budget(budget)
        if audit is not None:
            self.engine.request_audit(audit)
        applied = self.apply_when_idle()
        return {**self.cache_state(), "applied": applied}

    def apply_when_idle(self) -> bool:
        """Apply queued policy/budget requests now if no generation runs (True), else
        leave them to the running generation's next token (False)."""
        turn = self.queue.join_if_idle("cache")
        if turn is None:
            return False
        try:
            changes = self.engine.apply_requests()
            errors = [c.text for c in changes if c.kind == "error"]
            self._slots = self.engine.slots_per_layer
            if changes:
                for listener in self.listeners:
                    listener.cache_applied(changes)
        finally:
            self.queue.leave(turn)
        if errors:
            raise bad_param("budget", errors[0].removeprefix("budget error: "))
        return True
