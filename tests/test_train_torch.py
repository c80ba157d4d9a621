"""``poolgrad train --engine torch``, ``--nproc`` and ``--accumulate``: two ranks that
accumulate two batches per step take the steps of one process with batches twice as
large, a two-rank run resumes exactly, a failing rank ends the run with one line, and
bad input gives one line and exit 2 before any work.

Spawned runs cost seconds each (every rank imports PyTorch), so the module spawns three:
a two-rank run, its resumption and a crash, on 61 MNIST-shaped images in batches of 8 (an
odd count, so the last batch carries the sampler's padding)."""

import contextlib
import importlib.util
import json
import os
import re
import sys
import time

import numpy as np
import pytest
from test_train import toy_data, write_mnist

from poolgrad import cli, train
from poolgrad.train import TrainConfig, TrainError, checkpoints, config, numpy_engine

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="needs PyTorch")
TRAIN_EXAMPLES, BATCH = 61, 8


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data") / "mnist"
    write_mnist(folder, n_train=TRAIN_EXAMPLES, n_test=10)
    return f"idx:{folder}"


def poolgrad_train(*args):
    return cli.main(["train", "--engine", "torch", "--quiet", *args])


@pytest.fixture(scope="module")
def runs(mnist, tmp_path_factory):
    """Checkpoints of runs on the same data, step and seed: "two-1" after epoch 1 on two
    ranks, each step two global batches of ``BATCH / 2`` (``--accumulate 2``),
    "two-resumed" after that run resumed on two ranks for epoch 2 (the command line's),
    "one-1" and "one-2" after 1 and 2 epochs in one process, in batches of ``BATCH``."""
    import shutil

    from poolgrad.train import torch_engine
    root = tmp_path_factory.mktemp("runs")
    two = str(root / "two")
    assert poolgrad_train("--dataset", mnist, "--nproc", "2", "--epochs", "1",
                          "--batch-size", str(BATCH // 2), "--accumulate", "2",
                          "--out", two) == 0
    shutil.copy(os.path.join(two, "checkpoint.pt"), root / "two-1.pt")
    assert poolgrad_train("--dataset", mnist, "--nproc", "2", "--epochs", "2", "--resume",
                          "--out", two) == 0
    paths = {"two-1": str(root / "two-1.pt"), "two-resumed": os.path.join(two, "checkpoint.pt"),
             "two": two}
    for epochs in (1, 2):
        one = str(root / f"one-{epochs}")
        # on the CPU, as the ranks: a GPU's convolutions would round otherwise
        torch_engine.train(TrainConfig(mnist, one, engine="torch", epochs=epochs,
                                       batch_size=BATCH, progress=False, plot=False,
                                       device="cpu"))
        paths[f"one-{epochs}"] = os.path.join(one, "checkpoint.pt")
    return paths


def checkpoint(path):
    return checkpoints.load_torch(path)


def assert_same_weights(a, b, **tolerance):
    for part in ("model", "optimizer"):
        flat_a, flat_b = flatten(a[part]), flatten(b[part])
        assert flat_a.keys() == flat_b.keys()
        for key, value in flat_a.items():
            np.testing.assert_allclose(flat_b[key], value, err_msg=f"{part} {key}",
                                       **tolerance)


def flatten(state, prefix=""):
    """Every tensor and number of a (nested) state dict, by its path."""
    if isinstance(state, dict):
        return {k: v for key, value in state.items()
                for k, v in flatten(value, f"{prefix}{key}/").items()}
    if isinstance(state, (list, tuple)):
        return flatten(dict(enumerate(state)), prefix)
    if hasattr(state, "numpy"):
        return {prefix: state.numpy()}
    return {prefix: state} if isinstance(state, (int, float)) else {}


@needs_torch
def test_two_ranks_accumulating_take_the_steps_of_one_process(runs):
    """Each step of the two ranks sums two global batches of 4 (each rank's share 2),
    synchronising once: the steps of one process in batches of 8, the last (5 examples,
    one of them the sampler's padding on a rank) included."""
    two, one = checkpoint(runs["two-1"]), checkpoint(runs["one-1"])
    assert_same_weights(two, one, rtol=1e-4, atol=1e-6)
    assert (two["meta"]["settings"]["nproc"], one["meta"]["settings"]["nproc"]) == (2, 1)
    assert (two["meta"]["settings"]["batch_size"], two["meta"]["settings"]["accumulate"],
            one["meta"]["settings"]["accumulate"]) == (BATCH // 2, 2, 1)
    assert two["optimizer"]["state"][0]["step"] == one["optimizer"]["state"][0]["step"] == 8
    [two_epoch], [one_epoch] = two["meta"]["history"], one["meta"]["history"]
    assert two_epoch["train_accuracy"] == one_epoch["train_accuracy"]  # every example once
    assert two_epoch["train_loss"] == pytest.approx(one_epoch["train_loss"], rel=1e-5)
    assert two["model"]["0.weight"].shape == (16, 1, 5, 5)  # idx: 5x5 kernels, widths 16, 32


@needs_torch
def test_a_resumed_two_rank_run_equals_an_uninterrupted_one(runs):
    """Epoch 2 resumed on two ranks from their epoch-1 checkpoint reaches the weights
    and optimizer state of two uninterrupted epochs (in one process, which takes the
    same steps)."""
    resumed, straight = checkpoint(runs["two-resumed"]), checkpoint(runs["one-2"])
    assert_same_weights(resumed, straight, rtol=1e-4, atol=1e-6)
    assert resumed["meta"]["epoch"] == 2 and resumed["optimizer"]["state"][0]["step"] == 16
    assert resumed["meta"]["history"][0] == checkpoint(runs["two-1"])["meta"]["history"][0]
    files = set(os.listdir(runs["two"]))
    assert files == {"checkpoint.pt", "metrics.json", "training.png"}  # no temporaries
    with open(os.path.join(runs["two"], "metrics.json")) as stream:
        metrics = json.load(stream)
    assert metrics["settings"]["engine"] == "torch" and metrics["settings"]["nproc"] == 2
    assert metrics["epochs_run"] == 2 and metrics["train_examples"] == TRAIN_EXAMPLES


@needs_torch
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rmsprop", "adam"])
def test_accumulating_four_batches_trains_like_one_four_times_as_large(tmp_path, optimizer):
    """The torch engine's --accumulate, in one process: 4 batches of 25 per step reach
    the weights of batches of 100 over 230 examples (a last step of 25 + 5)."""
    from poolgrad.train import torch_engine
    options = {"engine": "torch", "epochs": 1, "optimizer": optimizer, "lr": 0.01,
               "progress": False, "plot": False, "data": toy_data(n_train=230)}
    for name, batch, accumulate in (("big", 100, 1), ("accumulated", 25, 4)):
        torch_engine.train(TrainConfig("digits", str(tmp_path / name), batch_size=batch,
                                       accumulate=accumulate, **options))
    big, accumulated = (checkpoint(str(tmp_path / name / "checkpoint.pt"))
                        for name in ("big", "accumulated"))
    assert_same_weights(accumulated, big, rtol=1e-5, atol=1e-7)
    if optimizer != "sgd":  # SGD without momentum keeps no state
        assert int(big["optimizer"]["state"][0]["step"]) == 3
        assert int(accumulated["optimizer"]["state"][0]["step"]) == 3
    assert accumulated["meta"]["history"][0]["train_loss"] == pytest.approx(
        big["meta"]["history"][0]["train_loss"], rel=1e-5)


@needs_torch
def test_ranks_synchronise_once_per_accumulated_step(tmp_path, monkeypatch):
    """Rank 0 of two, its DDP replaced by a wrapper that counts the batches it runs
    inside ``no_sync`` (their gradients only add up) and outside it (the backward that
    averages the ranks' gradients): 40 examples, global batches of 4 dealt 2 per rank,
    3 per step, so 10 batches in 4 steps, the last of one batch."""
    import torch

    from poolgrad.train import torch_engine
    from poolgrad.train.run import Run
    counts = {"synced": 0, "accumulated": 0, "inside": False}

    class CountingDDP(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, x):
            counts["accumulated" if counts["inside"] else "synced"] += 1
            return self.module(x)

        @contextlib.contextmanager
        def no_sync(self):
            counts["inside"] = True
            try:
                yield
            finally:
                counts["inside"] = False

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", CountingDDP)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor: None)
    job_config = TrainConfig("digits", str(tmp_path), engine="torch", epochs=1, batch_size=4,
                             accumulate=3, nproc=2, progress=False, plot=False,
                             data=toy_data(n_train=40, n_test=10))
    job = {"run": Run(job_config.settings(), job_config.data, str(tmp_path)),
           "config": job_config, "state": None}
    torch_engine._fit(0, 2, job)
    assert (counts["synced"], counts["accumulated"]) == (4, 6)
    state = checkpoint(str(tmp_path / "checkpoint.pt"))
    assert int(state["optimizer"]["state"][0]["step"]) == 4


@needs_torch
def test_ranks_batches_together_are_the_one_process_batches():
    import torch

    from poolgrad.train import torch_engine
    n, batch = TRAIN_EXAMPLES, BATCH

    def batches(ranks, rank):
        sampler = torch.utils.data.distributed.DistributedSampler(
            range(n), num_replicas=ranks, rank=rank, shuffle=True, seed=3)
        return list(torch_engine.epoch_batches(sampler, 5, batch))

    single = batches(1, 0)
    assert [count for _, _, count in single] == [8] * 7 + [5]
    for ranks in (2, 4):
        shares = [batches(ranks, rank) for rank in range(ranks)]
        for b, (indices, real, count) in enumerate(single):
            assert real.all() and count == len(indices)
            dealt = [(i, r) for share in shares for i, r in zip(*share[b][:2], strict=True)]
            assert sorted(int(i) for i, r in dealt if r) == sorted(indices.tolist())
            assert all(share[b][2] == count for share in shares)


@needs_torch
@pytest.mark.parametrize("pool", train.POOLS)
@pytest.mark.parametrize("spatial", [(8, 8), (40,)])
def test_the_torch_models_have_the_numpy_models_layers(pool, spatial):
    import torch

    from poolgrad.train import torch_engine
    for head in ("flatten", "gap", "attention"):
        options = {"pool": pool, "widths": (4, 8), "conv_kernel": 3, "head": head}
        numpy_model = numpy_engine.build_model(1, spatial, 3, **options)
        torch_model = torch_engine.build_model(1, spatial, 3, **options)
        assert ({re.sub(r"\.W$", ".weight", re.sub(r"\.b$", ".bias", key)): value.shape
                 for key, value in numpy_model.state_dict().items()}
                == {key: tuple(value.shape) for key, value in torch_model.state_dict().items()})
        x = torch.rand((5, 1, *spatial))
        torch.nn.functional.cross_entropy(torch_model(x), torch.tensor([0, 1, 2, 0, 1])
                                          ).backward()
        assert all(torch.isfinite(p.grad).all() for p in torch_model.parameters())


@needs_torch
def test_a_failing_rank_ends_the_run_with_one_line(mnist, tmp_path):
    """Rank 0 cannot write its checkpoint after epoch 1 while rank 1 waits for it at the
    next gradient all-reduce: the launcher must stop rank 1, not wait for it."""
    from poolgrad.tools import datasets
    from poolgrad.train import torch_engine
    from poolgrad.train.run import Run
    (tmp_path / "a-file").write_text("a file where the output folder should be")
    job_config = TrainConfig(mnist, str(tmp_path / "a-file" / "run"), engine="torch",
                             epochs=3, batch_size=BATCH, nproc=2, progress=False, plot=False)
    job = {"run": Run(job_config.settings(), datasets.load(mnist), job_config.out),
           "config": job_config, "state": None}
    started = time.perf_counter()
    with pytest.raises(ChildProcessError, match=r"^rank 0 of 2 failed, so the run stopped: "
                                                r"NotADirectoryError: .*checkpoint\.pt"):
        torch_engine._launch(2, job)
    assert time.perf_counter() - started < torch_engine.COLLECTIVE_TIMEOUT_S


def test_the_command_exits_1_with_one_line_when_a_rank_fails(monkeypatch, capsys):
    from poolgrad.train import torch_engine

    def failing_run(*args, **kwargs):
        raise ChildProcessError("rank 1 of 2 failed, so the run stopped: MemoryError")

    monkeypatch.setattr(torch_engine, "train", failing_run)
    assert poolgrad_train("--nproc", "2") == 1
    assert last_error_line(capsys) == ("poolgrad train: error: rank 1 of 2 failed, so the run "
                                       "stopped: MemoryError")


# ------------------------------------------------------------------------- bad input


def last_error_line(capsys):
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_nproc_needs_the_torch_engine(capsys):
    assert cli.main(["train", "--nproc", "2", "--epochs", "1"]) == 2
    assert last_error_line(capsys) == ("poolgrad train: error: --nproc 2 needs --engine "
                                       "torch: the numpy engine trains in one process")
    with pytest.raises(TrainError, match="--nproc 2 needs --engine torch"):
        config.check_nproc(2, 100)


def test_the_device_is_checked_before_any_work(tmp_path, capsys):
    out = tmp_path / "run"
    refusals = [
        (["train", "--device", "cuda"], "--device cuda needs --engine torch: the numpy engine "
                                        "trains on the CPU"),
        (["train", "--engine", "torch", "--nproc", "2", "--device", "cuda"],
         "--device cuda trains in one process, and --nproc 2 on CPU processes: give one or "
         "the other")]
    if importlib.util.find_spec("torch") is not None:
        import torch
        if not torch.cuda.is_available():
            refusals.append((["train", "--engine", "torch", "--device", "cuda"],
                             "--device cuda: torch sees no CUDA GPU here; use --device cpu"))
        assert config.resolve_device("auto", 2, torch) == "cpu"  # the ranks are CPU processes
        assert config.resolve_device("auto", 1, torch) == (
            "cuda" if torch.cuda.is_available() else "cpu")
    for args, message in refusals:
        assert cli.main([*args, "--quiet", "--out", str(out)]) == 2
        assert last_error_line(capsys) == f"poolgrad train: error: {message}"
        assert not out.exists()
    with pytest.raises(TrainError, match="unknown device 'tpu': choose one of auto, cpu, cuda"):
        TrainConfig(engine="torch", device="tpu")


@needs_torch
def test_a_run_records_the_device_it_trained_on(runs, tmp_path, mnist, capsys):
    with open(os.path.join(runs["two"], "metrics.json")) as stream:
        assert json.load(stream)["settings"]["device"] == "cpu"  # auto, two ranks
    assert poolgrad_train("--dataset", mnist, "--epochs", "1", "--batch-size", str(BATCH),
                          "--device", "cpu", "--out", str(tmp_path / "cpu")) == 0
    assert "(torch, 1 process, cpu): test accuracy" in capsys.readouterr().out
    with open(tmp_path / "cpu" / "metrics.json") as stream:
        assert json.load(stream)["settings"]["device"] == "cpu"


def test_the_global_batch_must_split_evenly(capsys):
    assert poolgrad_train("--nproc", "3", "--batch-size", str(BATCH)) == 2
    assert last_error_line(capsys) == (
        "poolgrad train: error: --batch-size 8 is not divisible by --nproc 3: it is the "
        "global batch, split evenly across the processes")


def test_an_engine_resumes_only_its_own_checkpoint(tmp_path, capsys):
    train.train(TrainConfig("digits", str(tmp_path / "numpy"), epochs=1, progress=False,
                            plot=False, data=toy_data(n_train=40, n_test=10)))
    before = {p.name: p.read_bytes() for p in (tmp_path / "numpy").iterdir()}
    assert poolgrad_train("--resume", "--out", str(tmp_path / "numpy")) == 2
    assert last_error_line(capsys) == (
        f"poolgrad train: error: the checkpoint in {tmp_path / 'numpy'} (checkpoint.npz) "
        "was written by --engine numpy: resume it with --engine numpy")
    assert {p.name: p.read_bytes() for p in (tmp_path / "numpy").iterdir()} == before
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "checkpoint.pt").write_bytes(b"not read")
    assert cli.main(["train", "--resume", "--out", str(tmp_path / "torch")]) == 2
    assert last_error_line(capsys).endswith("was written by --engine torch: resume it with "
                                            "--engine torch")
    assert os.listdir(tmp_path / "torch") == ["checkpoint.pt"]
    # a folder with both engines' checkpoints (by hand, or an older poolgrad) mixes two runs
    (tmp_path / "numpy" / "checkpoint.pt").write_bytes(b"not read")
    for engine in ("numpy", "torch"):
        assert cli.main(["train", "--resume", "--engine", engine, "--out",
                         str(tmp_path / "numpy")]) == 2
        assert last_error_line(capsys) == (
            f"poolgrad train: error: {tmp_path / 'numpy'} holds the checkpoints of both "
            "engines (checkpoint.npz, checkpoint.pt): it mixes two runs; give another --out, "
            "or --overwrite to start afresh there")


@needs_torch
def test_overwrite_replaces_a_run_of_the_other_engine(tmp_path):
    small = {"epochs": 1, "progress": False, "plot": False,
             "data": toy_data(n_train=40, n_test=10)}
    out = tmp_path / "run"
    train.train(TrainConfig("digits", str(out), **small))
    metrics = train.train(TrainConfig("digits", str(out), engine="torch", overwrite=True,
                                      **small))
    assert sorted(os.listdir(out)) == ["checkpoint.pt", "metrics.json"]  # no checkpoint.npz
    with open(out / "metrics.json") as stream:
        assert json.load(stream)["settings"]["engine"] == "torch"
    assert metrics["checkpoint"] == str(out / "checkpoint.pt")
    assert os.listdir(tmp_path) == ["run"]


@needs_torch
def test_torch_checkpoint_errors(tmp_path, capsys, mnist, runs):
    (tmp_path / "checkpoint.pt").write_bytes(b"PK\x03\x04 not really a zip")
    assert poolgrad_train("--resume", "--out", str(tmp_path)) == 2
    assert "checkpoint.pt is not a poolgrad checkpoint" in last_error_line(capsys)
    assert poolgrad_train("--resume", "--nproc", "3", "--epochs", "3", "--dataset", mnist,
                          "--out", runs["two"]) == 2
    assert "--batch-size 4 is not divisible by --nproc 3" in last_error_line(capsys)
    assert poolgrad_train("--resume", "--out", str(tmp_path / "nothing")) == 2
    assert "no checkpoint to resume from" in last_error_line(capsys)


def test_without_torch_the_engine_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    assert poolgrad_train("--out", str(tmp_path / "run")) == 2
    assert last_error_line(capsys) == ('poolgrad train: error: --engine torch needs PyTorch: '
                                       'pip install -e ".[torch]" (or pip install torch)')
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("engine", ["numpy", "torch"])
def test_a_fresh_run_never_writes_over_another(tmp_path, capsys, engine):
    """Either engine refuses a folder that holds a run, of either engine, unless it
    resumes it; the refused run leaves the old one's files as they were."""
    if engine == "torch":
        pytest.importorskip("torch")
    for first in ("numpy", "torch"):
        out = tmp_path / f"{first}-then-{engine}"
        train.train(TrainConfig("digits", str(out), engine=first, epochs=1, progress=False,
                                plot=False, data=toy_data(n_train=40, n_test=10)))
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        assert cli.main(["train", "--engine", engine, "--epochs", "1", "--quiet",
                         "--out", str(out)]) == 2
        assert last_error_line(capsys) == (
            f"poolgrad train: error: {out} holds another run "
            f"({'checkpoint.npz' if first == 'numpy' else 'checkpoint.pt'}, metrics.json): "
            "--resume continues it, --overwrite replaces it; or give another --out")
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_folder_that_looks_writable_but_is_not_is_refused_before_training(capsys):
    """/proc passes every check of permissions and kinds of path, and refuses the write:
    the probe file finds out before the training, not when the run saves."""
    assert cli.main(["train", "--epochs", "1", "--out", "/proc/poolgrad_out"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(
        "poolgrad train: error: cannot write to the output folder /proc/poolgrad_out: ")
    assert "epoch" not in err  # nothing was trained
