"""``moescope chat [MODEL] [--system TEXT] [--policy P] [--budget B] [--trace FILE]``.

A terminal chat with the model: multi-turn through the model's chat template, tokens
streamed as they come, one dim summary line per answer (the line ``generate`` ends with),
and slash commands that steer the cache live, as the window's controls do: ``/policy`` and
``/budget`` go through the engine's request queue, so model, KV cache and conversation are
kept. Ctrl+C stops an answer (what was generated stays in the conversation); Ctrl+C or
Ctrl+D at an empty prompt quits. With stdin not a terminal it reads one message per line
and prints only answers and summaries, so a session can be scripted (exit status 1 when
a message got no answer). With ``--trace``, a recording that stopped before the end (a
full disk, a file size limit) is said when it happens, the chat goes on, and the command
exits with status 1 at the end, so a script does not take the trace for a whole one. The
terminal chat keeps no history: the conversation lives in memory and ends with the
command (``--trace`` records the cache's work, not a chat to reopen). A thinking model's
thoughts (``<think>`` or harmony channels, see ``model.reasoning``) print dim before the
answer on a terminal, not at all in a script, and never go back into the conversation;
Ctrl+C while it thinks means "answer now" (the thoughts are closed and it answers), a
second Ctrl+C stops.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from moescope.cache.audit import check_every
from moescope.cache.policy import PRESET_NAMES
from moescope.cli.commands.generate import (
    add_audit_argument,
    add_gpu_layers_argument,
    add_sampling_arguments,
    answer_summary,
    cache_state,
    check_trace_output,
    close_trace,
    model_inputs,
    open_trace,
    parse_live_policy,
    resolve_model,
    sampling_from_args,
    start_audits,
    summary_line,
    with_model_sampling,
)
from moescope.cli.options import (
    add_budget_arguments,
    add_ctx_argument,
    add_model_argument,
    add_no_cache_argument,
    add_policy_argument,
    add_threads_argument,
    check_ctx,
    check_list,
    check_model_header,
    check_ram_budget,
    check_threads,
    check_utf8,
    not_utf8,
    path_arg,
    print_load_notes,
)
from moescope.cli.terminal import (
    AnswerPrinter,
    stop_on_interrupt,
    stream_reader,
    terminal_reader,
    use_color,
)
from moescope.model.ram_fit import is_auto
from moescope.model.reasoning import THINKING_SETTINGS
from moescope.session.answer import answer_now
from moescope.session.recording import Recording, RecordingStopped
from moescope.trace.names import formats_help, live_trace_file
from moescope.util.errors import MoEScopeError
from moescope.util.words import plural, utf8_name

if TYPE_CHECKING:
    from moescope.engine import AnswerStats, CacheTotals, Engine, Message, Sampling

HELP = """\
/policy [NAME]   show or switch the policy (exact, quality-first, speed-first, ...;
                 preset:key=value works too, e.g. threshold:theta=0.3; the quality
                 guard: guard:target=1%)
/budget [X]      show or change the VRAM for expert slots (25%, 12GiB, 16 slots)
/ram [X]         show or change the host memory for experts (the rest is read from disk;
                 auto: what fits the memory available now, as at load)
/stats           this session's totals, per policy when more than one was used
/compare [P,...] [score]
                 answer your last message again under Exact and each policy (default
                 quality-first,speed-first,psr), greedily from an empty cache, side by
                 side; 'score' also scores the whole chat (perplexity vs Exact)
