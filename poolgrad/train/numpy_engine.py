"""Mini-batch training of a small CNN on a local dataset: ``poolgrad train``.

One training step is the textbook one. The forward pass runs on every example of the
batch and each pooling layer keeps each example's own argmax; the backward pass routes
each example's gradient through it; the weight gradients (of the convolutions and the
linear layer) are averaged over the batch by the mean loss; then the optimizer steps.

Runs are reproducible: the weights start from ``seed`` and epoch ``e`` shuffles with
``numpy.random.default_rng([seed, e])``, so a run resumed from its checkpoint reaches
the same weights as an uninterrupted one.

This module is the NumPy engine and what both engines share (settings, resuming, the
progress bar, the history, metrics.json and the plot); :mod:`poolgrad.train_torch` is
the PyTorch engine (``--engine torch``, data-parallel with ``--nproc``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import zipfile
from dataclasses import dataclass, field

import numpy as np

from .. import nn, optim
from ..tools import datasets
from ..tools.figures import figure_class, save_png
from ..tools.files import check_output_folder, write_atomically

POOLS = nn.POOLS  # the --pool choices
HEADS = ("flatten", "gap", "attention")  # the --head choices

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

# Each engine writes its own kind of checkpoint; --resume refuses the other kind.
CHECKPOINTS = {"numpy": "checkpoint.npz", "torch": "checkpoint.pt"}
ENGINES = tuple(CHECKPOINTS)
CHECKPOINT, METRICS, PLOT = CHECKPOINTS["numpy"], "metrics.json", "training.png"


class TrainError(ValueError):
    """Settings or files that training cannot use."""


def defaults_for(dataset: str) -> dict:
    return DEFAULTS[datasets.kind_of(dataset, error=TrainError)]


def resolve_head(head: str | None, gap_head: bool) -> str:
    """The head, from ``head`` or the older flag ``gap_head`` (``head="gap"``)."""
    if gap_head and head not in (None, "gap"):
        raise TrainError(f"--gap-head is --head gap; it cannot go with --head {head}")
    head = "gap" if gap_head else (head or "flatten")
    return nn.check_pool(head, HEADS, "head", TrainError)


def build_model(in_channels: int, spatial: tuple[int, ...], classes: int, *, pool: str = "max",
                widths=(16, 32), conv_kernel: int = 3, gap_head: bool = False,
                head: str | None = None, seed: int = 0, dtype=np.float32) -> nn.Sequential:
    """Stages of conv -> ReLU -> downsample (2x, by ``pool``: one of :data:`POOLS`), then
    a linear head on the flattened features (``head="flatten"``), on their global
    average (``"gap"``, or ``gap_head``) or on an attention pooling's readout
    (``"attention"``: one query, one head)."""
    nn.check_pool(pool, error=TrainError)
    head = resolve_head(head, gap_head)
    rng = np.random.default_rng(seed)
    ndim = len(spatial)
    layers: list[nn.Layer] = []
    channels = in_channels
    for width in widths:
        layers += [nn.Conv(channels, width, conv_kernel, padding=conv_kernel // 2, ndim=ndim,
                           rng=rng, dtype=dtype), nn.ReLU()]
        if pool in nn.DOWNSAMPLING:
            layers.append(nn.DOWNSAMPLING[pool](ndim, rng))
        else:  # a learned 2x downsampling in place of pooling
            layers += [nn.Conv(width, width, 2, stride=2, ndim=ndim, rng=rng, dtype=dtype),
                       nn.ReLU()]
        channels = width
    if head == "gap":
        layers.append(nn.GlobalAvgPool())
    elif head == "attention":
        layers.append(nn.AttentionPool(channels, rng=rng))
    layers.append(nn.Flatten())
    probe = nn.Sequential(*layers).eval()  # eval: the probe saves no state
    features = probe.forward(np.zeros((1, in_channels) + tuple(spatial), dtype=dtype)).shape[1]
    probe.train()
    layers.append(nn.Linear(features, classes, rng=rng, dtype=dtype))
    return nn.Sequential(*layers)


def evaluate(model: nn.Sequential, x: np.ndarray, y: np.ndarray, batch: int = 500):
    """(mean loss, accuracy) of ``model`` in evaluation mode; its mode is restored."""
    was_training = model.training
    model.eval()
    loss_fn = nn.SoftmaxCrossEntropy()
    total_loss, correct = 0.0, 0
    for start in range(0, len(y), batch):
        logits = model.forward(x[start:start + batch])
        total_loss += loss_fn.forward(logits, y[start:start + batch]) * len(logits)
        correct += int((logits.argmax(axis=1) == y[start:start + batch]).sum())
    model.train(was_training)
    return total_loss / len(y), correct / len(y)


class _Progress:
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


def _save_checkpoint(path, model, optimizer, settings, epoch, history, train_time):
    arrays = {f"weight/{k}": v for k, v in model.state_dict().items()}
    arrays.update({f"optimizer/{k}": v for k, v in optimizer.state_dict().items()})
    arrays["meta"] = np.array(json.dumps({"settings": settings, "epoch": epoch,
                                          "history": history, "train_time_s": train_time}))
    write_atomically(path, lambda stream: np.savez(stream, **arrays))


def load_checkpoint(path: str):
    """``(weights, optimizer_state, meta)`` of a checkpoint written by :func:`train`."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
        meta = check_meta(json.loads(str(arrays.pop("meta"))))
    except FileNotFoundError:
        raise TrainError(f"no checkpoint to resume from: {path} does not exist") from None
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as error:
        raise TrainError(f"{path} is not a poolgrad checkpoint ({error})") from None
    weights = {k[len("weight/"):]: v for k, v in arrays.items() if k.startswith("weight/")}
    state = {k[len("optimizer/"):]: v for k, v in arrays.items() if k.startswith("optimizer/")}
    return weights, state, meta


