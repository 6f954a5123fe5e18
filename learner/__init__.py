"""malloczero: learner (see DESIGN.md)."""
