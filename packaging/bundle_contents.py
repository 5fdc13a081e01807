"""What goes into the PyInstaller desktop bundle, and what is left out: ``moescope.spec``.

The spec file is executed by PyInstaller, not imported, so ruff and pytest cannot see
into it. The decisions live here instead, as plain functions the spec calls and
``tests/test_bundle_contents.py`` checks:

* which Python modules PyInstaller cannot find by following imports (the GUI is imported
  by name, subcommands are found with ``pkgutil``, Pygments finds lexers by name);
* which Qt modules we leave out (we use QtCore, QtGui, QtWidgets, the SVG icon plugin and
  pyqtgraph's OpenGL modules; PySide6-Essentials also ships QML, Quick, Designer ... ~100 MB we
  never load);
* which platform plugins stay: ``xcb`` (X11, and XWayland on a Wayland desktop) and
  ``offscreen`` (``moescope --self-test`` and CI);
* which of llama_cpp's libraries are needed (the wheel ships every library three times,
  as ``libX.so``, ``libX.so.0`` and ``libX.so.0.25.3``; only the first two are ever
  opened: ``libX.so`` by llama_cpp's loader, ``libX.so.0`` as the others' SONAME).

Nothing here imports PyInstaller at module level, so the tests run without it.
"""

from __future__ import annotations

import posixpath
import re
import struct
from collections.abc import Callable
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
APP_NAME = "MoEScope"
"""The bundle's folder under ``dist/``."""
EXE_NAME = "moescope"
"""The executable inside it: the same name as the installed command."""

QT_MODULES_USED = ("QtCore", "QtGui", "QtWidgets", "QtSvg", "QtOpenGL", "QtOpenGLWidgets")
"""QtSvg is not imported by our code, but the window icon is an SVG file: Qt reads it with
the ``iconengines/qsvgicon`` and ``imageformats/qsvg`` plugins, which need libQt6Svg.
QtOpenGL and QtOpenGLWidgets are imported by pyqtgraph itself when it loads
(``PColorMeshItem``, ``RawImageWidget``), whether or not a plot uses OpenGL; together ~1 MB.
pyqtgraph's QtTest import fails softly by design, so QtTest stays out."""

EXCLUDED_MODULES: tuple[str, ...] = (
    # Qt modules we never import (pyqtgraph imports some of them lazily, for features we
    # do not use: OpenGL plots, printing, SVG export, QML widgets)
    "PySide6.QtQml", "PySide6.QtQuick", "PySide6.QtQuickWidgets", "PySide6.QtQuickControls2",
    "PySide6.QtQuickTest", "PySide6.QtWebEngineCore", "PySide6.QtWebEngineWidgets",
    "PySide6.QtWebEngineQuick", "PySide6.QtWebChannel", "PySide6.Qt3DCore",
    "PySide6.Qt3DRender", "PySide6.Qt3DExtras", "PySide6.QtDesigner", "PySide6.QtHelp",
    "PySide6.QtUiTools", "PySide6.QtSql", "PySide6.QtTest", "PySide6.QtNetwork",
    "PySide6.QtPrintSupport",
    "PySide6.QtSvgWidgets", "PySide6.QtXml", "PySide6.QtConcurrent", "PySide6.QtDBus",
    "PySide6.QtCharts", "PySide6.QtMultimedia", "PySide6.QtPdf",
    # the other Qt bindings, and optional extras of our dependencies we do not use
    "PyQt5", "PyQt6", "PySide2", "tkinter", "matplotlib", "scipy", "OpenGL", "IPython",
    "torch", "cupy", "h5py",
    # development tools: never at run time
    "pytest", "_pytest", "hypothesis", "pytestqt", "ruff", "importlinter", "grimp",
    "PyInstaller",
    # llama_cpp's OpenAI-compatible server (needs FastAPI/uvicorn, not installed)
    "llama_cpp.server",
)

