#!/usr/bin/env python3
"""Prepare bundle/: everything bench/gpu_check.sh needs on a GPU machine with no network.

The bundle holds

* ``llama_cpp_python-moescope-src.tar.gz``: the pinned llama-cpp-python sdist, patched with
  engine_patch/*.patch, with the native core copied into vendor/llama.cpp/src/moescope
  (exactly what engine_patch/build_engine.py compiles), trimmed to what CMake needs for
  libllama + ggml (CPU and CUDA backends): no .git, docs, examples, tests, tools, models
  (vocab files), Python conversion scripts or other backends' sources;
* ``wheels/``: pure-Python or cp312 wheels of the packages the GPU machine may lack
  (gguf 0.19.0 and its needs); bench/gpu_check.py installs only those that do not import;
* ``manifest.json``: hashes, the source key (sdist + patches + native core; the GPU check
  refuses a bundle whose key differs from the repository's) and what was verified.

By default the trimmed tree is also configured with CMake (CPU, and CUDA for sm_90 when a
CUDA toolkit with cuBLAS is found, see docs/building.md) and every C/C++ source of that
configuration is run through the preprocessor (``--deep-verify``: the CUDA sources too),
so that a file the trim removed shows up here rather than on the GPU machine.
``--quick`` skips that and the wheels (the dry-run test uses it); it needs the sdist
already in the engine cache and never downloads it.

    python bench/make_gpu_bundle.py [--out bundle] [--quick] [--no-wheels] [--no-verify]
                                    [--deep-verify]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    ARCHIVE_NAME,
    BUNDLE_DIR,
    BUNDLE_LIMIT_BYTES,
    GPU_LEAN_FLAGS,
    GPU_WHEELS,
    MANIFEST_NAME,
    WHEELS_DIRNAME,
    Clock,
    builder,
    extract_tar,
    gpu_cmake_args,
    lean_cmake_args,
    sha256_file,
    source_key,
)

CLOCK = Clock()

# What survives the trim, relative to the sdist's top folder.
KEEP_TOP = {"CMakeLists.txt", "pyproject.toml", "LICENSE.md", "README.md", "CHANGELOG.md",
            "llama_cpp", "vendor"}
KEEP_LLAMA_CPP = {"CMakeLists.txt", "CMakePresets.json", "LICENSE", "licenses", "cmake",
                  "include", "src", "ggml", "vendor"}
KEEP_GGML_BACKENDS = {"ggml-cpu", "ggml-cuda", "ggml-vulkan"}  # vulkan: gpu_check's Vulkan row
DROP_LLAMA_VENDOR = {"cpp-httplib"}  # only common/ uses it, and common is not built


def say(msg: str) -> None:
    CLOCK.say("bundle", msg)


def keep(rel: PurePosixPath, is_dir: bool) -> bool:
    """True when ``rel`` (a path inside the sdist's top folder) goes into the bundle."""
    parts = rel.parts
    if not parts:
        return True
    if parts[0] not in KEEP_TOP:
        return False
    if parts[0] == "llama_cpp":
        return len(parts) < 2 or parts[1] not in ("lib", "__pycache__")  # never binaries
    if parts[0] != "vendor" or len(parts) == 1:
        return True
    if parts[1] != "llama.cpp":
        return False
    sub = parts[2:]
    if not sub:
        return True
    if sub[0] not in KEEP_LLAMA_CPP:
        return False
    if sub[0] == "vendor" and len(sub) > 1 and sub[1] in DROP_LLAMA_VENDOR:
        return False
    if sub[0] == "ggml" and len(sub) > 1 and sub[1] in ("tests", "examples"):
        return False
    in_backend_dir = len(sub) > 3 or (len(sub) == 3 and is_dir)
    return not (sub[:2] == ("ggml", "src") and in_backend_dir and sub[2].startswith("ggml-")
                and sub[2] not in KEEP_GGML_BACKENDS)


def extract_trimmed(sdist: Path, dest: Path) -> tuple[Path, dict[str, int]]:
    """Unpack only the kept members of the sdist; returns the tree and counts."""
    stats = {"kept_files": 0, "dropped_files": 0, "dropped_bytes": 0}
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
        top = members[0].name.split("/")[0]
        chosen = []
        for m in members:
            rel = PurePosixPath(m.name).relative_to(top) if m.name != top else PurePosixPath()
            if keep(rel, m.isdir()):
                chosen.append(m)
                stats["kept_files"] += int(m.isfile())
            else:
                stats["dropped_files"] += int(m.isfile())
                stats["dropped_bytes"] += m.size if m.isfile() else 0
        extract_tar(tar, dest, chosen)
    return dest / top, stats


def prepare_tree(sdist: Path, dest: Path, key: str) -> tuple[Path, dict[str, int]]:
    """Trimmed sdist + patches + native core + version stamp (as build_engine.prepare_tree)."""
    tree, stats = extract_trimmed(sdist, dest)
    say(f"extracted {stats['kept_files']} files, dropped {stats['dropped_files']} "
        f"({stats['dropped_bytes'] / 2**20:.0f} MiB)")
    builder.apply_patches(tree, "vulkan")  # every patch: the Vulkan guard is inert in CUDA builds
    core = tree / "vendor" / "llama.cpp" / "src" / "moescope"
    core.mkdir(parents=True, exist_ok=True)
    for path in builder.native_sources():
        shutil.copy2(path, core / path.name)
    version = builder.read_lock()["version"]
    init = tree / "llama_cpp" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{version}"',
                                             f'__version__ = "{version}+moescope.gpu.{key}"'))
    return tree, stats


