"""Fractional max pooling: against PyTorch given the same samples, against window-by-window
maxima over the sequences Graham defines, finite differences, seeded determinism and bad
input."""

import numpy as np
import pytest

import poolgrad as pg
from poolgrad.kinds.fractional import boundaries, region_tables
from tests.test_gradcheck import numerical_vjp, tie_free

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape, out, kernel", [
    ((2, 3, 11, 17), (5, 7), 2),       # disjoint-ish windows
    ((2, 2, 30, 31), (17, 20), 3),     # overlapping windows
    ((1, 2, 9, 10, 11), (4, 5, 6), (2, 3, 2)),
    ((1, 1, 6, 6), (1, 1), 2),         # one window: flush with the end
])
def test_equals_pytorch_given_the_same_samples(dtype, shape, out, kernel):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    samples = torch.rand(shape[0], shape[1], len(out), dtype=dtype)
    pool = F.fractional_max_pool2d if len(out) == 2 else F.fractional_max_pool3d
    y, indices = pool(x, kernel, output_size=out, return_indices=True,
                      _random_samples=samples)
    dy = torch.randn_like(y)
    y.backward(dy)
    (ours, our_indices), pullback = pg.vjp(pg.fractional_max_pool, x.detach().numpy(), kernel,
                                           out, return_indices=True, samples=samples.numpy())
    np.testing.assert_array_equal(ours, y.detach().numpy())
    np.testing.assert_array_equal(our_indices, indices.numpy())
    np.testing.assert_array_equal(pullback(dy.numpy()), x.grad.numpy())


def _numpy_boundaries(u, span, steps):
    """The pseudo-random sequence's boundaries in NumPy steps, in ``u``'s dtype, as
    :func:`boundaries` computed them before its kernel."""
    b = np.full((u.shape[0], steps + 1), span, np.int64)
    if steps:
        alpha = u.dtype.type(span) / u.dtype.type(steps)
        index = np.arange(steps).astype(u.dtype)
        b[:, :steps] = (((index + u[:, None]) * alpha).astype(np.int64)
                        - (u * alpha).astype(np.int64)[:, None])
    return b


def _tables_by_boundaries(spatial, kernel, out, u):
    """The pseudo-random sequence's windows from :func:`_numpy_boundaries`, as
    ``region_tables`` builds them."""
    ndim, planes = len(spatial), u.shape[0]
    starts = np.zeros((planes, 3, max(out)), np.int64)
    lengths = np.ones((planes, 3, max(out)), np.int64)
    extent = [1, 1, 1]
    for axis, (length, k, o) in enumerate(zip(spatial, kernel, out, strict=True)):
        row, draws = 3 - ndim + axis, u[:, 1 - axis if ndim == 2 else axis]
        if isinstance(k, str):
            b = _numpy_boundaries(draws, length, o)
            ends = np.minimum(b[:, 1:] + 1, length) if k == "overlapping" else b[:, 1:]
            starts[:, row, :o], lengths[:, row, :o] = b[:, :o], ends - b[:, :o]
        else:
            starts[:, row, :o] = _numpy_boundaries(draws, length - k, o - 1)
            lengths[:, row, :o] = k
        extent[row] = int(lengths[:, row, :o].max(initial=1))
    return starts, lengths, extent


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spatial, kernel, out", [
    ((56, 56), (2, 2), (28, 28)),
    ((9, 7), ("disjoint", "overlapping"), (5, 4)),
    ((5, 6, 7), (2, "disjoint", 3), (3, 4, 2)),
    ((10,), (3,), (1,)),  # one window: no steps
    ((8,), ("overlapping",), (8,)),  # regions of one
])
@pytest.mark.parametrize("planes", [0, 1, 37])
def test_the_pseudo_random_kernel_gives_the_boundaries_of_numpy(
        dtype, spatial, kernel, out, planes):
    """``region_tables`` builds the pseudo-random sequence's windows in one kernel, in
    the draws' dtype: the same starts, lengths and extent as the NumPy steps it
    replaced, with no planes too; the random sequence's tables, built in NumPy, also
    give every column past an axis's windows start 0 and length 1."""
    u = np.random.default_rng(planes + len(spatial)).random((planes, len(spatial)))
    u = u.astype(dtype)
    starts, lengths, extent = region_tables(spatial, kernel, out, u, "pseudo_random", None)
    expected = _tables_by_boundaries(spatial, kernel, out, u)
    np.testing.assert_array_equal(starts, expected[0])
    np.testing.assert_array_equal(lengths, expected[1])
    assert list(extent) == expected[2]
    np.testing.assert_array_equal(boundaries(u[:, 0], 50, 7, "pseudo_random", None),
                                  _numpy_boundaries(u[:, 0], 50, 7))
    starts, lengths, _ = region_tables(spatial, kernel, out, u, "random",
                                       np.random.default_rng(0))
    for row, o in zip(range(3 - len(out), 3), out, strict=True):
        assert (starts[:, row, o:] == 0).all() and (lengths[:, row, o:] == 1).all()


