"""``moescope.util.resources`` inside a frozen desktop bundle (PyInstaller, ``make dist``).

A bundle has no checkout around it: the resources are in ``sys._MEIPASS/resources``. The
frozen attributes are faked here, so this runs without building a bundle; the real bundle
is checked by ``make dist``'s smoke test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from moescope.util import resources

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(resources.ENV_RESOURCES, raising=False)


def fake_bundle(tmp_path: Path) -> Path:
    """A bundle's ``_internal`` folder with a demo model and another model."""
    internal = tmp_path / "MoEScope" / "_internal"
    models = internal / "resources" / "models"
    models.mkdir(parents=True)
    (models / "a-user-model.gguf").write_bytes(b"GGUF")
    (models / resources.DEMO_MODEL_NAME).write_bytes(b"GGUF")
    return internal


def test_from_source_the_checkouts_resources_are_used() -> None:
    assert not getattr(sys, "frozen", False)
    assert resources.frozen_base() is None
    assert resources.resources_dir() == ROOT / "resources"


def test_a_frozen_app_finds_resources_in_meipass(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    internal = fake_bundle(tmp_path)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(internal), raising=False)
    assert resources.frozen_base() == internal
    assert resources.resources_dir() == internal / "resources"
    demo = resources.demo_model_path()
    assert demo == internal / "resources" / "models" / resources.DEMO_MODEL_NAME, (
        "the demo model, not the first .gguf by name")


def test_a_frozen_app_without_meipass_looks_next_to_the_executable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    internal = fake_bundle(tmp_path)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.delattr(sys, "_MEIPASS", raising=False)
    monkeypatch.setattr(sys, "executable", str(internal / "moescope"))
    assert resources.resources_dir() == internal / "resources"


def test_moescope_resources_overrides_a_frozen_app(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    internal = fake_bundle(tmp_path)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(internal), raising=False)
    monkeypatch.setenv(resources.ENV_RESOURCES, str(tmp_path / "elsewhere"))
    assert resources.resources_dir() == tmp_path / "elsewhere"
    assert resources.demo_model_path() is None, "an empty folder has no demo model"
