"""Strict JSON for the files malloczero reads: workloads, mappings and hardware descriptions.

Python's `json` accepts more than these formats mean, and fails in ways that are not one line:
a key given twice silently keeps its last value (a hand-edited file then means something its
author did not see), `NaN` and `Infinity` are read although JSON has no such numbers, a document
nested some thousands deep ends in a `RecursionError`, and an integer of more than 4300 digits
in a message that suggests changing Python's settings. Here each of those is refused in one
line naming the file (and, for a repeated key, where it is), as a caller's own error class.

A leading UTF-8 byte order mark, which some Windows editors write, is accepted and dropped.
"""

from __future__ import annotations

import json
import os
import re
import reprlib
from typing import Any, Collection, Mapping, Type

from malloczero.common.errors import MalloczeroError
from malloczero.common.inputs import read_input_text

BOM = "\ufeff"
# Python refuses to convert integers longer than this many digits (sys.get_int_max_str_digits).
_TOO_MANY_DIGITS = re.compile(r"integer string conversion: value has (\d+) digits")
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}")
# Values in messages: a few levels and items of each, so that a message stays one short line
# whatever the file holds.
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 3, 6, 4, 40, 40
_SHORT.maxlong = 40


def show_key(key: Any) -> str:
  """A key as a message quotes it: 'name', or JSON-escaped when it holds odd characters (a line
  break, a quote) that would otherwise break the message's one line."""
  key = str(key)
  return f"'{key}'" if _PLAIN_KEY.fullmatch(key) else json.dumps(key[:40])


def show_value(value: Any) -> str:
  """A value as a message shows it: short, escaped, one line, however large or deep it is."""
  return _SHORT.repr(value)


def unknown_key(data: Mapping, known: Collection[str]) -> str | None:
  """The complaint about the first key of `data` that is not `known`, else None: these formats
  have no optional extras, so a misspelt key would otherwise be silently ignored."""
  extra = next((k for k in data if k not in known), None)
  if extra is None:
    return None
  return (
    f"unknown key {show_key(extra)} (known keys: {', '.join(known)}): remove it or fix its spelling"
  )


class _Duplicated(dict):
  """A JSON object in which a key appeared more than once (`key` is the first repeated one)."""

  key: str = ""


class _NotJsonNumber(ValueError):
  pass


def _constant(name: str) -> None:
  raise _NotJsonNumber(name)


def _child(path: str, key: str) -> str:
  """The key path of `key` inside the object at `path`: `buffers[3].uses`, `a["odd key"]`."""
  if _PLAIN_KEY.fullmatch(key):
    return f"{path}.{key}" if path else key
  return f"{path}[{json.dumps(key[:40])}]"


def _find_duplicate(data: Any) -> tuple[str, str]:
  """(key path, key) of a `_Duplicated` object in `data`, searched without recursion."""
  stack: list[tuple[str, Any]] = [("", data)]
  while stack:
    path, node = stack.pop()
    if isinstance(node, _Duplicated):
      return path, node.key
    if isinstance(node, dict):
      stack += [(_child(path, k), v) for k, v in reversed(list(node.items()))]
    elif isinstance(node, list):
      stack += [(f"{path}[{i}]", v) for i, v in reversed(list(enumerate(node)))]
  raise AssertionError("no repeated key in the document")


def loads(text: str, where: str, error: Type[MalloczeroError]) -> Any:
  """The JSON document `text` (read from `where`), or `error` with a one-line message."""
  text = text[len(BOM) :] if text.startswith(BOM) else text
  repeated = []

  def unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    result = dict(pairs)
    if len(result) == len(pairs):
      return result
    seen: set[str] = set()
    marked = _Duplicated(result)
    marked.key = next(k for k, _ in pairs if k in seen or seen.add(k))
    repeated.append(marked)
    return marked

  try:
    data = json.loads(text, object_pairs_hook=unique_keys, parse_constant=_constant)
  except json.JSONDecodeError as e:
    raise error(
      f"{where}: not valid JSON (truncated or corrupt?): {e.msg} at line {e.lineno} "
      f"column {e.colno}"
    ) from None
  except _NotJsonNumber as e:
    raise error(f"{where}: '{e}' is not a JSON number: write a finite number") from None
  except RecursionError:
    raise error(
      f"{where}: JSON nested too deeply to read (these files are a few levels "
      "deep): is it the right file?"
    ) from None
  except ValueError as e:
    digits = _TOO_MANY_DIGITS.search(str(e))
    if digits is None:
      raise error(f"{where}: not valid JSON: {str(e).splitlines()[0][:200]}") from None
    raise error(
      f"{where}: an integer of {digits.group(1)} digits is too long: no value in "
      "this file needs more than 19 digits"
    ) from None
  if repeated:  # Only then is the document walked, to say where.
    path, key = _find_duplicate(data)
    raise error(
      f"{where}: key {show_key(key)} appears twice in "
      f"{f'the object at {path}' if path else 'the top-level object'}: give each key "
      "once"
    ) from None
  return data


def read_text(path: str, error: Type[MalloczeroError]) -> str:
  """The UTF-8 text of `path`, decompressed first when it ends in `.gz`, read within the input
  limits (`common/inputs.py`: regular files only, bounded size); `error` otherwise."""
  return read_input_text(path, error)


def load(path: str | os.PathLike, error: Type[MalloczeroError]) -> Any:
  """The JSON document in `path` (`.json` or `.json.gz`), read strictly (see `loads`)."""
  path = os.fspath(path)
  return loads(read_text(path, error), path, error)
