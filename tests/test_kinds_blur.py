"""Anti-aliased pooling (blur_pool, max_blur_pool, avg_blur_pool) against a NumPy
reference written from the definition, finite differences, kornia, and the core's
max pooling."""

import itertools
import math

import numpy as np
import pytest

import poolgrad as pg
from tests.test_gradcheck import numerical_vjp, tie_free

NUMPY_PAD = {"reflect": "reflect", "replicate": "edge", "zeros": "constant",
             "circular": "wrap"}


def binomial(size):
    row = np.array([math.comb(size - 1, t) for t in range(size)], dtype=np.float64)
    return row / row.sum()


def reference(x, pre, kernel, stride, size, pads, mode):
    """The definition: stride-1 max or mean over ``kernel`` (no padding), pad with
    ``mode``, correlate with the outer product of binomial filters, keep every
    ``stride``-th output. ``x`` is ``(N, C, *spatial)`` float64."""
    ndim = x.ndim - 2
    if pre != "none":
        windows = np.lib.stride_tricks.sliding_window_view(x, kernel, axis=tuple(range(2, x.ndim)))
        reduce = np.max if pre == "max" else np.mean
        x = reduce(windows, axis=tuple(range(x.ndim, x.ndim + ndim)))
    padded = np.pad(x, [(0, 0), (0, 0)] + list(pads), mode=NUMPY_PAD[mode])
    weights = binomial(size[0])
    for f in size[1:]:
        weights = np.multiply.outer(weights, binomial(f))
    out_spatial = [(p - f) // s + 1 for p, f, s in zip(padded.shape[2:], size, stride,
                                                           strict=True)]
    y = np.zeros(x.shape[:2] + tuple(out_spatial))
    for o in itertools.product(*(range(n) for n in out_spatial)):
        window = padded[(slice(None), slice(None)) + tuple(
            slice(i * s, i * s + f) for i, s, f in zip(o, stride, size, strict=True))]
        y[(slice(None), slice(None)) + o] = np.sum(window * weights, axis=tuple(
            range(2, 2 + ndim)))
    return y


