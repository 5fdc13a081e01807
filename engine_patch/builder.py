"""Build MoEScope's engine: llama-cpp-python 0.3.36 with our patches and the native core.

Why a build and not a vendored copy: the repo carries no third-party source. We download
the pinned sdist with pip, check its sha256, apply ``engine_patch/*.patch`` in order, copy
``native/`` (the expert-cache core) into the llama.cpp tree so it is compiled into libllama,
and build a wheel. The wheel is cached under a key hashed from every input (sdist hash,
patches, native sources, build flags, the builder's modules), so a second ``make test``
reuses it.

Incremental rebuilds: the patched tree is synced file-by-file into one working directory per
flavour (cpu/cuda/vulkan), keeping unchanged files' mtimes, and scikit-build-core reuses one
CMake build directory, so a change to the native core recompiles a handful of files, not 200.

A module, not only a script: ``engine_patch/build_engine.py`` (``make engine``) is its
command line (:func:`main`); ``bench/`` imports it for the sdist, the patches, the flags and
:func:`cmake_build`, the CMake + ninja build of libllama alone that the GPU check runs on a
machine without network or scikit-build-core. Which backend and its flags:
``engine_patch/backends.py``. Standard library only.

Environment: MOESCOPE_CACHE (default ~/.cache/moescope), MOESCOPE_BACKEND, MOESCOPE_CUDA=1
(same as MOESCOPE_BACKEND=cuda), CMAKE_CUDA_ARCHITECTURES (default: the GPUs' compute
capabilities, else "86;89;90"), CUBLAS_ROOT (a folder with include/ and lib/ of cuBLAS when
the CUDA toolkit lacks it), MOESCOPE_CCACHE=0 (ggml uses ccache when installed; this stops it).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine_patch.backends import (
    BACKENDS,
    BackendChoice,
    BuildError,
    check_tools,
    choose_backend,
    cmake_args,
    probe_vulkan_ctypes,
    requested_backend,
)

REPO = Path(__file__).resolve().parents[1]
PATCH_DIR = REPO / "engine_patch"
NATIVE_DIR = REPO / "native"
BUILDER_VERSION = "1"  # bump to invalidate every cached wheel
# The modules whose text is part of the cache key (what was the one script's text).
BUILDER_MODULES = (PATCH_DIR / "builder.py", PATCH_DIR / "backends.py")
BUILD_INFO = "moescope_build.json"  # beside libllama.so: backend and why (read by the app)
T0 = time.monotonic()

__all__ = ["BACKENDS", "BackendChoice", "BuildError", "choose_backend", "cmake_args",
           "requested_backend"]


def step(msg: str) -> None:
    """Print one build step with the elapsed time, so slow steps are visible in CI logs."""
    print(f"[engine {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def read_lock() -> dict[str, str]:
    lock: dict[str, str] = {}
    for line in (PATCH_DIR / "sdist.lock").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            lock[key.strip()] = value.strip()
    return lock


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_root() -> Path:
    return Path(os.environ.get("MOESCOPE_CACHE", Path.home() / ".cache" / "moescope"))


def patches(backend: str = "cpu", stock: bool = False) -> list[Path]:
    """The patches of one backend's build: a ``-vulkan-`` patch only for Vulkan (so the other
    builds' cache keys do not change with it); only ``-build-`` patches for ``stock``
    (--stock: no slot cache, for the benchmark)."""
    found = sorted(PATCH_DIR.glob("*.patch"))
    found = [p for p in found if backend == "vulkan" or "-vulkan-" not in p.name]
    return [p for p in found if "-build-" in p.name] if stock else found


def native_sources() -> list[Path]:
    """The core's sources as compiled into libllama: headers and .cpp files, flat."""
    files = sorted(NATIVE_DIR.glob("include/*.h")) + sorted(NATIVE_DIR.glob("src/*.h"))
    return files + sorted(NATIVE_DIR.glob("src/*.cpp"))


def cache_key(sdist_sha: str, backend: str = "cpu", archs: str | None = None,
              stock: bool = False) -> str:
    """Hash of everything that changes the wheel's bytes (ccache does not)."""
    h = hashlib.sha256()
    h.update(f"builder={BUILDER_VERSION}\nsdist={sdist_sha}\nstock={stock}\n".encode())
    for module in BUILDER_MODULES:
        h.update(module.read_bytes())
    h.update((PATCH_DIR / "build-requirements.txt").read_bytes())
    for path in patches(backend, stock) + native_sources():
        h.update(f"\n{path.relative_to(REPO)}\n".encode())
        h.update(path.read_bytes())
    flags = [a for a in cmake_args(backend, archs) if not a.startswith("-DGGML_CCACHE")]
    h.update("\n".join(flags).encode())
    return h.hexdigest()[:16]


