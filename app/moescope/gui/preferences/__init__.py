"""Edit ▸ Preferences: threads, GPU layers, theme and font size, folders, trace recording."""

from moescope.gui.preferences.dialog import PreferencesDialog
from moescope.gui.preferences.feature import PreferencesFeature
from moescope.gui.preferences.values import Preferences, read_preferences, write_preferences

__all__ = ["Preferences", "PreferencesDialog", "PreferencesFeature", "read_preferences",
           "write_preferences"]
