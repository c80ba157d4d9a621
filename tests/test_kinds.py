"""SoftPool, stochastic, GeM, mixed and gated pooling: against their papers' formulas
written window by window, finite differences (inputs and learnable parameters), seeded
determinism and bad input."""

import itertools
import math

import numpy as np
import pytest

import poolgrad as pg
from tests.test_gradcheck import numerical_vjp, tie_free

STEP = 1e-6


def windows(x, kernel, stride):
    """``(N, C, *out, *kernel)`` windows of an unpadded pooling."""
    ndim = len(kernel)
    view = np.lib.stride_tricks.sliding_window_view(x, kernel, axis=tuple(range(2, 2 + ndim)))
    return view[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)]


def flat_windows(x, kernel, stride):
    w = windows(x, kernel, stride)
    return w.reshape(w.shape[: x.ndim] + (-1,))


def soft_reference(x, kernel, stride):
    w = flat_windows(x, kernel, stride)
    e = np.exp(w)  # small inputs: the formula without the max subtracted
    return np.sum(e * w, axis=-1) / np.sum(e, axis=-1)


def stochastic_eval_reference(x, kernel, stride):
    w = flat_windows(x, kernel, stride)
    total = np.sum(w, axis=-1)
    return np.divide(np.sum(w * w, axis=-1), total, out=np.zeros_like(total), where=total != 0)


def gem_reference(x, p, kernel, stride, eps):
    w = flat_windows(np.maximum(x, eps), kernel, stride)
    return np.mean(w ** p, axis=-1) ** (1 / p)


def param_derivative(fn, value, dy):
    """d/dparam of sum(dy * fn(param)), central differences (arrays element by element)."""
    value = np.asarray(value, dtype=np.float64)
    grad = np.zeros_like(value)
    for index in np.ndindex(*value.shape):
        up, down = value.copy(), value.copy()
        up[index] += STEP
        down[index] -= STEP
        grad[index] = (np.sum(dy * fn(up)) - np.sum(dy * fn(down))) / (2 * STEP)
    return grad


# ------------------------------------------------------------------------- SoftPool

@pytest.mark.parametrize("shape, kernel, stride", [
    ((2, 3, 9), (3,), (2,)), ((1, 2, 6, 7), (2, 3), (2, 1)),
    ((1, 2, 4, 5, 4), (2, 2, 2), (1, 2, 2)),
])
def test_soft_pool_is_the_formula_and_its_gradient(shape, kernel, stride):
    x = tie_free(shape, seed=1)
    y, pullback = pg.vjp(pg.soft_pool, x, kernel, stride)
    np.testing.assert_allclose(y, soft_reference(x, kernel, stride), rtol=1e-13)
    dy = np.random.default_rng(2).standard_normal(y.shape)
    expected = numerical_vjp(lambda v: pg.soft_pool(v, kernel, stride), x.copy(), dy)
    # inputs up to +-8: the differences carry ~1e-9 of rounding
    np.testing.assert_allclose(pullback(dy), expected, rtol=1e-6, atol=1e-7)


def test_soft_pool_padding_is_never_part_of_a_window():
    x = tie_free((1, 2, 7, 6), seed=3)
    y, pullback = pg.vjp(pg.soft_pool, x, 3, 2, padding=1)
    padded = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)], constant_values=-np.inf)
    w = flat_windows(padded, (3, 3), (2, 2))
    e = np.exp(w - np.max(w, axis=-1, keepdims=True))
    np.testing.assert_allclose(y, np.sum(e * np.where(e > 0, w, 0), axis=-1)
                               / np.sum(e, axis=-1), rtol=1e-13)
    dy = np.random.default_rng(4).standard_normal(y.shape)
    expected = numerical_vjp(lambda v: pg.soft_pool(v, 3, 2, padding=1), x.copy(), dy)
    np.testing.assert_allclose(pullback(dy), expected, rtol=1e-6, atol=1e-7)


def test_soft_pool_same_padding_keeps_ceil_of_the_length():
    x = tie_free((1, 2, 7, 5), seed=4)
    y = pg.soft_pool(x, 3, 2, padding="same")
    assert y.shape == (1, 2, 4, 3)
    # "same" pads (1, 1) along both axes here: (ceil(L / 2) - 1) * 2 + 3 - L = 2
    np.testing.assert_array_equal(y, pg.soft_pool(x, 3, 2, padding=1))


def test_soft_pool_never_overflows_and_lies_between_mean_and_max():
    x = np.array([[[1000.0, 1000.0, -1000.0, 999.0]]], dtype=np.float32)
    y = pg.soft_pool(x, 2)
    assert y[0, 0, 0] == 1000.0
    assert y[0, 0, 1] == pytest.approx(999.0, abs=1e-3)
    x = np.random.default_rng(5).standard_normal((4, 5, 8, 8))
    y = pg.soft_pool(x, 2)
    assert np.all(y <= pg.max_pool(x, 2) + 1e-12) and np.all(y >= pg.avg_pool(x, 2) - 1e-12)


# ------------------------------------------------------------------------ stochastic

def test_stochastic_pool_draws_by_value_and_routes_to_the_draw():
    x = np.tile(np.array([1.0, 3.0, 0.0, 0.0]), (4000, 1, 1)).reshape(4000, 1, 4)
    y, pullback = pg.vjp(pg.stochastic_pool, x, 2, rng=0)
    assert set(np.unique(y[:, 0, 0])) == {1.0, 3.0}
    assert np.mean(y[:, 0, 0] == 3.0) == pytest.approx(0.75, abs=0.03)  # 3 / (1 + 3)
    assert np.all(y[:, 0, 1] == 0)  # a window of zeros draws its first element
    dy = np.random.default_rng(1).standard_normal(y.shape)
    dx = pullback(dy)
    drawn = np.where(y[:, 0, 0] == 3.0, 1, 0)
    np.testing.assert_array_equal(dx[np.arange(4000), 0, drawn], dy[:, 0, 0])
    np.testing.assert_array_equal(dx[np.arange(4000), 0, 1 - drawn], 0)
    np.testing.assert_array_equal(dx[:, 0, 2], dy[:, 0, 1])