def check_meta(meta) -> dict:
    """``meta`` if it has what resuming needs; otherwise a ValueError saying what lacks."""
    missing = {"settings", "epoch", "history", "train_time_s"} - set(meta)
    if missing:
        raise ValueError(f"its metadata lacks {sorted(missing)}")
    return meta


def refuse_other_engine(out: str, engine: str) -> None:
    """A TrainError when ``out`` holds only the other engine's checkpoint: a run resumes
    with the engine that started it."""
    for other, name in CHECKPOINTS.items():
        if (other != engine and os.path.exists(os.path.join(out, name))
                and not os.path.exists(os.path.join(out, CHECKPOINTS[engine]))):
            raise TrainError(f"the checkpoint in {out} ({name}) was written by --engine "
                             f"{other}: resume it with --engine {other}")


def check_nproc(nproc, batch_size, engine: str = "numpy") -> None:
    """A TrainError unless ``nproc`` processes can share a global batch of
    ``batch_size``: data-parallel training is the torch engine's, and every rank takes
    the same share of each batch."""
    if engine not in ENGINES:
        raise TrainError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise TrainError(f"nproc must be an integer >= 1, got {nproc!r}")
    if nproc > 1 and engine != "torch":
        raise TrainError(f"--nproc {nproc} needs --engine torch: the {engine} engine trains "
                         "in one process")
    if isinstance(batch_size, int) and batch_size % nproc:
        raise TrainError(f"--batch-size {batch_size} is not divisible by --nproc {nproc}: it "
                         "is the global batch, split evenly across the processes")