def test_output_ratio_truncates_as_pytorch():
    x = np.zeros((1, 1, 10, 10))
    assert pg.fractional_max_pool(x, 3, output_ratio=(0.55, 0.77), rng=0).shape == (1, 1, 5, 7)
    assert pg.fractional_max_pool(x, 3, output_ratio=0.55, rng=0).shape == (1, 1, 5, 5)


def reference(x, starts, ends):
    """Window-by-window maxima of a (C, L) input over per-plane [start, end) windows."""
    return np.array([[x[c, a:b].max() for a, b in zip(starts[c], ends[c], strict=True)]
                     for c in range(x.shape[0])])


@pytest.mark.parametrize("regions", ["disjoint", "overlapping"])
@pytest.mark.parametrize("sequence", ["pseudo_random", "random"])
def test_graham_regions_cover_the_input(regions, sequence):
    length, out = 29, 13
    x = tie_free((1, 4, length), 1)
    y, indices = pg.fractional_max_pool(x, regions, out, return_indices=True, rng=3,
                                        sequence=sequence)
    x, y, indices = x[0], y[0], indices[0]
    # the same draws, replayed: samples first, then the random orders
    rng = np.random.default_rng(3)
    u = rng.random((1, 4, 1))[0, :, 0]
    b = boundaries(u, length, out, sequence, rng)
    assert np.all(b[:, 0] == 0) and np.all(b[:, -1] == length)
    steps = np.diff(b, axis=1)
    assert set(np.unique(steps)) == {2, 3}  # 29 / 13 = 2.2: floor and ceil
    assert np.all(steps.sum(axis=1) == length)
    ends = np.minimum(b[:, 1:] + 1, length) if regions == "overlapping" else b[:, 1:]
    np.testing.assert_array_equal(y, reference(x, b[:, :-1], ends))
    if sequence == "random":  # the orders differ between planes
        assert len({tuple(row) for row in steps}) > 1
    assert np.all(np.take_along_axis(x, indices, axis=1) == y)


@pytest.mark.parametrize("kernel, kwargs", [
    (2, {"output_size": 4}), ("disjoint", {"output_size": 5}),
    ("overlapping", {"output_ratio": 0.6, "sequence": "random"}),
    ((2, 3), {"output_size": (3, 2)}),
])
def test_gradient_is_finite_differences(kernel, kwargs):
    shape = (1, 2, 8) if kernel != (2, 3) else (1, 2, 6, 7)
    x = tie_free(shape, 2)
    y, pullback = pg.vjp(pg.fractional_max_pool, x, kernel, rng=4, **kwargs)
    dy = np.random.default_rng(5).standard_normal(y.shape)
    expected = numerical_vjp(lambda t: pg.fractional_max_pool(t, kernel, rng=4, **kwargs),
                             x.copy(), dy)
    np.testing.assert_allclose(pullback(dy), expected, atol=1e-8)


