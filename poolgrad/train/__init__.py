"""``poolgrad train``: train a small CNN on a local dataset with poolgrad's pooling, in
NumPy (:mod:`poolgrad.nn`) or in PyTorch (:mod:`poolgrad.torch`), and write its
checkpoint, ``metrics.json`` and a plot. :func:`train` runs a :class:`TrainConfig`
with its engine; the command line builds the config from its flags. The rooms:

- :mod:`~poolgrad.train.config`: :class:`TrainConfig`, every setting and its check,
  the per-dataset defaults;
- :mod:`~poolgrad.train.menu`: the ``--pool`` menu, each downsampling's layers in both
  engines side by side;
- :mod:`~poolgrad.train.run`: what both engines go through: beginning or resuming a
  run, the progress bar, the history, ``metrics.json`` and the plot;
- :mod:`~poolgrad.train.checkpoints`: each engine's checkpoint;
- :mod:`~poolgrad.train.numpy_engine` and :mod:`~poolgrad.train.torch_engine` (with
  ``--nproc``: data-parallel over spawned processes): the networks and the loop.

Example (``train(config)`` would then write into ``runs/digits``):

>>> config = TrainConfig(dataset="digits", pool="gem", head="gap", epochs=1)
>>> config.out, config.settings()["optimizer"]
('runs/digits', 'adam')
>>> TrainConfig(pool="median")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
poolgrad.train.config.TrainError: unknown pool 'median': choose one of max, avg, lp, ...
"""

from __future__ import annotations

from . import numpy_engine, torch_engine
from .config import DEFAULTS, ENGINES, HEADS, TrainConfig, TrainError
from .menu import POOLS
from .run import METRICS

__all__ = ["DEFAULTS", "ENGINES", "HEADS", "METRICS", "POOLS", "TrainConfig", "TrainError",
           "train"]


def train(config: TrainConfig) -> dict:
    """Train as ``config`` says, with its engine; returns the metrics (what
    ``metrics.json`` holds)."""
    engine = torch_engine if config.engine == "torch" else numpy_engine
    return engine.train(config)
