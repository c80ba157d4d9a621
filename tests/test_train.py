"""Training end to end on small data: the loss falls, checkpoints resume exactly, the
IDX reader round-trips, and bad input gives one clear line and a non-zero exit."""

import gzip
import json
import os
import re
import struct
import sys

import numpy as np
import pytest
from in_process import run_command

from poolgrad import cli as poolgrad_cli
from poolgrad import train
from poolgrad.tools import datasets, folders
from poolgrad.train import TrainConfig, TrainError, checkpoints, config, menu, numpy_engine
from poolgrad.train.run import plot_history


def toy_data(n_train=200, n_test=60, seed=0):
    """Two classes of 1x8x8 images: a bright top-left or bottom-right quadrant."""
    rng = np.random.default_rng(seed)

    def make(n):
        labels = rng.integers(0, 2, n)
        x = rng.random((n, 1, 8, 8)).astype(np.float32) * 0.5
        for i, label in enumerate(labels):
            x[i, 0, 4 * label:4 * label + 4, 4 * label:4 * label + 4] += 1
        return x, labels.astype(np.int64)

    return datasets.Dataset("toy", *make(n_train), *make(n_test))


def run(tmp_path, name, **kwargs):
    options = {"epochs": 2, "batch_size": 32, "progress": False, "data": toy_data()}
    options.update(kwargs)
    return train.train(TrainConfig("digits", str(tmp_path / name), **options))


def test_training_lowers_the_loss_and_writes_its_files(tmp_path):
    metrics = run(tmp_path, "run", epochs=4)
    losses = [h["train_loss"] for h in metrics["history"]]
    assert losses[-1] < 0.5 * losses[0]
    assert metrics["test_accuracy"] > 0.9  # the task is easy; chance is 0.5
    out = tmp_path / "run"
    written = json.loads((out / "metrics.json").read_text())
    assert 0 <= written["test_accuracy"] <= 1 and written["train_time_s"] > 0
    assert written["settings"]["pool"] == "max" and written["settings"]["batch_size"] == 32
    assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with np.load(out / "checkpoint.npz") as checkpoint:
        assert "weight/0.W" in checkpoint.files and "optimizer/m.0" in checkpoint.files
    assert not [name for name in os.listdir(out) if name.startswith(".poolgrad-")]


HEADS = {"avg": "gap", "max": "attention", "soft": "attention"}


@pytest.mark.parametrize("pool", train.POOLS)
def test_every_pool_and_head_train(tmp_path, pool):
    head = HEADS.get(pool, "flatten")
    metrics = run(tmp_path, pool, pool=pool, head=head, epochs=3, optimizer="sgd", lr=0.1)
    assert metrics["history"][-1]["train_loss"] < metrics["history"][0]["train_loss"]
    assert metrics["settings"]["head"] == head
    assert metrics["settings"]["gap_head"] == (head == "gap")


def test_the_head_flags():
    assert config.resolve_head(None, True) == "gap" == config.resolve_head("gap", False)
    assert config.resolve_head(None, False) == "flatten"
    with pytest.raises(TrainError, match="cannot go with --head attention"):
        config.resolve_head("attention", True)
    with pytest.raises(TrainError, match="^unknown head 'mean': choose one of flatten, "
                                         "gap, attention$"):
        numpy_engine.build_model(1, (8, 8), 2, head="mean")


