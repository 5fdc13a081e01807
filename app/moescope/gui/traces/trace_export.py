"""A trace exported from the GUI: File ▸ Export trace (the session being recorded) and a
trace window's Export (the trace it shows, however old) ask for a name the same way and
write the same three files through :func:`moescope.display.trace_io.export_session`, so
the two cannot drift apart.

The save dialog starts in the folder of the last export (remembered in the settings, so
that a series of exports lands together), else the home folder.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QFileDialog, QWidget

from moescope.display.trace_io import export_session
from moescope.trace.names import (
    FORMAT_NAMES,
    live_trace_file,
    session_stem,
    trace_suffix,
)

EXPORT_FOLDER_KEY = "traces/export_folder"
"""Settings key of the folder the last trace export went to."""
_MAX_PATH = 4096


def export_folder(settings: QSettings | None) -> Path:
    """Where the save dialog starts: the last export's folder while it still exists."""
    if settings is not None:
        value = settings.value(EXPORT_FOLDER_KEY, "")
        text = value[:_MAX_PATH] if isinstance(value, str) else ""
        if text and Path(text).is_absolute() and Path(text).is_dir():
            return Path(text)
    return Path.home()


def default_name(recorded: Path) -> tuple[str, str]:
    """The dialog's proposed file name for a trace and its filter: the session's (or
    file's) name with the suffix of the format the copy keeps."""
    suffix = trace_suffix(recorded.name)
    if suffix is None:  # opened through "All files": the copy keeps its name as given
        return recorded.name, "MoEScope trace (*)"
    stem = session_stem(recorded.name) or recorded.name[:-len(suffix)]
    return (f"{stem}{suffix}",
            f"MoEScope trace, {FORMAT_NAMES.get(suffix, 'as recorded')} (*{suffix})")


def ask_export_path(parent: QWidget, trace: Path, settings: QSettings | None) -> str:
    """The save dialog for exporting ``trace`` ("" when cancelled)."""
    name, filters = default_name(live_trace_file(trace))
    path, _ = QFileDialog.getSaveFileName(
        parent, "Export trace", str(export_folder(settings) / name), filters)
    return path


def export_trace_files(trace: Path, dest: str | Path,
                       settings: QSettings | None) -> tuple[Path, Path, Path]:
    """Export ``trace`` to ``dest`` (the trace, Perfetto JSON, per-token CSV) and remember
    the folder; raises as :func:`export_session` does."""
    files = export_session(trace, Path(dest))
    if settings is not None:
        settings.setValue(EXPORT_FOLDER_KEY, str(files[0].parent.absolute()))
    return files


def saved_message(trace: Path, files: tuple[Path, Path, Path]) -> str:
    """The status line after an export; a copy of a journal (the session still records)
    says how to get the format it will be finished in."""
    copy, perfetto, csv = files
    recorded = trace_suffix(trace.name)
    journal = recorded is not None and trace_suffix(copy.name) != recorded
    return f"Trace saved to {copy}, with {perfetto.name} and {csv.name}" + (
        f" (an Arrow stream: the session is still recording; `moescope trace compact "
        f"{copy.name}` makes it {FORMAT_NAMES.get(recorded, recorded)})" if journal else "")