def test_overlapping_windows_add_their_gradients():
    x = np.array([[[0.0, 5.0, 0.0, 0.0, 0.0]]])
    y, pullback = pg.vjp(pg.fractional_max_pool, x, 3, 3, samples=np.array([[[0.0]]]))
    np.testing.assert_array_equal(y, [[[5.0, 5.0, 0.0]]])  # starts 0, 1, 2
    np.testing.assert_array_equal(pullback(np.ones_like(y)), [[[0.0, 2.0, 1.0, 0.0, 0.0]]])


def test_same_seed_same_bits_and_the_generator_advances():
    x = np.random.default_rng(0).standard_normal((2, 3, 15, 15)).astype(np.float32)
    for sequence in ("pseudo_random", "random"):
        a = pg.fractional_max_pool(x, 2, output_ratio=0.7, rng=9, sequence=sequence)
        b = pg.fractional_max_pool(x, 2, output_ratio=0.7, rng=9, sequence=sequence)
        assert a.tobytes() == b.tobytes()
    generator = np.random.default_rng(9)
    first = pg.fractional_max_pool(x, 2, output_ratio=0.7, rng=generator)
    second = pg.fractional_max_pool(x, 2, output_ratio=0.7, rng=generator)
    assert not np.array_equal(first, second)


def test_nan_wins_its_window_first_nan_and_input_unmodified():
    x = np.array([[[1.0, np.nan, np.nan, 1.0]]])
    before = x.copy()
    y, indices = pg.fractional_max_pool(x, 4, 1, return_indices=True, rng=0)
    assert np.isnan(y).all() and indices.item() == 1
    np.testing.assert_array_equal(x, before)


def test_float16_is_pooled_in_float32_and_kept():
    x = tie_free((1, 2, 12), 3).astype(np.float16)
    y = pg.fractional_max_pool(x, 2, 7, samples=np.full((1, 2, 1), 0.5, np.float32))
    expected = pg.fractional_max_pool(x.astype(np.float32), 2, 7,
                                      samples=np.full((1, 2, 1), 0.5, np.float32))
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, expected.astype(np.float16))


X = np.zeros((1, 2, 8, 8))


