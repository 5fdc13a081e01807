"""Found by the second hostile-input campaign: a flipped byte in a vocabulary token that made
it another token's twin aborted llama.cpp while loading (``GGML_ASSERT(id_to_token.size()
== token_to_id.size())`` in llama-vocab.cpp, SIGABRT). Two tokens with one text are now
refused in one line naming both, by ``info`` and before ``generate`` loads anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzz_helpers import explain

from moescope.model.gguf_info import read_model_info
from moescope.util.errors import ModelFormatError
from moescope_testing import fuzzgen
from moescope_testing.forkrun import ForkRunner


def _engine_ready() -> bool:
    try:
        from moescope.engine.bindings import is_patched

        return bool(is_patched())
    except Exception:
        return False


@pytest.fixture(scope="module")
def seed(fuzz_bases: tuple[list[Path], list[Path]]) -> Path:
    return next(m for m in fuzz_bases[0] if m.name.startswith("qwen3moe"))


def _with_tokens(seed: Path, dest: Path, edit: dict[int, bytes]) -> Path:
    doc = fuzzgen.read_doc(seed)
    kv = next(kv for kv in doc.kvs if kv.key == b"tokenizer.ggml.tokens")
    tokens = list(kv.value)
    for i, text in edit.items():
        tokens[i] = text
    kv.value = tokens
    dest.write_bytes(fuzzgen.encode_doc(doc))
    return dest


def _token(seed: Path, i: int) -> bytes:
    doc = fuzzgen.read_doc(seed)
    return next(kv for kv in doc.kvs if kv.key == b"tokenizer.ggml.tokens").value[i]


# (id, {token id: new text}, the pair the line names)
CASES = [
    ("twin", {200: None}, "tokens 100 and 200 of the vocabulary are both"),
    ("twin-after-nul", {200: b"\0tail"}, "tokens 100 and 200"),
    ("empty-named", {150: b"", 151: b"[EMPTY_150]"}, "tokens 150 and 151"),
]


@pytest.mark.parametrize(("edit", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_two_tokens_with_one_text_are_one_line(seed: Path, tmp_path: Path,
                                               edit: dict[int, bytes | None],
                                               message: str) -> None:
    same = _token(seed, 100)
    edit = {i: same + (t or b"") if t is None or t.startswith(b"\0") else t
            for i, t in edit.items()}
    path = _with_tokens(seed, tmp_path / "twin.gguf", edit)
    with pytest.raises(ModelFormatError, match=message) as err:
        read_model_info(path)
    text = str(err.value)
    assert text.startswith("twin.gguf: ") and "\n" not in text and "bug" not in text


def test_distinct_tokens_and_the_seed_pass(seed: Path, tmp_path: Path) -> None:
    read_model_info(seed)
    read_model_info(_with_tokens(seed, tmp_path / "ok.gguf", {150: b"", 151: b"x\xffy"}))


@pytest.mark.parametrize("command", ["info", "generate"])
def test_the_commands_end_in_one_line_not_an_abort(fork_runner: ForkRunner, seed: Path,
                                                   command: str) -> None:
    if command == "generate" and not _engine_ready():
        pytest.skip("the patched engine is not installed")
    path = _with_tokens(seed, fork_runner.scratch / "twin.gguf", {200: _token(seed, 100)})
    argv = [command, path.name] + (["--n", "1", "--prompt", "Hi"] if command == "generate"
                                   else [])
    r = fork_runner.run(argv, cwd=fork_runner.scratch)
    assert r.outcome == "error", explain(r)
    assert r.stderr.startswith("moescope: error: twin.gguf: tokens 100 and 200 of the "
                               "vocabulary are both")
