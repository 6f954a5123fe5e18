"""malloczero: actors (see docs/design.md)."""
