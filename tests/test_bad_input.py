"""Bad inputs: a clear ValueError/TypeError naming the offending parameter, never a Numba
error or a silent wrong answer, and the caller's arrays are never modified.

Also: non-contiguous and read-only inputs give the same results as contiguous copies.
"""

import functools

import numpy as np
import pytest
from numba.core.errors import TypingError

import poolgrad
from poolgrad import (
    adaptive_avg_pool, adaptive_max_pool, avg_pool, global_avg_pool, global_lp_pool,
    global_max_pool, lp_pool, max_pool, max_unpool, vjp,
)

OPS = {  # name -> (operator, default arguments)
    "max_pool": (max_pool, {"kernel_size": 2}),
    "avg_pool": (avg_pool, {"kernel_size": 2}),
    "lp_pool": (lp_pool, {"p": 2, "kernel_size": 2}),
    "global_max_pool": (global_max_pool, {}),
    "global_avg_pool": (global_avg_pool, {}),
    "global_lp_pool": (global_lp_pool, {"p": 2}),
    "adaptive_max_pool": (adaptive_max_pool, {"output_size": 2}),
    "adaptive_avg_pool": (adaptive_avg_pool, {"output_size": 2}),
    "max_unpool": (max_unpool, {"kernel_size": 2}),
}


def call(name, x, **kwargs):
    """``OPS[name]`` on x with its defaults overridden; ``"vjp:<op>"`` returns (y, pullback)."""
    op, defaults = OPS[name.removeprefix("vjp:")]
    kwargs = {**defaults, **kwargs}
    if op is max_unpool:
        kwargs.setdefault("indices", np.zeros(np.shape(x), np.int64))
    return vjp(op, x, **kwargs) if name.startswith("vjp:") else op(x, **kwargs)


def with_vjp(*names):
    return [*names, *(f"vjp:{n}" for n in names)]


SLIDING = with_vjp("max_pool", "avg_pool", "lp_pool")
GLOBAL = with_vjp("global_max_pool", "global_avg_pool", "global_lp_pool")
ADAPTIVE = with_vjp("adaptive_max_pool", "adaptive_avg_pool")
UNPOOL = with_vjp("max_unpool")
ALL = SLIDING + GLOBAL + ADAPTIVE + UNPOOL
MAX_OPS = with_vjp("max_pool", "global_max_pool", "adaptive_max_pool")
FLOAT_ONLY = with_vjp("avg_pool", "lp_pool", "global_avg_pool", "global_lp_pool",
                      "adaptive_avg_pool")
GRAD_NEEDS_FLOAT = ["vjp:max_pool", "vjp:global_max_pool", "vjp:adaptive_max_pool",
                    "vjp:max_unpool"]


def x_of(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


X1 = x_of((2, 3, 6))  # one spatial dim
X2 = x_of((2, 3, 4, 6))  # two spatial dims


def snapshot(*arrays):
    return [(a, a.copy(), a.flags.writeable) for a in arrays]


def assert_unchanged(snap):
    for array, before, writeable in snap:
        assert array.dtype == before.dtype and array.shape == before.shape
        assert array.flags.writeable == writeable
        np.testing.assert_array_equal(array, before, strict=True)


def raises(exc, match, fn, *arrays):
    """fn() raises exc with a message matching ``match``; ``arrays`` are left as they were."""
    snap = snapshot(*arrays)
    with pytest.raises(exc, match=match):
        fn()
    assert_unchanged(snap)


def xfail(reason, **kwargs):
    return pytest.mark.xfail(strict=True, reason=reason, **kwargs)


# ---------------------------------------------------------------------------------- x

@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("shape", [(), (6,), (4, 6), (1, 1, 2, 2, 2, 2)])
def test_x_of_wrong_ndim(name, shape):
    x = x_of(shape)
    raises(ValueError, r"\b[xy](\.ndim| has shape)", lambda: call(name, x), x)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [object, "U3", bool, complex, "M8[s]", np.longdouble])
def test_x_of_non_numeric_dtype(name, dtype):
    x = X1.astype(dtype)
    raises(TypeError, r"^[xy] must (be|have dtype)", lambda: call(name, x), x)


