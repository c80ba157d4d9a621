"""poolgrad.torch's pooling kinds: the NumPy operators' values and gradients (inputs and
learnable parameters) in float64, gradients of gradients, PyTorch's fractional max
pooling given the same samples, seeded draws, the modules, and bad input."""

import numpy as np
import pytest

import poolgrad as pg

torch = pytest.importorskip("torch")
import poolgrad.torch as pt  # noqa: E402
from poolgrad.torch import _ops  # noqa: E402
from poolgrad.torch.kinds import _draw  # noqa: E402


def _check_against_numpy(torch_fn, numpy_op, x, args, kwargs, params=()):
    """Values and gradients of ``torch_fn(x, *params)`` against ``vjp(numpy_op, ...)``."""
    xt = torch.tensor(x, requires_grad=True)
    pts = [torch.tensor(p, requires_grad=True) for p in params]
    y = torch_fn(xt, *pts)
    expected, pullback = pg.vjp(numpy_op, x, *args, **kwargs)
    np.testing.assert_allclose(y.detach().numpy(), expected, rtol=1e-12, atol=1e-14)
    dy = np.random.default_rng(7).standard_normal(expected.shape)
    y.backward(torch.tensor(dy))
    result = pullback(dy)
    grads = result if isinstance(result, tuple) else (result,)
    np.testing.assert_allclose(xt.grad.numpy(), grads[0], rtol=1e-10, atol=1e-12)
    for tensor, grad in zip(pts, grads[1:], strict=True):
        np.testing.assert_allclose(tensor.grad.numpy(), grad, rtol=1e-9, atol=1e-12)


X = np.random.default_rng(3).random((2, 3, 9, 10))
G = np.random.default_rng(4).standard_normal((3, 3))
Q, W = np.random.default_rng(5).standard_normal((2, 4)), np.eye(4) + 0.1

CASES = [
    ("blur reflect", lambda x: pt.blur_pool(x), pg.blur_pool, (), {}),
    ("blur zeros 1-d", lambda x: pt.blur_pool(x, 3, 5, "zeros"), pg.blur_pool,
     (3, 5, "zeros"), {}),
    ("blur circular 3-d", lambda x: pt.blur_pool(x, 2, (3, 1, 2), "circular"), pg.blur_pool,
     (2, (3, 1, 2), "circular"), {}),
    ("max blur replicate", lambda x: pt.max_blur_pool(x, 3, 2, 4, "replicate"),
     pg.max_blur_pool, (3, 2, 4, "replicate"), {}),
    ("avg blur same", lambda x: pt.avg_blur_pool(x, 2, 3, 3, "reflect", "same"),
     pg.avg_blur_pool, (2, 3, 3, "reflect", "same"), {}),
    ("soft", lambda x: pt.soft_pool(x, 3, 2, 1), pg.soft_pool, (3, 2, 1), {}),
    ("stochastic evaluation", lambda x: pt.stochastic_pool(x, 3, 2, 1, training=False),
     pg.stochastic_pool, (3, 2, 1), {"training": False}),
    ("mixed", lambda x, a: pt.mixed_pool(x, 3, 2, 1, a), pg.mixed_pool, (3, 2, 1, 0.3), {}),
    ("gated", lambda x, g: pt.gated_pool(x, g, 3, 2, 1), pg.gated_pool, (G, 3, 2, 1), {}),
    ("gem global", lambda x, p: pt.gem_pool(x, p), pg.gem_pool, (2.5,), {}),
    ("gem windows", lambda x, p: pt.gem_pool(x, p, 3, 2, 0.3), pg.gem_pool,
     (4.0, 3, 2, 0.3), {}),
]
PARAMS = {"mixed": (np.array(0.3),), "gated": (G,), "gem global": (np.array(2.5),),
          "gem windows": (np.array(4.0),)}
SHAPES = {"blur zeros 1-d": (2, 3, 13), "blur circular 3-d": (1, 2, 7, 4, 6)}


@pytest.mark.parametrize("name, torch_fn, numpy_op, args, kwargs", CASES,
                         ids=[case[0] for case in CASES])
def test_values_and_gradients_are_the_numpy_operators(name, torch_fn, numpy_op, args,
                                                      kwargs):
    shape = SHAPES.get(name)
    x = np.random.default_rng(8).random(shape) if shape else X
    _check_against_numpy(torch_fn, numpy_op, x, args, kwargs, PARAMS.get(name, ()))


