"""What every package of malloczero may import: its errors, safe file output, lazy imports."""
