"""Traces in the window: opening one, the trace window, and the what-if view over it."""
