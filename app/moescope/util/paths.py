"""Where the app keeps its files: the chat database, settings, traces.

One function decides, so tests (and portable installs) can redirect everything with
``MOESCOPE_DATA_DIR`` instead of touching the user's real profile.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from moescope.util.errors import MoEScopeError

ENV_DATA_DIR = "MOESCOPE_DATA_DIR"
ENV_MODELS_DIR = "MOESCOPE_MODELS_DIR"
_chosen: dict[str, Path] = {}
"""Folders chosen in Preferences ("models", "data"): set by the app at start and when
changed, so every reader of :func:`models_dir` and :func:`traces_dir` follows."""


def choose_folder(kind: str, path: str | Path | None) -> None:
    """Use ``path`` as the ``kind`` folder ("models": downloads and the Open dialog;
    "data": where session traces are recorded, in its ``traces/`` folder); None or "":
    the default again."""
    if kind not in ("models", "data"):
        raise ValueError(f"unknown folder kind {kind!r}")
    if path:
        _chosen[kind] = Path(path).expanduser()
    else:
        _chosen.pop(kind, None)


def data_dir_path() -> Path:
    """Where :func:`data_dir` is, without creating it (to name it when it cannot be)."""
    env = os.environ.get(ENV_DATA_DIR)
    # "~" expanded as for MOESCOPE_MODELS_DIR: a launcher's Exec= line has no shell to do it
    return (Path(env).expanduser() if env
            else Path(platformdirs.user_data_dir("MoEScope", "MoEScope")))


class FolderError(MoEScopeError, OSError):
    """A folder of the app's (the data folder, the models folder) that cannot be made: an
    ``OSError`` as before (``strerror``, ``filename``: the window words it so), and one
    sentence for the command line, naming the folder and how to choose another."""

    def __init__(self, err: OSError, path: Path, what: str, env: str) -> None:
        super().__init__(err.errno, err.strerror or str(err), str(path))
        self.what, self.env = what, env

    def __str__(self) -> str:
        return (f"the {self.what} {self.filename} cannot be made ({self.strerror}); set "
                f"{self.env} to a folder you can write to")


def _make(path: Path, what: str, env: str) -> Path:
    """``path`` created if missing (with its parents); :class:`FolderError` if it cannot
    be: a file in its place, ``/proc/x``, a name too long were tracebacks."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as err:  # "(File exists)" said nothing of what was in the way
        raise FolderError(OSError(err.errno, "it is there and is not a folder"), path,
                          what, env) from None
    except OSError as err:
        raise FolderError(err, path, what, env) from None
    return path


def data_dir() -> Path:
    """The user data directory (created on first use); ``MOESCOPE_DATA_DIR`` overrides it."""
    return _make(data_dir_path(), "data folder", ENV_DATA_DIR)


CHATS_DB = "chats.sqlite3"


def chats_db_path() -> Path:
    return data_dir() / CHATS_DB


def settings_path() -> Path:
    """An INI file next to the database, so settings travel with ``MOESCOPE_DATA_DIR``."""
    return data_dir() / "settings.ini"


def traces_dir() -> Path:
    """``traces/`` in the chosen data folder (a folder of its own: old traces in it are
    pruned), else in :func:`data_dir`."""
    path = _chosen.get("data") or data_dir()
    return _make(path / "traces", "traces folder", ENV_DATA_DIR)


def models_dir(make: bool = True) -> Path:
    """Where downloaded models land (and the Open dialog starts): ``MOESCOPE_MODELS_DIR``,
    else the folder chosen in Preferences, else ``models/`` in the data directory; created
    unless ``make`` is false (``pull`` makes it only once there is something to save)."""
    env = os.environ.get(ENV_MODELS_DIR)
    path = (Path(env).expanduser() if env else _chosen.get("models")
            or (data_dir() if make else data_dir_path()) / "models")
    return _make(path, "models folder", ENV_MODELS_DIR) if make else path