def test_pool_and_dataset_names_have_one_check_each():
    from poolgrad import explain, nn
    assert train.POOLS == tuple(menu.DOWNSAMPLING) == (
        "max", "avg", "lp", "blur", "max-blur", "avg-blur", "soft", "stochastic", "fractional",
        "gem", "mixed", "gated", "aps", "max-aps", "lps", "strided-conv")
    assert explain.KINDS == tuple(nn.POOLING) == ("max", "avg", "lp")
    for call in (lambda: numpy_engine.build_model(1, (8, 8), 2, pool="median"),
                 lambda: TrainConfig("digits", "unused", pool="median", data=toy_data())):
        with pytest.raises(TrainError, match="^unknown pool 'median': choose one of "
                                             "max, avg, lp, blur, .*, strided-conv$"):
            call()
    with pytest.raises(TrainError, match="^unknown --pool 'median'"):  # as the CLI says it
        TrainConfig(pool="median", flags=True)
    with pytest.raises(explain.ExplainError, match="^unknown kind 'strided-conv': choose one "
                                                   "of max, avg, lp$"):
        explain.route(np.zeros((1, 4, 4)), "strided-conv")
    allowed = r"choose digits, mnist1d or idx:PATH \(a folder of MNIST-style IDX files\)$"
    for name in ("cifar", "idx:", None):
        with pytest.raises(TrainError, match=f"^unknown dataset {name!r}: {allowed}"):
            config.defaults_for(name)
        with pytest.raises(datasets.DatasetError, match=f"^unknown dataset {name!r}: {allowed}"):
            datasets.load(name)
    assert [datasets.kind_of(n) for n in ("digits", "mnist1d", "idx:/data")] == [
        "digits", "mnist1d", "idx"]


