"""Translation invariance, ``poolgrad explain --invariance``: how many pooled outputs
stay the same when the input shifts, for max and average pooling, and its figure.
:func:`unchanged_outputs` is the measure for any pooling (``poolgrad study`` applies it
to a trained network's first downsampling)."""

from __future__ import annotations

import numpy as np

from .. import ops
from .figures import save, subplots
from .routing import ExplainError


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
    figure, axes = subplots(1, 1, (7, 4))
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
    return save(figure, path)