HIDDEN_IMPORT_PACKAGES = ("moescope", "pygments.lexers", "jinja2")
"""Packages whose every submodule is collected (``collect_submodules``): ``moescope``
because ``cli`` imports the GUI and the subcommands by name; ``pygments.lexers`` because
a fence's language is looked up by name (``get_lexer_by_name``) and the lexer module is
imported then; ``jinja2`` for llama_cpp's chat templates (its sandbox and extensions)."""

REQUIRED_LEXERS = ("python", "js", "bash")
"""Fence languages the smoke test and ``--self-test`` check resolve in the frozen app."""

KEEP_PLATFORM_PLUGINS = frozenset({"libqxcb.so", "libqoffscreen.so"})
DROPPED_PLUGIN_KINDS = frozenset({
    "wayland-decoration-client", "wayland-graphics-integration-client",
    "wayland-graphics-integration-server", "wayland-shell-integration",
    "egldeviceintegrations", "generic", "qmltooling", "qmllint", "designer", "sqldrivers",
    "printsupport", "networkinformation", "tls", "vectorimageformats",
})
"""Plugin folders of platforms we do not ship (Wayland, EGLFS, evdev input) and of Qt
modules we do not use."""
DROPPED_PLUGINS = frozenset({"libqpdf.so", "libqgtk3.so"})
"""``imageformats/qpdf`` would pull in libQt6Pdf (~10 MB; answers never show PDFs).
``platformthemes/qgtk3`` would pull in GTK's whole stack (gtk, gdk, cairo, pango, atk) from
the build machine, which then meets the user's own GTK and glib: a known source of symbol
clashes in frozen apps. Without it Qt draws its own dialogs (the app has its own dark theme
anyway); ``platformthemes/qxdgdesktopportal`` stays for the desktop's file portal."""

_LLAMA_LIB = re.compile(r"^lib[\w-]+\.so(\.\d+)?$")


def keep_binary(dest: str) -> bool:
    """Whether a binary PyInstaller collected, by its path inside the bundle, stays.

    Only what is chosen by name is decided here; the libraries that the dropped files
    alone needed go afterwards, in :func:`prune_unreachable`.
    """
    path = PurePosixPath(dest.replace("\\", "/"))
    parts = path.parts
    if "plugins" in parts and parts.index("plugins") + 1 < len(parts) - 1:
        kind = parts[parts.index("plugins") + 1]
        if kind == "platforms":
            return path.name in KEEP_PLATFORM_PLUGINS
        if kind in DROPPED_PLUGIN_KINDS or path.name in DROPPED_PLUGINS:
            return False
    return not (len(parts) >= 2 and parts[-2] == "lib" and "llama_cpp" in parts
                and not _LLAMA_LIB.match(path.name))


TocEntry = tuple[str, str, str]
"""PyInstaller's table-of-contents row: ``(dest in bundle, source, typecode)``; for a
``SYMLINK`` row the source is the link's target, relative to the link's folder."""


def select(binaries: list[TocEntry], datas: list[TocEntry],
           needed: Callable[[str], list[str] | None] | None = None
           ) -> tuple[list[TocEntry], list[TocEntry]]:
    """The spec's Analysis tables, less what we leave out (see the module's docstring).

    Plugins and libraries are chosen by name (:func:`keep_binary`), then the libraries only
    the dropped ones needed go (:func:`prune_unreachable`), then data files
    (:func:`keep_data`). PyInstaller lists its symbolic links (the top-level
    ``libQt6Gui.so.6 -> PySide6/Qt/lib/libQt6Gui.so.6`` ones) among the data files, so a link
    is dropped last, when its target is no longer in either table.
    """
    binaries = prune_unreachable([e for e in binaries if keep_binary(e[0])], needed)
    datas = [e for e in datas if keep_data(e[0])]
    present = {e[0] for e in binaries + datas}
    return drop_dangling_links(binaries, present), drop_dangling_links(datas, present)


def drop_dangling_links(entries: list[TocEntry], present: set[str]) -> list[TocEntry]:
    """``entries`` without the symbolic links whose target is not in ``present``."""
    return [e for e in entries if e[2] != "SYMLINK" or _link_target(e) in present]