def counted_draws(seed, shape):
    """The documented draws, written apart from the kernels: SplitMix64 of ``seed + (i +
    1) * 0x9E3779B97F4A7C15`` for window ``i`` (C order), top 53 bits over 2**53."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + np.arange(1, math.prod(shape) + 1, dtype=np.uint64) * (
            np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return ((z >> np.uint64(11)).astype(np.float64) / 2.0**53).reshape(shape)


def stochastic_reference(x, kernel, stride, draws):
    """Zeiler and Fergus's draw by the definition: the first tap (row-major) whose
    running sum exceeds ``u * S``, else the last positive one, else the first."""
    y = np.empty(draws.shape)
    for index in np.ndindex(*draws.shape):
        n, c, i, j = index
        taps = x[n, c, i * stride[0]:i * stride[0] + kernel[0],
                 j * stride[1]:j * stride[1] + kernel[1]].ravel()
        running, threshold, chosen = 0.0, draws[index] * taps.sum(), 0
        for t, v in enumerate(taps):
            running += v
            if v > 0:
                chosen = t
                if running > threshold:
                    break
        y[index] = taps[chosen]
    return y


@pytest.mark.parametrize("kernel, stride", [((2, 2), (2, 2)), ((3, 2), (2, 1))])
def test_stochastic_pool_draws_the_counted_stream(kernel, stride):
    """Each window's draw is the documented counted draw of the one seed the call takes
    from rng, in either layout (the 2x2 kernel and the general one)."""
    x = np.random.default_rng(3).random((2, 3, 7, 9))
    x[0, 0, :2, :2] = 0.0  # a window of zeros gives 0
    seed = np.random.default_rng(9).integers(2**63, dtype=np.uint64)
    shape = (2, 3, (7 - kernel[0]) // stride[0] + 1, (9 - kernel[1]) // stride[1] + 1)
    expected = stochastic_reference(x, kernel, stride, counted_draws(seed, shape))
    assert len(np.unique(expected)) > 20
    for stored in (x, np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)):
        y = pg.stochastic_pool(stored, kernel, stride, rng=np.random.default_rng(9))
        np.testing.assert_array_equal(y, expected)


def test_stochastic_pool_same_seed_same_bits():
    x = np.abs(np.random.default_rng(2).standard_normal((3, 4, 10, 10))).astype(np.float32)
    first, second = pg.stochastic_pool(x, 2, rng=7), pg.stochastic_pool(x, 2, rng=7)
    assert first.tobytes() == second.tobytes()
    assert first.tobytes() != pg.stochastic_pool(x, 2, rng=8).tobytes()
    generator = np.random.default_rng(7)
    assert pg.stochastic_pool(x, 2, rng=generator).tobytes() == first.tobytes()
    assert pg.stochastic_pool(x, 2, rng=generator).tobytes() != first.tobytes()  # advanced


def test_stochastic_pool_evaluation_is_the_weighted_average():
    x = np.abs(tie_free((2, 3, 6, 8), seed=6))
    x[0, 0, :2, :2] = 0  # a window of zeros
    y, pullback = pg.vjp(pg.stochastic_pool, x, 2, training=False)
    np.testing.assert_allclose(y, stochastic_eval_reference(x, (2, 2), (2, 2)), rtol=1e-13)
    assert y[0, 0, 0, 0] == 0
    x = x + 0.05  # no zeros, so the finite differences stay >= 0
    y, pullback = pg.vjp(pg.stochastic_pool, x, 2, training=False)
    dy = np.random.default_rng(7).standard_normal(y.shape)
    expected = numerical_vjp(lambda v: pg.stochastic_pool(v, 2, training=False), x.copy(), dy)
    np.testing.assert_allclose(pullback(dy), expected, rtol=1e-6, atol=1e-7)


def test_weighted_pullbacks_keep_what_their_backward_reads_and_own_it():
    """The 2x2 mean's backward recomputes y and S from x, so its pullback keeps x alone;
    SoftPool's keeps y and its norm too. Either way, changing x or y after the forward
    does not change the gradient."""
    cases = [(pg.stochastic_pool, {"training": False}, ["x"]),
             (pg.soft_pool, {}, ["x", "y", "norm"])]
    # (6, 8): windows that cover x, copied as the forward reads it; (7, 9): a copy of
    # its own
    for (op, kwargs, saved), size in itertools.product(cases, [(6, 8), (7, 9)]):
        x = np.abs(tie_free((2, 3) + size, seed=8)) + 0.05
        dy = np.random.default_rng(9).standard_normal((2, 3, 3, 4))
        y, pullback = pg.vjp(op, x, 2, **kwargs)
        assert list(pullback.saved) == saved
        np.testing.assert_array_equal(pullback.saved["x"].reshape(x.shape), x)
        expected = pullback(dy)
        changed = x.copy()
        y_changed, pullback = pg.vjp(op, changed, 2, **kwargs)
        changed *= 2
        y_changed += 1  # the caller's y: changing it must not reach the pullback either
        np.testing.assert_array_equal(pullback(dy), expected)


@pytest.mark.parametrize("height", [6, 7])  # the 2x2 kernel's own check; a pass apart
@pytest.mark.parametrize("bad", [-1e-30, np.nan])
def test_stochastic_pool_evaluation_refuses_negative_and_nan_anywhere(height, bad):
    """Evaluation refuses a negative or NaN input wherever it is, also in a row that no
    window reads, and leaves x as it was."""
    x = np.abs(tie_free((2, 3, height, 8), seed=8)).astype(np.float32)
    pg.stochastic_pool(x, 2, training=False)
    for where in ((1, 2, 0, 3), (0, 0, height - 1, 7)):
        broken = x.copy()
        broken[where] = bad
        before = broken.copy()
        with pytest.raises(ValueError, match=r"x must be >= 0 .* got a minimum of"):
            pg.stochastic_pool(broken, 2, training=False)
        np.testing.assert_array_equal(broken, before)


# ------------------------------------------------------------------------------ GeM

@pytest.mark.parametrize("kernel, stride", [(None, None), (2, None), ((3, 2), (2, 2))])
@pytest.mark.parametrize("p", [1.0, 3.0, 4.5])
def test_gem_pool_is_the_formula_with_gradients_for_x_and_p(kernel, stride, p):
    x = tie_free((2, 3, 7, 6), seed=8)  # negatives included: the clamp
    eps = 0.03  # between the inputs (multiples of 0.1 plus 0.05): no kink under the step
    y, pullback = pg.vjp(pg.gem_pool, x, p, kernel, stride, eps)
    if kernel is None:
        expected = np.mean(np.maximum(x, eps) ** p, axis=(2, 3), keepdims=True) ** (1 / p)
    else:
        k = (kernel,) * 2 if isinstance(kernel, int) else kernel
        expected = gem_reference(x, p, k, stride or k, eps)
    np.testing.assert_allclose(y, expected, rtol=1e-12)
    dy = np.random.default_rng(9).standard_normal(y.shape)
    dx, dp = pullback(dy)
    fn = lambda v: pg.gem_pool(v, p, kernel, stride, eps)  # noqa: E731
    np.testing.assert_allclose(dx, numerical_vjp(fn, x.copy(), dy), rtol=1e-6, atol=1e-7)
    assert dp == pytest.approx(float(param_derivative(
        lambda q: pg.gem_pool(x, float(q), kernel, stride, eps), p, dy)), rel=1e-6)


@pytest.mark.parametrize("layout, kernel", [
    ("nchw", "power_mean.gem_global_{}_planes"),
    ("channels_last", "power_mean.gem_global_{}_channels_last")])
def test_global_gem_runs_its_fused_kernels_in_either_layout(layout, kernel):
    x = tie_free((2, 5, 6, 7), seed=12)
    if layout == "channels_last":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    y, pullback = pg.vjp(pg.gem_pool, x, 3.0, eps=0.03)
    assert pullback.kernels == {"forward": kernel.format("forward"),
                                "backward": kernel.format("backward")}
    planar, planar_pullback = pg.vjp(pg.gem_pool, np.ascontiguousarray(x), 3.0, eps=0.03)
    np.testing.assert_array_equal(y, planar)  # the same sums in the same order
    dy = np.random.default_rng(13).standard_normal(y.shape)
    dx, dp = pullback(dy)
    assert dx.strides == x.strides  # the gradient keeps the layout
    planar_dx, planar_dp = planar_pullback(dy)
    np.testing.assert_allclose(dx, planar_dx, rtol=1e-15)
    assert dp == pytest.approx(planar_dp, rel=1e-12)
    half = x.astype(np.float16)  # computed in float32; NaN propagates, as the clamp does
    half[0, 1, 2, 3] = np.nan
    y16 = pg.gem_pool(half, 3.0)
    assert y16.dtype == np.float16 and np.isnan(y16[0, 1]).all()
    assert np.isfinite(np.delete(y16.reshape(10), 1)).all()
    unbatched = pg.gem_pool(x[0], 3.0, eps=0.03, spatial_dims=2)
    np.testing.assert_array_equal(unbatched, y[0])
    clamped = x - 0.5  # about half below the clamp, stored as x: no gradient there
    for p in (3.0, 2.5):  # raised by multiplying, and by exp and log
        y, pullback = pg.vjp(pg.gem_pool, clamped, p, eps=0.03)
        _, planar_pullback = pg.vjp(pg.gem_pool, np.ascontiguousarray(clamped), p, eps=0.03)
        dx = pullback(dy, params=False)  # dx alone, and with dp: the same dx
        np.testing.assert_array_equal(dx, pullback(dy)[0])
        np.testing.assert_allclose(dx, planar_pullback(dy, params=False), rtol=1e-15)
        assert (dx[clamped < 0.03] == 0).all() and (dx[clamped >= 0.03] != 0).all()


def test_gem_pool_large_p_tends_to_max_without_overflow():
    x = np.random.default_rng(10).random((2, 4, 6, 6)).astype(np.float32) * 100
    y = pg.gem_pool(x, p=400.0)
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y, pg.global_max_pool(x), rtol=0.02)


@pytest.mark.parametrize("p, bound, kernels", [(3.0, 0.53, (2, None)),
                                               (8.0, 0.5 + 1e-6, (None,))])
def test_gem_pool_float32_roots_are_within_their_stated_units_in_the_last_place(
        p, bound, kernels):
    """A float32 GeM's root takes three Newton steps for p 3 and 4 (within 0.53 units
    in the last place of the exact power mean; p 4's largest error, 0.525, was measured
    once, as each power compiles the kernels anew) and four otherwise (correctly
    rounded, up to float64 rounding): 2x2 windows and whole planes (their kernels share
    the root), means over six orders of magnitude."""
    rng = np.random.default_rng(12)
    x = (rng.random((4, 16, 12, 12)) * 10.0 ** rng.uniform(-3, 3, (4, 16, 1, 1))).astype(
        np.float32)
    xd = np.maximum(x.astype(np.float64), 1e-6)
    for kernel in kernels:
        y = pg.gem_pool(x, p, kernel)
        if kernel is None:
            exact = np.mean(xd ** p, axis=(2, 3), keepdims=True) ** (1 / p)
        else:
            n, c, h, w = xd.shape
            windows = xd.reshape(n, c, h // kernel, kernel, w // kernel, kernel)
            exact = np.mean(windows ** p, axis=(3, 5)) ** (1 / p)
        units = np.abs(y - exact) / np.spacing(exact.astype(np.float32))
        assert units.max() <= bound, (kernel, units.max())


@pytest.mark.parametrize("scale, p", [(1e-110, 3.0), (1e120, 3.0), (1e-50, 7.5)])
def test_global_gem_rescales_planes_whose_sums_leave_the_range(scale, p):
    """A plane whose sum of z^p underflows or overflows float64 is summed again
    relative to its largest z: the right power mean, the same bits in either layout."""
    x = np.random.default_rng(14).random((2, 3, 6, 7)) * scale
    eps = scale * 1e-3
    z = np.maximum(x, eps)
    top = z.max(axis=(2, 3), keepdims=True)
    expected = top * np.mean((z / top) ** p, axis=(2, 3), keepdims=True) ** (1 / p)
    with np.errstate(all="ignore"):  # the plain formula fails here
        plain = np.mean(z ** p, axis=(2, 3)) ** (1 / p)
        assert not np.allclose(plain, expected[..., 0, 0], rtol=1e-10, atol=0)
    y = pg.gem_pool(x, p, eps=eps)
    np.testing.assert_allclose(y, expected, rtol=1e-13)
    last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    np.testing.assert_array_equal(pg.gem_pool(last, p, eps=eps), y)


@pytest.mark.parametrize("layout", ["NCHW", "channels-last"])
@pytest.mark.parametrize("call", [
    lambda x: pg.lp_pool(x, 2, 2), lambda x: pg.lp_pool(x, 2, 3),
    lambda x: pg.lp_pool(x, 2, 2, padding=1), lambda x: pg.lp_pool(x, 2, 2, dilation=2),
    lambda x: pg.gem_pool(x, 2.0, eps=5e-324), lambda x: pg.gem_pool(x, 2.0, 2, eps=5e-324),
    lambda x: pg.gem_pool(x, 2.0, 3, 1, eps=5e-324),
    lambda x: pg.gem_pool(np.repeat(x, 2, axis=-1)[..., ::2], 2.0, 3, 2, eps=5e-324)],
    ids=["lp 2x2", "lp rows", "lp padded", "lp dilated", "gem global", "gem 2x2",
         "gem rows", "gem strided view"])
def test_power_means_of_subnormal_windows_are_lifted_before_their_scale(layout, call):
    """A float64 window (or plane) whose largest z is below about 5.6e-309 is summed
    relative to it, and 1 / largest overflowed: the result was inf or NaN. Lp and GeM
    are homogeneous, so ``f(x) = f(x 2^600) / 2^600``, and the lifted input sums in
    range: the same values, on each kernel family (one power: the lift does not
    depend on it, and each power compiles the kernels again)."""
    rng = np.random.default_rng(18)
    x = rng.random((2, 3, 6, 6)) * 1e-310
    x[0, 0] = 5e-324  # the smallest subnormal everywhere on a plane
    if layout == "channels-last":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    y = call(x)
    assert np.isfinite(y).all()
    lifted = call(x * 2.0**600) / 2.0**600  # GeM's eps (5e-324) clamps nothing
    np.testing.assert_allclose(y, lifted, rtol=1e-12, atol=1e-323)


@pytest.mark.parametrize("layout", ["NCHW", "channels-last"])
@pytest.mark.parametrize("op, args", [
    (pg.lp_pool, (2, 2)), (pg.lp_pool, (2, 3)), (pg.lp_pool, (2, 3, 1)),
    (pg.lp_pool, (2, 2, None, 0, 2)), (pg.lp_pool, (2, 2, None, 1)),
    (pg.gem_pool, (2.0,)), (pg.gem_pool, (2.0, 2)), (pg.gem_pool, (2.0, 3)),
    (pg.gem_pool, (2.0, 3, 1))],
    ids=["lp 2x2", "lp rows", "lp overlapping", "lp dilated", "lp padded", "gem global",
         "gem 2x2", "gem rows", "gem overlapping"])
def test_power_mean_gradients_of_subnormal_outputs_are_finite(layout, op, args):
    """The backwards took ``r = z * (1 / y)``, and a float64 ``y`` below about 5.6e-309
    made ``1 / y`` inf: every gradient of such a window was inf (GeM's ``dp`` NaN). ``dx``
    is homogeneous of degree 0 and ``dp`` of degree 1, so the lifted input gives them
    again. The plane of the smallest subnormal only has to be finite: there ``y`` itself
    keeps no digits (a padded window's ``sqrt(2) 5e-324`` rounds to ``5e-324``)."""
    rng = np.random.default_rng(19)
    x = rng.random((2, 3, 6, 6)) * 1e-310
    x[0, 0] = 5e-324
    if layout == "channels-last":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    kwargs = {"eps": 5e-324} if op is pg.gem_pool else {}
    y, pullback = pg.vjp(op, x, *args, **kwargs)
    dy = rng.random(y.shape)
    lifted_y, lifted_pullback = pg.vjp(op, x * 2.0**600, *args, **kwargs)
    grads, lifted = pullback(dy), lifted_pullback(dy)
    if op is pg.gem_pool:
        (grads, dp), (lifted, lifted_dp) = grads, lifted
        np.testing.assert_allclose(dp, lifted_dp / 2.0**600, rtol=1e-10)
    assert np.isfinite(grads).all()
    np.testing.assert_allclose(grads[1:], lifted[1:], rtol=1e-12)
    np.testing.assert_allclose(grads[0, 1:], lifted[0, 1:], rtol=1e-12)


@pytest.mark.parametrize("kernel, stride", [(None, None), (2, None), (3, 1)],
                         ids=["global", "2x2", "3x3 stride 1"])
def test_gem_pool_of_an_infinite_input_is_infinite(monkeypatch, kernel, stride):
    """A window (or plane) holding +inf has an infinite power mean, as the formula and
    PyTorch's composition give (relative to its largest z, inf, the sum is NaN): the
    global kernels, the 2x2 and rows kernels, and the general one, in either layout."""
    from poolgrad.kernels import dispatch
    x = np.random.default_rng(15).random((2, 3, 6, 6)).astype(np.float32) + 0.5
    x[0, 1, 2, 3] = x[1, 0, 5, 5] = np.inf
    z = x.astype(np.float64)
    with np.errstate(over="ignore"):
        if kernel is None:
            expected = np.mean(z ** 3, axis=(2, 3), keepdims=True) ** (1 / 3)
        else:
            s, count = stride or kernel, (6 - kernel) // (stride or kernel) + 1
            expected = np.array([[[[np.mean(z[n, c, i * s:i * s + kernel,
                                              j * s:j * s + kernel] ** 3) ** (1 / 3)
                                    for j in range(count)] for i in range(count)]
                                  for c in range(3)] for n in range(2)])
    assert np.isinf(expected).any()
    last = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    for choose in (dispatch.choose, dispatch.general):
        monkeypatch.setattr(dispatch, "choose", choose)
        for a in (x, last):
            np.testing.assert_allclose(pg.gem_pool(a, 3.0, kernel, stride), expected,
                                       rtol=1e-6)


@pytest.mark.parametrize("op, args", [
    (pg.gem_pool, (3.0,)), (pg.gem_pool, (3.0, 2)), (pg.mixed_pool, (2, None, 0, 0.3)),
    (pg.gated_pool, (np.array([[0.5, -1.0], [2.0, 0.3]]), 2)),
    (pg.attention_pool, (np.ones((2, 3)) / 3, np.eye(3)[:, ::-1].copy(), 3))],
    ids=["gem global", "gem 2x2", "mixed", "gated", "attention"])
def test_pullbacks_skip_the_parameters_gradients_when_asked(monkeypatch, op, args):
    """``pullback(dy, params=False)`` is the ``dx`` of ``pullback(dy)``, bit for bit,
    alone; GeM then sums no terms of ``dp`` (in a pass of their own, or, windowed, in the
    rows backward's, which takes a ``terms`` array) and adds none up."""
    import dataclasses

    from poolgrad.kernels import dispatch
    x = np.abs(tie_free((2, 3, 6, 4), seed=31))
    y, pullback = pg.vjp(op, x, *args)
    dy = np.random.default_rng(32).standard_normal(y.shape)
    calls = []  # (op, direction, the number of arguments) of each kernel run
    choose = dispatch.choose

    def recorded(op_name, direction, *rest, **keywords):
        kernel = choose(op_name, direction, *rest, **keywords)

        def run(*arguments):
            calls.append((op_name, direction, len(arguments)))
            return kernel.run(*arguments)
        return dataclasses.replace(kernel, run=run)
    monkeypatch.setattr(dispatch, "choose", recorded)
    dx = pullback(dy, params=False)
    alone = list(calls)
    full = pullback(dy)
    assert isinstance(dx, np.ndarray) and isinstance(full, tuple)
    assert len(full) == 1 + len(pullback.params)
    np.testing.assert_array_equal(dx, full[0])
    if op is pg.gem_pool and args[1:]:
        terms = [call for call in calls if call[:2] == ("gem", "p_terms")
                 or call == ("gem", "backward", 8)]  # x, y, dy, eps, p, whole, dx, terms
        after = calls[len(alone):]  # the terms, then their plane totals
        assert alone and not set(terms) & set(alone) and terms == after[-2:-1]
        assert after[-1] == ("gem", "p_total", 2) and after[-1] not in alone
    with pytest.raises(TypeError, match="params must be True or False, got 'no'"):
        pullback(dy, params="no")


def test_a_pullback_without_parameters_takes_params_false_too():
    x = tie_free((2, 3, 6, 4), seed=33)
    y, pullback = pg.vjp(pg.max_pool, x, 2)
    dy = np.ones_like(y)
    np.testing.assert_array_equal(pullback(dy, params=False), pullback(dy))


# --------------------------------------------------------------------- mixed, gated

def test_mixed_pool_blends_and_its_alpha_gradient():
    x = tie_free((2, 3, 7, 7), seed=11)
    alpha = 0.3
    y, pullback = pg.vjp(pg.mixed_pool, x, 3, 2, 1, alpha)
    expected = alpha * pg.max_pool(x, 3, 2, 1) + (1 - alpha) * pg.avg_pool(x, 3, 2, 1)
    np.testing.assert_allclose(y, expected, rtol=1e-14)
    dy = np.random.default_rng(12).standard_normal(y.shape)
    dx, dalpha = pullback(dy)
    fn = lambda v: pg.mixed_pool(v, 3, 2, 1, alpha)  # noqa: E731
    np.testing.assert_allclose(dx, numerical_vjp(fn, x.copy(), dy), rtol=1e-6, atol=1e-7)
    assert dalpha == pytest.approx(float(param_derivative(
        lambda a: pg.mixed_pool(x, 3, 2, 1, float(a)), alpha, dy)), rel=1e-6)


@pytest.mark.parametrize("shape, kernel, stride, padding", [
    ((2, 3, 9), (3,), (2,), (1,)), ((1, 2, 6, 7), (2, 2), (2, 2), 0),
    ((1, 2, 7, 6), (3, 3), (2, 1), 1),
])
def test_gated_pool_gradients_for_x_and_gate(shape, kernel, stride, padding):
    x = tie_free(shape, seed=13)
    gate = np.random.default_rng(14).standard_normal(kernel)
    y, pullback = pg.vjp(pg.gated_pool, x, gate, kernel, stride, padding)
    top, mean = pg.max_pool(x, kernel, stride, padding), pg.avg_pool(x, kernel, stride, padding)
    assert np.all((y - np.minimum(top, mean) >= -1e-12) & (np.maximum(top, mean) - y >= -1e-12))
    dy = np.random.default_rng(15).standard_normal(y.shape)
    dx, dgate = pullback(dy)
    fn = lambda v: pg.gated_pool(v, gate, kernel, stride, padding)  # noqa: E731
    np.testing.assert_allclose(dx, numerical_vjp(fn, x.copy(), dy), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dgate, param_derivative(
        lambda g: pg.gated_pool(x, g, kernel, stride, padding), gate, dy), rtol=1e-6,
        atol=1e-7)


@pytest.mark.parametrize("layout", ["NCHW", "channels-last"])
@pytest.mark.parametrize("kernel, stride, padding", [(2, 2, 0), (3, 3, 0), (3, 2, 1)],
                         ids=["2x2", "rows 3x3", "padded 3x3"])
@pytest.mark.parametrize("blend", ["alpha 1", "alpha 0", "alpha 0.5", "gated"])
def test_a_nan_tap_makes_the_blend_nan_and_takes_the_maximum_share(layout, kernel, stride,
                                                                  padding, blend):
    """The forwards take the maximum without a NaN test (the NaN reaches y through the
    sum): y must still be NaN exactly where a window holds a NaN, whatever the share,
    and mixed pooling's backward must route the maximum's share to that NaN (gated
    pooling's gate gradient is NaN there, and so every tap's)."""
    x = tie_free((2, 3, 6, 6), seed=17)
    x[0, 1, 2, 3] = x[1, 2, 0, 0] = np.nan
    if layout == "channels-last":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    if blend == "gated":
        op, args = pg.gated_pool, (np.zeros((kernel, kernel)),)
    else:
        op, args = pg.mixed_pool, ()
    alpha = {"alpha 1": 1.0, "alpha 0": 0.0}.get(blend, 0.5)
    extra = {} if blend == "gated" else {"alpha": alpha}
    y, pullback = pg.vjp(op, x, *args, kernel, stride, padding, **extra)
    holds_nan = pg.max_pool(np.isnan(x).astype(np.float32), kernel, stride, padding) > 0
    assert holds_nan.any()
    np.testing.assert_array_equal(np.isnan(y), holds_nan)
    finite = ~holds_nan
    top, mean = pg.max_pool(x, kernel, stride, padding), pg.avg_pool(x, kernel, stride, padding)
    share = 0.5 if blend == "gated" else alpha
    np.testing.assert_allclose(y[finite], (share * top + (1 - share) * mean)[finite],
                               rtol=1e-6)
    if blend != "gated" and share:  # the NaN wins: it gets the maximum's share of dy
        dx = pullback(np.ones_like(y))[0]
        assert dx[0, 1, 2, 3] >= share and dx[1, 2, 0, 0] >= share


def test_gated_pool_with_a_zero_gate_is_an_even_blend():
    x = tie_free((1, 2, 6, 6), seed=16)
    y = pg.gated_pool(x, np.zeros((2, 2)), 2)
    np.testing.assert_allclose(y, pg.mixed_pool(x, 2, alpha=0.5), rtol=1e-14)


# ------------------------------------------------------------- shared properties

# --------------------------------------------------------------- attention pooling

def attention_reference(x, queries, key_weight, heads):
    """Position by position, head by head: the docstring's formula."""
    n, channels = x.shape[:2]
    flat = x.reshape(n, channels, -1)
    d = channels // heads
    y = np.zeros((n, len(queries), channels))
    for b in range(n):
        keys = key_weight @ flat[b]
        for m, query in enumerate(queries):
            for h in range(heads):
                block = slice(h * d, (h + 1) * d)
                scores = query[block] @ keys[block] / np.sqrt(d)
                weights = np.exp(scores) / np.exp(scores).sum()
                y[b, m, block] = flat[b, block] @ weights
    return y


@pytest.mark.parametrize("shape, heads, queries", [
    ((2, 4, 6), 1, 1), ((2, 4, 3, 5), 2, 3), ((1, 6, 2, 3, 2), 3, 2),
])
def test_attention_pool_is_the_formula_with_all_three_gradients(shape, heads, queries):
    rng = np.random.default_rng(len(shape) + heads)
    x = rng.standard_normal(shape)
    q = rng.standard_normal((queries, shape[1]))
    w = rng.standard_normal((shape[1], shape[1]))
    y, pullback = pg.vjp(pg.attention_pool, x, q, w, heads)
    np.testing.assert_allclose(y, attention_reference(x, q, w, heads), rtol=1e-12)
    dy = rng.standard_normal(y.shape)
    dx, dq, dw = pullback(dy)
    np.testing.assert_allclose(dx, numerical_vjp(
        lambda t: pg.attention_pool(t, q, w, heads), x.copy(), dy), atol=1e-7)
    np.testing.assert_allclose(dq, param_derivative(
        lambda t: pg.attention_pool(x, t, w, heads), q, dy), atol=1e-7)
    np.testing.assert_allclose(dw, param_derivative(
        lambda t: pg.attention_pool(x, q, t, heads), w, dy), atol=1e-7)


def test_attention_pool_zero_queries_is_global_average_and_unbatched_works():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 5, 6))
    w = rng.standard_normal((4, 4))
    y = pg.attention_pool(x, np.zeros((2, 4)), w, 2, spatial_dims=2)
    assert y.shape == (2, 4)
    np.testing.assert_allclose(y, np.broadcast_to(x.mean(axis=(1, 2)), (2, 4)), atol=1e-15)
    # a large query on channel 0, whose position 7 stands out, reads out position 7
    x = rng.uniform(-1, 1, (4, 5, 6))
    x.reshape(4, -1)[0, 7] = 5.0
    q = np.array([[100.0, 0, 0, 0]])
    np.testing.assert_allclose(pg.attention_pool(x, q, np.eye(4), spatial_dims=2)[0],
                               x.reshape(4, -1)[:, 7], atol=1e-12)


