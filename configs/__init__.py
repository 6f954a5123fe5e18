"""malloczero: configs (see DESIGN.md)."""