def _settings(dataset, pool, gap_head, epochs, batch_size, optimizer, lr, seed,
              engine="numpy", head=None):
    defaults = defaults_for(dataset)
    head = resolve_head(head, gap_head)
    settings = {"dataset": dataset, "pool": pool, "head": head, "gap_head": head == "gap",
                "epochs": defaults["epochs"] if epochs is None else epochs,
                "batch_size": batch_size,
                "optimizer": defaults["optimizer"] if optimizer is None else optimizer,
                "lr": defaults["lr"] if lr is None else lr, "seed": seed,
                "widths": list(defaults["widths"]), "conv_kernel": defaults["conv_kernel"],
                "engine": engine}
    nn.check_pool(pool, error=TrainError)
    if settings["optimizer"] not in optim.OPTIMIZERS:
        raise TrainError(f"unknown optimizer {settings['optimizer']!r}: choose one of "
                         f"{', '.join(optim.OPTIMIZERS)}")
    for name in ("epochs", "batch_size", "seed"):
        value = settings[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < (name != "seed"):
            raise TrainError(f"{name} must be an integer >= {int(name != 'seed')}, got {value!r}")
    lr = settings["lr"]
    if (not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr)
            or lr <= 0):
        raise TrainError(f"lr must be a finite number > 0, got {lr!r}")
    return settings


@dataclass
class Run:
    """A run as it starts or goes on: its settings, the data, the per-epoch history so
    far, the next epoch and the seconds of training so far."""
    settings: dict
    data: datasets.Dataset
    history: list = field(default_factory=list)
    start_epoch: int = 0
    train_time: float = 0.0


def begin(dataset, out: str, engine: str, meta: dict | None, *, pool, gap_head, epochs,
          batch_size, optimizer, lr, seed, data, plot, nproc: int = 1,
          head: str | None = None) -> Run:
    """Check everything, then load the data: a fresh run's settings, or with ``meta``
    (a checkpoint's) the resumed run's (``epochs`` may extend it; ``nproc`` may differ),
    the output folder, and matplotlib when ``plot``."""
    if meta is not None:
        settings = dict(meta["settings"])
        settings.setdefault("engine", "numpy")  # checkpoints from before --engine
        settings.setdefault("head", "gap" if settings["gap_head"] else "flatten")  # and --head
        if data is None and dataset != settings["dataset"]:
            raise TrainError(f"the checkpoint in {out} was trained on {settings['dataset']}, "
                             f"not {dataset}")
        if epochs is not None:
            if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
                raise TrainError(f"epochs must be an integer >= 1, got {epochs!r}")
            if epochs < meta["epoch"]:
                raise TrainError(f"the checkpoint has already run {meta['epoch']} epochs; "
                                 f"--epochs {epochs} would go back")
            settings["epochs"] = epochs
    else:
        settings = _settings(dataset, pool, gap_head, epochs, batch_size, optimizer, lr, seed,
                             engine, head)
    check_nproc(nproc, settings["batch_size"], engine)
    settings["nproc"] = nproc
    check_output_folder(out, TrainError)
    if plot:
        _figure_class()  # fail before training, not after, when matplotlib is missing
    data = data if data is not None else datasets.load(settings["dataset"])
    if meta is None:
        return Run(settings, data)
    return Run(settings, data, meta["history"], meta["epoch"], meta["train_time_s"])


def record_epoch(run: Run, epoch: int, loss_sum: float, correct: int, seen: int,
                 test_loss: float, test_accuracy: float) -> None:
    """Add epoch ``epoch`` (0-based) to the history: train loss and accuracy over the
    ``seen`` examples, test loss and accuracy."""
    run.history.append({"epoch": epoch + 1, "train_loss": loss_sum / seen,
                        "train_accuracy": correct / seen, "test_loss": test_loss,
                        "test_accuracy": test_accuracy})


