"""The Triton (CUDA) kernels against the CPU kernels.

Without a GPU the same kernels run under the Triton interpreter (``TRITON_INTERPRET=1``,
set by ``conftest.py`` before Triton is imported) on CPU tensors, through the CUDA implementations
of :mod:`poolgrad.torch._cuda`; with one they run compiled on CUDA tensors. Max values,
winners, indices and gathers, and the average's sums, must give the CPU's bits; Lp
pooling (``pow`` as ``exp2(b * log2(a))``) must agree within a few ulps.
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
CUDA = torch.cuda.is_available()
# tests/conftest.py sets TRITON_INTERPRET=1 without a GPU, before Triton is imported
assert CUDA or os.environ.get("TRITON_INTERPRET") == "1"
triton = pytest.importorskip("triton")
tl = triton.language
DEVICE = "cuda" if CUDA else "cpu"
if not CUDA:
    from triton_interpreter import install  # noqa: E402

    install()  # the interpreter without its repeated patches (see the module)

from poolgrad import geometry  # noqa: E402
from poolgrad.torch import _cuda, _kind_ops, _ops  # noqa: E402
from poolgrad.torch.triton import dispatch  # noqa: E402

needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
# NaN and infinities in the test data: the interpreter's NumPy arithmetic warns on them
pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]


def cpu(name):
    return _ops.IMPLEMENTATIONS["cpu"][getattr(_kind_ops, name, None) or getattr(_ops, name)]


def triton_impl(name):
    return _cuda.IMPLEMENTATIONS[name]


def on_device(t):
    return t.to(DEVICE)


def on_cpu(t):
    return t.detach().to("cpu")


def same_bits(a, b):
    """Equal bit for bit (the sign of zero included), dtype and strides; a NaN equals a
    NaN whatever its payload."""
    a, b = on_cpu(a), on_cpu(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    assert a.stride() == b.stride(), (a.stride(), b.stride())
    if a.dtype.is_floating_point:
        # NaN payloads are the device's: a float32 NaN that arithmetic makes is
        # 0x7FFFFFFF on an H200 and 0x7FC00000 on the CPU (benchmarks/cuda_blur.py,
        # 2026-11-29), and torch's CPU conversion of any float32 NaN to bfloat16 gives
        # 0xFFFF (torch 2.13), Triton's 0x7FC0. Both NaN: NaNs compare as NaN here
        assert torch.equal(a.isnan(), b.isnan())
        a, b = a.nan_to_num(0.0, float("inf"), -float("inf")), b.nan_to_num(
            0.0, float("inf"), -float("inf"))
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.contiguous().view(width), b.contiguous().view(width)
    assert torch.equal(a, b)


def sliding(ndim, kernel, stride, before, after, dilation, ceil_mode):
    return _ops.sliding_window((kernel,) * ndim, (stride,) * ndim,
                               ((before, after),) * ndim, (dilation,) * ndim, ceil_mode)


def layouts(x):
    """``x`` as stored NCHW, channels-last (4-d and 5-d) and non-contiguous."""
    yield "nchw", x
    if x.dim() == 4:
        yield "channels_last", x.contiguous(memory_format=torch.channels_last)
    if x.dim() == 5:
        yield "channels_last", x.contiguous(memory_format=torch.channels_last_3d)
    wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
    wide[..., ::2] = x
    yield "strided", wide[..., ::2]


def special(shape, dtype, seed):
    """Values with ties, NaN, -0, +-inf and repeated small integers."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, shape, generator=g).to(torch.float64)
    x += torch.rand(shape, generator=g, dtype=torch.float64).round() * 0.5
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=g)[:4]
    flat[picks[0]] = float("nan")
    flat[picks[1]] = -0.0
    flat[picks[2]] = float("inf")
    flat[picks[3]] = -float("inf")
    return x.to(dtype)


# sliding geometries: (ndim, kernel, stride, before, after, dilation, ceil_mode)
SLIDING = [
    (1, 4, 4, 0, 0, 1, False),
    (1, 3, 2, 1, 1, 2, True),
    (2, 2, 2, 0, 0, 1, False),
    (2, 3, 2, 1, 1, 1, False),
    (2, 3, 1, 1, 0, 1, True),
    (2, 2, 3, 1, 1, 2, True),
    (3, 2, 2, 0, 0, 1, False),
    (3, 3, 2, 1, 1, 1, True),
]
ADAPTIVE = [(1, (3,)), (2, (3, 4)), (2, (1, 1)), (3, (2, 3, 2))]
SHAPES = {1: (2, 3, 11), 2: (2, 3, 7, 9), 3: (1, 2, 5, 6, 7)}


def windows():
    for g in SLIDING:
        yield f"sliding{g}", g[0], sliding(*g)
    for ndim, out in ADAPTIVE:
        yield f"adaptive{out}", ndim, _ops.adaptive_window(out)


WINDOWS = list(windows())


@pytest.mark.parametrize("name,ndim,window", WINDOWS, ids=[w[0] for w in WINDOWS])
def test_max_forward_backward_gather_and_indices_give_the_cpu_bits(name, ndim, window):
    """Values, winners, values-only, the routed gradient, the gather and the indices,
    in every layout, on data full of ties, NaN, -0 and infinities."""
    for seed, dtype in ((0, torch.float32), (1, torch.float64), (2, torch.bfloat16),
                        (3, torch.float16)):
        x = special(SHAPES[ndim], dtype, seed)
        for layout, xs in layouts(x):
            y, winners = cpu("max_pool")(xs, window, "first")
            ty, twinners = triton_impl("max_pool")(on_device(xs), window, "first")
            same_bits(ty, y)
            same_bits(twinners, winners)
            same_bits(triton_impl("max_pool_values")(on_device(xs), window), y)
            dy = special(y.shape, dtype, seed + 10)
            if layout == "channels_last":
                dy = dy.contiguous(memory_format=_ops.memory_format(y))
            dx = cpu("max_pool_backward")(dy, winners, window, list(x.shape))
            same_bits(triton_impl("max_pool_backward")(on_device(dy), twinners, window,
                                                       list(x.shape)), dx)
            src = special(x.shape, dtype, seed + 20)
            same_bits(triton_impl("max_pool_gather")(on_device(src), twinners, window),
                      cpu("max_pool_gather")(src, winners, window))
            same_bits(triton_impl("max_pool_indices")(twinners, window, list(x.shape)),
                      cpu("max_pool_indices")(winners, window, list(x.shape)))


@pytest.mark.parametrize("name,ndim,window", WINDOWS, ids=[w[0] for w in WINDOWS])
def test_average_forward_and_backward_give_the_cpu_bits(name, ndim, window):
    """Both divisors and an override; sums in the CPU's order give its bits, float16
    and bfloat16 computed in float32 as the CPU computes them. The one exception: the
    CPU's global average of C-contiguous planes (a strided x is copied into C order
    first) sums in eight interleaved running sums (``sum_pool.global_avg_forward``), so
    there the forward agrees within rounding."""
    g = torch.Generator().manual_seed(len(name))
    global_average = window == _ops.adaptive_window((1,) * ndim)
    divisors = {torch.float32: ((True, None), (False, None), (True, 3)),
                torch.float64: ((True, None),), torch.bfloat16: ((False, None),)}
    for dtype, modes in divisors.items():
        x = torch.randn(SHAPES[ndim], generator=g, dtype=torch.float64).to(dtype)
        for layout, xs in layouts(x):
            for include_pad, override in modes:
                y = cpu("avg_pool")(xs, window, include_pad, override)
                ty = triton_impl("avg_pool")(on_device(xs), window, include_pad, override)
                if global_average and layout != "channels_last":
                    torch.testing.assert_close(on_cpu(ty), y)
                    assert on_cpu(ty).stride() == y.stride()
                else:
                    same_bits(ty, y)
                dy = torch.randn(y.shape, generator=g, dtype=torch.float64).to(dtype)
                channels_last = layout == "channels_last"
                dx = cpu("avg_pool_backward")(dy, window, list(x.shape), include_pad,
                                              override, channels_last)
                same_bits(triton_impl("avg_pool_backward")(on_device(dy), window,
                                                           list(x.shape), include_pad,
                                                           override, channels_last), dx)


