"""What a run of ``poolgrad train`` is told, checked in one place: :class:`TrainConfig`,
the per-dataset defaults it falls back on, and the checks that resuming repeats against
a checkpoint's settings."""

from __future__ import annotations

import math
import os
from dataclasses import InitVar, dataclass, field, fields

from .. import optim
from ..tools import datasets
from ..tools.choices import check_choice
from .menu import check_pool

HEADS = ("flatten", "gap", "attention")  # the --head choices
ENGINES = ("numpy", "torch")  # the --engine choices
DEVICES = ("auto", "cpu", "cuda")  # the --device choices (cuda: the torch engine's)

# Per-dataset defaults, chosen so that a bare `poolgrad train --dataset NAME` reaches the
# README's accuracy: conv widths and kernel per stage (each stage halves the length),
# epochs, optimizer and learning rate.
DEFAULTS = {
    "digits": {"widths": (16, 32), "conv_kernel": 3, "epochs": 30, "optimizer": "adam",
               "lr": 0.003},
    "mnist1d": {"widths": (64, 64, 64), "conv_kernel": 5, "epochs": 60, "optimizer": "adam",
                "lr": 0.01},
    "idx": {"widths": (16, 32), "conv_kernel": 5, "epochs": 3, "optimizer": "adam",
            "lr": 0.001},
}

# What --resume may not change: the checkpoint's settings hold. (Only --epochs, to
# extend the run, and --nproc may differ.)
_FIXED_ON_RESUME = {"pool": "--pool", "gap_head": "--gap-head", "head": "--head",
                    "batch_size": "--batch-size", "accumulate": "--accumulate",
                    "optimizer": "--optimizer", "lr": "--lr", "seed": "--seed"}


class TrainError(ValueError):
    """Settings or files that training cannot use."""


def defaults_for(dataset: str) -> dict:
    return DEFAULTS[datasets.kind_of(dataset, error=TrainError)]


def default_out(dataset: str) -> str:
    """``runs/DATASET``, an ``idx:PATH`` dataset's path made one folder name."""
    return os.path.join("runs", dataset.replace("idx:", "idx-").replace(os.sep, "_"))


def resolve_head(head: str | None, gap_head: bool) -> str:
    """The head, from ``head`` or the older flag ``gap_head`` (``head="gap"``)."""
    if gap_head and head not in (None, "gap"):
        raise TrainError(f"--gap-head is --head gap; it cannot go with --head {head}")
    head = "gap" if gap_head else (head or "flatten")
    return check_choice(head, HEADS, "head", TrainError)


def check_nproc(nproc, batch_size, engine: str = "numpy") -> None:
    """A TrainError unless ``nproc`` processes can share a global batch of
    ``batch_size`` (None: not known yet): data-parallel training is the torch
    engine's, and every rank takes the same share of each batch."""
    if engine not in ENGINES:
        raise TrainError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if not _is_int(nproc, 1):
        raise TrainError(f"nproc must be an integer >= 1, got {nproc!r}")
    if nproc > 1 and engine != "torch":
        raise TrainError(f"--nproc {nproc} needs --engine torch: the {engine} engine trains "
                         "in one process")
    if isinstance(batch_size, int) and batch_size % nproc:
        raise TrainError(f"--batch-size {batch_size} is not divisible by --nproc {nproc}: it "
                         "is the global batch, split evenly across the processes")


def check_device(device, engine: str, nproc: int) -> None:
    """A TrainError unless the ``engine`` can train on ``device`` with ``nproc``
    processes: the numpy engine trains on the CPU, the ranks of ``--nproc`` on CPU
    processes, one GPU in one process."""
    if device not in DEVICES:
        raise TrainError(f"unknown device {device!r}: choose one of {', '.join(DEVICES)}")
    if device == "cuda" and engine != "torch":
        raise TrainError(f"--device cuda needs --engine torch: the {engine} engine trains "
                         "on the CPU")
    if device == "cuda" and nproc > 1:
        raise TrainError(f"--device cuda trains in one process, and --nproc {nproc} on CPU "
                         "processes: give one or the other")


def resolve_device(device: str, nproc: int, torch) -> str:
    """``cpu`` or ``cuda``: ``auto`` is the GPU when torch sees one and one process
    trains. ``cuda`` without a GPU is a TrainError, raised before any work."""
    if device == "auto":
        return "cuda" if nproc == 1 and torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise TrainError("--device cuda: torch sees no CUDA GPU here; use --device cpu")
    return device


