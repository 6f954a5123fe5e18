"""malloczero: replay (see DESIGN.md)."""
