"""poolgrad explain: its numbers are the core's pullback, the classic 4x4 example is
right by hand, every mode writes its figures, and bad arguments get one clear line."""

import re
import sys

import numpy as np
import pytest
from in_process import run_command

import poolgrad as pg
from poolgrad import cli, explain
from poolgrad.explain import figures

PNG = b"\x89PNG\r\n\x1a\n"


def test_golden_four_by_four():
    routings = explain.classic_routings()
    np.testing.assert_array_equal(routings["max"].y[0], [[4, 5], [6, 2]])
    expected = np.zeros((4, 4))
    # each window's winner: 4, 5, 6, and the first of the tied 2s (row-major)
    expected[1, 0] = expected[1, 3] = expected[3, 1] = expected[2, 2] = 1
    np.testing.assert_array_equal(routings["max"].dx[0], expected)
    np.testing.assert_array_equal(routings["avg"].dx[0], np.full((4, 4), 0.25))
    first = np.zeros((4, 4))
    first[0, 0] = first[0, 3] = first[2, 0] = first[2, 2] = 1
    np.testing.assert_array_equal(routings["ties first"].dx[0], first)
    split = np.array([[1 / 3, 1 / 3, 0, 0.5], [0, 1 / 3, 0.5, 0],
                      [0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]])
    np.testing.assert_allclose(routings["ties split"].dx[0], split, rtol=1e-15)
    assert routings["max"].coverage.tolist() == np.ones((4, 4)).tolist()


@pytest.mark.parametrize("kind, kwargs", [
    ("max", {"kernel": 3, "stride": 2, "padding": 1}),
    ("max", {"kernel": 2, "ties": "split"}),
    ("avg", {"kernel": 3, "stride": 2, "padding": 1}),
    ("lp", {"kernel": 2, "stride": 1, "p": 3.0}),
])
def test_tables_are_the_core_pullback(kind, kwargs):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, (6, 7, 9)).astype(np.float64)  # ties included
    dy_shape = route_shape = explain.route(x[:1], kind, **kwargs).y.shape[1:]
    dy = rng.integers(1, 10, (6,) + dy_shape).astype(np.float64)
    routing = explain.route(x, kind, dy=dy, **kwargs)

    op = {"max": pg.max_pool, "avg": pg.avg_pool, "lp": pg.lp_pool}[kind]
    options = {"kernel_size": kwargs["kernel"], "stride": kwargs.get("stride"),
               "padding": kwargs.get("padding", 0)}
    if kind == "max":
        options["ties"] = kwargs.get("ties", "first")
    if kind == "lp":
        options["p"] = kwargs["p"]
    y, pullback = pg.vjp(op, x[:, None], **options)
    dx = pullback(dy[:, None])[:, 0]
    assert routing.y.shape[1:] == route_shape
    np.testing.assert_array_equal(routing.y, y[:, 0])
    np.testing.assert_array_equal(routing.dx, dx)
    np.testing.assert_array_equal(routing.senders, (dx != 0).sum(axis=0))
    np.testing.assert_array_equal(routing.batch_gradient, dx.sum(axis=0))
    assert routing.summary()["batch_equals_examples_alone"]

    # coverage: count, for each position, the windows (by their start and size) holding it
    k, s, p = kwargs["kernel"], kwargs.get("stride") or kwargs["kernel"], kwargs.get("padding", 0)
    coverage = np.zeros(x.shape[1:], dtype=int)
    for oh in range(y.shape[2]):
        for ow in range(y.shape[3]):
            rows = slice(max(oh * s - p, 0), max(oh * s - p + k, 0))
            cols = slice(max(ow * s - p, 0), max(ow * s - p + k, 0))
            coverage[rows, cols] += 1
    np.testing.assert_array_equal(routing.coverage, coverage)


def test_one_dimensional_sequences():
    x = np.random.default_rng(1).standard_normal((5, 12))
    routing = explain.route(x, "max", kernel=3, stride=2)
    y, pullback = pg.vjp(pg.max_pool, x[:, None], 3, 2)
    np.testing.assert_array_equal(routing.y[:, 0], y[:, 0])
    np.testing.assert_array_equal(routing.dx[:, 0], pullback(np.ones_like(y))[:, 0])


