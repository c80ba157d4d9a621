"""Worked examples from the pooling literature and the documented semantics, by hand."""

import os

import numba
import numpy as np
import pytest

import poolgrad as pg
from poolgrad import kernels


def grid(rows):
    """A (1, 1, H, W) float64 array from nested lists."""
    return np.array(rows, dtype=np.float64)[None, None]


# ---------------------------------------------------------------- worked examples


def test_single_window_max_and_avg():
    x = grid([[1, 3], [2, 0.5]])
    y, pullback = pg.vjp(pg.max_pool, x, 2)
    assert y.item() == 3
    np.testing.assert_array_equal(pullback(np.full_like(y, 2.5)), grid([[0, 2.5], [0, 0]]))
    y, pullback = pg.vjp(pg.avg_pool, x, 2)
    assert y.item() == pytest.approx(1.625)
    np.testing.assert_array_equal(pullback(np.full_like(y, 2.0)), grid([[0.5, 0.5], [0.5, 0.5]]))


def test_four_by_four_into_four_windows():
    x = grid([[1, 1, 2, 4],
              [5, 6, 7, 8],
              [3, 2, 1, 0],
              [1, 2, 3, 4]])
    dy = grid([[1, 2], [3, 4]])
    y, pullback = pg.vjp(pg.max_pool, x, 2)
    np.testing.assert_array_equal(y, grid([[6, 8], [3, 4]]))
    np.testing.assert_array_equal(pullback(dy), grid([[0, 0, 0, 0],
                                                      [0, 1, 0, 2],
                                                      [3, 0, 0, 0],
                                                      [0, 0, 0, 4]]))
    y, pullback = pg.vjp(pg.avg_pool, x, 2)
    np.testing.assert_array_equal(y, grid([[3.25, 5.25], [2, 2]]))
    np.testing.assert_array_equal(pullback(dy), grid([[0.25, 0.25, 0.5, 0.5],
                                                      [0.25, 0.25, 0.5, 0.5],
                                                      [0.75, 0.75, 1, 1],
                                                      [0.75, 0.75, 1, 1]]))


def test_overlapping_three_by_three_stride_two_adds_up():
    # 5x5 input, four 3x3 windows at stride 2; they share row 2 and column 2.
    x = np.arange(25.0).reshape(5, 5) / 100
    x[2, 2] = 9.0  # the centre is the maximum of all four windows
    y, pullback = pg.vjp(pg.max_pool, x[None, None], 3, 2)
    np.testing.assert_array_equal(y, np.full((1, 1, 2, 2), 9.0))
    dx = pullback(np.array([[[[1.0, 2.0], [3.0, 4.0]]]]))[0, 0]
    assert dx[2, 2] == 1 + 2 + 3 + 4
    assert np.count_nonzero(dx) == 1
    # average: each window spreads dy/9; the shared positions collect 2 or 4 shares
    _, pullback = pg.vjp(pg.avg_pool, x[None, None], 3, 2)
    dx = pullback(np.ones((1, 1, 2, 2)))[0, 0]
    coverage = np.array([[1, 1, 2, 1, 1]] * 2 + [[2, 2, 4, 2, 2]] + [[1, 1, 2, 1, 1]] * 2)
    np.testing.assert_allclose(dx, coverage / 9)


def test_batch_routes_every_example_on_its_own():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 1, 4, 4))
    dy = rng.standard_normal((100, 1, 2, 2))
    y, pullback = pg.vjp(pg.max_pool, x, 2)
    dx = pullback(dy)
    for n in range(100):
        _, alone = pg.vjp(pg.max_pool, x[n:n + 1], 2)
        np.testing.assert_array_equal(dx[n:n + 1], alone(dy[n:n + 1]))
    receives = dx != 0
    # each example: one position per 2x2 window, a quarter of the input
    assert (receives.reshape(100, -1).sum(axis=1) == 4).all()
    # the batch as a whole reaches (nearly) every position
    reached = receives.any(axis=0).mean()
    assert reached == 1.0
    winners = np.unique(receives.reshape(100, -1), axis=0)
    assert len(winners) > 50  # the examples pick different maxima


