"""Cross-checks against PyTorch's own pooling functions and autograd, on random configs.

Max-pool values and indices must match bit for bit; everything else within float
tolerance. Each test draws one configuration from a seeded generator, so a failure
names its seed and reproduces.
"""

import numpy as np
import pytest

import poolgrad as pg

torch = pytest.importorskip("torch")
F = torch.nn.functional

SEEDS = range(100)
TOLERANCE = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-12, atol=1e-13)}


def torch_op(name, ndim):
    return getattr(F, f"{name}{ndim}d")


def random_sliding(rng, max_kernel=4, dilated=True):
    """A config PyTorch accepts: padding at most half the kernel, windows inside."""
    ndim = int(rng.integers(1, 4))
    kernel = tuple(int(k) for k in rng.integers(1, max_kernel + 1, ndim))
    stride = tuple(int(s) for s in rng.integers(1, 4, ndim))
    dilation = tuple(int(d) for d in rng.integers(1, 3, ndim)) if dilated else (1,) * ndim
    padding = tuple(int(rng.integers(0, k // 2 + 1)) for k in kernel)
    largest = {1: 13, 2: 9, 3: 6}[ndim]
    spatial = tuple(
        int(rng.integers(d * (k - 1) + 1, d * (k - 1) + 1 + largest))
        for k, d in zip(kernel, dilation, strict=False)
    )
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4))) + spatial
    dtype = (np.float32, np.float64)[int(rng.integers(2))]
    return ndim, kernel, stride, dilation, padding, bool(rng.integers(2)), shape, dtype


def autograd(fn, x, dy):
    """torch's forward and gradient of ``fn`` at ``x`` for upstream ``dy``."""
    xt = torch.tensor(x, requires_grad=True)
    out = fn(xt)
    values = out[0] if isinstance(out, tuple) else out
    values.backward(torch.tensor(dy))
    return out, xt.grad.numpy()


@pytest.mark.parametrize("seed", SEEDS)
def test_max_pool(seed):
    rng = np.random.default_rng(seed)
    ndim, kernel, stride, dilation, padding, ceil_mode, shape, dtype = random_sliding(rng)
    # half the configs have many ties (small integers), where "first" must match torch
    if seed % 2:
        x = rng.integers(-3, 4, shape).astype(dtype)
    else:
        x = rng.standard_normal(shape).astype(dtype)
    args = dict(kernel_size=kernel, stride=stride, padding=padding, dilation=dilation,
                ceil_mode=ceil_mode)
    (y, indices), pullback = pg.vjp(pg.max_pool, x, return_indices=True, **args)
    dy = rng.standard_normal(y.shape).astype(dtype)
    (yt, it), grad = autograd(lambda t: torch_op("max_pool", ndim)(t, return_indices=True,
                                                                   **args), x, dy)
    np.testing.assert_array_equal(y, yt.detach().numpy())
    np.testing.assert_array_equal(indices, it.numpy())
    np.testing.assert_allclose(pullback(dy), grad, **TOLERANCE[dtype])


@pytest.mark.parametrize("seed", SEEDS)
def test_avg_pool(seed):
    rng = np.random.default_rng(1000 + seed)
    ndim, kernel, stride, _, padding, ceil_mode, shape, dtype = random_sliding(rng, dilated=False)
    count_include_pad = bool(rng.integers(2))
    divisor_override = int(rng.integers(1, 7)) if ndim > 1 and seed % 3 == 0 else None
    x = rng.standard_normal(shape).astype(dtype)
    args = dict(kernel_size=kernel, stride=stride, padding=padding, ceil_mode=ceil_mode,
                count_include_pad=count_include_pad)
    torch_args = dict(args, divisor_override=divisor_override) if ndim > 1 else args
    y, pullback = pg.vjp(pg.avg_pool, x, divisor_override=divisor_override, **args)
    dy = rng.standard_normal(y.shape).astype(dtype)
    yt, grad = autograd(lambda t: torch_op("avg_pool", ndim)(t, **torch_args), x, dy)
    np.testing.assert_allclose(y, yt.detach().numpy(), **TOLERANCE[dtype])
    np.testing.assert_allclose(pullback(dy), grad, **TOLERANCE[dtype])


