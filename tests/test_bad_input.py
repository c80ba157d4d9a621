"""Bad inputs get a clear ValueError or TypeError naming the offending parameter (never a
Numba error, never a silent wrong answer) and leave the caller's arrays untouched.
Non-contiguous and read-only inputs give exactly the results of contiguous copies.
"""

import functools
import re
import sys

import numpy as np
import pytest

import poolgrad
from poolgrad import (
    adaptive_avg_pool,
    adaptive_max_pool,
    avg_pool,
    global_avg_pool,
    global_lp_pool,
    global_max_pool,
    lp_pool,
    max_pool,
    max_unpool,
    vjp,
)

OPS = {  # name -> (operator, default arguments)
    "max_pool": (max_pool, {"kernel_size": 2}),
    "avg_pool": (avg_pool, {"kernel_size": 2}),
    # p 3: the Lp signatures other files compile too (the kernels compile per power)
    "lp_pool": (lp_pool, {"p": 3, "kernel_size": 2}),
    "global_max_pool": (global_max_pool, {}),
    "global_avg_pool": (global_avg_pool, {}),
    "global_lp_pool": (global_lp_pool, {"p": 3}),
    "adaptive_max_pool": (adaptive_max_pool, {"output_size": 2}),
    "adaptive_avg_pool": (adaptive_avg_pool, {"output_size": 2}),
    "max_unpool": (max_unpool, {"kernel_size": 2}),
}


def call(name, x, **kwargs):
    """``OPS[name]`` on x, defaults overridden by kwargs; ``"vjp:op"`` gives (y, pullback)."""
    op, defaults = OPS[name.removeprefix("vjp:")]
    kwargs = {**defaults, **kwargs}
    if op is max_unpool:
        kwargs.setdefault("indices", np.zeros(np.shape(x), np.int64))
    return vjp(op, x, **kwargs) if name.startswith("vjp:") else op(x, **kwargs)


def with_vjp(*names):
    return [*names, *(f"vjp:{n}" for n in names)]


SLIDING = with_vjp("max_pool", "avg_pool", "lp_pool")
ADAPTIVE = with_vjp("adaptive_max_pool", "adaptive_avg_pool")
UNPOOL = with_vjp("max_unpool")
ALL = SLIDING + with_vjp("global_max_pool", "global_avg_pool", "global_lp_pool") + ADAPTIVE + UNPOOL
MAX_OPS = with_vjp("max_pool", "global_max_pool", "adaptive_max_pool")
FLOAT_ONLY = with_vjp("avg_pool", "lp_pool", "global_avg_pool", "global_lp_pool",
                      "adaptive_avg_pool")
GRAD_NEEDS_FLOAT = ["vjp:max_pool", "vjp:global_max_pool", "vjp:adaptive_max_pool",
                    "vjp:max_unpool"]


def x_of(shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


X1 = x_of((2, 3, 6))  # one spatial dim
X2 = x_of((2, 3, 4, 6))  # two spatial dims
SWAPPED = ">" if sys.byteorder == "little" else "<"  # non-native byte order


def snapshot(*arrays):
    return [(a, a.copy(), a.flags.writeable) for a in arrays]


def assert_unchanged(snap):
    for array, before, writeable in snap:
        assert array.flags.writeable == writeable
        np.testing.assert_array_equal(array, before, strict=True)  # also shape and dtype


def raises(exc, match, fn, *arrays):
    """fn() raises exc with a message matching ``match``; ``arrays`` are left as they were."""
    snap = snapshot(*arrays)
    with pytest.raises(exc, match=match):
        fn()
    assert_unchanged(snap)


# ------------------------------------------------------------------------------------ x

@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("shape", [(), (6,), (4, 6), (1, 1, 2, 2, 2, 2)])
def test_x_of_wrong_ndim(name, shape):
    x = x_of(shape)
    raises(ValueError, r"\b[xy](\.ndim| has shape)", lambda: call(name, x), x)


@pytest.mark.parametrize("name", ALL)
def test_x_with_an_empty_spatial_dim(name):
    x = np.zeros((1, 2, 0))
    raises(ValueError, r"^[xy] has an empty spatial dim", lambda: call(name, x), x)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [object, "U3", bool, complex, "M8[s]"])
def test_x_of_non_numeric_dtype(name, dtype):
    x = X1.astype(dtype)
    raises(TypeError, r"^[xy] must (be|have dtype)", lambda: call(name, x), x)