def test_lp_in_float64_keeps_float64_exponents():
    """p, 1/p and p-1 reach the kernel in the data's precision (a Python float argument
    would be float32 on a GPU)."""
    x = torch.rand(1, 2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    window = sliding(2, 2, 2, 0, 0, 1, False)
    for p in (1.1, 3.7):
        y = cpu("lp_pool")(x + 0.5, p, window)
        torch.testing.assert_close(on_cpu(triton_impl("lp_pool")(on_device(x + 0.5), p, window)),
                                   y, rtol=1e-13, atol=0)


@pytest.mark.parametrize("p", [1.0, 2.0, 3.5])
@pytest.mark.parametrize("name,ndim,window", WINDOWS[:6], ids=[w[0] for w in WINDOWS[:6]])
def test_lp_forward_and_backward_match_the_cpu(name, ndim, window, p):
    """Lp within a few float32 ulps (pow differs from libm's), zeros included."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(SHAPES[ndim], generator=g)
    x.view(-1)[::5] = 0.0
    for _, xs in layouts(x):
        y = cpu("lp_pool")(xs, p, window)
        ty = triton_impl("lp_pool")(on_device(xs), p, window)
        torch.testing.assert_close(on_cpu(ty), y, rtol=2e-6, atol=1e-6)
        assert on_cpu(ty).stride() == y.stride()
        dy = torch.randn(y.shape, generator=g)
        dx = cpu("lp_pool_backward")(dy, xs, y, p, window)
        tdx = triton_impl("lp_pool_backward")(on_device(dy), on_device(xs), ty, p, window)
        torch.testing.assert_close(on_cpu(tdx), dx, rtol=2e-5, atol=1e-6)
        same_bits(on_cpu(tdx) == 0, dx == 0)  # zeros where the CPU has zeros


GEM_WINDOWS = [("global 2-d", 2, _ops.adaptive_window((1, 1))),
               ("3x2 stride 2x1", 2, _ops.sliding_window((3, 2), (2, 1), ((0, 0),) * 2,
                                                         (1, 1), False)),
               ("1-d overlapping", 1, sliding(1, 3, 2, 0, 0, 1, False))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,ndim,window", GEM_WINDOWS, ids=[w[0] for w in GEM_WINDOWS])
def test_gem_forward_backward_and_p_terms_match_the_cpu(name, ndim, window, dtype):
    """GeM's three kernels against the CPU's fused ones in every layout, with inputs
    under the clamp (no gradient there) and a learnable p's terms."""
    g = torch.Generator().manual_seed(11)
    x = torch.rand(SHAPES[ndim], generator=g, dtype=dtype)
    x.view(-1)[::6] = 1e-4  # below eps
    p = torch.tensor(2.6, dtype=torch.float32)
    tolerance = {"rtol": 1e-12, "atol": 1e-14} if dtype == torch.float64 else {
        "rtol": 2e-6, "atol": 1e-6}
    for _, xs in layouts(x):
        y = cpu("gem_pool")(xs, p, 1e-3, window)
        ty = triton_impl("gem_pool")(on_device(xs), on_device(p), 1e-3, window)
        torch.testing.assert_close(on_cpu(ty), y, **tolerance)
        assert on_cpu(ty).stride() == y.stride()
        dy = torch.randn(y.shape, generator=g, dtype=dtype)
        dx, terms = cpu("gem_pool_backward")(dy, xs, y, p, 1e-3, window, True)
        tdx, tterms = triton_impl("gem_pool_backward")(on_device(dy), on_device(xs), ty,
                                                       on_device(p), 1e-3, window, True)
        torch.testing.assert_close(on_cpu(tdx), dx, **tolerance)
        torch.testing.assert_close(on_cpu(tterms), terms, **tolerance)
        assert on_cpu(tdx).stride() == dx.stride()
        same_bits(on_cpu(tdx) == 0, xs < 1e-3)  # zeros exactly under the clamp
        _, untaken = triton_impl("gem_pool_backward")(on_device(dy), on_device(xs), ty,
                                                      on_device(p), 1e-3, window, False)
        assert not on_cpu(untaken).any()


@pytest.mark.parametrize("name,ndim,window", GEM_WINDOWS[:2], ids=[w[0] for w in GEM_WINDOWS[:2]])
def test_gem_of_an_infinite_input_is_infinite_as_on_the_cpu(name, ndim, window):
    """A window holding +inf: inf, not the NaN of a sum taken relative to inf."""
    x = torch.rand(SHAPES[ndim], generator=torch.Generator().manual_seed(13)) + 0.5
    x.view(-1)[::17] = float("inf")
    p = torch.tensor(3.0)
    for _, xs in layouts(x):
        y = cpu("gem_pool")(xs, p, 1e-6, window)
        assert y.isinf().any() and not y.isnan().any()
        ty = triton_impl("gem_pool")(on_device(xs), on_device(p), 1e-6, window)
        torch.testing.assert_close(on_cpu(ty), y, rtol=2e-6, atol=1e-6)


WEIGHTED_WINDOWS = [("2x2", 2, sliding(2, 2, 2, 0, 0, 1, False)),
                    ("3x3 stride 2 padded ceil", 2, sliding(2, 3, 2, 1, 1, 1, True)),
                    ("1-d 3 stride 1", 1, sliding(1, 3, 1, 1, 0, 1, False))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,ndim,window", WEIGHTED_WINDOWS,
                         ids=[w[0] for w in WEIGHTED_WINDOWS])
def test_weighted_averages_and_the_stochastic_draw_match_the_cpu(name, ndim, window, dtype):
    """SoftPool and stochastic pooling's mean (forward, norm, backward) within rounding
    of the CPU's fused kernels, and the draw's values and winners bit for bit, in every
    layout; non-negative inputs with a window of zeros."""
    g = torch.Generator().manual_seed(12)
    x = torch.rand(SHAPES[ndim], generator=g, dtype=dtype) * 3
    x.view(-1)[::5] = 0.0
    x[..., :3] = 0.0  # windows of zeros: SELF's y = 0, the draw's first real tap
    tolerance = {"rtol": 1e-12, "atol": 1e-13} if dtype == torch.float64 else {
        "rtol": 3e-6, "atol": 2e-6}
    for _, xs in layouts(x):
        for kind in (_kind_ops.SOFT, _kind_ops.SELF):
            y, norm = cpu("weighted_pool")(xs, kind, window)
            ty, tnorm = triton_impl("weighted_pool")(on_device(xs), kind, window)
            torch.testing.assert_close(on_cpu(ty), y, **tolerance)
            torch.testing.assert_close(on_cpu(tnorm), norm, **tolerance)
            assert on_cpu(ty).stride() == y.stride()
            same_bits(on_cpu(triton_impl("weighted_pool_values")(on_device(xs), kind, window)),
                      on_cpu(ty))
            same_bits(cpu("weighted_pool_values")(xs, kind, window), y)
            dy = torch.randn(y.shape, generator=g, dtype=dtype)
            dx = cpu("weighted_pool_backward")(dy, xs, y, norm, kind, window)
            tdx = triton_impl("weighted_pool_backward")(on_device(dy), on_device(xs), ty,
                                                        tnorm, kind, window)
            torch.testing.assert_close(on_cpu(tdx), dx, **tolerance)
            assert on_cpu(tdx).stride() == dx.stride()
        # a seed above 2**32 and one whose uint64 sums wrap: the counted draws agree
        for seed in (2**62 + 12345, 2**63 - 1):
            seed = torch.tensor([seed])
            values, winners = cpu("stochastic_pool_sample")(xs, seed, window)
            tvalues, twinners = triton_impl("stochastic_pool_sample")(
                on_device(xs), on_device(seed), window)
            same_bits(tvalues, values)
            same_bits(twinners, winners)


FRACTIONAL_CASES = [  # (shape, kernel, out, sequence)
    ((2, 3, 9, 11), (2, 2), (4, 5), "pseudo_random"),
    ((2, 3, 9, 11), (3, 3), (4, 5), "pseudo_random"),  # overlapping windows
    ((2, 3, 9, 11), ("disjoint", "overlapping"), (4, 6), "pseudo_random"),
    ((2, 3, 9, 11), ("overlapping", 2), (5, 6), "random"),
    ((2, 3, 13), (3,), (6,), "random"),
    ((1, 2, 5, 6, 7), (2, "disjoint", 3), (3, 4, 4), "pseudo_random"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape,kernel,out,sequence", FRACTIONAL_CASES,
                         ids=[f"{c[1]}-{c[3]}" for c in FRACTIONAL_CASES])
def test_fractional_max_pooling_gives_the_cpu_bits(shape, kernel, out, sequence, dtype):
    """Windows built on the device from the same draws: the values, PyTorch's indices
    and dx of the CPU's kernels, bit for bit, in every layout, with ties, NaN, -0 and
    infinities (the winners are numbered over a bound on the windows' lengths, so only
    what they decode to is compared)."""
    from poolgrad.torch._fractional import sequence_steps
    g = torch.Generator().manual_seed(len(shape) + len(out))
    n, c = shape[:2]
    x = special(shape, dtype, seed=3)
    samples = torch.rand((n, c, len(out)), generator=g,
                         dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    orders = torch.rand((n * c, sum(sequence_steps(kernel, out, sequence))), generator=g,
                        dtype=torch.float64)
    geometry_ = _kind_ops.fractional_geometry(kernel, out, sequence)
    draws = (samples, orders, geometry_)
    for _, xs in layouts(x):
        size = list(xs.shape)
        y, winners = cpu("fractional_max_pool")(xs, *draws)
        ty, twinners = triton_impl("fractional_max_pool")(on_device(xs), *map(on_device,
                                                          draws[:2]), geometry_)
        same_bits(ty, y)
        assert twinners.dtype == winners.dtype and twinners.stride() == winners.stride()
        same_bits(triton_impl("fractional_max_pool_indices")(twinners, *map(on_device,
                  draws[:2]), geometry_, size),
                  cpu("fractional_max_pool_indices")(winners, *draws, size))
        dy = special(tuple(y.shape), dtype, seed=4).contiguous(
            memory_format=_ops.memory_format(y))
        same_bits(triton_impl("fractional_max_pool_backward")(
                      on_device(dy), twinners, *map(on_device, draws[:2]), geometry_, size),
                  cpu("fractional_max_pool_backward")(dy, winners, *draws, size))


APS_CASES = [("2-d stride 2", (2, 3, 6, 8), [2, 2]), ("2-d odd sizes (2, 3)", (3, 2, 7, 5), [2, 3]),
             ("1-d stride 3", (2, 3, 10), [3]), ("3-d", (2, 2, 4, 5, 6), [2, 1, 3])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name,shape,steps", APS_CASES, ids=[c[0] for c in APS_CASES])
def test_polyphase_sampling_matches_the_cpu(name, shape, steps, dtype):
    """APS's choice, gather and scatter bit for bit against the CPU's, for every norm
    and layout; ties (whole zero examples: phase 0) and a NaN (its phase wins)."""
    g = torch.Generator().manual_seed(21)
    x = torch.randn(shape, generator=g).to(dtype)
    x[0] = 0.0  # every norm ties: phase 0
    x.view(-1)[-1] = float("nan")  # the last example's component holding it wins
    for layout, xs in layouts(x):
        for norm in (0, 1, 2):
            y, phases = cpu("aps_pool")(xs, steps, norm)
            ty, tphases = triton_impl("aps_pool")(on_device(xs), steps, norm)
            same_bits(tphases, phases)
            same_bits(ty, y)
            assert phases[0] == 0, (layout, norm)
        given = torch.randint(0, math.prod(steps), (shape[0],), generator=g)
        same_bits(triton_impl("aps_gather")(on_device(xs), on_device(given), steps),
                  cpu("aps_gather")(xs, given, steps))
        dy = torch.randn(y.shape, generator=g).to(dtype)
        same_bits(triton_impl("aps_scatter")(on_device(dy), on_device(given), steps,
                                             list(shape)),
                  cpu("aps_scatter")(dy, given, steps, list(shape)))


# (shape, pads: before and after per spatial dim), some wrapping more than once
CIRCULAR_CASES = [((2, 3, 7), [2, 1]), ((2, 3, 4, 5), [1, 2, 3, 0]),
                  ((1, 2, 2, 3), [3, 3, 4, 5]), ((1, 2, 3, 4, 2), [1, 1, 0, 2, 2, 3])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape,pads", CIRCULAR_CASES, ids=[str(c[0]) for c in CIRCULAR_CASES])
def test_circular_padding_and_its_fold_give_the_cpu_bits(shape, pads, dtype):
    """max_aps_pool's circular padding and its transpose: the CPU's bits and strides in
    every layout (the fold sums each axis's copies in the CPU's order), NaN, -0 and
    infinities included."""
    x = special(shape, dtype, seed=8)
    for _, xs in layouts(x):
        padded = cpu("circular_pad")(xs, pads)
        same_bits(triton_impl("circular_pad")(on_device(xs), pads), padded)
        dy = special(tuple(padded.shape), dtype, seed=9).contiguous(
            memory_format=_ops.memory_format(padded))
        same_bits(triton_impl("circular_fold")(on_device(dy), pads, list(shape)),
                  cpu("circular_fold")(dy, pads, list(shape)))


BLEND_WINDOWS = [("2x2 float32", 2, sliding(2, 2, 2, 0, 0, 1, False), torch.float32),
                 ("3x3 stride 2 padded", 2, sliding(2, 3, 2, 1, 1, 1, False), torch.float64),
                 ("1-d 3 stride 1", 1, sliding(1, 3, 1, 1, 0, 1, False), torch.float64)]


@pytest.mark.parametrize("name,ndim,window,dtype", BLEND_WINDOWS,
                         ids=[w[0] for w in BLEND_WINDOWS])
def test_mixed_and_gated_blends_match_the_cpu(name, ndim, window, dtype):
    """Mixed and gated pooling (forward, dx and the weights' gradient) within rounding
    of the CPU's fused kernels in every layout, ties and a NaN included (the winner is
    max pooling's)."""
    g = torch.Generator().manual_seed(13)
    x = torch.randn(SHAPES[ndim], generator=g, dtype=dtype)
    x.view(-1)[::7] = 0.5  # ties
    x.view(-1)[11] = float("nan")
    tolerance = {"rtol": 1e-12, "atol": 1e-13} if dtype == torch.float64 else {
        "rtol": 3e-6, "atol": 2e-6}
    taps = _ops.sliding_args(window)[0]
    weights = {_kind_ops.MIXED: torch.tensor([0.3], dtype=torch.float64),
               _kind_ops.GATED: torch.randn(taps, generator=g)}
    for _, xs in layouts(x):
        for kind, w in weights.items():
            y = cpu("blend_pool")(xs, w, kind, window)
            ty = triton_impl("blend_pool")(on_device(xs), on_device(w), kind, window)
            torch.testing.assert_close(on_cpu(ty), y, equal_nan=True, **tolerance)
            assert on_cpu(ty).stride() == y.stride()
            dy = torch.randn(y.shape, generator=g, dtype=dtype)
            dx, dw = cpu("blend_pool_backward")(dy, xs, w, kind, window)
            tdx, tdw = triton_impl("blend_pool_backward")(on_device(dy), on_device(xs),
                                                          on_device(w), kind, window)
            torch.testing.assert_close(on_cpu(tdx), dx, equal_nan=True, **tolerance)
            assert on_cpu(tdx).stride() == dx.stride()
            torch.testing.assert_close(on_cpu(tdw), dw, equal_nan=True, rtol=1e-5, atol=1e-5)


# (name, pre, shape, kernel, stride, filter taps, pads, padding mode, dtype), per
# spatial dim; few and small: each launch runs its taps' loops in the interpreter
BLUR_CASES = [
    ("blur 2-d reflect", "none", (2, 3, 9, 8), (1, 1), (2, 2), (3, 3), ((1, 1), (1, 1)),
     "reflect", torch.float32),
    ("blur 2-d reflect bfloat16", "none", (2, 3, 9, 8), (1, 1), (2, 2), (3, 3),
     ((1, 1), (1, 1)), "reflect", torch.bfloat16),
    ("max-blur 2-d zeros", "max", (2, 3, 9, 8), (2, 2), (2, 2), (3, 3), ((1, 1), (1, 1)),
     "zeros", torch.float64),
    ("max-blur 2-d zeros bfloat16", "max", (2, 3, 9, 8), (2, 2), (2, 2), (3, 3),
     ((1, 1), (1, 1)), "zeros", torch.bfloat16),
    ("avg-blur 2-d circular", "avg", (2, 2, 8, 7), (2, 3), (2, 1), (3, 2), ((1, 1), (1, 0)),
     "circular", torch.float64),
    ("max-blur 1-d replicate", "max", (2, 3, 13), (3,), (3,), (5,), ((2, 2),), "replicate",
     torch.float32),
    ("avg-blur 1-d reflect, 7 taps", "avg", (2, 2, 12), (2,), (2,), (7,), ((3, 3),),
     "reflect", torch.float64),
    ("blur 1-d circular wider than the input", "none", (1, 2, 3), (1,), (1,), (7,),
     ((4, 4),), "circular", torch.float64),
    ("blur 3-d zeros", "none", (1, 2, 5, 6, 7), (1, 1, 1), (2, 1, 2), (3, 2, 3),
     ((1, 1), (0, 1), (1, 0)), "zeros", torch.float32),
    ("max-blur 3-d reflect", "max", (1, 2, 5, 6, 7), (2, 1, 2), (2, 2, 1), (3, 3, 2),
     ((1, 1), (1, 0), (0, 1)), "reflect", torch.float64),
]
BLUR_TOLERANCE = {torch.float64: {"rtol": 1e-12, "atol": 1e-13},
                  torch.float32: {"rtol": 2e-6, "atol": 2e-6},
                  torch.bfloat16: {"rtol": 8e-3, "atol": 8e-3}}


@pytest.mark.parametrize("name,pre,shape,kernel,stride,sizes,pads,mode,dtype", BLUR_CASES,
                         ids=[c[0] for c in BLUR_CASES])
def test_blur_kinds_match_the_cpu(name, pre, shape, kernel, stride, sizes, pads, mode, dtype):
    """blur_pool, max_blur_pool and avg_blur_pool's operators on their Triton kernels
    (no stride-1 map stored; the backward a gather): a max-blur's winners the CPU's bits,
    the values and dx within rounding of the CPU's kernels (their sums run in another
    order), each in the CPU's layout, in every layout; ties, NaN, -0 and infinities; the
    output alone is the output with winners."""
    geometry_ = _kind_ops.blur_geometry(pre, kernel, stride, sizes, pads, mode)
    x = special(shape, dtype, seed=5)
    tolerance = BLUR_TOLERANCE[dtype]
    for _, xs in layouts(x):
        y, winners = cpu("blur_pool")(xs, geometry_)
        ty, twinners = triton_impl("blur_pool")(on_device(xs), geometry_)
        torch.testing.assert_close(on_cpu(ty), y, equal_nan=True, **tolerance)
        assert on_cpu(ty).stride() == y.stride()
        same_bits(twinners, winners)
        same_bits(triton_impl("blur_pool_values")(on_device(xs), geometry_), ty)
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(6),
                         dtype=torch.float64).to(dtype).contiguous(
                             memory_format=_ops.memory_format(y))
        dx = cpu("blur_pool_backward")(dy, winners, geometry_, list(xs.shape))
        tdx = triton_impl("blur_pool_backward")(on_device(dy), twinners, geometry_,
                                                list(xs.shape))
        torch.testing.assert_close(on_cpu(tdx), dx, equal_nan=True, **tolerance)
        assert on_cpu(tdx).stride() == dx.stride()


@pytest.mark.parametrize("name,ndim,window", WINDOWS, ids=[w[0] for w in WINDOWS])
def test_split_ties_give_the_cpu_bits(name, ndim, window):
    """``ties="split"``: each tied maximum gets ``dy / ties``, a NaN window its winner."""
    for seed, dtype in ((4, torch.float32), (5, torch.float64)):
        x = special(SHAPES[ndim], dtype, seed)
        for _, xs in layouts(x):
            y, _ = cpu("max_pool")(xs, window, "first")
            dy = special(y.shape, dtype, seed + 30).nan_to_num(1.5, 2.0, -2.0)
            same_bits(triton_impl("max_pool_split_backward")(on_device(dy), on_device(xs),
                                                             window),
                      cpu("max_pool_split_backward")(dy, xs, window))


def test_unpooling_gives_the_cpu_bits_with_colliding_indices():
    """Entries that name the same place: the last one is written and gets the gradient,
    as the CPU's serial scatter; the same for indices a max pool returned."""
    g = torch.Generator().manual_seed(3)
    for shape, output_size in (((2, 3, 4, 5), [7, 9]), ((2, 3, 6), [11]),
                               ((1, 2, 2, 3, 2), [3, 5, 4])):
        plane = int(np.prod(output_size))
        y = torch.randn(shape, generator=g)
        indices = torch.randint(0, plane, shape, generator=g)
        indices.view(-1)[1::3] = indices.view(-1)[0]  # many entries, one place
        window = sliding(len(output_size), 2, 2, 0, 0, 1, False)
        out = cpu("max_unpool")(y, indices, window, output_size)
        same_bits(triton_impl("max_unpool")(on_device(y), on_device(indices), window,
                                            output_size), out)
        dout = torch.randn(out.shape, generator=g)
        same_bits(triton_impl("max_unpool_backward")(on_device(dout), on_device(indices),
                                                     window),
                  cpu("max_unpool_backward")(dout, indices, window))
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 63\)"):
        triton_impl("max_unpool")(on_device(torch.zeros(1, 1, 2, 2)),
                                  on_device(torch.full((1, 1, 2, 2), 63)),
                                  sliding(2, 2, 2, 0, 0, 1, False), [7, 9])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32, torch.int64])
def test_integer_max_pooling_gives_the_cpu_bits(dtype):
    """Integers are compared as int64 (float32 would round int64s beyond 2**24 together
    and pick the wrong winner): values, winners and indices equal the CPU's."""
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max, (2, 3, 7, 9), dtype=torch.int64,
                      generator=torch.Generator().manual_seed(8)).to(dtype)
    if dtype == torch.int64:  # the maxima of a plane, neighbours float32 cannot tell apart
        x[0, 0] = 0
        x[0, 0, 0, :3] = torch.tensor([2**40 + 1, 2**40 + 3, 2**40 + 2])
    for window in (sliding(2, 3, 2, 1, 1, 1, False), sliding(2, 2, 2, 0, 0, 1, True),
                   _ops.adaptive_window((3, 4))):
        for _, xs in layouts(x):
            y, winners = cpu("max_pool")(xs, window, "first")
            got_y, got_winners = triton_impl("max_pool")(on_device(xs), window, "first")
            same_bits(got_y, y)
            same_bits(got_winners, winners)
            same_bits(triton_impl("max_pool_values")(on_device(xs), window), y)
            same_bits(triton_impl("max_pool_indices")(got_winners, window, list(xs.shape)),
                      cpu("max_pool_indices")(winners, window, list(xs.shape)))


