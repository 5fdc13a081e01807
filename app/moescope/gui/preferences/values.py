"""The preferences as values, read from and written to the app's QSettings.

Everything read back is bounded (the INI file is a text file a user may edit): a thread
count or a layer count out of range falls back to automatic, an unknown theme to "system",
a font size to the nearest readable one.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QSettings

from moescope.gui.theme import THEME_CHOICES

MAX_THREADS = 256
MAX_GPU_LAYERS = 999
FONT_MIN_PT, FONT_MAX_PT = 7, 24
GROUP = "preferences"


@dataclass(frozen=True)
class Preferences:
    threads: int = 0
    """Decode threads (0: llama.cpp's choice, half the cores); from the next load."""
    gpu_layers: int = -1
    """Layers on the GPU (-1: automatic, all where the engine has a GPU backend, none on a
    CPU build); next load."""
    theme: str = "system"
    font_pt: int = 0
    """The app's font size in points (0: the system's)."""
    models_dir: str = ""
    """Where downloads land and File ▸ Open starts ("": the default)."""
    data_dir: str = ""
    """Where session traces are recorded, in its traces/ folder ("": the default)."""
    record_traces: bool = True

    def load_options(self) -> dict[str, int | None]:
        """What a model load takes from these (LoadRequest's fields)."""
        return {"n_threads": self.threads or None,
                "n_gpu_layers": None if self.gpu_layers < 0 else self.gpu_layers}


def _int(settings: QSettings, key: str, default: int, low: int, high: int) -> int:
    try:
        value = int(str(settings.value(f"{GROUP}/{key}", default)))
    except ValueError:
        return default
    return value if low <= value <= high else default


def _bool(value: object) -> bool:
    return value if isinstance(value, bool) else str(value).lower() in ("true", "1")


def read_preferences(settings: QSettings) -> Preferences:
    font = _int(settings, "font_pt", 0, 0, 1000)
    theme = str(settings.value(f"{GROUP}/theme", "system"))
    return Preferences(
        threads=_int(settings, "threads", 0, 0, MAX_THREADS),
        gpu_layers=_int(settings, "gpu_layers", -1, -1, MAX_GPU_LAYERS),
        theme=theme if theme in THEME_CHOICES else "system",
        font_pt=min(max(font, FONT_MIN_PT), FONT_MAX_PT) if font else 0,
        models_dir=str(settings.value(f"{GROUP}/models_dir", "") or "")[:4096],
        data_dir=str(settings.value(f"{GROUP}/data_dir", "") or "")[:4096],
        # the File menu's toggle has always been stored under this key
        record_traces=_bool(settings.value("record_traces", True)))


def write_preferences(settings: QSettings, prefs: Preferences) -> None:
    for key in ("threads", "gpu_layers", "theme", "font_pt", "models_dir", "data_dir"):
        settings.setValue(f"{GROUP}/{key}", getattr(prefs, key))
    settings.setValue("record_traces", prefs.record_traces)
    settings.sync()