@pytest.mark.parametrize("name", FLOAT_ONLY + GRAD_NEEDS_FLOAT)
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_integer_x_where_floats_are_needed(name, dtype):
    x = X1.astype(dtype)
    raises(TypeError, r"^x must have dtype float|floating-point x", lambda: call(name, x), x)


@pytest.mark.parametrize("name", ["max_pool", "global_max_pool", "adaptive_max_pool",
                                  "max_unpool"])
@pytest.mark.parametrize("dtype", [SWAPPED + "f8", SWAPPED + "i4"])
def test_non_native_byte_order_works(name, dtype):
    x = X1.astype(dtype)
    snap = snapshot(x)
    y = call(name, x)
    np.testing.assert_array_equal(y, call(name, x.astype(x.dtype.newbyteorder("="))))
    assert_unchanged(snap)


# ------------------------------------------------------------------------ bad arguments

def bad(names, param, values, exc, match, x=X2, marks=()):
    """Rows of BAD_ARGUMENTS: each op in names called on x with param=value."""
    return [pytest.param(n, {param: v}, x, exc, match, marks=marks, id=f"{n}-{param}={v!r}")
            for n in names for v in values]


Y = x_of((1, 2, 3))  # max_unpool input: pooled with kernel 2, unpooled length 6
INDICES = np.array([[[1, 2, 5], [0, 3, 4]]])
LP = with_vjp("lp_pool", "global_lp_pool")
BAD_ARGUMENTS = [
    *[row for param in ("kernel_size", "stride", "dilation")
      for names in [SLIDING + UNPOOL * (param != "dilation")] for row in [
          *bad(names, param, [0, -1, np.int64(0), (2, 0), (-1, 1)], ValueError,
               rf"^{param} must be >= 1"),
          *bad(names, param, [2.0, np.float64(2), "2", "22", True, (2, 2.0), (2, "2"),
                              (2, None), {2, 3}] + [None] * (param != "stride"),
               TypeError, rf"^{param} must be an int or a sequence of ints")]],
    *[pytest.param(n, kw, X2, ValueError, f"^per-dim arguments disagree .*{named}", id=f"{n}-{kw}")
      for n in SLIDING for kw, named in [
          ({"kernel_size": (2, 2), "stride": (1, 1, 1)}, "kernel_size has 2, stride has 3"),
          ({"kernel_size": (2, 2), "dilation": (1,)}, "kernel_size has 2, .*dilation has 1"),
          ({"stride": (1, 1), "padding": (0, 0, 0)}, "stride has 2, padding has 3")]],
    *bad(SLIDING + UNPOOL, "padding", [-1, (-1, 0), ((0, 0), (0, -1))], ValueError,
         r"^padding must be >= 0"),
    *bad(SLIDING, "padding", ["full", ""], ValueError, r'^padding must be "valid", "same"'),
    *bad(SLIDING, "padding", [((1, 1, 1), 0), ((1,), (1,)), ((1, 1.5), 0), ("1", 1)],
         TypeError, r"^padding entries must be ints or \(before, after\) pairs"),
    *bad(SLIDING, "padding", [1.0, None], TypeError, r"^padding must be an int"),
    *bad(UNPOOL, "padding", ["same", "valid"], ValueError, r"^max_unpool takes numeric padding"),
    *bad(LP, "p", [0, -1, -0.5, np.float32(0), np.nan, np.inf, -np.inf], ValueError,
         r"^p must be a finite number > 0"),
    *bad(LP, "p", ["2", None, True, 1j, [2]], TypeError, r"^p must be a real number"),
    *bad(MAX_OPS, "ties", ["last", "First", "", None, ["first"], 0], ValueError,
         r"^ties must be one of \('first', 'split'\)"),
    *bad(with_vjp("avg_pool"), "divisor_override", [0, -1, np.int64(-2), 2.0, 2.5, "2", True],
         (ValueError, TypeError), r"^divisor_override must be None or an int >= 1"),
    *bad(ADAPTIVE, "output_size", [0, -1, (2, 0), (-3, 2), (None, 0)], ValueError,
         r"^output_size must be >= 1"),
    *bad(ADAPTIVE, "output_size", [2.0, "2", True, (2, 2.5), (2, "2")], TypeError,
         r"^output_size must be an int or a sequence of ints"),
    *bad(["global_max_pool", "vjp:global_lp_pool"], "spatial_dims", [0, 4, "2", 2.0, (2,)],
         ValueError, r"^spatial_dims must be 1, 2 or 3"),
    *bad(UNPOOL, "indices", [INDICES[..., :2], INDICES[0], INDICES[..., None]], ValueError,
         r"^indices has shape \S.* but y has shape \(1, 2, 3\)", x=Y),
    *bad(UNPOOL, "indices", [INDICES.astype(t) for t in (float, bool, object)], TypeError,
         r"^indices must be an integer array", x=Y),
    *bad(UNPOOL, "indices", [INDICES - 1, INDICES + 1, np.full((1, 2, 3), 2**63 + 5, np.uint64)],
         ValueError, r"^indices must lie in \[0, 6\)", x=Y),
    *bad(UNPOOL, "output_size", [(3,), (4,), (8,), (100,), (0,), (-6,), (), (1, 1, 1, 6)],
         ValueError, r"^output_size .* (not possible|must give 1 spatial)", x=Y),
    *bad(UNPOOL, "output_size", [6, (None,)], TypeError, r"^output_size must be a seq", x=Y),
    *bad(UNPOOL, "output_size", [(6.9,), "6"], TypeError, r"^output_size", x=Y),
]