def test_the_dispatch_chooses_one_triton_kernel_per_pass():
    """The Triton dispatch's choices, by pass and by whether the winners are kept; an
    unknown pass is a ValueError naming the known ones."""
    plan = geometry.sliding_plan((8, 8), (2, 2), (2, 2), (1, 1), ((0, 0), (0, 0)), False)
    expected = {("max", "forward", False): "triton.max_values_forward",
                ("max", "forward", True): "triton.max_forward",
                ("max", "backward", False): "triton.max_backward",
                ("max", "gather", False): "triton.max_gather",
                ("max", "indices", False): "triton.max_indices",
                ("avg", "forward", False): "triton.avg_forward",
                ("global_avg", "backward", False): "triton.avg_backward",
                ("lp", "backward", False): "triton.lp_backward",
                ("max", "split", False): "triton.max_split_backward",
                ("unpool", "backward", False): "triton.unpool_gather",
                ("fractional", "forward", False): "triton.fractional_forward",
                ("fractional", "backward", False): "triton.fractional_backward",
                ("fractional", "indices", False): "triton.fractional_indices",
                ("blur", "forward", False): "triton.blur_forward",
                ("blur", "winners", False): "triton.blur_winners",
                ("blur", "backward", False): "triton.blur_backward",
                ("circular", "pad", False): "triton.circular_pad",
                ("circular", "fold", False): "triton.circular_fold"}
    for (op, direction, record), name in expected.items():
        kernel = dispatch.choose(op, direction, plan, record=record)
        assert kernel.name == name
        assert kernel.records == (name in ("triton.max_forward",
                                           "triton.fractional_forward"))
    assert dispatch.names("max", "forward") == ["triton.max_values_forward",
                                                "triton.max_forward"]
    with pytest.raises(ValueError, match="no Triton kernel for op 'unpool', pass 'split'; known"):
        dispatch.choose("unpool", "split", plan)


