"""poolgrad.torch's adaptive polyphase sampling: the NumPy operator's values, phases
and gradients, its operators (opcheck, gradients of gradients, torch.compile), the
modules, a circular CNN that no circular shift of its input changes, and bad input."""

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import poolgrad as pg  # noqa: E402
import poolgrad.torch as pt  # noqa: E402


def channels_last(t):
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
    return t.contiguous(memory_format=fmt) if fmt else t


@pytest.mark.parametrize("shape, stride, norm", [((3, 4, 6, 8), 2, "l2"),
                                                 ((2, 3, 7, 5), (2, 3), "l1"),
                                                 ((2, 2, 9), 3, "max"),
                                                 ((2, 2, 4, 6, 4), (2, 3, 2), "l2")])
def test_aps_pool_is_the_numpy_operator(shape, stride, norm):
    """Values, phases and dx against poolgrad.aps_pool in float64, in both layouts (the
    output keeps x's), max_aps_pool with and without its blur too."""
    x = np.random.default_rng(1).standard_normal(shape)
    (y, phases), pullback = pg.vjp(pg.aps_pool, x, stride, norm=norm, return_indices=True)
    dy = np.random.default_rng(2).standard_normal(y.shape)
    for stored in (torch.tensor(x), channels_last(torch.tensor(x))):
        leaf = stored.clone().requires_grad_()
        got, got_phases = pt.aps_pool(leaf, stride, norm=norm, return_indices=True)
        got.backward(torch.tensor(dy))
        np.testing.assert_array_equal(got.detach().numpy(), y)
        np.testing.assert_array_equal(got_phases.numpy(), phases)
        np.testing.assert_array_equal(leaf.grad.numpy(), pullback(dy))
        assert got.stride() == channels_last(got).stride() or stored.is_contiguous()
    for blur in (None, 3):
        expected = pg.max_aps_pool(x, 2, stride, blur, norm=norm)
        np.testing.assert_allclose(pt.max_aps_pool(torch.tensor(x), 2, stride, blur,
                                                   norm=norm).numpy(), expected, rtol=1e-13)


def test_gradients_of_gradients_and_the_operators():
    x = torch.randn(2, 3, 4, 6, dtype=torch.float64, requires_grad=True)
    phases = torch.tensor([2, 1])
    for fn in (lambda t: pt.aps_pool(t, 2), lambda t: pt.aps_pool(t, (1, 3), phase=phases),
               lambda t: pt.max_aps_pool(t, 2, 2), lambda t: pt.max_aps_pool(t, 2, 2, 3)):
        assert torch.autograd.gradcheck(fn, (x,))
        assert torch.autograd.gradgradcheck(fn, (x,))
    y, chosen = torch.ops.poolgrad.aps_pool(x.detach(), [2, 2], 0)
    torch.library.opcheck(torch.ops.poolgrad.aps_pool, (x, [2, 2], 0))
    torch.library.opcheck(torch.ops.poolgrad.aps_gather, (x, chosen, [2, 2]))
    torch.library.opcheck(torch.ops.poolgrad.aps_scatter, (y, chosen, [2, 2], list(x.shape)))


@pytest.mark.parametrize("shape, pads", [
    ((2, 3, 7, 6), [0, 1, 1, 1]), ((2, 3, 5), [2, 1]), ((1, 2, 3, 4, 5), [1, 0, 0, 2, 1, 1])])
