"""poolgrad study shift: the shifts move what they say, the measures are right on
networks whose invariance is known, the findings follow the numbers, and the pipeline
runs (--quick), resumes without redoing a run, and refuses bad settings in one line."""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from poolgrad import cli, explain, ops  # noqa: E402
from poolgrad.study import findings, make_plan, report, runner, shift_study, shifts  # noqa: E402
from poolgrad.study.runner import StudyError  # noqa: E402


def test_shift_zero_and_circular_per_example():
    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    before = x.clone()
    offsets = torch.tensor([[1, -2], [0, 3]])
    circular = shifts.shift(x, offsets, "circular")
    for n in range(2):
        rolled = torch.roll(x[n], tuple(offsets[n].tolist()), dims=(1, 2))
        assert torch.equal(circular[n], rolled)
    zero = shifts.shift(x, offsets, "zero").numpy()
    expected = np.zeros((2, 3, 4, 5), np.float32)
    expected[0, :, 1:, :3] = x[0, :, :3, 2:].numpy()  # down 1, left 2
    expected[1, :, :, 3:] = x[1, :, :, :2].numpy()  # right 3
    np.testing.assert_array_equal(zero, expected)
    assert torch.equal(shifts.shift(x, (1, 1), "zero")[1], shifts.shift(x, [[1, 1]] * 2)[1])
    assert torch.equal(x, before)  # the input is not modified
    with pytest.raises(ValueError, match="unknown shift mode 'wrap': choose one of zero"):
        shifts.shift(x, (1, 1), "wrap")


class Peak(torch.nn.Module):
    """Class = where the largest value is, modulo 10 (depends on position), or, with
    ``invariant``, a class from the values alone."""

    def __init__(self, invariant):
        super().__init__()
        self.invariant = invariant

    def forward(self, x):
        flat = x.flatten(1)
        if self.invariant:
            return torch.nn.functional.one_hot((flat.sum(1) * 7).long() % 10, 10).float()
        return torch.nn.functional.one_hot(flat.argmax(1) % 10, 10).float()


def test_measures_on_networks_whose_invariance_is_known():
    generator = torch.Generator().manual_seed(0)
    x = torch.rand((64, 1, 24), generator=generator)
    y = torch.zeros(64, dtype=torch.int64)
    invariant, peak = Peak(True), Peak(False)
    assert shifts.consistency(invariant, x, 8, "circular", seed=1) == 1.0
    curve = shifts.shift_curve(invariant, x, y, range(4), "circular")
    assert curve["agreement"] == [1.0] * 4 and curve["shift"] == [0, 1, 2, 3]
    # the peak moves with the shift: a nonzero circular shift of 1-9 changes its class
    curve = shifts.shift_curve(peak, x, y, [0, 1, 5], "circular")
    assert curve["agreement"] == [1.0, 0.0, 0.0]
    # two offsets agree exactly when they are equal: 1 / 9 of pairs drawn from 9 values
    assert 0.0 < shifts.consistency(peak, x, 8, "circular", seed=1) < 0.3


def test_circular_invariance_counts_every_shift():
    x = torch.rand((20, 1, 10), generator=torch.Generator().manual_seed(2))
    assert shifts.circular_invariance(Peak(True), x) == {"invariant": 1.0, "flips": 0.0}
    # 10 positions, 10 classes: the peak's class moves with every nonzero shift
    measured = shifts.circular_invariance(Peak(False), x)
    assert measured["invariant"] == 0.0 and measured["flips"] == pytest.approx(9 / 10)


@pytest.mark.parametrize("pool, seed, invariant", [("max-aps", 1, True), ("aps", 3, True),
                                                   ("max", 3, False)])
