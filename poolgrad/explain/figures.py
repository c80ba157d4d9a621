"""Where each example's gradient goes through a pooling layer, as numbers, pictures and
terminal grids: ``poolgrad explain``.

:func:`route` pools a batch of single-channel maps with the core's :func:`poolgrad.vjp`
and collects what a lecture on pooling's backward pass shows: each example's routed
gradient, how many examples send gradient to each input position, the batch gradient
(the sum of the per-example ones), and how many windows cover each position. The
drawing functions turn a :class:`Routing` into PNG figures (matplotlib: grids for 2-d
maps, line and bar plots along the sequence for 1-d data) and :func:`render_terminal`
into coloured grids (rich, or plain text without it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .. import nn, ops
from ..tools import datasets
from ..tools.choices import check_choice
from ..tools.figures import figure_class, save_png
from ..tools.files import check_output_folder
from . import sequences as plots

KINDS = tuple(nn.POOLING)  # the pooling layers: max, avg, lp
SOURCES = f"random, {', '.join(datasets.BUNDLED)}, a .npy file, or checkpoint:DIR"


class ExplainError(ValueError):
    """Settings or inputs that cannot be explained."""


@dataclass
class Routing:
    """One pooling layer applied to a batch ``x`` of ``(N, H, W)`` maps (1-d data has
    ``H = 1``), with upstream gradient ``dy``."""

    kind: str
    settings: dict
    x: np.ndarray  # (N, H, W)
    y: np.ndarray  # (N, OH, OW)
    dy: np.ndarray  # (N, OH, OW)
    dx: np.ndarray  # (N, H, W): row n is example n's routed gradient (the batch pullback)
    dx_alone: np.ndarray  # each example pulled back alone, for the comparison
    windows: list  # per output (oh, ow): the input positions [(h, w), ...] it reads
    winners: np.ndarray | None  # (N, OH, OW) flat input index of each max (max only)
    one_d: bool = False  # (N, L) sequences, pooled along L (kept as H = 1)

    @property
    def senders(self) -> np.ndarray:
        """(H, W): how many examples send a nonzero gradient to each position."""
        return (self.dx != 0).sum(axis=0)

    @property
    def batch_gradient(self) -> np.ndarray:
        """(H, W): the sum of the examples' gradients (as if the maps were one weight)."""
        return self.dx.sum(axis=0)

    @property
    def coverage(self) -> np.ndarray:
        """(H, W): how many windows read each input position."""
        count = np.zeros(self.x.shape[1:], dtype=np.int64)
        for window in self.windows:
            for h, w in window:
                count[h, w] += 1
        return count

    def summary(self) -> dict:
        n, h, w = self.x.shape
        reached = (self.dx != 0).reshape(n, -1).sum(axis=1)
        return {"examples": n, "positions": h * w,
                "mean_positions_reached_per_example": float(reached.mean()),
                "positions_reached_by_batch": int((self.senders > 0).sum()),
                "batch_equals_examples_alone": bool(np.array_equal(self.dx, self.dx_alone)),
                "max_windows_per_position": int(self.coverage.max())}


def _pool_call(kind, kernel, stride, padding, ties, p):
    common = {"kernel_size": kernel, "stride": stride, "padding": padding}
    if kind == "max":
        return ops.max_pool, dict(common, ties=ties, return_indices=True)
    if kind == "avg":
        return ops.avg_pool, common
    return ops.lp_pool, dict(common, p=p)