def default_pads(size):
    return [((f - 1) // 2, f - 1 - (f - 1) // 2) for f in size]


CASES = [
    # (op, pre, shape, kernel, stride, filter_size, padding, mode)
    (pg.blur_pool, "none", (2, 3, 11), 1, 2, 3, None, "reflect"),
    (pg.blur_pool, "none", (1, 2, 9, 8), 1, 2, 4, None, "replicate"),
    (pg.blur_pool, "none", (1, 2, 9, 8), 1, (2, 3), (5, 2), None, "zeros"),
    (pg.blur_pool, "none", (1, 1, 5, 6, 7), 1, 2, 3, None, "circular"),
    (pg.blur_pool, "none", (1, 2, 8, 7), 1, 1, 7, ((3, 3), (0, 2)), "replicate"),
    (pg.max_blur_pool, "max", (2, 2, 12), 2, 2, 3, None, "reflect"),
    (pg.max_blur_pool, "max", (1, 2, 9, 10), 2, 2, 3, None, "reflect"),
    (pg.max_blur_pool, "max", (1, 2, 9, 10), (3, 2), 3, 5, None, "zeros"),
    (pg.max_blur_pool, "max", (1, 1, 6, 7, 5), 2, 2, 2, None, "replicate"),
    (pg.max_blur_pool, "max", (1, 2, 9, 8), 2, 2, 1, None, "circular"),
    (pg.avg_blur_pool, "avg", (1, 2, 10, 9), 2, 2, 3, None, "reflect"),
    (pg.avg_blur_pool, "avg", (2, 1, 13), 3, 2, 6, ((1, 4),), "circular"),
]


def _call_args(case):
    op, pre, shape, kernel, stride, size, padding, mode = case
    kwargs = dict(stride=stride, filter_size=size, padding_mode=mode, padding=padding)
    if pre != "none":
        kwargs["kernel_size"] = kernel
    return kwargs


def _canonical(case):
    op, pre, shape, kernel, stride, size, padding, mode = case
    ndim = len(shape) - 2
    per = lambda v: (v,) * ndim if isinstance(v, int) else tuple(v)  # noqa: E731
    size = per(size)
    if padding is None:
        pads = default_pads(size)
    elif isinstance(padding, int):
        pads = [(padding, padding)] * ndim
    else:
        pads = [p if isinstance(p, tuple) else (p, p) for p in
                padding]
    return pre, per(kernel), per(stride), size, pads, mode


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].__name__}-{c[2]}-{c[7]}")
def test_matches_the_definition(case):
    x = tie_free(case[2], seed=1)
    y = case[0](x, **_call_args(case))
    expected = reference(x, *_canonical(case))
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].__name__}-{c[2]}-{c[7]}")
def test_pullback_matches_finite_differences(case):
    x = tie_free(case[2], seed=2)
    kwargs = _call_args(case)
    y, pullback = pg.vjp(case[0], x, **kwargs)
    dy = np.random.default_rng(3).standard_normal(y.shape)
    expected = numerical_vjp(lambda v: case[0](v, **kwargs), x.copy(), dy)
    np.testing.assert_allclose(pullback(dy), expected, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("op", [pg.blur_pool, pg.avg_blur_pool])
@pytest.mark.parametrize("mode", ["reflect", "replicate", "zeros", "circular"])
def test_linear_kinds_pullback_is_the_adjoint(op, mode):
    """<A x, v> = <x, A^T v> to rounding: every padding mode folds back exactly."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 2, 9, 7))
    y, pullback = pg.vjp(op, x, stride=2, filter_size=5, padding_mode=mode)
    v = rng.standard_normal(y.shape)
    assert np.vdot(y, v) == pytest.approx(np.vdot(x, pullback(v)), rel=1e-12)


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_max_map_is_the_core_max_pool(ndim):
    """Without blur and subsampling, max_blur_pool is max_pool at stride 1, bit for
    bit, forward and backward, ties and NaN included."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 4, (2, 3) + (7,) * ndim).astype(np.float32)
    x.reshape(-1)[[3, 40]] = np.nan
    y, pullback = pg.vjp(pg.max_blur_pool, x, kernel_size=3, stride=1, filter_size=1)
    y_core, pullback_core = pg.vjp(pg.max_pool, x, 3, stride=1)
    np.testing.assert_array_equal(y, y_core)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    np.testing.assert_array_equal(pullback(dy), pullback_core(dy))
    assert pullback.state_bytes_per_output == 1


def test_dtypes_layouts_and_unbatched_inputs():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 4, 10, 9))
    expected = pg.max_blur_pool(x)
    half = pg.max_blur_pool(x.astype(np.float16))
    assert half.dtype == np.float16
    np.testing.assert_allclose(half, expected, rtol=2e-3, atol=2e-3)
    single = x.astype(np.float32)
    channels_last = np.ascontiguousarray(single.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    for op in (pg.blur_pool, pg.max_blur_pool, pg.avg_blur_pool):  # channels-last in, out
        y, pullback = pg.vjp(op, channels_last)
        y_planes, pullback_planes = pg.vjp(op, single)
        dy = rng.standard_normal(y.shape).astype(np.float32)
        dx = pullback(dy)
        assert y.transpose(0, 2, 3, 1).flags.c_contiguous and not y.flags.c_contiguous
        assert dx.transpose(0, 2, 3, 1).flags.c_contiguous
        np.testing.assert_allclose(y, y_planes, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(dx, pullback_planes(dy), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(pg.max_blur_pool(channels_last), pg.max_blur_pool(single))
    # NCHW maps in flat passes, channels-last a row at a time: the same operations
    np.testing.assert_array_equal(pg.avg_blur_pool(channels_last), pg.avg_blur_pool(single))
    np.testing.assert_array_equal(pg.blur_pool(x[0], stride=(2, 2)), pg.blur_pool(x)[0])
    read_only = x.copy()
    read_only.flags.writeable = False
    y, pullback = pg.vjp(pg.avg_blur_pool, read_only)
    pullback(np.ones_like(y))
    np.testing.assert_array_equal(read_only, x)


def test_same_bits_every_run():
    x = np.random.default_rng(7).standard_normal((4, 8, 40, 40)).astype(np.float32)
    y1, p1 = pg.vjp(pg.max_blur_pool, x, filter_size=5)
    y2, p2 = pg.vjp(pg.max_blur_pool, x, filter_size=5)
    dy = np.ones_like(y1)
    assert y1.tobytes() == y2.tobytes()
    assert p1(dy).tobytes() == p2(dy).tobytes()


@pytest.mark.parametrize("call, message", [
    (lambda x: pg.blur_pool(x, filter_size=8), "filter_size must be 1 to 7"),
    (lambda x: pg.blur_pool(x, filter_size=0), "filter_size must be >= 1"),
    (lambda x: pg.blur_pool(x, padding_mode="mirror"), "padding_mode must be one of"),
    (lambda x: pg.blur_pool(x, padding=5), "reflect padding needs padding smaller"),
    (lambda x: pg.max_blur_pool(x, kernel_size=9), "kernel_size .* is larger than the input"),
    (lambda x: pg.blur_pool(x, stride=0), "stride must be >= 1"),
    (lambda x: pg.blur_pool(x, stride=(2, 2, 2, 2)), "pools 1, 2 or 3 spatial dims"),
    (lambda x: pg.max_blur_pool(x, stride=(2, 2), filter_size=(3, 3, 3)), "disagree"),
    (lambda x: pg.blur_pool(x, filter_size=7, padding=0, padding_mode="zeros"),
     "filter_size 7 does not fit"),
])
def test_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call(np.zeros((1, 2, 5, 5)))


def test_bad_types():
    with pytest.raises(TypeError, match="x must have dtype"):
        pg.blur_pool(np.zeros((1, 1, 4, 4), dtype=np.int32))
    with pytest.raises(TypeError, match="filter_size must be an int"):
        pg.blur_pool(np.zeros((1, 1, 4, 4)), filter_size=2.5)


# -------------------------------------------------------------------------- kornia

@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("stride", [1, 2, 3])
def test_kornia_parity(size, stride):
    """kornia's BlurPool2D and MaxBlurPool2D pad with zeros, ``(k - 1) // 2`` before
    and ``k // 2`` after: padding_mode="zeros" and the default padding."""
    torch = pytest.importorskip("torch")
    kornia = pytest.importorskip("kornia")
    x = torch.randn(2, 3, 13, 12, dtype=torch.float64, requires_grad=True)
    for theirs, ours, kwargs in [
        (kornia.filters.BlurPool2D(size, stride), pg.blur_pool, {}),
        (kornia.filters.MaxBlurPool2D(size, stride, max_pool_size=2), pg.max_blur_pool,
         {"kernel_size": 2}),
        (kornia.filters.MaxBlurPool2D(size, stride, max_pool_size=3), pg.max_blur_pool,
         {"kernel_size": 3}),
    ]:
        expected = theirs(x)
        dy = torch.randn_like(expected)
        (expected_dx,) = torch.autograd.grad(expected, x, dy)
        y, pullback = pg.vjp(ours, x.detach().numpy(), stride=stride, filter_size=size,
                             padding_mode="zeros", **kwargs)
        np.testing.assert_allclose(y, expected.detach().numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(pullback(dy.numpy()), expected_dx.numpy(), rtol=1e-12,
                                   atol=1e-12)


@pytest.mark.parametrize("shape, kwargs", [
    ((2, 3, 9, 11), {}),
    ((2, 3, 10, 8), {"padding_mode": "zeros"}),
    ((1, 2, 5, 6, 7), {"padding_mode": "circular"}),  # 3-d: the general kernel
])
def test_max_blur_forward_alone_gives_the_recorded_forwards_bits(shape, kwargs):
    """A forward no backward follows keeps no winners (the rows kernels' max without
    its taps, the general kernel's winners thrown away): the bits of the forward that
    keeps them, with ties and NaN, in both layouts."""
    rng = np.random.default_rng(19)
    x = rng.integers(0, 4, shape).astype(np.float32)
    x.flat[rng.choice(x.size, 4, replace=False)] = np.nan
    layouts = [x]
    if len(shape) == 4:
        layouts.append(np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2))
    for a in layouts:
        alone = pg.max_blur_pool(a, 2, **kwargs)
        kept, _ = pg.vjp(pg.max_blur_pool, a, 2, **kwargs)
        assert alone.tobytes() == kept.tobytes()
        assert np.isnan(alone).any() and alone.strides == kept.strides


@pytest.mark.parametrize("pre", ["none", "max", "avg"])
def test_a_window_of_negative_zeros_gives_plus_zero_in_both_layouts(pre):
    """The sums start from +0, so -0 inputs give +0 in every kernel: the fused 3-tap
    W pass loads its +0 (fast-math would drop a literal's sign)."""
    x = np.full((1, 3, 6, 8), -0.0, np.float32)
    call = {"none": lambda a: pg.blur_pool(a, 2, 3),
            "max": lambda a: pg.max_blur_pool(a, 2, 2, 3),
            "avg": lambda a: pg.avg_blur_pool(a, 2, 2, 3)}[pre]
    for a in (x, np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)):
        y = call(a)
        assert y.size and not np.signbit(y).any()


@pytest.mark.parametrize("pre", ["none", "max", "avg"])
def test_a_3d_blur_with_nothing_to_do_along_depth_keeps_every_slice(pre):
    """A 3-d blur whose filter and stride along D are 1 still pools every D slice (the
    rows kernels, which read one slice, took the first alone and left the rest
    unwritten)."""
    rng = np.random.default_rng(23)
    x = rng.standard_normal((2, 3, 3, 6, 7))
    kernel = (1, 2, 2)
    call = {"none": lambda a: pg.blur_pool(a, (1, 2, 2), (1, 3, 3)),
            "max": lambda a: pg.max_blur_pool(a, kernel, (1, 2, 2), (1, 3, 3)),
            "avg": lambda a: pg.avg_blur_pool(a, kernel, (1, 2, 2), (1, 3, 3))}[pre]
    y = call(x)
    for d in range(x.shape[2]):  # each slice pooled as the 2-d blur pools it
        two_d = {"none": lambda a: pg.blur_pool(a, 2, 3),
                 "max": lambda a: pg.max_blur_pool(a, 2, 2, 3),
                 "avg": lambda a: pg.avg_blur_pool(a, 2, 2, 3)}[pre](x[:, :, d])
        np.testing.assert_allclose(y[:, :, d], two_d, rtol=1e-12, atol=1e-12)