def test_without_matplotlib_training_stops_before_it_starts(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    message = (r"^matplotlib is needed for the training plot: pip install matplotlib \(or "
               r"pip install 'poolgrad\[train\]'\)$")
    with pytest.raises(TrainError, match=message):
        run(tmp_path, "no-plot")
    assert not (tmp_path / "no-plot").exists()  # nothing trained, nothing written
    with pytest.raises(TrainError, match=message):
        plot_history([], str(tmp_path / "plot.png"))
    assert run(tmp_path, "plot-off", plot=False)["plot"] is None  # trains without a plot


def test_resume_cannot_go_back_or_change_dataset(tmp_path):
    run(tmp_path, "done", epochs=2)
    with pytest.raises(TrainError, match="already run 2 epochs"):
        train.train(TrainConfig("digits", str(tmp_path / "done"), epochs=1, resume=True,
                                progress=False, data=toy_data()))
    with pytest.raises(TrainError, match="trained on digits, not mnist1d"):
        train.train(TrainConfig("mnist1d", str(tmp_path / "done"), epochs=3, resume=True,
                                progress=False))
    with pytest.raises(TrainError, match="only --epochs may change, but --lr was given"):
        TrainConfig("digits", str(tmp_path / "done"), lr=0.1, resume=True)


def test_resume_reaches_the_weights_of_an_uninterrupted_run(tmp_path):
    run(tmp_path, "straight", epochs=3, optimizer="rmsprop", lr=0.003)
    run(tmp_path, "resumed", epochs=1, optimizer="rmsprop", lr=0.003)
    resumed = train.train(TrainConfig("digits", str(tmp_path / "resumed"), epochs=3,
                                      resume=True, progress=False, data=toy_data()))
    straight_weights = checkpoints.load_numpy(str(tmp_path / "straight" / "checkpoint.npz"))
    resumed_weights = checkpoints.load_numpy(str(tmp_path / "resumed" / "checkpoint.npz"))
    for part in (0, 1):  # weights, optimizer state
        assert straight_weights[part].keys() == resumed_weights[part].keys()
        for key, value in straight_weights[part].items():
            np.testing.assert_array_equal(resumed_weights[part][key], value, err_msg=key)
    assert resumed["epochs_run"] == 3 and resumed["settings"]["optimizer"] == "rmsprop"


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rmsprop", "adam"])
def test_accumulating_four_batches_trains_like_one_four_times_as_large(tmp_path, optimizer):
    """Caffe's iter_size: 4 batches of 25 per step reach the weights of batches of 100,
    up to float rounding, over 230 examples, so the epoch's last step is 25 + 5 examples
    against one batch of 30. Batches of 25 stepped one by one do not."""
    data = toy_data(n_train=230)
    options = {"epochs": 1, "optimizer": optimizer, "lr": 0.01, "data": data, "plot": False}
    big = run(tmp_path, "big", batch_size=100, **options)
    accumulated = run(tmp_path, "accumulated", batch_size=25, accumulate=4, **options)
    run(tmp_path, "small", batch_size=25, **options)
    weights = {name: checkpoints.load_numpy(str(tmp_path / name / "checkpoint.npz"))
               for name in ("big", "accumulated", "small")}
    for part in (0, 1):  # weights, optimizer state
        for key, value in weights["big"][part].items():
            np.testing.assert_allclose(weights["accumulated"][part][key], value, rtol=1e-5,
                                       atol=1e-7, err_msg=key)
    assert weights["big"][1]["steps"] == weights["accumulated"][1]["steps"] == 3
    assert weights["small"][1]["steps"] == 10
    assert not np.allclose(weights["small"][0]["0.W"], weights["big"][0]["0.W"], atol=1e-4)
    assert accumulated["settings"]["accumulate"] == 4 and big["settings"]["accumulate"] == 1
    # every example's loss counted once, in either run
    assert accumulated["history"][0]["train_loss"] == pytest.approx(
        big["history"][0]["train_loss"], rel=1e-5)


def test_an_accumulating_run_resumes_exactly_and_keeps_its_accumulate(tmp_path):
    """Every epoch ends with a step (its last takes the batches left), so a checkpoint
    never holds half an accumulation."""
    options = {"optimizer": "adam", "lr": 0.003, "batch_size": 16, "accumulate": 3,
               "plot": False}
    run(tmp_path, "straight", epochs=2, **options)
    run(tmp_path, "resumed", epochs=1, **options)
    train.train(TrainConfig("digits", str(tmp_path / "resumed"), epochs=2, resume=True,
                            progress=False, plot=False, data=toy_data()))
    straight, resumed = (checkpoints.load_numpy(str(tmp_path / name / "checkpoint.npz"))
                         for name in ("straight", "resumed"))
    for part in (0, 1):
        for key, value in straight[part].items():
            np.testing.assert_array_equal(resumed[part][key], value, err_msg=key)
    assert resumed[2]["settings"]["accumulate"] == 3
    with pytest.raises(TrainError, match="only --epochs may change, but --accumulate was "
                                         "given"):
        TrainConfig("digits", str(tmp_path / "resumed"), accumulate=2, resume=True)
    for bad in (0, 1.5, True):
        with pytest.raises(TrainError, match=f"^accumulate must be an integer >= 1, got "
                                             f"{bad!r}$"):
            TrainConfig("digits", "unused", accumulate=bad)


def test_the_loss_gradient_of_a_batch_within_a_step():
    """A batch's share of a larger step's mean: each row divided by the step's count."""
    from poolgrad import nn
    logits = np.random.default_rng(0).standard_normal((5, 3))
    labels = np.array([0, 2, 1, 1, 0])
    loss = nn.SoftmaxCrossEntropy()
    loss.forward(logits, labels)
    mean = loss.backward()
    loss.forward(logits, labels)
    np.testing.assert_array_equal(loss.backward(count=20), mean * 5 / 20)
    loss.forward(logits, labels)
    for bad in (4, 2.5, True):  # refused before the saved state is taken

        with pytest.raises(ValueError, match=f"count must be an integer >= the batch's 5 "
                                             f"examples, got {bad!r}"):
            loss.backward(count=bad)
    np.testing.assert_array_equal(loss.backward(), mean)


def test_same_seed_same_numbers_and_another_seed_differs(tmp_path):
    a, b = run(tmp_path, "a", seed=3), run(tmp_path, "b", seed=3)
    c = run(tmp_path, "c", seed=4)

    def numbers(metrics):
        return [(h["train_loss"], h["test_loss"]) for h in metrics["history"]]

    assert numbers(a) == numbers(b)
    assert numbers(a) != numbers(c)


def test_digits_split_is_fixed_and_documented():
    pytest.importorskip("sklearn")
    data = datasets.load("digits")
    assert data.x_train.shape == (1437, 1, 8, 8) and data.x_test.shape == (360, 1, 8, 8)
    assert data.x_train.dtype == np.float32 and 0 <= data.x_train.min() <= data.x_train.max() <= 1
    again = datasets.load("digits")
    np.testing.assert_array_equal(again.y_test, data.y_test)


# ------------------------------------------------------------------------ run folders


def contents(folder):
    return {path.name: path.read_bytes() for path in folder.iterdir()}


SMALL = {"data": toy_data(n_train=40, n_test=10), "batch_size": 20}


def test_overwrite_replaces_the_run_whole(tmp_path, capsys):
    out = tmp_path / "run"
    run(tmp_path, "run", epochs=1, **SMALL)  # with its plot
    old = contents(out)
    metrics = run(tmp_path, "run", seed=1, plot=False, overwrite=True, **SMALL)
    new = contents(out)
    assert set(new) == {"checkpoint.npz", "metrics.json"}  # the old plot went with the run
    assert new["checkpoint.npz"] != old["checkpoint.npz"]
    assert json.loads(new["metrics.json"])["epochs_run"] == 2
    assert metrics["checkpoint"] == str(out / "checkpoint.npz")  # not the staging folder's
    assert os.listdir(tmp_path) == ["run"]  # the staging folder became it
    run(tmp_path, "fresh", epochs=1, plot=False, overwrite=True, **SMALL)  # nothing to replace
    assert set(contents(tmp_path / "fresh")) == {"checkpoint.npz", "metrics.json"}
    assert poolgrad_cli.main(["train", "--resume", "--overwrite", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "poolgrad train: error: --resume continues the run in the output folder and "
        "--overwrite replaces it: give one or the other\n")


def broken(*args, **kwargs):
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("crash", ["in epoch 2", "in the swap"])
def test_a_crash_while_overwriting_leaves_the_old_run(tmp_path, monkeypatch, crash):
    run(tmp_path, "run", epochs=1, plot=False, **SMALL)
    old = contents(tmp_path / "run")
    if crash == "in the swap":
        monkeypatch.setattr(folders, "exchange", broken)
    else:  # after epoch 1's checkpoint was written into the staging folder
        save, saved = checkpoints.save_numpy, []

        def save_once(path, *args):
            saved.append(path)
            if len(saved) > 1:
                broken()
            save(path, *args)

        monkeypatch.setattr(checkpoints, "save_numpy", save_once)
    with pytest.raises(OSError, match="No space left on device"):
        run(tmp_path, "run", seed=1, plot=False, overwrite=True, **SMALL)
    if crash == "in epoch 2":
        assert os.path.basename(os.path.dirname(saved[0])).startswith(".run.poolgrad-new-")
    assert contents(tmp_path / "run") == old
    assert os.listdir(tmp_path) == ["run"]  # the staging folder was removed


def test_train_refuses_a_study_or_other_files_even_to_overwrite(tmp_path, capsys):
    study = tmp_path / "study"
    (study / "runs" / "digits16").mkdir(parents=True)
    (study / "results.json").write_text("{}")
    (study / "runs" / "digits16" / "max-flatten-seed0.json").write_text("{}")
    for flags in ([], ["--overwrite"], ["--resume"]):
        assert poolgrad_cli.main(["train", "--epochs", "1", "--out", str(study), *flags]) == 2
        assert capsys.readouterr().err == (
            f"poolgrad train: error: {study} holds a study of poolgrad study shift, not a run "
            "of poolgrad train: give another --out\n")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "metrics.json").write_text("{}")
    (mixed / "notes.txt").write_text("mine")
    assert poolgrad_cli.main(["train", "--epochs", "1", "--overwrite", "--out", str(mixed)]) == 2
    assert capsys.readouterr().err.startswith(
        f"poolgrad train: error: {mixed} holds files that poolgrad train does not write "
        "(notes.txt): a run's folder holds it alone")
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "digits16", "max-flatten-seed0.json", "metrics.json", "mixed", "notes.txt",
        "results.json", "runs", "study"]  # nothing written, nothing deleted