# ---------------------------------------------------------------- ties and NaN


def test_split_ties_by_hand():
    x = grid([[2, 2, 1, 0],
              [1, 2, 3, 3],
              [0, 0, 5, 1],
              [0, 0, 1, 1]])
    dy = grid([[6, 4], [3, 8]])
    _, first = pg.vjp(pg.max_pool, x, 2)
    _, split = pg.vjp(pg.max_pool, x, 2, ties="split")
    np.testing.assert_array_equal(first(dy), grid([[6, 0, 0, 0],
                                                   [0, 0, 4, 0],
                                                   [3, 0, 8, 0],
                                                   [0, 0, 0, 0]]))
    np.testing.assert_array_equal(split(dy), grid([[2, 2, 0, 0],
                                                   [0, 2, 2, 2],
                                                   [0.75, 0.75, 8, 0],
                                                   [0.75, 0.75, 0, 0]]))


def test_split_ties_add_up_over_overlapping_windows():
    x = np.zeros((1, 1, 3))  # windows [0, 1] and [1, 2], everything tied
    _, split = pg.vjp(pg.max_pool, x, 2, 1, ties="split")
    np.testing.assert_array_equal(split(np.array([[[2.0, 4.0]]])), [[[1.0, 3.0, 2.0]]])


def test_padding_never_wins():
    x = np.full((1, 1, 3), -np.inf)
    y, indices = pg.max_pool(x, 3, 1, padding=1, return_indices=True)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(indices, [[[0, 0, 1]]])
    x = np.full((1, 1, 2), -5.0)
    y, pullback = pg.vjp(pg.max_pool, x, 3, 2, padding=2)
    np.testing.assert_array_equal(y, [[[-5.0, -5.0]]])
    # windows [-2, -1, 0] and [0, 1, 2]: both pick input 0 (the first of the tied -5s)
    np.testing.assert_array_equal(pullback(np.ones((1, 1, 2))), [[[2.0, 0.0]]])


@pytest.mark.parametrize("ties", ["first", "split"])
def test_nan_propagates_and_takes_the_gradient(ties):
    x = grid([[1, np.nan, 7, 2], [3, np.nan, 0, 1]])
    (y, indices), pullback = pg.vjp(pg.max_pool, x, 2, return_indices=True, ties=ties)
    assert np.isnan(y[0, 0, 0, 0]) and y[0, 0, 0, 1] == 7
    # the first NaN in row-major order wins (PyTorch's CPU kernel takes the last one)
    assert indices[0, 0, 0, 0] == 1
    np.testing.assert_array_equal(pullback(grid([[1, 1]])), grid([[0, 1, 1, 0], [0, 0, 0, 0]]))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32])
def test_integer_max_pool_forward(dtype):
    info = np.iinfo(dtype)
    x = np.array([[[info.min, info.max, 3, info.min]]], dtype=dtype)
    y, indices = pg.max_pool(x, 2, return_indices=True)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, np.array([[[info.max, 3]]], dtype=dtype))
    np.testing.assert_array_equal(indices, [[[1, 2]]])
    assert pg.max_pool(np.full((1, 1, 3), info.min, dtype), 2, 1, padding=1).min() == info.min


# ---------------------------------------------------------------- geometry rules


def test_ceil_mode_drops_a_window_starting_in_the_end_padding():
    x = np.arange(5.0)[None, None]
    # floor: (5 + 2 - 2) // 2 + 1 = 3; ceil would give 4, but window 3 starts at
    # 3 * 2 - 1 = 5, inside the end padding, so it is dropped
    assert pg.max_pool(x, 2, 2, padding=1).shape[-1] == 3
    assert pg.max_pool(x, 2, 2, padding=1, ceil_mode=True).shape[-1] == 3
    # without padding the ceil window starts at 4, inside the input, and is kept
    np.testing.assert_array_equal(pg.max_pool(x, 2, 2, ceil_mode=True), [[[1.0, 3.0, 4.0]]])


