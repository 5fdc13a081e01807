"""``moescope pull`` against the stand-in Hub: listing with fits, download, one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hub_helpers import CHILD_TIMEOUT_S, GATED_REPO, REPO, SPLIT_REPO, Hub, held_pull, pull_process

from moescope.cli import main
from moescope.model.gguf_info import read_model_info
from moescope_testing.hub_server import closed_port_endpoint, file_key


def test_listing_shows_each_models_fit_without_downloading(hub: Hub,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", REPO, "--budget", "50%"]) == 0
    out = capsys.readouterr().out
    assert "2 GGUF models;" in out and "Tiny-MoE-Q4_0.gguf" in out
    assert out.count("8/16 experts per layer cached in VRAM (50.0% resident") == 2
    assert f"moescope pull {REPO}:Q4_0" in out
    assert not list(Path(os.environ["MOESCOPE_MODELS_DIR"]).rglob("*.gguf*"))


def test_pull_by_quant_downloads_then_says_already_there(hub: Hub,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", f"{REPO}:q8_0"]) == 0
    captured = capsys.readouterr()
    path = Path(os.environ["MOESCOPE_MODELS_DIR"]) / REPO / "Tiny-MoE-Q8_0.gguf"
    assert f"saved 477.7 KiB: {path}" in captured.out
    assert "100%" in captured.err  # the progress line
    assert read_model_info(path).n_expert == 16
    served = hub.server.served[file_key(REPO, "Tiny-MoE-Q8_0.gguf")]
    assert main(["pull", f"{REPO}:Tiny-MoE-Q8_0.gguf"]) == 0
    assert "already downloaded" in capsys.readouterr().out
    assert hub.server.served[file_key(REPO, "Tiny-MoE-Q8_0.gguf")] - served < 1 << 20


def test_split_model_by_name_into_a_chosen_folder(hub: Hub, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", f"{SPLIT_REPO}:Q8_0", "--dir", str(tmp_path / "elsewhere")]) == 0
    first = tmp_path / "elsewhere" / SPLIT_REPO / "Q8_0" / "Split-MoE-Q8_0-00001-of-00003.gguf"
    assert str(first) in capsys.readouterr().out
    assert len(read_model_info(first).parts) == 3


def test_check_only_and_search(hub: Hub,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", f"{REPO}:Q4_0", "--check"]) == 0
    assert "fits" in capsys.readouterr().out
    assert hub.server.served[file_key(REPO, "Tiny-MoE-Q4_0.gguf")] <= 1 << 20
    assert main(["pull", "--search", "tiny"]) == 0
    assert REPO in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["pull", f"{REPO}:Q6_K"], "no GGUF file named or quantized 'Q6_K'"),
    (["pull", "test-org/Nope"], "not found on 127.0.0.1"),
    (["pull", f"{GATED_REPO}:Q8_0"], "gated or private"),
    (["pull", "not a repo"], "is not a repository id"),
    (["pull", REPO, "--budget", "lots"], "cannot read budget"),
])
def test_errors_are_one_line(hub: Hub, capsys: pytest.CaptureFixture[str], argv: list[str],
                             message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("moescope: error: ") and message in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv", [["pull", "test-org/Nope"], ["pull", f"{REPO}:Q4_0", "--check"]])
def test_a_pull_that_saves_nothing_makes_no_models_folder(
        hub: Hub, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """The models folder was made before the Hub was asked: a refused or --check pull left
    an empty one behind."""
    folder = Path(os.environ["MOESCOPE_MODELS_DIR"])
    assert not folder.exists()
    main(argv)
    capsys.readouterr()
    assert not folder.exists()


def test_an_unusable_models_folder_is_refused_before_the_hub_is_asked(
        hub: Hub, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("MOESCOPE_MODELS_DIR", str(tmp_path / "a-file" / "models"))
    monkeypatch.setenv("HF_ENDPOINT", closed_port_endpoint())  # asked, it would say so
    assert main(["pull", f"{REPO}:Q8_0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moescope: error: the models folder ") and "not a folder" in err
    assert err.count("\n") == 1


def test_no_network(hub: Hub, monkeypatch: pytest.MonkeyPatch,
                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_ENDPOINT", closed_port_endpoint())
    assert main(["pull", REPO]) == 2
    err = capsys.readouterr().err
    assert "cannot reach 127.0.0.1" in err and err.count("\n") == 1


def test_a_second_pull_of_a_model_being_downloaded_is_refused_at_once(hub: Hub) -> None:
    """Two real `moescope pull` processes, one file: the second used to cut the shared
    `.incomplete` back to what it had checked while the first wrote on, and the first then
    put a file with a zero-filled gap in place (its sha256 was of the stream)."""
    with held_pull(hub) as first:
        second = pull_process(f"{REPO}:Q8_0")
        _, err = second.communicate(timeout=CHILD_TIMEOUT_S)
        assert second.returncode == 2, err
        assert err == (f"moescope: error: Tiny-MoE-Q8_0.gguf is already being downloaded by "
                       f"another MoEScope (process {first.process.pid}): let that download "
                       f"finish (or cancel it there), then try again\n")
        assert first.partial.read_bytes() == hub.tiny.read_bytes()[:100_000]  # untouched
        first.pause.go.set()
        out, err = first.process.communicate(timeout=CHILD_TIMEOUT_S)
        assert first.process.returncode == 0, err
        assert f"saved 477.7 KiB: {first.final}" in out
    assert first.final.read_bytes() == hub.tiny.read_bytes()
    assert sorted(p.name for p in first.final.parent.iterdir()) == [first.final.name]


def test_a_killed_pull_leaves_no_lock_that_blocks_the_next(hub: Hub,
        capsys: pytest.CaptureFixture[str]) -> None:
    with held_pull(hub) as first:
        lock = first.final.with_name(first.final.name + ".lock")
        assert lock.read_text().strip() == str(first.process.pid)
        first.process.kill()
        first.process.wait(CHILD_TIMEOUT_S)
    assert lock.is_file()  # left behind, but its lock died with the process
    assert main(["pull", f"{REPO}:Q8_0"]) == 0
    assert "saved 477.7 KiB" in capsys.readouterr().out
    assert hub.server.ranges[-1] == (file_key(REPO, "Tiny-MoE-Q8_0.gguf"), "bytes=100000-")
    assert first.final.read_bytes() == hub.tiny.read_bytes() and not lock.exists()


def test_a_search_on_an_endpoint_without_one_says_so_not_check_the_repository_id(
        hub: Hub, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A mirror (``HF_ENDPOINT``) that answers 404 to ``/api/models``: ``pull --search``
    said "the search: not found ... check the repository id and file name", though no
    repository was named."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class NoSearch(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NoSearch)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        assert main(["pull", "--search", "qwen"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("moescope: error: the search: not found on 127.0.0.1")
        assert "offers no model search" in err and "repository id" not in err
        assert err.count("\n") == 1
        assert main(["pull", "test-org/Nope"]) == 2  # a repository's 404 keeps its advice
        assert "check the repository id" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()