def route(x, kind: str = "max", kernel=2, stride=None, padding=0, ties: str = "first",
          p: float = 2.0, dy=None) -> Routing:
    """Pool ``x`` (``(N, H, W)`` maps, or ``(N, L)`` sequences) and pull back ``dy``
    (default: ones), with the core's vjp."""
    check_choice(kind, KINDS, "kind", ExplainError)
    x = np.asarray(x, dtype=np.float64)
    if x.ndim not in (2, 3):
        raise ExplainError(f"x must be (N, H, W), (N, L) or one (H, W) map, got shape {x.shape}")
    settings = {"kernel": kernel, "stride": stride, "padding": padding, "ties": ties, "p": p}
    one_d = x.ndim == 2
    batch = x[:, None, None, :] if one_d else x[:, None]  # (N, 1, H, W)
    if one_d:  # pool along L only: the window is 1 x kernel
        kernel, stride, padding = (1, kernel), (1, stride or kernel), (0, padding)
    op, options = _pool_call(kind, kernel, stride, padding, ties, p)
    out, pullback = ops.vjp(op, batch, **options)
    y, indices = out if kind == "max" else (out, None)
    dy = np.ones_like(y) if dy is None else np.asarray(dy, dtype=np.float64).reshape(y.shape)
    dx = pullback(dy)
    alone = np.concatenate([ops.vjp(op, batch[n:n + 1], **options)[1](dy[n:n + 1])
                            for n in range(len(batch))])
    plan_windows = _windows(batch.shape[2:], op, options)
    return Routing(kind, settings, batch[:, 0], y[:, 0], dy[:, 0], dx[:, 0],
                   alone[:, 0], plan_windows, None if indices is None else indices[:, 0], one_d)


def _windows(spatial, op, options):
    """The input positions each output window reads, found with the core itself: the
    pullback of a one-hot dy through average pooling with divisor 1 marks them."""
    kwargs = {k: v for k, v in options.items() if k in ("kernel_size", "stride", "padding")}
    probe = np.zeros((1, 1) + tuple(spatial))
    y, pullback = ops.vjp(ops.avg_pool, probe, divisor_override=1, **kwargs)
    windows = []
    for o in np.ndindex(y.shape[2:]):
        dy = np.zeros_like(y)
        dy[(0, 0) + o] = 1
        windows.append([tuple(int(i) for i in pos) for pos in np.argwhere(pullback(dy)[0, 0])])
    return windows


# --------------------------------------------------------------------------- inputs


def load_batch(source: str, batch: int = 16, seed: int = 0, channel: int = 0):
    """``(x, description, layer_settings)``: a batch of ``(N, H, W)`` or ``(N, L)`` maps
    from ``source`` (see :data:`SOURCES`); ``layer_settings`` is the checkpoint's pooling
    layer for ``checkpoint:DIR`` and None otherwise."""
    rng = np.random.default_rng(seed)
    if batch < 1:
        raise ExplainError(f"batch must be >= 1, got {batch}")
    if source == "random":
        return rng.standard_normal((batch, 6, 6)).round(2), f"{batch} random 6x6 maps", None
    if source in datasets.BUNDLED:
        data = datasets.load(source)
        chosen = rng.choice(len(data.y_test), size=min(batch, len(data.y_test)), replace=False)
        x = data.x_test[chosen][:, 0]
        labels = " ".join(str(label) for label in data.y_test[chosen][:8])
        more = " ..." if len(chosen) > 8 else ""
        return x, f"{len(chosen)} {source} test examples (labels {labels}{more})", None
    if source.startswith("checkpoint:"):
        return _checkpoint_batch(source[len("checkpoint:"):], batch, seed, channel)
    if source.endswith(".npy"):
        try:
            x = np.load(source, allow_pickle=False)
        except FileNotFoundError:
            raise ExplainError(f".npy file not found: {source}") from None
        except (OSError, ValueError) as error:
            raise ExplainError(f"cannot read {source} as a .npy array: {error}") from None
        if x.ndim == 4:
            if x.shape[1] != 1:
                raise ExplainError(f"{source}: a 4-d array must be (N, 1, H, W), got {x.shape}")
            x = x[:, 0]
        if x.ndim not in (2, 3) or not np.issubdtype(x.dtype, np.number) or x.size == 0:
            raise ExplainError(f"{source}: expected numbers shaped (H, W) for one map, (N, H, W) "
                               f"or (N, 1, H, W), got {x.dtype} {x.shape}")
        if x.ndim == 2:
            x = x[None]
        return x[:batch].astype(np.float64), f"{min(batch, len(x))} maps from {source}", None
    raise ExplainError(f"unknown source {source!r}: choose {SOURCES}")


