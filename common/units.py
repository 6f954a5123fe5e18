"""Quantities as a person reads them: byte counts, and integers short enough for a one-line
message however large they are."""


def human_bytes(n: float) -> str:
  """'512 B', '1.50 KiB', ... up to GiB."""
  for unit in ("B", "KiB", "MiB", "GiB"):
    if abs(n) < 1024 or unit == "GiB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
    n /= 1024
  raise AssertionError("unreachable")


def show_int(value: int) -> str:
  """An integer as text; a huge one as its digit count, so that an error stays one short line."""
  digits = len(str(abs(int(value))))
  return str(int(value)) if digits <= 30 else f"a {digits}-digit number"


def show_power_of_two(limit: int) -> str:
  """A limit as text: '2**60' when it is a power of two, else its digits."""
  return f"2**{limit.bit_length() - 1}" if limit & (limit - 1) == 0 else str(limit)
