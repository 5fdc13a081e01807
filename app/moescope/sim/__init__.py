"""Router-logit simulator: replays recorded routing through the native core (no model)."""