def fetch_sdist(lock: dict[str, str], cache: Path, pip: Path | None = None) -> Path:
    """The pinned sdist, hash-checked; a damaged cached copy (an interrupted copy, a bad
    disk) is downloaded again. ``pip``: the build venv's, whose scikit-build-core prepares
    the sdist's metadata (no isolated env to fetch, no pip traceback about the backend)."""
    dest = cache / "sdist"
    sdist = dest / lock["filename"]
    digest = sha256_file(sdist) if sdist.exists() else None
    if digest is not None and digest != lock["sha256"]:
        step(f"cached {sdist.name} is damaged (sha256 mismatch); downloading it again")
        sdist.unlink()
        digest = None
    if digest is None:
        step(f"downloading {lock['name']}=={lock['version']} sdist with pip")
        dest.mkdir(parents=True, exist_ok=True)
        pip = pip or build_env(cache) / "bin" / "pip"
        proc = subprocess.run(
            [str(pip), "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
             "--quiet", f"{lock['name']}=={lock['version']}", "-d", str(dest)], check=False)
        if proc.returncode != 0 or not sdist.exists():
            raise BuildError(
                f"could not download {lock['name']}=={lock['version']} (pip's message above): "
                f"check the network or proxy (PIP_INDEX_URL), or put {lock['filename']} "
                f"(sha256 {lock['sha256']}) into {dest}/, then run make again")
        digest = sha256_file(sdist)
    if digest != lock["sha256"]:
        sdist.unlink()
        raise BuildError(f"{sdist.name}: sha256 {digest} does not match the pinned "
                         f"{lock['sha256']} (engine_patch/sdist.lock); the file was removed "
                         "(if this repeats, your package index serves a different file)")
    step(f"sdist verified: {sdist.name} sha256 {digest[:12]}...")
    return sdist


def apply_patches(tree: Path, backend: str = "cpu", stock: bool = False) -> None:
    """Apply every patch in order; a failure names the patch, the file and the hunk."""
    for patch in patches(backend, stock):
        cmd = ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-i",
               str(patch)]
        dry = subprocess.run([*cmd, "--dry-run"], cwd=tree, capture_output=True, text=True)
        if dry.returncode != 0:
            raise BuildError(f"patch {patch.name} does not apply:\n{dry.stdout}{dry.stderr}")
        subprocess.run(cmd, cwd=tree, check=True, capture_output=True)
        step(f"applied {patch.name}")


def sync_tree(src: Path, dst: Path) -> int:
    """Make dst equal to src, touching only files whose bytes differ (keeps mtimes)."""
    changed = 0
    seen: set[Path] = set()
    for path in src.rglob("*"):
        rel = path.relative_to(src)
        seen.add(rel)
        target = dst / rel
        if path.is_dir() and not path.is_symlink():
            target.mkdir(parents=True, exist_ok=True)
            continue
        if target.exists() and not path.is_symlink() and target.stat().st_size == \
                path.stat().st_size and target.read_bytes() == path.read_bytes():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() or target.is_symlink():
            target.unlink()
        shutil.copy2(path, target, follow_symlinks=False)
        changed += 1
    for path in sorted(dst.rglob("*"), reverse=True):
        if path.relative_to(dst) not in seen:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            changed += 1
    return changed


def prepare_tree(sdist: Path, lock: dict[str, str], work: Path, key: str,
                 backend: str = "cpu", stock: bool = False) -> Path:
    """Unpack, patch, add the core, stamp the version; sync into the stable work tree."""
    with tempfile.TemporaryDirectory(prefix="moescope-engine-") as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="tar")
        tree = Path(tmp) / f"llama_cpp_python-{lock['version']}"
        shutil.rmtree(tree / "vendor" / "llama.cpp" / ".git", ignore_errors=True)
        apply_patches(tree, backend, stock)
        core_dir = tree / "vendor" / "llama.cpp" / "src" / "moescope"
        core_dir.mkdir()
        for path in native_sources():
            shutil.copy2(path, core_dir / path.name)
        init = tree / "llama_cpp" / "__init__.py"
        init.write_text(init.read_text().replace(
            f'__version__ = "{lock["version"]}"',
            f'__version__ = "{lock["version"]}+{"stock" if stock else "moescope"}.{key}"'))
        work.mkdir(parents=True, exist_ok=True)
        changed = sync_tree(tree, work)
    step(f"patched tree ready in {work} ({changed} files changed)")
    return work