def drawn_figures(monkeypatch, routing, tmp_path):
    """The three routing figures of ``routing``, laid out as saved, with a renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    drawn, save = [], figures.save

    def keep(figure, path, **options):
        drawn.append(figure)
        return save(figure, path, **options)

    monkeypatch.setattr(figures, "save", keep)
    explain.draw_examples(routing, str(tmp_path / "examples.png"), 3)
    explain.draw_batch(routing, str(tmp_path / "batch.png"))
    explain.draw_overlap(routing, str(tmp_path / "overlap.png"))
    for figure in drawn:
        FigureCanvasAgg(figure).draw()
    return drawn


def assert_readable(figure):
    """Every panel at least half an inch high; no two numbers (or a number and a tick
    label) of a panel on top of each other."""
    renderer = figure.canvas.get_renderer()
    numbered = 0
    for axes in figure.axes:
        if axes.get_label() == "<colorbar>":
            continue
        assert axes.get_window_extent(renderer).height / figure.dpi >= 0.5, axes.get_title()
        texts = [t for t in axes.texts + axes.get_xticklabels()
                 if t.get_visible() and t.get_text()]
        boxes = [t.get_window_extent(renderer) for t in texts]
        numbered += len(axes.texts)
        for i, a in enumerate(boxes):
            for j in range(i):
                overlap = min(a.x1, boxes[j].x1) - max(a.x0, boxes[j].x0), \
                          min(a.y1, boxes[j].y1) - max(a.y0, boxes[j].y0)
                assert min(overlap) <= 0.5, (axes.get_title(), texts[i].get_text(),
                                             texts[j].get_text())
    return numbered


@pytest.mark.parametrize("kind, kwargs, length", [
    ("max", {"kernel": 2}, 40),  # poolgrad explain --source mnist1d
    ("max", {"kernel": 3, "stride": 1, "ties": "split"}, 40),
    ("avg", {"kernel": 3, "stride": 2, "padding": 1}, 40),
    ("lp", {"kernel": 4, "p": 3.0}, 40),
    ("max", {"kernel": 2}, 64),
    ("avg", {"kernel": 5, "stride": 3}, 200),  # too long for numbers: bars only
])
def test_one_dimensional_figures_are_readable(monkeypatch, tmp_path, kind, kwargs, length):
    rng = np.random.default_rng(length)
    x = rng.standard_normal((16, length)).round(2)
    shape = explain.route(x[:1], kind, **kwargs).y.shape[1:]
    routing = explain.route(x, kind, dy=rng.integers(1, 10, (16,) + shape), **kwargs)
    assert routing.one_d
    figures = drawn_figures(monkeypatch, routing, tmp_path)
    numbers = [assert_readable(figure) for figure in figures]
    if length <= 64:  # the numbers are there, one per window and per reached position
        windows = routing.y.shape[2]
        reached = int((routing.dx[:3] != 0).sum())
        assert numbers[0] == 3 * windows + reached
    # 1-d data is drawn along the sequence, not as one-cell-high grids
    assert not any(axes.images for figure in figures for axes in figure.axes)


def test_two_dimensional_figures_are_still_grids(monkeypatch, tmp_path):
    x = np.random.default_rng(5).standard_normal((16, 6, 6)).round(2)
    routing = explain.route(x, "max", kernel=2)
    assert not routing.one_d
    for figure in drawn_figures(monkeypatch, routing, tmp_path):
        assert assert_readable(figure) > 0
        assert all(axes.images for axes in figure.axes if axes.get_label() != "<colorbar>")


def test_invariance_is_local_to_the_window():
    x = np.random.default_rng(2).random((20, 8, 8))
    rows = explain.invariance(x, kernel=2)
    assert [r["shift"] for r in rows] == [0, 1, 2, 3, 4]
    assert rows[0]["max"] == rows[0]["avg"] == 1.0
    # a one-column shift keeps some window maxima, never (almost) an average of
    # random values; whole-window shifts move every output to another cell
    assert rows[1]["max"] > rows[1]["avg"]
    assert rows[1]["max"] > rows[4]["max"]


def run_cli(*args):
    return run_command("explain", *args)


def assert_figures(folder, names):
    for name in names:
        assert (folder / name).read_bytes()[:8] == PNG, name
        assert (folder / name).stat().st_size > 10_000, name


def test_default_set_on_digits_and_the_printed_numbers(tmp_path, capsys):
    pytest.importorskip("sklearn")
    assert cli.main(["explain", "--out", str(tmp_path), "--no-color"]) == 0
    out = capsys.readouterr().out
    assert_figures(tmp_path, ["examples.png", "batch.png", "overlap.png", "max_vs_avg.png"])
    x, _, _ = explain.load_batch("digits", 16, 0)
    summary = explain.route(x, "max").summary()
    assert (f"each example sends gradient to {summary['mean_positions_reached_per_example']:.1f}"
            f" of 64 positions; the batch reaches {summary['positions_reached_by_batch']}") in out
    assert "batch pullback == each example alone: True" in out


@pytest.mark.parametrize("args", [
    ["--source", "random", "--kind", "avg", "--kernel", "3", "--stride", "2", "--padding", "1"],
    ["--source", "random", "--kind", "lp", "--p", "3"],
    ["--source", "random", "--ties", "split", "--dy", "ones"],
    ["--source", "mnist1d", "--kernel", "4"],
])
def test_modes_write_their_figures(tmp_path, args):
    if "mnist1d" in args:
        pytest.importorskip("mnist1d")
    done = run_cli(*args, "--out", str(tmp_path), "--no-color")
    assert done.returncode == 0, done.stderr
    assert_figures(tmp_path, ["examples.png", "batch.png", "overlap.png", "max_vs_avg.png"])


def test_npy_file_and_invariance(tmp_path):
    maps = np.random.default_rng(3).random((4, 1, 10, 10))
    np.save(tmp_path / "maps.npy", maps)
    done = run_cli("--source", str(tmp_path / "maps.npy"), "--out", str(tmp_path / "a"))
    assert done.returncode == 0, done.stderr
    assert "4 maps from" in done.stdout
    assert_figures(tmp_path / "a", ["examples.png", "batch.png"])
    done = run_cli("--invariance", "--source", "random", "--out", str(tmp_path / "b"))
    assert done.returncode == 0, done.stderr
    assert "shift" in done.stdout and "inside the window" in done.stdout
    assert_figures(tmp_path / "b", ["invariance.png"])


def test_checkpoint_pooling_layer_on_real_examples(tmp_path):
    pytest.importorskip("sklearn")
    from poolgrad import train
    train.train(train.TrainConfig("digits", str(tmp_path / "run"), epochs=1, progress=False,
                                  plot=False))
    done = run_cli("--source", f"checkpoint:{tmp_path / 'run'}", "--channel", "3",
                   "--out", str(tmp_path / "figures"))
    assert done.returncode == 0, done.stderr
    assert "channel 3 of the input of layer 2 (MaxPool(" in done.stdout
    assert_figures(tmp_path / "figures", ["examples.png", "batch.png"])


def test_aps_choice_moves_with_the_shift_and_max_pooling_does_not(tmp_path, capsys):
    """``--kind aps``: every example's APS output of the shifted digits is a circular
    shift of its output, its phase moves one column where its largest norm is unique;
    max pooling's output is not moved so; the table and aps.png say it."""
    pytest.importorskip("sklearn")
    x, _, _ = explain.load_batch("digits", 16, 0)
    from poolgrad.explain.polyphase import phase_choices
    numbers = phase_choices(x)
    assert numbers["aps_moved"].all() and not numbers["max_moved"].all()
    for n, (norms, phase, after) in enumerate(zip(numbers["norms"], numbers["phase"],
                                                  numbers["shifted_phase"], strict=True)):
        a, b = divmod(int(phase), 2)
        np.testing.assert_allclose(norms, [np.sum(x[n, i::2, j::2] ** 2)
                                           for i in range(2) for j in range(2)])
        if np.sum(norms == norms.max()) == 1:
            assert divmod(int(after), 2) == (a, (b + 1) % 2)
    assert cli.main(["explain", "--kind", "aps", "--out", str(tmp_path), "--examples", "2"]) == 0
    out = capsys.readouterr().out
    assert (f"all 16: APS's output is a circular shift of the unshifted one for 16; max "
            f"pooling's for {int(numbers['max_moved'].sum())}") in out
    assert_figures(tmp_path, ["aps.png"])
    with pytest.raises(explain.ExplainError, match="even sizes"):
        phase_choices(x[:, :7])


