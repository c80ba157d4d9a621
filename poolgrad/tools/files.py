"""Output files: checked before the work, written atomically (a crash never leaves a
half-written file where a good one was)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from typing import IO


def check_output_folder(path: str, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming ``path`` when files cannot be written into the folder
    ``path``: it, or a folder above it, is a file, or the nearest existing folder is not
    writable. Nothing is created: :func:`write_atomically` makes missing folders."""
    problem = "the path is empty" if not path else _folder_problem(path, "it")
    if problem:
        raise error(f"cannot write to the output folder {path or repr(path)}: {problem}")


def check_output_file(path: str, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming ``path`` when the file ``path`` cannot be written: it is
    a folder, or its folder cannot be made or written into. An existing file is fine
    (it is replaced)."""
    if not path:
        problem = "the path is empty"
    elif path.endswith(("/", os.sep)) or os.path.isdir(path):
        problem = "it is a folder; give a file name"
    else:
        folder = os.path.dirname(path) or os.curdir
        problem = _folder_problem(folder, folder)
    if problem:
        raise error(f"cannot write the output file {path or repr(path)}: {problem}")


def probe_folder(path: str, error: type[Exception] = ValueError) -> None:
    """Make the folder ``path`` and write and remove a file in it, or raise ``error``:
    a folder can look writable and not be (``/proc``, a full disk), and a run that learns
    it when it saves has lost its work. Call it just before the work."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".poolgrad-probe-{secrets.token_hex(4)}")
        with open(probe, "wb") as stream:
            stream.write(b"poolgrad")
        os.remove(probe)
    except OSError as problem:
        reason = problem.strerror or str(problem)
        raise error(f"cannot write to the output folder {path}: {reason}") from None


def _folder_problem(folder: str, called: str) -> str | None:
    """What stops files being written into ``folder`` (None if nothing does), found from
    the nearest part of the path that exists; ``folder`` itself is ``called`` so."""
    existing = os.path.normpath(folder)
    while not os.path.lexists(existing):
        parent = os.path.dirname(existing)
        existing = parent if parent else os.curdir
    it = called if existing == os.path.normpath(folder) else existing
    if os.path.isfile(existing):
        return f"{it} is a file, not a folder"
    if not os.path.isdir(existing):
        return f"{it} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{it} is not writable"
    return None


def write_atomically(path: str, write: Callable[[IO[bytes]], None]) -> None:
    """Call ``write(stream)`` on a new temporary file beside ``path``, flush it to disk,
    then rename it onto ``path`` (an atomic replace on POSIX and Windows). The file gets
    the usual permissions (0666 less the umask). An OSError names ``path``, never the
    temporary file."""
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".poolgrad-{secrets.token_hex(8)}"
                                        f"{os.path.splitext(path)[1]}")
    try:
        os.makedirs(directory, exist_ok=True)
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as error:
        raise _naming(error, path) from None
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        os.unlink(temporary)
        if isinstance(error, OSError):
            raise _naming(error, path) from None
        raise
    _sync_directory(directory)


def _naming(error: OSError, path: str) -> OSError:
    """The same kind of OSError (same errno), about ``path``."""
    if error.errno is None:
        return error
    return OSError(error.errno, f"cannot write {path}: {error.strerror or error}")


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
