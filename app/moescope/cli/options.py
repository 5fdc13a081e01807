"""The arguments several subcommands share, defined once: the same name, default, units and
help wherever they appear (``generate``, ``chat``, ``bench``, ``eval``, ``serve``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from moescope.cache.policy import PRESET_NAMES
from moescope.model.ram_fit import DEFAULT_CONTEXT
from moescope.util.errors import BudgetError, MoEScopeError

if TYPE_CHECKING:
    from moescope.engine import LoadedModel

MIN_CTX = 16
"""The shortest context ``--ctx`` may ask for (chat and serve alike): fewer tokens do not
hold a chat template's turn."""
MAX_CTX = 1 << 22
"""The longest context ``--ctx`` may ask for (the model's own is the usual cap)."""
MAX_TOKENS = 1_000_000
"""Most tokens a count in an argument may ask to generate or score (``--tokens`` in
``generate``, ``chat``, ``bench`` and ``eval``)."""


def check_range(option: str, value: float, lo: float, hi: float, unit: str = "") -> None:
    """Refuse, in one line, a number read from an argument that is outside ``lo..hi``
    (NaN and the infinities too): every number a command takes is bounded here before it
    is used. ``unit`` follows the bounds (" s", " GB/s")."""
    if not lo <= value <= hi:  # False for NaN
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        raise MoEScopeError(f"{option} {shown} must be from {_bound(lo)} to "
                            f"{_bound(hi)}{unit}")


MAX_LIST = 64
"""Most policies or budgets one list may name (``replay -p``/``-b``, ``eval``, ``bench``,
chat's ``/compare``), as ``eval --sweep-theta`` takes at most 64 values: each is a run,
and ``replay`` runs every policy at every budget."""


def check_list(option: str, items: list[str], what: str) -> None:
    """Refuse, in one line, a list of policies or budgets that is longer than
    :data:`MAX_LIST` or names one twice (a row, or a run, repeated for nothing):
    ``replay -p exact,exact,... -b 25%,25%,...`` three thousand each was nine million
    replays and gigabytes before any output."""
    if len(items) > MAX_LIST:
        raise MoEScopeError(f"{option} names {len(items)} {what}; at most {MAX_LIST}")
    seen: set[str] = set()
    twice: list[str] = []
    for x in items:
        if x in seen and x not in twice:
            twice.append(x)
        seen.add(x)
    if twice:
        raise MoEScopeError(f"{option} names {', '.join(twice)} more than once")


def not_utf8(text: str) -> str | None:
    """Why ``text`` is not UTF-8 text, or None: Python reads the command line and standard
    input with ``surrogateescape``, so a byte that is not UTF-8 (a Latin-1 ``é``) arrives
    as a lone surrogate, which the tokenizer refused with a UnicodeEncodeError traceback."""
    for i, c in enumerate(text):
        if "\ud800" <= c <= "\udfff":
            code = ord(c)
            shown = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else "a surrogate"
            return f"is not UTF-8 text ({shown} at character {i + 1})"
    return None


def check_utf8(option: str, text: str | None) -> None:
    """Refuse, in one line, an argument of text (a prompt, a system prompt) that is not
    UTF-8 (:func:`not_utf8`)."""
    why = None if text is None else not_utf8(text)
    if why is not None:
        raise MoEScopeError(f"{option} {why}")


def _bound(x: float) -> str:
    """A bound as people write it: 1048576 and 1000000, not 1.04858e+06; 0.01 as is."""
    if isinstance(x, int) or (x.is_integer() and abs(x) < 1e15):
        return str(int(x))
    return f"{x:g}"


def path_arg(text: str) -> Path:
    """A file path argument (argparse ``type=``): an empty one is refused, where
    ``Path("")`` is ``.``, the current folder (``--csv ""`` said ".: is a folder", ``pull
    --dir ""`` downloaded into the current folder, ``info ""`` read "." as the model)."""
    if not text:
        raise argparse.ArgumentTypeError("is empty; give a path")
    return Path(text)


def add_model_argument(p: argparse.ArgumentParser) -> None:
    """The optional model path; the bundled demo model when it is left out."""
    p.add_argument("model", type=path_arg, nargs="?", metavar="MODEL.gguf",
                   help="GGUF model (default: the bundled demo model)")


def add_policy_argument(p: argparse.ArgumentParser) -> None:
    """One expert-cache policy, in the grammar of ``cache.policy`` and the quality guard."""
    p.add_argument("--policy", default="quality-first", metavar="POLICY",
                   help=f"expert-cache policy: {', '.join(PRESET_NAMES)}, or "
                        f"preset:key=value, e.g. threshold:theta=0.3, or the quality guard "
                        f"guard:target=1%% (default quality-first)")


def add_budget_arguments(p: argparse.ArgumentParser, *, vram: bool = True,
                         ram: bool = True) -> None:
    """The VRAM budget for expert slots and the RAM budget for experts (each unless it is
    False), both in ``cache.budget``'s grammar."""
    if vram:
        p.add_argument("--budget", default="25%",
                       help="VRAM for expert slots: 25%% of experts, 12GiB, 512MiB, or 16 "
                            "(slots per layer) (default 25%%)")
    if not ram:
        return
    p.add_argument("--ram-budget", default="auto", metavar="B",
                   help="host memory for experts (same units as --budget); experts beyond "
                        "it stay in the model file and are read on demand (default: auto, "
                        "all of them when the model fits the memory available, cgroup "
                        "limits included, else what fits; 100%% keeps all)")


