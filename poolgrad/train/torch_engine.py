"""``poolgrad train --engine torch``: the CNNs of :mod:`poolgrad.train` (same widths,
kernels, downsampling, heads, datasets and defaults) built from ``torch.nn`` layers and
``poolgrad.torch``'s pooling modules and stepped by ``torch.optim``; with ``nproc`` > 1,
data-parallel over that many processes (``torch.distributed``: DistributedDataParallel,
gloo on the CPU), launched from here.

Batches: a DistributedSampler draws epoch ``e``'s permutation with ``seed + e`` and
deals its position ``j`` to rank ``j mod nproc``; each rank takes its next
``batch_size / nproc`` examples per step. The ranks' ``b``-th batches together are then
the ``b``-th batch of one process, which uses the same sampler with one replica. Each
rank scales its summed loss so that DDP's average of the ranks' gradients is the mean
over the global batch, leaving out the repeats the sampler pads the last batch with:
one process and ``nproc`` ranks take the same steps, up to float rounding.

Only rank 0 evaluates, prints the progress bar and writes files. PyTorch is imported
only when this engine runs.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import pickle
import socket
import tempfile
import time

from ..tools.datasets import Dataset
from ..tools.files import write_atomically
from . import numpy_engine as shared  # what both engines share

CHECKPOINT = shared.CHECKPOINTS["torch"]

# How long a rank waits for the others at a collective. The others wait at the next
# gradient all-reduce while rank 0 evaluates and writes the checkpoint, so this must
# cover that; it also bounds how long a lost rank stalls the rest (the default is 30
# minutes). A rank that raises ends the run at once: the launcher stops the others.
COLLECTIVE_TIMEOUT_S = 120

# Numba's threading layer in the launched ranks. Without TBB, Numba would pick OpenMP:
# a second OpenMP runtime (the system's libgomp) beside the one PyTorch ships, two
# thread pools fighting over each rank's share of the cores. "workqueue" is Numba's own
# pool; spawned ranks start as fresh interpreters, so none inherits a pool's state from
# the parent; and its one limit, no parallel kernels launched from two threads at once,
# holds: each rank calls the kernels from its main thread (autograd runs CPU backward
# passes on the calling thread; gloo's threads only move gradients).
RANK_THREADING_LAYER = "workqueue"


def require_torch():
    """The ``torch`` module, or a TrainError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise shared.TrainError('--engine torch needs PyTorch: pip install -e ".[torch]" '
                                "(or pip install torch)") from None
    return torch