@pytest.mark.parametrize("channels_last", [False, True])
def test_circular_pad_is_f_pads_and_its_fold_is_the_transpose(shape, pads, channels_last):
    """max_aps_pool pads on the CPU with the ``circular_pad`` op (the NumPy operators'
    kernel), whose gradient ``circular_fold`` adds the wrapped positions back: F.pad's
    values and gradient, x's layout kept both ways, gradients of gradients, opcheck."""
    x = torch.randn(*shape, dtype=torch.float64)
    if channels_last and x.dim() > 3:
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4
                         else torch.channels_last_3d)
    flat = [p for i in reversed(range(len(pads) // 2)) for p in pads[2 * i: 2 * i + 2]]
    leaf, reference_leaf = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = torch.ops.poolgrad.circular_pad(leaf, pads)
    expected = torch.nn.functional.pad(reference_leaf, flat, mode="circular")
    assert torch.equal(y, expected)
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    if fmt is not None:  # stored as x is
        assert y.is_contiguous(memory_format=fmt) == channels_last
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, leaf, dy)
    (expected_dx,) = torch.autograd.grad(expected, reference_leaf, dy)
    torch.testing.assert_close(dx, expected_dx, rtol=0, atol=1e-15)
    assert dx.stride() == x.stride()
    pad = lambda t: torch.ops.poolgrad.circular_pad(t, pads)  # noqa: E731
    assert torch.autograd.gradcheck(pad, (leaf,))
    assert torch.autograd.gradgradcheck(pad, (leaf,))
    torch.library.opcheck(torch.ops.poolgrad.circular_pad, (leaf, pads))
    torch.library.opcheck(torch.ops.poolgrad.circular_fold, (dy.requires_grad_(), pads,
                                                             list(x.shape)))


def test_circular_pad_wraps_more_than_once():
    """A pad longer than its dim wraps round again, as np.pad's "wrap" and the NumPy
    operator do (on CUDA too: tests/test_triton.py checks its kernels)."""
    x = torch.arange(4.0, dtype=torch.float64).reshape(1, 1, 2, 2)
    padded = torch.ops.poolgrad.circular_pad(x, [3, 3, 3, 3])
    np.testing.assert_array_equal(padded[0, 0].numpy(),
                                  np.pad(x[0, 0].numpy(), 3, mode="wrap"))
    np.testing.assert_array_equal(pt.max_aps_pool(x, 7, 2).numpy(),
                                  pg.max_aps_pool(x.numpy(), 7, 2))


def test_torch_compile_gives_the_eager_values_and_gradient():
    x = torch.randn(2, 3, 6, 6)

    def fn(t):
        return pt.max_aps_pool(t, 2, 2, 3).square().sum()

    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    leaf, compiled_leaf = x.clone().requires_grad_(), x.clone().requires_grad_()
    fn(leaf).backward()
    compiled(compiled_leaf).backward()
    torch.testing.assert_close(compiled_leaf.grad, leaf.grad)


def test_modules_keep_their_phases_and_a_shortcut_follows():
    x = torch.randn(3, 4, 8, 8)
    pool = pt.MaxAPSPool(2, 2)
    y = pool(x)
    shortcut = pt.aps_pool(x[:, :2], 2, phase=pool.phases)
    for n, phase in enumerate(pool.phases.tolist()):
        a, b = divmod(phase, 2)
        torch.testing.assert_close(shortcut[n], x[n, :2, a::2, b::2])
    torch.testing.assert_close(y, pt.max_aps_pool(x, 2, 2))
    assert "stride=2" in repr(pt.APSPool(2))
    single, phase = pt.aps_pool(x[0], 2, spatial_dims=2, return_indices=True)
    assert single.shape == (4, 4, 4) and phase.shape == ()
    torch.testing.assert_close(pt.aps_pool(x[0], 2, spatial_dims=2, phase=phase), single)


class CircularNet(torch.nn.Module):
    """Circular convolutions, APS at every stride, global average, linear: the paper's
    recipe for a network that no circular shift of its input changes."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = torch.nn.Conv2d(1, 6, 3, padding=1, padding_mode="circular")
        self.conv2 = torch.nn.Conv2d(6, 8, 3, padding=1, padding_mode="circular")
        self.pool1, self.pool2 = pt.MaxAPSPool(2, 2, 3), pt.APSPool(2)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        x = self.pool1(torch.relu(self.conv1(x)))
        x = self.pool2(torch.relu(self.conv2(x)))
        return self.head(x.mean((2, 3)))


def test_a_circular_cnn_with_aps_predicts_the_same_for_every_circular_shift():
    """All 64 shifts of three 8x8 inputs: the same logits up to the global average's
    order of summation, the same prediction; a strided max pool in APS's place is
    not invariant."""
    net = CircularNet().double().eval()
    x = torch.randn(3, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        base = net(x)
        for shift in itertools.product(range(8), range(8)):
            shifted = net(torch.roll(x, shift, dims=(2, 3)))
            torch.testing.assert_close(shifted, base, rtol=1e-12, atol=1e-12)
            assert torch.equal(shifted.argmax(1), base.argmax(1))
        net.pool1, net.pool2 = torch.nn.MaxPool2d(2), torch.nn.MaxPool2d(2)
        plain = net(x)
        moved = max(float((net(torch.roll(x, s, dims=(2, 3))) - plain).abs().max())
                    for s in itertools.product(range(8), range(8)))
    assert moved > 1e-3


@pytest.mark.parametrize("call, error, message", [
    (lambda x: pt.aps_pool(x, 0), ValueError, "stride"),
    (lambda x: pt.aps_pool(x, 2, norm="l3"), ValueError, "norm must be one of l2, l1, max"),
    (lambda x: pt.aps_pool(x, 2, phase=4), ValueError, r"phase must be in \[0, 4\)"),
    (lambda x: pt.aps_pool(x, 2, phase=torch.tensor([0, 5])), ValueError,
     r"phase must be in \[0, 4\)"),
    (lambda x: pt.aps_pool(x, 2, phase=torch.tensor([0, 1, 2])), ValueError,
     r"one per example, shape \(2,\)"),
    (lambda x: pt.aps_pool(x, 2, phase=torch.tensor([0.0, 1.0])), TypeError,
     "phase must be None, an int or an integer tensor"),
    (lambda x: pt.aps_pool(x, 2, phase=True), TypeError, "phase must be None"),
    (lambda x: pt.aps_pool(x, 2, return_indices=1), TypeError, "return_indices must be"),
    (lambda x: pt.aps_pool(x.numpy(), 2), TypeError, "must be a torch.Tensor"),
    (lambda x: pt.max_aps_pool(x, 2, 2, 9), ValueError, "filter_size"),
])
def test_bad_input(call, error, message):
    x = torch.zeros(2, 3, 4, 4)
    with pytest.raises(error, match=message):
        call(x)
    assert not x.any()


def test_replace_pooling_makes_a_circular_cnn_invariant():
    """``to="aps"`` swaps each strided max pooling for MaxAPSPool (the same output
    sizes where its padding is "same"-like); the stride-1 one stays. The model then
    predicts the same for every circular shift; a padding that would change the sizes
    is refused, naming it."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1, padding_mode="circular"), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(4, 6, 3, padding=1, padding_mode="circular"),
        torch.nn.MaxPool2d(3, 2, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(6, 3)).double()
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        sizes = model[:5](x).shape
        assert pt.replace_pooling(model, to="aps") == 2
        assert isinstance(model[2], pt.MaxAPSPool) and isinstance(model[4], pt.MaxAPSPool)
        assert pt.replace_pooling(torch.nn.Sequential(torch.nn.MaxPool2d(3, 1, 1)),
                                  to="aps") == 0  # nothing to sample
        assert model[:5](x).shape == sizes and "poolgrad.MaxAPSPool" in repr(model)
        base = model(x)
        for shift in itertools.product(range(8), range(8)):
            torch.testing.assert_close(model(torch.roll(x, shift, dims=(2, 3))), base)
    blurred = torch.nn.Sequential(torch.nn.MaxPool2d(2))
    assert pt.replace_pooling(blurred, to="aps_blur") == 1 and blurred[0].options[
        "filter_size"] == 3
    with pytest.raises(ValueError, match=r"cannot become aps: .* padding \(0, 0\)"):
        pt.replace_pooling(torch.nn.Sequential(torch.nn.MaxPool2d(3, 2)), to="aps")


def test_lps_pool_is_the_numpy_operator_and_its_mixture(monkeypatch):
    """Evaluation: the NumPy operator's values and phases (float64); training: the
    mixture by the softmax of (scores + Gumbel noise of the generator's draws) / T,
    written with the NumPy operator's formula."""
    rng = np.random.default_rng(15)
    x = rng.standard_normal((3, 4, 6, 5))
    weights = (rng.standard_normal((5, 4)), rng.standard_normal(5), rng.standard_normal(5))
    tensors = tuple(torch.tensor(w) for w in weights)
    xt = torch.tensor(x)
    y, phases = pt.lps_pool(xt, tensors, 2, return_indices=True)
    expected, expected_phases = pg.lps_pool(x, weights, 2, return_indices=True)
    np.testing.assert_array_equal(y.numpy(), expected)
    np.testing.assert_array_equal(phases.numpy(), expected_phases)
    soft = pt.lps_pool(xt, tensors, 2, training=True, temperature=0.5, generator=7)
    uniform = torch.rand((3, 4), generator=torch.Generator().manual_seed(7),
                         dtype=torch.float64).numpy()

    class Draws:  # the torch generator's uniforms, handed to the NumPy operator
        @staticmethod
        def random(shape):
            assert shape == uniform.shape
            return uniform

    from poolgrad import _inputs
    monkeypatch.setattr(_inputs, "generator", lambda rng: Draws)
    mixed = pg.lps_pool(x, weights, 2, training=True, temperature=0.5)
    np.testing.assert_allclose(soft.numpy(), mixed, rtol=1e-12)


def test_lps_gradients_and_module():
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    weights = tuple(torch.randn(shape, dtype=torch.float64, requires_grad=True)
                    for shape in ((4, 3), (4,), (4,)))
    for training in (True, False):
        def fn(t, W1, b1, w2, training=training):
            return pt.lps_pool(t, (W1, b1, w2), 2, training=training, temperature=0.8,
                               generator=3)
        assert torch.autograd.gradcheck(fn, (x, *weights))
        assert torch.autograd.gradgradcheck(fn, (x, *weights))
    module = pt.LPSPool(3, hidden=4, seed=1).double()
    module(x).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())
    assert module.phases.shape == (2,) and "poolgrad.LPSPool(3, hidden=4" in repr(module)
    module.eval()
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), module(x))