@pytest.mark.parametrize("name, kwargs, x, exc, match", BAD_ARGUMENTS)
def test_bad_argument(name, kwargs, x, exc, match):
    if x is Y:
        kwargs = {"indices": INDICES, **kwargs}
    arrays = [x, *(v for v in kwargs.values() if isinstance(v, np.ndarray))]
    raises(exc, match, lambda: call(name, x, **kwargs), *arrays)


# Too few or too many per-dim values for x. (A 4-d x with a 3-value kernel is read, as
# documented, as an unbatched (C, D, H, W) input, so that case is not an error.)
WRONG_COUNT = [
    *[(n, (2, 3, 4, 6), "kernel_size", (2,)) for n in SLIDING + UNPOOL],
    *[(n, (3, 4, 6), "kernel_size", (2, 2, 2)) for n in SLIDING],
    *[(n, (1, 1, 2, 2, 2, 2), "kernel_size", (1,) * 4) for n in SLIDING],
    *[(n, (2, 3, 4, 6), "output_size", (2,)) for n in ADAPTIVE],
    *[(n, (2, 3, 4, 6), "output_size", (2,) * 4) for n in ADAPTIVE],
]


@pytest.mark.parametrize("name, shape, param, value", WRONG_COUNT)
def test_wrong_number_of_per_dim_values(name, shape, param, value):
    x = x_of(shape)
    raises(ValueError, rf"\b{param}\b.*spatial dim", lambda: call(name, x, **{param: value}), x)


# The kinds read x by one rule (issue 33): (N, C, *spatial), or unbatched (C, *spatial)
# where spatial_dims or a per-dim argument gives the number of spatial dims.
KINDS = {  # name -> the arguments after x
    "blur_pool": (), "max_blur_pool": (), "avg_blur_pool": (), "soft_pool": (2,),
    "stochastic_pool": (2,), "fractional_max_pool": (2, 1), "gem_pool": (),
    "mixed_pool": (2,), "gated_pool": (np.ones(2), 2),
    "attention_pool": (np.ones((1, 2)), np.eye(2)),
}
NEEDS_A_BATCH = (r"^x has shape \({}\) \({} dims\) but must be batched, \(N, C, \*spatial\) "
                 r"with 1-3 spatial dims \(3-5 dims\), or unbatched, \(C, \*spatial\) "
                 r"\(2-4 dims\) with spatial_dims")
SPATIAL_DIMS_2 = (r"^x has shape \({}\) \({} dims\) but spatial_dims=2 gives 2 spatial "
                  r"dim\(s\), which need 4 dims \(N, C, \*spatial\) batched or 3 dims "
                  r"\(C, \*spatial\) unbatched")


@pytest.mark.parametrize("name", KINDS)
@pytest.mark.parametrize("shape, spatial_dims, match", [
    ((4, 6), None, NEEDS_A_BATCH.format("4, 6", 2)),
    ((1, 2, 2, 2, 2, 2), None, NEEDS_A_BATCH.format("1, 2, 2, 2, 2, 2", 6)),
    ((1, 2, 4, 4, 4), 2, SPATIAL_DIMS_2.format("1, 2, 4, 4, 4", 5)),
    ((4, 6), 2, SPATIAL_DIMS_2.format("4, 6", 2)),
])
def test_kind_of_x_of_wrong_rank(name, shape, spatial_dims, match):
    x = np.abs(x_of(shape))
    op = getattr(poolgrad, name)
    raises(ValueError, match, lambda: op(x, *KINDS[name], spatial_dims=spatial_dims), x)


