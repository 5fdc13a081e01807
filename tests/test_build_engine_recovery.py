"""Setup's failure paths: the engine builder (engine_patch/builder.py) and the Makefile's
venv stamp recover from a damaged cache, an interrupted or failed step and a full disk, and
say in one line what to do; no real download or build here (fake pip scripts, a tmp cache)."""

from __future__ import annotations

import errno
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _engine(module: str = "builder") -> ModuleType:
    """engine_patch.<module>, imported as a package from the repository's root."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"engine_patch.{module}")


def _fake_pip(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def _lock_for(content: bytes) -> dict[str, str]:
    return {"name": "llama-cpp-python", "version": "0.3.36",
            "filename": "llama_cpp_python-0.3.36.tar.gz",
            "sha256": hashlib.sha256(content).hexdigest()}


def test_damaged_cached_sdist_is_downloaded_again(tmp_path: Path) -> None:
    be = _engine()
    lock = _lock_for(b"the real sdist")
    (tmp_path / "sdist").mkdir()
    (tmp_path / "sdist" / lock["filename"]).write_bytes(b"the real sd")  # interrupted copy
    # `pip download ... -d DEST`: the last argument is the folder
    pip = _fake_pip(tmp_path / "pip", 'for a; do d="$a"; done\n'
                    f'printf "the real sdist" > "$d/{lock["filename"]}"')
    sdist = be.fetch_sdist(lock, tmp_path, pip)
    assert sdist.read_bytes() == b"the real sdist"


def test_failed_download_says_what_to_do(tmp_path: Path) -> None:
    be = _engine()
    lock = _lock_for(b"x")
    pip = _fake_pip(tmp_path / "pip", "echo 'ERROR: no network' >&2; exit 1")
    with pytest.raises(be.BuildError, match=r"could not download.*check the network"):
        be.fetch_sdist(lock, tmp_path, pip)


def test_wrong_download_is_removed(tmp_path: Path) -> None:
    be = _engine()
    lock = _lock_for(b"pinned")
    pip = _fake_pip(tmp_path / "pip", 'for a; do d="$a"; done\n'
                    f'printf "other" > "$d/{lock["filename"]}"')
    with pytest.raises(be.BuildError, match="does not match the pinned"):
        be.fetch_sdist(lock, tmp_path, pip)
    assert not (tmp_path / "sdist" / lock["filename"]).exists()


def _wheel(path: Path, lib: bool = True) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("llama_cpp/__init__.py", "x" * 50_000)
        if lib:
            zf.writestr("llama_cpp/lib/libllama.so", os.urandom(50_000))
    return path


def test_wheel_ok_refuses_truncated_and_engineless_wheels(tmp_path: Path) -> None:
    be = _engine()
    good = _wheel(tmp_path / "good.whl")
    assert be.wheel_ok(good)
    assert not be.wheel_ok(_wheel(tmp_path / "nolib.whl", lib=False))
    cut = tmp_path / "cut.whl"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    assert not be.wheel_ok(cut)
    assert not be.wheel_ok(tmp_path / "missing.whl")


def test_damaged_cached_wheel_is_removed_and_rebuilt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    be = _engine()
    monkeypatch.setenv("MOESCOPE_CACHE", str(tmp_path))
    monkeypatch.setenv("MOESCOPE_BACKEND", "cpu")  # no probing of this machine's GPUs
    monkeypatch.setattr(be, "check_tools", lambda backend: None)
    key = be.cache_key(be.read_lock()["sha256"], "cpu")
    entry = tmp_path / "wheels" / key
    entry.mkdir(parents=True)
    (entry / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").write_bytes(b"PK\x03\x04cut")

    def rebuild(*args: object) -> Path:
        raise be.BuildError("rebuilding (stopped here by the test)")

    monkeypatch.setattr(be, "build_env", rebuild)  # the first step of a rebuild
    assert be.main([]) == 2
    assert not entry.exists()
    out = capsys.readouterr()
    assert "is damaged; removing it and rebuilding" in out.out
    assert "rebuilding (stopped here by the test)" in out.err


@pytest.mark.parametrize(("exc", "code", "says"), [
    (KeyboardInterrupt(), 130, "interrupted: run make again"),
    (OSError(errno.ENOSPC, "No space left on device"), 2, "no space left on device"),
])
def test_ctrl_c_and_full_disk_end_in_one_line(
        exc: BaseException, code: int, says: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    be = _engine()
    monkeypatch.setenv("MOESCOPE_CACHE", str(tmp_path))
    monkeypatch.setenv("MOESCOPE_BACKEND", "cpu")

    def fail(backend: str) -> None:
        raise exc

    monkeypatch.setattr(be, "check_tools", fail)
    try:
        rc = be.main([])
    except BaseException as escaped:  # the user would see a traceback
        pytest.fail(f"main() let {escaped!r} escape")
    assert rc == code
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_build_out_of_space_names_it_and_leaves_no_partial_wheel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    be = _engine()
    env = tmp_path / "buildenv"
    (env / "bin").mkdir(parents=True)
    # `pip wheel ... -w OUT TREE`: a half-copied wheel, then the error
    _fake_pip(env / "bin" / "pip", 'while [ "$1" != -w ]; do shift; done\n'
              'mkdir -p "$2" && head -c 1000 /dev/zero > "$2/part.whl"\n'
              "echo 'OSError: [Errno 28] No space left on device'; exit 1")
    monkeypatch.setattr(be, "build_env", lambda cache: env)
    with pytest.raises(be.BuildError, match=r"no space left on device.*free about 1 GB"):
        be.build_wheel(tmp_path / "tree", tmp_path, [], False, "cpu")
    assert not list(tmp_path.glob("tmp-wheel-*"))


def test_sweep_removes_only_old_folders_of_dead_builds(tmp_path: Path) -> None:
    be = _engine()
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    old = time.time() - 13 * 3600
    for name in (f"tmp-wheel-{dead.pid}", f"tmp-wheel-{os.getpid()}", "tmp-wheel-x"):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (old, old))
    (tmp_path / "tmp-wheel-1").mkdir()  # recent: perhaps another machine's build
    be.sweep_tmp_wheels(tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(["tmp-wheel-1", f"tmp-wheel-{os.getpid()}", "tmp-wheel-x"])


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_deps_reruns_when_the_venv_python_is_gone(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    stamp = venv / ".moescope-deps"
    stamp.touch()
    future = time.time() + 3600  # newer than pyproject.toml and constraints.txt
    os.utime(stamp, (future, future))

    def dry_run() -> str:
        return subprocess.run(["make", "-n", "-C", str(ROOT), "deps", f"VENV={venv}"],
                              capture_output=True, text=True, check=True).stdout

    assert "pip install" not in dry_run()  # up to date
    (venv / "bin" / "python").unlink()  # deleted, or a dangling link after an upgrade
    assert "pip install" in dry_run()


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ninja") is None,
                    reason="needs cmake and ninja")
def test_cmake_build_builds_the_target_and_names_the_log_when_it_fails(tmp_path: Path) -> None:
    """The builder's CMake + ninja build (what the GPU check runs on its bundle), on a
    one-file library: the libraries' folder comes back; a compile error is one BuildError
    naming the log, and a library that was not built is named."""
    be = _engine()
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.14)\nproject(t C)\n"
        "set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
        "add_library(llama SHARED a.c)\n")
    (tree / "a.c").write_text("int llama_answer(void) { return 42; }\n")
    log = tmp_path / "build.log"
    progress: list[str] = []
    lib_dir = be.cmake_build(tree, tmp_path / "build", [], log, jobs=1,
                             expect=("libllama.so",), progress=progress.append)
    assert (lib_dir / "libllama.so").exists() and log.read_text().startswith("cmake ")
    with pytest.raises(be.BuildError, match=r"libggml-base.so is missing.*build.log"):
        be.cmake_build(tree, tmp_path / "build", [], log, jobs=1)
    (tree / "a.c").write_text("int llama_answer(void) { return }\n")
    with pytest.raises(be.BuildError, match=r"the build of llama failed \(log: .*build.log\)"):
        be.cmake_build(tree, tmp_path / "build", [], log, jobs=1, expect=("libllama.so",))


def test_a_file_switched_back_to_older_bytes_looks_newer_than_its_object(tmp_path: Path) -> None:
    """Checkouts share the patched tree: one writes new bytes (its object is built after),
    another syncs the old bytes back with their old source mtime. The build decides by
    mtime, so the synced file must be newer than that object or it is not recompiled."""
    sync_tree = _engine().sync_tree
    work, a, b = tmp_path / "work", tmp_path / "a", tmp_path / "b"
    for tree, text in ((a, "old"), (b, "new")):
        tree.mkdir()
        (tree / "rules.cpp").write_text(text)
        (tree / "same.cpp").write_text("same")
        os.utime(tree / "rules.cpp", (1_000_000, 1_000_000))  # sources from long ago
        os.utime(tree / "same.cpp", (1_000_000, 1_000_000))
    assert sync_tree(b, work) == 2
    obj = tmp_path / "rules.o"
    obj.write_text("built from new")  # built now, after the sync
    same_before = (work / "same.cpp").stat().st_mtime_ns
    time.sleep(0.01)
    assert sync_tree(a, work) == 1  # only the file whose bytes differ
    assert (work / "rules.cpp").read_text() == "old"
    assert (work / "rules.cpp").stat().st_mtime_ns >= obj.stat().st_mtime_ns
    assert (work / "same.cpp").stat().st_mtime_ns == same_before  # its object stays valid