@pytest.mark.parametrize("name", FLOAT_ONLY + GRAD_NEEDS_FLOAT)
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_integer_x_where_floats_are_needed(name, dtype):
    x = X1.astype(dtype)
    raises(TypeError, r"^x must have dtype float|floating-point x", lambda: call(name, x), x)


@pytest.mark.parametrize("name", ALL)
def test_x_with_an_empty_spatial_dim(name):
    x = np.zeros((1, 2, 0))
    raises(ValueError, r"^x has an empty spatial dim|^y has an empty", lambda: call(name, x), x)


@pytest.mark.parametrize("name", ["max_pool", "global_max_pool", "adaptive_max_pool",
                                  "max_unpool"])
@pytest.mark.parametrize("dtype", [">f8", pytest.param(">i4", marks=xfail(
    "a big-endian integer x passes validation and reaches the kernel: numba TypingError",
    raises=TypingError))])
def test_non_native_byte_order_works_or_is_a_clear_type_error(name, dtype):
    x = X1.astype(dtype)
    snap = snapshot(x)
    try:
        y = call(name, x)
    except TypeError as error:
        assert str(error).startswith(("x must", "y must")), error
    else:
        np.testing.assert_array_equal(y, call(name, x.astype(x.dtype.newbyteorder("="))))
    assert_unchanged(snap)


# ------------------------------------------------------ kernel_size, stride, dilation

PER_DIM_OPS = {"kernel_size": SLIDING + UNPOOL, "stride": SLIDING + UNPOOL, "dilation": SLIDING}
PER_DIM_CASES = [(param, name) for param, names in PER_DIM_OPS.items() for name in names]


@pytest.mark.parametrize("param, name", PER_DIM_CASES)
@pytest.mark.parametrize("value", [0, -1, -3, (2, 0), (-1, 1), np.int64(0)])
def test_per_dim_below_one(param, name, value):
    x = X2 if isinstance(value, tuple) else X1
    raises(ValueError, rf"^{param} must be >= 1", lambda: call(name, x, **{param: value}), x)


@pytest.mark.parametrize("param, name", PER_DIM_CASES)
@pytest.mark.parametrize("value", [2.0, np.float64(2), "2", "22", True, (2, 2.0), (2, "2"),
                                   (2, None), np.array([2, 2]), {2, 3}])
def test_per_dim_not_int(param, name, value):
    x = X1 if np.ndim(value) == 0 and not isinstance(value, set) else X2
    raises(TypeError, rf"^{param} must be an int or a sequence of ints",
           lambda: call(name, x, **{param: value}), x)


@pytest.mark.parametrize("name", SLIDING)
@pytest.mark.parametrize("kwargs, named", [
    ({"kernel_size": (2, 2), "stride": (1, 1, 1)}, "kernel_size has 2, stride has 3"),
    ({"kernel_size": (2, 2), "dilation": (1,)}, "kernel_size has 2, .*dilation has 1"),
    ({"stride": (1, 1), "padding": (0, 0, 0)}, "stride has 2, padding has 3"),
    ({"kernel_size": (2,), "padding": ((0, 0), (0, 0))}, "kernel_size has 1, padding has 2"),
])
def test_per_dim_arguments_disagree(name, kwargs, named):
    raises(ValueError, f"^per-dim arguments disagree .*{named}", lambda: call(name, X2, **kwargs),
           X2)


WRONG_COUNT = [  # (op, x shape, argument, value): too many or too few per-dim values for x
    *[(n, (2, 3, 4, 6), "kernel_size", (2,)) for n in SLIDING + UNPOOL],
    *[(n, (3, 4, 6), "kernel_size", (2, 2, 2)) for n in SLIDING],
    *[(n, (1, 1, 2, 2, 2, 2), "kernel_size", (1, 1, 1, 1)) for n in SLIDING],
    *[(n, (2, 3, 4, 6), "output_size", (2,)) for n in ADAPTIVE],
    *[(n, (2, 3, 4, 6), "output_size", (2, 2, 2, 2)) for n in ADAPTIVE],
]


@pytest.mark.parametrize("name, shape, param, value", WRONG_COUNT)
def test_wrong_number_of_per_dim_values(name, shape, param, value):
    x = x_of(shape)
    raises(ValueError, r"spatial dim", lambda: call(name, x, **{param: value}), x)


@xfail("the message names x (or 'the per-dim arguments'), not the argument whose length "
       "set the number of spatial dims")
