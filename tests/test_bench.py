"""The benchmark runs end to end in quick mode (tiny shapes), so it cannot rot.
Nothing here asserts a speed."""

import json

import pytest

from poolgrad import bench, cli


def test_quick_benchmark_writes_table_and_json(tmp_path, capsys):
    out = tmp_path / "nested" / "bench.json"
    assert cli.main(["bench", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    layers = {row["layer"] for row in result["rows"]}
    assert layers == {layer.name for layer in bench.SUITE}
    # every layer in both layouts and all three passes
    assert len(result["rows"]) == len(bench.SUITE) * len(bench.LAYOUTS) * len(bench.PASSES)
    for row in result["rows"]:
        assert row["poolgrad_ms"] > 0 and row["roofline_fraction"] > 0
    assert result["machine"]["copy_bandwidth_GBps"] > 0
    assert "VGG 2x2/2" in printed and "results written to" in printed
    # tiny shapes time call overhead: say so, and give no verdict on speed
    assert bench.QUICK_NOTE in printed and "not pooling speed" in printed
    assert "slower than PyTorch" not in printed and "geometric-mean" not in printed
    assert not list(out.parent.glob(".poolgrad-*"))  # the atomic write left no temporary


def test_channels_last_view_is_the_same_logical_array():
    import numpy as np

    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    view = bench.channels_last(x)
    np.testing.assert_array_equal(view, x)
    assert view.strides[1] == x.itemsize  # channels vary fastest in memory


def test_summary_names_rows_slower_than_pytorch_fastest_layout():
    def row(layout, ours, theirs):
        return {"layer": "VGG 2x2/2", "layout": layout, "pass": "forward",
                "poolgrad_ms": ours, "torch_ms": theirs, "speedup": theirs / ours}
    # PyTorch's best here is channels-last at 2 ms: the NCHW row (3 ms) loses to it
    summary = bench.summarize([row("NCHW", 3.0, 30.0), row("channels-last", 1.0, 2.0)])
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
            "summary": bench.summarize(rows)}


def test_full_run_keeps_its_verdicts_and_quick_mode_gives_none():
    full = bench.format_table(fake_result(quick=False))
    assert "geometric-mean speedup over PyTorch, max forward, NCHW: 10.00x" in full
    assert ("rows slower than PyTorch's faster layout for the same layer and pass: 1 of 2\n"
            "  VGG 2x2/2 NCHW forward") in full
    assert "quick mode" not in full
    quick = bench.format_table(fake_result(quick=True))
    assert "(quick mode: tiny shapes, see the note below)" in quick.splitlines()[0]
    assert quick.endswith(bench.QUICK_NOTE)
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
