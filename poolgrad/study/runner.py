"""The runs of ``poolgrad study shift``: the grid, the data, training, measuring, and
the folder that keeps finished runs so that a study stopped halfway goes on.

A run is one (dataset, downsampling, head, seed): the CNN of ``poolgrad train --engine
torch`` (:func:`poolgrad.train.torch_engine.build_model`) trained with Adam, then measured by
:mod:`poolgrad.study.shifts` on the test set. Each finished run is written atomically
to ``OUT/runs/DATASET/POOL-HEAD-seedK.json`` with the settings it was made with; a run
whose file is there is never redone, and a study whose settings differ from the ones
in the folder is refused. Runs go to ``workers`` spawned processes, each with its
share of the cores (the runs are small: one thread each beats threads fighting over
one run), or to the one GPU.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..tools import processes
from ..tools.datasets import load as load_source
from ..tools.files import write_atomically

POOLS = ("max", "avg", "lp", "strided-conv", "blur", "max-blur", "gem", "soft",
         "stochastic", "fractional", "aps", "max-aps", "lps")
CONV_PADDINGS = ("zeros", "circular")
HEADS = ("flatten", "gap", "attention")
# mnist1d: MNIST-1D as made (its generator shifts each signal circularly, by up to 48
# of 72 samples before it is resampled to 40). digits16: the 8x8 digits centred on a
# 16x16 zero canvas; digits16-translated: the same, each training example placed
# anywhere on the canvas (a fresh place every epoch) while training.
DATASETS = ("mnist1d", "digits16", "digits16-translated")

# Per-dataset networks and optimizers. MNIST-1D's widths are half poolgrad train's (64)
# and the epochs a quarter of its 60 (the digits: 20, not 30), so that the study fits its
# time (docs/shift_study.md).
NETWORKS = {
    "mnist1d": {"widths": (32, 32, 32), "conv_kernel": 5, "lr": 0.01, "epochs": 15,
                "mode": "circular"},
    "digits16": {"widths": (16, 32), "conv_kernel": 3, "lr": 0.003, "epochs": 20,
                 "mode": "zero"},
}
CANVAS = 16
SEEDS, BATCH = 3, 100
# --quick: the pipeline end to end on a sliver of the data; its numbers mean nothing.
# Its pooling inputs all have fewer than kernels.SERIAL_BELOW elements (training
# batches of 50: digits16's first is 50x16x16x16; 40 test examples: the layer check's
# padded canvases are 40x16x16x22), so it compiles no parallel kernel builds (with
# batches of 100 and 60 test examples, they took 57 of its 99 s cold)
QUICK = {"epochs": 1, "seeds": 2, "pools": ("max", "blur"), "heads": ("flatten", "gap"),
         "train_examples": 200, "test_examples": 40, "batch_size": 50}


class StudyError(ValueError):
    """Settings or an output folder the study cannot use."""


@dataclass(frozen=True)
class Plan:
    """What a study runs: every dataset x pool x head x seed, each trained ``epochs``
    epochs (None: the dataset's in :data:`NETWORKS`) on at most ``train_examples`` and
    measured on at most ``test_examples`` (None: all), in batches of ``batch_size``."""
    datasets: tuple = DATASETS
    pools: tuple = POOLS
    heads: tuple = HEADS
    seeds: int = SEEDS
    epochs: int | None = None
    train_examples: int | None = None
    test_examples: int | None = None
    batch_size: int = BATCH
    quick: bool = False
    conv_padding: str = "zeros"  # the convolutions': circular commutes with circular shifts

    def runs(self) -> list[dict]:
        """Seed by seed, so that a study cut short has every cell once before any twice."""
        return [{"dataset": d, "pool": p, "head": h, "seed": s} for s in range(self.seeds)
                for d in self.datasets for p in self.pools for h in self.heads]

    def settings(self, dataset: str) -> dict:
        """What a run of ``dataset`` is made with: a finished run's file must match it."""
        network = {k: list(v) if isinstance(v, tuple) else v
                   for k, v in NETWORKS[dataset.split("-")[0]].items()}
        if self.epochs is not None:
            network["epochs"] = self.epochs
        return {**network, "batch_size": self.batch_size, "optimizer": "adam",
                "train_examples": self.train_examples, "test_examples": self.test_examples,
                "quick": self.quick, "conv_padding": self.conv_padding}


def make_plan(*, quick=False, datasets=None, pools=None, heads=None, seeds=None,
              epochs=None, conv_padding="zeros") -> Plan:
    """A checked :class:`Plan`: the full study's, or ``--quick``'s; given choices
    replace its lists and numbers."""
    base = Plan(**{**QUICK, "quick": True}) if quick else Plan()
    chosen = {}
    for name, value, allowed in (("datasets", datasets, DATASETS), ("pools", pools, POOLS),
                                 ("heads", heads, HEADS)):
        if value is None:
            continue
        value = tuple(value)
        unknown = [v for v in value if v not in allowed]
        if unknown or not value:
            raise StudyError(f"unknown {name[:-1]} {unknown[0] if unknown else '(none)'!r}: "
                             f"choose from {', '.join(allowed)}")
        chosen[name] = tuple(dict.fromkeys(value))
    for name, value in (("seeds", seeds), ("epochs", epochs)):
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise StudyError(f"{name} must be an integer >= 1, got {value!r}")
        chosen[name] = value
    if conv_padding not in CONV_PADDINGS:
        raise StudyError(f"unknown conv padding {conv_padding!r}: choose from "
                         f"{', '.join(CONV_PADDINGS)}")
    return Plan(**{**asdict(base), **chosen, "conv_padding": conv_padding})


def run_path(out: str, run: dict) -> str:
    return os.path.join(out, "runs", run["dataset"],
                        f"{run['pool']}-{run['head']}-seed{run['seed']}.json")


def finished(out: str, plan: Plan) -> dict:
    """The runs of ``plan`` already in ``out``, by path; a StudyError when one of them
    was made with other settings (it would mix two studies)."""
    done = {}
    for run in plan.runs():
        path = run_path(out, run)
        if not os.path.exists(path):
            continue
        try:
            with open(path) as stream:
                record = json.load(stream)
            settings = record["settings"]
        except (OSError, ValueError, KeyError, TypeError):
            raise StudyError(f"{path} is not a finished run of poolgrad study shift; move it "
                             "away or give another --out") from None
        expected = plan.settings(run["dataset"])
        if settings != expected:
            changed = sorted(k for k in set(settings) | set(expected)
                             if settings.get(k) != expected.get(k))
            raise StudyError(f"{out} holds runs made with other settings ({', '.join(changed)} "
                             "differ): give the same settings to go on, --overwrite to "
                             "start afresh there, or another --out")
        done[path] = record
    return done


# ---------------------------------------------------------------------------- data


@dataclass
class ShiftData:
    """One dataset as tensors: training inputs (placed on the canvas, unshifted), the
    test inputs in their unshifted place, and how the study shifts them."""
    name: str
    x_train: object
    y_train: object
    x_test: object
    y_test: object
    translate: bool  # place each training example anywhere while training
    stride: int  # the network's total stride: 2 per stage
    mode: str  # how the data's own shifts work: zeros come in, or circular

    @property
    def reach(self) -> int:
        """How far a training example may move from its place, either way."""
        return (CANVAS - 8) // 2


_LOADED = {}  # per process: each worker loads a dataset once


def load(name: str, plan: Plan) -> ShiftData:
    import torch
    key = (name, plan.train_examples, plan.test_examples)
    if key in _LOADED:
        return _LOADED[key]
    source = load_source("mnist1d" if name == "mnist1d" else "digits")
    x_train, x_test = source.x_train, source.x_test
    if name != "mnist1d":
        x_train, x_test = _centred(x_train), _centred(x_test)
    train, test = slice(plan.train_examples), slice(plan.test_examples)
    network = NETWORKS[name.split("-")[0]]
    data = ShiftData(name, torch.from_numpy(x_train[train]), torch.from_numpy(
        source.y_train[train]), torch.from_numpy(x_test[test]), torch.from_numpy(
        source.y_test[test]), name.endswith("-translated"), 2 ** len(network["widths"]),
        network["mode"])
    _LOADED[key] = data
    return data


def _centred(images: np.ndarray) -> np.ndarray:
    """(N, 1, 8, 8) images in the middle of (N, 1, CANVAS, CANVAS) zero canvases."""
    canvas = np.zeros(images.shape[:2] + (CANVAS, CANVAS), dtype=images.dtype)
    start = (CANVAS - images.shape[-1]) // 2
    canvas[..., start:start + images.shape[-2], start:start + images.shape[-1]] = images
    return canvas


# ----------------------------------------------------------------------- one run


def run_one(run: dict, plan: Plan, device: str = "cpu") -> dict:
    """Train and measure one run; returns its record (settings, figures, history)."""
    import torch

    from ..train import torch_engine
    from . import shifts
    data = load(run["dataset"], plan)
    settings = plan.settings(run["dataset"])
    seed = run["seed"]
    torch.manual_seed(seed)
    model = torch_engine.build_model(1, tuple(data.x_train.shape[2:]), 10, pool=run["pool"],
                                     widths=settings["widths"],
                                     conv_kernel=settings["conv_kernel"], head=run["head"],
                                     seed=seed, conv_padding=settings["conv_padding"]
                                     ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings["lr"])
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    draws = torch.Generator().manual_seed(seed)
    started, losses, batch = time.perf_counter(), [], settings["batch_size"]
    model.train()
    for _ in range(settings["epochs"]):
        order, total = torch.randperm(len(y_train), generator=draws), 0.0
        for start in range(0, len(order), batch):
            chosen = order[start:start + batch].to(device)
            inputs, labels = x_train[chosen], y_train[chosen]
            if data.translate:
                offsets = torch.randint(-data.reach, data.reach + 1,
                                        (len(chosen), inputs.dim() - 2), generator=draws)
                inputs = shifts.shift(inputs, offsets.to(device), "zero")
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(chosen)
        losses.append(total / len(order))
    train_time = time.perf_counter() - started
    x_test, y_test = data.x_test.to(device), data.y_test.to(device)
    curves = {mode: shifts.shift_curve(model, x_test, y_test, range(2 * data.stride + 1),
                                       mode) for mode in shifts.MODES}
    natural = curves[data.mode]
    return {**run, "settings": settings, "device": device,
            "test_accuracy": natural["accuracy"][0],
            "consistency": shifts.consistency(model, x_test, data.stride, data.mode,
                                              seed=1000 + seed),
            "flip_1px": 1.0 - natural["agreement"][1], "mode": data.mode,
            "stride": data.stride, "curves": curves,
            "layer": shifts.layer_invariance(model, x_test[:200], range(5)),
            "circular": shifts.circular_invariance(model, x_test),
            "train_loss": losses, "train_time_s": train_time}


def _record(out: str, run: dict, plan: Plan, device: str) -> dict:
    record = run_one(run, plan, device)
    text = json.dumps(record, indent=1, allow_nan=False)
    write_atomically(run_path(out, run), lambda stream: stream.write(text.encode()))
    return record


def _start_worker(threads: int) -> None:
    import numba
    import torch
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


def run_all(out: str, plan: Plan, *, device: str = "cpu", workers: int = 1,
            progress=None) -> list[dict]:
    """Every run of ``plan``: the finished ones read from ``out``, the others trained on
    ``workers`` processes (1: in this one) and written there as they finish."""
    done = finished(out, plan)
    todo = [run for run in plan.runs() if run_path(out, run) not in done]
    report = progress or (lambda text: None)
    report(f"{len(done)} of {len(plan.runs())} runs already in {out}; {len(todo)} to go")
    cores = processes.cores()
    if workers == 1 or len(todo) <= 1:
        with processes.threads(cores if device == "cpu" else 1):
            for k, run in enumerate(todo):
                _announce(report, k, len(todo), _record(out, run, plan, device))
    else:
        _run_spawned(out, plan, todo, device, workers, max(1, cores // workers), report)
    return [_read(run_path(out, run)) for run in plan.runs()]


def _run_spawned(out, plan, todo, device, workers, threads, report) -> None:
    import multiprocessing
    with processes.spawning():  # Numba's threading layer that is safe in the workers
        pool = concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker, initargs=(threads,))
    with pool:
        futures = {pool.submit(_record, out, run, plan, device): run for run in todo}
        for k, future in enumerate(concurrent.futures.as_completed(futures)):
            try:
                record = future.result()
            except Exception as error:  # the run raised, or its worker died
                for other in futures:
                    other.cancel()
                run = futures[future]
                reason = (str(error).strip().splitlines() or [type(error).__name__])[-1]
                raise ChildProcessError(
                    f"a run failed ({run['dataset']} {run['pool']} {run['head']} seed "
                    f"{run['seed']}), so the study stopped: {reason}") from None
            _announce(report, k, len(todo), record)


def _announce(report, k: int, total: int, record: dict) -> None:
    report(f"[{k + 1}/{total}] {record['dataset']} {record['pool']} {record['head']} "
           f"seed {record['seed']}: accuracy {record['test_accuracy']:.1%}, consistency "
           f"{record['consistency']:.1%}, 1-px flips {record['flip_1px']:.1%} "
           f"({record['train_time_s']:.1f} s)")


def _read(path: str) -> dict:
    with open(path) as stream:
        return json.load(stream)
