"""Where each example's gradient goes through a pooling layer, as numbers:
:func:`route` pools a batch of single-channel maps with the core's :func:`poolgrad.vjp`
and collects what a lecture on pooling's backward pass shows, a :class:`Routing`: each
example's routed gradient, how many examples send gradient to each input position, the
batch gradient (the sum of the per-example ones), and how many windows cover each
position. :func:`classic_routings` holds the classic 4x4 diagram's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import nn, ops
from ..tools.choices import check_choice

KINDS = tuple(nn.POOLING)  # the pooling layers: max, avg, lp


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
