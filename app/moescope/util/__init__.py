"""Operating-system helpers and the shared error type; no MoEScope concept lives here."""