def test_a_circular_network_with_aps_keeps_every_prediction(pool, seed, invariant):
    """The study's networks with circular convolutions and a global average head: with
    APS at every stride no circular shift changes a prediction (untrained weights: the
    guarantee holds for any; seeds whose predictions differ between inputs); with max
    pooling some do."""
    from poolgrad.train import torch_engine
    torch.manual_seed(0)
    model = torch_engine.build_model(1, (16, 16), 10, pool=pool, widths=(4, 8), head="gap",
                                     seed=seed, conv_padding="circular")
    x = torch.randn((30, 1, 16, 16), generator=torch.Generator().manual_seed(1)) * (
        torch.linspace(0.1, 3, 30)[:, None, None, None])
    assert len(shifts.predict(model, x).unique()) > 1  # not one class for every input
    measured = shifts.circular_invariance(model, x)
    assert (measured == {"invariant": 1.0, "flips": 0.0}) == invariant, measured


def test_layer_invariance_is_explains_measure_on_the_first_pooling():
    from poolgrad.train import torch_engine
    model = torch_engine.build_model(1, (12, 12), 10, pool="max", widths=(4, 8), seed=0)
    x = torch.rand((6, 1, 12, 12), generator=torch.Generator().manual_seed(0))
    before, block = shifts.first_downsampling(model)
    assert len(block) == 1 and type(block[0]).__name__ == "MaxPool2d"
    with torch.no_grad():
        maps = before(x).double().numpy()
    expected = explain.unchanged_outputs(
        maps, {"max": lambda canvas: ops.max_pool(canvas, 2)}, (2, 2), range(5))
    measured = shifts.layer_invariance(model, x, range(5))
    np.testing.assert_allclose(measured["unchanged"], [row["max"] for row in expected])
    assert measured["unchanged"][0] == 1.0 and measured["unchanged"][1] < 1.0
    strided = torch_engine.build_model(1, (12, 12), 10, pool="strided-conv", widths=(4, 8))
    _, block = shifts.first_downsampling(strided)
    assert [type(layer).__name__ for layer in block] == ["Conv2d"]  # its ReLU left out
    assert block[0].stride == (2, 2)


def test_plan_runs_and_refusals():
    plan = make_plan(pools=["max", "avg"], heads=["gap"], seeds=2, datasets=["mnist1d"])
    assert [(r["pool"], r["seed"]) for r in plan.runs()] == [
        ("max", 0), ("avg", 0), ("max", 1), ("avg", 1)]  # every cell once before twice
    assert plan.settings("mnist1d")["epochs"] == 15
    assert plan.settings("digits16-translated")["epochs"] == 20
    assert make_plan(epochs=2).settings("digits16")["epochs"] == 2
    full = make_plan()
    assert len(full.runs()) == 3 * 13 * 3 * 3
    assert full.settings("digits16")["conv_padding"] == "zeros"
    assert make_plan(conv_padding="circular").settings("mnist1d")["conv_padding"] == "circular"
    with pytest.raises(StudyError, match="unknown conv padding 'wrap': choose from zeros, "
                                         "circular"):
        make_plan(conv_padding="wrap")
    with pytest.raises(StudyError, match="unknown pool 'maxx': choose from max, avg"):
        make_plan(pools=["max", "maxx"])
    with pytest.raises(StudyError, match="seeds must be an integer >= 1, got 0"):
        make_plan(seeds=0)


def _cell(dataset, pool, head, consistency, spread=0.01, stride=4):
    figure = {"mean": 0.9, "spread": 0.01}
    curve = {"shift": list(range(2 * stride + 1)),
             "agreement": [1.0] + [consistency] * (2 * stride)}
    return {"dataset": dataset, "pool": pool, "head": head, "seeds": 3, "mode": "zero",
            "stride": stride, "test_accuracy": figure, "flip_1px": figure,
            "stride_agreement": figure, "layer_1px": {"mean": 0.4, "spread": 0.02},
            "layer_2px": {"mean": 0.2, "spread": 0.02},
            "consistency": {"mean": consistency, "spread": spread},
            "circular_invariant": figure, "circular_flips": figure,
            "curves": {"zero": curve, "circular": curve}}


