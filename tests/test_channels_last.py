"""Channels-last inputs (C fastest in memory, PyTorch's channels_last format) against the
same data stored NCHW: the same bits, winners, NaN routing and gradients, and outputs
and gradients that keep the channels-last format."""

import numpy as np
import pytest

import poolgrad as pg
from poolgrad.bench.suite import channels_last

# (spatial, keyword arguments): 1, 2 and 3 dims, the row-pass geometries and others,
# padding, dilation, ceil_mode, overlapping windows
GEOMETRIES = [
    ((13,), {"kernel_size": 4, "stride": 4}),
    ((13,), {"kernel_size": 3, "stride": 1, "padding": 1, "dilation": 2}),
    ((9, 11), {"kernel_size": 2, "stride": 2}),
    ((9, 11), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ((8, 13), {"kernel_size": (3, 2), "stride": (1, 3), "padding": ((2, 0), (1, 1)),
               "ceil_mode": True}),
    ((7, 9), {"kernel_size": 3, "stride": 1, "padding": "same", "dilation": (1, 2)}),
    ((5, 6, 7), {"kernel_size": 2, "stride": 2, "ceil_mode": True}),
    ((5, 6, 7), {"kernel_size": 3, "stride": 2, "padding": 1}),
]

OPS = {
    "max": (pg.max_pool, {}),
    "max-split": (pg.max_pool, {"ties": "split"}),
    "avg": (pg.avg_pool, {}),
    "avg-real": (pg.avg_pool, {"count_include_pad": False}),
    "lp": (pg.lp_pool, {"p": 3}),
}


def is_channels_last(a: np.ndarray) -> bool:
    order = (0,) + tuple(range(2, a.ndim)) + (1,)
    return a.transpose(order).flags.c_contiguous and not a.flags.c_contiguous


def sample(spatial, dtype, seed, channels=5):
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, (3, channels) + spatial).astype(dtype)  # many ties
    x[1, 2].flat[::4] = np.nan  # NaN must win, the first one
    return x