def run_script(script: str, interpreter: bool) -> subprocess.CompletedProcess:
    """``script`` in a Python process of its own, with or without Triton's interpreter
    (which is fixed when Triton is first imported, so it cannot change in this one)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpreter:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)


def printed_json(done: subprocess.CompletedProcess):
    """The JSON a script printed last, once it has exited cleanly."""
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# Compiles each kernel for an H100 (sm_90) with Triton's own compiler, which needs no
# GPU, in a process without the interpreter; prints per variant what the PTX holds.
COMPILE_SCRIPT = r"""
import inspect, json
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from poolgrad.torch.triton import blend as B, kernels as K, power_mean as G, weighted as WK
from poolgrad.torch.triton import blur as BL, fractional as FR, polyphase as PP

# the tuples: each axis's (L, O, K, S, P, A, DIL, N), each tensor's 5 strides
STRIDES = {"xs", "ys", "gs", "ps", "rs", "ss", "outs", "ts", "ds"}

def signature(fn, pointers, constants, integers):
    sig = {}
    for name in inspect.signature(fn.fn).parameters:
        if name in constants:
            sig[name] = "constexpr"
        elif name in ("axes", "blurs"):
            sig[name] = ((integers,) * 8,) * 3
        elif name in STRIDES:
            sig[name] = (integers,) * 5
        elif name in ("sizes", "steps", "comps", "counts", "ws", "fs", "padded", "befores",
                      "copies"):  # per-axis triples
            sig[name] = (integers,) * 3
        else:
            sig[name] = pointers.get(name, integers)
    return sig