def build_model(in_channels: int, spatial: tuple[int, ...], classes: int, *,
                pool: str = "max", widths=(16, 32), conv_kernel: int = 3,
                gap_head: bool = False, head: str | None = None, seed: int = 0):
    """:func:`poolgrad.train.build_model` in PyTorch: the same stages and head, with He
    normal weights drawn from a ``torch.Generator`` seeded with ``seed`` and zero
    biases."""
    from .. import nn as numpy_nn
    torch = require_torch()
    from .. import torch as pooling  # MaxPool2d and the rest: torch.nn's, on poolgrad's kernels
    nn = torch.nn
    numpy_nn.check_pool(pool, error=shared.TrainError)
    head = shared.resolve_head(head, gap_head)
    ndim = len(spatial)
    if ndim not in (1, 2):
        raise shared.TrainError(f"the torch engine trains on 1-d or 2-d inputs, got "
                                f"{ndim}-d {tuple(spatial)}")
    conv = getattr(nn, f"Conv{ndim}d")
    downsample = {
        "max": lambda stage: [getattr(pooling, f"MaxPool{ndim}d")(2)],
        "avg": lambda stage: [getattr(pooling, f"AvgPool{ndim}d")(2)],
        "lp": lambda stage: [getattr(pooling, f"LPPool{ndim}d")(2, 2)],
        "blur": lambda stage: [pooling.BlurPool(2)],
        "max-blur": lambda stage: [pooling.MaxBlurPool(2, 2)],
        "avg-blur": lambda stage: [pooling.AvgBlurPool(2, 2)],
        "soft": lambda stage: [pooling.SoftPool(2)],
        "stochastic": lambda stage: [pooling.StochasticPool(2, seed=seed + stage)],
        # 3-wide windows, as PyTorch's example: 2-wide ones at a ratio of 1/2 fall
        # exactly where 2x2 max pooling's do (alpha = 2 leaves nothing to chance)
        "fractional": lambda stage: [pooling.FractionalMaxPool(3, output_ratio=0.5,
                                                               seed=seed + stage)],
        "gem": lambda stage: [pooling.GeMPool(3.0, kernel_size=2)],
        "mixed": lambda stage: [pooling.MixedPool(2)],
        "gated": lambda stage: [pooling.GatedPool(2, ndim=ndim)],
        # a learned 2x downsampling in place of pooling
        "strided-conv": lambda stage: [conv(widths[stage], widths[stage], 2, stride=2),
                                       nn.ReLU()],
    }[pool]
    layers, channels = [], in_channels
    generator = torch.Generator().manual_seed(seed)
    for stage, width in enumerate(widths):
        layers += [conv(channels, width, conv_kernel, padding=conv_kernel // 2), nn.ReLU(),
                   *downsample(stage)]
        channels = width
    if head == "gap":
        layers.append(getattr(pooling, f"AdaptiveAvgPool{ndim}d")(1))
    elif head == "attention":
        layers.append(pooling.AttentionPool(channels, generator=generator))
    layers.append(nn.Flatten())
    with torch.no_grad():
        features = nn.Sequential(*layers)(torch.zeros((1, in_channels, *spatial))).shape[1]
    model = nn.Sequential(*layers, nn.Linear(features, classes))
    for layer in model:
        if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu", generator=generator)
            nn.init.zeros_(layer.bias)
    return model


def make_optimizer(name: str, parameters, lr: float):
    """torch.optim's optimizer of :data:`poolgrad.optim.OPTIMIZERS`'s ``name``; at their
    defaults both libraries have the same update formulas and constants."""
    torch = require_torch()
    optimizers = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad,
                  "rmsprop": torch.optim.RMSprop, "adam": torch.optim.Adam}
    return optimizers[name](parameters, lr=lr)


def epoch_batches(sampler, epoch: int, batch_size: int):
    """This rank's batches of epoch ``epoch`` (0-based): ``(indices, real, count)`` per
    step, ``indices`` its ``batch_size / num_replicas`` examples, ``real`` whether each is
    one (False for the sampler's padding: repeats that give every rank an equal share)
    and ``count`` the real examples in the step's global batch."""
    torch = require_torch()
    sampler.set_epoch(epoch)
    indices = torch.tensor(list(sampler), dtype=torch.int64)
    n, ranks = len(sampler.dataset), sampler.num_replicas
    share = batch_size // ranks
    # Rank r holds the positions r, r + ranks, r + 2 ranks, ... of the epoch's permutation
    # (padded to a multiple of ranks), so its b-th batch covers the positions b * batch_size
    # to (b + 1) * batch_size - 1 that are r mod ranks: the global b-th batch, dealt out.
    positions = sampler.rank + ranks * torch.arange(len(indices))
    for start in range(0, len(indices), share):
        batch = slice(start, start + share)
        count = min(batch_size, n - start * ranks)
        yield indices[batch], positions[batch] < n, count


def evaluate(model, x, y, batch: int = 500) -> tuple[float, float]:
    """(mean loss, accuracy) of ``model`` in evaluation mode; its mode is restored."""
    torch = require_torch()
    was_training = model.training
    model.eval()
    total_loss, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(y), batch):
            logits = model(x[start:start + batch])
            labels = y[start:start + batch]
            total_loss += float(torch.nn.functional.cross_entropy(logits, labels,
                                                                  reduction="sum"))
            correct += int((logits.argmax(dim=1) == labels).sum())
    model.train(was_training)
    return total_loss / len(y), correct / len(y)


def save_checkpoint(path: str, model, optimizer, run: shared.Run, epoch: int) -> None:
    torch = require_torch()
    state = {"engine": "torch", "model": model.state_dict(),
             "optimizer": optimizer.state_dict(),
             "meta": {"settings": run.settings, "epoch": epoch, "history": run.history,
                      "train_time_s": run.train_time}}
    write_atomically(path, lambda stream: torch.save(state, stream))


