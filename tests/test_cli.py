"""The ``poolgrad`` command: the demo runs, and bad arguments give one line and exit 2."""

import json
import signal
import subprocess
import sys

import pytest

from poolgrad import cli


def test_demo_reports_the_routing(capsys):
    assert cli.main(["demo", "--batch", "20", "--size", "4"]) == 0
    out = capsys.readouterr().out
    assert "batch of 20 random 4x4 inputs" in out
    assert "each example reaches 4.0 of 16 positions" in out
    assert "batch gradient == each example's gradient computed alone: True" in out


@pytest.mark.parametrize("args, message", [
    (["demo", "--size", "1", "--kernel", "3"], "output would be empty"),
    (["demo", "--batch", "0"], "--batch: must be an integer >= 1"),
    (["demo", "--kernel", "x"], "--kernel"),
    (["demo", "--seed", "-1"], "--seed: must be an integer >= 0"),
    (["nonsense"], "invalid choice"),
])
def test_bad_arguments_exit_non_zero_with_one_line(args, message):
    run = subprocess.run([sys.executable, "-m", "poolgrad.cli", *args],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert message in run.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("module", ["poolgrad", "poolgrad.cli"])
def test_bare_poolgrad_prints_the_help_and_exits_zero(module):
    run = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert run.stdout.startswith("usage: poolgrad")
    for command in ("demo", "bench", "train", "explain"):
        assert f"\n    {command} " in run.stdout, command
    assert cli.main([]) == 0


def test_the_package_exports_exactly_the_public_operators():
    import poolgrad
    from poolgrad import autodiff, kinds, ops
    assert poolgrad.__all__ == ops.__all__ + kinds.__all__
    assert "max_pool" in poolgrad.__all__ and "vjp" in poolgrad.__all__
    assert "blur_pool" in poolgrad.__all__
    for module in (ops, kinds):
        for name in module.__all__:
            assert getattr(poolgrad, name) is getattr(module, name), name
    # every exported operator and kind is one vjp takes
    for name in [*ops.__all__, *kinds.__all__]:
        if name not in ("vjp", "Pullback"):
            assert getattr(poolgrad, name) in autodiff.operators(), name


@pytest.mark.parametrize("args", [
    ["demo", "--kernel", "x"],           # a bad value
    ["nonsense"],                        # an unknown command
    ["study"],                           # a missing sub-command
    ["train", "--epochs"],               # a missing value
    ["bench", "--no-such-flag"],         # an unknown flag
])
def test_argument_errors_are_one_line_without_the_usage_block(args):
    run = subprocess.run([sys.executable, "-m", "poolgrad.cli", *args],
                         capture_output=True, text=True)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "usage:" not in run.stderr, run.stderr
    assert lines[0].startswith("poolgrad") and ": error: " in lines[0]
    assert lines[0].endswith("--help)")  # where the allowed values are


def _default_sigint():
    # pytest-xdist's workers ignore SIGINT, and an ignored signal stays ignored across
    # exec: Python would then never raise KeyboardInterrupt, as a user's terminal would
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_with_one_line_and_exit_130(tmp_path):
    out = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-m", "poolgrad.cli", "train", "--epochs",
                                "10000", "--out", str(out)], preexec_fn=_default_sigint,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = b""
        while b"epoch " not in seen:  # training has begun: the first epoch's line
            byte = process.stderr.read(1)
            assert byte, seen.decode(errors="replace")
            seen += byte
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()  # a no-op once it has stopped; never left training otherwise
    assert process.returncode == 130
    assert b"Traceback" not in err
    assert err.decode().strip().splitlines()[-1] == "poolgrad train: interrupted"
    assert not list(out.glob(".poolgrad-*"))  # files are written whole or not at all


def test_bench_writes_under_runs_by_default(tmp_path, monkeypatch):
    """A clone's root stays clean: the default JSON goes to runs/ (git-ignored)."""
    monkeypatch.chdir(tmp_path)
    from poolgrad.bench import numpy_api
    monkeypatch.setattr(numpy_api, "run", lambda **kwargs: {"quick": kwargs["quick"]})
    monkeypatch.setattr(numpy_api, "format_table", lambda result: "table")
    assert cli.main(["bench", "--quick"]) == 0
    assert json.loads((tmp_path / "runs" / "bench.json").read_text()) == {"quick": True}


def test_bench_kinds_writes_its_own_file_under_runs(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    from poolgrad.bench import kinds
    monkeypatch.setattr(kinds, "run", lambda progress, **kwargs: {"mode": "kinds", **kwargs})
    monkeypatch.setattr(kinds, "format_table", lambda result: "table")
    assert cli.main(["bench", "--kinds", "--quick", "--threads", "1"]) == 0
    written = json.loads((tmp_path / "runs" / "bench-kinds.json").read_text())
    assert {key: written[key] for key in ("mode", "quick", "threads", "repeats")} == {
        "mode": "kinds", "quick": True, "threads": 1, "repeats": None}
    assert not (tmp_path / "runs" / "bench.json").exists()