# ------------------------------------------------------------------------------- IDX


def write_idx(path, array, type_code=0x08, gz=False):
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I",
                                                                 *array.shape)
    payload = header + array.astype(">u1" if type_code == 0x08 else ">i4").tobytes()
    with (gzip.open if gz else open)(path, "wb") as stream:
        stream.write(payload)


def write_mnist(folder, n_train=30, n_test=10, gz=False, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gz else ""
    parts = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28)).astype(np.uint8)
        labels = rng.integers(0, 10, n).astype(np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", images, gz=gz)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", labels, gz=gz)
        parts[prefix] = images, labels
    return parts


@pytest.mark.parametrize("gz", [False, True])
def test_idx_reader_round_trip(tmp_path, gz):
    parts = write_mnist(tmp_path / "mnist", gz=gz)
    data = datasets.load(f"idx:{tmp_path / 'mnist'}")
    images, labels = parts["train"]
    np.testing.assert_array_equal(data.x_train[:, 0], images.astype(np.float32) / 255)
    np.testing.assert_array_equal(data.y_train, labels)
    np.testing.assert_array_equal(data.y_test, parts["t10k"][1])
    ints = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    write_idx(tmp_path / "ints", ints, type_code=0x0C)
    np.testing.assert_array_equal(datasets.read_idx(str(tmp_path / "ints")), ints)