def build_env(cache: Path) -> Path:
    """A private venv with the pinned build backend (for --no-build-isolation reuse)."""
    reqs = PATCH_DIR / "build-requirements.txt"
    env = cache / "buildenv"
    stamp = env / "requirements.sha256"
    want = sha256_file(reqs)
    if not stamp.exists() or stamp.read_text() != want:
        step("creating the build environment (scikit-build-core)")
        shutil.rmtree(env, ignore_errors=True)
        if subprocess.run([sys.executable, "-m", "venv", str(env)], check=False).returncode:
            raise BuildError(f"could not create the build venv {env}: install python3-venv "
                             "(`sudo apt-get install python3-venv`), then run make again")
        if subprocess.run([str(env / "bin" / "pip"), "install", "--quiet", "-r", str(reqs)],
                          check=False).returncode:
            raise BuildError("could not install the build backend (engine_patch/"
                             "build-requirements.txt; pip's message above): check the "
                             "network or proxy (PIP_INDEX_URL), then run make again")
        stamp.write_text(want)
    return env


def build_wheel(tree: Path, cache: Path, args: list[str], configure_only: bool,
                flavour: str) -> Path:
    env = build_env(cache)
    build_dir = cache / "build" / flavour
    out = cache / f"tmp-wheel-{os.getpid()}"
    shutil.rmtree(out, ignore_errors=True)
    if configure_only:
        step(f"configuring only ({flavour}): cmake {' '.join(args)}")
        cmake_build(tree, build_dir / "configure-only", args, targets=())
        step("CMake configuration succeeded")
        return build_dir
    environ = dict(os.environ)
    environ["CMAKE_ARGS"] = " ".join(args)
    environ.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    first = {"cuda": "~20-45 min", "vulkan": "~15-25 min"}.get(flavour.split("-")[0], "~3-4 min")
    step(f"building the {flavour} wheel (first build {first} on 2 cores; incremental later)")
    log = cache / f"build-{flavour}.log"
    try:
        with log.open("w") as f:
            proc = subprocess.run(
                [str(env / "bin" / "pip"), "wheel", "--no-deps", "--no-build-isolation",
                 "-C", f"build-dir={build_dir}", "-C", "cmake.verbose=false",
                 "-w", str(out), str(tree)],
                env=environ, stdout=f, stderr=subprocess.STDOUT, check=False)
    except BaseException:  # Ctrl+C: no half-copied wheel left behind
        shutil.rmtree(out, ignore_errors=True)
        raise
    if proc.returncode != 0:
        shutil.rmtree(out, ignore_errors=True)  # a half-copied wheel would fill the disk
        text = log.read_text(errors="replace")
        if "No space left on device" in text:
            raise BuildError(no_space(cache, log))
        tail = "".join(text.splitlines(True)[-40:])
        raise BuildError(f"wheel build failed (full log: {log}):\n{tail}")
    wheels = list(out.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"expected one wheel in {out}, found {wheels}")
    return wheels[0]


def cmake_build(tree: Path, build_dir: Path, args: list[str], log: Path | None = None, *,
                targets: tuple[str, ...] = ("llama",), jobs: int | None = None,
                expect: tuple[str, ...] = ("libllama.so", "libggml-base.so"),
                progress: Callable[[str], None] | None = None) -> Path:
    """Configure ``tree`` with CMake (Ninja) and build ``targets`` straight with ninja: no
    wheel, no scikit-build-core, no network. ``--configure-only`` (``targets=()``) and the
    GPU check's builds from its bundle; a rerun over the same ``build_dir`` only relinks.
    Output goes to ``log`` (else the terminal); every ~30 s ``progress`` gets ninja's
    latest "[n/m]" line. Returns the folder of the built libraries, each of ``expect``
    checked; raises :class:`BuildError` naming the log."""
    build_dir.mkdir(parents=True, exist_ok=True)
    where = f" (log: {log})" if log else ""
    with log.open("w") if log else contextlib.nullcontext() as out:
        if out is not None:
            out.write("cmake " + " ".join(args) + "\n")
            out.flush()
        rc = subprocess.run(["cmake", "-S", str(tree), "-B", str(build_dir), "-G", "Ninja",
                             "-Wno-dev", *args], stdout=out, stderr=subprocess.STDOUT,
                            check=False).returncode
        if rc != 0:
            raise BuildError(f"CMake configuration failed{where}")
        if not targets:
            return build_dir
        proc = subprocess.Popen(["ninja", "-C", str(build_dir), f"-j{jobs or os.cpu_count() or 2}",
                                 *targets], stdout=out, stderr=subprocess.STDOUT)
        while True:
            try:
                rc = proc.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                if progress is not None and log is not None:
                    progress(last_progress_line(log))
    if rc != 0:
        raise BuildError(f"the build of {' '.join(targets)} failed{where}")
    lib_dir = build_dir / "bin"
    for name in expect:
        if not (lib_dir / name).exists():
            raise BuildError(f"{name} is missing after the build{where}")
    return lib_dir


