"""malloczero: launch (see DESIGN.md)."""