def _link_target(entry: TocEntry) -> str:
    return posixpath.normpath(posixpath.join(posixpath.dirname(entry[0]), entry[1]))


def is_root_binary(entry: TocEntry) -> bool:
    """A binary something loads by name rather than by link: Python extension modules,
    Qt plugins, llama_cpp's ctypes libraries and libpython (the bootloader opens it)."""
    dest, _src, kind = entry
    parts = PurePosixPath(dest).parts
    return (kind == "EXTENSION" or "plugins" in parts or "llama_cpp" in parts
            or parts[-1].startswith("libpython"))


def prune_unreachable(entries: list[TocEntry],
                      needed: Callable[[str], list[str] | None] | None = None
                      ) -> list[TocEntry]:
    """Drop shared libraries that no kept binary links to, directly or through others.

    PyInstaller collects the link dependencies of every binary it sees, including those
    our filters drop afterwards (the GTK theme plugin's GTK stack, the Wayland plugins'
    libQt6WaylandClient); this walks ``DT_NEEDED`` from :func:`is_root_binary` rows and
    keeps what it reaches. A file whose links cannot be read counts as a root (kept).
    """
    needed = needed or elf_needed
    real = [e for e in entries if e[2] != "SYMLINK"]
    by_name: dict[str, TocEntry] = {}
    for e in real:
        by_name.setdefault(PurePosixPath(e[0]).name, e)
    for e in entries:  # a top-level link stands for its target under its own name
        if e[2] == "SYMLINK":
            target = _link_target(e)
            match = next((r for r in real if r[0] == target), None)
            if match is not None:
                by_name.setdefault(PurePosixPath(e[0]).name, match)
    links = {e[0]: needed(e[1]) for e in real}
    todo = [e for e in real if is_root_binary(e) or links[e[0]] is None]
    reached: set[str] = set()
    while todo:
        e = todo.pop()
        if e[0] in reached:
            continue
        reached.add(e[0])
        for name in links[e[0]] or ():
            dep = by_name.get(name)
            if dep is not None and dep[0] not in reached:
                todo.append(dep)
    kept = [e for e in entries if e[2] == "SYMLINK" or e[0] in reached]
    return drop_dangling_links(kept, {e[0] for e in kept})


def elf_needed(path: str) -> list[str] | None:
    """The ``DT_NEEDED`` names of a 64-bit little-endian ELF file; None if it is not one.

    Read here rather than with ``ldd`` (which runs the loader and lists the whole closure,
    from the build machine's paths) or ``readelf`` (binutils may be missing).
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    out: list[str] = []
    for _name, kind, _flags, _addr, offset, size, link, *_rest in sections:
        if kind != 6:  # SHT_DYNAMIC
            continue
        strtab_offset = sections[link][4]
        for at in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", data, at)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED
                start = strtab_offset + value
                out.append(data[start:data.index(b"\0", start)].decode())
    return out


def keep_data(dest: str) -> bool:
    """Whether a data file stays: Qt translations of dropped modules and QML files go."""
    path = PurePosixPath(dest.replace("\\", "/"))
    if "PySide6" in path.parts and ("qml" in path.parts or "translations" in path.parts):
        # qtbase_*.qm translates Qt's own dialogs (file dialog, message box): keep those
        return "translations" in path.parts and path.name.startswith("qtbase_")
    return True


def resource_datas() -> list[tuple[str, str]]:
    """``(source, folder in bundle)`` for the app's resources: icons, style sheet, models.

    They land in ``_internal/resources``, where ``moescope.util.resources`` looks when
    frozen. Only ``*.gguf`` models are taken: the folder may hold a user's own files too.
    """
    res = ROOT / "resources"
    out = [(str(res / "style.qss"), "resources")]
    out += [(str(p), "resources/icons") for p in sorted((res / "icons").iterdir())
            if p.is_file()]
    out += [(str(p), "resources/models") for p in sorted((res / "models").glob("*.gguf"))]
    return out
