"""`python -m malloczero ...` is the `malloczero` command."""

import sys

from malloczero.launch.cli import main

if __name__ == "__main__":
  sys.exit(main())
