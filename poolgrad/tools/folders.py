"""Output folders that hold one run: what a folder holds (:func:`survey`), and
``--overwrite``'s replacement of a whole folder (:func:`replacing`), which a crash at any
moment leaves holding the old run or the new one, never a mix of the two.

A run's folder holds that run alone. Each command's files are named in :data:`TRAIN`
and :data:`STUDY`: a folder holding anything else (another command's run, a user's
files) is refused, so that a run never mixes with other files and ``--overwrite``
never deletes what it did not write (``--out ~ --overwrite`` is refused, not obeyed).
A process killed outright while it trains leaves its staging folder,
``.NAME.poolgrad-new-*``, beside the old run, which is whole; it can be removed.
"""

from __future__ import annotations

import ctypes
import errno
import fnmatch
import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .files import probe_folder

TEMPORARY = ".poolgrad-"  # write_atomically's and probe_folder's files, left by a kill
NEW, OLD = "poolgrad-new", "poolgrad-old"  # the siblings of a folder being replaced


@dataclass(frozen=True)
class Layout:
    """What ``command`` writes into its folder: ``what`` it holds then (as the errors
    name it), ``marks`` (names any of which say that one is there) and ``patterns``
    (every path it may hold, relative and '/'-separated; a ``*`` stays within one
    level). Temporaries (:data:`TEMPORARY`) fit every layout."""
    command: str
    what: str
    marks: tuple[str, ...]
    patterns: tuple[str, ...]

    def fits(self, relative: str) -> bool:
        depth = relative.count("/")
        return (relative.rsplit("/", 1)[-1].startswith(TEMPORARY)
                or any(p.count("/") == depth and fnmatch.fnmatchcase(relative, p)
                       for p in self.patterns))


# Both layouts live here, not with their writers, because each command must know the
# other's folder and poolgrad.train may not import poolgrad.study (which imports it).
TRAIN = Layout("poolgrad train", "a run",
               marks=("checkpoint.npz", "checkpoint.pt", "metrics.json"),
               patterns=("checkpoint.npz", "checkpoint.pt", "metrics.json", "training.png"))
STUDY = Layout("poolgrad study shift", "a study", marks=("results.json", "runs"),
               patterns=("results.json", "table.md", "findings.md",
                         "consistency_vs_shift_zero.png", "consistency_vs_shift_circular.png",
                         "accuracy_vs_consistency.png", "runs", "runs/*", "runs/*/*.json"))
LAYOUTS = (TRAIN, STUDY)


def survey(out: str, layout: Layout, error: type[Exception] = ValueError) -> list[str]:
    """The marks of ``layout``'s run found in the folder ``out`` (none when it is
    missing or holds no run); ``error`` when it holds another layout's run or anything
    else that ``layout``'s command does not write."""
    strangers = _strangers(out, layout)
    if strangers:
        for other in LAYOUTS:
            if other is not layout and not _strangers(out, other) and _marks(out, other):
                raise error(f"{out} holds {other.what} of {other.command}, not {layout.what} "
                            f"of {layout.command}: give another --out")
        shown = ", ".join(strangers[:3]) + (f" and {len(strangers) - 3} more"
                                            if len(strangers) > 3 else "")
        raise error(f"{out} holds files that {layout.command} does not write ({shown}): "
                    f"{layout.what}'s folder holds it alone; give another --out, or move "
                    "them away")
    return _marks(out, layout)


def _marks(out: str, layout: Layout) -> list[str]:
    return [name for name in layout.marks if os.path.lexists(os.path.join(out, name))]


def _strangers(out: str, layout: Layout) -> list[str]:
    """What ``out`` holds that does not fit ``layout``, folders ending in '/'. Only
    folders that fit are looked into, so a home folder costs one listing."""
    if not os.path.isdir(out):
        return []
    found, todo = [], [""]
    while todo:
        prefix = todo.pop()
        with os.scandir(os.path.join(out, prefix)) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                relative = prefix + entry.name
                folder = entry.is_dir(follow_symlinks=False)
                if not layout.fits(relative):
                    found.append(relative + ("/" if folder else ""))
                elif folder:
                    todo.append(relative + "/")
    return found


def recover(out: str) -> str | None:
    """Put back the run that an ``--overwrite`` stopped halfway through its fallback
    swap had moved aside (``out`` missing, a ``.NAME.poolgrad-old-*`` beside it); returns
    a line saying so, or None when there was nothing to put back."""
    target = os.path.realpath(out)  # as replacing() names it
    moved = [] if os.path.lexists(target) else _siblings(target, OLD)
    if not moved:
        return None
    latest = max(moved, key=os.path.getmtime)
    os.rename(latest, target)
    return f"restored {out} from {latest}, where an --overwrite that stopped had moved it"


def _siblings(out: str, role: str) -> list[str]:
    parent, name = os.path.split(os.path.abspath(out))
    if not os.path.isdir(parent):
        return []
    return [os.path.join(parent, entry) for entry in os.listdir(parent)
            if entry.startswith(f".{name}.{role}-")]


def _sibling(out: str, role: str) -> str:
    """A new name beside ``out``: ``.NAME.ROLE-PID-RANDOM``."""
    parent, name = os.path.split(os.path.abspath(out))
    return os.path.join(parent, f".{name}.{role}-{os.getpid()}-{secrets.token_hex(4)}")


@contextmanager
def replacing(out: str, error: type[Exception] = ValueError) -> Iterator[str]:
    """A new staging folder beside ``out`` (made, and proven writable, or ``error``) for
    the block to write a run into. When the block ends, the staging folder replaces
    ``out`` whole (:func:`replace`); when it raises, the staging folder is removed and
    ``out`` is as it was. ``out`` itself is never written while the block runs."""
    target = os.path.realpath(out)  # a link to the run's folder: replace the folder
    if os.path.ismount(target):
        raise error(f"cannot replace {out}: it is a mount point; give a folder inside it")
    staged = _sibling(target, NEW)
    probe_folder(staged, error)
    try:
        yield staged
        replace(target, staged)
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # a failed run; or the old one, swapped


def replace(out: str, staged: str) -> None:
    """Make the folder ``staged`` be ``out``. On Linux one atomic exchange, which leaves
    the old ``out`` at ``staged`` for the caller to remove; elsewhere two renames (``out``
    aside to ``.NAME.poolgrad-old-*``, ``staged`` onto ``out``; the first undone if the
    second fails), then the old run is removed. A crash between the two renames leaves
    ``out`` missing, and :func:`recover` puts it back."""
    if not os.path.lexists(out):
        os.rename(staged, out)
        return
    if exchange(staged, out):
        return
    aside = _sibling(out, OLD)
    os.rename(out, aside)
    try:
        os.rename(staged, out)
    except BaseException:
        os.rename(aside, out)
        raise
    shutil.rmtree(aside, ignore_errors=True)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2  # <fcntl.h>, <linux/fs.h>


def exchange(a: str, b: str) -> bool:
    """Swap the paths ``a`` and ``b`` in one step (Linux's ``renameat2`` with
    ``RENAME_EXCHANGE``); False where that cannot be done: another system, a C library
    older than glibc 2.28, a file system without it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, f"cannot swap {a} and {b}: {os.strerror(code)}")
