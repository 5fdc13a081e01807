"""A small, deterministic byte-level BPE vocabulary (GPT-2 style) for synthetic models.

llama.cpp refuses a ``gpt2`` tokenizer without merges and warns loudly without a
pre-tokenizer, and a vocabulary of raw bytes alone tokenizes every prompt into one token per
byte. So the synthetic models get a real, if tiny, BPE: the 256 byte tokens, merges learned
from a built-in English paragraph, ChatML control tokens and, when a larger vocabulary is
asked for than the paragraph supports, unused ``<|reserved_N|>`` padding tokens. The result
depends only on the requested size, so the same spec always yields the same token ids.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

# Original text written for this project; its only job is to yield plausible merges.
CORPUS = """\
The expert cache keeps a fixed number of slots in video memory for every layer of the model.
When the router of a layer picks its experts for the next token, some of them are already
resident and the rest must either be fetched from host memory or be replaced by a resident
expert that the router also liked. Fetching is exact but slow; substitution is fast but it
changes the output a little. The question this program answers is which misses are worth
waiting for. A simple rule works well: always fetch the first choice of the router, fetch
any other expert whose gate weight is at least fifteen percent, and substitute the others.
Experts that keep losing gate mass to substitution are admitted into the cache in the
background, off the critical path, and the least frequently used expert is evicted.
Hello! How are you today? I am fine, thank you. What is the weather like in the city?
It is sunny and warm, with a light wind from the sea. Let us write a short story about a
small robot who wanted to learn how to paint. Every morning the robot walked to the hill,
looked at the sky and the trees, and tried to mix the colors it saw. At first the pictures
were strange, but after many days they started to look like the world around it.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 2048 4096.
def main(): print("hello, world") return 0 if x == 1 else -1 for i in range(10): pass
The quick brown fox jumps over the lazy dog. Mixture of experts models route each token
to a few experts out of many, so most of the weights are idle for any given token. That is
what makes them fast, and that is also what makes it possible to keep only some of the
experts on the graphics card while the others wait in system memory.
"""

CONTROL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
THINKING_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    "'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\n<think>\\n'")
"""ChatML whose generation prompt opens ``<think>``, like Qwen3's *Thinking* models."""
HYBRID_THINKING_CHAT_TEMPLATE = (
    "{% if reasoning_effort is defined %}{{ '<|im_start|>system\\nReasoning: ' + "
    "reasoning_effort + '<|im_end|>\\n' }}{% endif %}"
    + CHAT_TEMPLATE.replace(
        "'<|im_start|>assistant\\n' }}",
        "'<|im_start|>assistant\\n' }}{% if enable_thinking is defined and "
        "enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"))
"""ChatML with both thinking switches: Qwen3 hybrids' ``enable_thinking`` (false writes an
empty think block) and gpt-oss's ``reasoning_effort`` (here a system line)."""

# llama.cpp token types (llama_token_type in llama.h / gguf.TokenType).
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_UNUSED = 5

N_BYTE_TOKENS = 256

# A simplified GPT-2 pre-tokenizer: contractions, words with an optional leading space,
# single digits, punctuation runs, whitespace.
_PRETOKENIZE = re.compile(
    r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"
)


@functools.cache
def byte_encoder() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map (``bytes_to_unicode``)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


@dataclass(frozen=True)
class Vocab:
    """Token strings, their llama.cpp types, the merges and the special token ids."""

    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_id: int
    eos_id: int
    pad_id: int
    chat_template: str = CHAT_TEMPLATE

    @property
    def size(self) -> int:
        return len(self.tokens)


def min_vocab_size() -> int:
    """Smallest vocabulary a synthetic model can have: bytes plus control tokens."""
    return N_BYTE_TOKENS + len(CONTROL_TOKENS)


