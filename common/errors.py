"""Errors that reach the user as one line (the CLI prints `malloczero: error: <message>`)."""


class MalloczeroError(Exception):
  """Base class: bad input or an impossible request; the message is one self-contained line."""


class WorkloadError(MalloczeroError, ValueError):
  """A workload file or object is malformed."""


class HardwareError(MalloczeroError, ValueError):
  """A hardware description is impossible or malformed."""


class MappingError(MalloczeroError, ValueError):
  """A mapping is malformed or violates a constraint (the validator's verdict)."""


class IllegalActionError(MalloczeroError, ValueError):
  """An action outside the legal mask was played in mallocGame."""
