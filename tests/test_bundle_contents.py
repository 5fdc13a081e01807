"""What the PyInstaller desktop bundle takes and leaves out (``packaging/bundle_contents.py``,
used by ``packaging/moescope.spec``), and the bundle checks of ``make dist``.

Building the bundle takes a minute and PyInstaller is not a test dependency, so these check
the decisions on PyInstaller-shaped tables; ``make dist`` builds and smoke-tests the real one.
"""

from __future__ import annotations

import _ctypes
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "packaging" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # build_bundle imports bundle_contents by this name
    spec.loader.exec_module(module)
    return module


bc = _load("bundle_contents")
bb = _load("build_bundle")

PLUGINS = "PySide6/Qt/plugins"


@pytest.mark.parametrize(("dest", "kept"), [
    (f"{PLUGINS}/platforms/libqxcb.so", True),
    (f"{PLUGINS}/platforms/libqoffscreen.so", True),
    (f"{PLUGINS}/platforms/libqwayland.so", False),
    (f"{PLUGINS}/platforms/libqeglfs.so", False),
    (f"{PLUGINS}/platforms/libqvnc.so", False),
    (f"{PLUGINS}/wayland-shell-integration/libxdg-shell.so", False),
    (f"{PLUGINS}/imageformats/libqsvg.so", True),
    (f"{PLUGINS}/imageformats/libqpdf.so", False),
    (f"{PLUGINS}/iconengines/libqsvgicon.so", True),
    (f"{PLUGINS}/platformthemes/libqgtk3.so", False),
    (f"{PLUGINS}/platformthemes/libqxdgdesktopportal.so", True),
    (f"{PLUGINS}/generic/libqevdevmouseplugin.so", False),
    ("llama_cpp/lib/libllama.so", True),
    ("llama_cpp/lib/libggml-base.so.0", True),
    ("llama_cpp/lib/libggml-base.so.0.25.3", False),
    ("llama_cpp/lib/libllama.so.0.5.0", False),
    ("PySide6/Qt/lib/libQt6Core.so.6", True),
    ("libpython3.11.so.1.0", True),
])
def test_plugins_and_libraries_chosen_by_name(dest: str, kept: bool) -> None:
    assert bc.keep_binary(dest) is kept


def test_libraries_only_dropped_files_needed_are_pruned_links_go_with_them() -> None:
    binaries = [
        ("PySide6/QtGui.abi3.so", "/s/QtGui.abi3.so", "EXTENSION"),
        (f"{PLUGINS}/platforms/libqxcb.so", "/s/libqxcb.so", "BINARY"),
        (f"{PLUGINS}/platformthemes/libqgtk3.so", "/s/libqgtk3.so", "BINARY"),
        ("PySide6/Qt/lib/libQt6Gui.so.6", "/s/libQt6Gui.so.6", "BINARY"),
        ("PySide6/Qt/lib/libQt6XcbQpa.so.6", "/s/libQt6XcbQpa.so.6", "BINARY"),
        ("libxcb-cursor.so.0", "/s/libxcb-cursor.so.0", "BINARY"),
        ("libgtk-3.so.0", "/s/libgtk-3.so.0", "BINARY"),
        ("libcairo.so.2", "/s/libcairo.so.2", "BINARY"),
        ("llama_cpp/lib/libllama.so", "/s/libllama.so", "BINARY"),
        ("llama_cpp/lib/libggml.so.0", "/s/libggml.so.0", "BINARY"),
        ("unknown.bin", "/s/unknown.bin", "BINARY"),
    ]
    datas = [
        ("libQt6Gui.so.6", "PySide6/Qt/lib/libQt6Gui.so.6", "SYMLINK"),
        ("libggml.so.0", "llama_cpp/lib/libggml.so.0", "SYMLINK"),
        ("libgtk-3.so.0.link", "libgtk-3.so.0", "SYMLINK"),
        ("PySide6/Qt/translations/qtbase_de.qm", "/s/qtbase_de.qm", "DATA"),
        ("PySide6/Qt/translations/qtdeclarative_de.qm", "/s/qtdeclarative_de.qm", "DATA"),
        ("resources/style.qss", "/s/style.qss", "DATA"),
    ]
    needed = {
        "/s/QtGui.abi3.so": ["libQt6Gui.so.6"],
        "/s/libqxcb.so": ["libQt6XcbQpa.so.6", "libxcb-cursor.so.0"],
        "/s/libqgtk3.so": ["libgtk-3.so.0"],
        "/s/libgtk-3.so.0": ["libcairo.so.2"],
        "/s/libllama.so": ["libggml.so.0", "libc.so.6"],
        "/s/unknown.bin": None,  # unreadable: kept
    }
    kept_binaries, kept_datas = bc.select(binaries, datas,
                                          lambda src: needed.get(src, []))
    names = {Path(d).name for d, _, _ in kept_binaries}
    assert names == {"QtGui.abi3.so", "libqxcb.so", "libQt6Gui.so.6", "libQt6XcbQpa.so.6",
                     "libxcb-cursor.so.0", "libllama.so", "libggml.so.0", "unknown.bin"}
    assert [d for d, _, _ in kept_datas] == [
        "libQt6Gui.so.6", "libggml.so.0", "PySide6/Qt/translations/qtbase_de.qm",
        "resources/style.qss"], "links to kept files stay, to dropped ones go"