def last_progress_line(log: Path) -> str:
    """The latest ninja "[n/m] ..." line of a build log (shortened)."""
    try:
        with log.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return "building"
    for line in reversed(lines):
        if line.startswith("["):
            return line[:110]
    return "building"


def no_space(cache: Path, log: Path | None = None) -> str:
    where = f" (log: {log})" if log else ""
    return (f"no space left on device while building the engine{where}: free about 1 GB "
            f"under {cache} and {tempfile.gettempdir()} (or set MOESCOPE_CACHE to a bigger "
            "disk), then run make again")


def wheel_ok(path: Path) -> bool:
    """A complete wheel with the engine in it, not a truncated or damaged copy (~0.2 s)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            return zf.testzip() is None and any(
                n.endswith("/libllama.so") for n in zf.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def sweep_tmp_wheels(cache: Path) -> None:
    """Remove tmp-wheel-<pid> folders of builds that were killed (each can hold ~14 MB);
    only old ones, in case the cache is shared with another machine (pids differ there)."""
    for tmp in cache.glob("tmp-wheel-*"):
        pid = tmp.name.rpartition("-")[2]
        if not pid.isdigit() or time.time() - tmp.stat().st_mtime < 12 * 3600:
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass  # alive, another user's


def install(wheel: Path, venv: Path, key: str) -> None:
    """Install into the project venv unless this exact build is already there."""
    marker = venv / "moescope-engine.key"
    if marker.exists() and marker.read_text().strip() == key:
        step(f"engine {key} already installed in {venv}")
        return
    step(f"installing {wheel.name} into {venv}")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--no-deps", "--force-reinstall", str(wheel)], check=True)
    marker.write_text(key + "\n")


def unpack(wheel: Path, site: Path) -> Path:
    """The wheel's files under ``site`` (whole, or not there), executables kept runnable."""
    if not (site / "llama_cpp").is_dir():
        import zipfile

        part = site.with_name(f"{site.name}.part-{os.getpid()}")
        shutil.rmtree(part, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(part)
        for so in (part / "llama_cpp" / "lib").glob("*.so*"):
            so.chmod(0o755)
        shutil.rmtree(site, ignore_errors=True)
        part.rename(site)
    return site


def installed_lib_dir(venv: Path) -> Path | None:
    """llama_cpp/lib of the venv's installed engine (found without importing it)."""
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.util as u; s = u.find_spec('llama_cpp'); "
         "print(s.submodule_search_locations[0] if s else '')"],
        capture_output=True, text=True, check=False).stdout.strip()
    return Path(out) / "lib" if out else None


def write_build_info(lib_dir: Path, choice: BackendChoice, key: str) -> None:
    """Which backend this libllama was built for and why, for the app's About and memory
    view (rewritten on every run: the reason belongs to this machine, not to the wheel)."""
    info = {"backend": choice.backend, "reason": choice.reason, "key": key,
            "cuda_architectures": choice.archs or ""}
    target = lib_dir / BUILD_INFO
    if target.is_symlink():
        target.unlink()
    tmp = target.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    tmp.replace(target)