def require_torch():
    """The ``torch`` module, or a TrainError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise TrainError('--engine torch needs PyTorch: pip install -e ".[torch]" '
                         "(or pip install torch)") from None
    return torch


def _is_int(value, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


@dataclass(frozen=True)
class TrainConfig:
    """A run of ``poolgrad train``: the settings (None takes the dataset's default, from
    :data:`DEFAULTS`), where it writes, and how it runs. Creating one checks every
    setting, in the order the command line reports them; what only a checkpoint can
    tell (resuming) is checked when the run begins.

    - ``dataset``: ``digits``, ``mnist1d`` or ``idx:PATH``; ``data``, when given,
      replaces loading it (the tests pass small arrays).
    - ``out``: the folder of ``checkpoint.npz`` (``.pt``), ``metrics.json`` and
      ``training.png``; None: ``runs/DATASET``.
    - ``engine``: ``numpy`` (poolgrad.nn) or ``torch`` (torch.nn with poolgrad.torch's
      pooling); ``nproc`` > 1 processes train data-parallel (torch only); ``device``
      (torch only): ``cpu``, ``cuda``, or ``auto``, the GPU when torch sees one and
      ``nproc`` is 1. A resumed run may take another ``nproc`` or ``device``.
    - the network and its training: ``pool`` (one of
      :data:`poolgrad.train.menu.POOLS`), ``head`` (one of :data:`HEADS`; ``gap_head``
      is the older ``head="gap"``), ``epochs``, ``batch_size`` (the global batch),
      ``accumulate`` (Caffe's ``iter_size``: each step sums the gradients of that many
      batches, weighted so that it takes the mean over all their examples, as one
      batch ``accumulate`` times as large would), ``optimizer``, ``lr``, ``seed``.
    - ``resume``: go on from the checkpoint in ``out``, whose settings hold; only
      ``epochs`` (to extend the run) and ``nproc`` may be given. ``overwrite``: replace
      the run in ``out`` (either engine's) whole once this one has finished; until then
      the old run stays as it was (:func:`poolgrad.tools.folders.replacing`). Without
      either, ``out`` must hold no run; never may it hold anything but a run.
    - ``progress``: the progress bar; ``plot``: ``training.png``.

    ``flags`` (not kept): name the two settings checked against a list by their
    command-line flags (``unknown --pool ...``), as ``poolgrad train`` reports them.
    """

    dataset: str = "digits"
    out: str | None = None
    engine: str = "numpy"
    pool: str = "max"
    head: str | None = None
    gap_head: bool = False
    epochs: int | None = None
    batch_size: int = 100
    accumulate: int = 1
    optimizer: str | None = None
    lr: float | None = None
    seed: int = 0
    resume: bool = False
    overwrite: bool = False
    nproc: int = 1
    device: str = "auto"
    progress: bool = True
    plot: bool = True
    data: datasets.Dataset | None = field(default=None, repr=False, compare=False)
    flags: InitVar[bool] = False

    def __post_init__(self, flags: bool) -> None:
        check_pool(self.pool, "--pool" if flags else "pool", TrainError)
        datasets.kind_of(self.dataset, "--dataset" if flags else "dataset", TrainError)
        check_nproc(self.nproc, None if self.resume else self.batch_size, self.engine)
        check_device(self.device, self.engine, self.nproc)
        if self.resume and self.overwrite:
            raise TrainError("--resume continues the run in the output folder and "
                             "--overwrite replaces it: give one or the other")
        if self.resume:
            given = [flag for name, flag in _FIXED_ON_RESUME.items()
                     if getattr(self, name) != _default(name)]
            if given:
                raise TrainError(f"--resume takes its settings from the checkpoint; only "
                                 f"--epochs may change, but {', '.join(given)} was given")
        resolve_head(self.head, self.gap_head)
        if self.optimizer is not None and self.optimizer not in optim.OPTIMIZERS:
            raise TrainError(f"unknown optimizer {self.optimizer!r}: choose one of "
                             f"{', '.join(optim.OPTIMIZERS)}")
        for name, minimum in (("epochs", 1), ("batch_size", 1), ("accumulate", 1), ("seed", 0)):
            value = getattr(self, name)
            if value is None and name == "epochs":
                continue  # the dataset's default
            if not _is_int(value, minimum):
                raise TrainError(f"{name} must be an integer >= {minimum}, got {value!r}")
        lr = self.lr
        if lr is not None and (not isinstance(lr, (int, float)) or isinstance(lr, bool)
                               or not math.isfinite(lr) or lr <= 0):
            raise TrainError(f"lr must be a finite number > 0, got {lr!r}")
        if self.out is None:
            object.__setattr__(self, "out", default_out(self.dataset))

    def settings(self) -> dict:
        """A fresh run's settings, as its checkpoint and ``metrics.json`` record them:
        the dataset's defaults where this config leaves None."""
        defaults = defaults_for(self.dataset)
        head = resolve_head(self.head, self.gap_head)
        return {"dataset": self.dataset, "pool": self.pool, "head": head,
                "gap_head": head == "gap",
                "epochs": defaults["epochs"] if self.epochs is None else self.epochs,
                "batch_size": self.batch_size, "accumulate": self.accumulate,
                "optimizer": defaults["optimizer"] if self.optimizer is None else self.optimizer,
                "lr": defaults["lr"] if self.lr is None else self.lr, "seed": self.seed,
                "widths": list(defaults["widths"]), "conv_kernel": defaults["conv_kernel"],
                "engine": self.engine, "nproc": self.nproc}


def _default(name: str):
    return next(f.default for f in fields(TrainConfig) if f.name == name)
