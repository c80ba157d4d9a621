"""``poolgrad explain --kind K`` for the pooling kinds beyond max, average and Lp: where
the gradient of one output goes. Every example's output at the same place gets
``dy = 1`` (0 everywhere else) and the kind's own pullback (:func:`poolgrad.vjp`)
routes it back: the blur spreads it over its filter's taps, max-blur sends it through
those taps to the winners they read, SoftPool and GeM weight every tap, stochastic
pooling sends it to the element it drew, fractional max pooling to the winner of an
irregular window, mixed and gated pooling split it between the winner and the window.

:func:`window_gradient` gives the numbers (the tests check them against the kinds'
definitions); :func:`render_window` prints them; :func:`draw_window` draws them.
"""

from __future__ import annotations

import numpy as np

from .. import kinds
from ..autodiff import vjp
from ..geometry import is_int
from .routing import ExplainError

WINDOW = 2  # 2-wide windows (or a 3-tap filter) with stride 2, as poolgrad train's menu
FRACTIONAL_RATIO = 0.7  # 8 -> 5 outputs: windows of 2 at irregular starts
GATE = 0.5  # the gated pool's gate weights, each (a learned gate would differ)

# each kind's operator, its arguments for (N, 1, H, W) maps and a seed, and its rule
KIND_RULES = {
    "blur": (kinds.blur_pool, lambda x, seed: {"stride": WINDOW},
             "a binomial 3-tap filter per dim ([1 2 1] / 4), then every 2nd position: the "
             "gradient spreads over the filter's taps, by its weights"),
    "max-blur": (kinds.max_blur_pool, lambda x, seed: {"kernel_size": WINDOW, "stride": WINDOW},
                 "2x2 max at stride 1, then the blur: the gradient goes through the blur's "
                 "taps to the winners of the stride-1 windows they read"),
    "avg-blur": (kinds.avg_blur_pool, lambda x, seed: {"kernel_size": WINDOW, "stride": WINDOW},
                 "2x2 average at stride 1, then the blur: the gradient spreads over every "
                 "position the taps' windows read"),
    "soft": (kinds.soft_pool, lambda x, seed: {"kernel_size": WINDOW},
             "SoftPool: the window's average weighted by softmax(x): every tap gets some, "
             "the larger ones more"),
    "stochastic": (kinds.stochastic_pool,
                   lambda x, seed: {"kernel_size": WINDOW, "training": True, "rng": seed},
                   "stochastic pooling (training): one element drawn with probability "
                   "x / sum(x) over the window; the gradient goes to the one drawn"),
    "gem": (kinds.gem_pool, lambda x, seed: {"p": 3.0, "kernel_size": WINDOW},
            "GeM, p = 3: (mean of x^p)^(1/p); each tap gets (x / y)^(p - 1) / 4 of it"),
    "fractional": (kinds.fractional_max_pool,
                   lambda x, seed: {"kernel_size": WINDOW, "output_ratio": FRACTIONAL_RATIO,
                                    "samples": _samples(x, seed)},
                   f"fractional max pooling: 2-wide windows at pseudo-random starts "
                   f"(int({FRACTIONAL_RATIO} n) of them along a dim of n); the gradient goes "
                   f"to each irregular window's winner"),
    "mixed": (kinds.mixed_pool, lambda x, seed: {"kernel_size": WINDOW, "alpha": 0.5},
              "mixed pooling, alpha 0.5: alpha max + (1 - alpha) average; the winner gets "
              "alpha + (1 - alpha) / 4, the others (1 - alpha) / 4"),
    "gated": (kinds.gated_pool,
              lambda x, seed: {"gate": np.full((WINDOW, WINDOW), GATE), "kernel_size": WINDOW},
              f"gated pooling, gate weights {GATE}: s max + (1 - s) average with s = "
              f"sigmoid(gate . window): mixed pooling's split, plus the gate's own path"),
}
KINDS = tuple(KIND_RULES)


def _samples(x, seed):
    """Fractional pooling's draws, one ``(W, H)`` pair per plane (PyTorch's order)."""
    return np.random.default_rng(seed).random(x.shape[:2] + (2,))