@pytest.mark.parametrize("call, error, message", [
    (lambda: pg.fractional_max_pool(X, 2), ValueError, "exactly one of output_size"),
    (lambda: pg.fractional_max_pool(X, 2, 4, 0.5), ValueError, "exactly one of output_size"),
    (lambda: pg.fractional_max_pool(X, 2, output_ratio=1.5), ValueError, r"in \(0, 1\)"),
    (lambda: pg.fractional_max_pool(X, 2, output_ratio=0.05), ValueError, "empty output"),
    (lambda: pg.fractional_max_pool(X, 3, 7), ValueError, "needs at least 9 inputs"),
    (lambda: pg.fractional_max_pool(X, "disjoint", 9), ValueError, "exceeds input size"),
    (lambda: pg.fractional_max_pool(X, "strided", 4), ValueError, "'disjoint', 'overlapping'"),
    (lambda: pg.fractional_max_pool(X, 2, 4, sequence="halton"), ValueError, "sequence must"),
    (lambda: pg.fractional_max_pool(X, 2, 4, samples=np.zeros((1, 2))), ValueError,
     r"shape \(1, 2, 2\)"),
    (lambda: pg.fractional_max_pool(X, 2, 4, samples=np.ones((1, 2, 2))), ValueError,
     r"\[0, 1\)"),
    (lambda: pg.fractional_max_pool(X, 2, 4, samples=np.zeros((1, 2, 2)), rng=0), ValueError,
     "not both"),
    (lambda: pg.fractional_max_pool(X, 2, 4, samples=np.zeros((1, 2, 2)), sequence="random"),
     ValueError, "drawn from rng"),
    (lambda: pg.fractional_max_pool(X, 2, 4, rng="seed"), TypeError, "rng must be"),
    (lambda: pg.fractional_max_pool(X.astype(int), 2, 4), TypeError, "dtype"),
])
def test_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("kernel, out, shape", [
    (1, (4, 6), (1, 2, 5, 9)),
    (2, (5, 7), (2, 3, 11, 17)),
    (3, (6, 5), (2, 2, 13, 12)),
    ((2, 4), (4, 3), (1, 3, 9, 10)),         # W windows of 4: the kernel's scalar loop
    ("overlapping", (5, 6), (1, 3, 11, 13)),  # W windows of 2 and 3 in one row
    ("disjoint", (4, 3), (1, 2, 9, 11)),      # of 3 and 4
    ((2, 2, 3), (3, 4, 5), (1, 2, 7, 9, 11)),
])
def test_forward_takes_the_first_maximum_in_row_major_order(kernel, out, shape):
    """The forward reduces along W first, then across rows: against each window's
    first maximum (or first NaN) in row-major order, with many ties and NaNs."""
    rng = np.random.default_rng(17)
    x = rng.integers(0, 3, shape).astype(np.float32)
    x.flat[rng.choice(x.size, 6, replace=False)] = np.nan
    ndim = len(out)
    samples = rng.random(shape[:-ndim] + (ndim,)).astype(np.float32)
    y, indices = pg.fractional_max_pool(x, kernel, out, return_indices=True, samples=samples)
    kernels = (kernel,) * ndim if not isinstance(kernel, tuple) else kernel
    starts, lengths, _ = region_tables(shape[-ndim:], kernels, out,
                                       samples.reshape(-1, ndim), "pseudo_random", None)
    planes = x.reshape((-1,) + shape[-ndim:])
    axes = range(3 - ndim, 3)
    for p, plane in enumerate(planes):
        for o in np.ndindex(*out):
            window = tuple(slice(starts[p, a, i], starts[p, a, i] + lengths[p, a, i])
                           for a, i in zip(axes, o, strict=True))
            values = plane[window].ravel()
            nan = np.flatnonzero(np.isnan(values))
            first = nan[0] if nan.size else int(np.argmax(values))
            flat = np.ravel_multi_index(
                tuple(s.start + k for s, k in zip(window, np.unravel_index(
                    first, plane[window].shape), strict=True)), plane.shape)
            assert indices.reshape(len(planes), -1)[p, np.ravel_multi_index(o, out)] == flat
            got = y.reshape(len(planes), -1)[p, np.ravel_multi_index(o, out)]
            assert got == values[first] or (np.isnan(got) and np.isnan(values[first]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, kernel, out", [
    ((2, 5, 8, 10), 2, (4, 5)),        # ratio 0.5 of even lengths: 2x2 windows, stride 2
    ((1, 3, 9, 12), (3, 2), (4, 6)),   # overlapping windows of 3 at steps of 2
    ((2, 2, 12), 3, (4,)),             # 1-d, steps of 3
    ((1, 2, 6, 4, 8), 2, (3, 2, 4)),   # 3-d
])
def test_windows_on_one_grid_run_max_pooling_with_the_fractional_kernels_bits(
        shape, kernel, out, dtype, monkeypatch):
    """Where every plane's windows form one grid (a pseudo-random sequence whose mean
    step is whole), the forward and the backward run max pooling's kernels for that
    grid: the values, winners' indices and gradients of the fractional kernels, in both
    layouts, with ties and NaN."""
    from poolgrad.bench.suite import channels_last
    from poolgrad.engines import fractional as engine
    from poolgrad.kinds import fractional as fractional_kind

    rng = np.random.default_rng(5)
    x = np.round(rng.standard_normal(shape) * 2).astype(dtype)  # ties
    x.flat[rng.integers(0, x.size, 3)] = np.nan
    dy = rng.standard_normal(shape[:2] + out).astype(dtype)
    by_grid = engine.regular_grid
    for stored in (x, channels_last(x)):
        results = []
        for grid, search in ((by_grid, fractional_kind.pseudo_random_grid),
                             (lambda *args: None, lambda *args: None)):
            monkeypatch.setattr(engine, "regular_grid", grid)
            monkeypatch.setattr(fractional_kind, "pseudo_random_grid", search)
            (y, indices), pullback = pg.vjp(pg.fractional_max_pool, stored, kernel, out,
                                            return_indices=True, rng=3)
            results.append((tuple(pullback.kernels.values()), y, indices, pullback(dy)))
        (fast, *ours), (general, *theirs) = results
        for name in fast:
            assert name.startswith(("tiled.", "row_passes.", "channels_last.", "max_pool.",
                                    "gather_rows."))
        assert all(name.startswith("fractional.") for name in general)
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(stored, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spatial, kernel, out, whole", [
    ((56,), (2,), (28,), True), ((10, 12), (2, 3), (5, 4), True), ((13,), (3,), (6,), True),
    ((6, 4, 8), (2, 2, 2), (3, 2, 4), True), ((11,), (2,), (5,), False),
    ((9,), (2,), (1,), False), ((8,), ("disjoint",), (4,), True),
    ((9,), ("disjoint",), (4,), False), ((8,), ("overlapping",), (4,), False)])