@pytest.mark.parametrize("blur_gain", [0.2, -0.2, 0.0])
def test_findings_follow_the_numbers(blur_gain):
    summary = [_cell(dataset, pool, "flatten", 0.5 + 0.3 * (dataset == "digits16-translated")
                     + blur_gain * (pool == "blur"))
               for dataset in ("digits16", "digits16-translated")
               for pool in ("max", "avg", "blur")]
    text = findings.findings(summary)
    better, worse = {0.2: (2, 0), -0.2: (0, 2), 0.0: (0, 0)}[blur_gain]
    assert (f"Of 2 comparisons (dataset x head x pair), the blurred layer is more consistent "
            f"beyond the spread in {better}, less in {worse}, and within the spread in "
            f"{2 - better - worse}") in text
    assert "changes consistency by +30.0 points (beyond the spread)" in text
    assert "**Verdict.** Holds: the pooling layers alone" in text
    assert "leaves 40.0% ± 2.0 of the first max pooling's outputs unchanged" in text
    flat = findings.findings([dict(c, consistency={"mean": 0.5, "spread": 0.05})
                              for c in summary])
    assert "Not shown: training with translation did not raise consistency" in flat


def run(args, capsys):
    code = cli.main(["study", "shift", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


QUICK = ["--quick", "--datasets", "digits16", "--pools", "max", "--heads", "flatten"]


def test_quick_study_writes_everything(tmp_path, capsys):
    out = tmp_path / "study"
    code, printed, _ = run(["--quick", "--out", str(out), "--workers", "1"], capsys)
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    assert len(result["runs"]) == len(make_plan(quick=True).runs()) == 24
    assert len(result["cells"]) == 12 and all(c["seeds"] == 2 for c in result["cells"])
    run0 = result["runs"][0]
    assert run0["curves"]["zero"]["agreement"][0] == 1.0  # an input agrees with itself
    assert len(run0["curves"]["circular"]["shift"]) == 2 * run0["stride"] + 1
    assert run0["layer"]["unchanged"][0] == 1.0
    table = (out / "table.md").read_text()
    assert table.count("| max | flatten |") == 3 and "### digits16-translated" in table
    for name in ("zero", "circular", "scatter"):
        assert (out / report.FILES[name]).read_bytes()[:4] == b"\x89PNG"
    assert "**Verdict.**" in (out / "findings.md").read_text()
    assert "numbers mean nothing" in printed and "## 1." in printed


def test_resumes_without_redoing_a_run(tmp_path, capsys):
    out = tmp_path / "study"
    assert run(QUICK + ["--out", str(out), "--workers", "1"], capsys)[0] == 0
    files = sorted((out / "runs" / "digits16").iterdir())
    assert len(files) == 2
    stamps = [f.stat().st_mtime_ns for f in files]
    files[1].unlink()  # as if the study had stopped before its last run
    code, _, err = run(QUICK + ["--out", str(out), "--workers", "1"], capsys)
    assert code == 0 and "1 of 2 runs already in" in err and err.count("[1/1]") == 1
    assert files[0].stat().st_mtime_ns == stamps[0]  # the finished run was not redone
    assert files[1].exists()
    code, _, err = run(QUICK + ["--out", str(out), "--epochs", "2"], capsys)
    assert code == 2 and "holds runs made with other settings (epochs differ)" in err
    assert err.count("\n") == 1


def test_runs_in_spawned_workers(tmp_path, capsys):
    out = tmp_path / "study"
    code, _, err = run(QUICK + ["--out", str(out), "--workers", "2"], capsys)
    assert code == 0 and err.count("accuracy") == 2
    alone = tmp_path / "alone"
    assert run(QUICK + ["--out", str(alone), "--workers", "1"], capsys)[0] == 0
    for name in ("max-flatten-seed0.json", "max-flatten-seed1.json"):
        spawned, here = (json.loads((folder / "runs" / "digits16" / name).read_text())
                         for folder in (out, alone))
        # the same seed trains the same network in a worker as in this process
        assert spawned["curves"] == here["curves"]
        assert spawned["train_loss"] == pytest.approx(here["train_loss"], rel=1e-5)


@pytest.mark.parametrize("args, message", [
    (["--pools", "max,bogus"], "unknown pool 'bogus': choose from max"),
    (["--heads", "gap,mean"], "unknown head 'mean': choose from flatten, gap, attention"),
    (["--datasets", "mnist"], "unknown dataset 'mnist': choose from mnist1d"),
    (["--device", "cuda"], "--device cuda: torch sees no CUDA GPU here"),
])
def test_bad_arguments_get_one_line(tmp_path, capsys, args, message):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, _, err = run(["--quick", "--out", str(tmp_path / "s"), *args], capsys)
    assert code == 2 and message in err and err.count("\n") == 1
    assert not os.path.exists(tmp_path / "s")  # refused before any work


def test_bad_folders_are_refused_before_the_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, _, err = run(QUICK + ["--out", str(blocker / "study")], capsys)
    assert code == 2 and "cannot write to the output folder" in err
    out = tmp_path / "study"
    (out / "runs" / "digits16").mkdir(parents=True)
    (out / "runs" / "digits16" / "max-flatten-seed0.json").write_text("{half a file")
    code, _, err = run(QUICK + ["--out", str(out)], capsys)
    assert code == 2 and "is not a finished run of poolgrad study shift" in err


def files_in(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*")
            if p.is_file()}


def test_a_study_refuses_a_train_run_even_to_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoint.npz").write_bytes(b"weights")
    (out / "metrics.json").write_text("{}")
    for flags in ([], ["--overwrite"]):
        code, _, err = run(QUICK + ["--out", str(out), *flags], capsys)
        assert code == 2 and err == (f"poolgrad study: error: {out} holds a run of poolgrad "
                                     "train, not a study of poolgrad study shift: give "
                                     "another --out\n")
    assert files_in(out) == {"checkpoint.npz": b"weights", "metrics.json": b"{}"}


def test_overwrite_replaces_a_study_whole_or_leaves_it(tmp_path, monkeypatch):
    """The runs and the report are stand-ins (the folder is what is tested): a crash
    halfway leaves the old study, a finished study replaces it, runs and all."""
    crash_at_seed = None

    def stand_in_run(run, plan, device):
        if run["seed"] == crash_at_seed:
            raise OSError(28, "No space left on device")
        return {**run, "settings": plan.settings(run["dataset"]), "test_accuracy": 0.9,
                "consistency": 0.5, "flip_1px": 0.1, "train_time_s": 0.0}

    def stand_in_report(folder, records, about):
        path = os.path.join(folder, "results.json")
        with open(path, "w") as stream:
            json.dump({"runs": len(records)}, stream)
        return {"results": path}

    monkeypatch.setattr(runner, "run_one", stand_in_run)
    monkeypatch.setattr(report, "write", stand_in_report)
    out = tmp_path / "study"
    (out / "runs" / "digits16").mkdir(parents=True)
    (out / "runs" / "digits16" / "max-flatten-seed0.json").write_text(
        json.dumps({"settings": {"epochs": 99}}))
    (out / "results.json").write_text("old")
    (out / "table.md").write_text("old")
    old = files_in(out)
    plan = make_plan(quick=True, datasets=["digits16"], pools=["max"], heads=["flatten"])
    with pytest.raises(StudyError, match="holds runs made with other settings .* --overwrite "
                                         "to start afresh there"):
        shift_study(str(out), plan, device="cpu", workers=1)
    crash_at_seed = 1  # after seed 0's run was written into the staging folder
    with pytest.raises(OSError, match="No space left on device"):
        shift_study(str(out), plan, device="cpu", workers=1, overwrite=True)
    assert files_in(out) == old and os.listdir(tmp_path) == ["study"]
    crash_at_seed = None
    paths = shift_study(str(out), plan, device="cpu", workers=1, overwrite=True)
    assert paths == {"results": str(out / "results.json")}
    assert sorted(files_in(out)) == ["results.json", "runs/digits16/max-flatten-seed0.json",
                                     "runs/digits16/max-flatten-seed1.json"]
    assert json.loads((out / "results.json").read_text()) == {"runs": 2}
    assert os.listdir(tmp_path) == ["study"]