@pytest.mark.parametrize("shape, heads, queries, dtype", [
    ((3, 6, 11, 13), 2, 3, np.float64),  # 143 positions: a block of 128 and a short one
    ((2, 5, 17), 1, 2, np.float32),  # 5 channels, fewer than the 16 lanes
    ((2, 40, 5, 6), 2, 2, np.float64),  # 20 channels a head: a lane adds twice
    ((2, 12, 3, 4, 5), 3, 1, np.float64),
])
def test_attention_pool_runs_its_fused_kernels_with_the_same_bits_in_either_layout(
        shape, heads, queries, dtype):
    """NCHW runs ``attention.attention_planes_*`` and channels-last
    ``attention.attention_pixels_*``: the same sums in the same order, so the same bits
    for y and all three gradients, and dx keeps the layout. A NaN makes its example's
    readouts NaN (as PyTorch's softmax does) and leaves the others alone."""
    rng = np.random.default_rng(len(shape) + heads)
    x = rng.standard_normal(shape).astype(dtype)
    q = rng.standard_normal((queries, shape[1]))
    w = rng.standard_normal((shape[1], shape[1])) / 2
    last = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    x_last = np.moveaxis(last, -1, 1)
    dy = rng.standard_normal((shape[0], queries, shape[1]))
    results = {}
    for layout, array in (("planes", x), ("pixels", x_last)):
        y, pullback = pg.vjp(pg.attention_pool, array, q, w, heads)
        assert pullback.kernels == {"forward": f"attention.attention_{layout}_forward",
                                    "backward": f"attention.attention_{layout}_backward"}
        dx, dq, dw = pullback(dy)
        assert dx.strides == array.strides
        results[layout] = (y, dx, dq, dw)
    for planar, pixel in zip(results["planes"], results["pixels"], strict=True):
        np.testing.assert_array_equal(planar, pixel)
    np.testing.assert_allclose(results["planes"][0], attention_reference(x, q, w, heads),
                               rtol=1e-5 if dtype == np.float32 else 1e-12)
    x_last = x_last.copy()
    x_last[1, 0].flat[3] = np.nan
    y = pg.attention_pool(x_last, q, w, heads)
    assert np.isnan(y[1]).all() and np.isfinite(np.delete(y, 1, axis=0)).all()


