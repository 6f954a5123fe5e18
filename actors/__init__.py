"""malloczero: actors (see DESIGN.md)."""