def load_checkpoint(path: str) -> dict:
    """``{"model", "optimizer", "meta"}`` of a checkpoint written by :func:`train`."""
    torch = require_torch()
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("engine") != "torch":
            raise ValueError("it is not a torch engine checkpoint")
        shared.check_meta(state["meta"])
    except FileNotFoundError:
        raise shared.TrainError(f"no checkpoint to resume from: {path} does not exist") from None
    except (OSError, EOFError, RuntimeError, ValueError, KeyError, TypeError,
            pickle.UnpicklingError) as error:  # what torch.load raises on a bad file
        reason = (str(error).strip() or type(error).__name__).splitlines()[0]
        raise shared.TrainError(f"{path} is not a poolgrad checkpoint ({reason})") from None
    return state


def train(dataset: str = "digits", out: str = "runs/digits", *, pool: str = "max",
          gap_head: bool = False, epochs: int | None = None, batch_size: int = 100,
          optimizer: str | None = None, lr: float | None = None, seed: int = 0,
          resume: bool = False, progress: bool = True, data: Dataset | None = None,
          plot: bool = True, nproc: int = 1, head: str | None = None) -> dict:
    """:func:`poolgrad.train.train` with PyTorch, on ``nproc`` processes: writes
    ``checkpoint.pt``, ``metrics.json`` and ``training.png`` into ``out`` and returns
    the metrics. ``batch_size`` is the global batch; ``nproc`` must divide it. With
    ``resume``, ``nproc`` may differ from the checkpoint's. With ``nproc`` > 1 the ranks
    are spawned: a script that calls this needs the ``if __name__ == "__main__":`` guard
    of :mod:`multiprocessing`."""
    shared.check_nproc(nproc, None if resume else batch_size, "torch")
    require_torch()
    checkpoint_path = os.path.join(out, CHECKPOINT)
    state = None
    if resume:
        shared.refuse_other_engine(out, "torch")
        state = load_checkpoint(checkpoint_path)
    run = shared.begin(dataset, out, "torch", state and state["meta"], pool=pool,
                       gap_head=gap_head, epochs=epochs, batch_size=batch_size,
                       optimizer=optimizer, lr=lr, seed=seed, data=data, plot=plot,
                       nproc=nproc, head=head)
    job = {"run": run, "out": out, "state": state, "progress": progress, "plot": plot}
    if nproc == 1:
        with _threads(_cores()):
            return _fit(0, 1, job)
    _launch(nproc, job)
    with open(os.path.join(out, shared.METRICS)) as stream:  # what rank 0 wrote
        return json.load(stream)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@contextlib.contextmanager
