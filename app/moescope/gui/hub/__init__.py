"""The *Get models* window (File ▸ Get models…): the Hub, each file's fit, downloads."""

from moescope.gui.hub.window import GetModelsWindow, show_get_models

__all__ = ["GetModelsWindow", "show_get_models"]
