"""The kernels' disk cache (poolgrad.kernels.disk_cache): concurrent saves of one
kernel keep every signature, a data file never serves another signature's key, a
change to any module of the package compiles the kernels again, and every compiled
kernel uses it."""

import errno
import importlib
import importlib.util
import os
import pkgutil
import sys
import threading
import time

import numpy as np
from numba.core.caching import IndexDataCacheFile
from numba.core.dispatcher import Dispatcher

import poolgrad.bench.roofline
import poolgrad.kernels
from poolgrad.kernels import disk_cache, jit


class _SlowIndexReads(disk_cache._KeyedCacheFile):
    """Reads the index, then waits: without the lock, a second save reads the same
    index meanwhile and takes the same data file."""

    def _load_index(self):
        overloads = super()._load_index()
        time.sleep(0.2)
        return overloads


def test_concurrent_saves_of_two_signatures_keep_both(tmp_path):
    # Two cache files on one folder stand for two processes (flock locks conflict
    # between two opens of the lock file, in one process as in two)
    savers = [_SlowIndexReads(str(tmp_path), "kernel-1.py311", 1.0) for _ in range(2)]
    threads = [threading.Thread(target=saver.save, args=((signature,), (f"code {signature}",)))
               for saver, signature in zip(savers, ("float32", "float64"), strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reader = disk_cache._KeyedCacheFile(str(tmp_path), "kernel-1.py311", 1.0)
    assert reader.load(("float32",)) == ("code float32",)
    assert reader.load(("float64",)) == ("code float64",)
    assert sorted(reader._load_index().values()) == ["kernel-1.py311.keyed.1.nbc",
                                                     "kernel-1.py311.keyed.2.nbc"]


def test_a_data_file_that_holds_another_key_is_a_miss(tmp_path):
    # What an unlocked race leaves: the index lists one signature against the file the
    # other signature's save wrote last
    cache_file = disk_cache._KeyedCacheFile(str(tmp_path), "kernel-1.py311", 1.0)
    cache_file.save(("float32",), ("code float32",))
    cache_file.save(("float64",), ("code float64",))
    overloads = cache_file._load_index()
    overloads[("float32",)] = overloads[("float64",)]
    cache_file._save_index(overloads)
    assert cache_file.load(("float32",)) is None
    assert cache_file.load(("float64",)) == ("code float64",)
    # A stale index (its source changed) lists nothing
    assert disk_cache._KeyedCacheFile(str(tmp_path), "kernel-1.py311", 2.0).load(
        ("float64",)) is None


def test_plain_numba_and_this_cache_never_read_each_others_files(tmp_path):
    # An older poolgrad (plain Numba) on the same __pycache__, the same source: its
    # loader would crash on a keyed data file, and this cache's on a plain one
    ours = disk_cache._KeyedCacheFile(str(tmp_path), "kernel-1.py311", 1.0)
    plain = IndexDataCacheFile(str(tmp_path), "kernel-1.py311", 1.0)
    ours.save(("float32",), ("our code",))
    plain.save(("float64",), ("plain code",))
    assert plain.load(("float32",)) is None and ours.load(("float64",)) is None
    assert ours.load(("float32",)) == ("our code",)
    assert plain.load(("float64",)) == ("plain code",)


def test_saves_and_loads_work_where_no_lock_can_be_taken(tmp_path, monkeypatch):
    def no_locks(descriptor, operation):
        raise OSError(errno.ENOLCK, "No locks available")  # NFS without lockd

    monkeypatch.setattr(disk_cache.fcntl, "flock", no_locks)
    cache_file = disk_cache._KeyedCacheFile(str(tmp_path), "kernel-1.py311", 1.0)
    cache_file.save(("float32",), ("code",))
    assert cache_file.load(("float32",)) == ("code",)


_MODULE = '''
from poolgrad.kernels import jit


@jit()
def doubled(values):
    out = values.copy()
    for i in range(values.size):
        out[i] = 2 * values[i]
    return out
'''


def _fresh_import(path):
    spec = importlib.util.spec_from_file_location("cached_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_kernel_compiled_in_one_process_loads_its_signatures_in_another(tmp_path):
    path = tmp_path / "cached_kernel.py"
    path.write_text(_MODULE)
    first = _fresh_import(path).doubled
    values = {np.float32: np.arange(5, dtype=np.float32),
              np.float64: np.arange(5, dtype=np.float64)}
    for array in values.values():
        first(array)
    assert len(first.stats.cache_misses) == 2
    # A second import builds a new dispatcher with nothing in memory, as a new process
    # would: both signatures come from the disk, each to its own code
    second = _fresh_import(path).doubled
    for dtype, array in values.items():
        result = second(array)
        assert result.dtype == dtype
        np.testing.assert_array_equal(result, 2 * array)
    assert sum(second.stats.cache_hits.values()) == 2
    assert not second.stats.cache_misses


_PARALLEL_MODULE = '''
import numba
from poolgrad.kernels import parallel_kernel


@parallel_kernel
def halved(values, out):
    for i in numba.prange(values.size):
        out[i] = values[i] / 2
'''


def test_a_kernels_serial_and_parallel_builds_cache_apart(tmp_path):
    """Numba's cache keys hold the signature, not the options: without files of its
    own, the serial build would load the parallel one's code, or the reverse."""
    path = tmp_path / "cached_kernel.py"
    path.write_text(_PARALLEL_MODULE)
    small = np.arange(5.0)
    large = np.arange(float(poolgrad.kernels.SERIAL_BELOW))
    first = _fresh_import(path).halved
    for values in (small, large):
        first(values, np.empty_like(values))
    assert len(first.serial.stats.cache_misses) == len(first.compiled.stats.cache_misses) == 1
    indexes = [build._cache._cache_file._index_path for build in (first.serial, first.compiled)]
    assert indexes[0] != indexes[1] and all(os.path.exists(index) for index in indexes)
    second = _fresh_import(path).halved
    for values in (small, large):
        out = np.empty_like(values)
        second(values, out)
        np.testing.assert_array_equal(out, values / 2)
    for build in (second.serial, second.compiled):
        assert sum(build.stats.cache_hits.values()) == 1 and not build.stats.cache_misses


def _dispatchers(module):
    for value in vars(module).values():
        for build in (getattr(value, "compiled", value), getattr(value, "serial", None)):
            if isinstance(build, Dispatcher):
                yield build


def test_every_kernel_compiles_through_the_process_safe_cache():
    modules = [importlib.import_module(f"poolgrad.kernels.{info.name}")
               for info in pkgutil.iter_modules(poolgrad.kernels.__path__)]
    modules += [poolgrad.kernels, poolgrad.bench.roofline]
    dispatchers = {id(d): d for module in modules for d in _dispatchers(module)}
    assert len(dispatchers) > 50
    plain = sorted(d.py_func.__qualname__ for d in dispatchers.values()
                   if not isinstance(d._cache, disk_cache.ProcessSafeCache))
    assert plain == []


def test_jit_keeps_the_kernel_options_and_takes_more():
    @jit(inline="always")
    def add_one(x):
        return x + 1

    options = add_one.targetoptions
    assert options["nogil"] and options["error_model"] == "numpy"
    assert options["inline"] == "always" and options["fastmath"] == {"nsz"}
    assert isinstance(add_one._cache, disk_cache.ProcessSafeCache)
    assert not isinstance(jit(cache=False)(lambda x: x)._cache, disk_cache.ProcessSafeCache)


_HELPER = '''
from poolgrad.kernels import jit


@jit(inline="always")
def offset():
    return {value}
'''

_USER = '''
from poolgrad.kernels import jit
from cached_helper import offset


@jit()
def shifted(values):
    out = values.copy()
    for i in range(values.size):
        out[i] = values[i] + offset()
    return out
'''


def _import_user(folder, monkeypatch, digest):
    """The kernel module and its helper module imported afresh (as a new process
    would), with ``digest`` as the package's."""
    monkeypatch.setattr(disk_cache, "package_digest", lambda: digest)
    monkeypatch.delitem(sys.modules, "cached_helper", raising=False)
    return _fresh_import(folder / "cached_user.py").shifted


def test_a_change_to_a_helper_in_another_module_compiles_the_kernel_again(tmp_path,
                                                                         monkeypatch):
    """Numba keys a kernel's cache on its own file and bytecode: a helper changed in
    another module leaves the kernel's index fresh to Numba, which loads the old code.
    The package digest in the stamp makes that a miss."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "cached_user.py").write_text(_USER)
    (tmp_path / "cached_helper.py").write_text(_HELPER.format(value=1))
    values = np.arange(4.0)
    first = _import_user(tmp_path, monkeypatch, "before")
    np.testing.assert_array_equal(first(values), values + 1)
    (tmp_path / "cached_helper.py").write_text(_HELPER.format(value=2))
    stale = _import_user(tmp_path, monkeypatch, "before")  # the digest left as it was
    np.testing.assert_array_equal(stale(values), values + 1)  # Numba's stale load
    fresh = _import_user(tmp_path, monkeypatch, "after")
    np.testing.assert_array_equal(fresh(values), values + 2)
    assert len(fresh.stats.cache_misses) == 1


def test_the_package_digest_follows_every_module_of_the_folder(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("not a module\n")
    before = disk_cache.package_digest(str(tmp_path))
    (tmp_path / "notes.txt").write_text("changed\n")
    disk_cache.package_digest.cache_clear()
    assert disk_cache.package_digest(str(tmp_path)) == before
    (tmp_path / "b.py").write_text("y = 2\n")
    disk_cache.package_digest.cache_clear()
    assert disk_cache.package_digest(str(tmp_path)) != before
    stamp = poolgrad.kernels.max_pool.max_pool_forward.serial._cache._cache_file._source_stamp
    assert stamp[1] == disk_cache.package_digest()
    assert disk_cache.package_digest(str(tmp_path / "missing")) == ""