def _checkpoint_batch(folder, batch, seed, channel):
    """The input of a trained model's first pooling layer, on real test examples."""
    from ..train import checkpoints, numpy_engine
    weights, _, meta = checkpoints.load_numpy(os.path.join(folder, numpy_engine.CHECKPOINT))
    settings = meta["settings"]
    data = datasets.load(settings["dataset"])
    model = numpy_engine.build_model(data.x_train.shape[1], data.spatial, data.classes,
                              pool=settings["pool"], widths=settings["widths"],
                              conv_kernel=settings["conv_kernel"],
                              gap_head=settings["gap_head"], head=settings.get("head"),
                              seed=settings["seed"])
    model.load_state_dict(weights)
    model.eval()
    kinds = {layer: kind for kind, layer in nn.POOLING.items()}
    pools = [i for i, layer in enumerate(model.layers) if type(layer) in kinds]
    if not pools:
        raise ExplainError(f"the model in {folder} has no max, avg or lp pooling layer "
                           f"(it was trained with --pool {settings['pool']})")
    layer = model.layers[pools[0]]
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(data.y_test), size=min(batch, len(data.y_test)), replace=False)
    features = nn.Sequential(*model.layers[:pools[0]]).eval().forward(data.x_test[chosen])
    if not 0 <= channel < features.shape[1]:
        raise ExplainError(f"channel must be in [0, {features.shape[1]}), got {channel}")
    options = dict(layer.options, kind=kinds[type(layer)])
    x = features[:, channel].astype(np.float64)
    return (x, f"channel {channel} of the input of layer {pools[0]} ({layer!r}) of the model in "
               f"{folder}, on {len(chosen)} {settings['dataset']} test examples", options)


# --------------------------------------------------------------------------- figures


def _subplots(rows, cols, figsize, squeeze=True, **options):
    """A matplotlib figure and its axes (``options`` go to ``Figure.subplots``)."""
    figure = figure_class("the figures", "explain", ExplainError)(figsize=figsize)
    return figure, figure.subplots(rows, cols, squeeze=squeeze, **options)


def _save(figure, path, top=0.9):
    figure.tight_layout(rect=(0, 0, 1, top))  # the grids: room above ``top`` for the title
    return save_png(figure, path, dpi=110, bbox_inches="tight")


def _grid(axes, values, title, cmap="viridis", annotate=True, fmt="{:.2g}", centered=False):
    values = np.asarray(values, dtype=np.float64)
    limit = np.abs(values).max() or 1.0
    dark_low = cmap == "magma"  # where the colour map is dark, the text is white
    image = axes.imshow(values, cmap=cmap, vmin=-limit if centered else None,
                        vmax=limit if centered else None, aspect="equal")
    axes.set_title(title, fontsize=9)
    axes.set_xticks([])
    axes.set_yticks([])
    if annotate and values.size <= 196:
        for (i, j), v in np.ndenumerate(values):
            if v != 0 or not centered:
                dark = (v < 0.4 * limit) if dark_low else (v > 0.6 * limit)
                axes.text(j, i, fmt.format(v), ha="center", va="center", fontsize=7,
                          color="white" if dark and not centered else "black")
    return image


def _outline_windows(axes, routing, example=None, color="red"):
    from matplotlib.patches import Rectangle
    for k, window in enumerate(routing.windows):
        rows = [h for h, _ in window]
        cols = [w for _, w in window]
        # windows are drawn over their real taps (padding is never read)
        axes.add_patch(Rectangle((min(cols) - 0.5, min(rows) - 0.5), max(cols) - min(cols) + 1,
                                 max(rows) - min(rows) + 1, fill=False, lw=1.2,
                                 edgecolor=f"C{k % 10}"))
    if example is not None and routing.winners is not None:
        width = routing.x.shape[2]
        for flat in np.unique(routing.winners[example]):
            axes.plot(flat % width, flat // width, marker="o", ms=11, mfc="none", mec=color,
                      mew=2)


