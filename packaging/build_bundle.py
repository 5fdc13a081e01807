"""Build the desktop bundle ``dist/MoEScope/`` and prove it runs: ``make dist``.

``python packaging/build_bundle.py`` runs PyInstaller on ``packaging/moescope.spec``
(one-dir), strips the debug information of Python's own libraries, checks the layout, then
runs the frozen ``moescope`` the way a user would, from a clean environment outside the
checkout:

* ``moescope info <the bundled demo model>`` (GGUF reading, no engine);
* ``moescope generate --n 8`` (the engine: llama_cpp and its libraries inside the bundle,
  the demo model found by default), compared with the same command from the venv, and
  ``moescope replay`` of its trace (the simulator: the native core in the bundled
  libllama);
* ``moescope --self-test`` offscreen (the real window, worker, engine, Pygments), and again
  with the ``xcb`` platform under Xvfb when ``xvfb-run`` is installed.

Any failure ends the run with status 1 and says what failed; the last lines are the
measurements (build time, size, time of each smoke step). ``--smoke-only`` checks an
existing bundle again without building.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bundle_contents as bc

ROOT = bc.ROOT
SPEC = ROOT / "packaging" / "moescope.spec"
STEP_TIMEOUT_S = 300
"""Per smoke step; the self-test has its own, shorter timeout inside (``--self-test-timeout``)."""
SELF_TEST_TIMEOUT_S = 120
CLEAN_ENV_DROP = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "MOESCOPE_RESOURCES",
                  "MOESCOPE_NATIVE_LIB", "LLAMA_CPP_LIB_PATH", "LD_LIBRARY_PATH",
                  "QT_PLUGIN_PATH", "QT_QPA_PLATFORM_PLUGIN_PATH")
"""Variables that could make the frozen app use the checkout's files instead of its own."""
UNWANTED = re.compile(r"Qt6(WebEngine|Qml|Quick|3D|Designer|Pdf|Wayland)|libgtk|libgdk")


class BundleError(Exception):
    """The bundle is wrong or a smoke step failed; the message says which."""


@dataclass
class Report:
    """The measurements printed at the end (and written as JSON with ``--json``)."""

    build_s: float | None = None
    size_bytes: int = 0
    size_du: str = ""
    files: int = 0
    glibc: str = ""
    stripped_bytes: int = 0
    steps: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------- build
def build(dist: Path, work: Path) -> float:
    """Run PyInstaller; returns the seconds it took."""
    try:
        import PyInstaller  # noqa: F401
    except ImportError as err:
        raise BundleError("PyInstaller is not installed in this Python: run `make dist` "
                          "(it installs the 'dist' extra from constraints.txt)") from err
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
           "--distpath", str(dist), "--workpath", str(work), str(SPEC)]
    print("+", " ".join(cmd), flush=True)
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise BundleError(f"PyInstaller failed with status {done.returncode}")
    return time.perf_counter() - started


def strip_python_debug_info(internal: Path) -> int:
    """Strip debug sections from the build machine's own Python (libpython, lib-dynload).

    They are about two thirds of libpython (~16 MB) and help nobody running the app. Only
    those files: wheels' libraries may have been rewritten by patchelf (auditwheel), which
    ``strip`` is known to corrupt. Returns the bytes saved (0 when ``strip`` is missing).
    """
    strip = shutil.which("strip")
    if strip is None:
        return 0
    files = list(internal.glob("libpython*.so*"))
    files += list(internal.glob("python3*/lib-dynload/*.so"))
    saved = 0
    for f in files:
        if f.is_symlink() or not f.is_file():
            continue
        before = f.stat().st_size
        subprocess.run([strip, "--strip-debug", str(f)], check=True)
        saved += before - f.stat().st_size
    return saved