@pytest.mark.parametrize("name", KINDS)
@pytest.mark.parametrize("spatial_dims", [0, 4, "2", 2.0, True])
def test_kind_spatial_dims_must_be_1_2_or_3(name, spatial_dims):
    x = np.abs(X2)
    raises(ValueError, r"^spatial_dims must be 1, 2 or 3",
           lambda: getattr(poolgrad, name)(x, *KINDS[name], spatial_dims=spatial_dims), x)


PER_DIM = {  # name -> the arguments after x, one of them per dim (2 spatial dims)
    "blur_pool": ((2, 2),), "max_blur_pool": ((2, 2),), "avg_blur_pool": ((2, 2),),
    "soft_pool": ((2, 2),), "stochastic_pool": ((2, 2),), "fractional_max_pool": ((2, 2), 1),
    "gem_pool": (3.0, (2, 2)), "mixed_pool": ((2, 2),), "gated_pool": (np.ones((2, 2)), (2, 2)),
}


@pytest.mark.parametrize("name", PER_DIM)
def test_kind_spatial_dims_must_agree_with_the_per_dim_arguments(name):
    x = np.abs(x_of((2, 3, 4, 4, 4)))
    raises(ValueError, r"^spatial_dims=3 but \w+ has 2 per-dim values; they must agree",
           lambda: getattr(poolgrad, name)(x, *PER_DIM[name], spatial_dims=3), x)


@pytest.mark.parametrize("name", SLIDING)
@pytest.mark.parametrize("shape, kwargs", [
    ((4,), {"kernel_size": 2, "padding": 2}),  # window 0 covers only the front padding
    ((4,), {"kernel_size": 2, "padding": ((0, 2),)}),  # the last window only the end padding
    ((2,), {"kernel_size": 2, "stride": 1, "dilation": 4, "padding": 2}),  # taps jump over x
    ((4,), {"kernel_size": 3, "stride": 3, "padding": 3, "ceil_mode": True}),
    ((4,), {"kernel_size": 2, "padding": 2**63}),
    ((4, 6), {"kernel_size": 2, "padding": ((0, 0), (0, 2**64))}),
    ((4,), {"kernel_size": 5}),  # no window fits at all
    ((4,), {"kernel_size": 3, "dilation": 2}),
    ((4,), {"kernel_size": 7, "padding": 1}),
    ((4, 6), {"kernel_size": (2, 7)}),
])
def test_padding_or_kernel_too_large(name, shape, kwargs):
    x = x_of((1, 2) + shape)
    raises(ValueError, r"^padding \(\d+, \d+\) is too large in spatial dim \d: "
           r"(some )?window (\d+ )?"
           r"|^the output would be empty in spatial dim \d: the window \(kernel \d+.*padding",
           lambda: call(name, x, **kwargs), x)


@pytest.mark.parametrize("name", ["max_pool", "vjp:avg_pool"])
def test_huge_stride_gives_one_window(name):  # a legal stride: one window
    y, expected = call(name, X1, stride=2**64), call(name, X1, stride=6)
    if name.startswith("vjp:"):
        y, expected = y[0], expected[0]
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("name", ["lp_pool", "vjp:global_lp_pool"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])  # float16 computes in float32
@pytest.mark.parametrize("p", [1e-50, 1e39])  # 0 and inf in float32
def test_p_beyond_the_compute_dtype(name, dtype, p):
    x = np.array([[[0.5, 0.25]]], dtype)
    raises(ValueError, r"^p ", lambda: call(name, x, p=p), x)


# --------------------------------------------------------------------- pullbacks and vjp

@pytest.mark.parametrize("name", [n for n in ALL if n.startswith("vjp:")])
@pytest.mark.parametrize("bad_dy, exc", [
    (lambda s: np.ones(s + (1,)), ValueError), (lambda s: np.ones(s[:-1]), ValueError),
    (lambda s: np.ones(s[::-1]), ValueError), (lambda s: np.ones(s[:-1] + (9,)), ValueError),
    (lambda s: np.float64(1), ValueError), (lambda s: [[1.0]], ValueError),
    (lambda s: np.ones(s, object), TypeError), (lambda s: np.ones(s, "U3"), TypeError),
    (lambda s: np.ones(s, bool), TypeError), (lambda s: np.ones(s, complex), TypeError),
    (lambda s: None, TypeError),
])
def test_bad_dy(name, bad_dy, exc):
    y, pullback = call(name, X2)
    dy = bad_dy(y.shape)
    match = (re.escape(f"pullback: dy has shape {np.shape(dy)} but the output has shape "
                       f"{y.shape}") if exc is ValueError else r"^dy must have dtype")
    arrays = [X2, y] + ([dy] if isinstance(dy, np.ndarray) else [])
    raises(exc, match, lambda: pullback(dy), *arrays)


