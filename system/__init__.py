"""malloczero: system (see DESIGN.md)."""