def test_avg_ceil_mode_counts_only_the_padded_input():
    x = np.ones((1, 1, 5))
    # windows [0,1] [2,3] [4,(5)]: position 5 lies beyond the input (no padding) and
    # never counts, even with count_include_pad
    np.testing.assert_array_equal(pg.avg_pool(x, 2, ceil_mode=True), [[[1.0, 1.0, 1.0]]])
    # with padding 1: windows [-1,0] [1,2] [3,4]; the padded position counts
    np.testing.assert_array_equal(pg.avg_pool(x, 2, padding=1), [[[0.5, 1.0, 1.0]]])
    np.testing.assert_array_equal(pg.avg_pool(x, 2, padding=1, count_include_pad=False),
                                  [[[1.0, 1.0, 1.0]]])
    np.testing.assert_array_equal(pg.avg_pool(x, 2, padding=1, divisor_override=4),
                                  [[[0.25, 0.5, 0.5]]])


def test_padding_larger_than_half_the_kernel_is_allowed_like_onnx():
    x = np.arange(4.0)[None, None]
    y = pg.max_pool(x, 2, 1, padding=((1, 1),))
    np.testing.assert_array_equal(y, [[[0, 1, 2, 3, 3]]])
    np.testing.assert_array_equal(pg.avg_pool(x, 3, 1, padding=((2, 0),)),
                                  [[[0, 1 / 3, 1, 2]]])


def test_unbatched_input_keeps_its_shape():
    x = np.random.default_rng(1).standard_normal((3, 6, 6))
    y, pullback = pg.vjp(pg.max_pool, x, (2, 2))
    assert y.shape == (3, 3, 3)
    np.testing.assert_array_equal(y, pg.max_pool(x[None], 2)[0])
    assert pullback(np.ones_like(y)).shape == x.shape
    assert pg.global_avg_pool(x, spatial_dims=2).shape == (3, 1, 1)


# ---------------------------------------------------------------- state, dtypes, purity


@pytest.mark.parametrize("kernel, dtype", [(2, np.uint8), (16, np.uint8), (17, np.uint16),
                                           ((16, 16, 1), np.uint8), ((20, 20, 1), np.uint16)])
def test_max_pool_keeps_one_small_unsigned_position_per_output(kernel, dtype):
    x = np.random.default_rng(0).standard_normal((2, 3, 20, 20, 4)).astype(np.float32)
    kernel3 = kernel if isinstance(kernel, tuple) else (kernel, kernel, 1)
    y, pullback = pg.vjp(pg.max_pool, x, kernel3)
    assert list(pullback.saved) == ["window_positions"]
    assert pullback.saved["window_positions"].dtype == dtype
    assert pullback.state_bytes_per_output == np.dtype(dtype).itemsize


def test_pullback_is_pure_and_repeatable():
    x = np.random.default_rng(2).standard_normal((2, 2, 7, 7)).astype(np.float32)
    x_copy = x.copy()
    for op, args in [(pg.max_pool, (3, 2)), (pg.avg_pool, (3, 2)), (pg.lp_pool, (2.0, 3, 2))]:
        y, pullback = pg.vjp(op, x, *args)
        dy = np.ones_like(y)
        first, second = pullback(dy), pullback(dy)
        np.testing.assert_array_equal(first, second)
        assert first.dtype == x.dtype and first.shape == x.shape
        assert (dy == 1).all()
    np.testing.assert_array_equal(x, x_copy)


def test_float16_in_float16_out():
    x = np.random.default_rng(3).standard_normal((2, 2, 6, 6)).astype(np.float16)
    for op, args in [(pg.max_pool, (2,)), (pg.avg_pool, (3, 1, 1)), (pg.lp_pool, (2, 2))]:
        y, pullback = pg.vjp(op, x, *args)
        assert y.dtype == np.float16
        assert pullback(np.ones_like(y)).dtype == np.float16
    # the float16 result is the float32 computation rounded once
    np.testing.assert_array_equal(pg.avg_pool(x, 3, 1, 1),
                                  pg.avg_pool(x.astype(np.float32), 3, 1, 1).astype(np.float16))


