"""poolgrad.torch's pooling kinds: the NumPy operators' values and gradients (inputs and
learnable parameters) in float64, gradients of gradients, PyTorch's fractional max
pooling given the same samples, seeded draws, the modules, and bad input."""

import functools
import math

import numpy as np
import pytest

import poolgrad as pg
from poolgrad.kinds import fractional

torch = pytest.importorskip("torch")
import poolgrad.torch as pt  # noqa: E402
from poolgrad.torch import _kind_ops, _ops, kinds  # noqa: E402


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


@pytest.mark.parametrize("shape, memory_format", [
    ((2, 4, 3, 5), torch.contiguous_format), ((2, 4, 3, 5), torch.channels_last),
    ((2, 4, 2, 3, 2), torch.channels_last_3d), ((2, 4, 7), torch.contiguous_format)])
def test_attention_pool_values_and_three_gradients(shape, memory_format, monkeypatch):
    """A training pass on the CPU runs the NumPy operator's kernels as
    ``torch.ops.poolgrad.attention_pool`` and its backward op; torch's own products,
    which a forward alone and CUDA take, order them as a backward reads fastest (the
    pixels of channels-last x) or, with no backward, read the (N, C, L) view of either
    layout: the NumPy operator's values and gradients in every one."""
    x = np.random.default_rng(9).standard_normal(shape)
    implementations = _ops.IMPLEMENTATIONS["cpu"]
    ran = []
    for op in (_kind_ops.attention_pool, _kind_ops.attention_pool_backward):
        monkeypatch.setitem(implementations, op, functools.partial(
            lambda run, *args: ran.append(run) or run(*args), implementations[op]))

    def attention(x, q, w):
        return pt.attention_pool(x.contiguous(memory_format=memory_format), q, w, 2)

    def products(x, q, w):
        return kinds.attention_products(x.contiguous(memory_format=memory_format), q, w, 2,
                                        backward=True)
    _check_against_numpy(attention, pg.attention_pool, x, (Q, W, 2), {}, (Q, W))
    assert len(ran) == 2  # the forward op, then the backward op
    _check_against_numpy(products, pg.attention_pool, x, (Q, W, 2), {}, (Q, W))
    with torch.no_grad():
        values = attention(torch.tensor(x), torch.tensor(Q), torch.tensor(W))
    assert len(ran) == 2  # neither of them for a forward alone
    np.testing.assert_allclose(values.numpy(), pg.attention_pool(x, Q, W, 2), rtol=1e-12,
                               atol=1e-14)


