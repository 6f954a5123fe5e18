#!/usr/bin/env bash
# Prints the path of a working CPython 3.10 interpreter, or explains what to install.
# pyenv's `python3.10` shim is on PATH on many machines but fails unless pyenv selects 3.10,
# so every candidate is run before it is trusted.
set -u
works() { "$1" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 10))' >/dev/null 2>&1; }
candidates=()
[ -n "${PYTHON310:-}" ] && candidates+=("$PYTHON310")
command -v python3.10 >/dev/null 2>&1 && candidates+=("$(command -v python3.10)")
if command -v pyenv >/dev/null 2>&1; then
  root=$(pyenv root)
  for p in "$root"/versions/3.10.*/bin/python3.10; do [ -x "$p" ] && candidates+=("$p"); done
fi
for p in "$HOME"/.pyenv/versions/3.10.*/bin/python3.10 /usr/bin/python3.10 /usr/local/bin/python3.10; do
  [ -x "$p" ] && candidates+=("$p")
done
for p in "${candidates[@]}"; do
  if works "$p"; then echo "$p"; exit 0; fi
done
echo "error: no working CPython 3.10 found (launchpad 0.5.2 has no wheels for 3.11+)." >&2
echo "       install it, e.g. 'pyenv install 3.10.13', or set PYTHON310=/path/to/python3.10" >&2
exit 1
