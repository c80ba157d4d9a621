"""Windows of any width, forward and backward: wider than 64 taps along W (where a kernel
once took the width as the number of dims of an array, which NumPy caps at 64), wider
than 256 taps (winners no longer fit a uint8), and global and adaptive pools over large
maps. Checked against the naive reference and against PyTorch."""

import numpy as np
import pytest
from naive import adaptive_windows, pool, sliding_windows
from test_torch_parity import autograd as torch_autograd

import poolgrad as pg

torch = pytest.importorskip("torch")
F = torch.nn.functional


def distinct(shape, rng, dtype=np.float64):
    """Values without ties, so every window has one winner whatever the tie rule."""
    return rng.permutation(np.prod(shape)).reshape(shape).astype(dtype) / 7 - 50


@pytest.mark.parametrize("kernel", [65, 100, 255, 256, 257, 300])
def test_1d_windows_wider_than_64_match_the_reference_and_torch(kernel):
    rng = np.random.default_rng(kernel)
    length = kernel + 37
    x = distinct((2, 3, length), rng)
    stride = kernel // 3
    windows = sliding_windows((length,), (kernel,), (stride,), (1,), ((1, 1),), False)
    for kind, run, torch_run in (
            ("max", lambda: pg.vjp(pg.max_pool, x, kernel, stride, 1, return_indices=True),
             lambda t: F.max_pool1d(t, kernel, stride, 1, return_indices=True)),
            ("avg", lambda: pg.vjp(pg.avg_pool, x, kernel, stride, 1),
             lambda t: F.avg_pool1d(t, kernel, stride, 1)),
            ("lp", lambda: pg.vjp(pg.lp_pool, x, 2, kernel, stride, 1), None)):
        y, pullback = run()
        values = y[0] if kind == "max" else y
        dy = rng.standard_normal(values.shape)
        dx = pullback(dy)
        want_y, want_dx, want_indices = pool(x, windows, kind, dy)
        np.testing.assert_allclose(values, want_y, rtol=1e-12)
        np.testing.assert_allclose(dx, want_dx, rtol=1e-12, atol=1e-13)
        if kind == "max":
            assert pullback.saved["window_positions"].dtype == (
                np.uint8 if kernel <= 256 else np.uint16)
            np.testing.assert_array_equal(y[1], want_indices)
            np.testing.assert_array_equal(values, want_y)  # max is exact
            np.testing.assert_array_equal(dx, want_dx)
        if torch_run is not None:
            out, torch_dx = torch_autograd(torch_run, x, dy)
            torch_y = out[0] if kind == "max" else out
            np.testing.assert_allclose(values, torch_y.detach().numpy(), rtol=1e-12)
            np.testing.assert_allclose(dx, torch_dx, rtol=1e-12, atol=1e-13)
            if kind == "max":
                np.testing.assert_array_equal(y[1], out[1].numpy())


@pytest.mark.parametrize("size", [65, 112])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_and_adaptive_max_over_large_maps(size, dtype):
    """A global max over a 65x65 or 112x112 map is one window of 4,225 or 12,544 taps
    (uint16 winners); adaptive max from 65 or 112 down to 1 and to 3 bins."""
    rng = np.random.default_rng(size)
    x = distinct((2, 3, size, size), rng, dtype)
    x[1, 2, 5, 7] = np.nan  # NaN wins its window, and gets the gradient
    dy = rng.standard_normal((2, 3, 1, 1)).astype(dtype)
    y, pullback = pg.vjp(pg.global_max_pool, x)
    xt = torch.tensor(x, requires_grad=True)
    torch_y = F.adaptive_max_pool2d(xt, 1)
    torch_y.backward(torch.tensor(dy))
    assert y.tobytes() == torch_y.detach().numpy().tobytes()
    assert pullback(dy).tobytes() == xt.grad.numpy().tobytes()
    assert pullback.saved["window_positions"].dtype == np.uint16
    for bins in (1, 3, (1, 4)):
        (y, indices), pullback = pg.vjp(pg.adaptive_max_pool, x, bins, return_indices=True)
        out, torch_dx = torch_autograd(lambda t, bins=bins: F.adaptive_max_pool2d(
            t, bins, return_indices=True), x, np.ones(y.shape, dtype))
        assert y.tobytes() == out[0].detach().numpy().tobytes()
        np.testing.assert_array_equal(indices, out[1].numpy())
        assert pullback(np.ones_like(y)).tobytes() == torch_dx.tobytes()
    # the naive reference, on the float64 map without the NaN
    clean = distinct((1, 2, size, size), rng)
    windows = adaptive_windows((size, size), (3, 3))
    want_y, want_dx, _ = pool(clean, windows, "max", np.ones((1, 2, 3, 3)))
    y, pullback = pg.vjp(pg.adaptive_max_pool, clean, 3)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(pullback(np.ones_like(y)), want_dx)