# ---------------------------------------------------------------- determinism


DETERMINISM_CASES = [
    (pg.max_pool, (3,), dict(stride=1, padding=1)),
    (pg.max_pool, (3,), dict(stride=1, padding=1, ties="split")),
    (pg.avg_pool, (3,), dict(stride=1, padding=1)),
    (pg.lp_pool, (2.0, 3), dict(stride=1)),
    (pg.adaptive_avg_pool, ((7, 5),), {}),
]


@pytest.mark.parametrize("case", range(len(DETERMINISM_CASES)))
def test_backward_bits_do_not_depend_on_thread_count_or_build(case, monkeypatch):
    # small arrays normally run the serial build: make this one run the parallel build on
    # the whole pool, then on one thread, and last the serial build
    monkeypatch.setattr(kernels, "SERIAL_BELOW", 0)
    op, args, kwargs = DETERMINISM_CASES[case]
    rng = np.random.default_rng(case)
    # rounded values give ties for the split rule; heavy window overlap everywhere
    x = np.round(rng.standard_normal((4, 8, 33, 29)), 1).astype(np.float32)
    y, pullback = pg.vjp(op, x, *args, **kwargs)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    before = numba.get_num_threads()
    results = []
    assert numba.config.NUMBA_NUM_THREADS > 1 or os.cpu_count() == 1  # several threads run
    try:
        for threads in (1, numba.config.NUMBA_NUM_THREADS, 1):
            numba.set_num_threads(threads)
            results.append(pullback(dy))
            results.append(pullback(dy))
    finally:
        numba.set_num_threads(before)
    monkeypatch.setattr(kernels, "SERIAL_BELOW", x.size + 1)
    results.append(pullback(dy))
    for other in results[1:]:
        assert other.tobytes() == results[0].tobytes()


_RNG = np.random.default_rng(21)
_GATE, _QUERIES, _KEYS = (_RNG.standard_normal((2, 2)), _RNG.standard_normal((2, 6)),
                          _RNG.standard_normal((6, 6)))
_SCORER = (_RNG.standard_normal((5, 6)), _RNG.standard_normal(5), _RNG.standard_normal(5))
BUILD_CASES = [  # every operator once, on a small float32 input (the serial build's size)
    (pg.max_pool, (2,), {}), (pg.max_pool, (3, 2, 1), {}), (pg.avg_pool, (3, 2, 1), {}),
    (pg.lp_pool, (2.0, 2), {}), (pg.adaptive_max_pool, ((5, 4),), {}),
    (pg.adaptive_avg_pool, ((5, 4),), {}), (pg.global_max_pool, (), {}),
    (pg.global_avg_pool, (), {}), (pg.global_lp_pool, (3.0,), {}),
    (pg.blur_pool, (), {}), (pg.max_blur_pool, (), {}), (pg.avg_blur_pool, (), {}),
    (pg.soft_pool, (2,), {}), (pg.stochastic_pool, (2,), {"rng": 4}),
    (pg.stochastic_pool, (2,), {"training": True, "rng": 4}),
    (pg.fractional_max_pool, (2,), {"output_ratio": 0.5, "rng": 4}),
    (pg.gem_pool, (3.0, 2), {}), (pg.gem_pool, (2.5, 3, 2), {}), (pg.gem_pool, (3.0,), {}),
    (pg.mixed_pool, (2, None, 0, 0.5), {}), (pg.gated_pool, (_GATE, 2), {}),
    (pg.attention_pool, (_QUERIES, _KEYS, 2), {}), (pg.aps_pool, (), {}),
    (pg.max_aps_pool, (), {}), (pg.lps_pool, (_SCORER,), {}),
]