def write_archive(tree: Path, archive: Path) -> int:
    """tar.gz of the tree in sorted order (stable content); returns the unpacked bytes."""
    total = 0
    with tarfile.open(archive, "w:gz", compresslevel=6) as tar:
        paths = sorted(tree.rglob("*"))
        tar.add(tree, arcname=tree.name, recursive=False)
        for path in paths:
            tar.add(path, arcname=f"{tree.name}/{path.relative_to(tree).as_posix()}",
                    recursive=False)
            if path.is_file():
                total += path.stat().st_size
    return total


def download_wheels(dest: Path) -> list[dict[str, Any]]:
    """Wheels for the GPU machine's Python 3.12, cached in $MOESCOPE_CACHE/gpu-wheels."""
    cache = builder.cache_root() / "gpu-wheels"
    cache.mkdir(parents=True, exist_ok=True)

    def cached(req: str) -> Path | None:
        name, _, version = req.partition("==")
        norm = name.lower().replace("-", "_")
        for whl in cache.glob("*.whl"):
            parts = whl.name.split("-")
            if parts[0].lower().replace("-", "_") == norm and parts[1] == version:
                return whl
        return None

    missing = [req for _, req in GPU_WHEELS if cached(req) is None]
    if missing:
        say(f"downloading wheels for Python 3.12: {', '.join(missing)}")
        platforms = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                     "manylinux1_x86_64"]
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
               "-d", str(cache), *missing]
        for plat in platforms:
            cmd += ["--platform", plat]
        subprocess.run(cmd, check=True)
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for module, req in GPU_WHEELS:
        whl = cached(req)
        if whl is None:
            raise RuntimeError(f"pip did not produce a wheel for {req}")
        shutil.copy2(whl, dest / whl.name)
        out.append({"file": whl.name, "import": module, "requirement": req,
                    "bytes": whl.stat().st_size})
    return out


def preprocess_all(build: Path, cuda_files: bool) -> tuple[int, list[str]]:
    """Run the preprocessor of every compile command CMake generated: a header that the
    trim removed fails here in seconds instead of minutes into the GPU machine's build."""
    import shlex
    from concurrent.futures import ThreadPoolExecutor

    commands = json.loads((build / "compile_commands.json").read_text())
    chosen = [c for c in commands if cuda_files or not c["file"].endswith(".cu")]

    def run(entry: dict[str, str]) -> str | None:
        args, out, skip = shlex.split(entry["command"]), [], False
        for arg in args:
            if skip:
                skip = False
            elif arg == "-o":
                skip = True
            else:
                out.append("-E" if arg == "-c" else arg)
        proc = subprocess.run([*out, "-o", os.devnull], cwd=entry["directory"],
                              capture_output=True, text=True, check=False)
        return None if proc.returncode == 0 else f"{entry['file']}: {proc.stderr[-400:]}"

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        failures = [f for f in pool.map(run, chosen) if f]
    return len(chosen), failures