def test_3d_windows_of_more_than_256_taps_keep_uint16_winners():
    rng = np.random.default_rng(3)
    x = distinct((1, 2, 9, 10, 11), rng)
    kernel, stride = (7, 7, 7), (2, 3, 4)  # 343 taps
    windows = sliding_windows((9, 10, 11), kernel, stride, (1, 1, 1), ((1, 1),) * 3, False)
    (y, indices), pullback = pg.vjp(pg.max_pool, x, kernel, stride, 1, return_indices=True)
    assert pullback.saved["window_positions"].dtype == np.uint16
    dy = rng.standard_normal(y.shape)
    want_y, want_dx, want_indices = pool(x, windows, "max", dy)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(indices, want_indices)
    np.testing.assert_array_equal(pullback(dy), want_dx)
    out, torch_dx = torch_autograd(lambda t: F.max_pool3d(t, kernel, stride, 1,
                                                          return_indices=True), x, dy)
    np.testing.assert_array_equal(indices, out[1].numpy())
    np.testing.assert_array_equal(pullback(dy), torch_dx)
    avg, pullback = pg.vjp(pg.avg_pool, x, kernel, stride, 1)
    out, torch_dx = torch_autograd(lambda t: F.avg_pool3d(t, kernel, stride, 1), x, dy)
    np.testing.assert_allclose(avg, out.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(pullback(dy), torch_dx, rtol=1e-12)


def test_every_window_width_from_1_to_300():
    """Max, average and Lp along W for every width 1 to 300 (stride 1 and stride = width,
    the two geometries with kernels of their own), forward and backward, against
    PyTorch: max bit for bit, the sums within rounding."""
    rng = np.random.default_rng(300)
    length = 311
    x = rng.standard_normal((1, 2, 2, length))  # two rows: 2-d calls, W windows
    x[0, 1, 1] = rng.integers(-2, 3, length)  # a row of ties
    xt = torch.tensor(x, requires_grad=True)
    for width in range(1, 301):
        for stride in sorted({1, width}):
            args = ((1, width), (1, stride))
            for op, torch_op in ((pg.max_pool, F.max_pool2d), (pg.avg_pool, F.avg_pool2d),
                                 (pg.lp_pool, lambda t, *a: F.lp_pool2d(t.abs(), 2, *a))):
                call = (op, x, 2) + args if op is pg.lp_pool else (op, x) + args
                y, pullback = pg.vjp(*call)
                dy = rng.standard_normal(y.shape)
                xt.grad = None
                torch_y = torch_op(xt, *args)
                torch_y.backward(torch.tensor(dy))
                dx = pullback(dy)
                if op is pg.max_pool:
                    assert y.tobytes() == torch_y.detach().numpy().tobytes(), (width, stride)
                    assert dx.tobytes() == xt.grad.numpy().tobytes(), (width, stride)
                elif op is pg.avg_pool:
                    np.testing.assert_allclose(y, torch_y.detach().numpy(), rtol=1e-11,
                                               err_msg=f"{width}, {stride}")
                    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-11, atol=1e-14,
                                               err_msg=f"{width}, {stride}")
                else:  # torch has no |x|: compare on |x|, whose gradient differs in sign
                    np.testing.assert_allclose(y, torch_y.detach().numpy(), rtol=1e-11,
                                               err_msg=f"{width}, {stride}")
                    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-10,
                                               atol=1e-13, err_msg=f"{width}, {stride}")
