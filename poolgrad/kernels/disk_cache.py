"""Numba's disk cache, made safe for processes that compile the same kernel at once.

Numba (0.60 to 0.68 at least) keeps one index file per kernel, listing each compiled
signature against a numbered data file. A save reads the index, takes the first free
number, writes the index, then the data. Two processes that compile different
signatures of one kernel at the same time (two pytest-xdist workers, two ranks of
``poolgrad train --nproc``, two scripts on a fresh install) can both take number 1.
The index then lists one signature against the other's machine code, and every later
process that loads it fails with "can't unbox array from PyObject into native value"
where the types differ, or, where they differ only in layout, runs code compiled for
another signature: a wrong answer.

:class:`ProcessSafeCache` is Numba's per-function cache with a cache file that differs
in three ways:

* a save holds an exclusive lock on the kernel's ``.lock`` file from reading the index
  to writing it, so concurrent saves take different numbers (POSIX ``flock``; where
  there is none, or it cannot be taken, the next point still keeps every load correct);
* each data file holds its key, and a load that finds another key there is a miss, so
  the kernel compiles again rather than running the wrong code;
* the data file is written before the index lists it, so a reader that follows the
  index never finds a missing file or a stale one.

Its files are named apart from Numba's own (``kernel-12.py311.keyed.nbi`` and
``.keyed.1.nbc``), so that plain Numba, as an older poolgrad uses it on the same
``__pycache__``, never reads a data file in this format, nor this cache one in Numba's.

Numba keys a kernel's cache on its own source file (time and size) and bytecode alone,
and kernels inline helpers from other modules of the package (:mod:`.powers`,
:mod:`.walk`): a change to a helper alone left the old machine code in use, by a
developer's tree or an editable install after a pull. Each index here is stamped with
a digest of every module of the package too (:func:`package_digest`), so any change to
them compiles every kernel again.
"""

import contextlib
import functools
import hashlib
import itertools
import os

from numba.core.caching import FunctionCache, IndexDataCacheFile

try:
    import fcntl
except ImportError:  # not POSIX: loads stay correct through the key check alone
    fcntl = None


class _KeyedCacheFile(IndexDataCacheFile):
    """An index and its data files, saved under a lock, each data file with its key."""

    def __init__(self, cache_path, filename_base, source_stamp):
        super().__init__(cache_path, f"{filename_base}.keyed", source_stamp)
        self._lock_path = os.path.join(cache_path, f"{filename_base}.lock")

    @contextlib.contextmanager
    def _locked(self):
        """The lock, where it can be taken: flock needs no write access to the file
        (a cache folder shared by several users), and a file system without locks
        (NFS without lockd) leaves the key check to keep loads correct."""
        lock = None
        if fcntl is not None:
            try:
                lock = os.open(self._lock_path, os.O_RDONLY | os.O_CREAT, 0o666)
                fcntl.flock(lock, fcntl.LOCK_EX)
            except OSError:
                if lock is not None:
                    os.close(lock)
                lock = None
        try:
            yield
        finally:
            if lock is not None:
                os.close(lock)  # closing the last descriptor releases the lock

    def save(self, key, data):
        with self._locked():
            overloads = self._load_index()
            data_name = overloads.get(key)
            if data_name is None:
                taken = set(overloads.values())
                data_name = next(name for name in map(self._data_name, itertools.count(1))
                                 if name not in taken)
            self._save_data(data_name, (key, data))
            overloads[key] = data_name
            self._save_index(overloads)

    def load(self, key):
        stored = super().load(key)
        # A file that another key's save overwrote, or one that plain Numba wrote
        if not (isinstance(stored, tuple) and len(stored) == 2 and stored[0] == key):
            return None
        return stored[1]


@functools.cache
def package_digest(folder: str = os.path.dirname(__file__)) -> str:
    """A digest of the names and contents of the ``.py`` files in ``folder`` (by
    default this package's, read once per process)."""
    digest = hashlib.sha256()
    try:
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as source:
                    digest.update(name.encode() + b"\0" + source.read() + b"\0")
    except OSError:  # no folder of files (a zip archive): the files' own stamps alone
        return ""
    return digest.hexdigest()


class ProcessSafeCache(FunctionCache):
    """Numba's disk cache for one compiled function, safe across processes; a
    ``variant`` (another build of the function, such as a kernel's serial one) has files
    of its own, since Numba's keys hold the signature, not the compile options."""

    def __init__(self, py_func, variant: str = ""):
        super().__init__(py_func)
        base = self._impl.filename_base
        self._cache_file = _KeyedCacheFile(
            cache_path=self._cache_path,
            filename_base=f"{base}.{variant}" if variant else base,
            source_stamp=(self._impl.locator.get_source_stamp(), package_digest()))
