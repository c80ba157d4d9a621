"""Every operator and option against central finite differences, in float64.

Inputs are tie-free and away from zero (distinct half-integers times 0.1), so each
operator is smooth within the finite-difference step.
"""

import math

import numpy as np
import pytest

import poolgrad as pg

STEP = 1e-6


def tie_free(shape, seed):
    rng = np.random.default_rng(seed)
    size = math.prod(shape)
    return ((rng.permutation(size) - size / 2 + 0.5) * 0.1).reshape(shape)


def numerical_vjp(fn, x, dy):
    """d/dx of sum(dy * fn(x)), one element at a time."""
    grad = np.zeros_like(x)
    flat_x, flat_grad = x.reshape(-1), grad.reshape(-1)
    for i in range(flat_x.size):
        saved = flat_x[i]
        flat_x[i] = saved + STEP
        up = np.sum(dy * fn(x))
        flat_x[i] = saved - STEP
        down = np.sum(dy * fn(x))
        flat_x[i] = saved
        flat_grad[i] = (up - down) / (2 * STEP)
    return grad


CASES = [
    # (operator, input shape, args, kwargs)
    (pg.max_pool, (2, 2, 9), (3,), dict(stride=2, padding=1)),
    (pg.max_pool, (2, 2, 5, 6), (2,), {}),
    (pg.max_pool, (1, 2, 7, 6), ((3, 2),), dict(stride=(2, 1), padding=((2, 0), (1, 1)))),
    (pg.max_pool, (1, 2, 8, 7), (2,), dict(stride=1, dilation=(2, 3), ceil_mode=True)),
    (pg.max_pool, (1, 1, 7, 7), (3,), dict(stride=2, padding="same", ties="split")),
    (pg.max_pool, (1, 2, 4, 5, 4), (2,), dict(stride=(1, 2, 2), ceil_mode=True)),
    (pg.max_pool, (2, 5, 5), ((2, 2),), dict(return_indices=True)),  # unbatched
    (pg.avg_pool, (2, 2, 9), (3,), dict(stride=2, padding=1)),
    (pg.avg_pool, (1, 2, 7, 6), (3,), dict(stride=2, padding=1, count_include_pad=False,
                                           ceil_mode=True)),
    (pg.avg_pool, (1, 2, 7, 6), (3,), dict(stride=2, padding=1, ceil_mode=True)),
    (pg.avg_pool, (1, 2, 6, 6), (2,), dict(dilation=2, stride=1, divisor_override=3)),
    (pg.avg_pool, (1, 2, 4, 5, 4), (2,), dict(padding=((1, 0), (0, 1), (1, 1)))),
    (pg.lp_pool, (2, 2, 9), (2.0, 3), dict(stride=2, padding=1)),
    (pg.lp_pool, (1, 2, 6, 7), (1.0, 2), dict(stride=1)),
    (pg.lp_pool, (1, 2, 6, 7), (3.0, (2, 3)), dict(ceil_mode=True, stride=2)),
    (pg.lp_pool, (1, 2, 7, 6), (0.7, 3), dict(dilation=(1, 2), stride=1, padding="same")),
    (pg.lp_pool, (1, 2, 4, 4, 4), (2.5, 2), {}),
    (pg.global_max_pool, (2, 3, 5, 4), (), {}),
    (pg.global_avg_pool, (2, 3, 7), (), {}),
    (pg.global_lp_pool, (2, 2, 3, 3, 3), (2.0,), {}),
    (pg.adaptive_max_pool, (2, 2, 7, 5), ((3, 4),), {}),
    (pg.adaptive_max_pool, (1, 2, 5), (8,), dict(ties="split")),
    (pg.adaptive_avg_pool, (2, 2, 7, 5), ((3, 7),), {}),
    (pg.adaptive_avg_pool, (1, 2, 3, 4, 5), (2,), {}),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_pullback_matches_finite_differences(case):
    op, shape, args, kwargs = CASES[case]
    x = tie_free(shape, case)
    y, pullback = pg.vjp(op, x, *args, **kwargs)
    if isinstance(y, tuple):
        y = y[0]
    dy = np.random.default_rng(100 + case).standard_normal(y.shape)

    def forward(v):
        out = op(v, *args, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    np.testing.assert_allclose(pullback(dy), numerical_vjp(forward, x.copy(), dy),
                               rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_max_unpool_matches_finite_differences(ndim):
    x = tie_free((1, 2) + (6,) * ndim, ndim)
    y, indices = pg.max_pool(x, 2, 2, return_indices=True)
    out, pullback = pg.vjp(pg.max_unpool, y, indices, 2)
    dout = np.random.default_rng(ndim).standard_normal(out.shape)
    expected = numerical_vjp(lambda v: pg.max_unpool(v, indices, 2), y.copy(), dout)
    np.testing.assert_allclose(pullback(dout), expected, rtol=1e-6, atol=1e-8)
