"""The kernels against tests/naive.py over the whole option space, PyTorch's and ONNX's:
asymmetric and oversized padding (ONNX allows pads beyond half the kernel), "same",
dilation for every kind, ceil_mode, count_include_pad, divisor_override, both tie
rules, Lp with any p, adaptive bins, unpooling with coinciding indices."""

import naive
import numpy as np
import pytest

import poolgrad as pg


def random_geometry(rng):
    """Any valid geometry (resampled until every window holds an input element)."""
    while True:
        ndim = int(rng.integers(1, 4))
        kernel = tuple(int(k) for k in rng.integers(1, 5, ndim))
        stride = tuple(int(s) for s in rng.integers(1, 4, ndim))
        dilation = tuple(int(d) for d in rng.integers(1, 3, ndim))
        spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=False)]
        pads = tuple((int(rng.integers(0, s + 1)), int(rng.integers(0, s + 1))) for s in spans)
        largest = {1: 10, 2: 7, 3: 5}[ndim]
        spatial = tuple(int(rng.integers(1, largest + 1)) for _ in range(ndim))
        ceil_mode = bool(rng.integers(2))
        try:
            windows = naive.sliding_windows(spatial, kernel, stride, dilation, pads, ceil_mode)
        except ValueError:
            continue
        if windows and all(any(inside for _, inside, _ in taps) for taps in windows.values()):
            return spatial, kernel, stride, dilation, pads, ceil_mode, windows


def draw_input(rng, spatial, ties):
    shape = (2, 2) + spatial
    if ties:
        return rng.integers(-2, 3, shape).astype(np.float64)
    return rng.standard_normal(shape)


def assert_close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("seed", range(80))
@pytest.mark.parametrize("ties", ["first", "split"])
def test_max_pool(seed, ties):
    rng = np.random.default_rng(seed)
    spatial, kernel, stride, dilation, pads, ceil_mode, windows = random_geometry(rng)
    x = draw_input(rng, spatial, ties=True)
    (y, indices), pullback = pg.vjp(pg.max_pool, x, kernel, stride, pads, dilation, ceil_mode,
                                    return_indices=True, ties=ties)
    dy = rng.standard_normal(y.shape)
    y_ref, dx_ref, indices_ref = naive.pool(x, windows, "max", dy, ties=ties)
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(indices, indices_ref)
    assert_close(pullback(dy), dx_ref)


@pytest.mark.parametrize("seed", range(80))
def test_avg_pool(seed):
    rng = np.random.default_rng(100 + seed)
    spatial, kernel, stride, dilation, pads, ceil_mode, windows = random_geometry(rng)
    count_include_pad = bool(rng.integers(2))
    divisor_override = int(rng.integers(1, 9)) if seed % 4 == 0 else None
    x = draw_input(rng, spatial, ties=False)
    y, pullback = pg.vjp(pg.avg_pool, x, kernel, stride, pads, dilation, ceil_mode,
                         count_include_pad, divisor_override)
    dy = rng.standard_normal(y.shape)
    y_ref, dx_ref, _ = naive.pool(x, windows, "avg", dy, count_include_pad=count_include_pad,
                                  divisor_override=divisor_override)
    assert_close(y, y_ref)
    assert_close(pullback(dy), dx_ref)