KINDS = [
    (pg.soft_pool, (2,), {}),
    (pg.stochastic_pool, (2,), {"rng": 0}),
    (pg.stochastic_pool, (2,), {"training": False}),
    (pg.gem_pool, (), {}),
    (pg.mixed_pool, (2,), {}),
    (pg.gated_pool, (np.ones((2, 2)), 2), {}),
    (pg.fractional_max_pool, (2, 4), {"rng": 0}),
    (pg.attention_pool, (np.ones((2, 3)), np.eye(3), 3), {}),
]


@pytest.mark.parametrize("op, args, kwargs", KINDS)
def test_inputs_unmodified_and_dtypes_kept(op, args, kwargs):
    x = np.abs(np.random.default_rng(17).standard_normal((2, 3, 6, 6)))
    for dtype in (np.float16, np.float32, np.float64):
        xd = x.astype(dtype)
        before = xd.copy()
        y, pullback = pg.vjp(op, xd, *args, **kwargs)
        result = pullback(np.ones_like(y))
        dx = result[0] if isinstance(result, tuple) else result
        assert y.dtype == dtype and dx.dtype == dtype and dx.shape == xd.shape
        np.testing.assert_array_equal(xd, before)


UNBATCHED = [  # every kind, with arguments that pool a (C, H, W) image
    (pg.blur_pool, (), {}),
    (pg.max_blur_pool, (), {}),
    (pg.avg_blur_pool, (3, 1), {}),
    (pg.soft_pool, (2,), {}),
    (pg.stochastic_pool, (2,), {"rng": 0}),
    (pg.stochastic_pool, (2,), {"training": False}),
    (pg.fractional_max_pool, (2, 4), {"rng": 0}),
    (pg.gem_pool, (), {}),
    (pg.gem_pool, (3.0, 2), {}),
    (pg.mixed_pool, (2,), {}),
    (pg.gated_pool, (np.ones((2, 2)), 2), {}),
    (pg.attention_pool, (np.ones((2, 3)), np.eye(3)), {}),
]