def test_elf_needed_reads_a_real_library() -> None:
    needed = bc.elf_needed(_ctypes.__file__)
    assert needed is not None and any(n.startswith("libffi") or n.startswith("libc.")
                                      for n in needed), needed
    assert bc.elf_needed(__file__) is None, "not an ELF file"
    assert bc.elf_needed("/no/such/file") is None


def test_resources_are_bundled_where_the_frozen_app_looks() -> None:
    datas = bc.resource_datas()
    folders = {(Path(src).name, dest) for src, dest in datas}
    assert ("style.qss", "resources") in folders
    assert ("moescope.svg", "resources/icons") in folders
    assert ("moescope-demo-qwen3moe.gguf", "resources/models") in folders


def test_the_spec_uses_these_decisions() -> None:
    spec = (ROOT / "packaging" / "moescope.spec").read_text()
    for used in ("bc.select(", "bc.resource_datas()", "bc.EXCLUDED_MODULES",
                 "bc.HIDDEN_IMPORT_PACKAGES", 'collect_dynamic_libs("llama_cpp")',
                 "pyinstaller_entry.py"):
        assert used in spec
    assert "pygments.lexers" in bc.HIDDEN_IMPORT_PACKAGES


def test_pyinstaller_is_pinned_and_only_in_the_dist_extra() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert any(r.startswith("pyinstaller==") for r in extras["dist"])
    assert not any("pyinstaller" in r.lower() for r in extras["dev"] + project["dependencies"]), (
        "make test's dependencies stay without PyInstaller")
    pins = (ROOT / "constraints.txt").read_text().splitlines()
    assert "pyinstaller==6.22.3" in pins
    assert any(p.startswith("pyinstaller-hooks-contrib==") for p in pins)


def fake_app(tmp_path: Path) -> Path:
    """Empty files where ``check_layout`` looks: the layout of a good bundle."""
    app = tmp_path / bc.APP_NAME
    internal = app / "_internal"
    plugins = internal / PLUGINS
    for path in (app / bc.EXE_NAME, internal / "llama_cpp/lib/libllama.so",
                 internal / "resources/style.qss", internal / "resources/icons/moescope.svg",
                 internal / "resources/models/demo.gguf",
                 plugins / "platforms/libqxcb.so", plugins / "platforms/libqoffscreen.so",
                 plugins / "iconengines/libqsvgicon.so"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    return app


def test_layout_check_names_what_is_missing_or_unwanted(tmp_path: Path) -> None:
    app = fake_app(tmp_path)
    bb.check_layout(app)
    (app / "_internal/llama_cpp/lib/libllama.so").unlink()
    with pytest.raises(bb.BundleError, match=re.escape("llama_cpp/lib/libllama.so")):
        bb.check_layout(app)

    app = fake_app(tmp_path / "2")
    (app / "_internal" / PLUGINS / "platforms/libqwayland.so").write_bytes(b"")
    with pytest.raises(bb.BundleError, match="platform plugins"):
        bb.check_layout(app)

    app = fake_app(tmp_path / "3")
    (app / "_internal/libQt6WebEngineCore.so.6").write_bytes(b"")
    with pytest.raises(bb.BundleError, match="WebEngine"):
        bb.check_layout(app)


def test_glibc_needed_is_the_newest_version_asked_for(tmp_path: Path) -> None:
    app = fake_app(tmp_path)
    (app / bc.EXE_NAME).write_bytes(b"\x7fELF....GLIBC_2.17\x00GLIBC_2.34\x00")
    (app / "_internal/libx.so.1").write_bytes(b"\x7fELF....GLIBC_2.4\x00GLIBC_2.36\x00")
    (app / "_internal/notes.so.txt").write_bytes(b"GLIBC_2.99\x00")  # not an ELF file
    assert bb.glibc_needed(app) == "2.36"
