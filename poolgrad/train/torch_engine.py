"""The torch engine of ``poolgrad train`` (``--engine torch``): the CNNs of
:mod:`poolgrad.train.numpy_engine` (same widths, kernels, downsampling, heads, datasets
and defaults) built from ``torch.nn`` layers and ``poolgrad.torch``'s pooling modules
and stepped by ``torch.optim``; with ``nproc`` > 1, data-parallel over that many
processes (``torch.distributed``: DistributedDataParallel, gloo on the CPU), launched
from here.

Batches: a DistributedSampler draws epoch ``e``'s permutation with ``seed + e`` and
deals its position ``j`` to rank ``j mod nproc``; each rank takes its next
``batch_size / nproc`` examples per step. The ranks' ``b``-th batches together are then
the ``b``-th batch of one process, which uses the same sampler with one replica. Each
rank scales its summed loss so that DDP's average of the ranks' gradients is the mean
over the global batch, leaving out the repeats the sampler pads the last batch with:
one process and ``nproc`` ranks take the same steps, up to float rounding. With
``accumulate`` K, a step runs K such batches, each loss scaled by the count of the
step's examples so that the summed gradients are their mean; the ranks synchronise in
the step's last backward alone (DDP's ``no_sync`` before it).

Only rank 0 evaluates, prints the progress bar and writes files. PyTorch is imported
only when this engine runs.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import logging
import os
import pickle
import socket
import tempfile
import time

from ..tools import processes
from . import checkpoints
from .config import TrainConfig, TrainError, require_torch, resolve_device, resolve_head
from .menu import DOWNSAMPLING, Stage, check_conv_padding, check_pool
from .run import METRICS, Progress, begin, check_folder, finish, record_epoch, writing

CHECKPOINT = checkpoints.CHECKPOINTS["torch"]

# How long a rank waits for the others at a collective. The others wait at the next
# gradient all-reduce while rank 0 evaluates and writes the checkpoint, so this must
# cover that; it also bounds how long a lost rank stalls the rest (the default is 30
# minutes). A rank that raises ends the run at once: the launcher stops the others.
COLLECTIVE_TIMEOUT_S = 120


def build_model(in_channels: int, spatial: tuple[int, ...], classes: int, *,
                pool: str = "max", widths=(16, 32), conv_kernel: int = 3,
                gap_head: bool = False, head: str | None = None, seed: int = 0,
                conv_padding: str = "zeros"):
    """:func:`poolgrad.train.numpy_engine.build_model` in PyTorch: the same stages and
    head, with He normal weights drawn from a ``torch.Generator`` seeded with ``seed``
    and zero biases (an LPS scorer's weights from it too)."""
    torch = require_torch()
    from .. import torch as pooling  # MaxPool2d and the rest: torch.nn's, on poolgrad's kernels
    nn = torch.nn
    check_pool(pool, error=TrainError)
    head = resolve_head(head, gap_head)
    ndim = len(spatial)
    if ndim not in (1, 2):
        raise TrainError(f"the torch engine trains on 1-d or 2-d inputs, got "
                         f"{ndim}-d {tuple(spatial)}")
    conv = getattr(nn, f"Conv{ndim}d")
    layers, channels = [], in_channels
    generator = torch.Generator().manual_seed(seed)
    for index, width in enumerate(widths):
        layers += [conv(channels, width, conv_kernel, padding=conv_kernel // 2,
                        padding_mode=check_conv_padding(conv_padding)), nn.ReLU(),
                   *DOWNSAMPLING[pool].torch(Stage(index, width, ndim, seed), pooling, nn)]
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
        elif isinstance(layer, pooling.LPSPool):
            layer.reset_parameters(generator)
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


def _steps(batches, accumulate: int):
    """``batches`` grouped ``accumulate`` at a time, one group per optimizer step; the
    last group takes what is left."""
    step = []
    for batch in batches:
        step.append(batch)
        if len(step) == accumulate:
            yield step
            step = []
    if step:
        yield step


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


def train(config: TrainConfig) -> dict:
    """:func:`poolgrad.train.numpy_engine.train` with PyTorch, on ``config.nproc``
    processes: writes ``checkpoint.pt``, ``metrics.json`` and ``training.png`` into
    ``config.out`` and returns the metrics. ``config.batch_size`` is the global batch;
    ``nproc`` must divide it. A resumed run may take another ``nproc`` than the
    checkpoint's. With ``nproc`` > 1 the ranks are spawned: a script that calls this
    needs the ``if __name__ == "__main__":`` guard of :mod:`multiprocessing`."""
    if config.engine != "torch":
        raise TrainError(f"the torch engine cannot run a config for --engine {config.engine}")
    device = resolve_device(config.device, config.nproc, require_torch())
    check_folder(config)
    state = None
    if config.resume:
        state = checkpoints.load_torch(os.path.join(config.out, CHECKPOINT))
    run = begin(config, state and state["meta"])
    run.settings["device"] = device  # how this run trains, as nproc: a resume may differ
    with writing(run, config):
        job = {"run": run, "config": config, "state": state, "device": device}
        if config.nproc == 1:
            with processes.threads(processes.cores()):
                return _fit(0, 1, job)
        _launch(config.nproc, job)
        with open(os.path.join(run.folder, METRICS)) as stream:  # what rank 0 wrote
            return json.load(stream)


def _fit(rank: int, nproc: int, job: dict) -> dict | None:
    """Train on this rank; rank 0 evaluates, writes the files into ``run.folder`` and
    returns the metrics."""
    torch = require_torch()
    run, config, state = job["run"], job["config"], job["state"]
    device = job.get("device", "cpu")
    settings, data = run.settings, run.data
    model = build_model(data.x_train.shape[1], data.spatial, data.classes,
                        pool=settings["pool"], widths=settings["widths"],
                        conv_kernel=settings["conv_kernel"], head=settings["head"],
                        seed=settings["seed"]).to(device)
    optimizer = make_optimizer(settings["optimizer"], model.parameters(), settings["lr"])
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    stepped = model
    if nproc > 1:  # averages the ranks' gradients during backward
        stepped = torch.nn.parallel.DistributedDataParallel(model)
    # the whole dataset on the device once: the batches are gathers from it
    x_train, y_train, x_test, y_test = (torch.from_numpy(a).to(device) for a in (
        data.x_train, data.y_train, data.x_test, data.y_test))
    n, batch = len(y_train), settings["batch_size"]
    sampler = torch.utils.data.distributed.DistributedSampler(
        range(n), num_replicas=nproc, rank=rank, shuffle=True, seed=settings["seed"])
    bar = Progress(enabled=config.progress and rank == 0)
    accumulate = settings["accumulate"]
    steps = -(-n // (batch * accumulate))
    for epoch in range(run.start_epoch, settings["epochs"]):
        started = time.perf_counter()
        totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss, correct, seen
        model.train()
        for s, step in enumerate(_steps(epoch_batches(sampler, epoch, batch), accumulate)):
            count = sum(batch_count for _, _, batch_count in step)  # the global step's
            optimizer.zero_grad(set_to_none=True)
            for k, (chosen, real, _) in enumerate(step):
                chosen, real = chosen.to(device), real.to(device)
                # DDP averages the ranks' gradients in the step's last backward alone;
                # the batches before it add up on each rank
                syncing = nproc == 1 or k == len(step) - 1
                with contextlib.nullcontext() if syncing else stepped.no_sync():
                    labels = y_train[chosen]
                    logits = stepped(x_train[chosen])
                    losses = torch.nn.functional.cross_entropy(logits, labels,
                                                               reduction="none")
                    weights = real.to(losses.dtype)
                    # DDP divides the ranks' summed gradients by nproc: the mean over
                    # the global step's examples
                    ((losses * weights).sum() * (nproc / count)).backward()
                totals += torch.stack([(losses.detach() * weights).sum().double(),
                                       ((logits.argmax(dim=1) == labels) & real).sum().double(),
                                       real.sum().double()])
            optimizer.step()
            loss_sum, correct, seen = totals.tolist()  # rank 0's share: the live estimate
            bar.update(epoch + 1, settings["epochs"], s + 1, steps, loss_sum / seen,
                       correct / seen)
        if nproc > 1:  # the epoch's numbers, once: a collective per step would cost more
            torch.distributed.all_reduce(totals)
            loss_sum, correct, seen = totals.tolist()
        run.train_time += time.perf_counter() - started
        if rank != 0:
            continue
        record_epoch(run, epoch, loss_sum, int(correct), int(seen),
                     *evaluate(model, x_test, y_test))
        bar.update(epoch + 1, settings["epochs"], steps, steps, loss_sum / seen,
                   correct / seen, final=True)
        checkpoints.save_torch(os.path.join(run.folder, CHECKPOINT), model, optimizer, run,
                               epoch + 1)
    if rank != 0:
        return None
    return finish(run, config.out, os.path.join(config.out, CHECKPOINT),
                  *evaluate(model, x_test, y_test), plot=config.plot)


def _rank_main(rank: int, nproc: int, address: str, job_path: str) -> None:
    """One launched rank: its share of the threads, the process group, training."""
    import torch.distributed as dist
    with open(job_path, "rb") as stream:
        job = pickle.load(stream)
    with processes.threads(max(1, processes.cores() // nproc)):
        dist.init_process_group("gloo", init_method=address, rank=rank, world_size=nproc,
                                timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        try:
            _fit(rank, nproc, job)
            # Nothing may hold the process group when it goes: DDP's reducer and any
            # work it keeps are freed now, not at interpreter exit (where gloo's threads
            # would meet a finalizing interpreter), and no rank tears down while another
            # still talks to it (rank 0 evaluates and writes after the last collective).
            gc.collect()
            dist.barrier()
        finally:
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
        with processes.spawning():  # Numba's threading layer that is safe in the ranks
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