@pytest.mark.parametrize("op, args, kwargs", UNBATCHED)
def test_spatial_dims_pools_an_unbatched_image_as_its_batch_of_one(op, args, kwargs):
    x = np.abs(tie_free((3, 8, 8), seed=18))
    y, pullback = pg.vjp(op, x, *args, spatial_dims=2, **kwargs)
    expected, expected_pullback = pg.vjp(op, x[None], *args, **kwargs)
    np.testing.assert_array_equal(y, expected[0], strict=True)
    dy = np.random.default_rng(19).standard_normal(y.shape)
    dx, expected_dx = pullback(dy), expected_pullback(dy[None])
    if isinstance(dx, tuple):  # (dx, the parameters' gradients)
        dx, expected_dx = dx[0], expected_dx[0]
    np.testing.assert_array_equal(dx, expected_dx[0], strict=True)


def test_rank_3_is_a_batch_of_1d_signals_unless_spatial_dims_or_a_per_dim_argument_says():
    x = np.abs(tie_free((3, 8, 8), seed=20))
    assert pg.max_blur_pool(x).shape == (3, 8, 4)  # torch's F.interpolate reads rank 3 so
    assert pg.gem_pool(x).shape == (3, 8, 1)
    np.testing.assert_array_equal(pg.soft_pool(x, (2, 2)), pg.soft_pool(x, 2, spatial_dims=2))
    np.testing.assert_array_equal(pg.gem_pool(x, 3.0, (2, 2)), pg.gem_pool(x[None], 3.0, 2)[0])


