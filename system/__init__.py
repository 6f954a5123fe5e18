"""malloczero: system (see docs/design.md)."""