def test_attention_pool_values_and_three_gradients():
    x = np.random.default_rng(9).standard_normal((2, 4, 3, 5))
    _check_against_numpy(lambda x, q, w: pt.attention_pool(x, q, w, 2), pg.attention_pool,
                         x, (Q, W, 2), {}, (Q, W))


@pytest.mark.parametrize("fn", [
    lambda x: pt.blur_pool(x, 2, 3, "reflect"),
    lambda x: pt.max_blur_pool(x, 2, 2, 3, "zeros"),
    lambda x: pt.soft_pool(x, 2, 1),
    lambda x: pt.gem_pool(x, 3.0, 2),
    lambda x: pt.stochastic_pool(x, 2, training=False),
])
def test_gradients_of_gradients(fn):
    x = torch.rand(1, 2, 5, 6, dtype=torch.float64) + 0.1
    x = x + torch.arange(60, dtype=torch.float64).reshape(x.shape) * 1e-3  # no ties
    x.requires_grad_()
    assert torch.autograd.gradgradcheck(fn, (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape, out, kernel", [
    ((2, 3, 11, 17), (5, 7), 2), ((2, 2, 30, 31), (17, 20), 3),
    ((1, 2, 9, 10, 11), (4, 5, 6), (2, 3, 2)),
])
def test_fractional_max_pool_equals_torch_given_the_samples(dtype, shape, out, kernel):
    torch.manual_seed(1)
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    samples = torch.rand(shape[0], shape[1], len(out), dtype=dtype)
    reference = (torch.nn.functional.fractional_max_pool2d if len(out) == 2
                 else torch.nn.functional.fractional_max_pool3d)
    y, indices = reference(x, kernel, output_size=out, return_indices=True,
                           _random_samples=samples)
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    ours, our_indices = pt.fractional_max_pool(x, kernel, out, return_indices=True,
                                               samples=samples)
    (our_dx,) = torch.autograd.grad(ours, x, torch.ones_like(ours))
    assert torch.equal(ours, y) and torch.equal(our_indices, indices)
    assert torch.equal(our_dx, dx)


def test_fractional_regions_equal_numpy_and_seeds_repeat():
    x = torch.rand(2, 3, 12, 13, dtype=torch.float64)
    samples = torch.rand(2, 3, 2, dtype=torch.float64)
    for regions in ("disjoint", "overlapping"):
        np.testing.assert_array_equal(
            pt.fractional_max_pool(x, regions, output_ratio=0.6, samples=samples).numpy(),
            pg.fractional_max_pool(x.numpy(), regions, output_ratio=0.6,
                                   samples=samples.numpy()))
    first = pt.fractional_max_pool(x, "disjoint", 7, generator=3, sequence="random")
    again = pt.fractional_max_pool(x, "disjoint", 7, generator=3, sequence="random")
    assert torch.equal(first, again)


def test_stochastic_draws_follow_the_numpy_rule_and_route_there():
    x = np.random.default_rng(10).random((2, 3, 7, 8))
    x[0, 0, :3, :3] = 0  # a window of zeros draws its first real tap
    draws = np.random.default_rng(11).random((2, 3, 4, 4))
    _, pullback = pg.vjp(pg.stochastic_pool, x, 3, 2, 1, rng=np.random.default_rng(11))
    xt = torch.tensor(x)
    window = _ops.sliding_window((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), False)
    winners = _draw(xt, window, torch.tensor(draws))
    np.testing.assert_array_equal(winners.numpy(),
                                  pullback.saved["window_positions"].reshape(2, 3, 4, 4))
    xt.requires_grad_()
    y = pt.stochastic_pool(xt, 3, 2, 1, generator=12)
    dy = torch.rand_like(y)
    y.backward(dy)
    # each window's gradient reaches the element it drew (tie-free values identify it)
    expected = np.zeros_like(x)
    for index in np.ndindex(*y.shape):
        plane = x[index[:2]]
        where = np.argwhere(plane == y[index].item())
        assert len(where) >= 1
        expected[index[:2] + tuple(where[0])] += dy[index].item()
    nonzero = x != 0
    np.testing.assert_allclose(xt.grad.numpy()[nonzero], expected[nonzero], rtol=1e-12)
    again = pt.stochastic_pool(xt.detach(), 3, 2, 1, generator=12)
    assert torch.equal(again, y.detach())


