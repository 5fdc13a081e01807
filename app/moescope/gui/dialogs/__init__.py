"""Dialogs: open a model, compare policies, about, shortcuts."""
