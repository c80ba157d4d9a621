"""The figures of ``poolgrad explain``: a :class:`~poolgrad.explain.routing.Routing`
drawn as PNGs with matplotlib (grids for 2-d maps; line and bar plots along the sequence
for 1-d data, :mod:`poolgrad.explain.sequences`), and the classic 4x4 diagram of max
against average pooling.
"""

from __future__ import annotations

import numpy as np

from ..tools.figures import figure_class, save_png
from . import sequences as plots
from .routing import ExplainError, Routing, classic_routings


def subplots(rows, cols, figsize, squeeze=True, **options):
    """A matplotlib figure and its axes (``options`` go to ``Figure.subplots``)."""
    figure = figure_class("the figures", "explain", ExplainError)(figsize=figsize)
    return figure, figure.subplots(rows, cols, squeeze=squeeze, **options)


def save(figure, path, top=0.9):
    """``figure`` laid out and written to ``path`` as a PNG; returns ``path``."""
    figure.tight_layout(rect=(0, 0, 1, top))  # the grids: room above ``top`` for the title
    return save_png(figure, path, dpi=110, bbox_inches="tight")


def draw_grid(axes, values, title, cmap="viridis", annotate=True, fmt="{:.2g}", centered=False):
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
        circle_winners(axes, routing.winners[example], routing.x.shape[2], color)


def circle_winners(axes, winners, width: int, color="red", size=11, edge=2):
    """A circle on each winner of a 2-d map ``width`` wide (``winners``: flat indices)."""
    for flat in np.unique(winners):
        axes.plot(flat % width, flat // width, marker="o", ms=size, mfc="none", mec=color,
                  mew=edge)


def save_adjusted(figure, path, **adjust):
    """``figure`` with ``subplots_adjust(**adjust)`` (where tight_layout crowds square
    grids into each other's titles) written to ``path`` as a PNG; returns ``path``."""
    figure.subplots_adjust(**adjust)
    return save_png(figure, path, dpi=110, bbox_inches="tight")


def draw_examples(routing: Routing, path: str, examples: int = 3, description: str = ""):
    """For a few examples: the input with the windows and the winners (or the averaging
    weights), the pooled output, the upstream gradient and the gradient routed back."""
    examples = min(examples, len(routing.x))
    if routing.one_d:
        figure = _examples_along(routing, examples)
    else:
        figure, grid = subplots(examples, 4, (13, 3.2 * examples), squeeze=False)
        for n in range(examples):
            left = grid[n, 0]
            draw_grid(left, routing.x[n], f"example {n}: input, windows"
                  + (" and winners (circled)" if routing.kind == "max" else ""), cmap="Greys")
            _outline_windows(left, routing, n)
            draw_grid(grid[n, 1], routing.y[n], f"{routing.kind}-pooled output", cmap="Greys")
            draw_grid(grid[n, 2], routing.dy[n], "upstream gradient dy", cmap="coolwarm",
                  centered=True)
            draw_grid(grid[n, 3], routing.dx[n], "gradient routed back to the input",
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
        figure, (a, b, c) = subplots(1, 3, (13, 4.2))
        draw_grid(a, routing.dx[0], "example 0 alone: its gradient", cmap="coolwarm",
              centered=True)
        image = draw_grid(b, routing.senders, f"how many of the {info['examples']} examples\nsend "
                      "gradient to each position", cmap="magma", fmt="{:.0f}")
        figure.colorbar(image, ax=b, fraction=0.046)
        draw_grid(c, routing.batch_gradient, "batch gradient = sum of the\nper-example gradients",
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
        figure, (a, b, c) = subplots(1, 3, (13, 4.2))
        draw_grid(a, routing.x[0], "example 0: input and windows", cmap="Greys")
        _outline_windows(a, routing, 0)
        draw_grid(b, routing.coverage, "windows covering each position", cmap="magma",
              fmt="{:.0f}")
        if routing.winners is not None:
            draw_grid(c, _wins(routing, 0), "windows won by each position\n(>1: their gradients "
                  "add up)", cmap="magma", fmt="{:.0f}")
        else:
            draw_grid(c, routing.dx[0], "gradient routed back: overlapping\nwindows add up",
                  cmap="coolwarm", centered=True)
    figure.suptitle(f"{routing.kind} pooling {_settings_text(routing)}: overlapping windows",
                    fontsize=11)
    return _save_drawn(figure, routing, path)


def _save_drawn(figure, routing, path):
    # the grids keep the top tenth for the title; tight_layout makes room for it itself
    # in the sequence plots
    return save(figure, path, top=1 if routing.one_d else 0.9)


def _wins(routing, example):
    """(H, W): how many windows each position of ``example`` won (max pooling)."""
    wins = np.zeros(routing.x.shape[1:], dtype=np.int64)
    width = routing.x.shape[2]
    for flat in routing.winners[example].ravel():
        wins[flat // width, flat % width] += 1
    return wins


# 1-d data gets line and bar plots along the sequence (:mod:`poolgrad.explain.sequences`):
# as (1, L) grids they would be strips one cell high with their numbers on top of each
# other.


def _examples_along(routing, examples):
    """draw_examples for 1-d data: per example, the input with its windows, then dy
    and dx as bars along the sequence."""
    length = routing.x.shape[2]
    positions = np.arange(length)
    figure, axes = subplots(3 * examples, 1, (13, 4.4 * examples),
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
    figure, (a, b, c) = subplots(3, 1, (13, 6.6))
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
    figure, (a, b, c) = subplots(3, 1, (13, 6.6), gridspec_kw={"height_ratios": [1.8, 1, 1]})
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


def draw_classic(path: str):
    routings = classic_routings()
    figure, grid = subplots(2, 4, (13, 6.6))
    for row, (first, second) in enumerate([("max", "avg"), ("ties first", "ties split")]):
        r = routings[first]
        draw_grid(grid[row, 0], r.x[0], "input (2x2 windows, stride 2)", cmap="Greys", fmt="{:g}")
        _outline_windows(grid[row, 0], r, None)
        draw_grid(grid[row, 1], r.y[0], f"{first} pooling output" if row == 0 else "max output",
              cmap="Greys", fmt="{:g}")
        for col, name in ((2, first), (3, second)):
            draw_grid(grid[row, col], routings[name].dx[0],
                  f"{name}: dx for dy = 1" if row == 0 else f"max, {name}: dx for dy = 1",
                  cmap="coolwarm", centered=True, fmt="{:.2g}")
    figure.suptitle("max sends each window's gradient to its winner; average spreads it "
                    "evenly.\nWith ties, \"first\" (PyTorch, ONNX) picks the first maximum; "
                    "\"split\" shares it", fontsize=11)
    return save(figure, path)


def _settings_text(routing):
    s = routing.settings
    return f"(kernel {s['kernel']}, stride {s['stride'] or s['kernel']}, padding {s['padding']})"
