"""The NumPy engine of ``poolgrad train``: mini-batch training of a small CNN built
from :mod:`poolgrad.nn`'s layers and stepped by :mod:`poolgrad.optim`.

One training step is the textbook one. The forward pass runs on every example of the
batch and each pooling layer keeps each example's own argmax; the backward pass routes
each example's gradient through it; the weight gradients (of the convolutions and the
linear layer) are averaged over the batch by the mean loss; then the optimizer steps.
With ``accumulate`` K (Caffe's ``iter_size``), a step runs K batches one after another,
each loss gradient divided by the step's count of examples, and sums their weight
gradients before the optimizer steps: the mean over all K batches' examples, as one
batch K times as large would give, holding one batch's activations at a time. An
epoch's last step takes the batches that are left, as its last big batch would.

Runs are reproducible: the weights start from ``seed`` and epoch ``e`` shuffles with
``numpy.random.default_rng([seed, e])``, so a run resumed from its checkpoint reaches
the same weights as an uninterrupted one.
"""

from __future__ import annotations

import os
import time

import numpy as np

from .. import nn, optim
from . import checkpoints
from .config import TrainConfig, TrainError, resolve_head
from .menu import DOWNSAMPLING, Stage, check_conv_padding, check_pool
from .run import Progress, Run, begin, check_folder, finish, record_epoch, writing

CHECKPOINT = checkpoints.CHECKPOINTS["numpy"]


def build_model(in_channels: int, spatial: tuple[int, ...], classes: int, *, pool: str = "max",
                widths=(16, 32), conv_kernel: int = 3, gap_head: bool = False,
                head: str | None = None, seed: int = 0, dtype=np.float32,
                conv_padding: str = "zeros") -> nn.Sequential:
    """Stages of conv -> ReLU -> downsample (2x, by ``pool``: one of
    :data:`poolgrad.train.menu.POOLS`), then a linear head on the flattened features
    (``head="flatten"``), on their global average (``"gap"``, or ``gap_head``) or on an
    attention pooling's readout (``"attention"``: one query, one head). Every weight is
    drawn from one generator seeded with ``seed``, layer after layer. The convolutions
    pad with ``conv_padding``: ``"zeros"`` or ``"circular"`` (with which they commute
    with circular shifts)."""
    check_pool(pool, error=TrainError)
    head = resolve_head(head, gap_head)
    rng = np.random.default_rng(seed)
    ndim = len(spatial)
    layers: list[nn.Layer] = []
    channels = in_channels
    for index, width in enumerate(widths):
        layers += [nn.Conv(channels, width, conv_kernel, padding=conv_kernel // 2, ndim=ndim,
                           padding_mode=check_conv_padding(conv_padding), rng=rng,
                           dtype=dtype), nn.ReLU()]
        layers += DOWNSAMPLING[pool].numpy(Stage(index, width, ndim, seed, rng, dtype))
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


def train(config: TrainConfig) -> dict:
    """Train as ``config`` says (its ``engine`` aside), evaluate and write
    ``checkpoint.npz``, ``metrics.json`` and ``training.png`` into ``config.out``;
    returns the metrics. With ``config.resume``, the settings come from
    ``checkpoint.npz`` and training continues from its last epoch."""
    if config.engine != "numpy":
        raise TrainError(f"the numpy engine cannot run a config for --engine {config.engine}")
    check_folder(config)
    saved = None
    if config.resume:
        saved = checkpoints.load_numpy(os.path.join(config.out, CHECKPOINT))
    run = begin(config, saved and saved[2])
    with writing(run, config):
        return _fit(run, config, saved)