@pytest.mark.parametrize("args, message", [
    (["--kind", "median"], "unknown --kind 'median': choose one of max, avg, lp, blur, "
                           "max-blur, avg-blur, soft, stochastic, gem, fractional, mixed, "
                           "gated, aps"),
    (["--kind", "gem", "--source", "mnist1d"], "--kind gem explains 2-d maps"),
    (["--source", "random", "--kernel", "7"], "output would be empty"),
    (["--source", "missing.npy"], ".npy file not found: missing.npy"),
    (["--source", "cifar"], "unknown source 'cifar'"),
    (["--invariance", "--source", "random", "--kernel", "9"], "kernel 9 is larger than"),
    (["--source", "random", "--ties", "last"], "ties must be one of"),
    (["--source", "random", "--dy", "zeros"], "dy must be 'random' or 'ones'"),
])
def test_bad_arguments(tmp_path, args, message):
    done = run_cli(*args, "--out", str(tmp_path))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert message in done.stderr.strip().splitlines()[-1], done.stderr


@pytest.mark.parametrize("invariance", [False, True])
def test_bad_out_is_refused_before_the_work(tmp_path, invariance):
    (tmp_path / "a-file").write_text("not a folder")
    # the source does not exist either: --out is checked first, before any loading
    source = ["--source", str(tmp_path / "missing.npy")] + ["--invariance"] * invariance
    inside = tmp_path / "a-file" / "figures"
    for out, problem in [(tmp_path / "a-file", "it is a file, not a folder"),
                         (inside, f"{tmp_path / 'a-file'} is a file, not a folder")]:
        done = run_cli(*source, "--out", str(out))
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr == (f"poolgrad explain: error: cannot write to the output folder "
                               f"{out}: {problem}\n")


