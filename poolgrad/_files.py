"""Atomic file writes: a crash never leaves a half-written file where a good one was."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import IO


def write_atomically(path: str, write: Callable[[IO[bytes]], None]) -> None:
    """Call ``write(stream)`` on a temporary file beside ``path``, then rename it onto
    ``path`` (an atomic replace on POSIX and Windows)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    suffix = os.path.splitext(path)[1]
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".poolgrad-", suffix=suffix)
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes it private (0600)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