@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("case", range(len(GEOMETRIES)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_channels_last_gives_the_nchw_bits(op_name, case, dtype):
    spatial, kwargs = GEOMETRIES[case]
    op, extra = OPS[op_name]
    kwargs = {**kwargs, **extra}
    x = sample(spatial, dtype, case)
    x_cl = channels_last(x)
    assert is_channels_last(x_cl)
    kept = x_cl.copy()

    y, pullback = pg.vjp(op, x, **kwargs)
    y_cl, pullback_cl = pg.vjp(op, x_cl, **kwargs)
    np.testing.assert_array_equal(y_cl, y)
    dy = np.random.default_rng(1).standard_normal(y.shape).astype(dtype)
    dx = pullback(dy)
    np.testing.assert_array_equal(pullback_cl(channels_last(dy)), dx)
    np.testing.assert_array_equal(pullback_cl(dy), dx)  # an NCHW dy works too
    np.testing.assert_array_equal(x_cl, kept)  # the input is never modified
    if op_name in ("max", "avg", "avg-real"):  # the kernels that run along C
        assert is_channels_last(y_cl)
        assert is_channels_last(pullback_cl(channels_last(dy)))


@pytest.mark.parametrize("case", range(len(GEOMETRIES)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_channels_last_averages_add_in_the_nchw_order(case, dtype):
    """Sums of values of many magnitudes round differently in another order (the small
    integers of ``sample`` add exactly in any order): the channels-last average must
    add its taps in the order of the NCHW kernels, and give their +0 for a window of
    -0s and their -0 for a negative mean that underflows."""
    spatial, kwargs = GEOMETRIES[case]
    rng = np.random.default_rng(case)
    shape = (2, 6) + spatial
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 7, shape)).astype(dtype)
    x[1, 2] = -0.0  # windows of -0s average to +0, as sums that start from 0 give
    # and tiny negative sums whose means underflow keep their -0
    x[1, 3] = np.where(x[1, 3] > 0, -np.finfo(dtype).smallest_subnormal, 0.0)
    for include in (True, False):
        y = pg.avg_pool(x, **kwargs, count_include_pad=include)
        y_cl = pg.avg_pool(channels_last(x), **kwargs, count_include_pad=include)
        assert np.ascontiguousarray(y_cl).tobytes() == y.tobytes()


def awkward_gradients(shape, dtype, seed):
    """Gradients whose every special value shows in the bits: -0 (which the sums turn
    into +0), infinities, a quiet and a signalling NaN (which an addition quiets)."""
    dy = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    bits = np.uint32(0x7FA00000) if dtype == np.float32 else np.uint64(0x7FF4000000000000)
    flat = dy.reshape(-1)
    flat[::7] = -0.0
    flat[3::11] = np.inf
    flat[5::13] = -np.inf
    flat[6::17] = np.nan
    flat[2::19] = bits.view(dtype)
    return dy


@pytest.mark.parametrize("case", range(len(GEOMETRIES)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_channels_last_max_gradients_have_the_nchw_bits(case, dtype):
    """Enough channels for the vector loops and their tails, and gradients whose -0s the
    array comparisons of the test above cannot tell from +0: the channels-last max
    forward and backward give the NCHW kernels' bits."""
    spatial, kwargs = GEOMETRIES[case]
    rng = np.random.default_rng(case)
    x = rng.integers(-3, 4, (2, 21) + spatial).astype(dtype)  # ties
    x.reshape(-1)[::29] = np.nan
    y, pullback = pg.vjp(pg.max_pool, x, **kwargs)
    y_cl, pullback_cl = pg.vjp(pg.max_pool, channels_last(x), **kwargs)
    assert np.ascontiguousarray(y_cl).tobytes() == y.tobytes()
    dy = awkward_gradients(y.shape, dtype, case)
    kept = dy.copy()
    dx_cl = pullback_cl(channels_last(dy))
    assert is_channels_last(dx_cl)
    assert bits_but_nan_payloads(dx_cl) == bits_but_nan_payloads(pullback(dy))
    np.testing.assert_array_equal(dy, kept)


def bits_but_nan_payloads(a: np.ndarray) -> bytes:
    """The bytes of ``a`` in C order with every NaN made the same NaN. Which NaN a sum of
    two NaNs keeps depends on the order of the operands in the CPU's instruction, which
    the two layouts' vector loops need not share; everything else must match bit for bit."""
    return np.where(np.isnan(a), np.nan, a).astype(a.dtype).tobytes()


@pytest.mark.parametrize("case", range(len(GEOMETRIES)))
def test_channels_last_indices_and_unpool(case):
    spatial, kwargs = GEOMETRIES[case]
    x = sample(spatial, np.float32, case)
    y, indices = pg.max_pool(x, return_indices=True, **kwargs)
    y_cl, indices_cl = pg.max_pool(channels_last(x), return_indices=True, **kwargs)
    np.testing.assert_array_equal(y_cl, y)
    np.testing.assert_array_equal(indices_cl, indices)
    if set(kwargs) - {"kernel_size", "stride"}:
        return  # max_unpool takes no dilation or ceil_mode; the indices are checked
    window = (kwargs["kernel_size"], kwargs["stride"])
    np.testing.assert_array_equal(pg.max_unpool(y_cl, indices_cl, *window, output_size=spatial),
                                  pg.max_unpool(y, indices, *window, output_size=spatial))


def test_channels_last_global_average_pool():
    x = sample((7, 7), np.float32, 0, channels=16)
    y, pullback = pg.vjp(pg.global_avg_pool, x)
    y_cl, pullback_cl = pg.vjp(pg.global_avg_pool, channels_last(x))
    np.testing.assert_allclose(y_cl, y, rtol=1e-6)  # the sums may run in another order
    dy = np.random.default_rng(2).standard_normal(y.shape).astype(np.float32)
    np.testing.assert_array_equal(pullback_cl(dy), pullback(dy))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(2, 70, 9, 11), (3, 5, 13), (1, 4, 2, 3, 5), (0, 3, 4, 4)])
def test_channels_last_global_average_gradient_has_the_nchw_bits(shape, dtype):
    """The channels-last global average's backward runs a kernel of its own, which
    spreads each image's shares along its rows: the planes kernel's bits for gradients
    whose -0 (kept, as PyTorch keeps it), infinities and NaN show in the bytes, on more
    rows than one parallel step takes, an empty batch included; dx stays channels-last."""
    x = np.random.default_rng(4).standard_normal(shape).astype(dtype)
    y, pullback = pg.vjp(pg.global_avg_pool, x)
    _, pullback_cl = pg.vjp(pg.global_avg_pool, channels_last(x))
    if x.size:  # (an empty array is C-contiguous too, and takes the planes kernel)
        assert pullback_cl.kernels["backward"] == "channels_last.global_avg_backward"
    dy = np.random.default_rng(5).standard_normal(y.shape).astype(dtype)
    flat = dy.reshape(-1)
    flat[::3], flat[1::7], flat[2::11] = -0.0, np.inf, np.nan
    dx, dx_cl = pullback(dy), pullback_cl(dy)
    assert np.ascontiguousarray(dx_cl).tobytes() == dx.tobytes()
    assert dx_cl.shape == x.shape
    if x.size:
        assert is_channels_last(dx_cl)
        assert np.signbit(dx_cl[0, 0]).all()  # dy[0, 0] is -0


def test_channels_last_matches_torch_channels_last():
    torch = pytest.importorskip("torch")
    # no NaN: PyTorch routes a NaN window to its last NaN, poolgrad to its first
    x = np.nan_to_num(sample((10, 12), np.float32, 3, channels=8), nan=7.0)
    x[0, 0, :4, :4] = 1.0  # tied windows
    xt = torch.from_numpy(x).contiguous(memory_format=torch.channels_last).requires_grad_()
    yt, it = torch.nn.functional.max_pool2d(xt, 3, 2, 1, return_indices=True)
    dy = np.random.default_rng(4).standard_normal(yt.shape).astype(np.float32)
    yt.backward(torch.from_numpy(dy).contiguous(memory_format=torch.channels_last))

    (y, indices), pullback = pg.vjp(pg.max_pool, channels_last(x), 3, 2, 1,
                                    return_indices=True)
    np.testing.assert_array_equal(y, yt.detach().numpy())
    np.testing.assert_array_equal(indices, it.numpy())
    np.testing.assert_array_equal(pullback(channels_last(dy)), xt.grad.numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kwargs", [{"kernel_size": 3, "stride": 2, "padding": 1},
                                    {"kernel_size": 3, "stride": 1, "dilation": 2}])
def test_channels_last_3x3_mean_adds_in_the_nchw_order(kwargs, dtype):
    """Full 3x3 windows are summed in one pass over C: in the NCHW kernels' order, which
    values of one magnitude and both signs show (most of their sums round differently
    when regrouped), on a C of several vectors plus a tail."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 37, 11, 12)).astype(dtype)
    x[1, 2] = -0.0  # a window of -0s averages to +0
    y = pg.avg_pool(x, **kwargs)
    y_cl = pg.avg_pool(channels_last(x), **kwargs)
    assert np.ascontiguousarray(y_cl).tobytes() == y.tobytes()


KINDS = [  # (operator, arguments, keywords): the kinds that pool windows (the blurs' test
    # is test_kinds_blur's)
    (pg.soft_pool, (2,), {}),
    (pg.stochastic_pool, (2,), {"rng": 4}),  # evaluation: SoftPool's kernels
    (pg.fractional_max_pool, (2,), {"output_ratio": 0.5, "rng": 4}),
    (pg.gem_pool, (3.0, 2), {}),
    (pg.mixed_pool, (2, None, 0, 0.5), {}),
]


@pytest.mark.parametrize("case", range(len(KINDS)))
def test_every_kind_keeps_channels_last_with_the_nchw_bits(case):
    """A channels-last input gives a channels-last output, indices and gradient, with
    the bits of the same data stored NCHW (fractional and stochastic pooling's draws
    returned NCHW arrays for channels-last inputs before)."""
    op, args, kwargs = KINDS[case]
    x = np.abs(sample((8, 10), np.float32, case, channels=6))
    x = np.nan_to_num(x) + 0.5  # stochastic pooling's probabilities
    stored = channels_last(x)
    y, pullback = pg.vjp(op, stored, *args, **kwargs)
    y_nchw, pullback_nchw = pg.vjp(op, x, *args, **kwargs)
    assert is_channels_last(y)
    np.testing.assert_array_equal(y, y_nchw)
    dy = np.random.default_rng(case).standard_normal(y.shape).astype(np.float32)
    for given in (dy, channels_last(dy)):
        dx = pullback(given, params=False)  # GeM's dp and mixed pooling's alone aside
        assert is_channels_last(dx)
        np.testing.assert_array_equal(dx, pullback_nchw(dy, params=False))
    if op is pg.gem_pool:  # dp: each plane's terms added in one order in either layout
        dp = pullback(channels_last(dy))[1]
        assert np.isfinite(dp) and dp == pullback_nchw(dy)[1]
    if op is pg.fractional_max_pool:
        values, indices = pg.fractional_max_pool(stored, *args, return_indices=True, **kwargs)
        assert is_channels_last(indices)
        np.testing.assert_array_equal(
            indices, pg.fractional_max_pool(x, *args, return_indices=True, **kwargs)[1])