def _threads(count: int):
    """Numba and PyTorch each use ``count`` threads inside the block."""
    import numba
    torch = require_torch()
    previous = numba.get_num_threads(), torch.get_num_threads()
    numba.set_num_threads(min(count, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(count)
    try:
        yield
    finally:
        numba.set_num_threads(previous[0])
        torch.set_num_threads(previous[1])


def _fit(rank: int, nproc: int, job: dict) -> dict | None:
    """Train on this rank; rank 0 evaluates, writes the files and returns the metrics."""
    torch = require_torch()
    run, out, state = job["run"], job["out"], job["state"]
    settings, data = run.settings, run.data
    model = build_model(data.x_train.shape[1], data.spatial, data.classes,
                        pool=settings["pool"], widths=settings["widths"],
                        conv_kernel=settings["conv_kernel"], head=settings["head"],
                        seed=settings["seed"])
    optimizer = make_optimizer(settings["optimizer"], model.parameters(), settings["lr"])
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    stepped = model
    if nproc > 1:  # averages the ranks' gradients during backward
        stepped = torch.nn.parallel.DistributedDataParallel(model)
    x_train, y_train = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    x_test, y_test = torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)
    n, batch = len(y_train), settings["batch_size"]
    sampler = torch.utils.data.distributed.DistributedSampler(
        range(n), num_replicas=nproc, rank=rank, shuffle=True, seed=settings["seed"])
    bar = shared._Progress(enabled=job["progress"] and rank == 0)
    batches = -(-n // batch)
    checkpoint_path = os.path.join(out, CHECKPOINT)
    for epoch in range(run.start_epoch, settings["epochs"]):
        started = time.perf_counter()
        totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, examples
        model.train()
        for b, (chosen, real, count) in enumerate(epoch_batches(sampler, epoch, batch)):
            labels = y_train[chosen]
            logits = stepped(x_train[chosen])
            losses = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
            weights = real.to(losses.dtype)
            # DDP divides the ranks' summed gradients by nproc: the global batch's mean
            loss = (losses * weights).sum() * (nproc / count)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step = torch.stack([(losses.detach() * weights).sum().double(),
                                ((logits.argmax(dim=1) == labels) & real).sum().double(),
                                real.sum().double()])
            totals += step
            loss_sum, correct, seen = totals.tolist()  # rank 0's share: the live estimate
            bar.update(epoch + 1, settings["epochs"], b + 1, batches, loss_sum / seen,
                       correct / seen)
        if nproc > 1:  # the epoch's numbers, once: a collective per step would cost more
            torch.distributed.all_reduce(totals)
            loss_sum, correct, seen = totals.tolist()
        run.train_time += time.perf_counter() - started
        if rank != 0:
            continue
        shared.record_epoch(run, epoch, loss_sum, int(correct), int(seen),
                            *evaluate(model, x_test, y_test))
        bar.update(epoch + 1, settings["epochs"], batches, batches, loss_sum / seen,
                   correct / seen, final=True)
        save_checkpoint(checkpoint_path, model, optimizer, run, epoch + 1)
    if rank != 0:
        return None
    return shared.finish(run, out, checkpoint_path, *evaluate(model, x_test, y_test),
                         plot=job["plot"])


def _rank_main(rank: int, nproc: int, address: str, job_path: str) -> None:
    """One launched rank: its share of the threads, the process group, training."""
    import torch.distributed as dist
    with open(job_path, "rb") as stream:
        job = pickle.load(stream)
    with _threads(max(1, _cores() // nproc)):
        dist.init_process_group("gloo", init_method=address, rank=rank, world_size=nproc,
                                timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        try:
            _fit(rank, nproc, job)
        finally:
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def _environment(**values):
    """``os.environ`` with ``values`` inside the block (what spawned processes inherit)."""
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _launch(nproc: int, job: dict, rank_main=_rank_main) -> None:
    """Run ``rank_main(rank, nproc, address, job_path)`` on ``nproc`` spawned processes,
    ``job`` pickled at ``job_path``; when one fails, stop the others and raise a
    ChildProcessError saying which and why, in one line."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="poolgrad-ranks-") as folder:
        # The job (the data with it) goes through a file, not the spawn pipe: a process
        # that died while starting would leave the parent blocked forever on a write to a
        # pipe it holds both ends of, once the job outgrows the pipe's buffer.
        job_path = os.path.join(folder, "job.pickle")
        with open(job_path, "wb") as stream:
            pickle.dump(job, stream, protocol=pickle.HIGHEST_PROTOCOL)
        address = f"tcp://127.0.0.1:{_free_port()}"
        # A layer the user chose stays; otherwise the one that is safe in the ranks.
        layer = os.environ.get("NUMBA_THREADING_LAYER") or RANK_THREADING_LAYER
        with _environment(NUMBA_THREADING_LAYER=layer):
            ranks = mp.start_processes(rank_main, args=(nproc, address, job_path),
                                       nprocs=nproc, join=False, start_method="spawn")
        # join() logs a warning per rank it stops; the one-line error says what happened
        spawn_log = logging.getLogger("torch.multiprocessing.spawn")
        level = spawn_log.level
        spawn_log.setLevel(logging.ERROR)
        try:
            while not ranks.join():
                pass
        except mp.ProcessRaisedException as error:
            last_line = str(error).strip().splitlines()[-1]
            raise ChildProcessError(f"rank {error.error_index} of {nproc} failed, so the run "
                                    f"stopped: {last_line}") from None
        except mp.ProcessExitedException as error:
            raise ChildProcessError(f"rank {error.error_index} of {nproc} died, so the run "
                                    f"stopped: {error}") from None
        finally:
            spawn_log.setLevel(level)