# ------------------------------------------------------------------------------- checks
def check_layout(app: Path) -> None:
    """The files the app looks for at run time, and none of the Qt parts we leave out."""
    internal = app / "_internal"
    exe = app / bc.EXE_NAME
    required = [exe, internal / "llama_cpp" / "lib" / "libllama.so",
                internal / "resources" / "style.qss",
                internal / "resources" / "icons" / "moescope.svg",
                internal / "PySide6" / "Qt" / "plugins" / "platforms" / "libqxcb.so",
                internal / "PySide6" / "Qt" / "plugins" / "platforms" / "libqoffscreen.so",
                internal / "PySide6" / "Qt" / "plugins" / "iconengines" / "libqsvgicon.so"]
    missing = [str(p.relative_to(app)) for p in required if not p.exists()]
    if not list((internal / "resources" / "models").glob("*.gguf")):
        missing.append("_internal/resources/models/*.gguf")
    if missing:
        raise BundleError(f"missing from the bundle: {', '.join(missing)}")
    platforms = {p.name for p in (internal / "PySide6/Qt/plugins/platforms").iterdir()}
    if platforms != set(bc.KEEP_PLATFORM_PLUGINS):
        raise BundleError(f"platform plugins {sorted(platforms)}, expected "
                          f"{sorted(bc.KEEP_PLATFORM_PLUGINS)}")
    unwanted = sorted(str(p.relative_to(app)) for p in internal.rglob("*")
                      if UNWANTED.search(p.name))
    if unwanted:
        raise BundleError(f"left-out Qt parts are in the bundle: {', '.join(unwanted[:5])}")
    dangling = [str(p.relative_to(app)) for p in internal.rglob("*")
                if p.is_symlink() and not p.exists()]
    if dangling:
        raise BundleError(f"dangling links: {', '.join(dangling[:5])}")


def check_links(app: Path) -> None:
    """Every bundled library's links resolve (``ldd``), with the bundle's own folder on
    the library path as the bootloader sets it; a miss means a library we pruned (or one
    the build machine lacks) that something kept still needs."""
    if shutil.which("ldd") is None:
        return
    internal = app / "_internal"
    env = dict(os.environ, LD_LIBRARY_PATH=str(internal))
    broken: list[str] = []
    for f in sorted(internal.rglob("*.so*")):
        if f.is_symlink() or bc.elf_needed(str(f)) is None:
            continue
        out = subprocess.run(["ldd", str(f)], capture_output=True, text=True, env=env,
                             check=False).stdout
        missing = [line.split()[0] for line in out.splitlines() if "not found" in line]
        if missing:
            broken.append(f"{f.relative_to(internal)} needs {', '.join(missing)}")
    if broken:
        raise BundleError("unresolved links: " + "; ".join(broken[:5]))


def glibc_needed(app: Path) -> str:
    """The newest ``GLIBC_x.y`` symbol version any bundled binary asks for: the oldest
    glibc the bundle runs on (it is built against the build machine's)."""
    best: tuple[int, ...] = ()
    pattern = re.compile(rb"GLIBC_(\d+)\.(\d+)(?:\.(\d+))?\x00")
    for f in [app / bc.EXE_NAME, *(app / "_internal").rglob("*.so*")]:
        if f.is_symlink() or not f.is_file():
            continue
        with open(f, "rb") as fh:
            data = fh.read()
        if data[:4] != b"\x7fELF":
            continue
        for m in pattern.finditer(data):
            best = max(best, tuple(int(g) for g in m.groups() if g is not None))
    return ".".join(map(str, best))


def bundle_size(app: Path) -> tuple[int, int, str]:
    """Bytes of the files (links not followed), their count, and ``du -sh``'s figure."""
    files = [p for p in app.rglob("*") if p.is_file() and not p.is_symlink()]
    total = sum(p.stat().st_size for p in files)
    du = ""
    if shutil.which("du"):
        du = subprocess.run(["du", "-sh", str(app)], capture_output=True, text=True,
                            check=False).stdout.split("\t")[0]
    return total, len(files), du


# ------------------------------------------------------------------------------- smoke
def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV_DROP}
    env.update(extra or {})
    return env


def run_step(report: Report, name: str, cmd: Sequence[str], *, cwd: Path,
             env: dict[str, str], expect: str) -> str:
    """Run one smoke command; it must exit 0 and print ``expect``. Returns its stdout."""
    started = time.perf_counter()
    try:
        done = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=STEP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as err:
        raise BundleError(f"{name}: no result after {STEP_TIMEOUT_S} s") from err
    except OSError as err:
        raise BundleError(f"{name}: could not start {cmd[0]}: {err}") from err
    report.steps[name] = time.perf_counter() - started
    if done.returncode != 0 or expect not in done.stdout:
        tail = (done.stdout + done.stderr).strip().splitlines()[-8:]
        raise BundleError(f"{name}: exit {done.returncode}, expected {expect!r} in the "
                          "output; last lines:\n  " + "\n  ".join(tail))
    print(f"  ok  {name} ({report.steps[name]:.1f} s)")
    return done.stdout


