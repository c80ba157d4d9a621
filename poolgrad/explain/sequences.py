"""Line and bar plots along a 1-d sequence, for ``poolgrad explain`` on 1-d data: the
input with its windows bracketed below it, and bars with their values written over
them where they fit. Each function draws into matplotlib axes it is given.
"""

from __future__ import annotations

import numpy as np

FONT = 7  # points, the numbers over the bars


def number(value) -> str:
    """A bar's value in at most four characters where it can: 7, 144, 3.5, .5, .33,
    -.15, and ~0 for a gradient that rounds to 0.00."""
    value = float(value)
    size = abs(value)
    if value.is_integer() or size >= 10:
        return f"{value:.0f}" if size < 1e4 else f"{value:.1g}"
    if size >= 0.995:
        return f"{value:.1f}"
    text = f"{value:.2f}"
    return "~0" if float(text) == 0 else text.replace("0.", ".", 1).rstrip("0")


def text_width(text: str) -> float:
    """Roughly how wide ``text`` is in points at the numbers' font size."""
    return FONT * sum(0.36 if c in ".-~" else 0.64 for c in text)


def window_spans(routing):
    """Per window: its first and last input position along L (its real taps)."""
    return [(min(w for _, w in window), max(w for _, w in window))
            for window in routing.windows]


def sequence_axes(axes, length, title):
    axes.set_title(title, fontsize=9, loc="left")
    axes.set_xlim(-0.7, length - 0.3)
    axes.tick_params(labelsize=7)
    axes.grid(axis="y", alpha=0.3)
    axes.spines[["top", "right"]].set_visible(False)


def bars(axes, centers, values, widths, title, length, color, skip_zeros=True):
    """A bar per position (or per window, ``widths`` wide) with its value above it (below
    it when negative): upright where the numbers fit side by side, else turned on their
    side, and left out where even that would not fit."""
    values = np.asarray(values, dtype=np.float64)
    axes.bar(centers, values, width=widths, color=color, alpha=0.85)
    sequence_axes(axes, length, title)
    axes.axhline(0, color="0.4", lw=0.6)
    if np.all(values == np.round(values)):  # counts and integer gradients: integer ticks
        axes.yaxis.get_major_locator().set_params(integer=True)
    labels = [number(v) if v or not skip_zeros else "" for v in values]
    figure, box = axes.figure, axes.get_position()
    # room for a number, in points: the distance between neighbouring bars
    spacing = float(np.diff(centers).min()) if len(centers) > 1 else length
    slot = figure.get_figwidth() * box.width * 72 / (length + 0.4) * spacing
    widest = max(map(text_width, labels))
    upright = widest <= 0.9 * slot
    # the numbers' reach beyond the bar ends, in points, on each side that has them
    reach = (FONT * 1.3 if upright else widest) + 3
    sides = int(any(v > 0 for v, t in zip(values, labels, strict=True) if t)) + int(
        any(v < 0 for v, t in zip(values, labels, strict=True) if t))
    height = figure.get_figheight() * box.height * 72
    low, high = min(values.min(), 0.0), max(values.max(), 0.0)
    span = (high - low) or 1.0
    numbered = (upright or slot >= 1.4 * FONT) and height - sides * reach >= 0.4 * height
    room = reach * span / (height - sides * reach) if numbered else 0.1 * span
    axes.set_ylim(low - (room if low < 0 else 0), high + room)
    if not numbered:
        return
    for x, v, label in zip(centers, values, labels, strict=True):
        if label:
            axes.annotate(label, (x, v), xytext=(0, 2 if v >= 0 else -2),
                          textcoords="offset points", ha="center",
                          va="bottom" if v >= 0 else "top", fontsize=FONT,
                          rotation=0 if upright else 90)


def signal(axes, routing, example, title, pooled=True):
    """The input sequence, its windows as brackets below it (stacked where windows
    overlap), each window's pooled output as a bar across it, and the winners."""
    x = routing.x[example, 0]
    length = len(x)
    spans = window_spans(routing)
    low, high = float(x.min()), float(x.max())
    height = (high - low) or 1.0
    levels = int(routing.coverage.max())
    axes.plot(np.arange(length), x, color="0.3", lw=1, marker=".", ms=4, zorder=2,
              label="input")
    for k, (first, last) in enumerate(spans):
        color = f"C{k % 10}"
        level = low - height * (0.12 + 0.1 * (k % levels))
        axes.plot([first - 0.35, first - 0.35, last + 0.35, last + 0.35],
                  [level + 0.03 * height, level, level, level + 0.03 * height], color=color,
                  lw=1.2)
        if pooled:
            axes.plot([first - 0.4, last + 0.4], [routing.y[example, 0, k]] * 2, color=color,
                      lw=2.5, alpha=0.8, zorder=1,
                      label=f"{routing.kind}-pooled output" if k == 0 else None)
    if routing.winners is not None:
        won = np.unique(routing.winners[example])
        axes.plot(won, x[won], "o", ms=9, mfc="none", mec="red", mew=1.8, zorder=3,
                  label="winners")
    if pooled:  # Lp norms lie above the values
        high = max(high, float(routing.y[example, 0].max()))
    axes.set_ylim(low - height * (0.2 + 0.1 * levels), high + height * 0.15)
    axes.set_yticks([t for t in axes.get_yticks() if low <= t <= high])  # none by the brackets
    sequence_axes(axes, length, title)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def window_bars(routing, example, values):
    """Bars for per-window values, centred on each window and no wider than the
    distance between window centres (so overlapping windows' bars stay apart)."""
    spans = window_spans(routing)
    centers = np.array([(first + last) / 2 for first, last in spans])
    step = np.diff(centers).min() if len(centers) > 1 else np.inf
    widths = [min(last - first + 1, step) - 0.2 for first, last in spans]
    return centers, np.asarray(values)[example, 0], widths