/reset           start a new conversation (the system prompt is kept)
/system [TEXT]   show or set the system prompt ('/system -' removes it)
/help            this list
/quit            leave (Ctrl+D or Ctrl+C at an empty prompt too)
A line ending in \\ continues on the next line; start with // to send a line that
begins with /. Ctrl+C during an answer stops it and keeps what was written."""

QUIT_COMMANDS = ("/quit", "/exit", "/q")


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``chat`` subcommand."""
    p = subparsers.add_parser(
        "chat", help="chat with a model in the terminal; steer the cache with /commands",
        description="Multi-turn chat in the terminal through the model's chat template, "
                    "with a summary line of the cache's work after every answer. Type "
                    "/help in the chat for its commands.")
    add_model_argument(p)
    p.add_argument("--system", default="", metavar="TEXT", help="system prompt")
    p.add_argument("--thinking", default="default", choices=THINKING_SETTINGS,
                   help="the chat template's thinking switch: off/on (Qwen3 hybrids), "
                        "low/medium/high (gpt-oss); default leaves the template be")
    add_policy_argument(p)
    add_budget_arguments(p)
    add_sampling_arguments(p, n_default=512, n_help="most tokens per answer")
    add_ctx_argument(p)
    add_gpu_layers_argument(p)
    add_threads_argument(p)
    add_no_cache_argument(p)
    p.add_argument("--trace", type=path_arg, metavar="FILE",
                   help="record the session as a trace, in the format its name ends with: "
                        f"{formats_help()} (replay it with `moescope replay`)")
    add_audit_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the model, then chat until /quit, end of input, or Ctrl+C at the prompt."""
    from moescope.cache.budget import parse_budget
    from moescope.engine import Engine

    policy = parse_live_policy(args.policy)  # fail fast, before loading
    parse_budget(args.budget)
    check_ram_budget(args.ram_budget)
    sampling_from_args(args)  # --tokens, --temperature, --seed
    check_utf8("--system", args.system)
    ctx_given = check_ctx(args)
    check_every(args.audit, "--audit")
    check_threads(args.threads)
    inputs = model_inputs(args.model)
    check_trace_output(args.trace, inputs)
    model = resolve_model(args.model)
    check_model_header(model, budget=args.budget, ram_budget=args.ram_budget, ctx=ctx_given,
                       cache=not args.no_cache)
    engine = Engine()
    recording: Recording | None = None
    try:
        loaded = engine.load(model, budget=args.budget, policy=policy, n_ctx=args.ctx,
                             n_gpu_layers=args.n_gpu_layers, n_threads=args.threads,
                             cache=not args.no_cache, ram_budget=args.ram_budget)
        print_load_notes(loaded)
        start_audits(engine, args.audit)
        if args.trace:
            recording = Recording(open_trace(args.trace, engine, inputs))
        stdin = sys.stdin
        tty = stdin.isatty()
        print(f"moescope chat · {utf8_name(loaded.path.name)} · {cache_state(engine)} · "
              f"context {loaded.n_ctx} tokens · /help for commands, Ctrl+D to quit",
              file=sys.stderr)
        thinking = args.thinking
        if thinking not in engine.thinking_choices():
            print(f"moescope: this model's chat template has no '{thinking}' thinking "
                  "setting; it is ignored", file=sys.stderr)
            thinking = "default"
        sampling = dataclasses.replace(
            with_model_sampling(sampling_from_args(args), engine, args), thinking=thinking)
        session = ChatSession(engine, sampling, system=args.system,
                              recording=recording, color=use_color(sys.stdout))
        read = terminal_reader() if tty else stream_reader(stdin)
        while True:
            line = read()
            if line is None or not session.handle(line):
                break
        if not tty and session.unanswered:  # a script learns that a message failed
            return 1
        if session.recording_stopped is not None:  # said when it stopped; the trace is cut
            return 1
    finally:
        if recording is not None:
            stop_reason = engine.last_answer.stop_reason
            closing = recording
            close_trace(args.trace, lambda: closing.close(stop_reason=stop_reason))
        engine.close()
    return 0


def dropped_note(n: int) -> str:
    """The dim line after an answer whose prompt left out the ``n`` earliest messages."""
    return (f"({plural(n, 'earliest message')} {'was' if n == 1 else 'were'} left out of "
            "the prompt to fit the context; /reset starts a new conversation)")


# ------------------------------------------------------------------------------ session
@dataclass
class SessionStats:
    """Sums over answers: what ``/stats`` shows (tok/s over decode time, like answers)."""

    answers: int = 0
    tokens: int = 0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    cache: CacheTotals | None = None
    ram_tier: bool = False
    """Whether an answer ran with the RAM tier on (the line then says disk MB/tok)."""

    def add(self, a: AnswerStats) -> None:
        from moescope.engine import CacheTotals

        self.ram_tier = self.ram_tier or a.ram_tier
        self.answers += 1
        self.tokens += a.n_tokens
        if a.n_tokens > 1:
            self.decode_tokens += a.n_tokens - 1
            self.decode_seconds += max(a.seconds - a.time_to_first_token_s, 0.0)
        if self.cache is None:
            self.cache = CacheTotals()
        self.cache.add(a.cache)

    @property
    def tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def line(self, label: str) -> str:
        from moescope.engine import CacheTotals

        answers = plural(self.answers, "answer")
        return summary_line(label, self.tokens_per_second if self.decode_tokens else None,
                            self.cache or CacheTotals(),
                            f"{answers}, {plural(self.tokens, 'token')}",
                            ram_tier=self.ram_tier)


@dataclass
class ChatSession:
    """One conversation with a loaded engine: its messages, commands and totals.

    Separate from the input loop so that tests (and other front ends) can feed it lines
    and inspect the engine afterwards.
    """

    engine: Engine
    sampling: Sampling
    system: str = ""
    recording: Recording | None = None
    color: bool = False
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    messages: list[Message] = field(default_factory=list)
    total: SessionStats = field(default_factory=SessionStats)
    by_policy: dict[str, SessionStats] = field(default_factory=dict)
    unanswered: int = 0
    """Messages that got no answer (one that did not fit the context, a template that
    refused it): a scripted session with any ends with exit status 1."""
    recording_stopped: RecordingStopped | None = None
    """Why ``--trace``'s recording stopped before the session ended (None: it did not):
    the command then ends with exit status 1."""

    _answer_prefix: str | None = field(default=None, init=False, repr=False)

    def answer_prefix(self) -> str:
        """What the model's template opens each answer with (read once: the thinking
        setting is fixed for the session)."""
        if self._answer_prefix is None:
            self._answer_prefix = self.engine.answer_prefix(self.sampling.thinking)
        return self._answer_prefix

    def conversation(self) -> list[Message]:
        """What the engine gets: the system prompt (if any), then every message."""
        from moescope.engine import Message

        head = [Message("system", self.system)] if self.system.strip() else []
        return head + self.messages

    def handle(self, line: str) -> bool:
        """One line of input: a command or a message. False means quit."""
        text = line.strip()
        if not text:
            return True
        why = not_utf8(line)
        if why is not None:  # a Latin-1 pipe, a stray byte: said, and the chat goes on
            self.unanswered += not text.startswith("/")
            self._error(f"the line {why}; not sent")
            return True
        if text.startswith("/") and not text.startswith("//"):
            return self.command(text)
        self.ask(line[1:] if text.startswith("//") else line)
        return True

    # -------------------------------------------------------------------- answers
    def ask(self, text: str) -> None:
        """Send ``text`` as the user's message and stream the answer."""
        from moescope.engine import Message

        self.messages.append(Message("user", text))
        engine = self.engine
        previous = engine.last_answer
        prefix = self.answer_prefix()
        printer = AnswerPrinter(self.out, show_thoughts=self.color, raw=prefix)
        start = ""
        try:
            while True:
                if start and self.recording is not None:
                    self.recording.answer_now()
                with stop_on_interrupt(engine) as interrupted:
                    for tok in engine.generate(self.conversation(), self.sampling,
                                               answer_start=start):
                        self._record(tok)
                        printer.feed(tok.text)
                        if interrupted():
                            engine.stop()  # Ctrl+C came before generate() cleared the flag
                self._record(None)  # before "answer now" generates again
                cut = answer_now(printer.raw, prefix) if interrupted() and not start else None
                if cut is None:
                    break
                # Ctrl+C while thinking: "answer now", from what it has thought so far
                self._add_to_totals(engine.last_answer)
                self._dim("(answer now: thoughts cut short; Ctrl+C again stops)")
                printer.feed(cut.closing)
                start = cut.start
        except MoEScopeError as err:  # e.g. the conversation outgrew the context
            if engine.last_answer is previous:
                self.messages.pop()
                self.unanswered += 1
                self._error(str(err) if _is_template_error(err)
                            else f"{err}; /reset starts a new conversation")
                return
            self._error(str(err))
        self._record(None)  # the answer's last token on disk before its summary
        answer = printer.finish()
        if answer:
            self.messages.append(Message("assistant", answer))
        if printer.last != "\n":
            self.out.write("\n")
        a = engine.last_answer
        self._dim(answer_summary(engine))
        if a.dropped_messages:
            self._dim(dropped_note(a.dropped_messages))
        self._add_to_totals(a)
        if a.stop_reason == "context full":
            self._error("the context is full; /reset starts a new conversation")

    def __post_init__(self) -> None:
        if self.recording is not None:
            self.recording.on_stopped = self._recording_stopped

    def _record(self, tok: Any) -> None:
        """Record a token (None: the generation is over: record the step that chose its
        end-of-generation token, and wait until all is written)."""
        if self.recording is not None:
            if tok is None:
                self.recording.end_answer(self.engine)
            else:
                self.recording.record(tok, self.engine)

    def _recording_stopped(self, stopped: RecordingStopped) -> None:
        """A failed write (a full disk) stopped recording; the chat goes on, and the
        command ends with exit status 1."""
        self.recording_stopped = stopped
        said = re.sub(r"^\[Errno \d+\] ", "", stopped.error or "a write failed")
        self._error(f"recording stopped ({said}); the trace so far is in "
                    f"{live_trace_file(stopped.path)}")

    def _add_to_totals(self, a: AnswerStats) -> None:
        if a.n_tokens:
            self.total.add(a)
            self.by_policy.setdefault("/".join(a.policies), SessionStats()).add(a)

    # -------------------------------------------------------------------- commands
    def command(self, text: str) -> bool:
        """Run a slash command; False for /quit."""
        name, _, arg = text.partition(" ")
        name, arg = name.lower(), arg.strip()
        if name in QUIT_COMMANDS:
            return False
        handlers: dict[str, Callable[[str], None]] = {
            "/help": lambda _: self._say(HELP), "/?": lambda _: self._say(HELP),
            "/policy": self._policy, "/budget": self._budget, "/stats": self._stats,
            "/ram": self._ram,
            "/reset": self._reset, "/system": self._system, "/compare": self._compare,
        }
        handler = handlers.get(name)
        if handler is None:
            self._error(f"unknown command {name}; /help lists the commands")
        else:
            handler(arg)
        return True

    def _policy(self, arg: str) -> None:
        if not arg:
            name = self.engine.guard.describe() if self.engine.guard else self.engine.policy_name
            self._say(f"policy {name} (presets: {', '.join(PRESET_NAMES)}; "
                      "the quality guard: guard:target=1%)")
            return
        try:
            policy = parse_live_policy(arg)
        except MoEScopeError as err:
            self._error(str(err))
            return
        self.engine.request_policy(policy)
        self.engine.apply_requests()
        self._say(f"policy {self.engine.policy_name} · {self._slots()}")

    def _budget(self, arg: str) -> None:
        from moescope.cache.budget import parse_budget

        plan = self.engine.model.plan if self.engine.model is not None else None
        if self.engine.cache is None or plan is None:
            self._error("the expert cache is off for this model; there is no budget")
            return
        if not arg:
            self._say(f"budget {plan.budget.text} · {self._slots()}")
            return
        try:
            parse_budget(arg)
        except MoEScopeError as err:
            self._error(str(err))
            return
        self.engine.request_budget(arg)
        errors = [c.text for c in self.engine.apply_requests() if c.kind == "error"]
        if errors:
            self._error(errors[0].removeprefix("budget error: "))
            return
        plan = self.engine.model.plan if self.engine.model is not None else None
        self._say(f"budget {arg} · {self._slots()}")
        if plan is not None and plan.clamped:
            self._say(f"note: {plan.message}")

    def _ram(self, arg: str) -> None:
        model = self.engine.model
        if self.engine.cache is None or model is None:
            self._error("the expert cache is off for this model; there is no RAM budget")
            return
        if not arg:
            ram = model.ram_plan
            self._say("RAM tier off: every expert in host memory" if ram is None else
                      f"RAM budget {ram.budget.text} · {ram.slots_per_layer}/{ram.n_expert} "
                      f"experts per layer in RAM")
            return
        try:
            ram = self.engine.set_ram_budget(arg)
        except MoEScopeError as err:
            self._error(str(err))
            return
        auto = is_auto(arg)
        if ram is None:  # the budget holds every expert ("/ram 24GiB" said only "off")
            self._say(f"RAM budget {'auto' if auto else arg} · RAM tier off: every expert "
                      f"in host memory")
        else:
            self._say(f"RAM budget {'auto' if auto else arg} · {ram.slots_per_layer}/"
                      f"{ram.n_expert} experts per layer")
        if auto and model.ram_note:
            self._say(f"note: {model.ram_note}")

    def _slots(self) -> str:
        """``16/64 slots per layer (25.0% resident)``, from what the engine has now."""
        model = self.engine.model
        if self.engine.cache is None or model is None or model.info is None:
            return "cache off"
        slots, n = self.engine.slots_per_layer, model.info.n_expert
        return f"{slots}/{n} slots per layer ({slots / n:.1%} resident)"

    def _stats(self, _arg: str) -> None:
        if not self.total.answers:
            self._say("no answers yet")
            return
        self._say(self.total.line("session"))
        if len(self.by_policy) > 1:
            for name, stats in self.by_policy.items():
                self._say("  " + stats.line(name))

    def _compare(self, arg: str) -> None:
        """The window's *Compare policies* dialog as a table: Exact's answer to the last
        message is the reference; with ``score``, every policy also reads the whole chat
        teacher-forced (``engine.compare``)."""
        from moescope.engine.compare import (
            compare_policies,
            conversation_tokens,
            same_start_text,
        )

        if self.engine.cache is None:
            self._error("the expert cache is off for this model; there is nothing to compare")
            return
        if self.recording is not None and self.recording.active:
            self._error("not while recording (--trace): a comparison empties the expert "
                        "cache, which the trace could not show, and its replay would differ")
            return
        conversation = self.conversation()
        while conversation and conversation[-1].role != "user":
            conversation.pop()
        if not any(m.role == "user" for m in conversation):
            self._error("send a message first: /compare answers your last message again")
            return
        words = arg.replace(",", " ").split()
        score = "score" in words
        names = [w for w in words if w != "score"] or ["quality-first", "speed-first", "psr"]
        try:
            check_list("/compare", names, "policies")
            policies = [parse_live_policy(name) for name in names]
        except MoEScopeError as err:
            self._error(str(err))
            return
        tokens = conversation_tokens(self.engine, self.conversation(),
                                     self.sampling.thinking) if score else []

        def progress(done: int, total: int, label: str) -> None:
            if label:
                self._dim(f"[{done + 1}/{total}] {label}…")

        with stop_on_interrupt(self.engine) as interrupted:
            result = compare_policies(
                self.engine, conversation, ["exact", *policies],
                max_tokens=min(self.sampling.max_tokens, 256), thinking=self.sampling.thinking,
                score=tokens, progress=progress, stopped=interrupted)
        rows = [("policy", "tok/s", "vs exact", "same start", "agreement", "hit",
                 "substituted", "mass/tok", "expected cost", "chat perplexity")]
        for i, a in enumerate(result.answers):
            c = a.cache
            ref = i == 0
            rows.append((a.policy, f"{a.tokens_per_second:.1f}",
                         "reference" if ref else f"{result.speedup(a):.2f}x",
                         "reference" if ref else same_start_text(a),
                         "reference" if ref else f"{a.agreement:.0%}",
                         f"{c.hit_rate:.1%}", f"{c.substituted_fraction:.1%}",
                         f"{c.mass_per_token:.3f}",
                         a.audit.cost_text() if a.audit is not None else "–",
                         "reference" if ref and a.nll is not None
                         else result.perplexity_text(a)))
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        for r in rows:
            self._say("  ".join(cell.ljust(w) if k == 0 else cell.rjust(w)
                                for k, (cell, w) in enumerate(zip(r, widths, strict=True))))
        most = result.max_tokens
        note = (f"greedy answers of up to {plural(most, 'token')}, each from an "
                "empty cache")
        if result.scored_tokens:
            note += f"; {result.scored_note()}"
        if result.stopped:
            note += "; stopped before every policy answered"
        if any(a.audit is not None for a in result.answers):
            note += ("; expected cost: audited, exp(mean KL) - 1, the perplexity cost "
                     "expected on the model's own text (its answer)")
        self._dim(note + "; the cache starts empty again")

    def _reset(self, _arg: str) -> None:
        self.messages.clear()
        kept = " (system prompt kept)" if self.system.strip() else ""
        self._say(f"new conversation{kept}")

    def _system(self, arg: str) -> None:
        if not arg:
            self._say(f"system prompt: {self.system}" if self.system.strip()
                      else "no system prompt")
            return
        self.system = "" if arg == "-" else arg
        self._say("system prompt removed" if not self.system
                  else "system prompt set; it applies to the whole conversation")

    # -------------------------------------------------------------------- output
    def _say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def _dim(self, text: str) -> None:
        self._say(f"\x1b[2m{text}\x1b[0m" if self.color else text)

    def _error(self, text: str) -> None:
        self.out.flush()
        self.err.write(f"moescope: {text}\n")
        self.err.flush()


def _is_template_error(err: MoEScopeError) -> bool:
    """The model's chat template refused the conversation (e.g. "System role not
    supported"): a reset would not help; the message alone says what to change."""
    from moescope.engine import ChatTemplateError

    return isinstance(err, ChatTemplateError)