def test_dy_must_be_the_values_not_the_indices_tuple():
    (y, indices), pullback = vjp(max_pool, X2, 2, return_indices=True)
    raises(ValueError, r"dy has shape", lambda: pullback((y, indices)), X2, y, indices)


@pytest.mark.parametrize("op", [
    np.max, lambda x, k: max_pool(x, k), functools.partial(max_pool, kernel_size=2), "max_pool",
    None, poolgrad.Pullback, [max_pool],
])
def test_vjp_of_a_non_poolgrad_function(op):
    raises(TypeError, r"^vjp needs one of poolgrad's operators", lambda: vjp(op, X1, 2), X1)


# ------------------------------------------------- non-contiguous and read-only inputs

def read_only(a):
    a = a.copy()
    a.flags.writeable = False
    return a


FLIP = (slice(None, None, -1),) * 4
LAYOUTS = {  # the same values as a 4-d contiguous a, in other layouts
    "transposed": lambda a: np.ascontiguousarray(a.T).T,
    "step-sliced": lambda a: np.repeat(a, 2, axis=-1)[..., ::2],
    "negative-strides": lambda a: a[FLIP].copy()[FLIP],
    "read-only": read_only,
    "read-only-negative-strides": lambda a: read_only(a[FLIP])[FLIP],
}
CASES = [  # overlapping windows, padding and dilation, so the backward gathers really sum
    ("max_pool", {"kernel_size": 3, "stride": 1, "padding": 1}),
    ("max_pool", {"kernel_size": (2, 3), "stride": (1, 2), "ties": "split"}),
    ("avg_pool", {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False}),
    ("lp_pool", {"p": 3, "kernel_size": 2, "stride": 1, "dilation": (1, 2)}),
    ("adaptive_max_pool", {"output_size": (3, 4)}),
    ("global_lp_pool", {"p": 1.5}),
]


