"""A one-line refusal, before building anything big, of an input this machine cannot hold.

Why: the cost model, msa and the validator keep arrays per incidence (an op touching a buffer)
and per op, and the workload keeps a Python object per op and per buffer, so a large enough
program cannot be held; without a guard the kernel's out-of-memory killer ends the process
after minutes, with no message. The estimate is what a solve with validation measured per
incidence, buffer and op, rounded up: about 180 B per incidence on generated CSVs of 2k to 20k
rows when a CSV buffer touched every op of its range (peak resident memory of
`malloczero solve --solver msa`). Since a CSV buffer has two incidences at most
(env/minimalloc_csv.py), the buffers and ops dominate: a 200k-row CSV (559k ops, 400k
incidences) peaked at 0.70 GB through load, msa and validation, against an estimate of 1.08 GB.
"""

from __future__ import annotations

from malloczero.common.errors import MalloczeroError

BYTES_PER_INCIDENCE = 200
BYTES_PER_BUFFER = 2048
BYTES_PER_OP = 512
BASE_BYTES = 300 << 20  # The interpreter, numpy, numba and the solvers' code.


class InputTooLargeError(MalloczeroError, MemoryError):
  """An input needs more memory than the machine has available."""


def estimated_bytes(num_ops: int, num_buffers: int, num_incidences: int) -> int:
  """Peak memory a solve and validation of a program this size is expected to need."""
  return (
    BASE_BYTES
    + BYTES_PER_INCIDENCE * int(num_incidences)
    + BYTES_PER_BUFFER * int(num_buffers)
    + BYTES_PER_OP * int(num_ops)
  )


def available_bytes() -> int | None:
  """Memory the machine can give this process now (psutil's `available`, else /proc/meminfo's
  MemAvailable); None when neither can be read, and then nothing is refused."""
  try:
    import psutil

    return int(psutil.virtual_memory().available)
  except ImportError:
    pass
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  return None


def _gb(value: int) -> str:
  return f"{value / 1e9:.1f} GB"


def check_fits_in_memory(what: str, num_ops: int, num_buffers: int, num_incidences: int) -> None:
  """Raises InputTooLargeError, one line naming the numbers, when the estimate exceeds the
  available memory."""
  available = available_bytes()
  need = estimated_bytes(num_ops, num_buffers, num_incidences)
  if available is None or need <= available:
    return
  raise InputTooLargeError(
    f"{what}: needs about {_gb(need)} of memory ({num_buffers:,} buffers, {num_ops:,} ops, "
    f"{num_incidences:,} incidences, about {BYTES_PER_INCIDENCE} B each), more than the "
    f"{_gb(available)} this machine has available"
  )
