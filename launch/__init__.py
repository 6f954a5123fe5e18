"""malloczero: launch (see docs/design.md)."""
