"""The benchmark runs end to end in quick mode (tiny shapes), so it cannot rot.
Nothing here asserts a speed."""

import json

import pytest

from poolgrad import cli
from poolgrad.bench import numpy_api, suite, timing
from poolgrad.bench.roofline import Roofline


def test_quick_benchmark_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "nested" / "bench.json"
    assert cli.main(["bench", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    layers = {row["layer"] for row in result["rows"]}
    assert layers == {layer.name for layer in suite.SUITE}
    # every layer in both layouts and all three passes
    assert len(result["rows"]) == len(suite.SUITE) * len(suite.LAYOUTS) * len(suite.PASSES)
    for row in result["rows"]:
        assert row["poolgrad_ms"] > 0 and row["roofline_fraction"] > 0
    assert result["machine"]["copy_bandwidth_GBps"] > 0
    assert "VGG 2x2/2" in printed and "results written to" in printed
    # tiny shapes time call overhead: say so, and give no verdict on speed
    assert suite.QUICK_NOTE in printed and "not pooling speed" in printed
    assert "slower than PyTorch" not in printed and "geometric-mean" not in printed
    assert not list(out.parent.glob(".poolgrad-*"))  # the atomic write left no temporary
    # the roofline: bytes of every pass, a bound in ms, and the probe's bandwidths
    roofline = result["machine"]["roofline"]
    assert roofline["read_GBps"] > 0 and roofline["write_GBps"] > 0
    assert roofline["fresh_write_GBps"] > 0
    for row in result["rows"]:
        assert row["read_bytes"] > 0 and row["write_bytes"] > 0
        assert row["roofline_ms"] > 0
    if "torch" not in result["machine"]:
        return
    rows = result["rows"]
    compiled = [(r["layer"], r["layout"], r["pass"]) for r in rows
                if r["compiled_ms"] is not None]
    # quick mode compiles the first layer, NCHW, for all three passes
    assert compiled == [(suite.SUITE[0].name, "NCHW", p) for p in suite.PASSES]
    for row in rows:
        same = [r for r in rows if (r["layer"], r["pass"]) == (row["layer"], row["pass"])]
        candidates = [r[c] for r in same for c in ("torch_ms", "compiled_ms")
                      if r[c] is not None]
        assert row["best_torch_ms"] == min(candidates)
        assert row["speedup_vs_best"] == pytest.approx(row["best_torch_ms"]
                                                       / row["poolgrad_ms"])
        assert ("speedup_vs_compiled" in row) == (row["compiled_ms"] is not None)
        assert (row["compile_s"] is None) == (row["compiled_ms"] is None)


def test_must_move_counts_each_pass_bytes():
    import numpy as np

    layer = suite.Layer("VGG 2x2/2", "max", (1, 1, 4, 4), 2, 2)
    x, y = np.zeros((1, 1, 4, 4), np.float32), np.zeros((1, 1, 2, 2), np.float32)
    # forward: x in, y out; backward: dy and 1 byte of state per output in, dx out
    assert suite.must_move(layer, "forward", x, y) == (64, 16)
    assert suite.must_move(layer, "backward", x, y) == (16 + 4, 64)
    assert suite.must_move(layer, "forward+backward", x, y) == (64 + 16 + 4, 16 + 4 + 64)
    average = suite.Layer("VGG avg 2x2/2", "avg", (1, 1, 4, 4), 2, 2)
    assert suite.must_move(average, "backward", x, y) == (16, 64)  # no state


def test_roofline_bandwidths_of_the_header():

    roofline = Roofline(repeats=1)
    large = 2**20
    bandwidths = roofline.bandwidths(large)
    assert bandwidths["bytes"] == large
    assert min(bandwidths["read_GBps"], bandwidths["write_GBps"],
               bandwidths["fresh_write_GBps"]) > 0
    assert roofline.seconds(4096, large) > 0


def test_roofline_bound_is_the_slower_of_the_fastest_read_and_write():

    # the fastest round of each probe counts, and the faster of the two ways
    samples = {"read by sum": [3.0, 2.0, 5.0], "read by copy": [2.5, 4.0, 9.0],
               "write by fill": [7.0, 6.0, 8.0], "write by copy": [6.5, 9.0, 7.5],
               "write by zeroing": [6.2, 7.0]}
    assert Roofline.bound(samples) == 6.0
    assert Roofline.bound({**samples, "write by zeroing": [5.5]}) == 5.5
    assert Roofline.bound({**samples, "write by fill": [1.0], "write by copy": [1.5],
                           "write by zeroing": [1.2]}) == 2.0
    # the probes are what the bound reads, and they run
    probes = Roofline().probes(4096, 2**16)
    assert set(probes) == set(samples)
    timed = timing.timed_samples(probes, repeats=2)
    assert all(len(times) == 2 and min(times) > 0 for times in timed.values())
    assert Roofline.bound(timed) > 0


def test_summary_compares_with_the_best_pytorch_and_the_roofline():
    def row(layout, pass_name, ours, eager, compiled, fraction):
        return {"layer": "VGG 2x2/2", "layout": layout, "pass": pass_name,
                "poolgrad_ms": ours, "torch_ms": eager, "compiled_ms": compiled,
                "roofline_fraction": fraction}
    rows = [row("NCHW", "forward", 3.0, 30.0, 6.0, 0.9),
            row("channels-last", "forward", 2.0, 4.0, 1.5, 0.79),
            row("NCHW", "backward", 4.0, 8.0, 8.0, 0.49),
            row("channels-last", "backward", 4.0, 8.0, None, 0.5)]
    suite.best_pytorch(rows)
    summary = suite.summarize(rows)
    # compiled channels-last forward (1.5 ms) is the best PyTorch: both forwards lose
    assert summary["rows_slower_than_best_torch"] == ["VGG 2x2/2 NCHW forward",
                                                      "VGG 2x2/2 channels-last forward"]
    assert summary["rows_below_roofline_target"] == [
        "VGG 2x2/2 channels-last forward (79%)", "VGG 2x2/2 NCHW backward (49%)"]
    assert summary["max_forward_geomean_speedup_vs_compiled_nchw"] == pytest.approx(2.0)
    assert rows[0]["speedup_vs_best"] == pytest.approx(0.5)


def test_channels_last_view_is_the_same_logical_array():
    import numpy as np

    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    view = suite.channels_last(x)
    np.testing.assert_array_equal(view, x)
    assert view.strides[1] == x.itemsize  # channels vary fastest in memory


def test_a_pass_that_writes_into_its_input_stops_the_benchmark(monkeypatch):
    import numpy as np

    layer = suite.SUITE[1].quick()
    passes = numpy_api._poolgrad_passes

    def scribbling(layer, x):
        found = passes(layer, x)
        forward = found["forward"]

        def forward_and_scribble():
            x[(0,) * x.ndim] += 1  # what no pass may do
            return forward()
        return {**found, "forward": forward_and_scribble}
    monkeypatch.setattr(numpy_api, "_poolgrad_passes", scribbling)
    base = np.random.default_rng(0).standard_normal(layer.shape, dtype=np.float32)
    with pytest.raises(AssertionError, match="wrote into the input of VGG 2x2/2"):
        numpy_api._time_layer(layer, base, None, 1, (), Roofline(repeats=1), None)


def test_each_timed_call_follows_a_settle_of_the_same_function(monkeypatch):
    monkeypatch.setattr(timing, "SETTLE_SECONDS", 0.005)
    calls = {"a": 0, "b": 0}

    def counter(name):
        def function():
            calls[name] += 1
        return function

    samples = timing.timed_samples({"a": counter("a"), "b": counter("b")}, repeats=2)
    assert {name: len(times) for name, times in samples.items()} == {"a": 2, "b": 2}
    # a warm-up, then per round 5 ms of untimed calls (thousands of these) and one timed
    assert min(calls.values()) > 100
    # one function alone has nothing to settle from: warm-up and timed calls only
    calls["a"] = 0
    timing.timed_samples({"a": counter("a")}, repeats=3)
    assert calls["a"] == 4


def test_torch_input_reads_the_same_memory_as_poolgrad():
    import numpy as np
    torch = pytest.importorskip("torch")

    formats = {2: torch.channels_last, 3: torch.channels_last_3d}
    for spatial in ((7,), (4, 5), (3, 4, 5)):
        x = np.arange(2 * 3 * int(np.prod(spatial)), dtype=np.float32).reshape((2, 3) + spatial)
        for layout in suite.LAYOUTS:
            view = x if layout == "NCHW" else suite.channels_last(x)
            xt = suite.torch_input(view, layout, torch)
            np.testing.assert_array_equal(xt.numpy(), view)
            # no copy: PyTorch and poolgrad time reading the same bytes
            assert xt.data_ptr() == view.ctypes.data
            if layout == "channels-last" and len(spatial) in formats:
                assert xt.is_contiguous(memory_format=formats[len(spatial)])
    # a view PyTorch's formats do not describe is copied into one
    odd = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)[:, :, ::2]
    xt = suite.torch_input(odd, "NCHW", torch)
    assert xt.is_contiguous() and np.array_equal(xt.numpy(), odd)


def test_summary_names_rows_slower_than_pytorch_fastest_layout():
    def row(layout, ours, theirs):
        return {"layer": "VGG 2x2/2", "layout": layout, "pass": "forward",
                "poolgrad_ms": ours, "torch_ms": theirs, "speedup": theirs / ours}
    # PyTorch's best here is channels-last at 2 ms: the NCHW row (3 ms) loses to it
    summary = suite.summarize([row("NCHW", 3.0, 30.0), row("channels-last", 1.0, 2.0)])
    assert summary["rows_slower_than_torch_fastest_layout"] == ["VGG 2x2/2 NCHW forward"]
    assert summary["max_forward_geomean_speedup_nchw"] == pytest.approx(10.0)


def fake_result(quick):
    def row(layer, layout, ours, theirs):
        return {"layer": layer, "shape": [1, 1, 4, 4], "layout": layout, "pass": "forward",
                "poolgrad_ms": ours, "torch_ms": theirs, "speedup": theirs / ours,
                "roofline_fraction": 0.5}
    rows = [row("VGG 2x2/2", "NCHW", 3.0, 30.0), row("VGG 2x2/2", "channels-last", 1.0, 2.0)]
    machine = {"cpu": "test CPU", "threads": 1, "copy_bandwidth_GBps": 10.0}
    return {"machine": machine, "quick": quick, "repeats": 1, "rows": rows,
            "summary": suite.summarize(rows)}


def test_full_run_keeps_its_verdicts_and_quick_mode_gives_none():
    full = numpy_api.format_table(fake_result(quick=False))
    assert "geometric-mean speedup over PyTorch, max forward, NCHW: 10.00x" in full
    assert ("rows slower than PyTorch's faster layout for the same layer and pass: 1 of 2\n"
            "  VGG 2x2/2 NCHW forward") in full
    assert "quick mode" not in full
    quick = numpy_api.format_table(fake_result(quick=True))
    assert "(quick mode: tiny shapes, see the note below)" in quick.splitlines()[0]
    assert quick.endswith(suite.QUICK_NOTE)
    assert "geometric-mean" not in quick and "slower" not in quick
    # the table itself is the same in both modes
    assert quick.splitlines()[1:5] == full.splitlines()[1:5]


@pytest.mark.parametrize("out, message", [
    ("folder", "cannot write the output file {out}: it is a folder; give a file name"),
    ("folder/", "cannot write the output file {out}: it is a folder; give a file name"),
    ("a-file/bench.json",
     "cannot write the output file {out}: {tmp}/a-file is a file, not a folder"),
    ("", "cannot write the output file '': the path is empty"),
])
def test_bad_out_is_refused_before_any_timing(tmp_path, capsys, out, message):
    (tmp_path / "folder").mkdir()
    (tmp_path / "a-file").write_text("not a folder")
    out = str(tmp_path / out) + ("/" if out.endswith("/") else "") if out else ""
    assert cli.main(["bench", "--quick", "--out", out]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"poolgrad bench: error: {message.format(out=out, tmp=tmp_path)}\n"
    assert captured.out == ""  # refused before the suite ran (it reports each layer)
    assert not list(tmp_path.rglob(".poolgrad-*"))


def test_quick_torch_benchmark_writes_table_and_json(tmp_path, capsys):
    pytest.importorskip("torch")
    from poolgrad.bench import torch_api

    out = tmp_path / "torch.json"
    assert cli.main(["bench", "--torch", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["mode"] == "torch" and result["quick"] and result["repeats"] == 1
    # the machine as the NumPy suite records it, and PyTorch's version
    for key in ("cpu", "cpu_family", "simd", "cores", "threads", "copy_bandwidth_GBps",
                "numpy", "numba", "torch"):
        assert key in result["machine"]
    # every layer in both layouts and both passes; quick mode compiles one layer, NCHW
    rows = result["rows"]
    assert len(rows) == len(suite.SUITE) * len(suite.LAYOUTS) * len(torch_api.PASSES)
    assert {row["layer"] for row in rows} == {layer.name for layer in suite.SUITE}
    compiled = [row for row in rows if row["compiled_ms"] is not None]
    assert [(r["layer"], r["layout"], r["pass"]) for r in compiled] == [
        (suite.SUITE[0].name, "NCHW", "forward"),
        (suite.SUITE[0].name, "NCHW", "forward+backward")]
    for row in rows:
        assert row["poolgrad_torch_ms"] > 0 and row["eager_ms"] > 0
        assert row["speedup_vs_eager"] == pytest.approx(row["eager_ms"]
                                                        / row["poolgrad_torch_ms"])
        assert (row["speedup_vs_compiled"] is None) == (row["compiled_ms"] is None)
        assert (row["compile_s"] is None) == (row["compiled_ms"] is None)
    for baseline in ("eager", "compiled"):
        assert set(result["summary"][baseline]) == {
            "max_forward_geomean_speedup_nchw", "max_forward_backward_geomean_speedup_nchw",
            "all_forward_geomean_speedup_nchw", "all_forward_backward_geomean_speedup_nchw",
            "rows_slower_than_fastest_layout"}
    overhead = result["call_overhead"]
    assert overhead["shape"] == [8, 16, 32, 32]
    for pass_name in torch_api.PASSES:
        assert set(overhead["us"][pass_name]) == {"poolgrad.torch", "numpy", "eager"}
    large = result["large_layer_overhead"]
    assert large["layer"] == "VGG 2x2/2" and len(large["rows"]) == 4
    assert all(row["numpy_ms"] > 0 and "overhead" in row for row in large["rows"])
    assert result["model_steps"] is None  # only with --models
    assert "poolgrad.torch ms" in printed and "per call, max pool 2x2/2" in printed
    assert suite.QUICK_NOTE in printed and "geometric-mean" not in printed
    assert not list(out.parent.glob(".poolgrad-*"))


def test_model_steps_time_both_poolings(tmp_path):
    torch = pytest.importorskip("torch")
    from poolgrad.bench import torch_api
    from poolgrad.torch import zoo

    # ResNet-18 alone: VGG-11's 133 million parameters take seconds to build
    steps = torch_api.model_steps(torch_api.import_front_end(), torch, quick=True, repeats=1,
                                    models={"resnet18": zoo.resnet18})
    assert steps["batch"] == 2 and steps["input"] == [3, 32, 32]
    (model,) = steps["models"]
    assert model["model"] == "resnet18" and model["pooling_layers"] == 2
    assert set(model["step_ms"]) == set(torch_api.POOLING)
    assert set(model["pooling_alone_ms"]) == set(torch_api.POOLING)
    assert 0 < model["pooling_share_of_step"]
    table = torch_api._format_models(steps)
    assert any(line.lstrip().startswith("resnet18") for line in table)


def test_models_without_torch_and_torch_missing_are_refused(tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "bench.json")
    assert cli.main(["bench", "--models", "--quick", "--out", out]) == 2
    assert "--models times models through poolgrad.torch: give --torch too" in (
        capsys.readouterr().err)
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # as if not installed
    assert cli.main(["bench", "--torch", "--quick", "--out", out]) == 2
    assert "poolgrad bench --torch needs PyTorch: pip install torch" in capsys.readouterr().err


def test_torch_summary_and_verdicts():
    from poolgrad.bench import torch_api

    def row(layout, pass_name, ours, eager, compiled=None):
        return {"layer": "VGG 2x2/2", "shape": [1, 1, 4, 4], "layout": layout,
                "pass": pass_name, "compile_s": None, "poolgrad_torch_ms": ours,
                "eager_ms": eager, "compiled_ms": compiled,
                "speedup_vs_eager": eager / ours,
                "speedup_vs_compiled": compiled / ours if compiled else None}
    rows = [row("NCHW", "forward", 1.0, 10.0, 0.5), row("channels-last", "forward", 2.0, 1.5),
            row("NCHW", "forward+backward", 2.0, 8.0, 4.0),
            row("channels-last", "forward+backward", 2.0, 4.0)]
    summary = torch_api.summarize(rows)
    assert summary["eager"]["max_forward_geomean_speedup_nchw"] == pytest.approx(10.0)
    assert summary["eager"]["all_forward_backward_geomean_speedup_nchw"] == pytest.approx(4.0)
    # eager's faster layout for the forward is channels-last (1.5 ms): 2.0 ms loses to it
    assert summary["eager"]["rows_slower_than_fastest_layout"] == [
        "VGG 2x2/2 channels-last forward"]
    # rows without a compiled time are left out, not counted as faster
    assert summary["compiled"]["rows_slower_than_fastest_layout"] == ["VGG 2x2/2 NCHW forward"]
    assert summary["compiled"]["max_forward_backward_geomean_speedup_nchw"] == pytest.approx(2)
    lines = torch_api._format_summary(summary, len(rows))
    assert "geometric-mean speedup over eager PyTorch, max forward, NCHW: 10.00x" in lines
    assert ("rows slower than eager PyTorch's faster layout for the same layer and pass: "
            "1 of 4\n  VGG 2x2/2 channels-last forward") in lines