def verify(archive: Path, deep: bool) -> dict[str, str]:
    """Configure the trimmed tree with CMake (CPU always, CUDA sm_90 when a toolkit with
    cuBLAS is found) and preprocess every C/C++ source (and CUDA source with ``deep``)."""
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="moescope-bundle-check-") as tmp:
        with tarfile.open(archive) as tar:
            extract_tar(tar, Path(tmp))
        tree = next(Path(tmp).iterdir())
        cpu = lean_cmake_args("cpu")
        flavours: list[tuple[str, list[str] | str]] = [("cpu_configure", cpu)]
        if shutil.which("nvcc") is None:
            flavours.append(("cuda_configure", "skipped: no nvcc on PATH"))
        else:
            try:
                flavours.append(("cuda_configure", gpu_cmake_args("90")))
            except builder.BuildError as err:
                flavours.append(("cuda_configure", f"skipped: {err}"))
        last_build: Path | None = None
        for name, args in flavours:
            if isinstance(args, str):
                results[name] = args
                say(f"{name}: {args}")
                continue
            build = Path(tmp) / f"build-{name}"
            proc = subprocess.run(["cmake", "-S", str(tree), "-B", str(build), "-G", "Ninja",
                                   "-Wno-dev", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON", *args],
                                  capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
                raise RuntimeError(f"{name} of the trimmed tree failed:\n{tail}")
            results[name] = "ok"
            last_build = build
            say(f"{name}: ok")
        if last_build is not None:
            deep_cuda = deep and results.get("cuda_configure") == "ok"
            n, failures = preprocess_all(last_build, deep_cuda)
            if failures:
                raise RuntimeError("sources of the trimmed tree do not preprocess:\n"
                                   + "\n".join(failures[:10]))
            kind = "C/C++ and CUDA" if deep_cuda else "C/C++"
            results["preprocess"] = f"ok: {n} {kind} sources"
            say(f"preprocessed {n} {kind} sources: ok")
    return results


def clear_bundle(out: Path) -> None:
    """Remove what a previous run wrote (only our own files)."""
    for name in (ARCHIVE_NAME, MANIFEST_NAME):
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / WHEELS_DIRNAME, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=BUNDLE_DIR, help="bundle folder (bundle/)")
    ap.add_argument("--quick", action="store_true",
                    help="no wheels, no CMake check, no sdist download (for the dry-run test)")
    ap.add_argument("--no-wheels", action="store_true")
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--deep-verify", action="store_true",
                    help="also preprocess the 144 CUDA sources (about a minute on 2 cores)")
    args = ap.parse_args(argv)
    lock = builder.read_lock()
    cache = builder.cache_root()
    sdist = cache / "sdist" / lock["filename"]
    if args.quick and not sdist.exists():
        print(f"[bundle] {sdist} is not cached (run `make engine` first); --quick does not "
              "download it", file=sys.stderr)
        return 3
    try:
        sdist = builder.fetch_sdist(lock, cache)
        key = source_key()
        out: Path = args.out
        out.mkdir(parents=True, exist_ok=True)
        clear_bundle(out)
        with tempfile.TemporaryDirectory(prefix="moescope-bundle-") as tmp:
            tree, stats = prepare_tree(sdist, Path(tmp), key)
            archive = out / ARCHIVE_NAME
            unpacked = write_archive(tree, archive)
        say(f"wrote {archive} ({archive.stat().st_size / 2**20:.1f} MiB, "
            f"{unpacked / 2**20:.1f} MiB unpacked)")
        wheels: list[dict[str, Any]] = []
        if not (args.quick or args.no_wheels):
            wheels = download_wheels(out / WHEELS_DIRNAME)
        verified = ({"cpu_configure": "skipped", "cuda_configure": "skipped"}
                    if args.quick or args.no_verify else verify(archive, args.deep_verify))
    except (builder.BuildError, RuntimeError, subprocess.CalledProcessError) as err:
        print(f"[bundle] ERROR: {err}", file=sys.stderr)
        return 2
    files = [p for p in out.rglob("*") if p.is_file() and p.name != MANIFEST_NAME]
    total = sum(p.stat().st_size for p in files)
    manifest = {
        "format": 1,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "quick": bool(args.quick),
        "source_key": key,
        "sdist": {"filename": lock["filename"], "sha256": lock["sha256"],
                  "llama_cpp_commit": lock.get("llama_cpp_commit", "")},
        "patches": [{"name": p.name, "sha256": sha256_file(p)} for p in builder.patches("vulkan")],
        "native": [{"name": p.name, "sha256": sha256_file(p)} for p in builder.native_sources()],
        "archive": {"name": ARCHIVE_NAME, "top": tree.name, "bytes": archive.stat().st_size,
                    "sha256": sha256_file(archive), "unpacked_bytes": unpacked, **stats},
        "wheels": wheels,
        "lean_cmake_flags": list(GPU_LEAN_FLAGS),
        "verified": verified,
        "total_bytes": total,
    }
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    say(f"bundle {out}: {total / 2**20:.1f} MiB in {len(files)} files, source key {key}")
    if total > BUNDLE_LIMIT_BYTES:
        print(f"[bundle] ERROR: {total / 2**20:.1f} MiB is over the "
              f"{BUNDLE_LIMIT_BYTES / 2**20:.0f} MiB limit", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