@pytest.mark.parametrize("seed", range(60))
def test_lp_pool(seed):
    rng = np.random.default_rng(200 + seed)
    spatial, kernel, stride, dilation, pads, ceil_mode, windows = random_geometry(rng)
    p = [1.0, 2.0, 3.0, 0.5, 1.7, 4.0][seed % 6]
    x = draw_input(rng, spatial, ties=False)
    y, pullback = pg.vjp(pg.lp_pool, x, p, kernel, stride, pads, dilation, ceil_mode)
    dy = rng.standard_normal(y.shape)
    y_ref, dx_ref, _ = naive.pool(x, windows, "lp", dy, p=p)
    np.testing.assert_allclose(y, y_ref, rtol=1e-11)
    np.testing.assert_allclose(pullback(dy), dx_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_adaptive(seed, kind):
    rng = np.random.default_rng(300 + seed)
    ndim = int(rng.integers(1, 4))
    spatial = tuple(int(s) for s in rng.integers(1, 8, ndim))
    out = tuple(int(rng.integers(1, s + 4)) for s in spatial)
    x = draw_input(rng, spatial, ties=(kind == "max"))
    windows = naive.adaptive_windows(spatial, out)
    dy = rng.standard_normal((2, 2) + out)
    if kind == "max":
        ties = ("first", "split")[seed % 2]
        (y, indices), pullback = pg.vjp(pg.adaptive_max_pool, x, out, return_indices=True,
                                        ties=ties)
        y_ref, dx_ref, indices_ref = naive.pool(x, windows, "max", dy, ties=ties)
        np.testing.assert_array_equal(indices, indices_ref)
    else:
        y, pullback = pg.vjp(pg.adaptive_avg_pool, x, out)
        y_ref, dx_ref, _ = naive.pool(x, windows, "avg", dy, count_include_pad=False)
    assert_close(y, y_ref)
    assert_close(pullback(dy), dx_ref)


@pytest.mark.parametrize("seed", range(20))
def test_same_padding_matches_explicit_pairs(seed):
    """'same' is ceil(L / stride) outputs with the odd extra pad at the end (SAME_UPPER)."""
    rng = np.random.default_rng(400 + seed)
    ndim = int(rng.integers(1, 4))
    kernel = tuple(int(k) for k in rng.integers(1, 5, ndim))
    stride = tuple(int(s) for s in rng.integers(1, 4, ndim))
    dilation = tuple(int(d) for d in rng.integers(1, 3, ndim))
    # at least one window span long: a shorter, dilated input can leave a window
    # holding only padding, which is an error (see test_bad_input)
    spatial = tuple(d * (k - 1) + 1 + int(rng.integers(0, 7))
                    for k, d in zip(kernel, dilation, strict=True))
    pads = []
    for length, k, s, d in zip(spatial, kernel, stride, dilation, strict=False):
        total = max((-(-length // s) - 1) * s + d * (k - 1) + 1 - length, 0)
        pads.append((total // 2, total - total // 2))
    x = draw_input(rng, spatial, ties=False)
    y = pg.max_pool(x, kernel, stride, "same", dilation)
    assert y.shape[2:] == tuple(-(-length // s) for length, s in zip(spatial, stride, strict=False))
    np.testing.assert_array_equal(y, pg.max_pool(x, kernel, stride, pads, dilation))
    a = pg.avg_pool(x, kernel, stride, "same", dilation, count_include_pad=False)
    assert_close(a, pg.avg_pool(x, kernel, stride, pads, dilation, count_include_pad=False))
    np.testing.assert_array_equal(pg.max_pool(x, kernel, stride, "valid", dilation),
                                  pg.max_pool(x, kernel, stride, 0, dilation))


@pytest.mark.parametrize("seed", range(30))
def test_max_unpool_with_overlapping_windows(seed):
    """Overlapping windows can pick the same input, so indices coincide: the last entry in
    row-major order is written and alone receives that place's gradient."""
    rng = np.random.default_rng(500 + seed)
    ndim = int(rng.integers(1, 4))
    kernel = tuple(int(k) for k in rng.integers(2, 4, ndim))
    stride = tuple(int(rng.integers(1, k + 1)) for k in kernel)
    spatial = tuple(int(rng.integers(k, k + 5)) for k in kernel)
    x = draw_input(rng, spatial, ties=False)
    y, indices = pg.max_pool(x, kernel, stride, return_indices=True)
    out, pullback = pg.vjp(pg.max_unpool, y, indices, kernel, stride, output_size=spatial)
    dout = rng.standard_normal(out.shape)
    out_ref, dy_ref = naive.unpool(y, indices, spatial, dout)
    np.testing.assert_array_equal(out, out_ref)
    np.testing.assert_array_equal(pullback(dout), dy_ref)
    # every kept maximum goes back to where it came from
    kept = out != 0
    np.testing.assert_array_equal(out[kept], x[kept])