def draw_examples(routing: Routing, path: str, examples: int = 3, description: str = ""):
    """For a few examples: the input with the windows and the winners (or the averaging
    weights), the pooled output, the upstream gradient and the gradient routed back."""
    examples = min(examples, len(routing.x))
    if routing.one_d:
        figure = _examples_along(routing, examples)
    else:
        figure, grid = _subplots(examples, 4, (13, 3.2 * examples), squeeze=False)
        for n in range(examples):
            left = grid[n, 0]
            _grid(left, routing.x[n], f"example {n}: input, windows"
                  + (" and winners (circled)" if routing.kind == "max" else ""), cmap="Greys")
            _outline_windows(left, routing, n)
            _grid(grid[n, 1], routing.y[n], f"{routing.kind}-pooled output", cmap="Greys")
            _grid(grid[n, 2], routing.dy[n], "upstream gradient dy", cmap="coolwarm",
                  centered=True)
            _grid(grid[n, 3], routing.dx[n], "gradient routed back to the input",
                  cmap="coolwarm", centered=True)
    figure.suptitle(f"{routing.kind} pooling {_settings_text(routing)}: where each example's "
                    f"gradient goes\n{description}", fontsize=11)
    return _save_drawn(figure, routing, path)


def draw_batch(routing: Routing, path: str, description: str = ""):
    """The whole batch: how many examples send gradient to each input position, one
    example's sparse gradient, and the batch gradient (the sum of the per-example ones)."""
    info = routing.summary()
    if routing.one_d:
        figure = _batch_along(routing, info)
    else:
        figure, (a, b, c) = _subplots(1, 3, (13, 4.2))
        _grid(a, routing.dx[0], "example 0 alone: its gradient", cmap="coolwarm",
              centered=True)
        image = _grid(b, routing.senders, f"how many of the {info['examples']} examples\nsend "
                      "gradient to each position", cmap="magma", fmt="{:.0f}")
        figure.colorbar(image, ax=b, fraction=0.046)
        _grid(c, routing.batch_gradient, "batch gradient = sum of the\nper-example gradients",
              cmap="coolwarm", centered=True)
    figure.suptitle(
        f"{routing.kind} pooling {_settings_text(routing)}: each example reaches "
        f"{info['mean_positions_reached_per_example']:.1f} of {info['positions']} positions; "
        f"the batch reaches {info['positions_reached_by_batch']}\n"
        f"batch pullback == each example pulled back alone: "
        f"{info['batch_equals_examples_alone']}. {description}", fontsize=10)
    return _save_drawn(figure, routing, path)


def draw_overlap(routing: Routing, path: str):
    """Overlapping windows: how many windows cover each position, and where one
    example's contributions add up (positions that won, or share, several windows)."""
    if routing.one_d:
        figure = _overlap_along(routing)
    else:
        figure, (a, b, c) = _subplots(1, 3, (13, 4.2))
        _grid(a, routing.x[0], "example 0: input and windows", cmap="Greys")
        _outline_windows(a, routing, 0)
        _grid(b, routing.coverage, "windows covering each position", cmap="magma",
              fmt="{:.0f}")
        if routing.winners is not None:
            _grid(c, _wins(routing, 0), "windows won by each position\n(>1: their gradients "
                  "add up)", cmap="magma", fmt="{:.0f}")
        else:
            _grid(c, routing.dx[0], "gradient routed back: overlapping\nwindows add up",
                  cmap="coolwarm", centered=True)
    figure.suptitle(f"{routing.kind} pooling {_settings_text(routing)}: overlapping windows",
                    fontsize=11)
    return _save_drawn(figure, routing, path)


def _save_drawn(figure, routing, path):
    # the grids keep the top tenth for the title; tight_layout makes room for it itself
    # in the sequence plots
    return _save(figure, path, top=1 if routing.one_d else 0.9)