@pytest.mark.parametrize("seed", range(40))
def test_lp_pool(seed):
    # torch's lp_pool has no padding or dilation, and its ceil_mode divides partial
    # windows by their clipped size; compare where the two definitions agree:
    # non-negative inputs, no padding, floor mode.
    rng = np.random.default_rng(2000 + seed)
    ndim, kernel, stride, _, _, _, shape, dtype = random_sliding(rng, dilated=False)
    p = [1.0, 2.0, 3.0, 1.5][seed % 4]
    x = rng.uniform(0.1, 2.0, shape).astype(dtype)
    y, pullback = pg.vjp(pg.lp_pool, x, p, kernel, stride)
    dy = rng.standard_normal(y.shape).astype(dtype)
    # torch's lp_pool1d wants plain ints
    tk, ts = (kernel[0], stride[0]) if ndim == 1 else (kernel, stride)
    yt, grad = autograd(lambda t: torch_op("lp_pool", ndim)(t, p, tk, ts), x, dy)
    loose = dict(rtol=1e-4, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(y, yt.detach().numpy(), **loose)
    np.testing.assert_allclose(pullback(dy), grad, **loose)


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_adaptive(seed, kind):
    rng = np.random.default_rng(3000 + seed)
    ndim = int(rng.integers(1, 4))
    spatial = tuple(int(s) for s in rng.integers(1, {1: 20, 2: 12, 3: 7}[ndim], ndim))
    # output sizes below, equal to and above the input size (bins then overlap)
    out = tuple(int(rng.integers(1, s + 3)) for s in spatial)
    dtype = (np.float32, np.float64)[seed % 2]
    x = rng.standard_normal((2, 3) + spatial).astype(dtype)
    dy = rng.standard_normal((2, 3) + out).astype(dtype)
    if kind == "max":
        (y, indices), pullback = pg.vjp(pg.adaptive_max_pool, x, out, return_indices=True)
        (yt, it), grad = autograd(
            lambda t: torch_op("adaptive_max_pool", ndim)(t, out, return_indices=True), x, dy)
        np.testing.assert_array_equal(y, yt.detach().numpy())
        np.testing.assert_array_equal(indices, it.numpy())
    else:
        y, pullback = pg.vjp(pg.adaptive_avg_pool, x, out)
        yt, grad = autograd(lambda t: torch_op("adaptive_avg_pool", ndim)(t, out), x, dy)
        np.testing.assert_allclose(y, yt.detach().numpy(), **TOLERANCE[dtype])
    np.testing.assert_allclose(pullback(dy), grad, **TOLERANCE[dtype])


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("kind", ["max", "avg", "lp"])
def test_global(seed, kind):
    rng = np.random.default_rng(4000 + seed)
    ndim = int(rng.integers(1, 4))
    spatial = tuple(int(s) for s in rng.integers(1, 8, ndim))
    dtype = (np.float32, np.float64)[seed % 2]
    x = rng.standard_normal((3, 2) + spatial).astype(dtype)
    dy = rng.standard_normal((3, 2) + (1,) * ndim).astype(dtype)
    dims = tuple(range(2, 2 + ndim))
    if kind == "max":
        y, pullback = pg.vjp(pg.global_max_pool, x)
        reference = lambda t: t.amax(dim=dims, keepdim=True)  # noqa: E731
    elif kind == "avg":
        y, pullback = pg.vjp(pg.global_avg_pool, x)
        reference = lambda t: t.mean(dim=dims, keepdim=True)  # noqa: E731
    else:
        y, pullback = pg.vjp(pg.global_lp_pool, x, 3)
        reference = lambda t: t.abs().pow(3).sum(dim=dims, keepdim=True).pow(1 / 3)  # noqa: E731
    yt, grad = autograd(reference, x, dy)
    np.testing.assert_allclose(y, yt.detach().numpy(), **TOLERANCE[dtype])
    np.testing.assert_allclose(pullback(dy), grad, **TOLERANCE[dtype])


@pytest.mark.parametrize("seed", range(30))
def test_max_unpool(seed):
    rng = np.random.default_rng(5000 + seed)
    ndim = int(rng.integers(1, 4))
    kernel = tuple(int(k) for k in rng.integers(1, 4, ndim))
    # stride >= kernel: windows do not overlap, so no two indices coincide and
    # torch's gradient (a plain gather) is exact
    stride = tuple(k + int(rng.integers(0, 2)) for k in kernel)
    padding = tuple(int(rng.integers(0, k // 2 + 1)) for k in kernel)
    spatial = tuple(int(rng.integers(k, k + {1: 12, 2: 8, 3: 5}[ndim])) for k in kernel)
    dtype = (np.float32, np.float64)[seed % 2]
    x = rng.standard_normal((2, 2) + spatial).astype(dtype)
    y, indices = pg.max_pool(x, kernel, stride, padding, return_indices=True)
    out, pullback = pg.vjp(pg.max_unpool, y, indices, kernel, stride, padding,
                           output_size=spatial)
    dout = rng.standard_normal(out.shape).astype(dtype)
    unpool = torch_op("max_unpool", ndim)
    outt, grad = autograd(lambda t: unpool(t, torch.tensor(indices), kernel, stride, padding,
                                           output_size=spatial), y, dout)
    np.testing.assert_array_equal(out, outt.detach().numpy())
    np.testing.assert_array_equal(pullback(dout), grad)


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_float16_matches_torch_float32_path(ndim):
    """float16 is stored as float16 and computed in float32: max is exact, avg is the
    float32 result rounded once."""
    rng = np.random.default_rng(ndim)
    x = rng.standard_normal((2, 3) + (7,) * ndim).astype(np.float16)
    xt = torch.tensor(x.astype(np.float32))
    y = pg.max_pool(x, 3, 2, 1)
    assert y.dtype == np.float16
    expected = torch_op("max_pool", ndim)(xt, 3, 2, 1).numpy().astype(np.float16)
    np.testing.assert_array_equal(y, expected)
    a = pg.avg_pool(x, 3, 2, 1)
    assert a.dtype == np.float16
    expected = torch_op("avg_pool", ndim)(xt, 3, 2, 1).numpy().astype(np.float16)
    np.testing.assert_array_equal(a, expected)