def _with_taps(value, taps, layout, dtype=np.float32):
    """A 1x2x4x4 plane of ones with ``taps`` of its first row set to ``value``."""
    x = np.ones((1, 2, 4, 4), dtype)
    x[:, :, 0, :taps] = value
    if layout == "channels_last":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    return x


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("kernel", [2, 3])
def test_stochastic_pool_refuses_infinite_weights(kernel, training, layout):
    """+inf is no weight: a draw cannot take it with probability inf / inf, nor the mean
    inf^2 / inf. It once drew a finite tap in training and gave NaN in evaluation."""
    x = _with_taps(np.inf, 1, layout)
    snap = x.copy()
    with pytest.raises(ValueError, match=r"finite and not NaN; got a minimum of 1\.0 and a "
                                         r"maximum of inf"):
        pg.stochastic_pool(x, kernel, training=training, rng=1)
    np.testing.assert_array_equal(x, snap)


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stochastic_pool_evaluation_takes_negative_zero_as_a_weight(dtype, layout):
    """-0.0 is >= 0: a weight of 0. Its sign bit raises the 2x2 kernel's alarm, whose
    exact test then passes the window; the values are those of +0.0."""
    x = _with_taps(-0.0, 2, layout, dtype)
    x[:, :, 1, 1] = 3.0
    assert np.signbit(x).any()
    expected = pg.stochastic_pool(np.abs(x), 2, training=False)
    np.testing.assert_array_equal(pg.stochastic_pool(x, 2, training=False), expected)
    assert expected[0, 0, 0, 0] == 2.5  # (0 + 0 + 1 + 9) / (0 + 0 + 1 + 3)


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("value, training", [(2e38, True), (2e38, False), (1e20, False)])
def test_stochastic_pool_refuses_2x2_sums_that_overflow(value, training, layout):
    """Finite float32 weights whose 2x2 window sums overflow: the sum (training's
    threshold) or the sum of squares (evaluation's numerator) would be inf, and the
    draw the last positive tap or the mean inf or NaN. The 2x2 kernels check each
    window's sum once; float64 input pools them."""
    x = _with_taps(value, 2, layout)
    with pytest.raises(ValueError, match="each window's sums must be finite in float32"):
        pg.stochastic_pool(x, 2, training=training, rng=1)
    y = pg.stochastic_pool(x.astype(np.float64), 2, training=training, rng=1)
    assert np.isfinite(y).all()
    with pytest.raises(ValueError, match=r"finite in float64; got a maximum of 1\.5e\+308: "
                                         r"scale x down$"):  # float64's own overflow
        pg.stochastic_pool(_with_taps(1.5e308, 2, layout, np.float64), 2, training=training)
    if not training:  # (2 v^2 + 2) / (2 v + 2), the first window of each channel
        v = float(np.float32(value))
        np.testing.assert_allclose(y[:, :, 0, 0], (2 * v**2 + 2) / (2 * v + 2), rtol=1e-12)