@pytest.mark.parametrize("name, shape, param, value", WRONG_COUNT[::7])
def test_wrong_number_of_per_dim_values_names_the_argument(name, shape, param, value):
    x = x_of(shape)
    raises(ValueError, param, lambda: call(name, x, **{param: value}), x)


@xfail("stride 2**64 (legal: one window, like stride 6) reaches NumPy as a Python int: "
       "OverflowError 'Python int too large to convert to C long'", raises=OverflowError)
@pytest.mark.parametrize("name", ["max_pool", "vjp:avg_pool"])
def test_huge_stride_gives_one_window(name):
    y, expected = call(name, X1, stride=2**64), call(name, X1, stride=6)
    if name.startswith("vjp:"):
        y, expected = y[0], expected[0]
    np.testing.assert_array_equal(y, expected)


@xfail("padding 2**64: ValueError('Maximum allowed size exceeded') from np.arange, which "
       "names no parameter (2**63 gives an OverflowError)")
@pytest.mark.parametrize("name", ["max_pool", "vjp:avg_pool"])
def test_huge_padding_names_padding(name):
    raises(ValueError, "^padding", lambda: call(name, X1, padding=2**64), X1)


# --------------------------------------------------------------------------- padding

@pytest.mark.parametrize("name", SLIDING + UNPOOL)
@pytest.mark.parametrize("padding", [-1, (-1,), ((0, -1),), ((-2, 0),)])
def test_negative_padding(name, padding):
    raises(ValueError, r"^padding must be >= 0", lambda: call(name, X1, padding=padding), X1)


@pytest.mark.parametrize("name", SLIDING)
@pytest.mark.parametrize("padding, exc, message", [
    ("full", ValueError, r'^padding must be "valid", "same"'),
    ("", ValueError, r'^padding must be "valid", "same"'),
    (((1, 1, 1),), TypeError, r"^padding entries must be ints or \(before, after\) pairs"),
    (((1,),), TypeError, r"^padding entries"),
    (((1, 1.5),), TypeError, r"^padding entries"),
    (("1",), TypeError, r"^padding entries"),
    (1.0, TypeError, r"^padding must be an int"),
    (None, TypeError, r"^padding must be an int"),
    (np.array([1]), TypeError, r"^padding must be an int"),
])
def test_padding_of_a_wrong_form(name, padding, exc, message):
    raises(exc, message, lambda: call(name, X1, padding=padding), X1)


@pytest.mark.parametrize("name", UNPOOL)
@pytest.mark.parametrize("padding", ["same", "valid", "SAME"])
def test_max_unpool_string_padding(name, padding):
    raises(ValueError, r"^max_unpool takes numeric padding", lambda: call(name, X1, padding=padding),
           X1)


@pytest.mark.parametrize("name", SLIDING)
@pytest.mark.parametrize("length, kwargs", [
    (4, {"kernel_size": 2, "padding": 2}),  # window 0 covers only the front padding
    (4, {"kernel_size": 2, "padding": ((0, 2),)}),  # the last window only the end padding
    (4, {"kernel_size": 2, "stride": 1, "dilation": 3, "padding": 3}),
    (4, {"kernel_size": 3, "stride": 3, "padding": 3, "ceil_mode": True}),
])
def test_padding_so_large_a_window_holds_only_padding(name, length, kwargs):
    x = x_of((1, 2, length))
    raises(ValueError, r"^padding \(\d+, \d+\) is too large in spatial dim 0: window \d+ ",
           lambda: call(name, x, **kwargs), x)


@pytest.mark.parametrize("name", SLIDING)
@pytest.mark.parametrize("shape, kwargs", [
    ((1, 2, 4), {"kernel_size": 5}),
    ((1, 2, 4), {"kernel_size": 3, "dilation": 2}),
    ((1, 2, 4), {"kernel_size": 7, "padding": 1}),
    ((1, 2, 4, 6), {"kernel_size": (2, 7)}),
])
def test_kernel_larger_than_padded_input(name, shape, kwargs):
    x = x_of(shape)
    # the offender is the combination: the message gives the window's and the input's sizes
    raises(ValueError, r"^the window \(dilated size \d+\) is larger than the padded input",
           lambda: call(name, x, **kwargs), x)