@functools.cache
def _train_merges(max_merges: int) -> tuple[tuple[str, str], ...]:
    """Greedy BPE on :data:`CORPUS`; ties break on the pair itself, so it is deterministic."""
    enc = byte_encoder()
    words = Counter(_PRETOKENIZE.findall(CORPUS))
    seqs: dict[tuple[str, ...], int] = {}
    for word, count in words.items():
        sym = tuple(enc[b] for b in word.encode("utf-8"))
        seqs[sym] = seqs.get(sym, 0) + count
    merges: list[tuple[str, str]] = []
    while len(merges) < max_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for sym, count in seqs.items():
            for a, b in itertools.pairwise(sym):
                pairs[(a, b)] += count
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        new_seqs: dict[tuple[str, ...], int] = {}
        for sym, count in seqs.items():
            out: list[str] = []
            i = 0
            while i < len(sym):
                if i + 1 < len(sym) and (sym[i], sym[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(sym[i])
                    i += 1
            key = tuple(out)
            new_seqs[key] = new_seqs.get(key, 0) + count
        seqs = new_seqs
    return tuple(merges)


@functools.cache
def build_vocab(vocab_size: int) -> Vocab:
    """Build a vocabulary of exactly ``vocab_size`` tokens.

    Layout: byte tokens (ids 0-255, in byte order), learned merges, the ChatML control
    tokens, then unused padding tokens if the corpus ran out of merges.
    """
    if vocab_size < min_vocab_size():
        raise ValueError(f"vocab_size must be at least {min_vocab_size()}, got {vocab_size}")
    enc = byte_encoder()
    tokens: list[str] = [enc[b] for b in range(N_BYTE_TOKENS)]
    types: list[int] = [TOKEN_TYPE_NORMAL] * N_BYTE_TOKENS
    merges = _train_merges(vocab_size - min_vocab_size())
    seen = set(tokens)
    merge_strs: list[str] = []
    for a, b in merges:
        merge_strs.append(f"{a} {b}")
        if a + b not in seen:
            seen.add(a + b)
            tokens.append(a + b)
            types.append(TOKEN_TYPE_NORMAL)
    first_control = len(tokens)
    tokens.extend(CONTROL_TOKENS)
    types.extend([TOKEN_TYPE_CONTROL] * len(CONTROL_TOKENS))
    n_pad = vocab_size - len(tokens)
    tokens.extend(f"<|reserved_{i}|>" for i in range(n_pad))
    types.extend([TOKEN_TYPE_UNUSED] * n_pad)
    assert len(tokens) == vocab_size
    endoftext = first_control + CONTROL_TOKENS.index("<|endoftext|>")
    im_end = first_control + CONTROL_TOKENS.index("<|im_end|>")
    return Vocab(
        tokens=tuple(tokens),
        token_types=tuple(types),
        merges=tuple(merge_strs),
        bos_id=endoftext,
        eos_id=im_end,
        pad_id=endoftext,
    )


_SYLLABLES = tuple(c + v for c in ("", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n",
                                   "p", "qu", "r", "s", "t", "v", "w", "x", "z", "ch", "sh",
                                   "th", "st", "tr", "pr", "gr")
                   for v in ("a", "e", "i", "o", "u", "ou", "ea", "ai", "er", "on", "an",
                             "in"))


def _wide_pieces() -> Iterator[str]:
    """Text of a large vocabulary's tokens, real tokenizers' kinds in rough proportion:
    JSON punctuation runs, indentation, numbers, words with and without a leading space
    (capitalized too, and with punctuation after them), code-ish pieces, CJK characters.
    Endless (the caller stops it) and deterministic."""
    punct = ("{", "}", "[", "]", '"', ":", ",", " ", "\n", ".", "(", ")", "_", "-", "'")
    for n in (1, 2, 3):
        for combo in itertools.product(punct, repeat=n):
            yield "".join(combo)
    for k in range(1, 33):
        yield " " * k
        yield "\n" + " " * k
        yield "\t" * k
    for i in range(2000):
        yield str(i)
        yield " " + str(i)
    for cp in range(0x4E00, 0x4E00 + 12000):  # CJK ideographs, three UTF-8 bytes each
        yield chr(cp)
    for n in itertools.count(1):
        for combo in itertools.product(_SYLLABLES, repeat=n):
            word = "".join(combo)
            yield word
            yield " " + word
            yield " " + word.capitalize()
            yield word.capitalize()
            yield word + '":'
            yield '"' + word
            yield "_" + word


@functools.cache
def build_wide_vocab(vocab_size: int) -> Vocab:
    """A vocabulary of exactly ``vocab_size`` tokens that are all real text (no unused
    padding): :func:`build_vocab`'s bytes, merges and control tokens, then pieces like a
    large tokenizer's (Qwen3 has 151,936 tokens), for what costs per vocabulary entry
    (a grammar checks every token's text). Prompts tokenize as with :func:`build_vocab`
    (the merges are the same); the extra tokens are only generated."""
    base = build_vocab(4096)
    keep = [i for i, t in enumerate(base.token_types) if t != TOKEN_TYPE_UNUSED]
    if vocab_size < len(keep):
        raise ValueError(f"vocab_size must be at least {len(keep)}, got {vocab_size}")
    enc = byte_encoder()
    tokens = [base.tokens[i] for i in keep]
    types = [base.token_types[i] for i in keep]
    seen = set(tokens)
    pieces = _wide_pieces()
    while len(tokens) < vocab_size:
        token = "".join(enc[b] for b in next(pieces).encode("utf-8"))
        if token not in seen:
            seen.add(token)
            tokens.append(token)
            types.append(TOKEN_TYPE_NORMAL)
    return Vocab(tokens=tuple(tokens), token_types=tuple(types), merges=base.merges,
                 bos_id=tokens.index("<|endoftext|>"), eos_id=tokens.index("<|im_end|>"),
                 pad_id=tokens.index("<|endoftext|>"))
