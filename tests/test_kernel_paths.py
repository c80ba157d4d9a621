"""The row-pass kernels (vectorized, for contiguous inputs and common W geometries)
against the general kernels: the same bits, winners and NaN routing."""

import numpy as np
import pytest

import poolgrad as pg
from poolgrad.kernels import rows

# (spatial, kernel, stride, padding): every (kernel, stride) with a vectorized W pass,
# in 1, 2 and 3 dims, with and without padding (windows cut by W padding take the
# one-by-one path), including inputs too narrow to have interior windows
CASES = [
    ((17,), 4, 4, 0), ((18,), 4, 4, ((1, 3),)), ((3,), 4, 4, ((1, 0),)),
    ((9, 11), 2, 2, 0), ((9, 11), 2, 2, 1), ((9, 11), 3, 2, 1), ((8, 13), 3, 2, ((2, 0), (1, 2))),
    ((2, 3), 3, 2, 1), ((5, 6, 9), 2, 2, 1), ((5, 6, 9), 3, 2, 0),
]


def general_path(x):
    """The same array as a non-contiguous view, which the row-pass kernels refuse."""
    wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16])
def test_row_pass_matches_the_general_kernels(case, dtype):
    spatial, kernel, stride, padding = CASES[case]
    rng = np.random.default_rng(case)
    x = rng.integers(-2, 3, (2, 3) + spatial).astype(dtype)  # many ties
    if dtype != np.int16:
        x[0, 0].flat[:: 5] = np.nan  # NaN must win, the first one
    strided = general_path(x)
    assert not strided.flags.c_contiguous
    args = (kernel, stride, padding)
    fast, slow = pg.max_pool(x, *args, return_indices=True), pg.max_pool(strided, *args,
                                                                          return_indices=True)
    np.testing.assert_array_equal(fast[0], slow[0])
    np.testing.assert_array_equal(fast[1], slow[1])
    if dtype != np.int16:
        for include in (True, False):
            np.testing.assert_array_equal(
                pg.avg_pool(x, *args, count_include_pad=include),
                pg.avg_pool(strided, *args, count_include_pad=include))


def test_row_pass_is_used_for_the_common_layers():
    from poolgrad import geometry
    x = np.zeros((1, 1, 1, 8, 8), np.float32)
    plan = geometry.sliding_plan((8, 8), (2, 2), (2, 2), (1, 1), ((0, 0), (0, 0)), False)
    assert rows.row_pass_geometry(plan, x) is not None
    dilated = geometry.sliding_plan((8, 8), (2, 2), (2, 2), (1, 2), ((0, 0), (0, 0)), False)
    assert rows.row_pass_geometry(dilated, x) is None