f32, bf16 = "*fp32", "*bf16"
cases = {
    "max_forward bf16 channels-last i64": (K.max_forward, {"x": bf16, "y": bf16, "pos": "*u8"},
        dict(ADAPTIVE=False, CHANNELS_LAST=True, RECORD=True, ACC=tl.float32, BLOCK=256), "i64"),
    "max_forward i64 values": (K.max_forward, {"x": "*i64", "y": "*i64", "pos": "*i64"},
        dict(ADAPTIVE=False, CHANNELS_LAST=False, RECORD=False, ACC=tl.int64, BLOCK=256), "i32"),
    "max_forward f16 adaptive values": (K.max_forward, {"x": "*fp16", "y": "*fp16", "pos": "*fp16"},
        dict(ADAPTIVE=True, CHANNELS_LAST=False, RECORD=False, ACC=tl.float32, BLOCK=256), "i32"),
    "max_backward bf16 u16": (K.max_backward, {"dy": bf16, "pos": "*u16", "dx": bf16},
        dict(ADAPTIVE=False, CHANNELS_LAST=False, ACC=tl.float32, BLOCK=256), "i32"),
    "max_gather indices": (K.max_gather, {"src": "*u8", "pos": "*u8", "out": "*i64"},
        dict(ADAPTIVE=False, CHANNELS_LAST=True, INDICES=True, BLOCK=256), "i64"),
    "max_gather values": (K.max_gather, {"src": f32, "pos": "*u8", "out": f32},
        dict(ADAPTIVE=True, CHANNELS_LAST=False, INDICES=False, BLOCK=256), "i32"),
    "avg_forward f32": (K.avg_forward, {"x": f32, "y": f32},
        dict(ADAPTIVE=False, CHANNELS_LAST=True, MODE=0, ACC=tl.float32, BLOCK=256), "i32"),
    "avg_forward f64 override": (K.avg_forward, {"x": "*fp64", "y": "*fp64"},
        dict(ADAPTIVE=True, CHANNELS_LAST=False, MODE=2, ACC=tl.float64, BLOCK=256), "i64"),
    "avg_backward bf16": (K.avg_backward, {"dy": bf16, "dx": bf16},
        dict(ADAPTIVE=False, CHANNELS_LAST=False, MODE=1, ACC=tl.float32, BLOCK=256), "i32"),
    "lp_forward p": (K.lp_forward, {"x": f32, "y": f32, "exponents": "*fp64"},
        dict(ADAPTIVE=False, CHANNELS_LAST=False, P_KIND=0, ACC=tl.float64, BLOCK=256), "i32"),
    "lp_forward f64": (K.lp_forward, {"x": "*fp64", "y": "*fp64", "exponents": "*fp64"},
        dict(ADAPTIVE=False, CHANNELS_LAST=False, P_KIND=0, ACC=tl.float64, BLOCK=256), "i32"),
    "lp_backward 2": (K.lp_backward, {"x": bf16, "y": bf16, "dy": bf16, "dx": bf16,
        "exponents": "*fp32"},
        dict(ADAPTIVE=True, CHANNELS_LAST=True, P_KIND=2, ACC=tl.float32, BLOCK=256), "i32"),
    "max_tie_count": (K.max_tie_count, {"x": f32, "y": f32, "ties": f32},
        dict(ADAPTIVE=False, CHANNELS_LAST=False, ACC=tl.float32, BLOCK=256), "i32"),
    "max_split_backward": (K.max_split_backward, {"x": f32, "y": f32, "dy": f32, "ties": f32,
        "pos": "*u8", "dx": f32}, dict(ADAPTIVE=False, CHANNELS_LAST=True, ACC=tl.float32,
        BLOCK=256), "i32"),
    "gem_forward adaptive": (G.gem_forward, {"x": bf16, "y": bf16, "power": "*fp64",
        "clamp": "*fp32"}, dict(ADAPTIVE=True, CHANNELS_LAST=False, ACC=tl.float32, BLOCK=256),
        "i32"),
    "gem_backward": (G.gem_backward, {"x": f32, "y": f32, "dy": f32, "power": "*fp32",
        "clamp": "*fp64", "dx": f32}, dict(ADAPTIVE=False, CHANNELS_LAST=True, ACC=tl.float64,
        BLOCK=256), "i32"),
    "gem_p_terms f64": (G.gem_p_terms, {"x": "*fp64", "y": "*fp64", "dy": "*fp64",
        "power": "*fp64", "clamp": "*fp64", "terms": "*fp64"}, dict(ADAPTIVE=False,
        CHANNELS_LAST=False, ACC=tl.float64, BLOCK=256), "i64"),
    "weighted_forward soft bf16": (WK.weighted_forward, {"x": bf16, "y": bf16, "norm": f32},
        dict(ADAPTIVE=False, CHANNELS_LAST=True, KIND=0, ACC=tl.float32, BLOCK=256), "i32"),
    "weighted_backward self": (WK.weighted_backward, {"x": f32, "y": f32, "norm": f32,
        "dy": f32, "dx": f32}, dict(ADAPTIVE=False, CHANNELS_LAST=False, KIND=1,
        ACC=tl.float32, BLOCK=256), "i32"),
    "weighted_backward soft f64": (WK.weighted_backward, {"x": "*fp64", "y": "*fp64",
        "norm": "*fp64", "dy": "*fp64", "dx": "*fp64"}, dict(ADAPTIVE=False,
        CHANNELS_LAST=True, KIND=0, ACC=tl.float64, BLOCK=256), "i64"),
    "stochastic_sample": (WK.stochastic_sample, {"x": f32, "seed": "*i64", "y": f32,
        "pos": "*u8"}, dict(ADAPTIVE=False, CHANNELS_LAST=False, ACC=tl.float32, BLOCK=256),
        "i32"),
    "blend_forward gated bf16": (B.blend_forward, {"x": bf16, "weights": f32, "y": bf16},
        dict(ADAPTIVE=False, CHANNELS_LAST=True, KIND=1, ACC=tl.float32, BLOCK=256), "i32"),
    "blend_backward mixed": (B.blend_backward, {"x": f32, "dy": f32, "weights": "*fp64",
        "dx": f32}, dict(ADAPTIVE=False, CHANNELS_LAST=False, KIND=0, ACC=tl.float32,
        BLOCK=256), "i32"),
    "blend_weight_terms gated f64": (B.blend_weight_terms, {"x": "*fp64", "dy": "*fp64",
        "weights": "*fp64", "terms": "*fp64"}, dict(ADAPTIVE=False, CHANNELS_LAST=True,
        KIND=1, ACC=tl.float64, BLOCK=256), "i64"),
    "phase_norm_partials l2 bf16": (PP.phase_norm_partials, {"x": bf16, "partials": "*fp64"},
        dict(NORM=0, BLOCK=256), "i32"),
    "phase_norm_partials max f32 i64": (PP.phase_norm_partials, {"x": f32,
        "partials": "*fp64"}, dict(NORM=2, BLOCK=256), "i64"),
    "phase_move gather": (PP.phase_move, {"src": f32, "phases": "*i64", "dst": f32},
        dict(SCATTER=False, BLOCK=256), "i32"),
    "phase_move scatter f64 i64": (PP.phase_move, {"src": "*fp64", "phases": "*i64",
        "dst": "*fp64"}, dict(SCATTER=True, BLOCK=256), "i64"),
    "fractional_forward bf16 channels-last": (FR.fractional_forward, {"x": bf16,
        "starts": "*i64", "lengths": "*i64", "y": bf16, "pos": "*u8"}, dict(EXT_D=1, EXT_H=3,
        EXT_W=3, CHANNELS_LAST=True, ACC=tl.float32, BLOCK=256), "i32"),
    "fractional_backward f32": (FR.fractional_backward, {"dy": f32, "pos": "*u16",
        "starts": "*i64", "first": "*i64", "last": "*i64", "dx": f32},
        dict(EXT_H=2, EXT_W=3, CHANNELS_LAST=False, ACC=tl.float32, BLOCK=256), "i64"),
    "fractional_indices": (FR.fractional_indices, {"pos": "*u8", "starts": "*i64",
        "indices": "*i64"}, dict(EXT_H=2, EXT_W=2, CHANNELS_LAST=True,
        BLOCK=256), "i32"),
    "blur_forward max bf16 channels-last": (BL.blur_forward, {"x": bf16, "filters": f32,
        "boxes": f32, "y": bf16}, dict(PRE=1, MODE=1, CHANNELS_LAST=True, ACC=tl.float32,
        BLOCK=256), "i32"),
    "blur_forward avg f64 circular": (BL.blur_forward, {"x": "*fp64", "filters": "*fp64",
        "boxes": "*fp64", "y": "*fp64"}, dict(PRE=2, MODE=3, CHANNELS_LAST=False,
        ACC=tl.float64, BLOCK=256), "i64"),
    "blur_winners": (BL.blur_winners, {"x": f32, "pos": "*u8"}, dict(CHANNELS_LAST=False,
        ACC=tl.float32, BLOCK=256), "i32"),
    "blur_backward avg replicate": (BL.blur_backward, {"dy": f32, "filters": f32,
        "boxes": f32, "g": f32}, dict(PRE=2, MODE=2, CHANNELS_LAST=True, ACC=tl.float32,
        BLOCK=256), "i32"),
    "blur_backward max zeros f64": (BL.blur_backward, {"dy": "*fp64", "filters": "*fp64",
        "boxes": "*fp64", "g": "*fp64"}, dict(PRE=1, MODE=0, CHANNELS_LAST=False,
        ACC=tl.float64, BLOCK=256), "i64"),
    "circular_pad bf16": (PP.circular_pad, {"x": bf16, "out": bf16},
        dict(CHANNELS_LAST=True, BLOCK=256), "i32"),
    "circular_fold f32": (PP.circular_fold, {"dy": f32, "dx": f32},
        dict(CHANNELS_LAST=False, ACC=tl.float32, BLOCK=256), "i64"),
    "unpool_claim": (K.unpool_claim, {"indices": "*i64", "owner": "*i32"}, dict(BLOCK=256), "i64"),
    "unpool_place": (K.unpool_place, {"values": bf16, "indices": "*i64", "owner": "*i32",
        "out": bf16, "written": "*u8"}, dict(WRITE_VALUES=True, BLOCK=256), "i32"),
    "unpool_gather": (K.unpool_gather, {"dout": f32, "indices": "*i64", "written": "*u8",
        "dy": f32}, dict(BLOCK=256), "i32"),
}
report = {}
for name, (fn, pointers, constants, integers) in cases.items():
    try:
        source = ASTSource(fn=fn, signature=signature(fn, pointers, constants, integers),
                           constexprs=constants)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
        ptx = compiled.asm["ptx"]
        report[name] = {"ok": True, "atomics": "atom." in ptx, "div_rn": "div.rn.f32" in ptx,
                        "approx_div": "div.full.f32" in ptx or "div.approx.f32" in ptx,
                        "approx_power": "ex2.approx" in ptx or "lg2.approx" in ptx}
    except Exception as error:
        report[name] = {"ok": False, "error": f"{type(error).__name__}: {str(error)[-600:]}"}