def test_attention_training_pass_is_an_operator():
    """``attention_pool`` and ``attention_pool_backward``: opcheck (the backward's on
    channels-last x, whose strides matter), the NumPy operator's values and dx bit for
    bit, dx stored as x is, and gradgradcheck in x, the queries and the key weights
    (torch.compile: the test of the kinds' graph)."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(2, 4, 5, 3, dtype=torch.float64, generator=g)
    queries = torch.randn(3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    key_weight = torch.randn(4, 4, dtype=torch.float64, generator=g, requires_grad=True)
    projected = torch.randn(6, 4, dtype=torch.float64, generator=g)
    for fmt in (torch.contiguous_format, torch.channels_last):
        xf = x.float().contiguous(memory_format=fmt).requires_grad_()
        torch.library.opcheck(torch.ops.poolgrad.attention_pool, (xf, projected, 2))
        y, attn = torch.ops.poolgrad.attention_pool(xf, projected, 2)
        if fmt == torch.channels_last:  # (4.6 s a layout, its composite run under aot)
            torch.library.opcheck(torch.ops.poolgrad.attention_pool_backward,
                                  (torch.rand_like(y), xf, projected, attn, 2))
        xt = x.clone(memory_format=fmt).requires_grad_()
        y = pt.attention_pool(xt, queries, key_weight, 2)
        dy = torch.randn(y.shape, dtype=torch.float64, generator=g)
        y.backward(dy)
        expected, pullback = pg.vjp(pg.attention_pool, x.numpy(), queries.detach().numpy(),
                                    key_weight.detach().numpy(), 2)
        np.testing.assert_array_equal(y.detach().numpy(), expected)
        np.testing.assert_array_equal(xt.grad.numpy(), pullback(dy.numpy())[0])
        assert xt.grad.is_contiguous(memory_format=fmt)
    assert torch.autograd.gradgradcheck(
        lambda t, q, w: pt.attention_pool(t, q, w, 2), (x.requires_grad_(), queries, key_weight))


@pytest.mark.parametrize("heads", [1, 2, 3, 6])
@pytest.mark.parametrize("shape, memory_format", [
    ((2, 6, 3, 5), torch.channels_last), ((2, 6, 2, 3, 2), torch.channels_last_3d)])
def test_attention_forward_alone_on_channels_last_keeps_each_channels_head(
        shape, memory_format, heads):
    """A channels-last forward with no backward takes every head's weights against all
    channels and keeps each channel's own head: the NumPy operator's values for any
    number of heads and queries, the input untouched; the products in a backward's
    order (channels-last reads pixels) give its gradient."""
    rng = np.random.default_rng(heads)
    x = rng.standard_normal(shape)
    queries, key_weight = rng.standard_normal((3, 6)), rng.standard_normal((6, 6))
    xt = torch.tensor(x).contiguous(memory_format=memory_format)
    before = xt.clone()
    with torch.no_grad():
        y = pt.attention_pool(xt, torch.tensor(queries), torch.tensor(key_weight), heads)
    np.testing.assert_allclose(y.numpy(), pg.attention_pool(x, queries, key_weight, heads),
                               rtol=1e-12, atol=1e-14)
    assert torch.equal(xt, before) and xt.is_contiguous(memory_format=memory_format)
    # the products in a backward's order (CUDA's training pass): the same gradient
    leaf = xt.clone().requires_grad_()
    dy = rng.standard_normal(y.shape)
    kinds.attention_products(leaf, torch.tensor(queries), torch.tensor(key_weight), heads,
                             backward=True).backward(torch.tensor(dy))
    dx = pg.vjp(pg.attention_pool, x, queries, key_weight, heads)[1](dy)[0]
    np.testing.assert_allclose(leaf.grad.numpy(), dx, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("fn", [
    lambda x: pt.blur_pool(x, 2, 3, "reflect"),
    lambda x: pt.max_blur_pool(x, 2, 2, 3, "zeros"),
    lambda x: pt.avg_blur_pool(x, 2, 2, 3, "circular"),
    lambda x: pt.soft_pool(x, 2, 1),
    lambda x: pt.gem_pool(x, 3.0, 2),
    lambda x: pt.stochastic_pool(x, 2, training=False),
    lambda x: pt.mixed_pool(x, 3, 2, 1, 0.2),
    lambda x: pt.gated_pool(x, torch.ones(2, 2, dtype=torch.float64), 2),
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
    ((4, 16, 8, 12), (4, 6), 2),  # every plane's windows on the 2x2/2 grid: max pooling's
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


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fractional_max_pool_takes_channels_last_in_every_dtype(dtype):
    """A channels-last x (copied into planes by the tiled transpose, float16 by NumPy)
    gives the contiguous x's values and gradient."""
    torch.manual_seed(2)
    x = torch.randn(2, 3, 9, 10).to(dtype)
    samples = torch.rand(2, 3, 2).to(dtype)
    results = []
    for layout in (torch.contiguous_format, torch.channels_last):
        xl = x.contiguous(memory_format=layout).requires_grad_()
        y = pt.fractional_max_pool(xl, 3, (4, 5), samples=samples)
        (dx,) = torch.autograd.grad(y, xl, torch.ones_like(y))
        results.append((y, dx))
    (y, dx), (y_cl, dx_cl) = results
    assert torch.equal(y, y_cl) and torch.equal(dx, dx_cl)


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


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_fractional_windows_on_one_grid_keep_only_the_grid(memory_format, monkeypatch):
    """Windows on one grid (ratio 0.5 of even sizes, k 2) run max pooling's kernels:
    the CPU ops keep the grid and no tables, and the values, indices and gradient are
    the fractional kernels' bit for bit, in either layout, with ties and NaN."""
    from poolgrad.engines import fractional as engine
    from poolgrad.torch import _cpu

    x = torch.from_numpy(np.round(np.random.default_rng(4).standard_normal((2, 5, 8, 10)) * 2))
    x.view(-1)[[3, 77]] = math.nan
    x = x.float().contiguous(memory_format=memory_format)
    samples = torch.rand(2, 5, 2, generator=torch.Generator().manual_seed(6))
    dy = torch.randn(2, 5, 4, 5).contiguous(memory_format=memory_format)
    results = []
    from poolgrad.kinds import fractional as fractional_kind

    for grid, search in ((engine.regular_grid, fractional_kind.pseudo_random_grid),
                         (lambda *args: None, lambda *args: None)):
        monkeypatch.setattr(engine, "regular_grid", grid)
        monkeypatch.setattr(fractional_kind, "pseudo_random_grid", search)
        _cpu._grids.clear()
        leaf = x.detach().requires_grad_()
        y, indices = pt.fractional_max_pool(leaf, 2, (4, 5), return_indices=True,
                                            samples=samples)
        y.backward(dy)
        kept = _cpu._fractional_tables(_kind_ops.fractional_geometry((2, 2), (4, 5),
                                                                     "pseudo_random"),
                                       list(x.shape), samples,
                                       torch.empty((10, 0), dtype=torch.float64))
        results.append((kept, y.detach(), indices, leaf.grad))
    (on_grid, *ours), (off_grid, *theirs) = results
    assert on_grid[0] is None and on_grid[1] is not None
    assert off_grid[0] is not None and off_grid[1] is None
    for a, b in zip(ours, theirs, strict=True):
        assert a.stride() == b.stride()
        np.testing.assert_array_equal(np.ascontiguousarray(a.numpy()).view(np.uint8),
                                      np.ascontiguousarray(b.numpy()).view(np.uint8))


