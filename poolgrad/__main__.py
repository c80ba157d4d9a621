"""``python -m poolgrad``: the ``poolgrad`` command (:mod:`poolgrad.cli`), for a Python
whose scripts folder is not on the PATH."""

import sys

from .cli import main

# Guarded: pytest's doctest collection and spawned worker processes import this module
if __name__ == "__main__":
    sys.exit(main())