def window_gradient(x: np.ndarray, kind: str, seed: int = 0, output=None) -> dict:
    """For ``(N, H, W)`` maps: ``kind`` pooled with 2-wide windows (see
    :data:`KIND_RULES`), and the gradient of one output (``output``, ``(i, j)``; default
    the middle one) routed back, every example's its own: ``dx`` ``(N, H, W)``. The
    stochastic draw takes non-negative maps: negative values are set to 0 first, as a
    ReLU before the pool would. Also ``y``, the ``rule`` and, for fractional pooling,
    each example's ``windows``."""
    if kind not in KIND_RULES:
        raise ExplainError(f"unknown kind {kind!r}: choose one of {', '.join(KINDS)}")
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3 or min(x.shape[1:]) < 2 * WINDOW:
        raise ExplainError(f"--kind {kind} explains (N, H, W) maps of at least "
                           f"{2 * WINDOW}x{2 * WINDOW}, got shape {x.shape}")
    if kind == "stochastic":
        x = np.maximum(x, 0.0)
    op, arguments, rule = KIND_RULES[kind]
    batch = x[:, None]
    y, pullback = vjp(op, batch, **arguments(batch, seed))
    out = y.shape[2:]
    if output is None:
        output = tuple(n // 2 for n in out)
    if (not isinstance(output, (tuple, list)) or len(output) != 2
            or not all(is_int(o) and 0 <= o < n for o, n in zip(output, out, strict=True))):
        raise ExplainError(f"output must be a position (i, j) of the {out[0]}x{out[1]} "
                           f"output, got {output!r}")
    output = tuple(int(o) for o in output)
    dy = np.zeros_like(y)
    dy[(slice(None), 0) + output] = 1
    dx = pullback(dy)
    dx = dx[0] if isinstance(dx, tuple) else dx  # learned parameters' part aside
    numbers = {"kind": kind, "rule": rule, "x": x, "y": y[:, 0], "dx": dx[:, 0],
               "output": output, "seed": seed}
    if kind == "fractional":  # each example's window starts, as the pullback keeps them
        starts = pullback.saved["starts"]
        numbers["windows"] = [(starts[n, -2, :out[0]], starts[n, -1, :out[1]])
                              for n in range(len(x))]
    if kind == "stochastic":  # the draw: each tap's probability, and the tap drawn
        i, j = (WINDOW * o for o in output)
        window = x[:, i:i + WINDOW, j:j + WINDOW]
        total = window.sum(axis=(1, 2), keepdims=True)
        numbers["probabilities"] = np.divide(window, total, out=np.zeros_like(window),
                                             where=total > 0)
        numbers["window"] = (i, j)
    return numbers


def render_window(numbers: dict, examples: int = 1) -> str:
    """The terminal grids: per example, the input (``[x]`` where gradient lands) and
    the gradient routed back, with the kind's rule on top."""
    i, j = numbers["output"]
    lines = [f"{numbers['kind']}: {numbers['rule']}",
             f"the gradient of output ({i}, {j}) (dy = 1 there, 0 elsewhere), routed back:"]
    for n in range(min(examples, len(numbers["x"]))):
        dx = numbers["dx"][n]
        lines.append(f"example {n}: input ([x] receives gradient)")
        lines += ["  " + " ".join(f"[{v:5.2f}]" if g else f" {v:5.2f} "
                                  for v, g in zip(row, grow, strict=True))
                  for row, grow in zip(numbers["x"][n], dx, strict=True)]
        if "probabilities" in numbers:
            drawn = np.argwhere(dx)[0]
            probabilities = numbers["probabilities"][n].ravel()
            lines.append(f"example {n}: the window at {numbers['window']} draws its taps with "
                         f"probabilities {' '.join(f'{p:.2f}' for p in probabilities)}; it "
                         f"drew ({drawn[0]}, {drawn[1]})" + (
                             "" if probabilities.any() else
                             " (a window of zeros gives its first element)"))
        if "windows" in numbers:
            starts_h, starts_w = numbers["windows"][n]
            lines.append(f"example {n}: its windows start at rows {starts_h.tolist()} and "
                         f"columns {starts_w.tolist()} ({WINDOW} wide each)")
        lines.append(f"example {n}: its gradient (sum {dx.sum():.3f})")
        lines += ["  " + " ".join(f" {v:5.3f} " if v else "    .    " for v in row)
                  for row in dx]
    return "\n".join(lines)


def draw_window(numbers: dict, path: str, examples: int = 3, description: str = "") -> str:
    """``KIND.png``: per example, the input with the positions that receive gradient
    outlined (fractional pooling: its windows drawn), the pooled output with the chosen
    output outlined, and the gradient routed back, its values written in."""
    from matplotlib.patches import Rectangle

    from .figures import draw_grid, save_adjusted, subplots
    rows = min(examples, len(numbers["x"]))
    figure, grid = subplots(rows, 3, (11, 3.7 * rows + 0.9), squeeze=False)
    i, j = numbers["output"]
    for n in range(rows):
        left, middle, right = grid[n]
        draw_grid(left, numbers["x"][n], f"example {n}: input (gradient lands in red)",
                  cmap="Greys", annotate=False)
        for h, w in np.argwhere(numbers["dx"][n]):
            left.add_patch(Rectangle((w - 0.5, h - 0.5), 1, 1, fill=False, lw=2,
                                     edgecolor="red"))
        if "windows" in numbers:  # where every window starts, and the chosen one whole
            starts_h, starts_w = numbers["windows"][n]
            for start in starts_h:
                left.axhline(start - 0.5, color="tab:blue", lw=0.8, alpha=0.5)
            for start in starts_w:
                left.axvline(start - 0.5, color="tab:blue", lw=0.8, alpha=0.5)
            left.add_patch(Rectangle((starts_w[j] - 0.5, starts_h[i] - 0.5), WINDOW, WINDOW,
                                     fill=False, lw=2.5, edgecolor="tab:blue"))
            left.set_title(f"example {n}: input; window starts (lines),\noutput ({i}, {j})'s "
                           f"window (blue)", fontsize=9)
        if "probabilities" in numbers:  # the window drawn from, and its taps' chances
            top, first = numbers["window"]
            left.add_patch(Rectangle((first - 0.5, top - 0.5), WINDOW, WINDOW, fill=False,
                                     lw=2.5, edgecolor="tab:blue"))
            chances = " ".join(f"{p:.2f}" for p in numbers["probabilities"][n].ravel())
            left.set_title(f"example {n}: window (blue) draws with p = {chances};\nthe "
                           f"drawn tap gets the gradient (red)", fontsize=9)
        draw_grid(middle, numbers["y"][n], f"{numbers['kind']}-pooled output; dy = 1 at "
                  f"({i}, {j})", cmap="Greys", fmt="{:.2f}")
        middle.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=3,
                                   edgecolor="red"))
        draw_grid(right, numbers["dx"][n], f"gradient routed back (sum "
                  f"{numbers['dx'][n].sum():.3f})", cmap="coolwarm", centered=True,
                  fmt="{:.2f}")
    figure.suptitle(f"where the gradient of one output goes: {numbers['rule']}"
                    + (f"\n{description}" if description else ""), fontsize=10, wrap=True)
    return save_adjusted(figure, path, top=1 - 1.0 / (3.7 * rows + 0.9), hspace=0.3,
                         wspace=0.1)
