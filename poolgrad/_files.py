"""Atomic file writes: a crash never leaves a half-written file where a good one was."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from typing import IO


def write_atomically(path: str, write: Callable[[IO[bytes]], None]) -> None:
    """Call ``write(stream)`` on a new temporary file beside ``path``, flush it to disk,
    then rename it onto ``path`` (an atomic replace on POSIX and Windows). The file gets
    the usual permissions (0666 less the umask)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".poolgrad-{secrets.token_hex(8)}"
                                        f"{os.path.splitext(path)[1]}")
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    _sync_directory(directory)


def _sync_directory(directory: str) -> None:
    """Make the rename itself durable (POSIX; a no-op where directories can't be opened)."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)