def _fit(run: Run, config: TrainConfig, saved) -> dict:
    """Train ``run`` from its start epoch (``saved``: the checkpoint's weights and
    optimizer state, or None), writing its files into ``run.folder``."""
    settings, data = run.settings, run.data
    model = build_model(data.x_train.shape[1], data.spatial, data.classes,
                        pool=settings["pool"], widths=settings["widths"],
                        conv_kernel=settings["conv_kernel"], head=settings["head"],
                        seed=settings["seed"])
    opt = optim.OPTIMIZERS[settings["optimizer"]](model.parameters(), lr=settings["lr"])
    if saved is not None:
        model.load_state_dict(saved[0])
        opt.load_state_dict(saved[1])
    bar = Progress(enabled=config.progress)
    n, batch, accumulate = len(data.y_train), settings["batch_size"], settings["accumulate"]
    steps = -(-n // (batch * accumulate))
    for epoch in range(run.start_epoch, settings["epochs"]):
        started = time.perf_counter()
        order = np.random.default_rng([settings["seed"], epoch]).permutation(n)
        loss_sum, correct, seen = train_epoch(
            model, opt, data.x_train, data.y_train, order, batch, accumulate,
            on_step=lambda done, totals, e=epoch: bar.update(
                e + 1, settings["epochs"], done, steps, totals[0] / totals[2],
                totals[1] / totals[2]))
        run.train_time += time.perf_counter() - started
        record_epoch(run, epoch, loss_sum, correct, seen,
                     *evaluate(model, data.x_test, data.y_test))
        bar.update(epoch + 1, settings["epochs"], steps, steps, loss_sum / seen,
                   correct / seen, final=True)
        checkpoints.save_numpy(os.path.join(run.folder, CHECKPOINT), model, opt, run,
                               epoch + 1)
    return finish(run, config.out, os.path.join(config.out, CHECKPOINT),
                  *evaluate(model, data.x_test, data.y_test), plot=config.plot)


def train_epoch(model: nn.Sequential, opt, x: np.ndarray, y: np.ndarray, order: np.ndarray,
                batch: int, accumulate: int = 1, on_step=None) -> tuple[float, int, int]:
    """One epoch of ``model`` on ``x[order]`` (training mode), stepping ``opt`` once per
    ``accumulate`` batches of ``batch``: each loss gradient is divided by the step's
    count of examples, so the step's summed weight gradients are their mean. Returns
    ``(loss_sum, correct, seen)`` over the epoch; ``on_step(steps_done, those three)``
    after each step."""
    loss_fn = nn.SoftmaxCrossEntropy()
    step_size = batch * accumulate
    loss_sum, correct, seen = 0.0, 0, 0
    model.train()
    for s in range(-(-len(order) // step_size)):
        chosen = order[s * step_size:(s + 1) * step_size]
        accumulated = None
        for start in range(0, len(chosen), batch):
            micro = chosen[start:start + batch]
            xb, yb = x[micro], y[micro]
            logits = model.forward(xb)
            loss = loss_fn.forward(logits, yb)
            # each example's loss gradient over the step's examples, as one batch of the
            # step's size would have it: the weight gradients add up to its mean
            model.backward(loss_fn.backward(count=len(chosen)))
            if len(chosen) > batch:  # a step of several batches: keep their sum
                accumulated = _accumulate(model, accumulated)
            seen += len(yb)
            loss_sum += loss * len(yb)
            correct += int((logits.argmax(axis=1) == yb).sum())
        if accumulated is not None:
            _restore(model, accumulated)
        opt.step()
        if on_step is not None:
            on_step(s + 1, (loss_sum, correct, seen))
    return loss_sum, correct, seen


def _accumulate(model: nn.Sequential, total: list | None) -> list:
    """The weight gradients of ``model``'s last backward added to ``total`` (None: the
    first batch of a step, whose gradients start it)."""
    grads = [layer.grads[name] for layer, name in model.parameters()]
    if total is None:
        return [grad.copy() for grad in grads]
    for running, grad in zip(total, grads, strict=True):
        running += grad
    return total


def _restore(model: nn.Sequential, total: list) -> None:
    """Put a step's summed gradients where the optimizer reads them."""
    for (layer, name), grad in zip(model.parameters(), total, strict=True):
        layer.grads[name] = grad
