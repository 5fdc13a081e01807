"""*Serve API* in the window: the OpenAI-compatible server on the window's model, the
cache panel following its tokens, and a log of its requests (``feature.ServeFeature``)."""

from moescope.gui.serve.feature import ServeFeature

__all__ = ["ServeFeature"]