def test_modules_learn_their_parameters():
    x = torch.rand(2, 4, 8, 8)
    gem, mixed, gated = pt.GeMPool(), pt.MixedPool(2), pt.GatedPool(2)
    attention = pt.AttentionPool(4, heads=2, queries=3)
    y = attention(x)
    assert y.shape == (2, 12)
    torch.testing.assert_close(y.reshape(2, 3, 4), x.mean((2, 3))[:, None].expand(2, 3, 4))
    for module, name in ((gem, "p"), (mixed, "alpha"), (gated, "gate"),
                         (attention, "queries")):
        optimizer = torch.optim.SGD(module.parameters(), lr=0.5)
        before = getattr(module, name).detach().clone()
        module(x).square().sum().backward()
        optimizer.step()
        assert not torch.equal(getattr(module, name).detach(), before)
    fixed = pt.GeMPool(learn=False)
    assert list(fixed.parameters()) == []
    stochastic = pt.StochasticPool(2, seed=5)
    first = stochastic(x)
    assert torch.equal(pt.StochasticPool(2, seed=5)(x), first)
    stochastic.eval()
    torch.testing.assert_close(stochastic(x), pt.stochastic_pool(x, 2, training=False))
    fractional = pt.FractionalMaxPool(2, output_ratio=0.7, seed=1)
    assert fractional(x).shape == (2, 4, 5, 5)


def test_compiled_matches_eager():
    x = torch.rand(2, 3, 9, 10, requires_grad=True)
    compiled = torch.compile(lambda t: pt.max_blur_pool(t) + pt.soft_pool(t, 2, 2, 1)[..., :4, :5])
    y = compiled(x)
    torch.testing.assert_close(y, pt.max_blur_pool(x) + pt.soft_pool(x, 2, 2, 1)[..., :4, :5])


@pytest.mark.parametrize("call, error, message", [
    (lambda x: pt.stochastic_pool(x - 2, 2), ValueError, "x must be >= 0"),
    (lambda x: pt.gated_pool(x, torch.ones(3), 2), ValueError, "gate must have the window"),
    (lambda x: pt.attention_pool(x, torch.ones(1, 2), torch.eye(2)), ValueError,
     r"queries must be \(queries, C\)"),
    (lambda x: pt.blur_pool(x, padding_mode="mirror"), ValueError, "padding_mode must be"),
    (lambda x: pt.blur_pool(x.numpy()), TypeError, "must be a torch.Tensor"),
    (lambda x: pt.soft_pool(x[0, 0], 2), ValueError, r"\(N, C, \*spatial\)"),
    (lambda x: pt.fractional_max_pool(x, 2), ValueError, "exactly one of output_size"),
    (lambda x: pt.fractional_max_pool(x, 2, 2, samples=torch.rand(1, 3, 2), generator=1),
     ValueError, "not both"),
    (lambda x: pt.stochastic_pool(x, 2, generator="seed"), TypeError, "generator must be"),
    (lambda x: pt.gem_pool(x, stride=2), ValueError, "stride needs a kernel_size"),
])
def test_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call(torch.ones(1, 3, 4, 4))


@pytest.mark.parametrize("p", [0, -1, -2.0, float("nan"), float("inf")])
def test_gem_p_is_checked_as_numpy_checks_it(p):
    """GeM's p must be finite and > 0, in both front ends, at construction and at call:
    p = 0 gave the window maximum with a NaN gradient, a negative p a wrong answer, and
    gem_pool(x, 0) a ZeroDivisionError."""
    from poolgrad import nn as numpy_nn
    x = torch.rand(1, 3, 4, 4)
    numpy_error = "p must be a finite number > 0"
    for build in (pt.GeMPool, numpy_nn.GeMPool):
        with pytest.raises(ValueError, match=numpy_error):
            build(p)
    with pytest.raises(ValueError, match=numpy_error):
        pt.gem_pool(x, p)
    with pytest.raises(ValueError, match=numpy_error):
        pg.gem_pool(x.numpy(), p)
    with pytest.raises(ValueError, match=r"gem_pool: p must be finite and > 0"):
        pt.gem_pool(x, torch.tensor(float(p)))  # a learnable p that training drove there
    module = pt.GeMPool(3.0)
    with torch.no_grad():
        module.p.fill_(p)
    with pytest.raises(ValueError, match=r"gem_pool: p must be finite and > 0"):
        module(x)
