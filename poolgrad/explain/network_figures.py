"""The figures of ``poolgrad explain --network`` (the numbers come from
:mod:`poolgrad.explain.network`): a few examples' own routing and weight gradients, the
batch's gradient three ways for max and average pooling, and the optimizer steps."""

from __future__ import annotations

import numpy as np

from .figures import circle_winners, draw_grid, save, save_adjusted, subplots
from .network import NetworkGradients

KERNEL = "0.W"  # the first convolution's kernel: the weight gradient drawn


def _kernel_tiles(kernel: np.ndarray, per_row: int = 4) -> np.ndarray:
    """A convolution kernel's gradient ``(out, in, *k)`` as one picture: each output
    channel's first input plane, side by side in rows of ``per_row``, zeros between
    (white in the centred colour map). A 1-d kernel is one row per output channel."""
    planes = kernel[:, 0]
    if planes.ndim == 2:
        return planes
    out, kh, kw = planes.shape
    rows = -(-out // per_row)
    tiles = np.zeros((rows * (kh + 1) - 1, per_row * (kw + 1) - 1))
    for o in range(out):
        r, c = divmod(o, per_row)
        tiles[r * (kh + 1):r * (kh + 1) + kh, c * (kw + 1):c * (kw + 1) + kw] = planes[o]
    return tiles


def busiest_channel(result: NetworkGradients) -> int:
    """The pooling layer's channel that receives the most gradient over the batch."""
    return int(np.abs(result.routed).sum(axis=tuple(i for i in range(result.routed.ndim)
                                                    if i != 1)).argmax())


def _window_lines(axes, shape, step: int):
    """Thin lines between the pooling windows (``step`` apart) of a 2-d map."""
    for i in range(step, shape[0], step):
        axes.axhline(i - 0.5, color="tab:blue", lw=0.8, alpha=0.6)
    for j in range(step, shape[1], step):
        axes.axvline(j - 0.5, color="tab:blue", lw=0.8, alpha=0.6)


def _routed_differently(result: NetworkGradients, channel: int) -> np.ndarray:
    """Per window of ``channel``: the share of examples that route its gradient other
    than the mean map does. Max pooling: the winner differs. Average pooling routes by
    position alone, every example alike: none."""
    if result.winners is None:
        return np.zeros(result.pool_upstream.shape[2:])
    return (result.winners[:, channel] != result.mean_winners[channel]).mean(axis=0)


def draw_network_examples(result: NetworkGradients, path: str, examples: int = 3) -> str:
    """``network_examples.png``: for each of the first ``examples`` examples, its input,
    the pooling layer's input (one channel; max pooling's winners circled), the
    gradient routed back through it, and the example's own gradient of the first
    convolution's kernel."""
    rows = min(examples, len(result.x))
    channel = busiest_channel(result)
    figure, grid = subplots(rows, 4, (14, 3.6 * rows + 0.7), squeeze=False,
                            gridspec_kw={"width_ratios": [1, 1, 1, 1.6]})
    width = result.pool_input.shape[-1]
    step = result.pool_input.shape[-1] // result.pool_upstream.shape[-1]
    for n in range(rows):
        if result.x.ndim == 3:  # 1-d signals: lines and bars along the sequence
            _examples_along(grid[n], result, n, channel)
            continue
        draw_grid(grid[n, 0], result.x[n, 0], f"example {n} (label {result.labels[n]})",
                  cmap="Greys", annotate=False)
        draw_grid(grid[n, 1], result.pool_input[n, channel],
                  f"{result.pool} pooling's input, channel {channel}"
                  + (" (winners circled)" if result.winners is not None else ""),
                  cmap="Greys", annotate=False)
        _window_lines(grid[n, 1], result.pool_input.shape[2:], step)
        if result.winners is not None:
            circle_winners(grid[n, 1], result.winners[n, channel], width, size=9, edge=1.8)
        draw_grid(grid[n, 2], result.routed[n, channel],
                  "its gradient routed back through them", cmap="coolwarm", centered=True,
                  annotate=False)
        draw_grid(grid[n, 3], _kernel_tiles(result.per_example[KERNEL][n]),
                  "its own gradient of the conv kernel", cmap="coolwarm", centered=True,
                  annotate=False)
    figure.suptitle(f"every example is routed through its own winners and gets its own weight "
                    f"gradient\n{result.description}", fontsize=11)
    return save(figure, path, top=1 - 0.5 / (3.6 * rows + 0.7))


def _examples_along(row, result: NetworkGradients, n: int, channel: int) -> None:
    """One example of 1-d data: its signal, the pooling layer's input (winners marked)
    and the gradient routed back, along the sequence, and its kernel gradient."""
    row[0].plot(result.x[n, 0], color="black", lw=1)
    row[0].set_title(f"example {n} (label {result.labels[n]})", fontsize=9)
    pooled_input = result.pool_input[n, channel]
    row[1].plot(pooled_input, color="grey", lw=1)
    if result.winners is not None:
        won = np.unique(result.winners[n, channel])
        row[1].plot(won, pooled_input[won], "o", mfc="none", mec="red", ms=5)
    row[1].set_title(f"{result.pool} pooling's input, channel {channel}"
                     + (" (winners circled)" if result.winners is not None else ""), fontsize=9)
    routed = result.routed[n, channel]
    row[2].bar(np.arange(len(routed)), routed, width=0.8,
               color=np.where(routed < 0, "tab:blue", "tab:red"))
    row[2].set_title("its gradient routed back through them", fontsize=9)
    for axes in row[:3]:
        axes.set_xlabel("position", fontsize=8)
        axes.tick_params(labelsize=7)
    draw_grid(row[3], _kernel_tiles(result.per_example[KERNEL][n]),
              "its own gradient of the conv kernel", cmap="coolwarm", centered=True,
              annotate=False)


def draw_network_batch(results: list, path: str) -> str:
    """``network_batch.png``: per network (a row each: max, then average pooling) the
    first convolution's kernel gradient as the mean of the examples' own, from the
    batch's backward pass and from the misconception, and at the pooling layer how many
    examples route a window's gradient other than the mean map does."""
    figure, grid = subplots(len(results), 4, (17, 3.3 * len(results) + 0.6), squeeze=False,
                            gridspec_kw={"width_ratios": [1.6, 1.6, 1.6, 1]})
    for row, result in zip(grid, results, strict=True):
        n = result.numbers
        same, wrong = n["examples_vs_batch"], n["misconception_vs_batch"]
        limit = max(np.abs(result.batch[KERNEL]).max(), np.abs(result.misconception[KERNEL]).max())
        for axes, gradient, title in (
                (row[0], result.mean_of_examples[KERNEL],
                 f"{result.pool} pooling: mean of the {n['examples']} examples'\nown kernel "
                 f"gradients"),
                (row[1], result.batch[KERNEL],
                 f"the batch's one backward pass\n(largest difference "
                 f"{same['max_difference']:.1e})"),
                (row[2], result.misconception[KERNEL],
                 f"misconception: averaged first\n(relative error "
                 f"{wrong['relative_error']:.2f}, cosine {wrong['cosine']:.2f})")):
            image = draw_grid(axes, _kernel_tiles(gradient), title, cmap="coolwarm",
                              centered=True, annotate=False)
            image.set_clim(-limit, limit)  # one scale for the three
        channel = busiest_channel(result)
        title = (f"{result.pool} pooling, channel {channel}: share of\nexamples routed "
                 f"unlike the mean map\n(routing the mean there: off by "
                 f"{n['at_the_pool']['relative_error']:.2f})")
        differently = _routed_differently(result, channel)
        if differently.ndim == 1:  # 1-d: a bar per window
            row[3].bar(np.arange(len(differently)), differently, color="tab:purple")
            row[3].set(ylim=(0, 1), xlabel="window")
            row[3].set_title(title, fontsize=9)
        else:
            draw_grid(row[3], differently, title, cmap="magma", fmt="{:.1f}").set_clim(0, 1)
    figure.suptitle("one backward pass for the batch = the mean of the per-example ones; "
                    "averaging the batch first is another gradient", fontsize=11)
    return save_adjusted(figure, path, top=0.86, hspace=0.45, wspace=0.08)


def draw_network_steps(results: list, steps: list, path: str) -> str:
    """``network_steps.png``: per network and optimizer, each weight's update from the
    batch's gradient (x) against the update from the examples' mean (on the diagonal)
    and from the misconception (off it)."""
    names = list(steps[0])
    figure, grid = subplots(len(results), len(names), (4.6 * len(names), 4.2 * len(results)),
                            squeeze=False)
    for row, result, step in zip(grid, results, steps, strict=True):
        for axes, name in zip(row, names, strict=True):
            routes = step[name]
            axes.scatter(routes["batch"], routes["misconception"], s=4, alpha=0.4,
                         color="tab:red", label="misconception")
            axes.scatter(routes["batch"], routes["examples"], s=4, alpha=0.6,
                         color="tab:blue", label="mean of the examples'")
            limit = np.abs(routes["batch"]).max() * 1.1 or 1.0
            axes.plot([-limit, limit], [-limit, limit], color="grey", lw=0.8)
            axes.set(xlabel="update from the batch's gradient", ylabel="update from ...",
                     title=f"{result.pool} pooling, {name}")
            axes.grid(alpha=0.3)
            axes.legend(fontsize=8, markerscale=3)
    figure.suptitle("the step that follows, from an optimizer state warmed on earlier "
                    "batches (each weight a dot)", fontsize=11)
    return save(figure, path, top=0.93)