def check_ram_budget(text: str | None, *, auto: bool = True) -> None:
    """``--ram-budget`` read by ``cache.budget``'s grammar before a model loads (or a trace
    is read), its error naming the option: it said "budget '4.7' has no unit" as
    ``--budget``'s does, so with both given neither said which one was wrong, and it came
    only from the engine's load. ``auto`` (the default's word) passes where ``auto`` is
    true (every command but ``replay``)."""
    from moescope.cache.budget import parse_budget
    from moescope.model.ram_fit import is_auto

    if text is None or (auto and is_auto(text)):
        return
    try:
        parse_budget(text)
    except BudgetError as err:
        raise MoEScopeError(f"--ram-budget: {err}") from None


def check_model_header(model: Path, *, budget: str | None = None,
                       ram_budget: str | None = None, ctx: int | None = None,
                       cache: bool = True) -> None:
    """What the model's GGUF header (read before the load: bounded, one line on a file
    that is not a whole GGUF) says of the options, before the slow load: ``--budget`` or
    ``--ram-budget`` asking for more experts per layer than the model has is refused,
    naming the option and the model's count (it came after reading the whole header
    again in the load, as "budget '999': ..." for either option); ``--ctx`` above the
    model's trained context is clamped to it, and says so in one line on stderr (the
    startup line alone showed the context used)."""
    from moescope.cache.budget import parse_budget
    from moescope.model.gguf_info import read_model_info
    from moescope.model.ram_fit import is_auto

    info = read_model_info(model, require_moe=False)
    if ctx is not None and info.context_length and ctx > info.context_length:
        print(f"moescope: --ctx {ctx} is above the model's {info.context_length}; using "
              f"{info.context_length}", file=sys.stderr)
    if not (cache and info.is_moe):
        return
    for option, text in (("--budget", budget), ("--ram-budget", ram_budget)):
        if text is None or is_auto(text):
            continue
        slots = parse_budget(text).slots
        if slots is not None and slots > info.n_expert:
            raise MoEScopeError(
                f"{option} {text.strip()} asks for {slots} experts per layer; the model "
                f"has {info.n_expert} (give at most {info.n_expert}, or 100%)")


def refuse_guard(spec: str, option: str, instead: str) -> None:
    """``replay`` and ``eval`` run fixed policies: the quality guard, which moves its policy
    from audits of the answers as a session goes, is refused by its name with what to do
    ``instead`` (it was "unknown policy 'guard'", though ``generate``, ``chat``, ``serve``
    and ``bench`` take it)."""
    from moescope.cache.guard import GUARD

    if spec.strip().split(":", 1)[0].strip() == GUARD:
        raise MoEScopeError(f"{option} {spec.strip()[:60]}: the quality guard steers from "
                            f"audits of the model's answers as a session goes; {instead}")


DEFAULT_CTX = DEFAULT_CONTEXT
"""``--ctx`` when it is not given (clamped to the model's own without a word)."""


def add_ctx_argument(p: argparse.ArgumentParser) -> None:
    """The context length of a session (bounded by :func:`check_ctx`). Left out, it reads
    None, which :func:`check_ctx` makes :data:`DEFAULT_CTX`: only a ``--ctx`` the user
    gave is worth a note when the model's context is shorter."""
    p.add_argument("--ctx", type=int, default=None, metavar="N",
                   help=f"context length in tokens, at least {MIN_CTX} (default "
                        f"{DEFAULT_CTX}, at most the model's)")


def check_ctx(args: argparse.Namespace) -> int | None:
    """``--ctx`` from :data:`MIN_CTX` to :data:`MAX_CTX`, the same in every command;
    ``args.ctx`` becomes :data:`DEFAULT_CTX` where it was left out. Returns the ``--ctx``
    the user gave, or None."""
    given: int | None = args.ctx
    if given is None:
        args.ctx = DEFAULT_CTX
    else:
        check_range("--ctx", given, MIN_CTX, MAX_CTX)
    return given


MAX_THREADS = 512
"""llama.cpp's ``GGML_MAX_N_THREADS``: more threads abort inside ggml (``bad_alloc``) or
end in a bare libgomp line."""


def add_threads_argument(p: argparse.ArgumentParser) -> None:
    """llama.cpp's CPU threads (bounded by :func:`check_threads`)."""
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help=f"CPU threads for llama.cpp, 1 to {MAX_THREADS} (default: "
                        "llama.cpp's choice)")


def check_threads(n: int | None) -> None:
    """``--threads`` within what llama.cpp accepts (None: llama.cpp's default)."""
    if n is not None and not 1 <= n <= MAX_THREADS:
        raise MoEScopeError(f"--threads must be between 1 and {MAX_THREADS} (this machine "
                            f"has {os.cpu_count() or 1} CPUs), got {n}")


def add_tokens_argument(p: argparse.ArgumentParser, *, default: int, what: str) -> None:
    """The token count, spelt the same in every command (``generate``, ``chat``,
    ``bench``, ``eval``): ``--tokens``, ``-n`` (llama.cpp's spelling, which people bring
    with them) and ``--n`` (``generate``'s and ``chat``'s old spelling, still taken); it
    reads as ``args.tokens``."""
    p.add_argument("-n", "--tokens", "--n", dest="tokens", type=int, default=default,
                   metavar="N",
                   help=f"{what} (default {default}; also -n, and --n, generate's and chat's "
                        "old spelling)")


def add_no_cache_argument(p: argparse.ArgumentParser) -> None:
    """Stock llama.cpp: the expert cache off."""
    p.add_argument("--no-cache", action="store_true", help="run stock llama.cpp (cache off)")


def print_load_notes(loaded: LoadedModel) -> None:
    """What the load chose that the user did not ask for (a clamped budget, a dense model's
    cache off, the RAM tier of a model larger than memory), one line each on stderr."""
    for note in (loaded.notice, loaded.ram_note):
        if note:
            print(f"moescope: {note}", file=sys.stderr)
