"""A run from start to finish, as both engines go through it: :func:`check_folder`
(what the output folder holds), :func:`begin` (the settings, fresh or a checkpoint's,
the data), :func:`writing` (the folder the files go to), the progress bar, the history
an epoch at a time (:func:`record_epoch`), and :func:`finish` (``metrics.json`` and the
plot)."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..tools import datasets, folders
from ..tools.figures import figure_class, save_png
from ..tools.files import check_output_folder, probe_folder, write_atomically
from .checkpoints import CHECKPOINTS
from .config import TrainConfig, TrainError, check_nproc

METRICS, PLOT = "metrics.json", "training.png"


@dataclass
class Run:
    """A run as it starts or goes on: its settings, the data, the ``folder`` its files
    are written into, the per-epoch history so far, the next epoch and the seconds of
    training so far."""
    settings: dict
    data: datasets.Dataset
    folder: str
    history: list = field(default_factory=list)
    start_epoch: int = 0
    train_time: float = 0.0


def check_folder(config: TrainConfig) -> None:
    """A TrainError, before anything is read or trained, unless ``config.out`` suits the
    run: no run for a fresh one, a run of ``config.engine`` to resume, any run to
    overwrite, and never anything but a run (:func:`poolgrad.tools.folders.survey`).
    A run an interrupted ``--overwrite`` had moved aside is put back first."""
    restored = folders.recover(config.out)
    if restored:
        print(f"poolgrad train: {restored}", file=sys.stderr)
    found = folders.survey(config.out, folders.TRAIN, TrainError)
    if config.overwrite:
        return
    engines = [engine for engine, name in CHECKPOINTS.items() if name in found]
    if config.resume and len(engines) > 1:
        raise TrainError(f"{config.out} holds the checkpoints of both engines "
                         f"({', '.join(CHECKPOINTS.values())}): it mixes two runs; give "
                         "another --out, or --overwrite to start afresh there")
    if config.resume and engines and engines != [config.engine]:
        raise TrainError(f"the checkpoint in {config.out} ({CHECKPOINTS[engines[0]]}) was "
                         f"written by --engine {engines[0]}: resume it with --engine "
                         f"{engines[0]}")
    if found and not config.resume:
        raise TrainError(f"{config.out} holds another run ({', '.join(found)}): --resume "
                         "continues it, --overwrite replaces it; or give another --out")


def begin(config: TrainConfig, meta: dict | None) -> Run:
    """Check what is left to check, then load the data: a fresh run's settings, or
    with ``meta`` (a checkpoint's) the resumed run's (``config.epochs`` may extend it;
    ``config.nproc`` may differ), the output folder, and matplotlib when
    ``config.plot``. Call :func:`check_folder` first."""
    if meta is not None:
        settings = dict(meta["settings"])
        settings.setdefault("engine", "numpy")  # checkpoints from before --engine
        settings.setdefault("head", "gap" if settings["gap_head"] else "flatten")  # and --head
        settings.setdefault("accumulate", 1)  # and --accumulate
        if config.data is None and config.dataset != settings["dataset"]:
            raise TrainError(f"the checkpoint in {config.out} was trained on "
                             f"{settings['dataset']}, not {config.dataset}")
        if config.epochs is not None:
            if config.epochs < meta["epoch"]:
                raise TrainError(f"the checkpoint has already run {meta['epoch']} epochs; "
                                 f"--epochs {config.epochs} would go back")
            settings["epochs"] = config.epochs
    else:
        settings = config.settings()
    check_nproc(config.nproc, settings["batch_size"], config.engine)
    settings["nproc"] = config.nproc
    check_output_folder(config.out, TrainError)
    if config.plot:
        _figure_class()  # fail before training, not after, when matplotlib is missing
    data = config.data if config.data is not None else datasets.load(settings["dataset"])
    if not config.overwrite:  # the last check: it makes the folder (writing() probes its own)
        probe_folder(config.out, TrainError)
    if meta is None:
        return Run(settings, data, config.out)
    return Run(settings, data, config.out, meta["history"], meta["epoch"],
               meta["train_time_s"])


@contextmanager
def writing(run: Run, config: TrainConfig) -> Iterator[None]:
    """The block that trains ``run`` and writes its files into ``run.folder``: with
    ``config.overwrite`` a staging folder beside ``config.out``, which replaces it whole
    when the block ends and is removed if the block raises, leaving the old run as it
    was (:func:`poolgrad.tools.folders.replacing`)."""
    if not config.overwrite:
        yield
        return
    with folders.replacing(config.out, TrainError) as staged:
        run.folder = staged
        yield


class Progress:
    """A one-line progress bar on stderr (redrawn in place on a terminal)."""

    def __init__(self, stream=sys.stderr, enabled: bool = True):
        self.stream, self.enabled = stream, enabled
        self.live = enabled and hasattr(stream, "isatty") and stream.isatty()

    def update(self, epoch, epochs, done, total, loss, accuracy, final=False):
        if not self.enabled or not (self.live or final):
            return
        filled = int(20 * done / total)
        line = (f"epoch {epoch}/{epochs} [{'#' * filled}{'.' * (20 - filled)}] {done}/{total} "
                f"loss {loss:.4f} acc {accuracy:6.2%}")
        self.stream.write(("\r" if self.live else "") + line + ("\n" if final else ""))
        self.stream.flush()


def record_epoch(run: Run, epoch: int, loss_sum: float, correct: int, seen: int,
                 test_loss: float, test_accuracy: float) -> None:
    """Add epoch ``epoch`` (0-based) to the history: train loss and accuracy over the
    ``seen`` examples, test loss and accuracy."""
    run.history.append({"epoch": epoch + 1, "train_loss": loss_sum / seen,
                        "train_accuracy": correct / seen, "test_loss": test_loss,
                        "test_accuracy": test_accuracy})


def finish(run: Run, out: str, checkpoint_path: str, test_loss: float, test_accuracy: float,
           plot: bool) -> dict:
    """Write ``metrics.json`` and, with ``plot``, ``training.png`` into ``run.folder``;
    returns the metrics, which name the files in ``out`` (with ``checkpoint_path``)."""
    settings = run.settings
    metrics = {"test_accuracy": test_accuracy, "test_loss": test_loss,
               "train_time_s": run.train_time, "epochs_run": len(run.history),
               "train_examples": len(run.data.y_train), "test_examples": len(run.data.y_test),
               "settings": settings, "history": run.history,
               "checkpoint": checkpoint_path, "plot": os.path.join(out, PLOT) if plot else None}
    text = json.dumps(_json_safe(metrics), indent=2, allow_nan=False)
    write_atomically(os.path.join(run.folder, METRICS),
                     lambda stream: stream.write(text.encode()))
    if plot:
        plot_history(run.history, os.path.join(run.folder, PLOT), title=(
            f"{settings['dataset']}, {settings['pool']} pooling: test accuracy "
            f"{test_accuracy:.2%}"))
    return metrics


def _json_safe(value):
    """NaN and infinities (a diverged run) become null: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _figure_class():
    return figure_class("the training plot", "train", TrainError)


def plot_history(history: list[dict], path: str, title: str = "") -> None:
    """Loss and accuracy per epoch (train and test) as a PNG, written atomically."""
    figure = _figure_class()(figsize=(10, 4))
    left, right = figure.subplots(1, 2)
    epochs = [h["epoch"] for h in history]
    for split in ("train", "test"):
        left.plot(epochs, [h[f"{split}_loss"] for h in history], marker=".", label=split)
        right.plot(epochs, [100 * h[f"{split}_accuracy"] for h in history], marker=".",
                   label=split)
    left.set(xlabel="epoch", ylabel="cross-entropy loss", yscale="log")
    right.set(xlabel="epoch", ylabel="accuracy (%)")
    for axes in (left, right):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.suptitle(title)
    figure.tight_layout()
    save_png(figure, path, dpi=100)
