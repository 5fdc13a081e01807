"""The user's dials: cache policy and the VRAM budget."""