print(json.dumps(report))
"""


def test_every_kernel_compiles_for_an_h100_without_atomics_in_the_backwards():
    """Triton's compiler (no GPU needed) turns each kernel into sm_90 PTX: the
    interpreter does not check the types a GPU build checks (a loop-carried int64 tap
    number and float64's IEEE division failed here before). The backwards hold no
    atomics, and the float32 divisions are the correctly rounded ones."""
    done = run_script(COMPILE_SCRIPT, interpreter=False)
    if "No module named" in done.stderr or "GPUTarget" in done.stderr:
        pytest.skip(f"this Triton cannot compile for CUDA here: {done.stderr[-300:]}")
    report = printed_json(done)
    failed = {name: r["error"] for name, r in report.items() if not r["ok"]}
    assert not failed, failed
    for name in ("max_backward bf16 u16", "avg_backward bf16", "lp_backward 2",
                 "max_split_backward", "unpool_gather", "max_gather values", "gem_backward",
                 "gem_p_terms f64", "weighted_backward self", "weighted_backward soft f64",
                 "blend_backward mixed", "blend_weight_terms gated f64",
                 "phase_move scatter f64 i64", "phase_norm_partials l2 bf16",
                 "fractional_backward f32", "blur_backward avg replicate", "circular_fold f32",
                 "blur_backward max zeros f64"):
        assert not report[name]["atomics"], name
    assert report["unpool_claim"]["atomics"]  # the claim is the one atomic (a maximum)
    for name in ("avg_forward f32", "avg_backward bf16", "max_split_backward"):
        assert report[name]["div_rn"] and not report[name]["approx_div"], name
    # float32 data raised in float64, as launched (launch._power_dtype): no approximate
    # exp2, log2 or division, which Triton gives float32 math on a GPU
    for name in ("lp_forward p", "gem_backward"):
        assert not report[name]["approx_power"] and not report[name]["approx_div"], name
    assert report["gem_forward adaptive"]["approx_power"]  # bfloat16: float32's forms


def test_kernels_unpack_one_tuple_level_per_assignment():
    """Triton 3.6 (the H200 machine's, 2026-11-28) refused every launch of a kernel
    whose code or helpers assign to a nested tuple (``(a, b), c = t``): the walk that
    hashes a kernel's dependencies puts each target in a set, and a nested one is a
    list (TypeError: unhashable type: 'list'). CI's Triton takes them, so the rule is
    checked in the source; on a GPU every kernel's dependency walk runs too."""
    import ast
    import importlib
    import inspect
    import pkgutil
    import textwrap

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from poolgrad.torch import triton as kernels
    nested, walked = [], 0
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"{kernels.__name__}.{info.name}")
        for name, value in vars(module).items():
            if not (isinstance(value, (JITFunction, InterpretedFunction))
                    and value.fn.__module__ == module.__name__):
                continue
            if isinstance(value, JITFunction):  # compiled, not interpreted: on a GPU
                assert value.cache_key  # the walk that failed
            walked += 1
            tree = ast.parse(textwrap.dedent(inspect.getsource(value.fn)))
            nested += [f"{info.name}.{name} line {node.lineno}" for node in ast.walk(tree)
                       if isinstance(node, (ast.Assign, ast.For))
                       for target in (node.targets if isinstance(node, ast.Assign)
                                      else [node.target])
                       if isinstance(target, ast.Tuple)
                       and any(isinstance(e, (ast.Tuple, ast.List)) for e in target.elts)]
    assert walked > 30 and not nested, nested


def test_lp_and_gem_raise_float32_in_float64():
    """As the CPU kernels do: on a GPU, float32 arithmetic would take Triton's
    approximate exp2, log2 and division (the compile test checks the PTX)."""
    from poolgrad.torch.triton import launch
    for dtype, power in ((torch.float32, torch.float64), (torch.float64, torch.float64),
                         (torch.bfloat16, torch.float32), (torch.float16, torch.float32)):
        assert launch._power_dtype(torch.empty(0, dtype=dtype)) == power
        exponents = launch._exponents_for(2.5, torch.empty(0, dtype=dtype))
        assert exponents.dtype == power and exponents[1].item() == 0.4 if power == (
            torch.float64) else exponents.dtype == power


# Registers the CUDA implementations as the CPU kernels of the ops, in a process of its
# own under the interpreter, and checks gradients through poolgrad.torch's functions.
GRADCHECK_SCRIPT = r"""
import json
import torch
from poolgrad.torch import _cuda, _kind_ops, _ops
import poolgrad.torch as pgt
calls = {}
def counted(name, implementation):
    def run(*args):
        calls[name] = calls.get(name, 0) + 1
        return implementation(*args)
    return run
for name, implementation in _cuda.IMPLEMENTATIONS.items():
    op = getattr(_kind_ops, name, None) or getattr(_ops, name)
    _ops.implement(op, "cpu")(counted(name, implementation))
x = torch.randn(1, 1, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0),
                requires_grad=True)
p = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
cases = {
    "max_pool2d": (lambda t: pgt.max_pool2d(t, 3, 2, 1), True),
    "lp_pool2d": (lambda t: pgt.lp_pool2d(t, 3.0, 2, 2), True),
    "avg_pool2d": (lambda t: pgt.avg_pool2d(t, 3, 2, 1, count_include_pad=False), False),
    "max_pool2d split": (lambda t: pgt.max_pool2d(t.round(), 2, 1, ties="split"), False),
    "max_unpool2d": (lambda t: pgt.max_unpool2d(*pgt.max_pool2d(t, 2, 2, return_indices=True),
                                                2, 2), False),
    "gem_pool learned p": (lambda t, q: pgt.gem_pool(t.abs(), q, 2, 1, 0.05), False),
    "soft_pool": (lambda t: pgt.soft_pool(t, 3, 2, 1), True),
    "stochastic_pool evaluation": (lambda t: pgt.stochastic_pool(t.abs() + 0.1, 2, 1,
                                                                 training=False), False),
    "stochastic_pool training": (lambda t: pgt.stochastic_pool(t.abs(), 2, 1, generator=3),
                                 False),
    "mixed_pool learned alpha": (lambda t, a: pgt.mixed_pool(t, 3, 2, 1, a), False),
    "gated_pool": (lambda t: pgt.gated_pool(t, torch.tensor([[0.5, -1.0], [2.0, 0.3]],
                                                             dtype=torch.float64), 2, 1),
                   False),
    "aps_pool": (lambda t: pgt.aps_pool(t, 2), True),
    "fractional_max_pool": (lambda t: pgt.fractional_max_pool(
        t, 2, (2, 3), samples=torch.tensor([[[0.3, 0.7]]], dtype=torch.float64)), True),
    "aps_pool given phases": (lambda t: pgt.aps_pool(t, (1, 2), phase=torch.tensor([1])),
                              False),
    "blur_pool": (lambda t: pgt.blur_pool(t, 2, 3, "circular", 1), False),
    "max_blur_pool": (lambda t: pgt.max_blur_pool(t, 2, 2, 3, "reflect", 1), True),
    "avg_blur_pool": (lambda t: pgt.avg_blur_pool(t, 2, 1, 2, "zeros", 1), False),
    "max_aps_pool": (lambda t: pgt.max_aps_pool(t, 2, 2, 3), False),
}
checks = {}
for name, (fn, second) in cases.items():
    inputs = (x, p) if "learned" in name else (x,)
    # fast mode (a random projection of the Jacobian, v^T J u): the full Jacobians are
    # checked on the CPU kernels, and here each launch is interpreted (45 s -> 9.5 s)
    checks[name] = [torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5,
                                             fast_mode=True),
                    torch.autograd.gradgradcheck(fn, inputs, eps=1e-6, atol=1e-5,
                                                 fast_mode=True) if second else True]
print(json.dumps({"checks": checks, "calls": calls}))
"""


def test_gradients_through_the_public_functions_on_the_triton_kernels():
    """gradcheck (and gradgradcheck for max, Lp, SoftPool, APS, fractional max and
    max-blur; GeM's p and mixed pooling's alpha too), in fast mode, through
    poolgrad.torch's functions and autograd formulas with every op running its CUDA
    implementation, on CPU tensors under the interpreter: float64, 1x1x4x5."""
    result = printed_json(run_script(GRADCHECK_SCRIPT, interpreter=True))
    assert all(all(checks) for checks in result["checks"].values()), result["checks"]
    used = set(result["calls"])
    # the values-only ops serve inference, where no gradient is taken
    assert used == set(_cuda.IMPLEMENTATIONS) - {"max_pool_values", "weighted_pool_values",
                                                 "blur_pool_values"}, used


def test_tensors_on_two_devices_are_refused():
    x = torch.zeros(1, 1, 4, 4)
    window = sliding(2, 2, 2, 0, 0, 1, False)
    _, winners = triton_impl("max_pool")(on_device(x), window, "first")
    with pytest.raises(ValueError, match="all tensors must be on one device, got"):
        triton_impl("max_pool_backward")(torch.zeros(1, 1, 2, 2, device="meta"), winners,
                                         window, [1, 1, 4, 4])


def test_inputs_are_not_modified():
    x = special((2, 3, 7, 9), torch.float32, 5)
    before = x.clone()
    window = sliding(2, 3, 2, 1, 1, 1, False)
    y, winners = triton_impl("max_pool")(on_device(x), window, "first")
    triton_impl("max_pool_backward")(on_device(torch.ones_like(y)), winners, window,
                                     list(x.shape))
    triton_impl("avg_pool")(on_device(x), window, True, None)
    same_bits(x, before)


# ------------------------------------------------------------------ on a CUDA device


@needs_cuda
def test_cuda_tensors_train_through_the_public_api_deterministically():
    """poolgrad.torch on CUDA: the CPU's values and gradients, the same bits on every
    run, under torch.use_deterministic_algorithms."""
    import poolgrad.torch as pgt
    x = special((4, 8, 17, 19), torch.float32, 11)
    layers = [pgt.MaxPool2d(3, 2, 1), pgt.AvgPool2d(3, 2, 1), pgt.AdaptiveMaxPool2d((5, 4)),
              pgt.AdaptiveAvgPool2d(1), pgt.LPPool2d(2, 3, 2)]
    torch.use_deterministic_algorithms(True)
    try:
        for layer in layers:
            grads = []
            for _ in range(2):
                xc = x.cuda().nan_to_num(0.0, 3.0, -3.0).requires_grad_()
                y = layer(xc)
                y.backward(torch.ones_like(y))
                grads.append(xc.grad.cpu())
            same_bits(grads[0], grads[1])
            xr = x.nan_to_num(0.0, 3.0, -3.0).requires_grad_()
            yr = layer(xr)
            yr.backward(torch.ones_like(yr))
            torch.testing.assert_close(y.detach().cpu(), yr.detach(), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(grads[0], xr.grad, rtol=1e-6, atol=1e-6)
    finally:
        torch.use_deterministic_algorithms(False)


@needs_cuda
def test_cuda_ops_compile_with_fullgraph_and_capture_in_a_cuda_graph():
    import poolgrad.torch as pgt
    x = torch.randn(4, 8, 16, 16, device="cuda")
    pool = pgt.MaxPool2d(2, 2)
    compiled = torch.compile(pool, fullgraph=True)
    same_bits(compiled(x), pool(x))
    static = x.clone()
    pool(static)  # warm up (kernel compile) before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pool(static)
    static.copy_(x * 2)
    graph.replay()
    same_bits(out, pool(x * 2))


@triton.jit
def _twice(v):
    return v + v


@triton.jit
def _doubled_squares(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    v = tl.load(src + offs, mask=live)
    tl.store(dst + offs, _twice(v * v) + _twice(v), mask=live)


@triton.jit
def _zeros_plus_twice(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < n
    v = tl.load(src + offs, mask=live)
    # tl.zeros is a jitted helper whose module holds tl.core, which the kernel's
    # globals (tl) do not
    tl.store(dst + offs, tl.zeros((BLOCK,), tl.float32) + _twice(v), mask=live)


@pytest.mark.skipif(CUDA, reason="the interpreter's patches (no GPU)")
@pytest.mark.parametrize("kernel,patches,expected", [
    # the launch, then none of the helpers' calls (two per program)
    (_doubled_squares, 1, lambda src: 2 * src * src + 2 * src),
    # the launch, then tl.zeros's first call (tl.core), then none
    (_zeros_plus_twice, 2, lambda src: 2 * src)])
def test_the_interpreter_patches_the_language_once_per_launch(monkeypatch, kernel, patches,
                                                              expected):
    """tests/triton_interpreter.py: a launch patches each language module once, its
    helpers' calls reuse those patches, and the kernel computes what it computes with a
    patch per helper call."""
    from triton.runtime import interpreter

    assert interpreter._patch_lang.skips_repeats
    real = interpreter._patch_lang.__wrapped__
    patched = []

    def counted(fn):
        patched.append(fn)
        return real(fn)

    src = torch.arange(-7.0, 9.0)
    results = []
    for wrapped in (True, False):
        patched.clear()
        if wrapped:  # the patches it makes
            monkeypatch.setattr(interpreter._patch_lang, "__wrapped__", counted)
        else:  # every call Triton makes, each patching
            monkeypatch.setattr(interpreter, "_patch_lang", counted)
        dst = torch.empty_like(src)
        kernel[(4,)](src, dst, src.numel(), BLOCK=4)
        results.append((dst, len(patched)))
    (skipping, made), (every, calls) = results
    assert made == patches and calls == 1 + 4 * 2  # the launch, then each program's helpers
    same_bits(skipping, every)
    same_bits(skipping, expected(src))