def finish(run: Run, out: str, checkpoint_path: str, test_loss: float, test_accuracy: float,
           plot: bool) -> dict:
    """Write ``metrics.json`` and, with ``plot``, ``training.png``; returns the metrics."""
    settings = run.settings
    metrics = {"test_accuracy": test_accuracy, "test_loss": test_loss,
               "train_time_s": run.train_time, "epochs_run": len(run.history),
               "train_examples": len(run.data.y_train), "test_examples": len(run.data.y_test),
               "settings": settings, "history": run.history,
               "checkpoint": checkpoint_path, "plot": os.path.join(out, PLOT) if plot else None}
    text = json.dumps(_json_safe(metrics), indent=2, allow_nan=False)
    write_atomically(os.path.join(out, METRICS), lambda stream: stream.write(text.encode()))
    if plot:
        plot_history(run.history, os.path.join(out, PLOT), title=(
            f"{settings['dataset']}, {settings['pool']} pooling: test accuracy "
            f"{test_accuracy:.2%}"))
    return metrics


def train(dataset: str = "digits", out: str = "runs/digits", *, pool: str = "max",
          gap_head: bool = False, epochs: int | None = None, batch_size: int = 100,
          optimizer: str | None = None, lr: float | None = None, seed: int = 0,
          resume: bool = False, progress: bool = True, data: datasets.Dataset | None = None,
          plot: bool = True, head: str | None = None) -> dict:
    """Train, evaluate and write ``checkpoint.npz``, ``metrics.json`` and
    ``training.png`` into ``out``; returns the metrics. ``None`` settings take the
    dataset's defaults (:data:`DEFAULTS`). With ``resume``, the settings come from
    ``out/checkpoint.npz`` (``epochs`` may extend the run) and training continues from
    its last epoch. ``data`` replaces loading ``dataset`` (tests pass small arrays)."""
    checkpoint_path = os.path.join(out, CHECKPOINT)
    meta = None
    if resume:
        refuse_other_engine(out, "numpy")
        weights, optimizer_state, meta = load_checkpoint(checkpoint_path)
    run = begin(dataset, out, "numpy", meta, pool=pool, gap_head=gap_head, epochs=epochs,
                batch_size=batch_size, optimizer=optimizer, lr=lr, seed=seed, data=data,
                plot=plot, head=head)
    settings, data = run.settings, run.data

    model = build_model(data.x_train.shape[1], data.spatial, data.classes,
                        pool=settings["pool"], widths=settings["widths"],
                        conv_kernel=settings["conv_kernel"], head=settings["head"],
                        seed=settings["seed"])
    opt = optim.OPTIMIZERS[settings["optimizer"]](model.parameters(), lr=settings["lr"])
    if resume:
        model.load_state_dict(weights)
        opt.load_state_dict(optimizer_state)
    loss_fn = nn.SoftmaxCrossEntropy()
    bar = _Progress(enabled=progress)
    n, batch = len(data.y_train), settings["batch_size"]
    batches = -(-n // batch)
    for epoch in range(run.start_epoch, settings["epochs"]):
        started = time.perf_counter()
        order = np.random.default_rng([settings["seed"], epoch]).permutation(n)
        seen, loss_sum, correct = 0, 0.0, 0
        model.train()
        for b in range(batches):
            chosen = order[b * batch:(b + 1) * batch]
            xb, yb = data.x_train[chosen], data.y_train[chosen]
            logits = model.forward(xb)
            loss = loss_fn.forward(logits, yb)
            model.backward(loss_fn.backward())
            opt.step()
            seen += len(yb)
            loss_sum += loss * len(yb)
            correct += int((logits.argmax(axis=1) == yb).sum())
            bar.update(epoch + 1, settings["epochs"], b + 1, batches, loss_sum / seen,
                       correct / seen)
        run.train_time += time.perf_counter() - started
        record_epoch(run, epoch, loss_sum, correct, seen,
                     *evaluate(model, data.x_test, data.y_test))
        bar.update(epoch + 1, settings["epochs"], batches, batches, loss_sum / seen,
                   correct / seen, final=True)
        _save_checkpoint(checkpoint_path, model, opt, settings, epoch + 1, run.history,
                         run.train_time)
    return finish(run, out, checkpoint_path, *evaluate(model, data.x_test, data.y_test),
                  plot=plot)


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
