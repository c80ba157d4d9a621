"""Datasets for ``poolgrad train``, ``explain`` and ``study``, made or read locally:
nothing is downloaded.

- ``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 images, shipped
  inside scikit-learn). Split: a permutation drawn with ``numpy.random.default_rng(0)``;
  its first 1,437 images train and the last 360 (20%) test. Pixels 0..16 scaled to 0..1.
- ``mnist1d``: MNIST-1D made by the ``mnist1d`` package's ``make_dataset`` with its
  default arguments (seed 42): 4,000 train and 1,000 test sequences of length 40.
- ``idx:PATH``: MNIST or Fashion-MNIST IDX files in the folder PATH, gzipped or not
  (``train-images-idx3-ubyte[.gz]``, ``train-labels-idx1-ubyte[.gz]``,
  ``t10k-images-idx3-ubyte[.gz]``, ``t10k-labels-idx1-ubyte[.gz]``). Pixels scaled to 0..1.

Every dataset is ``(N, 1, *spatial)`` float32 images and int64 labels.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass

import numpy as np

BUNDLED = ("digits", "mnist1d")  # made or shipped by a package (idx:PATH reads a folder)


class DatasetError(ValueError):
    """A dataset that cannot be loaded: unknown, missing or corrupt."""


def kind_of(name, what: str = "dataset", error: type[ValueError] = DatasetError) -> str:
    """``"digits"``, ``"mnist1d"`` or ``"idx"``: which dataset :func:`load` gives for
    ``name``; for any other name, ``error`` saying ``unknown {what} ...`` and what is
    allowed. The one check of dataset names."""
    if name in BUNDLED:
        return name
    if isinstance(name, str) and name.startswith("idx:") and len(name) > 4:
        return "idx"
    raise error(f"unknown {what} {name!r}: choose {', '.join(BUNDLED)} or idx:PATH (a folder "
                "of MNIST-style IDX files)")


@dataclass
class Dataset:
    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1

    @property
    def spatial(self) -> tuple[int, ...]:
        return self.x_train.shape[2:]


def _need(module: str, package: str, dataset: str):
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError:
        raise DatasetError(f"the {dataset} dataset needs the {package} package: "
                           f"pip install {package} (or pip install 'poolgrad[train]')") from None


def digits() -> Dataset:
    sklearn_datasets = _need("sklearn.datasets", "scikit-learn", "digits")
    bunch = sklearn_datasets.load_digits()
    x = (bunch.images / 16.0).astype(np.float32)[:, None]
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:1437], order[1437:]
    return Dataset("digits", x[train], y[train], x[test], y[test])


def mnist1d() -> Dataset:
    data = _need("mnist1d.data", "mnist1d", "mnist1d")
    state = np.random.get_state()  # make_dataset seeds NumPy's global generator
    try:
        made = data.make_dataset(data.get_dataset_args())
    finally:
        np.random.set_state(state)
    return Dataset("mnist1d", made["x"].astype(np.float32)[:, None],
                   made["y"].astype(np.int64), made["x_test"].astype(np.float32)[:, None],
                   made["y_test"].astype(np.int64))


# IDX: two zero bytes, a type code, the number of dims, then each dim as a big-endian int32
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4",
              0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """One IDX file (gzipped if its name ends in ``.gz``) as an array."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as stream:
            raw = stream.read()
    except FileNotFoundError:
        raise DatasetError(f"IDX file not found: {path}") from None
    except (OSError, EOFError, zlib.error) as error:
        raise DatasetError(f"cannot read IDX file {path}: {error}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise DatasetError(f"{path} is not an IDX file: its header must start with two zero "
                           f"bytes and a type code in {sorted(_IDX_TYPES)}")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise DatasetError(f"{path}: corrupt IDX header ({ndim} dims, {len(raw)} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(raw) != expected:
        raise DatasetError(f"{path}: the header promises shape {shape} ({expected} bytes) "
                           f"but the file has {len(raw)} bytes")
    return np.frombuffer(raw, dtype, offset=header).reshape(shape)


def _idx_file(folder: str, stem: str) -> str:
    for name in (stem, stem + ".gz"):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return path
    raise DatasetError(f"IDX file not found: {os.path.join(folder, stem)}[.gz]")


def _idx_split(folder: str, prefix: str):
    images = read_idx(_idx_file(folder, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(_idx_file(folder, f"{prefix}-labels-idx1-ubyte"))
    if images.ndim != 3 or labels.ndim != 1:
        raise DatasetError(f"{folder}: {prefix} images must be 3-d and labels 1-d IDX "
                           f"arrays, got {images.ndim}-d and {labels.ndim}-d")
    if len(images) != len(labels):
        raise DatasetError(f"{folder}: {len(images)} {prefix} images but {len(labels)} labels")
    return (images.astype(np.float32) / 255.0)[:, None], labels.astype(np.int64)


def idx(folder: str) -> Dataset:
    if not os.path.isdir(folder):
        raise DatasetError(f"IDX folder not found: {folder}")
    x_train, y_train = _idx_split(folder, "train")
    x_test, y_test = _idx_split(folder, "t10k")
    return Dataset(f"idx:{folder}", x_train, y_train, x_test, y_test)


def load(name: str) -> Dataset:
    """``digits``, ``mnist1d`` or ``idx:PATH``."""
    kind = kind_of(name)
    if kind == "idx":
        return idx(name[4:])
    return digits() if kind == "digits" else mnist1d()
