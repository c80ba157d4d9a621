"""``poolgrad explain --kind aps``: which polyphase component adaptive polyphase sampling
chooses for each example, and how the choice moves when the input shifts by one pixel,
next to max pooling, whose output does not just move.

:func:`phase_choices` gives the numbers (the tests check them); :func:`draw_phases`
draws them; :func:`render_phases` prints them.
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import kinds, ops
from .routing import ExplainError

STRIDE = 2  # 2x2 components, the phases (0, 0), (0, 1), (1, 0), (1, 1)


def _is_circular_shift(moved: np.ndarray, original: np.ndarray) -> bool:
    """Whether ``moved`` (H, W) is ``original`` rolled by some offset, value for value."""
    return any(np.array_equal(moved, np.roll(original, offset, axis=(0, 1)))
               for offset in itertools.product(*(range(n) for n in original.shape)))


def phase_choices(x: np.ndarray, shift: int = 1) -> dict:
    """For ``(N, H, W)`` maps, each example's APS numbers at stride 2 (l2 norm) before and
    after a circular shift of ``shift`` columns: ``norms`` ``(N, 4)`` (the squared l2
    norm of each component), ``phase`` and ``shifted_phase`` ``(N,)``, ``aps_moved``
    (whether APS's output of the shifted map is a circular shift of its output of the
    map: its promise), and for 2x2 stride-2 max pooling of the same maps ``max_moved``
    (the same question) and ``max_unchanged`` (the fraction of its outputs left as they
    were)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3:
        raise ExplainError(f"--kind aps explains (N, H, W) maps, got shape {x.shape}")
    if x.shape[1] % STRIDE or x.shape[2] % STRIDE:
        raise ExplainError(f"--kind aps explains maps of even sizes (stride 2), got "
                           f"{x.shape[1:]}")
    batch, moved = x[:, None], np.roll(x, shift, axis=2)[:, None]
    components = [x[:, a::STRIDE, b::STRIDE] for a in range(STRIDE) for b in range(STRIDE)]
    y, phase = kinds.aps_pool(batch, STRIDE, return_indices=True)
    y_moved, shifted_phase = kinds.aps_pool(moved, STRIDE, return_indices=True)
    pooled, pooled_moved = ops.max_pool(batch, 2), ops.max_pool(moved, 2)
    return {
        "norms": np.stack([np.sum(c ** 2, axis=(1, 2)) for c in components], axis=1),
        "phase": phase, "shifted_phase": shifted_phase, "shift": shift,
        "y": y[:, 0], "y_moved": y_moved[:, 0], "pooled": pooled[:, 0],
        "pooled_moved": pooled_moved[:, 0], "x": x, "x_moved": moved[:, 0],
        "aps_moved": np.array([_is_circular_shift(y_moved[n, 0], y[n, 0])
                               for n in range(len(x))]),
        "max_moved": np.array([_is_circular_shift(pooled_moved[n, 0], pooled[n, 0])
                               for n in range(len(x))]),
        "max_unchanged": (pooled_moved == pooled).reshape(len(x), -1).mean(axis=1),
    }


def render_phases(numbers: dict, examples: int) -> str:
    """The terminal table: one line per example (the first ``examples``), then the
    batch's totals."""
    lines = [f"adaptive polyphase sampling, stride 2, a shift of {numbers['shift']} column(s)",
             "example  norms of the phases (0,0) (0,1) (1,0) (1,1)   phase -> after shift  "
             "APS output moved  max pool output moved (unchanged)"]
    for n in range(min(examples, len(numbers["phase"]))):
        norms = " ".join(f"{v:7.1f}" for v in numbers["norms"][n])
        phase, after = (divmod(int(numbers[k][n]), STRIDE) for k in ("phase",
                                                                       "shifted_phase"))
        lines.append(f"{n:7d}  {norms}          {phase} -> {after}         "
                     f"{'yes' if numbers['aps_moved'][n] else 'NO':>3}               "
                     f"{'yes' if numbers['max_moved'][n] else 'no':>3} "
                     f"({numbers['max_unchanged'][n]:.0%})")
    total = len(numbers["phase"])
    lines.append(f"all {total}: APS's output is a circular shift of the unshifted one for "
                 f"{int(numbers['aps_moved'].sum())}; max pooling's for "
                 f"{int(numbers['max_moved'].sum())} (its outputs unchanged: "
                 f"{numbers['max_unchanged'].mean():.1%})")
    return "\n".join(lines)


def draw_phases(numbers: dict, path: str, examples: int = 3, description: str = "") -> str:
    """``aps.png``: for each of the first ``examples`` examples, the map, its four
    components (the chosen one outlined, with its norm), the shifted map and its chosen
    component, and max pooling's outputs of both."""
    from matplotlib.patches import Rectangle

    from .figures import draw_grid, save, subplots
    rows = min(examples, len(numbers["phase"]))
    figure, axes = subplots(rows, 9, (18, 2.6 * rows + 0.8), squeeze=False)
    for n in range(rows):
        row = axes[n]
        draw_grid(row[0], numbers["x"][n], f"example {n}", annotate=False)
        for k in range(STRIDE * STRIDE):
            a, b = divmod(k, STRIDE)
            component = numbers["x"][n, a::STRIDE, b::STRIDE]
            draw_grid(row[1 + k], component, f"phase ({a},{b}): {numbers['norms'][n, k]:.1f}",
                  annotate=False)
            if k == numbers["phase"][n]:
                row[1 + k].add_patch(Rectangle((-0.5, -0.5), component.shape[1],
                                               component.shape[0], fill=False, lw=4,
                                               edgecolor="red"))
        after = divmod(int(numbers["shifted_phase"][n]), STRIDE)
        draw_grid(row[5], numbers["x_moved"][n], f"shifted {numbers['shift']} px", annotate=False)
        draw_grid(row[6], numbers["y_moved"][n], f"APS after: phase {after}", annotate=False)
        draw_grid(row[7], numbers["pooled"][n], "max pool 2x2/2", annotate=False)
        draw_grid(row[8], numbers["pooled_moved"][n],
              f"max pool, shifted ({numbers['max_unchanged'][n]:.0%} same)", annotate=False)
    figure.suptitle("adaptive polyphase sampling picks the component of largest norm; a "
                    "circular shift moves the choice with it" + (f"\n{description}"
                                                                 if description else ""))
    return save(figure, path, top=1 - 0.7 / (2.6 * rows + 0.8))
