"""``poolgrad bench --device cuda``: its pipeline, run on the CPU (the same code with the
wall clock for CUDA events), and its refusals. Its figures need a GPU."""

import json

import pytest

torch = pytest.importorskip("torch")

from poolgrad import cli  # noqa: E402
from poolgrad.bench import cuda as bench_cuda  # noqa: E402
from poolgrad.bench import suite  # noqa: E402

LAYERS = (suite.SUITE[0], suite.SUITE[7])  # a max and an average layer


@pytest.fixture(scope="module")
def quick_result():
    return bench_cuda.run(quick=True, device="cpu", layers=LAYERS)


def test_every_layer_layout_dtype_and_pass_is_timed_against_both_baselines(quick_result):
    rows = quick_result["rows"]
    assert len(rows) == len(LAYERS) * 2 * 2 * 3
    assert {(r["layer"], r["layout"], r["dtype"], r["pass"]) for r in rows} == {
        (layer.name, layout, dtype, pass_name) for layer in LAYERS
        for layout in suite.LAYOUTS for dtype in bench_cuda.DTYPES
        for pass_name in bench_cuda.PASSES}
    for row in rows:
        assert row["poolgrad_ms"] > 0 and row["eager_ms"] > 0
        assert row["speedup_vs_eager"] == pytest.approx(row["eager_ms"] / row["poolgrad_ms"])
        assert row["best_torch_ms"] <= row["eager_ms"]
    # quick mode compiles one variant, so that the path runs
    compiled = [r for r in rows if r["compiled_ms"] is not None]
    assert {(r["layer"], r["layout"], r["dtype"]) for r in compiled} == {
        (LAYERS[0].name, "NCHW", "float32")}
    assert all(r["compile_s"] > 0 for r in compiled)


def test_the_roofline_is_the_bytes_at_the_copy_bandwidth(quick_result):
    bandwidth = quick_result["machine"]["copy_bandwidth_GBps"] * 1e9
    row = next(r for r in quick_result["rows"] if r["layer"] == LAYERS[0].name
               and r["pass"] == "forward" and r["dtype"] == "float32")
    x_bytes = 4 * torch.Size(LAYERS[0].quick().shape).numel()
    y = torch.nn.functional.max_pool2d(torch.zeros(LAYERS[0].quick().shape), 3, 2)
    expected_ms = (x_bytes + 4 * y.numel()) / bandwidth * 1e3
    assert row["roofline_ms"] == pytest.approx(expected_ms)
    assert row["roofline_fraction"] == pytest.approx(row["roofline_ms"] / row["poolgrad_ms"])


def test_backwards_record_whether_two_runs_gave_the_same_bits(quick_result):
    backward = [r for r in quick_result["rows"] if r["pass"] == "backward"]
    assert backward and all(r["poolgrad_deterministic"] is True for r in backward)
    assert quick_result["summary"]["nondeterministic_backwards"]["poolgrad"] == []
    others = [r for r in quick_result["rows"] if r["pass"] != "backward"]
    assert all("poolgrad_deterministic" not in r for r in others)


def test_summary_and_table(quick_result):
    summary = quick_result["summary"]
    assert len(summary["bfloat16_speedup_over_float32"]) == len(LAYERS) * 2 * 3
    slower = [r for r in quick_result["rows"] if r["speedup_vs_best"] < 1]
    assert len(summary["rows_slower_than_best_torch"]) == len(slower)
    table = bench_cuda.format_table(quick_result)
    assert table.count("\n") > len(quick_result["rows"])
    assert suite.QUICK_NOTE in table  # quick mode gives no verdict


def test_a_wrong_result_stops_the_benchmark(monkeypatch):
    """Every implementation is checked against eager PyTorch before it is timed."""
    from poolgrad import torch as front_end
    monkeypatch.setattr(front_end, "max_pool2d", lambda x, *args: torch.nn.functional.max_pool2d(
        x, *args) + 1)
    with pytest.raises(AssertionError, match="poolgrad and eager PyTorch disagree"):
        bench_cuda.run(quick=True, device="cpu", layers=(suite.SUITE[0],))


def test_a_wrong_baseline_is_timed_and_marked(monkeypatch):
    """PyTorch's float64 CPU result judges where poolgrad and the baseline disagree: a
    baseline wrong on channels-last inputs alone (as torch 2.11's CUDA avg_pool2d
    backward with padding, pytorch#188344) is timed, kept out of the ratios and marked;
    poolgrad's rows go on."""
    real = torch.nn.functional.max_pool2d

    def wrong_on_channels_last(x, *args, **kwargs):
        y = real(x, *args, **kwargs)
        return y * 2 if x.dim() == 4 and not x.is_contiguous() else y

    monkeypatch.setattr(torch.nn.functional, "max_pool2d", wrong_on_channels_last)
    result = bench_cuda.run(quick=True, device="cpu", layers=(suite.SUITE[0],))
    for row in result["rows"]:
        marked = row["layout"] == "channels-last"
        assert row["wrong_results"] == (["eager"] if marked else [])
        assert (row["eager_ms"] is None) == marked
        assert (row.get("eager_wrong_result_ms", 0) > 0) == marked
    assert len(result["summary"]["wrong_pytorch_results"]) == 6
    assert "eager WRONG" in bench_cuda.format_table({**result, "quick": False})


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_without_a_gpu_the_cli_says_so_in_one_line(tmp_path, capsys):
    out = tmp_path / "cuda.json"
    assert cli.main(["bench", "--device", "cuda", "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert "needs a CUDA device" in error and "\n" not in error
    assert not out.exists()
    assert cli.main(["bench", "--device", "cuda", "--torch", "--out", str(out)]) == 2
    assert "leave out --torch" in capsys.readouterr().err


def test_the_result_is_json(quick_result, tmp_path):
    path = tmp_path / "r.json"
    suite.write_json(quick_result, str(path))
    assert json.loads(path.read_text())["mode"] == "cuda"