def _wins(routing, example):
    """(H, W): how many windows each position of ``example`` won (max pooling)."""
    wins = np.zeros(routing.x.shape[1:], dtype=np.int64)
    width = routing.x.shape[2]
    for flat in routing.winners[example].ravel():
        wins[flat // width, flat % width] += 1
    return wins


# 1-d data gets line and bar plots along the sequence (:mod:`poolgrad._sequence_plots`):
# as (1, L) grids they would be strips one cell high with their numbers on top of each
# other.


def _examples_along(routing, examples):
    """draw_examples for 1-d data: per example, the input with its windows, then dy
    and dx as bars along the sequence."""
    length = routing.x.shape[2]
    positions = np.arange(length)
    figure, axes = _subplots(3 * examples, 1, (13, 4.4 * examples),
                             gridspec_kw={"height_ratios": [1.8, 1, 1] * examples})
    for n in range(examples):
        top, middle, bottom = axes[3 * n:3 * n + 3]
        plots.signal(top, routing, n, f"example {n}: input (windows bracketed below it)"
                + (", winners circled" if routing.kind == "max" else ""))
        plots.bars(middle, *plots.window_bars(routing, n, routing.dy),
              "upstream gradient dy, one bar per window", length, "tab:blue")
        plots.bars(bottom, positions, routing.dx[n, 0], 0.6,
              "gradient routed back to the input, one bar per position", length, "tab:red")
    return figure


def _batch_along(routing, info):
    """draw_batch for 1-d data: three bar plots along the sequence."""
    length = routing.x.shape[2]
    positions = np.arange(length)
    figure, (a, b, c) = _subplots(3, 1, (13, 6.6))
    plots.bars(a, positions, routing.dx[0, 0], 0.6, "example 0 alone: its gradient", length,
          "tab:red")
    plots.bars(b, positions, routing.senders[0], 0.6, f"how many of the {info['examples']} "
          "examples send gradient to each position", length, "tab:purple")
    plots.bars(c, positions, routing.batch_gradient[0], 0.6,
          "batch gradient = sum of the per-example gradients", length, "tab:red")
    return figure


def _overlap_along(routing):
    """draw_overlap for 1-d data: the windows stacked where they overlap, then bars."""
    length = routing.x.shape[2]
    positions = np.arange(length)
    figure, (a, b, c) = _subplots(3, 1, (13, 6.6), gridspec_kw={"height_ratios": [1.8, 1, 1]})
    plots.signal(a, routing, 0, "example 0: input and windows (bracketed below it)", pooled=False)
    plots.bars(b, positions, routing.coverage[0], 0.6, "windows covering each position", length,
          "tab:purple")
    if routing.winners is not None:
        plots.bars(c, positions, _wins(routing, 0)[0], 0.6,
              "windows won by each position (>1: their gradients add up)", length, "tab:purple")
    else:
        plots.bars(c, positions, routing.dx[0, 0], 0.6,
              "gradient routed back: overlapping windows add up", length, "tab:red")
    return figure


CLASSIC_INPUT = np.array([[1.0, 3.0, 2.0, 1.0],
                          [4.0, 2.0, 0.0, 5.0],
                          [3.0, 1.0, 2.0, 2.0],
                          [0.0, 6.0, 1.0, 2.0]])
TIED_INPUT = np.array([[2.0, 2.0, 1.0, 3.0],
                       [1.0, 2.0, 3.0, 0.0],
                       [5.0, 5.0, 4.0, 4.0],
                       [5.0, 5.0, 4.0, 4.0]])


def classic_routings():
    """The classic diagram's numbers: 2x2 stride-2 max and average pooling of a 4x4
    input with dy = 1, and ties "first" against "split" on an input with ties."""
    return {"max": route(CLASSIC_INPUT[None], "max"), "avg": route(CLASSIC_INPUT[None], "avg"),
            "ties first": route(TIED_INPUT[None], "max", ties="first"),
            "ties split": route(TIED_INPUT[None], "max", ties="split")}


def draw_classic(path: str):
    routings = classic_routings()
    figure, grid = _subplots(2, 4, (13, 6.6))
    for row, (first, second) in enumerate([("max", "avg"), ("ties first", "ties split")]):
        r = routings[first]
        _grid(grid[row, 0], r.x[0], "input (2x2 windows, stride 2)", cmap="Greys", fmt="{:g}")
        _outline_windows(grid[row, 0], r, None)
        _grid(grid[row, 1], r.y[0], f"{first} pooling output" if row == 0 else "max output",
              cmap="Greys", fmt="{:g}")
        for col, name in ((2, first), (3, second)):
            _grid(grid[row, col], routings[name].dx[0],
                  f"{name}: dx for dy = 1" if row == 0 else f"max, {name}: dx for dy = 1",
                  cmap="coolwarm", centered=True, fmt="{:.2g}")
    figure.suptitle("max sends each window's gradient to its winner; average spreads it "
                    "evenly.\nWith ties, \"first\" (PyTorch, ONNX) picks the first maximum; "
                    "\"split\" shares it", fontsize=11)
    return _save(figure, path)


def _settings_text(routing):
    s = routing.settings
    return f"(kernel {s['kernel']}, stride {s['stride'] or s['kernel']}, padding {s['padding']})"


# ------------------------------------------------------------------------ invariance


def invariance(x, kernel: int = 2, shifts=None) -> list[dict]:
    """How often max- and average-pooled outputs stay the same when the input shifts
    right by ``s``: :func:`unchanged_outputs` of the maps ``x`` ((N, H, W), or (N, W)
    sequences) with ``kernel`` x ``kernel`` windows and stride (``kernel`` long for
    sequences), for the shifts 0 to ``2 * kernel`` unless ``shifts`` are given."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 2:
        x = x[:, None, :]
    shifts = list(range(0, 2 * kernel + 1)) if shifts is None else list(shifts)
    n, h, w = x.shape
    if kernel < 1 or kernel > w or (h > 1 and kernel > h):
        raise ExplainError(f"kernel {kernel} is larger than the {h}x{w} input")
    window = (1, kernel) if h == 1 else (kernel, kernel)
    pools = {"max": lambda canvas: ops.max_pool(canvas, window),
             "avg": lambda canvas: ops.avg_pool(canvas, window)}
    return unchanged_outputs(x[:, None], pools, window, shifts)


def unchanged_outputs(maps, pools: dict, window: tuple[int, ...], shifts) -> list[dict]:
    """For each shift ``s``, the fraction of each pooling's outputs that stay the same
    when the maps move ``s`` positions along their last axis: ``{"shift": s, name:
    fraction, ...}`` per shift.

    ``maps`` is (N, C, *spatial). Each is placed on a zero canvas (wide enough for the
    largest shift and a multiple of the last window dim), shifted by ``s``, and given to
    ``pools`` (name -> a function of the float64 canvas, returning its pooled array); an
    output counts as unchanged when it equals the unshifted canvas's output at the same
    position. Outputs whose windows (``window``, one size per spatial dim, at that
    stride) are blank (all zero) in both canvases are left out: they never change.
    """
    maps = np.asarray(maps, dtype=np.float64)
    length = maps.shape[-1]
    width = length + max(shifts) + window[-1]
    width += (-width) % window[-1]
    rows, base = [], None
    for s in shifts:
        canvas = np.zeros(maps.shape[:-1] + (width,))
        canvas[..., s:s + length] = maps
        pooled = {name: np.asarray(pool(canvas), dtype=np.float64)
                  for name, pool in pools.items()}
        blank = ops.max_pool(np.abs(canvas), window) == 0
        if base is None:
            base, base_blank = pooled, blank
        counted = ~(blank & base_blank)
        row = {"shift": s}
        for name in pools:
            same = np.isclose(pooled[name], base[name], rtol=1e-9, atol=1e-12) & counted
            row[name] = float(same.sum() / counted.sum())
        rows.append(row)
    return rows


def draw_invariance(rows: list[dict], kernel: int, path: str, description: str = ""):
    figure, axes = _subplots(1, 1, (7, 4))
    shifts = [r["shift"] for r in rows]
    for kind in ("max", "avg"):
        axes.plot(shifts, [100 * r[kind] for r in rows], marker="o", label=f"{kind} pooling")
    axes.axvspan(-0.5, kernel - 0.5, color="grey", alpha=0.15,
                 label=f"shifts inside the window (< {kernel})")
    axes.set(xlabel="shift (columns)", ylabel="outputs unchanged (%)", ylim=(0, 105),
             title=f"translation invariance is local: {kernel}x{kernel} windows, stride "
                   f"{kernel}\n{description}")
    axes.grid(alpha=0.3)
    axes.legend()
    return _save(figure, path)


# --------------------------------------------------------------------------- terminal


def render_terminal(routing: Routing, examples: int = 1, color: bool = True) -> str:
    """Small grids as text: input (winners marked), routed gradient, and the batch's
    sender counts. Coloured with rich when it is installed and ``color`` is set."""
    lines = []
    h, w = routing.x.shape[1:]
    if h * w > 400:
        return f"(maps of {h}x{w} are too large for the terminal; see the figures)"
    for n in range(min(examples, len(routing.x))):
        won = set()
        if routing.winners is not None:
            won = {(int(f) // w, int(f) % w) for f in routing.winners[n].ravel()}
        lines.append(f"example {n}: input ([x] won a window)")
        lines += ["  " + " ".join((f"[{v:5.2f}]" if (i, j) in won else f" {v:5.2f} ")
                                  for j, v in enumerate(row))
                  for i, row in enumerate(routing.x[n])]
        lines.append(f"example {n}: gradient routed back (dy = given upstream gradient)")
        lines += ["  " + " ".join(f" {v:5.2f} " if v else "    .   " for v in row)
                  for row in routing.dx[n]]
    lines.append(f"examples sending gradient to each position (of {len(routing.x)}):")
    lines += ["  " + " ".join(f"{int(v):4d}" for v in row) for row in routing.senders]
    text = "\n".join(lines)
    if not color:
        return text
    try:
        from rich.text import Text
    except ImportError:
        return text
    rich_text = Text(text)
    rich_text.highlight_regex(r"\[[ \-0-9.]+\]", "bold red")
    return rich_text


def explain(source: str = "digits", out: str = "explain", *, kind: str = "max", kernel=2,
            stride=None, padding=0, ties: str = "first", p: float = 2.0, batch: int = 16,
            examples: int = 3, seed: int = 0, channel: int = 0, dy: str = "random") -> dict:
    """Write the default set of figures into ``out`` and return their paths with the
    routing numbers: ``examples.png``, ``batch.png``, ``overlap.png`` (3x3 stride-2
    windows over the same batch) and ``max_vs_avg.png`` (the classic 4x4 diagram).
    ``dy``: ``"random"`` (integers 1 to 9, so each window's value can be followed to
    where it lands) or ``"ones"``."""
    if dy not in ("random", "ones"):
        raise ExplainError(f"dy must be 'random' or 'ones', got {dy!r}")
    if examples < 1:
        raise ExplainError(f"examples must be >= 1, got {examples}")
    check_output_folder(out, ExplainError)  # before the work, not after it
    x, description, layer = load_batch(source, batch, seed, channel)
    if layer is not None:  # a checkpoint's pooling layer brings its own settings
        kind, kernel = layer["kind"], layer["kernel_size"]
        stride, padding = layer.get("stride"), layer.get("padding", 0)
        p = layer.get("p", p)
    upstream = None
    if dy == "random":
        shape = route(x[:1], kind, kernel, stride, padding, ties, p).y.shape[1:]
        upstream = np.random.default_rng(seed).integers(1, 10, (len(x),) + shape)
    routing = route(x, kind, kernel, stride, padding, ties, p, upstream)
    pooled_dims = routing.x.shape[2:] if routing.one_d else routing.x.shape[1:]
    overlap = route(x, kind, 3, 2, 1, ties, p) if min(pooled_dims) >= 3 else routing
    files = {"examples": draw_examples(routing, os.path.join(out, "examples.png"), examples,
                                       description),
             "batch": draw_batch(routing, os.path.join(out, "batch.png"), description),
             "overlap": draw_overlap(overlap, os.path.join(out, "overlap.png")),
             "max_vs_avg": draw_classic(os.path.join(out, "max_vs_avg.png"))}
    return {"files": files, "routing": routing, "description": description,
            "summary": routing.summary()}


def explain_invariance(source: str = "digits", out: str = "explain", *, kernel: int = 2,
                       batch: int = 100, seed: int = 0) -> dict:
    check_output_folder(out, ExplainError)
    x, description, _ = load_batch(source, batch, seed)
    rows = invariance(x, kernel)
    path = draw_invariance(rows, kernel, os.path.join(out, "invariance.png"), description)
    return {"files": {"invariance": path}, "rows": rows, "description": description}