def test_idx_errors(tmp_path):
    write_mnist(tmp_path / "m")
    (tmp_path / "m" / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00")
    with pytest.raises(datasets.DatasetError, match="corrupt IDX header"):
        datasets.load(f"idx:{tmp_path / 'm'}")
    (tmp_path / "m" / "t10k-labels-idx1-ubyte").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(datasets.DatasetError, match="is not an IDX file"):
        datasets.load(f"idx:{tmp_path / 'm'}")
    write_idx(tmp_path / "m" / "t10k-labels-idx1-ubyte", np.zeros(9, np.uint8))
    with pytest.raises(datasets.DatasetError, match="10 t10k images but 9 labels"):
        datasets.load(f"idx:{tmp_path / 'm'}")
    os.remove(tmp_path / "m" / "t10k-labels-idx1-ubyte")
    with pytest.raises(datasets.DatasetError, match="IDX file not found"):
        datasets.load(f"idx:{tmp_path / 'm'}")
    data = tmp_path / "short"
    write_idx(data, np.zeros((2, 3), np.uint8))
    data.write_bytes(data.read_bytes()[:-1])
    with pytest.raises(datasets.DatasetError, match="promises shape"):
        datasets.read_idx(str(data))


# ----------------------------------------------------------------------- command line


def cli(*args, cwd=None):
    return run_command("train", *args, cwd=cwd)


def test_cli_trains_on_idx_files(tmp_path):
    write_mnist(tmp_path / "mnist", gz=True)
    out = tmp_path / "out"
    done = cli("--dataset", f"idx:{tmp_path / 'mnist'}", "--epochs", "1", "--batch-size", "8",
               "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    assert "test accuracy" in done.stdout and f"checkpoint: {out}" in done.stdout
    assert (out / "training.png").stat().st_size > 0
    assert json.loads((out / "metrics.json").read_text())["epochs_run"] == 1


def bad_cases(tmp_path):
    write_mnist(tmp_path / "bad-header")
    (tmp_path / "bad-header" / "train-images-idx3-ubyte").write_bytes(b"\x01\x02\x03\x04")
    write_mnist(tmp_path / "bad-gzip", gz=True)
    (tmp_path / "bad-gzip" / "t10k-labels-idx1-ubyte.gz").write_bytes(
        gzip.compress(b"\x00" * 64)[:-12] + b"\xff" * 12)
    write_mnist(tmp_path / "mismatch")
    write_idx(tmp_path / "mismatch" / "train-labels-idx1-ubyte", np.zeros(29, np.uint8))
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "checkpoint.npz").write_bytes(b"PK\x03\x04 not really a zip")
    (tmp_path / "not-zip").mkdir()
    (tmp_path / "not-zip" / "checkpoint.npz").write_bytes(b"plain bytes")
    (tmp_path / "npy").mkdir()
    with open(tmp_path / "npy" / "checkpoint.npz", "wb") as stream:
        np.save(stream, np.zeros(3))  # an .npy array where the .npz archive should be
    return [
        (["--resume", "--out", str(tmp_path / "not-zip")],
         "checkpoint.npz is not a poolgrad checkpoint (not a .npz archive)"),
        (["--resume", "--out", str(tmp_path / "npy")],
         "checkpoint.npz is not a poolgrad checkpoint (not a .npz archive)"),
        (["--resume", "--out", str(tmp_path / "corrupt")], "is not a poolgrad checkpoint"),
        (["--resume", "--lr", "0.1", "--out", str(tmp_path / "corrupt")],
         "--resume takes its settings from the checkpoint; only --epochs may change"),
        (["--dataset", "cifar"], "unknown --dataset 'cifar'"),
        (["--dataset", f"idx:{tmp_path / 'nowhere'}"], "IDX folder not found"),
        (["--dataset", f"idx:{tmp_path / 'a-file'}"], "IDX folder not found"),
        (["--dataset", f"idx:{tmp_path / 'bad-header'}"], "is not an IDX file"),
        (["--dataset", f"idx:{tmp_path / 'mismatch'}"], "30 train images but 29 labels"),
        (["--dataset", f"idx:{tmp_path / 'bad-gzip'}"], "cannot read IDX file"),
        (["--pool", "median"], "unknown --pool 'median'"),
        (["--batch-size", "0"], "--batch-size: must be an integer >= 1"),
        (["--accumulate", "0"], "--accumulate: must be an integer >= 1"),
        (["--optimizer", "lbfgs"], "unknown optimizer 'lbfgs'"),
        (["--lr", "-1"], "--lr: must be a finite number > 0"),
        (["--out", str(tmp_path / "a-file" / "run")], "cannot write to the output folder"),
        (["--resume", "--out", str(tmp_path / "empty")], "no checkpoint to resume from"),
    ]


def test_cli_bad_input_gives_one_line_and_non_zero_exit(tmp_path):
    for args, message in bad_cases(tmp_path):
        done = cli(*args, "--epochs", "1", cwd=tmp_path)
        assert done.returncode != 0, args
        assert "Traceback" not in done.stderr, (args, done.stderr)
        assert message in done.stderr.strip().splitlines()[-1], (args, done.stderr)
        assert "allow_pickle" not in done.stderr  # NumPy's advice is not ours to give


def test_atomic_write_errors_name_the_file_not_the_temporary(tmp_path):
    from poolgrad.tools.files import write_atomically
    (tmp_path / "folder").mkdir()
    for path in (tmp_path / "folder", tmp_path / "folder" / "x" / "y"):
        if path.name == "y":
            (tmp_path / "folder" / "x").write_text("a file where a folder is needed")
        message = rf"^\[Errno \d+\] cannot write {re.escape(str(path))}: "
        with pytest.raises(OSError, match=message) as caught:
            write_atomically(str(path), lambda stream: stream.write(b"{}"))
        assert ".poolgrad-" not in str(caught.value)
    assert not list(tmp_path.rglob(".poolgrad-*"))  # the temporary was removed


def test_atomic_writes_get_the_usual_permissions(tmp_path):
    from poolgrad.tools.files import write_atomically
    old = os.umask(0o022)
    try:
        write_atomically(str(tmp_path / "f.json"), lambda stream: stream.write(b"{}"))
    finally:
        os.umask(old)
    assert (tmp_path / "f.json").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    assert (tmp_path / "f.json").read_bytes() == b"{}"