@pytest.mark.builds  # compiles every parallel build: 5 min cold, not in the default run
@pytest.mark.parametrize("case", range(len(BUILD_CASES)))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_the_parallel_build_gives_the_serial_builds_bits(case, layout, monkeypatch):
    """Calls on arrays below ``SERIAL_BELOW`` run each kernel's serial build, larger ones
    its parallel build: the two must agree bit for bit, value and gradient, for every
    operator (here on the pool's threads, the small array sent to the parallel build)."""
    op, args, kwargs = BUILD_CASES[case]
    rng = np.random.default_rng(case)
    x = (np.abs(rng.standard_normal((2, 6, 12, 11))) + 0.25).astype(np.float32)
    if layout == "channels_last":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)

    def run():
        y, pullback = pg.vjp(op, x, *args, **kwargs)
        outputs = y if isinstance(y, tuple) else (y,)  # values first, then any indices
        dy = np.random.default_rng(case).standard_normal(outputs[0].shape).astype(np.float32)
        grads = pullback(dy)
        return [np.asarray(a) for a in outputs + (grads if isinstance(grads, tuple)
                                                  else (grads,))]

    serial = run()
    monkeypatch.setattr(kernels, "SERIAL_BELOW", 0)
    before = numba.get_num_threads()
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    try:
        parallel = run()
    finally:
        numba.set_num_threads(before)
    for a, b in zip(serial, parallel, strict=True):
        assert a.tobytes() == b.tobytes()


@kernels.parallel_kernel
def threads_used(x):
    for i in numba.prange(1):
        x[i] = numba.get_num_threads()


@pytest.mark.filterwarnings("ignore:Cannot cache compiled function")  # a test-only kernel
def test_small_calls_run_the_serial_build_and_large_ones_the_pool():
    small, large = np.zeros(8), np.zeros(kernels.SERIAL_BELOW)
    outside = numba.get_num_threads()
    pool = numba.config.NUMBA_NUM_THREADS
    numba.set_num_threads(pool)
    try:
        threads_used(small)  # compiled without parallel=True, and no pool touched
        assert threads_used.serial.signatures and not threads_used.compiled.signatures
        threads_used(large)
        assert threads_used.compiled.signatures
        assert numba.get_num_threads() == pool
    finally:
        numba.set_num_threads(outside)
    assert large[0] == pool


@kernels.parallel_kernel(any_layout=True)
def scaled_copy(x, factor, y):
    for i in numba.prange(x.shape[0]):
        for j in range(x.shape[1]):
            y[i, j] = x[i, j] * factor


def _array_layouts(signature):
    return [(arg.layout, arg.mutable, arg.aligned) for arg in signature
            if isinstance(arg, numba.types.Array)]


@pytest.mark.filterwarnings("ignore:Cannot cache compiled function")  # a test-only kernel
def test_an_any_layout_kernel_compiles_once_for_every_layout_and_write_flag():
    values = np.arange(24.0).reshape(4, 6)
    read_only = values.copy()
    read_only.flags.writeable = False
    # the same values stored four ways: C order, F order, a strided view, read-only
    stored = [values, np.asfortranarray(values), np.repeat(values, 2, axis=1)[:, ::2],
              read_only]
    for x in stored:
        for y in (np.zeros((4, 6)), np.zeros((6, 4)).T):  # a C and a strided output
            scaled_copy(x, 2.0, y)
            np.testing.assert_array_equal(y, values * 2.0)
    signatures = scaled_copy.serial.signatures  # small arrays: the serial build
    assert len(signatures) == 1 and not scaled_copy.compiled.signatures
    assert _array_layouts(signatures[0]) == [("A", True, True)] * 2
    x32 = values.astype(np.float32)  # another dtype: a signature of its own
    y32 = np.zeros((4, 6), np.float32)
    scaled_copy(x32, 2.0, y32)
    np.testing.assert_array_equal(y32, x32 * 2)
    assert len(scaled_copy.serial.signatures) == 2
