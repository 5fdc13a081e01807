"""Where the app keeps its files: the chat database, settings, traces.

One function decides, so tests (and portable installs) can redirect everything with
``MOESCOPE_DATA_DIR`` instead of touching the user's real profile.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

ENV_DATA_DIR = "MOESCOPE_DATA_DIR"
ENV_MODELS_DIR = "MOESCOPE_MODELS_DIR"


def data_dir() -> Path:
    """The user data directory (created on first use); ``MOESCOPE_DATA_DIR`` overrides it."""
    env = os.environ.get(ENV_DATA_DIR)
    path = Path(env) if env else Path(platformdirs.user_data_dir("MoEScope", "MoEScope"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def chats_db_path() -> Path:
    return data_dir() / "chats.sqlite3"


def settings_path() -> Path:
    """An INI file next to the database, so settings travel with ``MOESCOPE_DATA_DIR``."""
    return data_dir() / "settings.ini"


def traces_dir() -> Path:
    path = data_dir() / "traces"
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    """Where downloaded models land (and the Open dialog starts): ``MOESCOPE_MODELS_DIR``,
    else ``models/`` in the data directory."""
    env = os.environ.get(ENV_MODELS_DIR)
    path = Path(env).expanduser() if env else data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path