def _lock(cache: Path, flavour: str) -> Any:
    """Hold an exclusive lock on this flavour's build directory until the process exits
    (or the handle is closed); flavour "shared" guards the sdist and the build venv, which
    every flavour uses."""
    import fcntl

    cache.mkdir(parents=True, exist_ok=True)
    handle = (cache / f"build-{flavour}.lock").open("w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        step(f"another {flavour} engine build is running; waiting for it")
        fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engine_patch/build_engine.py",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=None,
                        help="install the wheel into this venv")
    parser.add_argument("--backend", choices=("auto", *BACKENDS), default=None,
                        help="default: $MOESCOPE_BACKEND, else auto (cuda when "
                             "MOESCOPE_CUDA=1)")
    parser.add_argument("--cuda", action="store_true", help="same as --backend cuda")
    parser.add_argument("--configure-only", action="store_true",
                        help="stop after CMake configuration (checks the CUDA path)")
    parser.add_argument("--print-key", action="store_true")
    parser.add_argument("--print-backend", action="store_true",
                        help="print the backend auto-selection would build, and why")
    parser.add_argument("--lib-dir", action="store_true",
                        help="unpack the wheel and print its lib folder, for "
                             "LLAMA_CPP_LIB_PATH (a second backend beside the venv's)")
    parser.add_argument("--probe-vulkan", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stock", action="store_true",
                        help="build llama-cpp-python without the slot-cache patch (for "
                             "bench/engine_bench.py) and print a folder to put on PYTHONPATH")
    args = parser.parse_args(argv)
    stock = bool(args.stock)
    try:
        if args.probe_vulkan:
            for name, kind in probe_vulkan_ctypes():
                print(f"deviceType = {kind}\ndeviceName = {name}")
            return 0
        requested = "cuda" if args.cuda else args.backend or requested_backend(os.environ)
        choice = choose_backend(requested)
        if args.print_backend:
            print(f"{choice.backend}: {choice.reason}")
            return 0
        lock = read_lock()
        cache = cache_root()
        if args.print_key:
            print(cache_key(lock["sha256"], choice.backend, choice.archs, stock))
            return 0
        step(f"backend: {choice.backend} ({choice.reason})")
        check_tools(choice.backend)
        key = cache_key(lock["sha256"], choice.backend, choice.archs, stock)
        flavour = choice.backend + ("-stock" if stock else "")
        cached = cache / "wheels" / key
        wheels = list(cached.glob("*.whl")) if cached.exists() else []
        build_lock = _lock(cache, flavour)  # noqa: F841 (held until exit) one build per flavour at a time (CI, helpers, make)
        if not wheels:
            wheels = list(cached.glob("*.whl")) if cached.exists() else []  # built meanwhile
        sweep_tmp_wheels(cache)
        if wheels and not args.configure_only and not wheel_ok(wheels[0]):
            step(f"cached wheel {wheels[0].name} is damaged; removing it and rebuilding")
            shutil.rmtree(cached)
            wheels = []
        if wheels and not args.configure_only:
            step(f"reusing cached {flavour} wheel {key} ({wheels[0].name})")
            wheel = wheels[0]
        else:
            with _lock(cache, "shared"):
                sdist = fetch_sdist(lock, cache, build_env(cache) / "bin" / "pip")
            tree = prepare_tree(sdist, lock, cache / "src" / flavour, key, choice.backend,
                                stock)
            flags = cmake_args(choice.backend, choice.archs)
            built = build_wheel(tree, cache, flags, args.configure_only, flavour)
            if args.configure_only:
                return 0
            cached.mkdir(parents=True, exist_ok=True)
            wheel = cached / built.name
            shutil.move(str(built), wheel)
            shutil.rmtree(built.parent, ignore_errors=True)
            (cached / "manifest.json").write_text(json.dumps({
                "key": key, "flavour": flavour, "sdist_sha256": lock["sha256"],
                "patches": [p.name for p in patches(choice.backend, stock)], "cmake_args": flags,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "seconds": round(time.monotonic() - T0, 1)}, indent=2))
            step(f"built and cached {wheel}")
        if stock or args.lib_dir:
            site = unpack(wheel, cache / ("stock" if stock else "unpacked") / key)
            if stock:
                step("stock llama_cpp unpacked; put this folder on PYTHONPATH:")
                print(site)
                return 0
            lib_dir = site / "llama_cpp" / "lib"
            write_build_info(lib_dir, choice, key)
            step("engine libraries unpacked; point LLAMA_CPP_LIB_PATH at:")
            print(lib_dir)
            return 0
        if args.venv is not None:
            install(wheel, args.venv, key)
            lib_dir = installed_lib_dir(args.venv)
            if lib_dir is not None:
                write_build_info(lib_dir, choice, key)
        step("done")
        return 0
    except BuildError as err:
        print(f"[engine] ERROR: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:
        print(f"[engine] ERROR: command failed ({err.returncode}): {err.cmd}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\n[engine] interrupted: run make again to resume (a build continues where "
              "it stopped)", file=sys.stderr)
        return 130
    except OSError as err:
        msg = no_space(cache_root()) if err.errno == errno.ENOSPC else str(err)
        print(f"[engine] ERROR: {msg}", file=sys.stderr)
        return 2