@pytest.mark.parametrize("call, error, message", [
    (lambda x: pg.stochastic_pool(x - 2, 2), ValueError, "x must be >= 0"),
    (lambda x: pg.stochastic_pool(x * np.nan, 2), ValueError, "finite and not NaN"),
    (lambda x: pg.stochastic_pool(x, 2, rng="seed"), TypeError, "rng must be None"),
    (lambda x: pg.soft_pool(x, 2, padding="full"), ValueError, 'padding must be "valid"'),
    (lambda x: pg.gem_pool(x, p=0), ValueError, "p must be a finite number > 0"),
    (lambda x: pg.gem_pool(x, eps=0), ValueError, "eps must be a finite number > 0"),
    (lambda x: pg.gem_pool(x, stride=2), ValueError, "stride needs a kernel_size"),
    (lambda x: pg.mixed_pool(x, 2, alpha=float("nan")), ValueError, "alpha must be a finite"),
    (lambda x: pg.mixed_pool(x, 2, alpha="half"), TypeError, "alpha must be a real number"),
    (lambda x: pg.gated_pool(x, np.ones(3), 2), ValueError, "gate must have the window's"),
    (lambda x: pg.soft_pool(x.astype(np.int64), 2), TypeError, "x must have dtype"),
    (lambda x: pg.attention_pool(x, np.ones((1, 3)), np.eye(2)), ValueError,
     r"queries must be \(queries, C\) = \(M, 2\)"),
    (lambda x: pg.attention_pool(x, np.ones((1, 2)), np.eye(3)), ValueError,
     r"key_weight must be \(C, C\) = \(2, 2\)"),
    (lambda x: pg.attention_pool(x, np.ones((1, 2)), np.eye(2), heads=3), ValueError,
     "heads must be a positive int dividing the 2 channels"),
])
def test_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call(np.ones((1, 2, 4, 4)))


