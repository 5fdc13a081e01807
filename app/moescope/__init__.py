"""MoEScope: chat locally with big Mixture-of-Experts models and see what the expert cache does."""

__version__ = "0.1.0"
