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


# ----------------------------------------------------------------- bench --kinds


def _kinds_module():
    pytest.importorskip("torch")
    from poolgrad.bench import kinds
    return kinds


def _kind(name):
    return next(kind for kind in _kinds_module().KINDS if kind.name == name)


def test_quick_kinds_benchmark_writes_table_and_json(tmp_path, capsys, monkeypatch):
    kinds = _kinds_module()
    # a compile takes seconds: the compiled reference has a test of its own
    monkeypatch.setattr(kinds, "_QUICK_COMPILED_KINDS", 0)
    monkeypatch.setattr(timing, "SETTLE_SECONDS", 0.001)
    out = tmp_path / "kinds.json"
    assert cli.main(["bench", "--kinds", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["mode"] == "kinds" and result["quick"] and result["repeats"] == 1
    assert result["shape"] == list(kinds.QUICK_SHAPE) and "torch" in result["machine"]
    # every kind in both layouts and both passes, in that order
    rows = result["rows"]
    assert [(r["kind"], r["settings"], r["layout"], r["pass"]) for r in rows] == [
        (kind.function, kind.settings, layout, pass_name) for kind in kinds.KINDS
        for layout in suite.LAYOUTS for pass_name in kinds.PASSES]
    for row in rows:
        assert min(row["numpy_ms"], row["poolgrad_torch_ms"], row["eager_ms"]) > 0
        assert row["compiled_ms"] is None and row["compile_s"] is None
        references = {name: row[f"{name}_ms"] for name in kinds.REFERENCES
                      if row[f"{name}_ms"] is not None
                      and not (name == "kornia" and row["kornia_differs"])}
        assert row["best_reference_ms"] == references[row["best_reference"]]
        assert row["best_reference_ms"] == min(references.values())
        assert row["speedup_numpy"] == pytest.approx(row["best_reference_ms"] / row["numpy_ms"])
        assert row["torch_overhead"] == pytest.approx(row["poolgrad_torch_ms"]
                                                      / row["numpy_ms"] - 1)
    if result["machine"]["kornia"]:
        # kornia times the four blur rows; it is a reference where it pads as poolgrad
        with_kornia = {(r["kind"], r["settings"], r["kornia_differs"]) for r in rows
                       if r["kornia_ms"] is not None}
        assert with_kornia == {
            ("blur_pool", "3-tap/2", kinds.KORNIA_PADS_ZEROS), ("blur_pool", "3-tap/2 zeros", None),
            ("max_blur_pool", "2x2 3-tap/2", kinds.KORNIA_PADS_ZEROS),
            ("max_blur_pool", "2x2 3-tap/2 zeros", None)}
        assert f"*: {kinds.KORNIA_PADS_ZEROS}" in printed
    assert "attention_pool global 1 query" in printed and "results written to" in printed
    assert suite.QUICK_NOTE in printed and "geometric-mean" not in printed
    assert not list(out.parent.glob(".poolgrad-*"))


def test_each_kinds_contender_gets_dy_stored_as_its_own_output(monkeypatch):
    """APS's reference gathers into an NCHW y from a channels-last x, poolgrad's ops
    return channels-last ones: a dy stored as the reference's would charge poolgrad.torch
    a layout copy that no reference pays (its channels-last forward+backward took 10.7
    against NumPy's 6.3 ms that way)."""
    torch = pytest.importorskip("torch")
    kinds = _kinds_module()
    monkeypatch.setattr(kinds, "_QUICK_COMPILED_KINDS", 0)
    monkeypatch.setattr(timing, "SETTLE_SECONDS", 0.001)
    calls, passes = [], kinds.torch_api.passes

    def recording(fn, x, dy, torch):
        calls.append((fn, x, dy))
        return passes(fn, x, dy, torch)

    monkeypatch.setattr(kinds.torch_api, "passes", recording)
    kinds.run(quick=True, kinds=(_kind("aps_pool stride 2"),))
    layouts = set()
    for fn, x, dy in calls:
        with torch.no_grad():
            y = fn(x)
        assert (dy.shape, dy.stride()) == (y.shape, y.stride())
        layouts.add((x.is_contiguous(), y.is_contiguous()))
    # the case above happened: a channels-last x with an NCHW y and with a channels-last y
    assert {(False, True), (False, False)} <= layouts


@pytest.mark.parametrize("name", [
    "blur_pool 3-tap/2", "blur_pool 3-tap/2 zeros", "max_blur_pool 2x2 3-tap/2",
    "max_blur_pool 2x2 3-tap/2 zeros", "avg_blur_pool 2x2 3-tap/2", "soft_pool 2x2",
    "stochastic_pool 2x2 training", "stochastic_pool 2x2 evaluation",
    "fractional_max_pool k2 ratio 0.5", "gem_pool global p3", "gem_pool 2x2 p3",
    "gem_pool 2x2 learned p",
    "mixed_pool 2x2 alpha 0.5", "gated_pool 2x2", "attention_pool global 1 query",
    "aps_pool stride 2", "max_aps_pool 2x2/2"])
def test_each_plain_pytorch_reference_is_poolgrads_function(name):
    """Values and input gradients (a random dy) of each reference against both of
    poolgrad's APIs, in float64 on a non-square input; the random kinds given the draws
    each API makes from the same seed."""
    import numpy as np
    import torch

    import poolgrad as pg
    kinds = _kinds_module()
    front_end = kinds.torch_api.import_front_end()
    kind = _kind(name)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 8, 10))
    if kind.non_negative:
        x = np.maximum(x, 0)
        x[0, 0, :2, :2] = 0  # a window of zeros: the draw's fallback
    params = kind.params(3, rng, x.dtype) if kind.params else ()
    tensors = tuple(torch.from_numpy(p) for p in params)
    op, args, kwargs = kinds.numpy_call(kind, params, 7)
    y, pullback = pg.vjp(op, x, *args, **kwargs)
    dy = rng.standard_normal(y.shape)
    dx = pullback(dy)
    leaf = torch.tensor(x, requires_grad=True)
    y_torch = kinds.front_end_call(kind, front_end, tensors, 7)(leaf)
    y_torch.backward(torch.from_numpy(dy))
    ours = {"numpy": (y, dx[0] if isinstance(dx, tuple) else dx),
            "torch": (y_torch.detach().numpy(), leaf.grad.numpy())}
    for like, (values, gradient) in ours.items():
        draws = kind.draws(torch.from_numpy(x), 7, like) if kind.draws else None
        xt = torch.tensor(x, requires_grad=True)
        expected = kind.reference(xt, draws, *tensors)
        expected.backward(torch.from_numpy(dy))
        np.testing.assert_allclose(values, expected.detach().numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(gradient, xt.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_the_stochastic_reference_falls_back_as_poolgrad_draws():
    torch = pytest.importorskip("torch")
    reference = _kind("stochastic_pool 2x2 training").reference
    x = torch.tensor([[[[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]]])
    # u = 1 (a draw rounded up to x's float32): no running sum exceeds u * S, so the last
    # positive tap; a window of zeros gives its first
    assert reference(x, torch.ones(1, 1, 1, 2, dtype=torch.float32)).tolist() == [[[[2.0, 0.0]]]]
    # the draw picks the first tap whose running sum exceeds u * S: 1 > 0.3 * 3
    assert reference(x, torch.full((1, 1, 1, 2), 0.3, dtype=torch.float64)).tolist() == [
        [[[1.0, 0.0]]]]


def test_the_kinds_check_refuses_another_function_and_kornia_differs_where_marked():
    import dataclasses

    import numpy as np
    kornia = pytest.importorskip("kornia")
    kinds = _kinds_module()
    front_end = kinds.torch_api.import_front_end()
    x = np.random.default_rng(0).standard_normal(kinds.QUICK_SHAPE, dtype=np.float32)
    reflect, zeros = _kind("blur_pool 3-tap/2"), _kind("blur_pool 3-tap/2 zeros")
    layer = reflect.kornia(kornia)
    kinds.check_agree(reflect, x, (), front_end, layer)  # kornia left out: marked
    kinds.check_agree(zeros, x, (), front_end, layer)  # kornia compared, and equal
    # the mark is true: kornia's layer is not the reflecting blur
    with pytest.raises(AssertionError, match="kornia and the plain PyTorch reference "
                                             "disagree on blur_pool 3-tap/2 NCHW, forward"):
        kinds.check_agree(dataclasses.replace(reflect, kornia_differs=None), x, (), front_end,
                          layer)
    with pytest.raises(AssertionError, match="poolgrad's NumPy API and the plain PyTorch "
                                             "reference disagree on blur_pool 3-tap/2 "
                                             "channels-last, forward"):
        kinds.check_agree(dataclasses.replace(reflect, reference=zeros.reference),
                          suite.channels_last(x), (), front_end, layout="channels-last")


def test_the_compiled_reference_draws_fresh_and_is_checked(monkeypatch):
    import numpy as np
    import torch
    kinds = _kinds_module()
    kind = _kind("stochastic_pool 2x2 training")
    x = torch.from_numpy(np.abs(np.random.default_rng(0).standard_normal(
        kinds.QUICK_SHAPE, dtype=np.float32)))
    dy = torch.ones(2, 3, 4, 4)
    forward, seconds = kinds._compile(kind, (), x, dy, "forward")
    assert seconds > 0
    first, second = forward(), forward()
    assert first.shape == (2, 3, 4, 4) and not torch.equal(first, second)  # fresh draws
    # a compiled graph that computes something else stops the benchmark
    monkeypatch.setattr(suite, "compile_static",
                        lambda function, torch: lambda t, u: function(t, u) + 1)
    with pytest.raises(AssertionError, match="compiled and eager PyTorch disagree on "
                                             "stochastic_pool 2x2 training, forward"):
        kinds._compile(kind, (), x, dy, "forward")


def test_a_compiled_reference_marked_as_another_function_is_timed_but_no_reference():
    """The k3 fractional row: torch.compile'd PyTorch places some windows elsewhere than
    eager (the run that found it stopped on the check), so its time is shown, marked,
    and the best reference is taken from the others."""
    kinds = _kinds_module()
    kind = _kind("fractional_max_pool k3 ratio 0.5")
    assert kind.compiled_differs == kinds.COMPILED_FRACTIONAL_WINDOWS
    seconds = {"numpy": 2e-3, "poolgrad.torch": 2e-3, "eager": 8e-3, "compiled": 1e-3}
    row = kinds._row(kind, "NCHW", "forward", seconds, 1.0)
    assert row["best_reference"] == "eager" and row["speedup_numpy"] == pytest.approx(4.0)
    assert row["compiled_differs"] == kinds.COMPILED_FRACTIONAL_WINDOWS
    plain = kinds._row(_kind("fractional_max_pool k2 ratio 0.5"), "NCHW", "forward",
                       seconds, 1.0)
    assert plain["best_reference"] == "compiled" and plain["compiled_differs"] is None
    rows = [row, plain]
    machine = {"cpu": "test CPU", "threads": 2, "copy_bandwidth_GBps": 10.0}
    table = kinds.format_table({"machine": machine, "quick": False, "repeats": 5,
                                "shape": [32, 64, 56, 56], "rows": rows,
                                "summary": kinds.summarize(rows)})
    assert table.count("    1.00*") == 1 and "    1.00 " in table
    assert f"*: {kinds.COMPILED_FRACTIONAL_WINDOWS}: timed, no reference" in table


def test_kinds_best_reference_and_verdicts():
    kinds = _kinds_module()
    seconds = {"numpy": 2e-3, "poolgrad.torch": 4e-3, "eager": 3e-3, "compiled": 2.5e-3,
               "kornia": 1e-3}
    # kornia is fastest, but on the reflecting blur it computes another function
    marked = kinds._row(_kind("blur_pool 3-tap/2"), "NCHW", "forward", seconds, 1.0)
    assert marked["best_reference"] == "compiled"
    assert marked["speedup_numpy"] == pytest.approx(1.25)
    assert marked["speedup_torch"] == pytest.approx(0.625)
    same = kinds._row(_kind("blur_pool 3-tap/2 zeros"), "NCHW", "forward", seconds, 1.0)
    assert same["best_reference"] == "kornia" and same["speedup_numpy"] == pytest.approx(0.5)
    assert same["torch_overhead"] == pytest.approx(1.0)
    rows = [marked, same]
    machine = {"cpu": "test CPU", "threads": 2, "copy_bandwidth_GBps": 10.0}
    result = {"machine": machine, "quick": False, "repeats": 5, "shape": [32, 64, 56, 56],
              "rows": rows, "summary": kinds.summarize(rows)}
    table = kinds.format_table(result)
    assert "    1.00*" in table and "    1.00 " in table  # kornia marked on one row only
    assert ("poolgrad's NumPy API, forward: geometric-mean speedup over the best reference "
            "0.79x; slower in 1 of 2 rows\n  blur_pool 3-tap/2 zeros NCHW") in table
    assert "poolgrad.torch, forward: " in table and "slower in 2 of 2 rows" in table
    assert "quick mode" not in table
    quick = kinds.format_table({**result, "quick": True})
    assert quick.endswith(suite.QUICK_NOTE) and "geometric-mean" not in quick


@pytest.mark.parametrize("flags, message", [
    (["--device", "cuda"], "--kinds times the CPU kernels: leave out --device cuda"),
    (["--models"], "--kinds times no models: leave out --models"),
    (["--torch"], "--kinds times poolgrad.torch already: leave out --torch"),
])
def test_kinds_with_another_mode_is_refused(tmp_path, capsys, flags, message):
    out = tmp_path / "kinds.json"
    assert cli.main(["bench", "--kinds", "--quick", *flags, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"poolgrad bench: error: {message}\n" and captured.out == ""
    assert not out.exists()