EMPTY_KINDS = [  # name, arguments after x, keywords
    ("gem_pool", (3.0,), {}), ("gem_pool", (3.0, 2), {}), ("soft_pool", (2,), {}),
    ("stochastic_pool", (2,), {"rng": 0}), ("stochastic_pool", (2,), {"training": False}),
    ("blur_pool", (), {}), ("max_blur_pool", (), {}), ("mixed_pool", (2,), {}),
    ("fractional_max_pool", (2,), {"output_ratio": 0.5, "rng": 0})]


@pytest.mark.parametrize("shape", [(0, 3, 6, 6), (2, 0, 6, 6)])
@pytest.mark.parametrize("name, args, kwargs", EMPTY_KINDS)
def test_kinds_pool_an_empty_batch_or_no_channels(name, args, kwargs, shape):
    """As torch.nn's pooling does: an empty output of the right shape, and a pullback
    that gives an empty dx (the kernels' task split once divided by the planes' count)."""
    for x in (np.zeros(shape), np.zeros(shape[:1] + shape[2:] + shape[1:2]).transpose(
            0, 3, 1, 2)):
        y, pullback = pg.vjp(getattr(pg, name), x, *args, **kwargs)
        pooled = (1, 1) if name == "gem_pool" and len(args) == 1 else (3, 3)  # global
        assert y.shape == shape[:2] + pooled
        grads = pullback(np.zeros(y.shape))
        assert (grads[0] if isinstance(grads, tuple) else grads).shape == shape