def test_fractional_ops_keep_the_grids_by_value_and_build_tables_afresh(monkeypatch):
    """The CPU ops keep the last few calls' grids by the contents of their samples and
    orders: a backward finds its forward's grid, equal samples in another tensor find it
    too, and the oldest go once more are kept. Windows off a grid are built afresh at
    every call (the same tables each time), none kept."""
    from poolgrad.engines import fractional as engine
    from poolgrad.kinds import fractional as fractional_kind
    from poolgrad.torch import _cpu

    searches = []  # a grid is searched for in the tables, or (here) without them
    for module, name in ((engine, "regular_grid"), (fractional_kind, "pseudo_random_grid")):
        search = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, search=search: searches.append(1)
                            or search(*args))
    _cpu._grids.clear()
    orders = torch.empty((6, 0), dtype=torch.float64)
    on_grid = _kind_ops.fractional_geometry((2, 2), (3, 4), "pseudo_random")
    grid_size = [2, 3, 6, 8]  # ratio 0.5 of even sizes: one grid (for draws below 0.5)
    samples = torch.rand(2, 3, 2, generator=torch.Generator().manual_seed(0)) / 2
    tables, grid = _cpu._fractional_tables(on_grid, grid_size, samples, orders)
    assert tables is None and grid is not None
    assert _cpu._fractional_tables(on_grid, grid_size, samples.clone(), orders.clone()) == (
        None, grid)
    assert len(searches) == 1
    for k in range(_cpu._GRIDS_KEPT):
        _cpu._fractional_tables(on_grid, grid_size, samples + k + 1, orders)
    assert _cpu._fractional_tables(on_grid, grid_size, samples, orders) == (None, grid)
    assert len(searches) == _cpu._GRIDS_KEPT + 2  # the first was searched again

    window = _kind_ops.fractional_geometry((2, 2), (3, 4), "pseudo_random")
    size = [2, 3, 7, 9]
    first, grid = _cpu._fractional_tables(window, size, samples, orders)
    again, _ = _cpu._fractional_tables(window, size, samples.clone(), orders)
    assert grid is None and first is not again
    expected = fractional.region_tables((7, 9), (2, 2), (3, 4), samples.numpy()
                                        .reshape(6, 2), "pseudo_random", None)
    for got, got_again, want in zip(first, again, expected, strict=True):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got_again, want)
    x = torch.rand(2, 3, 7, 9, requires_grad=True)
    y = pt.fractional_max_pool(x, 2, (3, 4), samples=samples)
    y.backward(torch.ones_like(y))
    x_numpy = x.detach().numpy()
    expected_dx = pg.vjp(pg.fractional_max_pool, x_numpy, 2, (3, 4),
                         samples=samples.numpy())[1](np.ones(y.shape, np.float32))
    np.testing.assert_array_equal(x.grad.numpy(), expected_dx)


def test_stochastic_draws_follow_the_numpy_rule_and_route_there():
    x = np.random.default_rng(10).random((2, 3, 7, 8))
    x[0, 0, :3, :3] = 0  # a window of zeros draws its first real tap
    # the NumPy operator's one seed from its generator, given to the operator
    seed = np.random.default_rng(11).integers(2**63, dtype=np.uint64)
    _, pullback = pg.vjp(pg.stochastic_pool, x, 3, 2, 1, rng=np.random.default_rng(11))
    xt = torch.tensor(x)
    window = _ops.sliding_window((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), False)
    _, winners = torch.ops.poolgrad.stochastic_pool_sample(xt, torch.tensor([int(seed)]),
                                                           window)
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
    assert list(fixed.parameters()) == [] and "p" not in fixed.state_dict()
    assert fixed.double().p.dtype == torch.float64 and fixed.float().p.dtype == torch.float32
    stochastic = pt.StochasticPool(2, seed=5)
    first = stochastic(x)
    assert torch.equal(pt.StochasticPool(2, seed=5)(x), first)
    stochastic.eval()
    torch.testing.assert_close(stochastic(x), pt.stochastic_pool(x, 2, training=False))
    fractional = pt.FractionalMaxPool(2, output_ratio=0.7, seed=1)
    assert fractional(x).shape == (2, 4, 5, 5)


@pytest.mark.parametrize("kernel_size, stride", [(None, None), ((2, 3), (1, 2))])
def test_gem_is_an_operator_with_gradients_in_x_and_p(kernel_size, stride):
    """GeM runs as ``torch.ops.poolgrad.gem_pool`` (and its backward op): opcheck,
    gradcheck and gradgradcheck in x and a learned p (clamped inputs included), and
    (windowed) torch.compile with fullgraph keeps the values, the channels-last layout
    and dp."""
    g = torch.Generator().manual_seed(2)
    x = (torch.rand(2, 3, 5, 7, dtype=torch.float64, generator=g) + 0.02).requires_grad_()
    x.data.view(-1)[::9] = 0.01  # under eps: no gradient there
    p = torch.tensor(2.7, dtype=torch.float64, requires_grad=True)
    fn = functools.partial(pt.gem_pool, kernel_size=kernel_size, stride=stride, eps=0.015)
    assert torch.autograd.gradcheck(fn, (x, p))
    assert torch.autograd.gradgradcheck(fn, (x, p))
    window = (_ops.adaptive_window((1, 1)) if kernel_size is None
              else _ops.sliding_window(kernel_size, stride, ((0, 0),) * 2, (1, 1), False))
    xf, pf = x.detach().float(), p.detach().float().requires_grad_()
    torch.library.opcheck(torch.ops.poolgrad.gem_pool, (xf.requires_grad_(), pf, 0.015, window))
    y = torch.ops.poolgrad.gem_pool(xf, pf, 0.015, window)
    torch.library.opcheck(torch.ops.poolgrad.gem_pool_backward,
                          (torch.rand_like(y), xf, y, pf, 0.015, window, True))
    if kernel_size is None:
        return  # (compiling both windows would cost the suite seconds for nothing new)
    module = pt.GeMPool(3.0, kernel_size, stride)
    xc = torch.rand(2, 4, 8, 9, generator=g).contiguous(memory_format=torch.channels_last)
    compiled = torch.compile(module, fullgraph=True)(xc.requires_grad_())
    compiled.sum().backward()
    dp = module.p.grad.clone()
    module.p.grad = None
    eager = module(xc)
    eager.sum().backward()
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(module.p.grad, dp)
    assert compiled.is_contiguous(memory_format=torch.channels_last)