def test_the_grid_found_without_tables_is_the_tables_grid(spatial, kernel, out, whole,
                                                          dtype):
    """``pseudo_random_grid`` checks the pseudo-random sequence's starts without building
    the tables: the same plan as ``regular_grid`` of the tables, and the tables'
    starts. On random draws a whole mean step (``whole``) gives a grid; draws just
    below 1 move windows off it (``(i + u) alpha`` rounds up in the draws' dtype), and
    then neither finds one."""
    from poolgrad.engines.fractional import regular_grid
    from poolgrad.kinds.fractional import pseudo_random_grid

    ndim = len(spatial)
    u = np.random.default_rng(9).random((200, ndim)).astype(dtype) * 0.9
    near_one = u.copy()
    near_one[7] = np.nextafter(dtype(1.0), dtype(0))
    for draws, on_grid in ((u, whole), (near_one, False)):
        tables = region_tables(spatial, kernel, out, draws, "pseudo_random", None)
        expected = regular_grid(tables, spatial, out)
        found = pseudo_random_grid(spatial, kernel, out, draws, "pseudo_random")
        assert (found is not None) == (expected is not None) == on_grid
        if found is not None:
            plan, starts = found
            assert plan == expected
            np.testing.assert_array_equal(starts, tables[0])
    assert pseudo_random_grid(spatial, kernel, out, u, "random") is None


def test_a_mean_step_whole_only_after_rounding_is_no_grid():
    """``alpha = span / steps`` in float32 is whole for a span of 2^24 + 5 over 2^23 + 2
    steps (the span rounds to 2^24 + 4), but the last window starts at the span itself,
    off the grid of steps of 2: no grid (it took one, and pooled the last window one
    position early). No planes: no grid, as ``regular_grid`` says."""
    from poolgrad.kinds.fractional import pseudo_random_grid

    steps = 2**23 + 2
    length, out = 2 * steps + 1 + 2, steps + 1
    u = np.array([[0.1]], np.float32)
    assert np.float32(length - 2) / np.float32(steps) == 2.0
    assert pseudo_random_grid((length,), (2,), (out,), u, "pseudo_random") is None
    assert pseudo_random_grid((10,), (2,), (5,), u[:0], "pseudo_random") is None


def test_windows_off_a_grid_are_not_taken_for_one():
    """A mean step that is not whole (11 to 5 with windows of 2: 9/4), Graham's regions
    of uneven lengths, planes whose grids differ or no planes: no grid."""
    from poolgrad.engines.fractional import regular_grid

    u = np.random.default_rng(8).random((6, 1))
    assert regular_grid(region_tables((11,), (2,), (5,), u, "pseudo_random", None), (11,),
                        (5,)) is None
    assert regular_grid(region_tables((11,), ("disjoint",), (4,), u, "pseudo_random", None),
                        (11,), (4,)) is None
    on_grid = region_tables((10,), (2,), (5,), u, "pseudo_random", None)
    plan = regular_grid(on_grid, (10,), (5,))
    assert plan is not None and plan.out_spatial == (5,)
    starts, lengths, extent = on_grid
    shifted = starts.copy()
    shifted[2, -1, 1] += 1  # one plane's second window one step on
    assert regular_grid((shifted, lengths, extent), (10,), (5,)) is None
    assert regular_grid((starts[:0], lengths[:0], extent), (10,), (5,)) is None
