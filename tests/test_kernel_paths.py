"""The row-pass kernels (vectorized, for contiguous arrays and common W geometries)
against the general kernels: the same bits, winners, NaN routing and gradients."""

import itertools
import math

import numpy as np
import pytest

import poolgrad as pg
from poolgrad import geometry
from poolgrad.engines.pullback import empty
from poolgrad.kernels import dispatch

# The kernels each case must run, in the order (max values-only forward, max recorded
# forward, max backward, avg forward, avg backward); see docs/kernels.md
TILED = ("tiled.max_values_forward_tiled", "tiled.max_pool_forward_tiled",
         "tiled.max_pool_backward_tiled", "tiled.avg_pool_forward_tiled",
         "gather_rows.avg_pool_backward_rows")
ROWS = ("row_passes.max_values_forward_rows", "row_passes.max_pool_forward_rows",
        "gather_rows.max_pool_backward_rows", "row_passes.avg_pool_forward_rows",
        "gather_rows.avg_pool_backward_rows")
BLOCKS = ("blocks.max_values_forward_blocks", "blocks.max_pool_forward_blocks",
          "gather_rows.max_pool_backward_rows", "blocks.avg_pool_forward_blocks",
          "gather_rows.avg_pool_backward_rows")
# a row of 8 windows, two of them cut by the padding: too few clear ones for a recorded
# block, enough for the values-only blocks, which mask the padded taps
BLOCKS_UNRECORDED = BLOCKS[:1] + ROWS[1:2] + BLOCKS[2:]
# tiling windows of a W width without row passes: only the backward has a fast kernel
TILED_BACKWARD = ("max_pool.max_pool_forward", "max_pool.max_pool_forward",
                  "tiled.max_pool_backward_tiled", "sum_pool.avg_pool_forward",
                  "sum_pool.avg_pool_backward")
WIDE_TILED = ("max_pool.max_pool_forward_wide",) * 2 + TILED_BACKWARD[2:]

# (spatial, kernel, stride, padding, kernels): every (kernel, stride) with a vectorized W
# pass, in 1, 2 and 3 dims, with and without padding (windows cut by W padding take the
# one-by-one path), including inputs too narrow to have interior windows
CASES = [
    ((17,), 4, 4, 0, TILED), ((18,), 4, 4, ((1, 3),), ROWS), ((3,), 4, 4, ((1, 0),), ROWS),
    ((9,), 4, 4, 2, ROWS), ((9, 11), 2, 2, 0, TILED), ((9, 11), 2, 2, 1, ROWS),
    ((9, 11), 3, 2, 1, ROWS), ((8, 13), 3, 2, ((2, 0), (1, 2)), ROWS),
    ((2, 3), 3, 2, 1, ROWS), ((7, 4), 3, 2, ((0, 1), (2, 1)), ROWS),
    ((5, 6, 9), 2, 2, 1, ROWS), ((5, 6, 9), 3, 2, 0, ROWS),
    # windows that tile the input (the tiled max backward), with rows, columns and slices
    # that no window reads
    ((5, 6, 9), 2, 2, 0, TILED), ((4, 8), 2, 2, 0, TILED), ((16,), 4, 4, 0, TILED),
    ((7, 10), 3, 3, 0, TILED_BACKWARD),
    # tiling windows wider than the tiled kernels' constant widths (2 rows of 5: the
    # wide max forward), and one tap wide
    ((6, 17), (2, 5), (2, 5), 0, WIDE_TILED), ((7, 6), (3, 1), (3, 1), 0, TILED_BACKWARD),
    # 3-tap stride-2 rows long enough for the vector blocks of the average: exactly one
    # block ending at the last element of x, blocks that overlap, W padding on both
    # sides (one block reaching into both; windows with a single real tap), and 3-d
    # windows with more than three tap rows
    ((3, 17), 3, 2, 0, BLOCKS), ((4, 40), 3, 2, 1, BLOCKS),
    ((5, 37), 3, 2, ((2, 1), (1, 2)), BLOCKS), ((3, 15), 3, 2, 1, BLOCKS_UNRECORDED),
    ((3, 21), 3, 2, ((0, 0), (2, 2)), BLOCKS),
    ((3, 5, 23), 3, 2, ((1, 0), (0, 1), (1, 1)), BLOCKS),
    # tiling windows 2 wide, whose backward routes rows in blocks of 32 bytes (8 float32
    # or 4 float64): blocks that overlap with a column no window reads, an odd number of
    # tap rows, a single one, and 3-d windows with four
    ((5, 23), 2, 2, 0, TILED), ((7, 20), (3, 2), (3, 2), 0, TILED),
    ((3, 12), (1, 2), (1, 2), 0, TILED), ((3, 5, 30), 2, 2, 0, TILED),
]


def chosen_kernels(monkeypatch):
    """A list that collects the name of every kernel the dispatch chooses from now on."""
    names = []
    choose = dispatch.choose

    def spy(*args, **kwargs):
        kernel = choose(*args, **kwargs)
        names.append(kernel.name)
        return kernel
    monkeypatch.setattr(dispatch, "choose", spy)
    return names


def put_nan_payloads(plane, every=3):
    """NaNs with different bits (quiet and signalling payloads, both signs) at every
    ``every``-th element, so that a kernel that lets the wrong NaN win gives different
    bits."""
    bits = plane.view(np.uint32 if plane.dtype == np.float32 else np.uint64)
    top = np.array(np.inf, plane.dtype).view(bits.dtype)[()]  # exponent all ones
    sign = np.array(-0.0, plane.dtype).view(bits.dtype)[()]
    flat = bits.reshape(-1)
    for k in range(0, flat.size, every):
        payload = bits.dtype.type(k % 7 + 1)
        flat[k] = (top | payload) | (sign if k % 2 else bits.dtype.type(0))


def both_paths(fn, monkeypatch):
    """``fn()`` with the kernels the dispatch chooses, then with the general kernels only."""
    fast = fn()
    with monkeypatch.context() as patch:
        patch.setattr(dispatch, "choose", dispatch.general)
        slow = fn()
    return fast, slow


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_passes_match_the_general_kernels(case, dtype, monkeypatch):
    spatial, kernel, stride, padding, kernels = CASES[case]
    rng = np.random.default_rng(case)
    x = rng.integers(-2, 3, (2, 3) + spatial).astype(dtype)  # many ties
    x[0, 0].flat[::5] = np.nan  # NaN must win, the first one
    put_nan_payloads(x[1, 2])
    # a lone NaN off the first tap row (at h = 1, d = 1): a kernel that checks only the
    # first tap row for NaN would let a number win that window
    x[(1, 1) + (1,) * len(spatial)] = np.nan
    args = (kernel, stride, padding)

    def max_run():
        (y, indices), pullback = pg.vjp(pg.max_pool, x, *args, return_indices=True)
        return y, indices, pullback(dy)

    with monkeypatch.context() as patch:
        ran = chosen_kernels(patch)
        values_only = pg.max_pool(x, *args)
        (_, pullback), (_, avg_pullback) = pg.vjp(pg.max_pool, x, *args), pg.vjp(
            pg.avg_pool, x, *args)
    assert ran[:1] + list(pullback.kernels.values()) + list(
        avg_pullback.kernels.values()) == list(kernels)
    dy = rng.standard_normal(values_only.shape).astype(dtype)
    fast, slow = both_paths(max_run, monkeypatch)
    for a, b in zip(fast, slow, strict=True):
        assert a.tobytes() == b.tobytes()
    # a sum's NaN carries the bits of one of its NaN operands, and which one is the
    # compiler's choice (it may commute an addition): one kind of NaN for the sums
    x[1, 2] = np.nan
    # a window of -0s sums to +0, as sums that start from 0 (PyTorch's) give
    x[0, 1] = np.where(x[0, 1] == 0, -0.0, x[0, 1])
    x[1, 1] = -0.0
    # tiny negative sums whose means underflow to -0, as in sums that start from 0
    x[0, 2] = np.where(x[0, 2] > 0, -np.finfo(dtype).smallest_subnormal, 0.0)
    for include in (True, False):
        def avg_run(include=include):
            y, pullback = pg.vjp(pg.avg_pool, x, *args, count_include_pad=include)
            return y, pullback(dy)
        fast, slow = both_paths(avg_run, monkeypatch)
        for a, b in zip(fast, slow, strict=True):
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stride2_blocks_leave_out_the_taps_past_either_edge(dtype, monkeypatch):
    """The vector blocks of 3-tap stride-2 rows (average, and max values) mask out the
    taps that fall in the W padding or, with ceil_mode, past the end of the row: the
    same bits as the general kernels (average, with and without the padding counted;
    a window of -0s gives +0) and as the forward that records winners (max)."""
    served = chosen_kernels(monkeypatch)
    rng = np.random.default_rng(5)
    # (width, padding, dilation, ceil_mode); the last one with tap rows 2 apart
    for width, padding, dilation, ceil_mode in (
            (20, 0, 1, True), (16, 0, 1, True), (19, 1, 1, True),
            (34, ((0, 0), (2, 1)), 1, False), (18, 1, (2, 1), False)):
        x = rng.integers(-2, 3, (2, 3, 7, width)).astype(dtype)
        x[0, 1] = np.where(x[0, 1] == 0, -0.0, x[0, 1])
        x[1, 1] = -0.0
        args = (3, 2, padding, dilation, ceil_mode)
        for include in (True, False):
            def run(include=include, args=args, x=x):
                return pg.avg_pool(x, *args, count_include_pad=include)
            fast, slow = both_paths(run, monkeypatch)
            assert fast.tobytes() == slow.tobytes()
            assert not np.signbit(fast[1, 1]).any()
        x[0, 2] = -np.inf  # the blocks count taps in the padding as -inf
        x[1, 0, 2:5].flat[::4] = np.nan
        recorded, _ = pg.vjp(pg.max_pool, x, *args)
        assert pg.max_pool(x, *args).tobytes() == recorded.tobytes()
    # every case ran the blocks (the general kernels run unspied)
    assert served.count("blocks.avg_pool_forward_blocks") == 10
    assert served.count("blocks.max_values_forward_blocks") == 5


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_recorded_stride2_blocks_keep_the_winners_of_the_general_kernels(dtype,
                                                                         monkeypatch):
    """The forward that records winners runs 3-tap stride-2 rows in vector blocks (the
    windows clear of the W padding) and the windows cut by the padding one by one: the
    values, winners and gradients of the general kernels, with ties, NaN rows, windows
    of -inf at the cut edges (the first real tap wins), and tap numbers that move on
    along H and D (3-d windows, dilated H, 27 taps)."""
    served = chosen_kernels(monkeypatch)
    rng = np.random.default_rng(11)
    cases = [((7, 20), 3, 2, 0, 1, True), ((7, 41), 3, 2, 1, 1, False),
             ((6, 37), 3, 2, ((2, 1), (1, 2)), 1, False), ((9, 36), 3, 2, 1, (2, 1), True),
             ((5, 6, 23), 3, 2, ((1, 0), (0, 1), (1, 1)), 1, False),
             ((4, 5, 40), 3, 2, 1, 1, True)]
    for spatial, kernel_size, stride, padding, dilation, ceil_mode in cases:
        x = rng.integers(-2, 3, (2, 4) + spatial).astype(dtype)  # many ties
        x[0, 1] = -np.inf
        x[0, 2, ..., :3] = -np.inf
        x[0, 2, ..., -3:] = -np.inf
        x[1, 0].flat[::7] = np.nan
        put_nan_payloads(x[1, 3])
        args = (kernel_size, stride, padding, dilation, ceil_mode)
        dy = rng.standard_normal(pg.max_pool(x, *args).shape).astype(dtype)

        def run(x=x, args=args, dy=dy):
            (y, indices), pullback = pg.vjp(pg.max_pool, x, *args, return_indices=True)
            return y, indices, pullback(dy)

        fast, slow = both_paths(run, monkeypatch)
        for a, b in zip(fast, slow, strict=True):
            assert a.tobytes() == b.tobytes()
    # every case ran the blocks (the general kernels run unspied)
    assert served.count("blocks.max_pool_forward_blocks") == len(cases)