def test_soft_and_stochastic_pooling_are_operators():
    """SoftPool and stochastic pooling run as ``weighted_pool``, its backward and
    ``stochastic_pool_sample``: opcheck, gradgradcheck through the functions, and the
    channels-last layout kept."""
    g = torch.Generator().manual_seed(5)
    x = torch.rand(2, 3, 5, 6, dtype=torch.float64, generator=g).requires_grad_()
    assert torch.autograd.gradgradcheck(lambda t: pt.soft_pool(t, 3, 2, 1), (x,))
    assert torch.autograd.gradgradcheck(
        lambda t: pt.stochastic_pool(t + 0.1, 2, 1, training=False), (x,))
    window = _ops.sliding_window((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), True)
    xf = x.detach().float().contiguous(memory_format=torch.channels_last).requires_grad_()
    for kind in (_kind_ops.SOFT, _kind_ops.SELF):
        torch.library.opcheck(torch.ops.poolgrad.weighted_pool, (xf, kind, window))
        y, norm = torch.ops.poolgrad.weighted_pool(xf, kind, window)
        assert y.is_contiguous(memory_format=torch.channels_last)
        torch.library.opcheck(torch.ops.poolgrad.weighted_pool_backward,
                              (torch.rand_like(y), xf, y, norm, kind, window))
        # the values alone (inference), whose gradient recomputes the norm
        torch.library.opcheck(torch.ops.poolgrad.weighted_pool_values, (xf, kind, window))
        values = torch.ops.poolgrad.weighted_pool_values(xf, kind, window)
        torch.testing.assert_close(values, y, rtol=0, atol=0)
        assert values.is_contiguous(memory_format=torch.channels_last)
        dy = torch.rand_like(y)
        with_norm = torch.ops.poolgrad.weighted_pool(xf, kind, window)[0]
        torch.testing.assert_close(torch.autograd.grad(values, xf, dy),
                                   torch.autograd.grad(with_norm, xf, dy), rtol=0, atol=0)
    torch.library.opcheck(torch.ops.poolgrad.stochastic_pool_sample,
                          (xf, torch.tensor([2**63 - 1]), window))


@pytest.mark.parametrize("kernel, stride, padding", [(2, 2, 0), (3, 2, 1)])
def test_mixed_and_gated_pooling_are_operators(kernel, stride, padding):
    """Mixed and gated pooling run as ``blend_pool`` and its backward: gradcheck and
    gradgradcheck in x and the learned weights, opcheck in both layouts, the layout
    kept, and the definition's values (the max, the mean counting padding, the gate's
    sigmoid over the zero-padded window)."""
    g = torch.Generator().manual_seed(6)
    x = torch.rand(2, 3, 6, 7, dtype=torch.float64, generator=g)
    x = (x + torch.arange(x.numel(), dtype=torch.float64).reshape(x.shape) * 1e-4)  # no ties
    x.requires_grad_()
    alpha = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    gate = torch.randn(kernel, kernel, dtype=torch.float64, generator=g, requires_grad=True)
    mixed = functools.partial(pt.mixed_pool, kernel_size=kernel, stride=stride,
                              padding=padding)
    gated = functools.partial(pt.gated_pool, kernel_size=kernel, stride=stride,
                              padding=padding)
    for fn, weights in ((lambda t, a: mixed(t, alpha=a), alpha), (gated, gate)):
        assert torch.autograd.gradcheck(fn, (x, weights))
        assert torch.autograd.gradgradcheck(fn, (x, weights))
    top = torch.nn.functional.max_pool2d(x, kernel, stride, padding)
    mean = torch.nn.functional.avg_pool2d(x, kernel, stride, padding)
    taps = torch.nn.functional.pad(x, (padding,) * 4).unfold(2, kernel, stride).unfold(
        3, kernel, stride)
    share = torch.sigmoid((taps * gate).sum((-2, -1)))
    torch.testing.assert_close(gated(x, gate), share * top + (1 - share) * mean,
                               rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(mixed(x, alpha=alpha), 0.3 * top + 0.7 * mean, rtol=1e-14,
                               atol=1e-15)
    window = _ops.sliding_window((kernel,) * 2, (stride,) * 2, ((padding, padding),) * 2,
                                 (1, 1), False)
    for fmt in (torch.contiguous_format, torch.channels_last):
        xf = x.detach().float().contiguous(memory_format=fmt).requires_grad_()
        for kind, weights in ((_kind_ops.MIXED, alpha.detach().reshape(1)),
                              (_kind_ops.GATED, gate.detach().float())):
            weights = weights.clone().requires_grad_()
            torch.library.opcheck(torch.ops.poolgrad.blend_pool, (xf, weights, kind, window))
            y = torch.ops.poolgrad.blend_pool(xf, weights, kind, window)
            assert y.is_contiguous(memory_format=fmt)
            # (its own gradient, a float32 composite, rounds differently compiled)
            torch.library.opcheck(torch.ops.poolgrad.blend_pool_backward,
                                  (torch.rand_like(y), xf, weights, kind, window),
                                  rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pre, mode", [("none", "reflect"), ("max", "zeros"),
                                       ("avg", "circular"), ("max", "replicate")])