def test_figures_are_written_atomically_into_a_new_folder(tmp_path):
    out = tmp_path / "new" / "figures"
    done = run_cli("--source", "random", "--out", str(out), "--no-color")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["batch.png", "examples.png",
                                                      "max_vs_avg.png", "overlap.png"]


def test_without_matplotlib_the_figures_say_what_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    message = ("matplotlib is needed for the figures: pip install matplotlib (or pip install "
               "'poolgrad[explain]')")
    with pytest.raises(explain.ExplainError, match=f"^{re.escape(message)}$"):
        explain.draw_classic(str(tmp_path / "classic.png"))
    assert cli.main(["explain", "--source", "random", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"poolgrad explain: error: {message}\n"
    assert not list(tmp_path.iterdir())


def test_checkpoint_without_a_sliding_pool_says_so(tmp_path):
    pytest.importorskip("sklearn")
    from poolgrad import train
    train.train(train.TrainConfig("digits", str(tmp_path / "run"), pool="strided-conv",
                                  gap_head=True, epochs=1, progress=False, plot=False))
    done = run_cli("--source", f"checkpoint:{tmp_path / 'run'}", "--out", str(tmp_path / "f"))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "has no max, avg or lp pooling layer" in done.stderr.strip().splitlines()[-1]


def test_a_missing_checkpoint_folder_is_named_as_such(tmp_path):
    done = run_cli("--source", f"checkpoint:{tmp_path / 'nowhere'}", "--out",
                   str(tmp_path / "f"))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert f"no checkpoint in {tmp_path / 'nowhere'} to explain" in last
    assert "resume" not in last  # explain resumes nothing