def test_row_passes_serve_the_common_layers():
    x = np.zeros((1, 1, 1, 8, 8), np.float32)
    plan = geometry.sliding_plan((8, 8), (2, 2), (2, 2), (1, 1), ((0, 0), (0, 0)), False)
    assert dispatch.row_interior(plan) is not None
    dilated = geometry.sliding_plan((8, 8), (2, 2), (2, 2), (1, 2), ((0, 0), (0, 0)), False)
    assert dispatch.row_interior(dilated) is None
    read_only = x.copy()
    read_only.flags.writeable = False
    assert dispatch.operand(x).fast
    for other in (x.transpose(0, 1, 2, 4, 3), x.astype(np.int32), read_only):
        assert not dispatch.operand(other).fast
        name = dispatch.choose("max", "forward", plan, dispatch.operand(other)).name
        assert name == "max_pool.max_pool_forward"
    assert dispatch.choose("max", "forward", plan, dispatch.operand(x)).name == (
        "tiled.max_values_forward_tiled")


def test_plans_keep_their_per_call_tables_and_hand_out_copies():
    """The W interior and the divisor tables are built once per plan; writing into a
    table a call was given changes nothing for the next call."""
    plan = geometry.sliding_plan((9, 11), (3, 3), (2, 2), (1, 1), ((1, 1), (1, 1)), False)
    # windows start at 2*ow - 1: window 0 reads the front padding, window 5 the back
    interior = dispatch.row_interior(plan)
    assert interior.tolist() == [1, 5, 2]
    interior[:] = 0
    assert dispatch.row_interior(plan).tolist() == [1, 5, 2]
    padded = plan.divisor_table("padded", None, np.float32)
    assert padded[2, :6].tolist() == [3] * 6
    padded[:] = 7
    assert plan.divisor_table("padded", None, np.float32)[2, :6].tolist() == [3] * 6
    assert plan.divisor_table("real", None, np.float32)[2, :6].tolist() == [2, 3, 3, 3, 3, 2]
    assert plan.divisor_table("real", 5, np.float64)[0, 0] == 5


