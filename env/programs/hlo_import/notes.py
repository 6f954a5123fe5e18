"""What the importer tells the user besides the workload: one-line notes and warnings.

Choosing the parser, the cost rules and the conversion all add to one `Notes`; `import_hlo_text`
returns its lines with the workload.
"""

from __future__ import annotations


class Notes:
  """One-line notes for the user: what was done, and one warning per kind of approximation
  (not per instruction)."""

  def __init__(self) -> None:
    self.lines: list[str] = []
    self.kinds: dict[str, tuple[set[str], str]] = {}

  def note(self, line: str) -> None:
    """Adds a line saying what was done (which parser, what compiling did)."""
    self.lines.append(line)

  def warn(self, kind: str, instruction: str, what: str) -> None:
    """Records an approximation of `kind` at `instruction`; `what` says what it means (the
    first `what` of a kind is kept)."""
    self.kinds.setdefault(kind, (set(), what))[0].add(instruction)

  def all(self) -> list[str]:
    """The notes, then one warning line per kind with its count and one example."""
    warnings = []
    for kind, (instructions, what) in self.kinds.items():
      count = len(instructions)
      warnings.append(
        f"warning: {kind} ({count} instruction{'s' if count != 1 else ''}, e.g. "
        f"'{min(instructions)}'): {what}"
      )
    return self.lines + warnings