def test_blur_kinds_are_operators(pre, mode):
    """``blur_pool`` and its backward: opcheck in both layouts, the output in the input's
    layout, and the values of the definition (the stride-1 pre-pool, the padding and a
    depthwise binomial convolution)."""
    g = torch.Generator().manual_seed(6)
    x = torch.rand(2, 3, 9, 8, generator=g)
    kernel = (1, 1) if pre == "none" else (2, 3)
    pads = ((1, 1), (2, 1))
    geometry = _kind_ops.blur_geometry(pre, kernel, (2, 2), (3, 4), pads, mode)
    for layout in (torch.contiguous_format, torch.channels_last):
        xl = x.contiguous(memory_format=layout).requires_grad_()
        torch.library.opcheck(torch.ops.poolgrad.blur_pool, (xl, geometry))
        y, winners = torch.ops.poolgrad.blur_pool(xl, geometry)
        assert y.is_contiguous(memory_format=layout)
        torch.library.opcheck(torch.ops.poolgrad.blur_pool_backward,
                              (torch.rand_like(y), winners, geometry, list(x.shape)))
        # the output alone (inference), whose gradient recomputes the winners
        torch.library.opcheck(torch.ops.poolgrad.blur_pool_values, (xl, geometry))
        values = torch.ops.poolgrad.blur_pool_values(xl, geometry)
        torch.testing.assert_close(values, y, rtol=0, atol=0)
        assert values.is_contiguous(memory_format=layout)
        dy = torch.rand_like(y)
        kept = torch.ops.poolgrad.blur_pool(xl, geometry)[0]
        torch.testing.assert_close(torch.autograd.grad(values, xl, dy),
                                   torch.autograd.grad(kept, xl, dy), rtol=0, atol=0)
    pooled = x
    if pre != "none":
        pooled = (torch.nn.functional.max_pool2d(x, kernel, 1) if pre == "max"
                  else torch.nn.functional.avg_pool2d(x, kernel, 1))
    torch.testing.assert_close(y, blurred(pooled, (2, 2), (3, 4), pads, mode))


def blurred(x, stride, sizes, pads, mode):
    """The blur's definition in torch's own ops: ``x`` padded in ``mode``, then a
    depthwise convolution with the outer product of the binomial filters at the stride."""
    flat = [p for lo, hi in reversed(pads) for p in (lo, hi)]
    x = torch.nn.functional.pad(x, flat, mode="constant" if mode == "zeros" else mode)
    weight = torch.ones((), dtype=torch.float64)
    for axis, size in enumerate(sizes):
        taps = torch.tensor([math.comb(size - 1, t) / 2 ** (size - 1) for t in range(size)],
                            dtype=torch.float64)
        weight = weight.unsqueeze(-1) * taps.reshape((1,) * axis + (-1,))
    channels = x.shape[1]
    weight = weight.to(x.dtype).expand(channels, 1, *sizes)
    conv = (torch.nn.functional.conv1d, torch.nn.functional.conv2d,
            torch.nn.functional.conv3d)[len(sizes) - 1]
    return conv(x, weight, stride=stride, groups=channels)


@pytest.mark.parametrize("kernel, sequence", [((2, 3), "pseudo_random"),
                                              (("disjoint", "overlapping"), "random")])
def test_fractional_max_pool_is_an_operator(kernel, sequence):
    """``fractional_max_pool`` and its backward and indices: opcheck in both layouts, the
    output in the input's layout, the NumPy operator's values and winners' indices for
    the same draws (the random orders too), gradients to second order, and one graph
    under torch.compile(fullgraph=True)."""
    g = torch.Generator().manual_seed(8)
    x = torch.rand(2, 3, 11, 12, dtype=torch.float64, generator=g)
    out = [5, 7]
    samples = torch.rand(2, 3, 2, dtype=torch.float64, generator=g)
    steps = [o - (not isinstance(k, str)) for k, o in zip(kernel, out, strict=True)]
    orders = (torch.rand(6, sum(steps), dtype=torch.float64, generator=g)
              if sequence == "random" else torch.empty(6, 0, dtype=torch.float64))
    windows = _kind_ops.fractional_geometry(kernel, out, sequence)
    op = torch.ops.poolgrad
    for layout in (torch.contiguous_format, torch.channels_last):
        xl = x.clone(memory_format=layout).requires_grad_()
        torch.library.opcheck(op.fractional_max_pool, (xl, samples, orders, windows))
        y, winners = op.fractional_max_pool(xl, samples, orders, windows)
        assert y.is_contiguous(memory_format=layout)
        torch.library.opcheck(op.fractional_max_pool_backward,
                              (torch.rand_like(y), winners, samples, orders, windows,
                               list(x.shape)))
        torch.library.opcheck(op.fractional_max_pool_indices,
                              (winners, samples, orders, windows, list(x.shape)))
    if sequence == "pseudo_random":
        expected, indices = pg.fractional_max_pool(x.numpy(), kernel, out, return_indices=True,
                                                   samples=samples.numpy())
        assert torch.equal(op.fractional_max_pool_indices(winners, samples, orders, windows,
                                                          list(x.shape)),
                           torch.from_numpy(indices))
    else:  # the definition: each plane's windows from the same orders, their maxima
        columns = iter(np.split(orders.numpy(), np.cumsum(steps)[:-1], axis=1))

        class Orders:
            def random(self, shape):
                return next(columns)

        starts, lengths, _ = fractional.region_tables(
            tuple(x.shape[2:]), kernel, out, samples.numpy().reshape(6, 2), sequence, Orders())
        planes = x.reshape(6, 11, 12).numpy()
        expected = np.array([[[planes[p, starts[p, 1, i]: starts[p, 1, i] + lengths[p, 1, i],
                                      starts[p, 2, j]: starts[p, 2, j] + lengths[p, 2, j]].max()
                               for j in range(out[1])] for i in range(out[0])]
                             for p in range(6)]).reshape(y.shape)
    np.testing.assert_array_equal(y.detach().numpy(), expected)
    leaf = x.clone().requires_grad_()
    f = lambda t: op.fractional_max_pool(t, samples, orders, windows)[0]  # noqa: E731
    assert torch.autograd.gradcheck(f, (leaf,))
    assert torch.autograd.gradgradcheck(f, (leaf,))
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), f(x))