@pytest.mark.parametrize("args", [(2,), (3,), (3, 2), (3, 2, 1), (4, 4, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_backward_moves_every_gradient_value_exactly(args, dtype, monkeypatch):
    """The fast backwards (tiled: gradient bits copied; overlapping: ``dy * (0 or 1)``
    with rows that come out non-finite redone) against the general gather: -0,
    infinities and NaN in dy must arrive as its ``0 + dy`` (so -0 becomes +0)."""
    x = np.random.default_rng(5).standard_normal((2, 3, 5, 6, 9)).astype(dtype)
    plan = geometry.sliding_plan((5, 6, 9), (2, 2, 2), (2, 2, 2), (1, 1, 1),
                                 ((0, 0),) * 3, False)
    assert plan.tiles and not geometry.sliding_plan(
        (5, 6, 9), (3, 3, 3), (2, 2, 2), (1, 1, 1), ((0, 0),) * 3, False).tiles
    y, pullback = pg.vjp(pg.max_pool, x, *args)
    dy = np.random.default_rng(6).standard_normal(y.shape).astype(dtype)
    dy.flat[::7] = -0.0
    dy.flat[1::11] = np.inf
    dy.flat[2::13] = -np.inf
    dy.flat[3::17] = np.nan
    put_nan_payloads(dy[1, 1])  # signalling NaNs must come out quieted, as 0 + dy does

    def garbage(shape, dtype, channels_last):  # dx as uninitialised memory may hold
        return np.full(shape, 12345.0, dtype)  # no element may be left unwritten

    from poolgrad.engines import pullback as pullbacks

    monkeypatch.setattr(pullbacks, "empty", garbage)
    fast, slow = both_paths(lambda: pullback(dy), monkeypatch)
    assert fast.tobytes() == slow.tobytes()
    assert not np.signbit(fast[fast == 0]).any()
    assert not (fast == 12345.0).any()


def test_fast_paths_on_arrays_that_run_in_parallel(monkeypatch):
    """Arrays above SERIAL_BELOW run on the thread pool: every parallel step must write
    only its own rows, and a step's run of rows crosses rows, slices and planes."""
    from poolgrad.kernels import SERIAL_BELOW

    rng = np.random.default_rng(9)
    for shape in ((2, 16, 97, 96), (2, 8, 13, 37, 36)):
        x = rng.integers(-3, 4, shape).astype(np.float32)
        assert x.size > SERIAL_BELOW
        put_nan_payloads(x[1, 7])
        for op, args in ((pg.max_pool, (2,)), (pg.max_pool, (3, 2, 1)), (pg.avg_pool, (2,)),
                         (pg.avg_pool, (3, 2, 1))):
            def run(op=op, args=args, x=x):
                rng = np.random.default_rng(10)
                y, pullback = pg.vjp(op, x, *args)
                return op(x, *args), y, pullback(rng.standard_normal(y.shape,
                                                                     dtype=np.float32))
            fast = run()
            with monkeypatch.context() as patch:
                patch.setattr(dispatch, "choose", dispatch.general)
                slow = run()
            for a, b in zip(fast, slow, strict=True):
                if op is pg.max_pool:
                    assert a.tobytes() == b.tobytes()
                else:  # a sum of NaNs keeps a payload the compiler picks (see README)
                    nan = np.isnan(a)
                    assert (nan == np.isnan(b)).all()
                    assert a[~nan].tobytes() == b[~nan].tobytes()


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inference_forward_gives_the_values_of_the_recorded_forward(case, dtype):
    """A forward without pullback or indices folds values only (row passes and
    channels-last); it must give the bits of the forward that records the winners."""
    from poolgrad.bench.suite import channels_last

    spatial, kernel, stride, padding, kernels = CASES[case]
    rng = np.random.default_rng(case)
    x = rng.integers(-2, 3, (2, 8) + spatial).astype(dtype)  # many ties
    x[x == 0] = np.where(rng.random(int((x == 0).sum())) < 0.5, -0.0, 0.0)  # +0/-0 ties
    x[0, 0].flat[::5] = np.nan
    put_nan_payloads(x[1, 5])  # which NaN wins shows in its bits: the first one must
    x[1, 3].flat[::3] = np.inf
    x[1, 4] = -np.inf  # as the blocks count taps in the padding: -inf, no real tap lost
    x[1, 6].flat[::2] = -np.inf
    args = (kernel, stride, padding)
    recorded, _ = pg.vjp(pg.max_pool, x, *args)
    for layout in (x, channels_last(x)):
        values = pg.max_pool(layout, *args)
        assert np.ascontiguousarray(values).tobytes() == recorded.tobytes()


def test_dispatch_lists_its_rules_and_refuses_what_it_has_no_kernel_for():
    """Every rule list ends in its general kernel; an unknown op or pass is a ValueError
    that names what exists."""
    assert dispatch.names("avg", "backward") == [
        "sum_pool.global_avg_backward", "channels_last.global_avg_backward",
        "channels_last.avg_pool_backward", "gather_rows.avg_pool_backward_rows",
        "sum_pool.avg_pool_backward"]
    for op, direction in (("max", "forward"), ("max", "backward"), ("avg", "forward"),
                          ("global_avg", "forward"), ("lp", "backward")):
        general = dispatch.names(op, direction)[-1]
        assert general.startswith(("max_pool.", "sum_pool.")), general
    plan = geometry.sliding_plan((8, 8), (2, 2), (2, 2), (1, 1), ((0, 0), (0, 0)), False)
    with pytest.raises(ValueError, match="no Numba kernel for op 'median', pass 'forward'; known"):
        dispatch.choose("median", "forward", plan, dispatch.operand(np.zeros((1,) * 5)))
    # a channels-last forward's gradient is stored channels-last, any other C-contiguous
    x = np.zeros((2, 3, 1, 8, 8), np.float32)
    cl = np.ascontiguousarray(x.transpose(0, 2, 3, 4, 1)).transpose(0, 4, 1, 2, 3)
    for array, layout in ((x, "nchw"), (cl, "channels_last")):
        kernel = dispatch.choose("max", "forward", plan, dispatch.operand(array), record=True)
        stored = dispatch.stored_as(kernel.channels_last, np.float32)
        assert kernel.records and stored.layout == layout


@pytest.mark.parametrize("spatial, kernel, stride, padding, dilation", [
    ((9, 11), 2, 2, 1, 1),            # 2x2 windows, cut ones at the edges
    ((11, 12), 3, 2, 1, 1),           # 3x3 and its 2x3, 3x2, 2x2 edges
    ((11, 12), 3, 2, 2, 2),           # dilated 3x3
    ((4, 6, 9), 2, 2, 1, 1),          # 2x2x2 and its cut 1x2x2, 2x1x2 edges
    ((5, 6, 9), (1, 3, 3), 2, 0, 1),  # 3-d with 3x3 planes
    ((5, 6, 9), 3, 2, 1, 1),          # windows of more tap rows: a pass per row
    ((25,), 4, 3, 2, 1),              # 1-d rows of 4 taps and the cut 2 and 3 at edges
    ((23,), 3, 2, 1, 3),              # dilated 1-d rows of 3
    ((10, 12), 2, 2, 0, 1),           # VGG's 2x2/2: tiling windows
    ((9, 11), 2, 2, 0, 1),            # 2x2/2 tiling all but the last row and column
    ((3, 6, 8), (1, 2, 2), (1, 2, 2), 0, 1),  # 2x2/2 planes of a 3-d input
    ((5, 6, 9), 2, 2, 0, 1),          # 2x2x2/2, tiling all but the last slice
    ((26,), 4, 4, 0, 1),              # 1-d k4/4, tiling all but the last two
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_channels_last_window_folds_match_the_general_kernel(spatial, kernel, stride, padding,
                                                            dilation, dtype, monkeypatch):
    """The channels-last inference forward folds 2x2, 3x3 (and their cut edges), 2x2x2
    and 1-d windows of two to four taps in one pass over C: the bits of the general
    kernel, with ties, -0, infinities and NaN payloads, on a C of several vectors plus a
    tail."""
    from poolgrad.bench.suite import channels_last

    rng = np.random.default_rng(len(spatial) * 10 + np.ndim(kernel))
    x = rng.integers(-2, 3, (2, 37) + spatial).astype(dtype)  # many ties
    x[x == 0] = np.where(rng.random(int((x == 0).sum())) < 0.5, -0.0, 0.0)
    x[0, :5].flat[::7] = np.nan
    put_nan_payloads(x[1, 5])
    put_nan_payloads(x[1, 9], every=1)  # windows of NaNs only: the first must win
    # NaNs of random payloads at random places: windows whose first NaN is any tap
    bits = x[:, 10:30].view(np.uint32 if dtype == np.float32 else np.uint64)
    payload = rng.integers(1, 99, bits.shape, bits.dtype)
    nan_bits = np.array(np.nan, dtype).view(bits.dtype) | payload
    density = np.linspace(0.05, 0.5, 20).reshape((20,) + (1,) * len(spatial))
    scattered = rng.random(bits.shape) < density
    bits[scattered] = nan_bits[scattered]
    x[1, 6].flat[::3] = np.inf
    x[1, 7] = -np.inf
    x[0, 8].flat[1::4] = -np.inf
    view = channels_last(x)
    args = dict(kernel_size=kernel, stride=stride, padding=padding, dilation=dilation)
    with monkeypatch.context() as patch:
        ran = chosen_kernels(patch)
        fast = pg.max_pool(view, **args)
    window = (1,) * (3 - len(spatial)) + tuple(np.broadcast_to(kernel, len(spatial)))
    tiles = padding == 0 and kernel == stride and window in ((1, 2, 2), (2, 2, 2), (1, 1, 4))
    assert ran == [("channels_last_tiles" if tiles else "channels_last") + ".max_values_forward"]
    _, slow = both_paths(lambda: pg.max_pool(view, **args), monkeypatch)
    assert np.ascontiguousarray(fast).tobytes() == np.ascontiguousarray(slow).tobytes()


@pytest.mark.parametrize("spatial", [(10, 12), (9, 11), (3, 6, 8)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("options", [{}, {"divisor_override": 3}, {"ceil_mode": True}])
def test_channels_last_quads_average_has_the_general_kernels_bits(spatial, dtype, options,
                                                                   monkeypatch):
    """The channels-last average of 2x2 windows that tile (VGG's 2x2/2) runs the tiling
    windows' kernel, with the general kernel's bits: -0 windows give +0, a NaN or an infinity
    spreads to its window, and a divisor override divides every window. Windows cut by
    ceil_mode take the windowed kernel."""
    from poolgrad.bench.suite import channels_last

    rng = np.random.default_rng(len(spatial))
    x = rng.standard_normal((2, 21) + spatial).astype(dtype)
    x[0, :3] = -0.0  # windows of -0s: their mean is +0, as from a sum that starts at 0
    x[1, 4].flat[::5] = np.nan
    x[1, 5].flat[::3] = np.inf
    x[0, 6].flat[1::4] = -np.inf
    x[1, 7].flat[::2] = np.finfo(dtype).tiny / 4  # subnormals, divided without a flush
    kernel = (1, 2, 2) if len(spatial) == 3 else 2
    view = channels_last(x)
    with monkeypatch.context() as patch:
        ran = chosen_kernels(patch)
        fast = pg.avg_pool(view, kernel, kernel, **options)
    cut = options.get("ceil_mode") and any(n % 2 for n in spatial[-2:])
    assert ran == ["channels_last.avg_pool_forward" if cut else
                   "channels_last_tiles.avg_pool_forward_quads"]
    _, slow = both_paths(lambda: pg.avg_pool(view, kernel, kernel, **options), monkeypatch)
    assert np.ascontiguousarray(fast).tobytes() == np.ascontiguousarray(slow).tobytes()


def test_blur_rows_kernels_match_the_general_chain():
    """1-d and 2-d blurs stream rows (``blur_rows.blur_rows_*``): over planes, or over
    channels-last images with the channels innermost; 3-d ones run the chain.
    Against the chain on random geometries, both layouts, every padding mode and
    pre-pool, ties and NaN: the same winners and NaN, values and gradients to rounding
    (the pre-pool's mean and the W adjoint sum in another order), each output in its
    input's layout; a max's values the same bits without its winners (NCHW's flat map
    has a pass of its own for them)."""
    rng = np.random.default_rng(3)
    assert dispatch.names("blur", "forward") == ["blur_rows.blur_rows_forward"] * 2 + [
        "blur.blur_pool_forward"]
    deep = geometry.blur_plan((3, 6, 6), "max", (2, 2, 2), (3, 3, 3), (2, 2, 2),
                              ((1, 1),) * 3, "reflect")
    for layout in ("nchw", "channels_last"):
        assert dispatch.choose("blur", "backward", deep, dispatch.Operand(
            np.dtype(np.float64), layout)).name == "blur.blur_pool_backward"
    checked = {"nchw": 0, "channels_last": 0}
    for trial in range(80):
        ndim, pre = 1 + trial % 2, geometry.BLUR_PRE[trial % 3]
        mode = geometry.BLUR_PADDING_MODES[trial // 3 % 4]
        spatial = tuple(int(v) for v in rng.integers(3, 12, ndim))
        kernel = tuple(int(rng.integers(1, 4)) if pre != "none" else 1 for _ in spatial)
        pads = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in spatial)
        try:
            plan = geometry.blur_plan(spatial, pre, kernel,
                                      tuple(int(v) for v in rng.integers(1, 6, ndim)),
                                      tuple(int(v) for v in rng.integers(1, 4, ndim)),
                                      pads, mode)
        except ValueError:
            continue
        dtype = (np.float64, np.float32)[trial % 2]
        lead = (int(rng.integers(1, 4)), int(rng.integers(2, 5)))
        grid = lead + (1,) * (3 - ndim)
        x = np.round(rng.standard_normal(grid + spatial) * 2).astype(dtype)  # ties
        x.flat[rng.integers(0, x.size, 2)] = np.nan if trial % 4 == 0 else 0
        channels_last = trial % 5 >= 2
        if channels_last:
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 4, 1)).transpose(0, 4, 1, 2, 3)
        operand = dispatch.operand(x)
        records = pre == "max" and math.prod(kernel) > 1
        outputs = []
        for choose in (dispatch.choose, dispatch.general):
            forward = choose("blur", "forward", plan, operand)
            stored = forward.channels_last
            y = empty(grid + plan.out_spatial, dtype, stored)
            winners = (np.zeros(grid + plan.map_spatial, np.uint8) if pre == "max"
                       else np.empty((0,) * 5, np.uint8))
            if stored and pre == "max":
                winners = empty(winners.shape, np.uint8, True)
                winners[...] = 0
            forward(x, y, winners)
            if pre == "max":  # a forward no backward follows: no winners, the same y
                values = empty(y.shape, dtype, stored)
                forward(x, values, None)
                np.testing.assert_array_equal(values, y)
            dx = empty(x.shape, dtype, stored)
            dy = np.nan_to_num(y) * 0.5 + 1
            backward = choose("blur", "backward", plan, dispatch.operand(dy))
            backward(dy, winners, dx)
            outputs.append((forward.name, backward.name, y, winners, dx))
        (fast_f, fast_b, y, winners, dx), (_, _, y0, winners0, dx0) = outputs
        assert (fast_f, fast_b) == ("blur_rows.blur_rows_forward", "blur_rows.blur_rows_backward")
        assert dispatch.operand(y).layout == dispatch.operand(dx).layout == operand.layout
        assert np.array_equal(np.isnan(y), np.isnan(y0))
        if records:
            assert np.array_equal(winners, winners0)
        tolerance = 1e-12 if dtype == np.float64 else 1e-5
        np.testing.assert_allclose(np.nan_to_num(y), np.nan_to_num(y0), rtol=tolerance,
                                   atol=tolerance)
        np.testing.assert_allclose(dx, dx0, rtol=tolerance, atol=tolerance)
        checked[operand.layout] += 1
    assert min(checked.values()) >= 20, checked


@pytest.mark.parametrize("mode", ["zeros", "reflect"])
def test_nchw_max_blur_flat_maps_match_the_general_chain(mode):
    """NCHW max-blurs take the plane's whole max map in flat passes (the 2x2 map of a
    forward without winners in one fused pass): the chain's bits, NaN and ties
    included, with and without winners, across whole planes and split ones."""
    rng = np.random.default_rng(5)
    blurred = geometry.blur_plan((9, 11), "max", (2, 2), (3, 3), (2, 2), ((1, 1),) * 2, mode)
    # a one-tap filter at stride 1: y is the max map itself, each NaN where it must be
    unblurred = geometry.blur_plan((9, 11), "max", (2, 2), (1, 1), (1, 1), ((0, 0),) * 2, mode)
    for planes, plan in itertools.product(((1, 2), (4, 8)), (blurred, unblurred)):
        # (tasks split a plane's rows, or take whole planes)
        x = np.round(rng.standard_normal(planes + (1, 9, 11)) * 2).astype(np.float32)
        x.flat[rng.integers(0, x.size, 3)] = np.nan
        results = []
        for choose, record in ((dispatch.choose, True), (dispatch.choose, False),
                               (dispatch.general, True)):
            forward = choose("blur", "forward", plan, dispatch.operand(x))
            y = np.empty(planes + (1,) + plan.out_spatial, np.float32)
            winners = np.zeros(planes + (1,) + plan.map_spatial, np.uint8) if record else None
            forward(x, y, winners)
            results.append((forward.name, y, winners))
        assert results[0][0] == "blur_rows.blur_rows_forward"
        np.testing.assert_array_equal(results[0][1], results[2][1])
        np.testing.assert_array_equal(results[1][1], results[2][1])
        np.testing.assert_array_equal(results[0][2], results[2][2])


def test_vectorizing_exp_and_log_are_numpys_to_rounding():
    """kernels.elementary, which GeM's kernels raise and take logs with: within 5e-16
    relative of NumPy's wherever the result is a normal number, and NumPy's special
    values (0, inf, NaN, negatives, subnormal inputs) exactly."""
    import numba

    from poolgrad.kernels import elementary

    @numba.njit(error_model="numpy")
    def both(x, exps, logs):
        for i in range(x.shape[0]):
            exps[i], logs[i] = elementary.exp(x[i]), elementary.log(x[i])

    rng = np.random.default_rng(17)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 5e-324, 1e-310,
               np.finfo(np.float64).max, 709.78, 709.79, -745.1, -745.2, 1e-17]
    x = np.concatenate([rng.uniform(-750, 720, 20000), rng.uniform(-1e-3, 1e-3, 2000),
                        np.exp(rng.uniform(-744, 709, 20000)), np.arange(-708.0, 710.0),
                        special])
    exps, logs = np.empty_like(x), np.empty_like(x)
    both(x, exps, logs)
    with np.errstate(all="ignore"):
        for got, want in ((exps, np.exp(x)), (logs, np.log(x))):
            normal = np.isfinite(want) & (np.abs(want) >= np.finfo(np.float64).tiny)
            assert np.max(np.abs(got[normal] - want[normal]) / np.abs(want[normal])) < 5e-16
            exact = ~np.isfinite(want) | (want == 0)
            np.testing.assert_array_equal(got[exact], want[exact])
    assert exps[x == -745.2][0] == 0 and exps[x == 709.79][0] == np.inf


def test_float32_exp_and_log_are_within_one_unit_in_the_last_place():
    """kernels.elementary.exp32 and log32, which the float32 forwards of SoftPool take:
    within one unit in the last place of the exact result wherever that is a normal
    float32, and their special values (inf, 0, NaN, overflow, underflow, negatives,
    subnormal inputs) exactly; exp_in and log_in pick them for float32 and the float64
    functions for float64."""
    import numba

    from poolgrad.kernels import elementary

    @numba.njit(error_model="numpy")
    def both(x, x64, exps, exps64):
        for i in range(x.shape[0]):
            exps[i], exps64[i] = elementary.exp_in(x[i]), elementary.exp_in(x64[i])

    @numba.njit(error_model="numpy")
    def logs(x, out):
        for i in range(x.shape[0]):
            out[i] = elementary.log_in(x[i])

    rng = np.random.default_rng(19)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 88.72, 88.73, -87.3, -103.9, -104.0,
               -1e30, 1e30]
    x = np.concatenate([rng.uniform(-105, 90, 200000), rng.uniform(-1, 1, 50000),
                        rng.uniform(-1e-6, 1e-6, 1000), special]).astype(np.float32)
    exps, exps64 = np.empty_like(x), np.empty(x.shape)
    both(x, x.astype(np.float64), exps, exps64)
    with np.errstate(all="ignore"):
        exact = np.exp(x.astype(np.float64))
        rounded = exact.astype(np.float32)
    normal = np.isfinite(rounded) & (rounded >= np.finfo(np.float32).tiny)
    ulps = np.abs(exps[normal] - exact[normal]) / np.spacing(rounded[normal])
    assert ulps.max() <= 1.0
    assert np.mean(exps[normal] == rounded[normal]) > 0.8  # mostly correctly rounded
    ends = ~np.isfinite(rounded) | (rounded == 0)
    np.testing.assert_array_equal(exps[ends], rounded[ends])
    finite = np.isfinite(exact) & (exact > 0)  # float64 inputs: the float64 exp
    assert np.max(np.abs(exps64[finite] - exact[finite]) / exact[finite]) < 5e-16

    x = np.concatenate([np.exp(rng.uniform(-103, 88, 200000)), rng.uniform(0.5, 2, 50000),
                        [0.0, -0.0, np.inf, -1.0, np.nan, 1.0, 1e-45, 1e-40, 3e38]]
                       ).astype(np.float32)
    got = np.empty_like(x)
    logs(x, got)
    with np.errstate(all="ignore"):
        exact = np.log(x.astype(np.float64))
        rounded = exact.astype(np.float32)
    finite = np.isfinite(rounded) & (rounded != 0)
    assert np.max(np.abs(got[finite] - exact[finite]) / np.spacing(np.abs(rounded[finite]))
                  ) <= 1.0
    ends = ~finite
    np.testing.assert_array_equal(got[ends], rounded[ends])


def test_log2_and_exp2_for_float32_results_are_within_their_bound():
    """kernels.elementary.log2_for_float32 and exp2_for_float32, which raise float32
    inputs to a power that is not whole: log2 within 2**-35 absolute (every normal
    float64 exponent, and near 1, where it is relative) and exp2 within 2**-35 relative
    wherever the result is a normal float64; their special values exactly, and z**p
    from them within (p + 1) 2**-35 relative over the float32 range."""
    import numba

    from poolgrad.kernels import elementary

    @numba.njit(error_model="numpy")
    def both(z, t, logs, exps):
        for i in range(z.shape[0]):
            logs[i] = elementary.log2_for_float32(z[i])
            exps[i] = elementary.exp2_for_float32(t[i])

    rng = np.random.default_rng(23)
    n = 200000
    z = np.concatenate([np.exp2(rng.uniform(-1022, 1024, n)), rng.uniform(0.5, 2, n),
                        1 + rng.uniform(-1e-6, 1e-6, n),
                        [0.0, np.inf, np.nan, -1.0, -np.inf, 1.0, 2.0, 2.0 ** -1022]])
    t = np.concatenate([rng.uniform(-1080, 1030, n), rng.uniform(-1, 1, n),
                        rng.uniform(-1e-9, 1e-9, n),
                        [0.0, np.inf, -np.inf, np.nan, 1024.0, 1023.999, -1074.0, -1076.0]])
    logs, exps = np.empty_like(z), np.empty_like(t)
    both(z, t, logs, exps)
    with np.errstate(all="ignore"):
        want_logs, want_exps = np.log2(z), np.exp2(t)
    finite = np.isfinite(want_logs)
    assert np.max(np.abs(logs[finite] - want_logs[finite])) < 2.0 ** -35
    near_one = slice(2 * n, 3 * n)  # relative where log2 z is small
    assert np.max(np.abs(logs[near_one] - want_logs[near_one])
                  / np.abs(want_logs[near_one])) < 1e-15
    np.testing.assert_array_equal(logs[~finite], want_logs[~finite])
    normal = np.isfinite(want_exps) & (want_exps >= np.finfo(np.float64).tiny)
    assert np.max(np.abs(exps[normal] - want_exps[normal]) / want_exps[normal]) < 2.0 ** -35
    ends = ~np.isfinite(want_exps) | (want_exps == 0)
    np.testing.assert_array_equal(exps[ends], want_exps[ends])

    x = np.concatenate([np.exp(rng.uniform(-103, 88, n)).astype(np.float32),
                        np.float32([1e-45, 3.4e38])]).astype(np.float64)
    logs = np.empty_like(x)
    both(x, np.zeros_like(x), logs, np.empty_like(x))
    for p in (0.5, 2.5, 3.01, 7.3):
        raised = np.empty_like(x)
        both(np.ones_like(x), p * logs, np.empty_like(x), raised)
        want = x ** p
        normal = (want >= np.finfo(np.float64).tiny) & np.isfinite(want)
        assert np.max(np.abs(raised - want)[normal] / want[normal]) < (p + 1) * 2.0 ** -35


def _random_windows(rng, trial):
    """``(ndim, kernel, stride, spatial, lead)`` for the rows-vs-window tests: windows
    with no padding, apart (stride >= kernel) or overlapping."""
    ndim = 1 + trial // 2 % 3
    kernel = tuple(int(v) for v in rng.integers(1, 4, ndim))
    stride = tuple(max(1, k + int(rng.integers(-1, 2))) if trial % 4 else k for k in kernel)
    spatial = tuple(k + int(rng.integers(0, 9)) for k in kernel)
    return ndim, kernel, stride, spatial, (int(rng.integers(1, 3)), int(rng.integers(1, 5)))


def _quad(kernel) -> bool:
    """Whether the kernels see a 2x2 window (a 3-d one of depth 1 included)."""
    return (1,) * (3 - len(kernel)) + tuple(kernel) == (1, 2, 2)


def _stored_as(x, ndim, channels_last):
    """``x``, or a copy of it stored channels-last."""
    return (np.ascontiguousarray(np.moveaxis(x, 1, -1)).transpose(
        0, ndim + 1, *range(1, ndim + 1)) if channels_last else x)


def _rows_and_window_kernels(x, ndim, kernel, stride, run, **arguments):
    """``(layout, apart, fast, slow)``: ``run(choose, xs, stored, plan, operand,
    **arguments) -> (kernel names, *arrays)`` on the dispatch's choice for ``x`` and on
    the general kernels, on a C-ordered copy (their values do not depend on the layout,
    and one layout halves what these tests compile)."""
    plan = pg._inputs.sliding_plan(x, kernel, stride, 0, 1, False, ndim)
    xk = pg._inputs.compute_view(x, pg._inputs.Layout(x.shape, ndim))
    operand = dispatch.operand(xk)
    results = [run(choose, xs, dispatch.operand(xs).layout == "channels_last", plan, operand,
                   **arguments)
               for choose, xs in ((dispatch.choose, xk),
                                  (dispatch.general, np.ascontiguousarray(xk)))]
    return (operand.layout, all(s >= k for s, k in zip(stride, kernel, strict=True)),
            *results)


def _out_shape(xs, plan):
    return xs.shape[:2] + tuple(a.count for a in plan.kernel_axes)


def _same_bits_as_the_window_kernels(result, rows, window, forward=None,
                                     backward=None) -> tuple[str, bool]:
    """Assert that a :func:`_rows_and_window_kernels` result ran ``forward`` (default
    ``{rows}_forward``) and, where windows are apart, ``backward`` (default
    ``{rows}_backward``; else ``{window}_backward``) against ``{window}_*``, with the
    same bits for every output; ``(layout, apart)``."""
    layout, apart, (names, *fast), (general_names, *slow) = result
    backward = (backward or f"{rows}_backward") if apart else f"{window}_backward"
    assert names == (forward or f"{rows}_forward", backward)
    assert general_names == (f"{window}_forward", f"{window}_backward")
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(a, b)
    return layout, apart


def test_gem_rows_kernels_match_the_window_kernels():
    """Windowed GeM on contiguous arrays runs the rows kernels (``power_mean.gem_rows_*``:
    each tap row raised once, the windows of an output row summed together), the
    backward only where windows do not overlap. Against the general window kernels, on
    random geometries in 1-3 dims, both layouts, whole and other powers, windows whose
    sums underflow (summed again relative to their maximum), NaN and the clamp: the same
    bits for y, dx and every term of dp, which the rows backward also writes in its own
    pass."""

    rng = np.random.default_rng(21)
    assert dispatch.names("gem", "forward") == ["power_quads.gem_quads_forward",
                                                "power_mean.gem_rows_forward",
                                                "power_mean.gem_window_forward"]
    seen = set()
    for trial in range(40):
        ndim, kernel, stride, spatial, lead = _random_windows(rng, trial)
        # a whole power (multiplied) and others (exp and log in float64, and for float32
        # results exp2 and log2); few, as each compiles six kernels
        p, dtype = ((3.0, np.float32), (4.5, np.float64), (2.5, np.float32))[trial % 3]
        x = rng.random(lead + spatial) + 0.01
        x.flat[rng.integers(0, x.size, 2)] = -1.0  # below eps: clamped, no gradient
        if trial % 5 == 0:  # every power and dtype in turn
            x.flat[rng.integers(0, x.size)] = np.nan
        if trial % 7 == 0:  # a corner whose z^p underflows float64
            x[(0, 0) + (slice(0, 2),) * ndim] = 1e-120
        x = _stored_as(x.astype(dtype), ndim, trial // 9 % 2 == 1)
        eps = 1e-130 if trial % 7 == 0 else 0.02
        result = _rows_and_window_kernels(x, ndim, kernel, stride, _gem_passes, eps=eps, p=p)
        seen.add(_same_bits_as_the_window_kernels(
            result, "power_mean.gem_rows", "power_mean.gem_window",
            _paired_quads(kernel, stride, result[0], "power_quads.gem_quads_forward")))
    assert seen == {(layout, apart) for layout in ("nchw", "channels_last")
                    for apart in (True, False)}


def _paired_quads(kernel, stride, layout, name) -> str | None:
    """``name``, a 2x2 forward, where it serves these windows (2x2, NCHW ones at stride 2
    along W: ``rule.paired_quads``); else None (the rows kernel)."""
    return name if _quad(kernel) and (layout == "channels_last" or stride[-1] == 2) else None


def _gem_passes(choose, xs, stored, plan, operand, eps, p):
    from poolgrad.kernels import powers

    whole = powers.power_form(p, xs.dtype)
    forward = choose("gem", "forward", plan, operand)
    y = empty(_out_shape(xs, plan), xs.dtype, stored)
    copy = np.full_like(xs, 7.0)  # the pullback's x, written as the forward reads x
    forward(xs, eps, p, whole, y, copy=copy)
    np.testing.assert_array_equal(copy, xs)
    dy = np.nan_to_num(y) * 0.5 - 0.25
    backward = choose("gem", "backward", plan, operand)
    dx = empty(xs.shape, xs.dtype, stored)
    backward(xs, y, dy, eps, p, whole, dx)
    terms = empty(y.shape, np.float64, stored)
    choose("gem", "p_terms", plan, operand)(xs, y, dy, eps, p, whole, terms)
    if backward.name == "power_mean.gem_rows_backward":  # dx and dp's terms in one pass
        fused_dx, fused_terms = empty(xs.shape, xs.dtype, stored), empty(y.shape, np.float64,
                                                                          stored)
        backward(xs, y, dy, eps, p, whole, fused_dx, fused_terms)
        np.testing.assert_array_equal(fused_dx, dx)
        np.testing.assert_array_equal(fused_terms, terms)
    return (forward.name, backward.name), y, dx, terms


def test_lp_runs_gems_rows_kernels_with_the_general_kernels_bits():
    """Lp pooling over windows inside x runs GeM's rows kernels with ``eps`` None
    (``|x|``, the sum not divided, the gradient signed), the backward where windows do
    not overlap. Against the general Lp kernels on random geometries in 1-3 dims, both
    layouts, whole and other powers, zeros (whole windows of them), negative values,
    NaN, +inf, and sums that underflow or overflow (summed again relative to the
    largest |x|): the same bits for y and dx."""
    rng = np.random.default_rng(24)
    assert dispatch.names("lp", "forward") == ["power_quads.gem_quads_forward",
                                               "power_mean.gem_rows_forward",
                                               "sum_pool.lp_pool_forward"]
    assert dispatch.names("lp", "backward") == ["power_mean.gem_rows_backward",
                                                "sum_pool.lp_pool_backward"]
    seen = set()
    for trial in range(36):
        ndim, kernel, stride, spatial, lead = _random_windows(rng, trial)
        # a whole power (multiplied) and others (exp and log in float64, and for float32
        # results exp2 and log2); few, as each compiles
        p, dtype = ((2.0, np.float32), (2.5, np.float64), (1.5, np.float32))[trial % 3]
        x = rng.standard_normal(lead + spatial)
        x[(0, 0) + (slice(0, 3),) * ndim] = 0.0  # a corner of zeros
        if trial % 4 == 0:  # every power and dtype in turn
            x.flat[rng.integers(0, x.size)] = np.nan
        if trial % 5 == 0:
            x.flat[rng.integers(0, x.size)] = np.inf
        if trial % 7 == 0:  # a corner whose |x|^p underflows float64, one that overflows
            x[(0, -1) + (slice(0, 2),) * ndim] = 1e-200 if dtype == np.float64 else 1e-30
            x[(-1, 0) + (slice(0, 2),) * ndim] = 1e200 if dtype == np.float64 else 3e38
        x = _stored_as(x.astype(dtype), ndim, trial // 9 % 2 == 1)
        result = _rows_and_window_kernels(x, ndim, kernel, stride, _lp_passes, p=p)
        seen.add(_same_bits_as_the_window_kernels(
            result, "power_mean.gem_rows", "sum_pool.lp_pool",
            _paired_quads(kernel, stride, result[0], "power_quads.gem_quads_forward")))
    assert seen == {(layout, apart) for layout in ("nchw", "channels_last")
                    for apart in (True, False)}


def _lp_passes(choose, xs, stored, plan, operand, p):
    forward = choose("lp", "forward", plan, operand)
    y = empty(_out_shape(xs, plan), xs.dtype, stored)
    forward(xs, y, p)
    dy = np.nan_to_num(y, posinf=3.0) * 0.5 - 0.25
    backward = choose("lp", "backward", plan, operand)
    dx = empty(xs.shape, xs.dtype, stored)
    backward(xs, y, dy, p, dx)
    return (forward.name, backward.name), y, dx



@pytest.mark.parametrize("p, dtype", [(2.0, np.float32), (2.0, np.float64)])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels-last"])
def test_lp_quads_count_the_sums_out_of_range_where_the_redo_matters(p, dtype,
                                                                     channels_last):
    """Lp of float32 taps with p 1 or 2 does not count the sums that leave the range
    (``powers.may_leave_range``): such a sum is a window of zeros or one with an
    infinite tap, whose root is already the redo's. Float64 taps (and other powers)
    count them and redo those windows. The same bits as the general kernels on such
    windows, on the smallest subnormal and the largest finite value (their terms
    underflow or overflow float64 for float64 taps), -0, -inf and NaN."""
    rng = np.random.default_rng(40)
    x = rng.standard_normal((2, 3, 6, 8)).astype(dtype)
    x[0, 0, :2, :2] = 0.0  # a window of zeros
    x[0, 1, :2, 2:4] = [[-0.0, 0.0], [0.0, -0.0]]
    x[0, 2, 2, 0] = np.inf
    x[1, 0, 2, 2:4] = [-np.inf, 1.0]
    x[1, 1, 4, 4:6] = np.finfo(dtype).smallest_subnormal
    x[1, 1, 5, 4:6] = 0.0
    x[1, 2, 0, 6] = np.finfo(dtype).max
    x[1, 2, 1, 7] = -np.finfo(dtype).max
    x[0, 0, 4, 6] = np.nan
    x = _stored_as(x, 2, channels_last)
    result = _rows_and_window_kernels(x, 2, (2, 2), (2, 2), _lp_passes, p=p)
    _same_bits_as_the_window_kernels(result, "power_mean.gem_rows", "sum_pool.lp_pool",
                                     "power_quads.gem_quads_forward")
    y = result[2][1][:, :, 0]  # (N, C, D, H, W) with D 1
    assert np.isposinf(y[0, 2, 1, 0]) and np.isposinf(y[1, 0, 1, 1]) and y[0, 0, 0, 0] == 0
    assert np.isnan(y[0, 0, 2, 3]) and 0 < y[1, 1, 2, 2] < np.finfo(dtype).tiny
    assert np.isposinf(y[1, 2, 0, 3])  # the norm of (max, -max) is beyond the largest

def test_weighted_rows_kernels_match_the_window_kernels():
    """SoftPool and stochastic pooling's mean run on rows kernels
    (``weighted.weighted_rows_*``: each tap of an output row's windows gathered, then
    the maxima and sums taken over the buffer) where windows have no padding, the
    backward only where they do not overlap. Against the general kernels on random
    geometries in 1-3 dims, both layouts, NaN, windows of zeros: the same bits for y,
    norm and dx."""
    from poolgrad.kernels import weighted

    rng = np.random.default_rng(23)
    seen = set()
    for trial in range(36):
        ndim, kernel, stride, spatial, lead = _random_windows(rng, trial)
        dtype = (np.float32, np.float64)[trial % 2]
        kind = (weighted.SOFT, weighted.SELF)[trial // 6 % 2]
        x = rng.random(lead + spatial) * 3
        x.flat[rng.integers(0, x.size, 3)] = 0.0  # SELF: windows of zeros give 0
        if trial % 5 == 0:
            x.flat[rng.integers(0, x.size)] = np.nan
        x = _stored_as(x.astype(dtype), ndim, trial // 9 % 2 == 1)
        result = _rows_and_window_kernels(x, ndim, kernel, stride, _weighted_passes, kind=kind)
        seen.add(_same_bits_as_the_window_kernels(
            result, "weighted.weighted_rows", "weighted.weighted_pool",
            _paired_quads(kernel, stride, result[0], "weighted.weighted_quads_forward"),
            _quads_backward(kind) if _quad(kernel) else None))
    assert seen == {(layout, apart) for layout in ("nchw", "channels_last")
                    for apart in (True, False)}


def _quads_backward(kind):
    from poolgrad.kernels import weighted

    return ("weighted.soft_quads_backward" if kind == weighted.SOFT
            else "weighted.mean_quads_backward")


def _quad_trials(kinds):
    """The 24 trials of the 2x2 kernels' tests: ``(trial, dtype, kind, channels_last,
    stride)``, every dtype, both kinds and layouts, W strides of 2 and others."""
    for trial in range(24):
        yield (trial, (np.float32, np.float64, np.float16)[trial % 3], kinds[trial // 3 % 2],
               trial // 6 % 2 == 1, ((2, 2), (1, 1), (2, 3), (3, 2))[trial // 12 * 2 + trial % 2])


def _quad_taps(x, stride, y):
    """``(out, taps)``: the kernels' 5-d ``y`` as ``(N, C, H, W)``, and the four taps of
    its 2x2 windows in row-major order, each shaped as ``out``."""
    out = y[:, :, 0]
    return out, [x[:, :, a::stride[0], b::stride[1]][:, :, :out.shape[2], :out.shape[3]]
                 for a in (0, 1) for b in (0, 1)]


def test_weighted_quads_kernel_matches_the_window_kernel():
    """2x2 windows with no padding run ``weighted.weighted_quads_forward`` (the four
    taps in one loop; SoftPool's log in a second; NCHW ones at stride 2 along W alone,
    the others the rows kernel), and at strides >= 2
    ``weighted.soft_quads_backward`` or ``weighted.mean_quads_backward`` (which
    recomputes y and S from x): the window kernels' bits for y, norm and dx in both
    layouts, float16/32/64, strides 1-3 along W, SoftPool and stochastic pooling's
    mean, NaN and windows of zeros. A float32 mean computes in float32: ``y = sum x^2 /
    sum x`` and ``dx = dy / S * (2 x - y)`` in float32 arithmetic, bit for bit."""
    from poolgrad.kernels import weighted

    rng = np.random.default_rng(29)
    seen = set()
    for trial, dtype, kind, channels_last, stride in _quad_trials((weighted.SOFT,
                                                                    weighted.SELF)):
        x = (rng.random((2, 5, 7 + trial % 4, 8 + trial % 3)) * 3).round(1)
        x[0, 0, :2, :2] = 0.0  # a window of zeros: stochastic pooling gives 0
        if trial % 4 == 0:
            x.flat[rng.integers(0, x.size)] = np.nan
        x = _stored_as(x.astype(dtype), 2, channels_last)
        layout, apart, (names, y, norm, dx), (general_names, *slow) = (
            _rows_and_window_kernels(x, 2, (2, 2), stride, _weighted_passes, kind=kind))
        assert names == (_paired_quads((2, 2), stride, layout, "weighted.weighted_quads_forward")
                         or "weighted.weighted_rows_forward",
                         _quads_backward(kind) if apart else "weighted.weighted_pool_backward")
        assert general_names[0] == "weighted.weighted_pool_forward"
        for fast, general in zip((y, norm, dx), slow, strict=True):
            np.testing.assert_array_equal(fast, general)
        if kind == weighted.SELF and dtype == np.float32:
            out, taps = _quad_taps(x, stride, y)
            zero = np.float32(0)
            total = (((zero + taps[0]) + taps[1]) + taps[2]) + taps[3]
            squares = (((zero + taps[0] ** 2) + taps[1] ** 2) + taps[2] ** 2) + taps[3] ** 2
            with np.errstate(invalid="ignore"):
                expected = np.where(total != 0, squares / total, zero)
            np.testing.assert_array_equal(out, expected)
            assert out[0, 0, 0, 0] == 0
            if apart:  # each tap in one window: its share alone
                dy = np.nan_to_num(out) * np.float32(0.5) - np.float32(0.25)
                with np.errstate(invalid="ignore", divide="ignore"):
                    gradient = np.where(total != 0, dy / total, zero)
                for (a, b), tap in zip(((0, 0), (0, 1), (1, 0), (1, 1)), taps, strict=True):
                    share = dx[:, :, 0, a::stride[0], b::stride[1]][:, :, :out.shape[2],
                                                                     :out.shape[3]]
                    np.testing.assert_array_equal(share, gradient * (tap + tap - out))
        seen.add((layout, stride[1] == 2, kind))
    assert seen == {(layout, two, kind) for layout in ("nchw", "channels_last")
                    for two in (True, False) for kind in (weighted.SOFT, weighted.SELF)}


def test_gem_quads_forward_matches_the_window_kernel():
    """GeM over 2x2 windows with no padding runs ``power_quads.gem_quads_forward`` (the
    four taps raised and summed and the root taken in one loop), NCHW ones at stride 2
    along W alone, and other NCHW 2x2 windows the rows kernel: the window kernel's bits
    for y, and the rows and window kernels' for dx and dp, in both layouts, float32 and
    float64, strides 1-3 along W, powers 3 (float32: three Newton steps) and 4.5
    (float64: exp and log; the powers and dtypes of the rows test, as each compiles
    the kernels anew), NaN, the clamp, and windows whose sums underflow or overflow
    (summed again relative to their maximum)."""
    rng = np.random.default_rng(31)
    seen = set()
    for trial in range(24):
        dtype = (np.float32, np.float64)[trial % 2]
        channels_last, stride = trial // 6 % 2 == 1, ((2, 2), (1, 1), (2, 3), (3, 2))[trial % 4]
        p = (3.0, 4.5)[trial % 2]
        x = rng.random((2, 5, 7 + trial % 4, 8 + trial % 3)) * 3 + 0.01
        x[0, 1, 0, 0] = -1.0  # below eps: clamped
        if trial % 5 == 0:
            x.flat[rng.integers(0, x.size)] = np.nan
        if trial % 3 == 0:  # a window whose z^p underflows, one whose sum overflows
            x[1, 0, :2, :2] = 1e-120 if dtype == np.float64 else 1e-30
            x[1, 1, :2, :2] = 1e300 if dtype == np.float64 else 1e38
        x = _stored_as(x.astype(dtype), 2, channels_last)
        eps = 1e-130 if trial % 3 == 0 else 0.02
        result = _rows_and_window_kernels(x, 2, (2, 2), stride, _gem_passes, eps=eps, p=p)
        layout, apart, (names, *fast), (general_names, *slow) = result
        assert names[0] == (_paired_quads((2, 2), stride, layout,
                                          "power_quads.gem_quads_forward")
                            or "power_mean.gem_rows_forward")
        assert general_names[0] == "power_mean.gem_window_forward"
        for a, b in zip(fast, slow, strict=True):
            np.testing.assert_array_equal(a, b)
        seen.add((layout, names[0].split(".")[0], stride[1] == 2))
    assert seen == {("nchw", "power_quads", True), ("nchw", "power_mean", False),
                    ("channels_last", "power_quads", True),
                    ("channels_last", "power_quads", False)}


def test_weighted_quads_forward_checks_the_taps_it_reads():
    """Stochastic pooling's mean and its draw check their input in the 2x2 kernels' own
    pass: each returns whether a tap it read was negative or NaN (``-0.0`` is a valid
    weight), and None where the windows leave inputs unread (the engine then checks
    those apart). Without a ``norm`` the kernel writes the same means (SoftPool's
    too)."""
    from poolgrad.kernels import weighted

    rng = np.random.default_rng(31)
    seen = set()
    for trial in range(16):
        height, channels_last = (6, 7)[trial % 2], trial // 2 % 2 == 1
        x = rng.random((2, 3, height, 8)).astype(np.float32)
        bad = (None, -1e-30, np.nan, -0.0)[trial // 4]
        if bad is not None:
            x[1, 2, rng.integers(0, 6), rng.integers(0, 8)] = bad
        x = _stored_as(x, 2, channels_last)
        xk = pg._inputs.compute_view(x, pg._inputs.Layout(x.shape, 2))
        plan = pg._inputs.sliding_plan(x, 2, None, 0, 1, False, 2)
        forward = dispatch.choose("weighted", "forward", plan, dispatch.operand(xk))
        assert forward.name == "weighted.weighted_quads_forward"
        y, norm, bare = (empty(_out_shape(xk, plan), xk.dtype, channels_last)
                         for _ in range(3))
        found = forward(xk, y, norm, weighted.SELF)
        assert forward(xk, bare, None, weighted.SELF) is found
        sample = dispatch.choose("stochastic", "sample", plan, dispatch.operand(xk))
        assert sample.name == "stochastic.stochastic_quads_sample"
        drawn, pos = empty(y.shape, xk.dtype, channels_last), empty(y.shape, np.uint8,
                                                                   channels_last)
        assert sample(xk, np.empty((0,) * 5), np.uint64(trial), drawn, pos) is found
        np.testing.assert_array_equal(bare, y)
        expected = bad is not None and not (bad == 0)  # -0.0 is no negative weight
        assert found is (expected if height % 2 == 0 else None)
        seen.add((channels_last, found))
        forward(xk, y, norm, weighted.SOFT)  # SoftPool skips its norm's log alone
        forward(xk, bare, None, weighted.SOFT)
        np.testing.assert_array_equal(bare, y)
    assert seen == {(layout, found) for layout in (False, True)
                    for found in (True, False, None)}


def test_stochastic_quads_sample_draws_the_window_kernels_taps():
    """Stochastic pooling's training draw on 2x2 windows with no padding runs
    ``stochastic.stochastic_quads_sample`` (selects in place of the window kernel's
    branches, one loop per row): the general kernel's taps and values, bit for bit, in
    both layouts, float16/32/64, strides 1-3 along W, with zeros, windows of zeros,
    ties, and draws of 0 and of the largest float64 below 1 (where rounding can leave no
    running sum above ``u * S``: the last positive tap is drawn)."""
    rng = np.random.default_rng(35)
    seen = set()
    for trial, dtype, _, channels_last, stride in _quad_trials((None, None)):
        x = np.maximum(rng.standard_normal((2, 5, 7 + trial % 4, 8 + trial % 3)), 0).round(1)
        x[:, 0, :3, :3] = 0  # windows of zeros
        x = _stored_as(x.astype(dtype), 2, channels_last)
        plan = pg._inputs.sliding_plan(x, (2, 2), stride, 0, 1, False, 2)
        draws = rng.random(_out_shape(x[:, :, None], plan))
        draws.flat[::5], draws.flat[2::5] = 0.0, np.nextafter(1.0, 0.0)
        # given draws, then draws counted from a seed (an empty array)
        for given, seed in ((draws, 0), (np.empty((0,) * 5), 2**64 - 1 - trial)):
            layout, _, (name, y, pos), (general_name, *slow) = _rows_and_window_kernels(
                x, 2, (2, 2), stride, _sample_pass, draws=given, seed=np.uint64(seed))
            assert (name, general_name) == ("stochastic.stochastic_quads_sample",
                                            "stochastic.stochastic_pool_sample")
            np.testing.assert_array_equal(y, slow[0])
            np.testing.assert_array_equal(pos, slow[1])
            assert set(np.unique(pos)) == {0, 1, 2, 3}
        seen.add((layout, stride[1] == 2))
    assert seen == {(layout, two) for layout in ("nchw", "channels_last")
                    for two in (True, False)}


def _sample_pass(choose, xs, stored, plan, operand, draws, seed):
    y = empty(_out_shape(xs, plan), xs.dtype, stored)
    pos = empty(y.shape, geometry.position_dtype(plan.window_size), stored)
    sample = choose("stochastic", "sample", plan, operand)
    sample(xs, draws, seed, y, pos)
    return sample.name, y, pos


def _weighted_passes(choose, xs, stored, plan, operand, kind):
    from poolgrad.kernels import weighted

    y, norm = (empty(_out_shape(xs, plan), xs.dtype, stored) for _ in range(2))
    forward = choose("weighted", "forward", plan, operand)
    copy = np.full_like(xs, 7.0)  # the pullback's x, written as the forward reads x
    forward(xs, y, norm, kind, copy=copy)
    np.testing.assert_array_equal(copy, xs)
    dy = np.nan_to_num(y) * 0.5 - 0.25
    backward = choose("weighted", "backward" if kind == weighted.SOFT else "mean_backward",
                      plan, operand)
    dx = empty(xs.shape, xs.dtype, stored)
    # a kernel that recomputes y and norm gets None for them, as from a pullback
    outputs = (y, norm) if backward.needs_outputs else (None, None)
    backward(xs, *outputs, dy, kind, dx)
    return (forward.name, backward.name), y, norm, dx


def test_blend_rows_kernels_match_the_window_kernels():
    """Mixed and gated pooling run on rows kernels (``blend.blend_rows_*``: each tap of
    an output row's windows gathered, the running maxima, their taps, the sums and the
    gate's logits taken over the buffer) where windows have no padding, the backward
    only where they do not overlap. Against the general kernels on random geometries in
    1-3 dims, both layouts, ties and NaN: the same bits for y and dx, and the weights'
    gradient (added in another order) to rounding."""
    from poolgrad.kernels import blend

    rng = np.random.default_rng(25)
    seen = set()
    for trial in range(32):
        ndim, kernel, stride, spatial, lead = _random_windows(rng, trial)
        dtype = (np.float32, np.float64)[trial % 2]
        kind = (blend.MIXED, blend.GATED)[trial // 8 % 2]
        weights = (np.array([0.3]) if kind == blend.MIXED
                   else rng.standard_normal(int(np.prod(kernel))))
        x = rng.standard_normal(lead + spatial).round(1)  # ties
        if trial % 5 == 0:
            x.flat[rng.integers(0, x.size)] = np.nan
        x = _stored_as(x.astype(dtype), ndim, trial // 16 % 2 == 1)
        layout, apart, (names, y, dx, dweights), (general_names, *slow) = (
            _rows_and_window_kernels(x, ndim, kernel, stride, _blend_passes, kind=kind,
                                     weights=weights))
        assert names == (_paired_quads(kernel, stride, layout, "blend.blend_quads_forward")
                         or "blend.blend_rows_forward",
                         "blend.blend_rows_backward" if apart else "blend.blend_window_backward")
        assert general_names == ("blend.blend_window_forward", "blend.blend_window_backward")
        np.testing.assert_array_equal(y, slow[0])
        np.testing.assert_array_equal(dx, slow[1])
        np.testing.assert_allclose(dweights, slow[2], rtol=1e-12, atol=1e-12)
        seen.add((layout, apart, kind))
    assert seen == {(layout, apart, kind) for layout in ("nchw", "channels_last")
                    for apart in (True, False) for kind in (blend.MIXED, blend.GATED)}


def test_blend_quads_kernel_matches_the_window_kernel():
    """2x2 windows with no padding run ``blend.blend_quads_forward`` (the four taps in
    one loop, no buffer; NCHW ones at stride 2 along W alone, the others the rows
    kernel): the window kernel's bits in both layouts, float16/32/64, strides 1-3 along
    W, mixed and gated, ties and NaN. A float32 forward computes in float32: mixed
    pooling's output is ``s M + (1 - s) (sum / 4)`` in float32 arithmetic, bit for bit,
    and gated pooling's the same with ``s = 1 / (1 + exp(-z))``, ``z`` and ``exp`` in
    float32."""
    from poolgrad.kernels import blend, elementary

    rng = np.random.default_rng(27)
    seen = set()
    for trial, dtype, kind, channels_last, stride in _quad_trials((blend.MIXED, blend.GATED)):
        weights = np.array([0.3]) if kind == blend.MIXED else rng.standard_normal(4)
        x = rng.standard_normal((2, 5, 7 + trial % 4, 8 + trial % 3)).round(1)  # ties
        if trial % 4 == 0:
            x.flat[rng.integers(0, x.size)] = np.nan
        x = _stored_as(x.astype(dtype), 2, channels_last)
        layout, _, (names, y, _, _), (general_names, *slow) = _rows_and_window_kernels(
            x, 2, (2, 2), stride, _blend_passes, kind=kind, weights=weights)
        assert names[0] == (_paired_quads((2, 2), stride, layout, "blend.blend_quads_forward")
                            or "blend.blend_rows_forward")
        assert general_names[0] == "blend.blend_window_forward"
        np.testing.assert_array_equal(y, slow[0])
        if dtype == np.float32:
            out, taps = _quad_taps(x, stride, y)
            total = ((taps[0] + taps[1]) + taps[2]) + taps[3]
            share, rest = np.float32(0.3), np.float32(0.7)
            if kind == blend.GATED:
                gate = weights.astype(np.float32)
                logit = ((gate[0] * taps[0] + gate[1] * taps[1]) + gate[2] * taps[2]
                         + gate[3] * taps[3])
                powers = np.array([elementary.exp32(v) for v in -logit.ravel()], np.float32)
                share = np.float32(1) / (np.float32(1) + powers.reshape(logit.shape))
                rest = np.float32(1) - share
            expected = share * np.maximum.reduce(taps) + rest * (total / np.float32(4))
            assert expected.dtype == np.float32
            np.testing.assert_array_equal(out, expected)
        seen.add((layout, stride[1] == 2, kind))
    assert seen == {(layout, two, kind) for layout in ("nchw", "channels_last")
                    for two in (True, False) for kind in (blend.MIXED, blend.GATED)}


def _blend_passes(choose, xs, stored, plan, operand, kind, weights):
    y = empty(_out_shape(xs, plan), xs.dtype, stored)
    forward = choose("blend", "forward", plan, operand)
    forward(xs, kind, weights, y)
    dy = np.nan_to_num(y) * 0.5 - 0.25
    backward = choose("blend", "backward", plan, operand)
    dx, dweights = empty(xs.shape, xs.dtype, stored), np.empty(weights.size)
    backward(xs, dy, kind, weights, dx, dweights)
    return (forward.name, backward.name), y, dx, dweights


@pytest.mark.parametrize("shape", [(2, 3, 1, 5, 7), (3, 70, 2, 9, 40), (1, 1, 1, 1, 1),
                                   (0, 3, 1, 2, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint8, np.float16])
def test_planes_copy_channels_last_arrays_both_ways(shape, dtype):
    """``layouts.planes_of`` and ``store_planes``: the tiled transposes give NumPy's
    copies exactly, for shapes that are not multiples of the tile (float16, which
    Numba cannot take, by NumPy's copy), C-contiguous arrays are viewed, and the input
    is left as it was."""
    from poolgrad.kernels import layouts

    rng = np.random.default_rng(41)
    values = (rng.random(shape) * 200).astype(dtype)
    x = np.empty((shape[0],) + shape[2:] + (shape[1],), dtype).transpose(0, 4, 1, 2, 3)
    x[...] = values
    before = x.copy()
    planes = layouts.planes_of(x)
    assert planes.flags.c_contiguous and planes.shape == (shape[0] * shape[1],) + shape[2:]
    np.testing.assert_array_equal(planes.reshape(shape), values)
    np.testing.assert_array_equal(x, before)
    assert not values.size or np.shares_memory(layouts.planes_of(values), values)
    out = np.empty_like(x)
    layouts.store_planes(out, planes)
    assert out.strides == x.strides
    np.testing.assert_array_equal(out, values)


def test_fractional_channels_last_forward_has_the_planes_bits(monkeypatch):
    """Fractional max pooling runs ``fractional.fractional_max_forward`` on planes and,
    for a channels-last input, ``fractional.fractional_max_forward_channels_last``
    (blocks of channels pooled in cache, no planes array): the same values, winners,
    indices and gradients, in 1-3 dims, channels not a multiple of its block, ties,
    NaN, windows of up to 5 taps, float32 and float64."""
    from poolgrad.bench.suite import channels_last
    from poolgrad.engines import fractional as engine

    # the fractional kernels themselves: windows that happen to form one grid would run
    # max pooling's (tests/test_kinds_fractional.py)
    from poolgrad.kinds import fractional as fractional_kind

    monkeypatch.setattr(engine, "regular_grid", lambda *args: None)
    monkeypatch.setattr(fractional_kind, "pseudo_random_grid", lambda *args: None)
    rng = np.random.default_rng(37)
    for trial in range(12):
        ndim = 1 + trial % 3
        spatial = tuple(int(v) for v in rng.integers(6, 12, ndim))
        kernel = tuple(int(v) for v in rng.integers(1, 6 if trial % 2 else 4, ndim))
        dtype = (np.float32, np.float64)[trial % 2]
        x = np.round(rng.standard_normal((2, 5 + 14 * (trial % 2)) + spatial)).astype(dtype)
        x.flat[rng.integers(0, x.size, 2)] = np.nan
        out = tuple(max(1, min(s - k + 1, s // 2)) for s, k in zip(spatial, kernel, strict=True))
        results = []
        for stored in (x, channels_last(x)):
            def run(stored=stored, kernel=kernel, out=out, seed=trial):
                (y, indices), pullback = pg.vjp(pg.fractional_max_pool, stored, kernel, out,
                                                return_indices=True, rng=seed)
                return pullback.kernels, (y, indices, pullback(np.ones_like(y)))

            # the general kernel (the tests' reference) serves every layout too
            (kernels, fast), (general, slow) = both_paths(run, monkeypatch)
            expected = ("fractional.fractional_max_forward_channels_last"
                        if stored is not x else "fractional.fractional_max_forward")
            assert kernels["forward"] == expected
            assert general["forward"] == "fractional.fractional_max_forward"
            assert kernels["backward"] == "fractional.fractional_max_backward"
            results += [fast, slow]
        for result in results[1:]:
            for a, b in zip(results[0], result, strict=True):
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("length", [0, 1, 15, 16, 17, 50, 3137])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lane_dot_is_the_loop_of_lanes_it_replaces(length, dtype):
    """The attention kernels' dot products, one vector of lanes, give the bits of the
    loop they replaced: lane k adds the products l = k mod LANES in increasing l from
    +0, then halving; lengths with and without a partial group, NaN and infinities
    included."""
    import numba

    from poolgrad.kernels import JIT_OPTIONS
    from poolgrad.kernels.attention import _LANES_WITNESS, LANES
    from poolgrad.kernels.lanes import lane_dot
    rng = np.random.default_rng(length)
    a = rng.standard_normal(length) * 10.0 ** rng.integers(-8, 8, length)
    b = rng.standard_normal(length).astype(dtype)
    if length > 20:  # in the whole only: the shorter part checks finite sums
        a[[-5, -3]] = np.inf, -np.inf
        b[-1] = np.nan
    call = numba.njit(**JIT_OPTIONS)(lambda a, b: lane_dot(a, b, _LANES_WITNESS))
    for a_part, b_part in ((a, b), (a[:length - length // 3], b[:length - length // 3])):
        lanes = np.zeros(LANES)
        with np.errstate(invalid="ignore"):
            for index, product in enumerate(a_part * b_part.astype(np.float64)):
                lanes[index % LANES] += product
        half = LANES // 2
        while half >= 1:
            lanes[:half] += lanes[half:2 * half]
            half //= 2
        np.testing.assert_array_equal(call(a_part, b_part), lanes[0])


@pytest.mark.parametrize("length", [1, 7, 8, 9, 49, 64, 3137])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_average_sums_in_eight_running_sums(length, dtype):
    """The global average of C-contiguous planes (``lane_sum``: one vector of eight
    running sums) gives the bits of eight scalar sums: lane k adds elements 8j + k from
    +0, the lanes are added in adjacent pairs, then the tail one by one, in the dtype;
    values over many magnitudes so that another order would round differently, and a
    plane with infinities and NaN."""
    rng = np.random.default_rng(length)
    x = (rng.standard_normal((3, 4, length))
         * 10.0 ** rng.integers(-6, 6, (3, 4, length))).astype(dtype)
    if length > 8:
        x[1, 2, [0, 3]] = np.inf, -np.inf
        x[2, 0, -1] = np.nan
    y, pullback = pg.vjp(pg.global_avg_pool, x)
    assert pullback.kernels["forward"] == "sum_pool.global_avg_forward"
    expected = np.empty((3, 4), dtype)
    bulk = length - length % 8
    with np.errstate(invalid="ignore", over="ignore"):
        for n, c in np.ndindex(3, 4):
            s = [dtype(0)] * 8
            for j in range(bulk):
                s[j % 8] = dtype(s[j % 8] + x[n, c, j])
            total = dtype(dtype(dtype(s[0] + s[1]) + dtype(s[2] + s[3]))
                          + dtype(dtype(s[4] + s[5]) + dtype(s[6] + s[7])))
            for j in range(bulk, length):
                total = dtype(total + x[n, c, j])
            expected[n, c] = dtype(total / dtype(length))
    np.testing.assert_array_equal(y[..., 0], expected)
    assert bool(np.isnan(y[2, 0, 0]) and np.isnan(y[1, 2, 0])) == (length > 8)


def test_tiled_max_forwards_take_short_rows_in_blocks():
    """The tiled max forwards' row loop, chosen at compile time: vector blocks for a W
    kernel of 2 on rows of at least one block (8 float32 or 4 float64 windows' taps)
    and under 32 windows, tile loops otherwise (the CASES above run both)."""
    from poolgrad.kernels import tiled
    assert tiled.row_form(2, 7, 4) is tiled.IN_BLOCKS  # VGG's deep rows
    assert tiled.row_form(2, 4, 4) is tiled.IN_BLOCKS  # exactly one block of taps
    assert tiled.row_form(2, 2, 8) is tiled.IN_BLOCKS
    assert tiled.row_form(2, 3, 4) is tiled.TILE_LOOPS  # shorter than a block
    assert tiled.row_form(2, 32, 4) is tiled.TILE_LOOPS  # long rows vectorize as they are
    assert tiled.row_form(4, 7, 4) is tiled.TILE_LOOPS
    assert tiled.IN_BLOCKS.ndim != tiled.TILE_LOOPS.ndim  # two compiled loops


@pytest.mark.parametrize("spatial", [(1,), (15,), (17,), (7, 7), (2, 5, 9), (56, 56)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_max_keeps_the_general_kernels_winners(spatial, dtype, monkeypatch):
    """A window over each whole NCHW plane (global, adaptive to ones, or a sliding
    window the size of the input) runs ``lane_max``'s vector of running maxima: the
    general kernel's values and winners bit for bit, so its gradient and indices too.
    Planes of ties, signed zeros, infinities, NaNs of different payloads (the first
    wins), a NaN in the part past the last whole group, and lengths below, at and past
    one group of 16."""
    rng = np.random.default_rng(len(spatial) * 100 + spatial[-1])
    x = np.round(rng.standard_normal((2, 8, *spatial)) * 2).astype(dtype)  # many ties
    planes = x.reshape(16, -1)
    planes[1] = 0.0
    planes[2, ::2] = -0.0
    planes[3, -1] = np.inf
    planes[4] = -np.inf
    put_nan_payloads(planes[5], every=5)
    planes[6, -1] = np.nan
    planes[7, planes.shape[1] // 2:] = 7.0
    dy = rng.standard_normal((2, 8) + (1,) * len(spatial)).astype(dtype)

    def passes():
        names = chosen_kernels(monkeypatch)
        y, pullback = pg.vjp(pg.global_max_pool, x)
        results = [y, pullback(dy)]
        results += list(pg.adaptive_max_pool(x, 1, return_indices=True))
        results.append(pg.max_pool(x, spatial))
        return results, names

    (fast, names), (slow, _) = both_paths(passes, monkeypatch)
    assert names[0] == "max_pool.global_max_forward"
    assert names.count("max_pool.global_max_forward") == 3
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("layout", ["NCHW", "channels-last"])
def test_whole_plane_averages_run_the_global_kernels(layout, monkeypatch):
    """An adaptive average to ones and an average over a window the size of the input
    are global averages: they run the global kernels, with global_avg_pool's bits."""
    x = np.random.default_rng(5).standard_normal((2, 3, 7, 9)).astype(np.float32)
    if layout == "channels-last":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    dy = np.random.default_rng(6).standard_normal((2, 3, 1, 1)).astype(np.float32)
    y, pullback = pg.vjp(pg.global_avg_pool, x)
    expected = (y, pullback(dy))
    for op, args, kwargs in ((pg.adaptive_avg_pool, (1,), {}), (pg.avg_pool, ((7, 9),), {}),
                             (pg.avg_pool, ((7, 9),), {"count_include_pad": False})):
        names = chosen_kernels(monkeypatch)
        y, pullback = pg.vjp(op, x, *args, **kwargs)
        assert names[-1] == ("sum_pool.global_avg_backward" if layout == "NCHW" else
                             "channels_last.global_avg_backward")
        if layout == "NCHW":
            assert names[0] == "sum_pool.global_avg_forward"
        for a, b in zip((y, pullback(dy)), expected, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("call", [
    lambda x: pg.adaptive_max_pool(x, 3, return_indices=True),
    lambda x: pg.adaptive_max_pool(x, (2, 1), return_indices=True),
    lambda x: pg.max_pool(x, 9, 4, padding=4, return_indices=True),
    lambda x: pg.max_pool(x, 5, 1, return_indices=True),
    lambda x: pg.max_pool(x, (3, 8), (2, 5), dilation=(2, 1), ceil_mode=True,
                          return_indices=True),
    lambda x: pg.max_pool(x[:, :, :18, :20].reshape(2, 8, 3, 6, 20), (2, 3, 9), (1, 2, 5),
                          return_indices=True)],
    ids=["adaptive 3", "adaptive (2, 1)", "k9 s4 p4", "k5 s1", "dilated rows", "3-d"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_wide_max_windows_keep_the_general_kernels_winners(call, dtype, monkeypatch):
    """Windows of 2 or more rows of 5 or more taps on NCHW arrays (adaptive bins, wide
    sliding windows) fold in ``window_max``: the general kernel's values and winners, so
    its indices and gradient, on ties, signed zeros, infinities and NaNs of different
    payloads (the first in row-major order wins), rows cut by the padding."""
    rng = np.random.default_rng(11)
    x = np.round(rng.standard_normal((2, 8, 19, 23)) * 2).astype(dtype)
    planes = x.reshape(16, -1)
    planes[1] = 0.0
    planes[2, ::3] = -0.0
    planes[3, 200] = np.inf
    put_nan_payloads(planes[4], every=37)
    planes[5, -3:] = np.nan
    x = np.ascontiguousarray(x)

    def passes():
        names = chosen_kernels(monkeypatch)
        y, indices = call(x)
        return [y, indices], names

    (fast, names), (slow, _) = both_paths(passes, monkeypatch)
    assert names[0] == "max_pool.max_pool_forward_wide"
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_wide_windows_numbered_past_int32_take_the_general_kernel(monkeypatch):
    """``window_max`` numbers a window's taps in int32, padding included: a window of
    2^30 taps a row (almost all padding) over 3 rows would wrap them (a review found
    the wide kernel returning 2.0 here). Such plans take the general kernel."""
    width = 2**30
    x = np.array([1.0, 2.0, 3.0], np.float32).reshape(1, 1, 3, 1)
    names = chosen_kernels(monkeypatch)
    y = pg.max_pool(x, (3, width), (1, width), ((0, 0), (width // 2, width // 2)))
    assert names == ["max_pool.max_pool_forward"]
    np.testing.assert_array_equal(y, [[[[3.0]]]])