@pytest.mark.parametrize("layout", LAYOUTS)  # float64 only: each layout is a Numba compile
@pytest.mark.parametrize("name, kwargs", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_any_layout_gives_the_contiguous_result(name, kwargs, layout):
    x = np.round(x_of((2, 3, 5, 6)) * 4) / 4  # with ties
    y_ref, pullback_ref = call(f"vjp:{name}", x, **kwargs)
    dy = x_of(y_ref.shape, seed=1)
    dx_ref = pullback_ref(dy)
    x_view, dy_view = LAYOUTS[layout](x), LAYOUTS[layout](dy)
    assert not (x_view.flags.c_contiguous and x_view.flags.writeable)
    snap = snapshot(x, dy, x_view, dy_view)

    y_forward = call(name, x_view, **kwargs)
    y, pullback = call(f"vjp:{name}", x_view, **kwargs)
    for got, expected in [(y_forward, y_ref), (y, y_ref), (pullback(dy_view), dx_ref),
                          (pullback(dy_view), dx_ref)]:  # a pullback may be called again
        np.testing.assert_array_equal(got, expected, strict=True)
    assert_unchanged(snap)


def test_pullback_does_not_see_later_changes_to_x():
    """The pullbacks that keep x (Lp, split ties) keep their own copy."""
    x = np.array([[[0.5, 2.0, 2.0, 1.0]]])
    cases = [(poolgrad.lp_pool, (3.0, 2), {}), (poolgrad.max_pool, (2,), {"ties": "split"})]
    for op, args, kwargs in cases:
        y, pullback = poolgrad.vjp(op, x, *args, **kwargs)
        before = pullback(np.ones_like(y))
        changed = x.copy()
        x[...] = 7.0
        np.testing.assert_array_equal(pullback(np.ones_like(y)), before)
        x[...] = changed


def test_pullback_does_not_see_later_changes_to_y_or_indices():
    x = np.array([[[0.5, 2.0, 2.0, 1.0]]])
    for op, args, kwargs in [(poolgrad.lp_pool, (3.0, 2), {}),
                             (poolgrad.max_pool, (2,), {"ties": "split"})]:
        y, pullback = poolgrad.vjp(op, x, *args, **kwargs)
        before = pullback(np.ones_like(y))
        y[...] = 0.0  # e.g. an in-place activation on the output
        np.testing.assert_array_equal(pullback(np.ones_like(y)), before)
    y, indices = poolgrad.max_pool(np.arange(16.0).reshape(1, 1, 4, 4), 2, return_indices=True)
    out, pullback = poolgrad.vjp(poolgrad.max_unpool, y, indices, 2)
    before = pullback(np.ones_like(out))
    indices[...] = 10**12  # the pullback indexes with its own validated copy
    np.testing.assert_array_equal(pullback(np.ones_like(out)), before)


@pytest.mark.parametrize("kwargs", [{"ceil_mode": "False"}, {"ceil_mode": 2},
                                    {"return_indices": "yes"}, {"count_include_pad": "no"}])
def test_flags_must_be_booleans(kwargs):
    op = poolgrad.avg_pool if "count_include_pad" in kwargs else poolgrad.max_pool
    name = next(iter(kwargs))
    with pytest.raises(TypeError, match=f"^{name} must be True or False"):
        op(X2, 2, **kwargs)


def test_masked_arrays_are_refused():
    x = np.ma.masked_array(X2, X2 < 0)
    with pytest.raises(TypeError, match="^x is a masked array"):
        poolgrad.max_pool(x, 2)


@pytest.mark.parametrize("call_it", [
    lambda: poolgrad.lp_pool(X1, 10**400, 2),
    lambda: poolgrad.max_pool(X1, 2, dilation=2**63),
    lambda: poolgrad.max_pool(X1, 2, 1, padding=2**62, dilation=2**62),
])
def test_absurd_sizes_get_a_named_value_error(call_it):
    with pytest.raises(ValueError, match=r"^(p must|padding|the output would be empty)"):
        call_it()


def test_one_tap_kernel_ignores_dilation_and_arrays_work_as_per_dim_values():
    np.testing.assert_array_equal(poolgrad.max_pool(X2, 1, dilation=2**63), X2)
    np.testing.assert_array_equal(poolgrad.max_pool(X2, np.array([2, 2]), padding=np.array([1, 0])),
                                  poolgrad.max_pool(X2, (2, 2), padding=(1, 0)))


def test_unpool_full_output_size_must_match_the_leading_dims():
    y, indices = poolgrad.max_pool(np.zeros((1, 2, 4, 4)), 2, return_indices=True)
    assert poolgrad.max_unpool(y, indices, 2, output_size=(1, 2, 4, 4)).shape == (1, 2, 4, 4)
    with pytest.raises(ValueError, match="^output_size"):
        poolgrad.max_unpool(y, indices, 2, output_size=(99, 2, 4, 4))


@pytest.mark.parametrize("bad", [2.0, True, (2.0, 2), (True, 2), np.float64(2.0)])
def test_kept_arguments_never_let_a_bad_one_through(bad):
    """The operators keep their checked arguments per call (``_inputs.memoized``); a value
    equal to a good one (``2.0 == True + 1 == 2``) must still be refused after it."""
    from poolgrad.kinds.blur import blur_arguments
    from poolgrad.kinds.fractional import fractional_arguments

    x = np.random.default_rng(0).standard_normal((1, 2, 8, 8))
    # the good arguments, kept (checked as the operators check them, with no kernel to
    # compile); the bad ones are refused before any kernel runs
    blur_arguments(x.shape, 1, 2, 3, None, "reflect", None)
    fractional_arguments(x.shape, 2, 4, None, "pseudo_random", None)
    with pytest.raises(TypeError, match="stride"):
        poolgrad.blur_pool(x, bad)
    with pytest.raises(TypeError, match="kernel_size"):
        poolgrad.fractional_max_pool(x, bad, output_size=4, samples=np.full((1, 2, 2), 0.5))


def test_kept_arguments_tell_floats_apart():
    from poolgrad._inputs import memoized

    seen = []
    kept = memoized(lambda *args: seen.append(args) or len(seen))
    assert kept(0.0) == kept(0.0) == 1
    assert kept(-0.0) == 2 and kept(float("nan")) == 3 == kept(float("nan"))
    assert kept(1) == 4 and kept(True) == 5 and kept(np.int64(1)) == 6
    assert kept([1]) == 7 and kept((1,)) == 8 and kept([1]) == 7
    assert kept(np.array([1])) == 9 and kept(np.array([1])) == 10  # arrays: never kept