def test_kinds_compile_whole_and_match_eager():
    """torch.compile(fullgraph=True) over the kinds (GeM's operator has its own test;
    attention pooling's training pass runs its ops; a seeded or fractional draw's
    torch.Generator cannot enter a graph): one graph, the values and the gradients eager
    gives. The blur backward here corrupted the heap under Inductor before the CPU
    padding moved to F.pad."""
    modules = [pt.BlurPool(), pt.MaxBlurPool(2, 2, 3, "zeros"), pt.SoftPool(2),
               pt.StochasticPool(2).eval(), pt.GatedPool(2), pt.MixedPool(3, 2, 1),
               pt.AttentionPool(3, queries=2)]

    def outputs(t):
        return [module(t) for module in modules]
    x = torch.rand(2, 3, 9, 10, requires_grad=True)
    compiled = torch.compile(outputs, fullgraph=True)(x)
    weights = [torch.rand_like(y) for y in compiled]
    (compiled_dx,) = torch.autograd.grad(compiled, x, weights)
    eager = outputs(x)
    (eager_dx,) = torch.autograd.grad(eager, x, weights)
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(compiled_dx, eager_dx)


@pytest.mark.parametrize("call, error, message", [
    (lambda x: pt.stochastic_pool(x - 2, 2), ValueError, "x must be >= 0"),
    (lambda x: pt.stochastic_pool(  # the check reads a channels-last x in memory order
        torch.where(torch.arange(4) == 3, -1.0, x).contiguous(
            memory_format=torch.channels_last), 2, training=False),
     ValueError, "x must be >= 0"),
    (lambda x: torch.compile(  # the CPU operator checks the taps it reads, compiled too
        lambda t: pt.stochastic_pool(t, 2, training=False), backend="eager", fullgraph=True)(
            torch.where(torch.arange(4) == 3, float("nan"), x)), ValueError, "x must be >= 0"),
    (lambda x: pt.stochastic_pool(  # with a backward to follow
        torch.where(torch.arange(4) == 0, -1.0, x).requires_grad_(), 2, training=False),
     ValueError, "x must be >= 0"),
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


# --------------------------------------------------- the input rule and the parameters

S = np.random.default_rng(6).random((3, 2))  # a (3, H, W) image's fractional samples
UNBATCHED = [  # name, arguments after x (arrays become tensors for torch), keywords
    ("blur_pool", (), {}), ("max_blur_pool", (), {}), ("avg_blur_pool", (3, 1), {}),
    ("soft_pool", (2,), {}), ("stochastic_pool", (2,), {"training": False}),
    ("fractional_max_pool", (2, 4), {"samples": S}), ("gem_pool", (), {}),
    ("gem_pool", (3.0, 2), {}), ("mixed_pool", (2,), {}), ("gated_pool", (G[:2, :2], 2), {}),
    ("attention_pool", (Q[:, :3], W[:3, :3]), {}),
]


@pytest.mark.parametrize("name, args, kwargs", UNBATCHED,
                         ids=[f"{name}-{len(args)}" for name, args, _ in UNBATCHED])
def test_spatial_dims_pools_an_unbatched_image_as_numpy_and_as_its_batch_of_one(
        name, args, kwargs):
    x = np.random.default_rng(11).random((3, 8, 8))
    xt = torch.tensor(x, requires_grad=True)
    torch_args = [torch.tensor(a) if isinstance(a, np.ndarray) else a for a in args]
    # torch's samples for an unbatched x are (1, C, ndim), as torch's own
    torch_kwargs = {k: torch.tensor(v)[None] for k, v in kwargs.items()}
    fn = getattr(pt, name)
    y = fn(xt, *torch_args, spatial_dims=2, **torch_kwargs)
    expected = fn(xt[None], *torch_args, **torch_kwargs)[0]
    assert torch.equal(y, expected)
    np.testing.assert_allclose(y.detach().numpy(), getattr(pg, name)(
        x, *args, spatial_dims=2, **kwargs), rtol=1e-12, atol=1e-14)
    dy = torch.rand_like(y)
    (dx,) = torch.autograd.grad(y, xt, dy, retain_graph=True)
    assert torch.equal(dx, torch.autograd.grad(expected, xt, dy)[0])


def test_rank_3_is_a_batch_of_1d_signals_unless_spatial_dims_says_and_modules_take_it():
    from poolgrad import nn as numpy_nn
    x = torch.rand(3, 8, 8)
    assert pt.MaxBlurPool()(x).shape == (3, 8, 4)  # as torch's F.interpolate reads rank 3
    assert pt.GeMPool()(x).shape == (3, 8, 1)
    expected = pt.max_blur_pool(x[None])[0]
    for module in (pt.MaxBlurPool(spatial_dims=2), numpy_nn.MaxBlurPool(spatial_dims=2)):
        y = module(x) if isinstance(module, torch.nn.Module) else module.forward(x.numpy())
        torch.testing.assert_close(torch.as_tensor(y), expected)
    modules = [pt.BlurPool(spatial_dims=2), pt.AvgBlurPool(spatial_dims=2),
               pt.SoftPool(2, spatial_dims=2), pt.StochasticPool(2, spatial_dims=2),
               pt.FractionalMaxPool(2, 4, spatial_dims=2), pt.GeMPool(spatial_dims=2),
               pt.MixedPool(2, spatial_dims=2), pt.GatedPool(2, spatial_dims=2)]
    assert [tuple(m(x).shape) for m in modules] == [(3, 4, 4)] * 5 + [(3, 1, 1)] + [
        (3, 4, 4)] * 2
    assert pt.AttentionPool(3, queries=2, spatial_dims=2)(x).shape == (6,)
    assert numpy_nn.AttentionPool(3, queries=2, spatial_dims=2).forward(x.numpy()).shape == (6,)


TORCH_KINDS = {  # name -> the arguments after x
    "blur_pool": (), "max_blur_pool": (), "avg_blur_pool": (), "soft_pool": (2,),
    "stochastic_pool": (2,), "fractional_max_pool": (2, 1), "gem_pool": (),
    "mixed_pool": (2,), "gated_pool": (torch.ones(2), 2),
    "attention_pool": (torch.ones(1, 2), torch.eye(2)),
}


@pytest.mark.parametrize("name", TORCH_KINDS)
@pytest.mark.parametrize("shape, spatial_dims, match", [
    ((4, 6), None, r"x has shape \(4, 6\) \(2 dims\) but must be batched, \(N, C, "
                   r"\*spatial\) .*\(3-5 dims\), or unbatched, .*\(2-4 dims\) with spatial_dims"),
    ((1, 2, 2, 2, 2, 2), None, r"x has shape \(1, 2, 2, 2, 2, 2\) \(6 dims\) but must be "
                               r"batched"),
    ((1, 2, 4, 4, 4), 2, r"x has shape \(1, 2, 4, 4, 4\) \(5 dims\) but spatial_dims=2 "
                         r"gives 2 spatial dim\(s\), which need 4 dims \(N, C, \*spatial\) "
                         r"batched or 3 dims"),
    ((1, 2, 4, 4), 4, r"spatial_dims must be 1, 2 or 3"),
], ids=["rank 2", "rank 6", "rank 5 for spatial_dims=2", "spatial_dims=4"])
def test_wrong_rank_is_named_as_numpy_names_it(name, shape, spatial_dims, match):
    x = torch.rand(shape)
    with pytest.raises(ValueError, match=f"^{name}: {match}"):
        getattr(pt, name)(x, *TORCH_KINDS[name], spatial_dims=spatial_dims)


NAN, INF = float("nan"), float("inf")


def _scalar_rows():
    from poolgrad import nn as numpy_nn
    gem = (pt.gem_pool, pg.gem_pool, pt.GeMPool, numpy_nn.GeMPool)
    mixed = (functools.partial(pt.mixed_pool, kernel_size=2),
             functools.partial(pg.mixed_pool, kernel_size=2),
             functools.partial(pt.MixedPool, 2), functools.partial(numpy_nn.MixedPool, 2))
    return [*[("p", v, gem, "p must be a finite number > 0") for v in (0, -1, -2.0, NAN, INF)],
            *[("alpha", v, mixed, "alpha must be a finite number") for v in (NAN, INF, -INF)]]


@pytest.mark.parametrize("name, value, kinds, message", _scalar_rows(),
                         ids=[f"{row[0]}={row[1]}" for row in _scalar_rows()])
def test_learnable_scalars_are_checked_as_numpy_checks_them(name, value, kinds, message):
    """GeM's p and MixedPool's alpha, in both front ends, at construction and at every
    call, a parameter that training (or a user) drove out of range included: p = 0 gave
    the window maximum with a NaN gradient, a negative p a wrong answer, gem_pool(x, 0) a
    ZeroDivisionError, alpha = NaN a NaN output."""
    function, operator, module, layer = kinds
    x = torch.rand(1, 3, 4, 4)
    fixed, trained = module(), layer()
    with torch.no_grad():
        getattr(fixed, name).fill_(value)
    trained.params[name][...] = value
    for call in (lambda: module(**{name: value}), lambda: layer(**{name: value}),
                 lambda: function(x, **{name: value}),
                 lambda: function(x, **{name: torch.tensor(float(value))}),
                 lambda: operator(x.numpy(), **{name: value}),
                 lambda: fixed(x), lambda: trained.forward(x.numpy())):
        with pytest.raises(ValueError, match=f"^{message}"):
            call()


@pytest.mark.parametrize("gate, message", [
    (np.ones((3, 3)), r"gate must have the window's shape \(2, 2\), got \(3, 3\)"),
    (np.ones(2), r"gate must have the window's shape \(2, 2\), got \(2,\)"),
    (np.array([[1.0, NAN], [0, 0]]), "gate must hold finite numbers only, got nan"),
    (np.array([[1.0, 0], [-INF, 0]]), "gate must hold finite numbers only, got -inf"),
])
def test_the_gate_is_checked_as_numpy_checks_it(gate, message):
    from poolgrad import nn as numpy_nn
    x = torch.rand(1, 3, 4, 4)
    module, layer = pt.GatedPool(2), numpy_nn.GatedPool(2)
    module.gate = torch.nn.Parameter(torch.tensor(gate))  # as a user or training set it
    layer.params["gate"] = gate
    for call in (lambda: pt.gated_pool(x, torch.tensor(gate), 2),
                 lambda: pg.gated_pool(x.numpy(), gate, 2),
                 lambda: module(x), lambda: layer.forward(x.numpy())):
        with pytest.raises(ValueError, match=f"^{message}"):
            call()


def test_attention_pool_sizes_and_shapes_are_checked_on_both_sides():
    from poolgrad import nn as numpy_nn
    for build in (pt.AttentionPool, numpy_nn.AttentionPool):
        with pytest.raises(ValueError, match=r"^AttentionPool: heads must be a positive int"):
            build(4, heads=0)  # was a ZeroDivisionError
        with pytest.raises(ValueError, match=r"^AttentionPool: heads \(3\) must divide"):
            build(4, heads=3)
    x = torch.rand(1, 3, 4, 4)  # 3 channels for a 4-channel head
    with pytest.raises(ValueError, match=r"^queries must be \(queries, C\) = \(M, 3\)"):
        pt.AttentionPool(4)(x)
    with pytest.raises(ValueError, match=r"^queries must be \(queries, C\) = \(M, 3\)"):
        numpy_nn.AttentionPool(4).forward(x.numpy())
    with pytest.raises(ValueError, match=r"^heads must be a positive int dividing the 3"):
        pt.attention_pool(x, torch.ones(1, 3), torch.eye(3), heads=0)
    with pytest.raises(TypeError, match=r"^attention_pool: queries must be a tensor, got nd"):
        pt.attention_pool(x, np.ones((1, 3)), torch.eye(3))
    with pytest.raises(ValueError, match=r"^attention_pool: key_weight must be on x's dev"):
        pt.attention_pool(x, torch.ones(1, 3), torch.eye(3, device="meta"))


# torch's forward mode loads its decompositions through torch.jit.script (torch 2.13)
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_attention_pool_under_torch_func_and_forward_mode():
    """The CPU training pass's ops have no functorch or forward-mode rules, so under
    those transforms (a module's parameters require grad) attention pooling takes torch's
    own products: torch.func.grad over the parameters and a forward-mode derivative in
    x give what reverse mode gives."""
    from torch.autograd import forward_ad
    from torch.func import functional_call, grad
    module = pt.AttentionPool(4, heads=2, queries=3).double()
    x = torch.randn(2, 4, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    params = dict(module.named_parameters())
    by_func = grad(lambda p: functional_call(module, p, (x,)).square().sum())(params)
    module(x).square().sum().backward()
    for name, value in params.items():
        torch.testing.assert_close(by_func[name], value.grad)
    tangent = torch.ones_like(x)
    with forward_ad.dual_level():
        dual = module(forward_ad.make_dual(x, tangent))
        derivative = forward_ad.unpack_dual(dual).tangent
    expected = torch.autograd.functional.jvp(lambda t: module(t), x, tangent)[1]
    torch.testing.assert_close(derivative, expected)


@pytest.mark.parametrize("shape", [(0, 3, 6, 6), (2, 0, 6, 6)])
def test_kinds_pool_an_empty_batch_or_no_channels(shape):
    """An empty output of the right shape and an empty gradient, in both layouts (the
    stochastic check once took the min of an empty tensor, which torch refuses)."""
    kinds = [lambda t: pt.stochastic_pool(t, 2, training=False),
             lambda t: pt.stochastic_pool(t, 2), lambda t: pt.soft_pool(t, 2),
             lambda t: pt.gem_pool(t, 3.0, 2), lambda t: pt.max_blur_pool(t),
             lambda t: pt.fractional_max_pool(t, 2, output_ratio=0.5)]
    for fmt in (torch.contiguous_format, torch.channels_last):
        x = torch.zeros(shape).contiguous(memory_format=fmt).requires_grad_()
        for kind in kinds:
            y = kind(x)
            assert tuple(y.shape) == shape[:2] + (3, 3)
            (dx,) = torch.autograd.grad(y.sum(), x)
            assert dx.shape == x.shape
