"""Adaptive polyphase sampling (APS): exact invariance to circular shifts, against the
paper's definition written apart from the kernels, the given phase, the gradient's
routing, and bad input."""

import itertools
import math

import numpy as np
import pytest

import poolgrad as pg
from tests.test_gradcheck import numerical_vjp


def channels_last(x):
    """A copy of ``x`` (N, C, *spatial) stored channels-last."""
    ndim = x.ndim - 2
    return np.ascontiguousarray(np.moveaxis(x, 1, -1)).transpose(0, ndim + 1,
                                                                 *range(1, ndim + 1))


def aps_reference(x, stride, norm="l2"):
    """The definition: pad circularly to a multiple of the stride, split into the
    polyphase components (row-major phases), take each example's component of largest
    norm (the first on a tie)."""
    ndim = x.ndim - 2
    stride = (stride,) * ndim if isinstance(stride, int) else stride
    padded = x
    for axis, (length, step) in enumerate(zip(x.shape[2:], stride, strict=True)):
        padded = np.take(padded, np.arange(-(-length // step) * step) % length, axis=2 + axis)
    components = [padded[(slice(None), slice(None)) + tuple(
        slice(a, None, s) for a, s in zip(offsets, stride, strict=True))]
        for offsets in itertools.product(*(range(s) for s in stride))]
    measure = {"l2": lambda c: np.sum(c.astype(np.float64) ** 2),
               "l1": lambda c: np.sum(np.abs(c.astype(np.float64))),
               "max": lambda c: np.max(np.abs(c.astype(np.float64)))}[norm]
    phases = np.array([int(np.argmax([measure(c[n]) for c in components]))
                       for n in range(x.shape[0])])
    y = np.stack([components[p][n] for n, p in enumerate(phases)])
    return y, phases


CASES = [((2, 3, 8, 10), 2), ((3, 2, 9), 3), ((2, 2, 4, 6, 4), (2, 3, 2)),
         ((2, 3, 7, 5), 2), ((1, 4, 5, 6), (1, 3)), ((2, 1, 3, 2), 4)]


@pytest.mark.parametrize("norm", ["l2", "l1", "max"])
@pytest.mark.parametrize("shape, stride", CASES)
def test_aps_pool_is_the_definition(shape, stride, norm):
    """Odd sizes (padded circularly), per-dim strides, a stride above the size, 1-3
    dims; both layouts give the same bits."""
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    expected, phases = aps_reference(x, stride, norm)
    y, chosen = pg.aps_pool(x, stride, norm=norm, return_indices=True)
    np.testing.assert_array_equal(chosen, phases)
    assert chosen.dtype == np.int64 and y.dtype == np.float32
    np.testing.assert_array_equal(y, expected)
    stored = channels_last(x)
    y_cl = pg.aps_pool(stored, stride, norm=norm)
    np.testing.assert_array_equal(y_cl, expected)
    assert np.moveaxis(y_cl, 1, -1).flags.c_contiguous  # channels-last in and out


@pytest.mark.parametrize("shape, stride", [((3, 4, 8, 6), 2), ((4, 3, 12), 3),
                                           ((2, 2, 4, 6, 2), (2, 3, 2))])
def test_every_circular_shift_shifts_the_output_and_changes_no_value(shape, stride):
    """The paper's promise, bit for bit: for sizes that are multiples of the stride,
    each example's output under any circular shift of x is a circular shift of its
    unshifted output (by the shift over the stride, rounded down or up by the phase)."""
    x = np.random.default_rng(2).standard_normal(shape)
    ndim = len(shape) - 2
    y = pg.aps_pool(x, stride)
    rolls = list(itertools.product(*(range(m) for m in y.shape[2:])))
    for shift in itertools.product(*(range(length) for length in shape[2:])):
        shifted = pg.aps_pool(np.roll(x, shift, axis=tuple(range(2, 2 + ndim))), stride)
        for n in range(shape[0]):
            assert any(np.array_equal(shifted[n], np.roll(y[n], r, tuple(range(1, 1 + ndim))))
                       for r in rolls), (shift, n)


def test_plain_subsampling_is_not_invariant_but_aps_is():
    """The contrast that motivates APS: x[::2] of a one-pixel shift is another signal."""
    x = np.array([[[0.0, 3.0, 0.0, 2.0, 0.0, 1.0]]])
    shifted = np.roll(x, 1, axis=2)
    assert not np.array_equal(np.sort(shifted[..., ::2]), np.sort(x[..., ::2]))
    np.testing.assert_array_equal(pg.aps_pool(x, 2), [[[3.0, 2.0, 1.0]]])
    np.testing.assert_array_equal(pg.aps_pool(shifted, 2), [[[1.0, 3.0, 2.0]]])


def test_ties_go_to_the_lowest_phase_and_nan_wins():
    x = np.array([[[1.0, -1.0, 2.0, 2.0]], [[0.0, 0.0, 0.0, 0.0]], [[1.0, np.nan, 5.0, 0.0]]])
    y, phases = pg.aps_pool(x, 2, return_indices=True)
    np.testing.assert_array_equal(phases, [0, 0, 1])  # equal norms: phase 0
    assert np.isnan(y[2, 0, 0])
    for norm in ("l1", "max"):
        np.testing.assert_array_equal(pg.aps_pool(x, 2, norm=norm, return_indices=True)[1],
                                      [0, 0, 1])


def test_a_given_phase_is_taken_and_a_shortcut_follows_the_main_path():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 2, 6, 6))
    np.testing.assert_array_equal(pg.aps_pool(x, 2, phase=1), x[:, :, 0::2, 1::2])
    main, phases = pg.aps_pool(x, 2, return_indices=True)
    shortcut = pg.aps_pool(2 * x[:, :1] + 1, 2, phase=phases)  # another tensor, same phases
    for n, phase in enumerate(phases):
        a, b = divmod(int(phase), 2)
        np.testing.assert_array_equal(shortcut[n], 2 * x[n, :1, a::2, b::2] + 1)
        np.testing.assert_array_equal(main[n], x[n, :, a::2, b::2])


def test_unbatched_input_gives_one_phase():
    x = np.random.default_rng(4).standard_normal((3, 8))
    y, phase = pg.aps_pool(x, 2, spatial_dims=1, return_indices=True)
    assert y.shape == (3, 4) and phase.shape == ()
    np.testing.assert_array_equal(y, pg.aps_pool(x[None], 2)[0])
    np.testing.assert_array_equal(pg.aps_pool(x, 2, spatial_dims=1, phase=phase), y)


@pytest.mark.parametrize("shape, stride", [((2, 2, 5, 4), 2), ((2, 3, 7), 3)])
def test_the_gradient_goes_to_the_chosen_component(shape, stride):
    """Finite differences, the routing itself, and one small integer saved per
    example."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape)
    (y, phases), pullback = pg.vjp(pg.aps_pool, x, stride, return_indices=True)
    dy = rng.standard_normal(y.shape)
    dx = pullback(dy)
    np.testing.assert_allclose(dx, numerical_vjp(lambda v: pg.aps_pool(v, stride), x.copy(), dy),
                               rtol=1e-7, atol=1e-9)
    # the adjoint of the gather: <dy, y(x')> = <dx, x'> for any x' with the same phases
    other = rng.standard_normal(shape)
    np.testing.assert_allclose(np.sum(dy * pg.aps_pool(other, stride, phase=phases)),
                               np.sum(dx * other), rtol=1e-12)
    assert pullback.saved["phases"].dtype == np.uint8 and pullback.saved["phases"].size == 2
    assert np.count_nonzero(dx) == dy.size  # no position is written twice


def test_the_gradient_keeps_channels_last():
    x = channels_last(np.random.default_rng(6).standard_normal((2, 3, 6, 4)))
    y, pullback = pg.vjp(pg.aps_pool, x, 2)
    dx = pullback(channels_last(np.ones_like(y)))
    assert np.moveaxis(dx, 1, -1).flags.c_contiguous and dx.sum() == y.size


@pytest.mark.parametrize("call, error, message", [
    (lambda x: pg.aps_pool(x, 0), ValueError, "stride"),
    (lambda x: pg.aps_pool(x, 2, norm="l3"), ValueError, "norm must be one of l2, l1, max"),
    (lambda x: pg.aps_pool(x, 2, phase=4), ValueError, r"phase must be in \[0, 4\)"),
    (lambda x: pg.aps_pool(x, 2, phase=-1), ValueError, r"phase must be in \[0, 4\)"),
    (lambda x: pg.aps_pool(x, 2, phase=[0, 1, 2]), ValueError, r"one per example, shape \(2,\)"),
    (lambda x: pg.aps_pool(x, 2, phase=1.0), TypeError, "phase must be None, an int"),
    (lambda x: pg.aps_pool(x, 2, phase=True), TypeError, "phase must be None, an int"),
    (lambda x: pg.aps_pool(x, 2, return_indices=1), TypeError, "return_indices must be"),
    (lambda x: pg.aps_pool(x.astype(int), 2), TypeError, "float"),
])
def test_bad_input(call, error, message):
    x = np.zeros((2, 3, 4, 4))
    with pytest.raises(error, match=message):
        call(x)
    assert not x.any()


def test_component_count_and_shapes():
    x = np.zeros((1, 1, 5, 7, 3))
    assert pg.aps_pool(x, (2, 3, 1)).shape == (1, 1, 3, 3, 3)
    assert math.prod((2, 3, 1)) == 6
    assert pg.aps_pool(x, (2, 3, 1), phase=5).shape == (1, 1, 3, 3, 3)


# ----------------------------------------------------------------------- max_aps_pool


def circular_max_map(x, kernel):
    """The stride-1 max over ``kernel`` windows of x padded circularly (``k - 1`` in
    all, ``(k - 1) // 2`` before), by rolls."""
    ndim = x.ndim - 2
    result = np.full(x.shape, -np.inf)
    for offsets in itertools.product(*(range(k) for k in kernel)):
        shift = tuple((k - 1) // 2 - o for k, o in zip(kernel, offsets, strict=True))
        result = np.maximum(result, np.roll(x, shift, axis=tuple(range(2, 2 + ndim))))
    return result


def circular_blur(x):
    """The 3-tap binomial blur [1, 2, 1] / 4 along each spatial axis, circular."""
    for axis in range(2, x.ndim):
        x = (np.roll(x, 1, axis) + 2 * x + np.roll(x, -1, axis)) / 4
    return x


@pytest.mark.parametrize("shape, kernel, stride, blur", [
    ((2, 3, 8, 6), (2, 2), 2, False), ((2, 2, 7, 5), (3, 2), (2, 3), True),
    ((3, 2, 9), (3,), 3, True), ((1, 2, 4, 4, 6), (2, 2, 2), 2, False)])
def test_max_aps_pool_is_the_circular_max_then_aps(shape, kernel, stride, blur):
    x = np.random.default_rng(7).standard_normal(shape)
    mapped = circular_max_map(x, kernel)
    if blur:
        mapped = circular_blur(mapped)
    expected, phases = aps_reference(mapped, stride)
    y, chosen = pg.max_aps_pool(x, kernel, stride, 3 if blur else None, return_indices=True)
    np.testing.assert_array_equal(chosen, phases)
    np.testing.assert_allclose(y, expected, rtol=1e-15 if not blur else 1e-12)


@pytest.mark.parametrize("blur", [None, 3])
def test_max_aps_pool_is_invariant_to_every_circular_shift(blur):
    x = np.random.default_rng(8).standard_normal((2, 3, 6, 8))
    y = pg.max_aps_pool(x, 2, 2, blur)
    rolls = list(itertools.product(range(3), range(4)))
    for shift in itertools.product(range(6), range(8)):
        shifted = pg.max_aps_pool(np.roll(x, shift, axis=(2, 3)), 2, 2, blur)
        for n in range(2):
            assert any(np.array_equal(shifted[n], np.roll(y[n], r, (1, 2))) for r in rolls)


@pytest.mark.parametrize("blur", [None, 3])
def test_max_aps_pool_gradient(blur):
    """Finite differences (tie-free x), unbatched too, and the same phases given back."""
    rng = np.random.default_rng(9)
    x = rng.permutation(2 * 2 * 5 * 6).reshape(2, 2, 5, 6) / 7.0
    (y, phases), pullback = pg.vjp(pg.max_aps_pool, x, 2, 2, blur, return_indices=True)
    dy = rng.standard_normal(y.shape)
    np.testing.assert_allclose(
        pullback(dy), numerical_vjp(lambda v: pg.max_aps_pool(v, 2, 2, blur, phase=phases),
                                    x.copy(), dy), rtol=1e-6, atol=1e-7)
    single, one = pg.vjp(pg.max_aps_pool, x[0], 2, 2, blur, spatial_dims=2)
    np.testing.assert_array_equal(single, y[0])
    np.testing.assert_array_equal(one(dy[0]), pg.vjp(pg.max_aps_pool, x[:1], 2, 2, blur)[1](
        dy[:1])[0])


@pytest.mark.parametrize("call, error, message", [
    (lambda x: pg.max_aps_pool(x, 0), ValueError, "kernel_size"),
    (lambda x: pg.max_aps_pool(x, 2, 2, 9), ValueError, "filter_size"),
    (lambda x: pg.max_aps_pool(x, 2, norm="l0"), ValueError, "norm must be one of"),
])
def test_max_aps_pool_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call(np.zeros((2, 3, 4, 4)))


# -------------------------------------------------------------------------- lps_pool


def scorer(channels, hidden=5, seed=10):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((hidden, channels)), rng.standard_normal(hidden),
            rng.standard_normal(hidden))


def lps_reference(x, weights, stride, noise, temperature):
    """The paper's sampling written apart: each component's score, the mean over its
    positions of w2 . relu(W1 c + b1); softmax((s + g) / T) weights the components
    (``noise`` None: the hard choice)."""
    W1, b1, w2 = weights
    ndim = x.ndim - 2
    stride = (stride,) * ndim if isinstance(stride, int) else stride
    padded = x
    for axis, (length, step) in enumerate(zip(x.shape[2:], stride, strict=True)):
        padded = np.take(padded, np.arange(-(-length // step) * step) % length, axis=2 + axis)
    comps = np.stack([padded[(slice(None), slice(None)) + tuple(
        slice(a, None, s) for a, s in zip(offsets, stride, strict=True))]
        for offsets in itertools.product(*(range(s) for s in stride))], 1)
    flat = comps.reshape(*comps.shape[:3], -1)
    scores = np.array([[np.mean(w2 @ np.maximum(W1 @ flat[n, p] + b1[:, None], 0))
                        for p in range(comps.shape[1])] for n in range(x.shape[0])])
    if noise is None:
        return comps[np.arange(x.shape[0]), np.argmax(scores, 1)]
    logits = (scores + noise) / temperature
    weights = np.exp(logits - logits.max(1, keepdims=True))
    weights /= weights.sum(1, keepdims=True)
    return np.einsum("np,np...->n...", weights, comps)


@pytest.mark.parametrize("shape, stride", [((3, 4, 6, 5), 2), ((2, 3, 9), 3),
                                           ((2, 2, 4, 3, 4), (2, 1, 2))])
def test_lps_pool_is_the_definition(shape, stride):
    x = np.random.default_rng(11).standard_normal(shape)
    weights = scorer(shape[1])
    np.testing.assert_allclose(pg.lps_pool(x, weights, stride),
                               lps_reference(x, weights, stride, None, 1.0), rtol=1e-15)
    count = math.prod((stride,) * (len(shape) - 2) if isinstance(stride, int) else stride)
    noise = -np.log(-np.log(np.random.default_rng(4).random((shape[0], count))))
    np.testing.assert_allclose(
        pg.lps_pool(x, weights, stride, training=True, temperature=0.5, rng=4),
        lps_reference(x, weights, stride, noise, 0.5), rtol=1e-12)


def test_lps_pool_in_evaluation_takes_the_chosen_component_whatever_the_others_hold():
    """The hard choice is the chosen component itself: infinities in the others do not
    reach it (weighted by 0, they would give NaN), in NumPy and in poolgrad.torch."""
    x = np.random.default_rng(0).uniform(0.1, 2, (2, 3, 6, 6))
    x[0, 1, 1, 2], x[1, 0, 0, 1] = -np.inf, np.inf  # the first chosen, the second not
    weights = scorer(3)
    with np.errstate(invalid="ignore"):  # the scores of the infinite components
        y, phases = pg.lps_pool(x, weights, 2, return_indices=True)
        expected = lps_reference(x, weights, 2, None, 1.0)
    np.testing.assert_array_equal(y, expected)
    assert np.isinf(y).sum() == 1 and not np.isnan(y).any()
    torch = pytest.importorskip("torch")
    from poolgrad.torch import polyphase
    ty, tphases = polyphase.lps_pool(torch.from_numpy(x), tuple(map(torch.from_numpy, weights)),
                                     2, return_indices=True)
    np.testing.assert_array_equal(ty.numpy(), expected)
    np.testing.assert_array_equal(tphases.numpy(), phases)


def test_lps_pool_in_evaluation_is_invariant_to_every_circular_shift():
    x = np.random.default_rng(12).standard_normal((2, 3, 6, 4))
    weights = scorer(3)
    y = pg.lps_pool(x, weights, 2)
    rolls = list(itertools.product(range(3), range(2)))
    for shift in itertools.product(range(6), range(4)):
        shifted = pg.lps_pool(np.roll(x, shift, axis=(2, 3)), weights, 2)
        for n in range(2):
            assert any(np.array_equal(shifted[n], np.roll(y[n], r, (1, 2))) for r in rolls)


@pytest.mark.parametrize("training", [True, False])
def test_lps_pool_gradients(training):
    """dx and the scoring network's gradients against finite differences; in evaluation
    the weights get none and dx goes to the chosen component; seeded draws repeat."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 2, 4, 6))
    weights = scorer(2, hidden=4)
    options = {"training": training, "temperature": 0.7, "rng": 5}
    y, pullback = pg.vjp(pg.lps_pool, x, weights, 2, **options)
    np.testing.assert_array_equal(pg.lps_pool(x, weights, 2, **options), y)
    dy = rng.standard_normal(y.shape)
    dx, *grads = pullback(dy)
    np.testing.assert_allclose(dx, numerical_vjp(lambda v: pg.lps_pool(v, weights, 2, **options),
                                                 x.copy(), dy), rtol=1e-6, atol=1e-8)
    for index, grad in enumerate(grads):
        def vary(value, index=index):
            changed = list(weights)
            changed[index] = value
            return pg.lps_pool(x, tuple(changed), 2, **options)
        expected = numerical_vjp(vary, weights[index].copy(), dy)
        np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-8)
        assert training or not grad.any()
    np.testing.assert_array_equal(pullback(dy, params=False), dx)


def test_a_cold_softmax_is_the_hard_choice():
    x = np.random.default_rng(14).standard_normal((4, 3, 6, 6))
    weights = scorer(3)
    # at a temperature near 0 the mixture is the component of highest score + noise
    soft, noisy_phases = pg.lps_pool(x, weights, 2, training=True, temperature=1e-9, rng=0,
                                     return_indices=True)
    for n, phase in enumerate(noisy_phases):
        a, b = divmod(int(phase), 2)
        np.testing.assert_allclose(soft[n], x[n, :, a::2, b::2], rtol=1e-12)
    # and with the noise outweighed (scores scaled up), that of the evaluation's choice
    loud = (weights[0], weights[1], weights[2] * 1e9)
    _, phases = pg.lps_pool(x, loud, 2, return_indices=True)
    _, trained = pg.lps_pool(x, loud, 2, training=True, temperature=1e-9, rng=0,
                             return_indices=True)
    np.testing.assert_array_equal(trained, phases)


@pytest.mark.parametrize("call, error, message", [
    (lambda x: pg.lps_pool(x, scorer(2)), ValueError, r"W1 \(hidden, 3\)"),
    (lambda x: pg.lps_pool(x, scorer(3)[:2]), TypeError, r"weights must be \(W1, b1, w2\)"),
    (lambda x: pg.lps_pool(x, (np.full((2, 3), np.nan), np.ones(2), np.ones(2))), ValueError,
     "finite"),
    (lambda x: pg.lps_pool(x, scorer(3), temperature=0), ValueError, "temperature"),
    (lambda x: pg.lps_pool(x, scorer(3), training=1), TypeError, "training and return"),
])
def test_lps_pool_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call(np.zeros((2, 3, 4, 4)))


@pytest.mark.parametrize("before, after, sizes", [((0, 1), (1, 0), (5, 4)), ((2,), (3,), (3,)),
                                                  ((4, 0, 1), (5, 2, 0), (2, 3, 4)),
                                                  ((6, 1), (9, 0), (2, 3))])
def test_the_circular_pad_is_numpys_wrap_in_the_inputs_layout(before, after, sizes):
    """Bands longer than the axis wrap more than once; a channels-last x gives a
    channels-last result (np.pad gave C order, and the copy cost max_aps_pool's
    channels-last forward 8 ms)."""
    from poolgrad.engines.pullback import circular_pad
    from poolgrad.kernels import dispatch
    ndim = len(sizes)
    x = np.random.default_rng(3).standard_normal((2, 3) + sizes)
    expected = np.pad(x, [(0, 0)] * 2 + list(zip(before, after, strict=True)), mode="wrap")
    five = (slice(None), slice(None)) + (None,) * (3 - ndim)
    # the kernel for NCHW and channels-last float32/64; slices for float16 and others
    for stored, kernel in ((x, "layouts.circular_pad_rows"),
                           (channels_last(x), "layouts.circular_pad_rows"),
                           (channels_last(x).astype(np.float32), "layouts.circular_pad_rows"),
                           (x.astype(np.float16), "numpy.slices"),
                           (np.flip(x, axis=1), "numpy.slices")):
        operand = dispatch.operand(stored[five])
        assert dispatch.choose("circular", "pad", None, operand).name == kernel
        padded = circular_pad(stored, ndim, before, after)
        np.testing.assert_array_equal(padded, np.pad(stored, [(0, 0)] * 2 + list(
            zip(before, after, strict=True)), mode="wrap"))
        if stored.dtype == x.dtype and not stored.strides[1] < 0:
            np.testing.assert_array_equal(padded, expected)
            assert (np.argsort(padded.strides) == np.argsort(stored.strides)).all()


@pytest.mark.parametrize("before, after, sizes", [((0, 1), (1, 0), (5, 4)), ((2,), (3,), (3,)),
                                                  ((4, 0, 1), (5, 2, 0), (2, 3, 4))])
def test_the_circular_fold_is_the_pads_transpose(before, after, sizes):
    """Wrapping more than once included: <pad(x), g> = <x, fold(g)> for every x, checked
    on the basis, and against a scatter of each padded position onto its element."""
    from poolgrad.engines.pullback import circular_pad, fold_circular
    ndim = len(sizes)
    rng = np.random.default_rng(16)
    x = rng.standard_normal((2, 3) + sizes)
    padded = circular_pad(x, ndim, before, after)
    g = rng.standard_normal(padded.shape)
    expected = np.zeros_like(x)
    for index in np.ndindex(*padded.shape):
        source = index[:2] + tuple((i - b) % n for i, b, n in zip(index[2:], before, sizes,
                                                                  strict=True))
        expected[source] += g[index]
    np.testing.assert_allclose(fold_circular(g, ndim, before, sizes), expected, rtol=1e-12)
    np.testing.assert_allclose(np.sum(padded * g), np.sum(x * expected), rtol=1e-12)


@pytest.mark.parametrize("shape, stride", [((3, 37, 7, 9), (2, 2)), ((2, 16, 8, 6), (2, 3)),
                                           ((2, 5, 4, 6, 4), (2, 1, 2))])
def test_channels_last_runs_its_own_kernels_with_the_planes_bits(shape, stride):
    """A channels-last x runs the kernels that read a pixel's channels at once; its
    norms are the planes' kernel's to the bit (so the same choices), for every norm,
    channel counts around the block of 16 and a NaN; the pullback names its kernels."""
    from poolgrad.engines import polyphase as engine
    x = np.random.default_rng(17).standard_normal(shape).astype(np.float32)
    x.flat[5] = np.nan
    ndim = len(shape) - 2
    steps = np.array((1,) * (3 - ndim) + stride, np.int64)
    five = (slice(None), slice(None)) + (None,) * (3 - ndim)
    stored = channels_last(x)
    for norm in ("l2", "l1", "max"):
        np.testing.assert_array_equal(engine.phase_norms(stored[five], steps, norm),
                                      engine.phase_norms(x[five], steps, norm))
    _, planes = pg.vjp(pg.aps_pool, x, stride)
    _, pixels = pg.vjp(pg.aps_pool, stored, stride)
    assert planes.kernels == {"forward": "polyphase.phase_gather",
                              "backward": "polyphase.phase_scatter"}
    assert pixels.kernels == {"forward": "polyphase.phase_gather_channels_last",
                              "backward": "polyphase.phase_scatter_channels_last"}


def _norms_in_stated_order(x5, steps, norm):
    """The norms in the kernels' documented order (poolgrad.kernels.polyphase), written
    as plain Python: each row phase's columns add their terms down the rows, each
    component's columns go into lanes (position ``k`` into lane ``k mod LANES``), the
    lanes are added by halving, then the planes in channel order."""
    from poolgrad.kernels.polyphase import LANES
    n_batch, n_chan, *sizes = x5.shape
    counts = [-(-length // step) for length, step in zip(sizes, steps, strict=True)]
    row_phases = int(steps[0] * steps[1])
    partials = np.zeros((n_batch, n_chan, row_phases * int(steps[2])))
    for n, c in itertools.product(range(n_batch), range(n_chan)):
        columns = np.zeros((row_phases, sizes[2]))
        for pd in range(counts[0] * steps[0]):
            for ph in range(counts[1] * steps[1]):
                row = x5[n, c, pd % sizes[0], ph % sizes[1]].astype(np.float64)
                columns[(pd % steps[0]) * steps[1] + ph % steps[1]] += (
                    row * row if norm == "l2" else np.abs(row))
        for row_phase, e in itertools.product(range(row_phases), range(steps[2])):
            lanes = np.zeros(LANES)
            for k in range(counts[2]):
                lanes[k % LANES] += columns[row_phase, (e + k * steps[2]) % sizes[2]]
            half = LANES // 2
            while half >= 1:
                lanes[:half] += lanes[half:2 * half]
                half //= 2
            partials[n, c, row_phase * steps[2] + e] = lanes[0]
    norms = np.zeros((n_batch, partials.shape[2]))
    for c in range(n_chan):  # the planes added in channel order, as the engine adds them
        norms += partials[:, c]
    return norms


@pytest.mark.parametrize("shape, stride", [((2, 3, 6, 56), (2, 2)), ((1, 70, 5, 12), (3, 2)),
                                           ((2, 2, 4, 21), (2, 2)), ((1, 3, 4, 30), (1, 3)),
                                           ((1, 2, 3, 4, 18), (2, 1, 2)), ((2, 3, 11), (3,)),
                                           ((2, 3, 19, 10), (2, 2)), ((1, 70, 13, 6), (3, 2))])
@pytest.mark.parametrize("norm", ["l2", "l1"])
def test_the_norms_are_summed_in_the_stated_order(shape, stride, norm):
    """Both layouts' sums, bit for bit, against the order the kernels document: even
    and odd widths (a component's last position wrapping round), rows that wrap,
    strides 1 to 3, 1-d to 3-d, more channels than a channels-last task takes, and row
    phases of 5 and 10 rows (which channels-last examples add four rows at a time)."""
    from poolgrad.engines import polyphase as engine
    x = np.random.default_rng(23).standard_normal(shape).astype(np.float32)
    ndim = len(shape) - 2
    steps = np.array((1,) * (3 - ndim) + stride, np.int64)
    five = (slice(None), slice(None)) + (None,) * (3 - ndim)
    expected = _norms_in_stated_order(x[five], steps, norm)
    for stored in (x, channels_last(x)):
        np.testing.assert_array_equal(engine.phase_norms(stored[five], steps, norm), expected)