def smoke(app: Path, report: Report) -> None:
    """The frozen app's commands, from a temporary folder with a clean environment."""
    exe = app / bc.EXE_NAME
    demo = sorted((app / "_internal" / "resources" / "models").glob("*.gguf"))[0]
    with tempfile.TemporaryDirectory(prefix="moescope-bundle-smoke-") as tmp:
        cwd = Path(tmp)
        env = clean_env({"MOESCOPE_DATA_DIR": str(cwd / "data"), "HOME": str(cwd)})
        run_step(report, "version", [str(exe), "--version"], cwd=cwd, env=env,
                 expect="moescope ")
        run_step(report, "info", [str(exe), "info", str(demo)], cwd=cwd, env=env,
                 expect="experts")
        trace = cwd / "session.jsonl"
        text = run_step(report, "generate", [str(exe), "generate", "--n", "8", "--trace",
                                             str(trace)], cwd=cwd, env=env, expect=" slots] ")
        compare_with_source(text, report)
        run_step(report, "replay", [str(exe), "replay", str(trace), "--policy",
                                    "exact,speed-first", "--budget", "25%"], cwd=cwd,
                 env=env, expect="cost model")
        self_test = [str(exe), "--self-test", "--self-test-timeout", str(SELF_TEST_TIMEOUT_S)]
        line = run_step(report, "self-test offscreen", self_test, cwd=cwd,
                        env=dict(env, QT_QPA_PLATFORM="offscreen"),
                        expect="self-test: OK")
        print("      " + line.strip())
        xvfb = shutil.which("xvfb-run")
        if xvfb is None:
            report.notes.append("xcb self-test skipped: xvfb-run not installed "
                                "(apt-get install xvfb)")
            return
        line = run_step(report, "self-test xcb (Xvfb)",
                        [xvfb, "-a", "-s", "-screen 0 1280x800x24", *self_test], cwd=cwd,
                        env=dict(env, QT_QPA_PLATFORM="xcb"), expect="self-test: OK")
        print("      " + line.strip())


def compare_with_source(frozen: str, report: Report) -> None:
    """The frozen ``generate`` must write what the venv's does (same engine, same seed)."""
    source = ROOT / ".venv" / "bin" / "moescope"
    if not source.is_file():
        report.notes.append("generate not compared: no .venv/bin/moescope")
        return
    done = subprocess.run([str(source), "generate", "--n", "8"], capture_output=True,
                          text=True, timeout=STEP_TIMEOUT_S, check=False, cwd=ROOT)
    if done.returncode != 0:
        report.notes.append(f"generate not compared: the venv's exited {done.returncode}")
        return
    text = [line for line in frozen.splitlines() if not line.startswith("[")]
    expected = [line for line in done.stdout.splitlines() if not line.startswith("[")]
    if text != expected:
        raise BundleError(f"generate: the bundle wrote {text!r}, the venv {expected!r}")
    print("      same text as the venv's `moescope generate --n 8`")


# ------------------------------------------------------------------------------- main
def print_report(report: Report) -> None:
    print("\nMoEScope desktop bundle")
    if report.build_s is not None:
        print(f"  {'build':<22} {report.build_s:.0f} s (PyInstaller)")
    print(f"  {'size':<22} {report.size_du or '?'} (du -sh), "
          f"{report.size_bytes / 2**20:.0f} MiB in {report.files} files"
          + (f"; {report.stripped_bytes / 2**20:.0f} MiB of debug info stripped"
             if report.stripped_bytes else ""))
    print(f"  {'glibc':<22} >= {report.glibc or '?'} (symbol versions the binaries ask for)")
    for name, seconds in report.steps.items():
        print(f"  {name:<22} {seconds:.1f} s")
    for note in report.notes:
        print(f"  note: {note}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="output folder")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "pyinstaller",
                        help="PyInstaller's work folder")
    parser.add_argument("--smoke-only", action="store_true",
                        help="check and smoke-test an existing bundle, do not build")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    args = parser.parse_args(argv)
    app = (args.dist / bc.APP_NAME).resolve()  # the smoke steps run in another folder
    report = Report()
    try:
        if not args.smoke_only:
            report.build_s = build(args.dist, args.work)
            report.stripped_bytes = strip_python_debug_info(app / "_internal")
        elif not (app / bc.EXE_NAME).is_file():
            raise BundleError(f"no bundle at {app}: run `make dist` first")
        report.size_bytes, report.files, report.size_du = bundle_size(app)
        report.glibc = glibc_needed(app)
        check_layout(app)
        check_links(app)
        print(f"smoke test of {app}:")
        smoke(app, report)
    except BundleError as err:
        print(f"\nbundle: FAILED: {err}", file=sys.stderr)
        print_report(report)
        return 1
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report.__dict__, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
