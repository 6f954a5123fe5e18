"""Quantities as a person reads them."""


def human_bytes(n: float) -> str:
  """'512 B', '1.50 KiB', ... up to GiB."""
  for unit in ("B", "KiB", "MiB", "GiB"):
    if abs(n) < 1024 or unit == "GiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
    n /= 1024
  raise AssertionError("unreachable")
