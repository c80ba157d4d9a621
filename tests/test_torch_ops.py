"""poolgrad.torch: the custom ops' registration, gradients to second order, parity with
torch.nn.functional, torch.compile, deterministic mode, dtypes, memory formats, the
state kept for the backward, and bad input.

Random configurations come from seeded generators, so a failure names its seed.
"""

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pt = pytest.importorskip("poolgrad.torch")
from poolgrad.torch import _cpu as cpu  # noqa: E402
from poolgrad.torch import _ops as O  # noqa: E402

F = torch.nn.functional


def window2d(kernel=3, stride=2, pad=1, dilation=1, ceil_mode=False, ndim=2):
    return O.sliding_window((kernel,) * ndim, (stride,) * ndim, ((pad, pad),) * ndim,
                            (dilation,) * ndim, ceil_mode)


def random_config(rng, torch_compatible=True):
    """A sliding configuration PyTorch accepts (padding at most half the kernel)."""
    ndim = int(rng.integers(1, 4))
    kernel = tuple(int(k) for k in rng.integers(1, 5, ndim))
    stride = tuple(int(s) for s in rng.integers(1, 4, ndim))
    dilation = tuple(int(d) for d in rng.integers(1, 3, ndim))
    padding = tuple(int(rng.integers(0, k // 2 + 1)) for k in kernel)
    largest = {1: 13, 2: 9, 3: 6}[ndim]
    spatial = tuple(int(rng.integers(d * (k - 1) + 1, d * (k - 1) + 1 + largest))
                    for k, d in zip(kernel, dilation, strict=True))
    batched = bool(rng.integers(0, 4))  # mostly batched
    lead = (int(rng.integers(1, 3)), int(rng.integers(1, 5))) if batched else (
        int(rng.integers(1, 5)),)
    dtype = (torch.float32, torch.float64)[int(rng.integers(2))]
    channels_last = batched and ndim > 1 and bool(rng.integers(2))
    return dict(ndim=ndim, kernel=kernel, stride=stride, dilation=dilation, padding=padding,
                ceil_mode=bool(rng.integers(2)), shape=lead + spatial, dtype=dtype,
                channels_last=channels_last)


def make_input(rng, config, ties=False, positive=False):
    shape, dtype = config["shape"], config["dtype"]
    if ties:
        x = torch.from_numpy(rng.integers(-3, 4, shape)).to(dtype)
    else:
        x = torch.from_numpy(rng.standard_normal(shape)).to(dtype)
    if positive:
        x = x.abs() + 0.1
    if config["channels_last"]:
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        x = x.contiguous(memory_format=fmt)
    return x


def forward_backward(fn, x, seed=0):
    """``fn(x)`` and the gradient of ``(fn(x) * weights).sum()`` through autograd."""
    leaf = x.detach().clone().requires_grad_()
    out = fn(leaf)
    values = out[0] if isinstance(out, tuple) else out
    weights = torch.from_numpy(np.random.default_rng(seed).standard_normal(values.shape))
    (values * weights.to(values.dtype)).sum().backward()
    return out, leaf.grad


def close(a, b):
    tolerance = dict(rtol=2e-5, atol=2e-6) if a.dtype == torch.float32 else dict(
        rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(a, b, **tolerance)


# ------------------------------------------------------- parity with torch.nn.functional


@pytest.mark.parametrize("seed", range(120))
def test_max_pool_matches_torch(seed):
    rng = np.random.default_rng(seed)
    c = random_config(rng)
    x = make_input(rng, c, ties=seed % 2 == 1)
    name = f"max_pool{c['ndim']}d"
    args = (c["kernel"], c["stride"], c["padding"], c["dilation"], c["ceil_mode"], True)
    (y, indices), dx = forward_backward(lambda t: getattr(pt, name)(t, *args), x, seed)
    (y_ref, indices_ref), dx_ref = forward_backward(lambda t: getattr(F, name)(t, *args), x,
                                                    seed)
    assert torch.equal(y, y_ref) and torch.equal(indices, indices_ref)
    close(dx, dx_ref)
    if c["channels_last"]:
        assert O.memory_format(y) == O.memory_format(x) == O.memory_format(dx)


@pytest.mark.parametrize("seed", range(80))
def test_avg_pool_matches_torch(seed):
    rng = np.random.default_rng(seed)
    c = random_config(rng)
    x = make_input(rng, c)
    divisor = int(rng.integers(1, 5)) if seed % 3 == 0 and c["ndim"] > 1 else None
    name = f"avg_pool{c['ndim']}d"
    args = (c["kernel"], c["stride"], c["padding"], c["ceil_mode"], bool(seed % 2))
    if divisor is not None:
        args += (divisor,)
    y, dx = forward_backward(lambda t: getattr(pt, name)(t, *args), x, seed)
    y_ref, dx_ref = forward_backward(lambda t: getattr(F, name)(t, *args), x, seed)
    close(y, y_ref)
    close(dx, dx_ref)
    assert O.memory_format(y) == O.memory_format(x) == O.memory_format(dx)


@pytest.mark.parametrize("seed", range(40))
def test_lp_pool_matches_torch_on_nonnegative_input(seed):
    rng = np.random.default_rng(seed)
    c = random_config(rng)
    x = make_input(rng, c, positive=True)
    p = (1.0, 2.0, 3.0, 1.5)[seed % 4]
    name = f"lp_pool{c['ndim']}d"
    # torch's lp_pool has no padding or dilation and scales ceil_mode's partial windows;
    # its 1-d version takes an int kernel only
    kernel = c["kernel"][0] if c["ndim"] == 1 else c["kernel"]
    y, dx = forward_backward(lambda t: getattr(pt, name)(t, p, kernel, c["stride"]), x)
    y_ref, dx_ref = forward_backward(lambda t: getattr(F, name)(t, p, kernel, c["stride"]), x)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_adaptive_matches_torch(seed, kind):
    rng = np.random.default_rng(seed)
    c = random_config(rng)
    x = make_input(rng, c, ties=kind == "max" and seed % 2 == 1)
    spatial = c["shape"][-c["ndim"]:]
    sizes = tuple(int(rng.integers(1, 2 * s + 2)) for s in spatial)
    if seed % 5 == 0:
        sizes = (1,) * c["ndim"]  # the global-pooling kernels
    name = f"adaptive_{kind}_pool{c['ndim']}d"
    extra = (True,) if kind == "max" else ()
    out, dx = forward_backward(lambda t: getattr(pt, name)(t, sizes, *extra), x, seed)
    out_ref, dx_ref = forward_backward(lambda t: getattr(F, name)(t, sizes, *extra), x, seed)
    if kind == "max":
        assert torch.equal(out[0], out_ref[0]) and torch.equal(out[1], out_ref[1])
    else:
        close(out, out_ref)
    close(dx, dx_ref)


@pytest.mark.parametrize("seed", range(30))
def test_max_unpool_matches_torch(seed):
    rng = np.random.default_rng(seed)
    c = random_config(rng)
    c["dilation"] = (1,) * c["ndim"]
    c["shape"] = c["shape"][:-c["ndim"]] + tuple(
        int(rng.integers(k, k + 8)) for k in c["kernel"])
    x = make_input(rng, c)
    ndim = c["ndim"]
    args = (c["kernel"], c["stride"], c["padding"])
    y, indices = getattr(F, f"max_pool{ndim}d")(x, *args, return_indices=True)
    size = x.shape[-ndim:]
    out, dy = forward_backward(
        lambda t: getattr(pt, f"max_unpool{ndim}d")(t, indices, *args, output_size=size), y)
    out_ref, dy_ref = forward_backward(
        lambda t: getattr(F, f"max_unpool{ndim}d")(t, indices, *args, output_size=size), y)
    assert torch.equal(out, out_ref)
    if all(k <= s for k, s in zip(c["kernel"], c["stride"], strict=True)):
        # without overlap no two entries name one place; with it, torch's gradient goes
        # to every entry naming a place, poolgrad's only to the one written there
        assert torch.equal(dy, dy_ref)


def test_unbatched_input_equals_its_batch_of_one():
    x = torch.randn(3, 9, 8, dtype=torch.float64)
    for name, args in [("max_pool2d", (3, 2, 1)), ("avg_pool2d", (2,)),
                       ("lp_pool2d", (2.0, 2)), ("adaptive_max_pool2d", ((4, 3),)),
                       ("adaptive_avg_pool2d", ((4, 3),))]:
        function = getattr(pt, name)
        assert torch.equal(function(x, *args), function(x[None], *args)[0]), name
    y, indices = pt.max_pool2d(x, 2, return_indices=True)
    assert torch.equal(pt.max_unpool2d(y, indices, 2), F.max_unpool2d(y[None], indices[None],
                                                                      2)[0])


def test_poolgrad_extras_match_the_numpy_api():
    import poolgrad as pg
    x = torch.randn(2, 3, 9, 10, dtype=torch.float64)
    a = x.numpy()
    assert np.array_equal(pt.max_pool2d(x, 3, 2, "same", ties="split").numpy(),
                          pg.max_pool(a, 3, 2, "same", ties="split"))
    assert np.array_equal(pt.avg_pool2d(x, 3, 1, ((0, 2), (1, 1)), dilation=2).numpy(),
                          pg.avg_pool(a, 3, 1, ((0, 2), (1, 1)), dilation=2))
    assert np.array_equal(pt.lp_pool2d(x, 3, 2, padding=1, dilation=(1, 2)).numpy(),
                          pg.lp_pool(a, 3, 2, padding=1, dilation=(1, 2)))
    # abs(x), as ONNX: torch's lp_pool is NaN here
    assert torch.isfinite(pt.lp_pool2d(-x.abs(), 1.5, 2)).all()


# ------------------------------------------------------------------- registration


def _channels_last_image():
    return torch.randn(2, 3, 8, 7).contiguous(memory_format=torch.channels_last)


def _pooling_cases(x, window):
    """``(op, args)`` for every pooling op on ``x`` and ``window``."""
    grad = x.detach().clone().requires_grad_()
    y, winners = O.max_pool(x, window, "first")
    dy = torch.randn_like(y, requires_grad=True)
    size = list(x.shape)
    cases = [(O.max_pool, (grad, window, "first")), (O.max_pool_values, (grad, window)),
             (O.max_pool_backward, (dy, winners, window, size)),
             (O.max_pool_gather, (torch.randn_like(grad), winners, window)),
             (O.max_pool_indices, (winners, window, size)),
             (O.avg_pool, (grad, window, True, None)),
             (O.avg_pool_backward, (dy, window, size, True, None,
                                    O.memory_format(x) != torch.contiguous_format))]
    if window[0] == O.SLIDING:
        positive = (x.abs() + 0.1).requires_grad_()
        cases += [(O.max_pool, (grad, window, "split")),
                  (O.max_pool_split_backward, (dy, x, window)),
                  (O.avg_pool, (grad, window, False, 3)),
                  (O.lp_pool, (positive, 2.5, window)),
                  (O.lp_pool_backward, (dy, positive,
                                        O.lp_pool(positive, 2.5, window).detach(),
                                        2.5, window))]
    return cases


def _unpool_cases():
    """``(op, args)`` for unpooling and its backward."""
    y, indices = F.max_pool2d(_channels_last_image(), 2, return_indices=True)
    unpool = window2d(2, 2, 0)
    return [(O.max_unpool, (y.requires_grad_(), indices, unpool, [8, 7])),
            (O.max_unpool_backward, (torch.randn(2, 3, 8, 7, requires_grad=True), indices,
                                     unpool))]


# Per input, a function making its opcheck cases: called in the test, as collection (in
# every pytest-xdist worker) runs no kernel
_OPCHECK_CASES = [
    pytest.param(lambda: _pooling_cases(_channels_last_image(), window2d()),
                 id="2-d channels-last"),
    pytest.param(lambda: _pooling_cases(torch.randn(2, 3, 11, dtype=torch.float64),
                                        window2d(3, 2, 1, 2, True, ndim=1)), id="1-d float64"),
    pytest.param(lambda: _pooling_cases(torch.randn(1, 2, 5, 6, 4, dtype=torch.float64),
                                        window2d(2, 2, 0, ndim=3)), id="3-d float64"),
    pytest.param(lambda: _pooling_cases(_channels_last_image(), O.adaptive_window((3, 5))),
                 id="2-d adaptive channels-last"),
    pytest.param(_unpool_cases, id="unpool"),
]


@pytest.mark.parametrize("make_cases", _OPCHECK_CASES)
def test_opcheck(make_cases, request):
    """torch.library.opcheck on every op, per input."""
    for op, args in make_cases():
        try:
            torch.library.opcheck(op, args)
        except Exception as error:
            raise AssertionError(f"{op} on {request.node.callspec.id}: {error}") from error


# --------------------------------------------------------------- gradients, 2nd order


def _differentiable_cases():
    yield "max", lambda t: pt.max_pool2d(t, 3, 2, 1)
    yield "max dilated ceil", lambda t: pt.max_pool1d(t.flatten(2), 3, 2, 1, 2, True)
    yield "max 3d same", lambda t: pt.max_pool3d(t[:, :, None].expand(-1, -1, 3, -1, -1),
                                                 2, 1, "same")
    yield "max channels-last", lambda t: pt.max_pool2d(
        t.contiguous(memory_format=torch.channels_last), 2, 1, ((0, 1), (1, 0)))
    yield "avg", lambda t: pt.avg_pool2d(t, 3, 2, 1, True, False)
    yield "avg divisor dilation", lambda t: pt.avg_pool2d(t, 2, 1, 1, False, True, 3,
                                                          dilation=2)
    yield "avg 3d", lambda t: pt.avg_pool3d(t[:, :, None].expand(-1, -1, 2, -1, -1), 2, 1)
    yield "lp 2", lambda t: pt.lp_pool2d(t, 2, 3, 2, padding=1)
    yield "lp 3.5 1d", lambda t: pt.lp_pool1d(t.flatten(2), 3.5, 4, 3, True)
    yield "lp 1", lambda t: pt.lp_pool2d(t, 1, 2, dilation=2)
    yield "adaptive max", lambda t: pt.adaptive_max_pool2d(t, (3, 5))
    yield "adaptive avg", lambda t: pt.adaptive_avg_pool2d(t, (4, None))
    yield "global avg", lambda t: pt.adaptive_avg_pool3d(t[:, :, None], 1)
    yield "global max", lambda t: pt.adaptive_max_pool1d(t.flatten(2), 1)
    yield "unbatched max", lambda t: pt.max_pool2d(t[0], 2)
    yield "unpool", lambda t: pt.max_unpool2d(
        t[:, :, :3, :3], torch.tensor([[[[0, 3, 5], [14, 17, 19], [28, 30, 34]]]]).expand(
            2, 3, 3, 3), 2, output_size=(7, 7))


@pytest.mark.parametrize("name, fn", list(_differentiable_cases()))
def test_gradcheck_and_gradgradcheck(name, fn):
    # away from ties and from 0 (where Lp's derivatives are conventions)
    rng = np.random.default_rng(1)
    values = rng.permutation(np.linspace(0.5, 3.0, 2 * 3 * 7 * 7)) * rng.choice([-1, 1],
                                                                                 2 * 3 * 7 * 7)
    x = torch.from_numpy(values.reshape(2, 3, 7, 7)).requires_grad_()
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


def test_split_ties_backward_and_its_adjoint():
    x = torch.tensor([[[[1.0, 3.0, 3.0], [2.0, 3.0, 0.0], [3.0, 1.0, 1.0]]]],
                     dtype=torch.float64)
    window = window2d(2, 1, 0)
    dy = torch.tensor([[[[6.0, 4.0], [3.0, 9.0]]]], dtype=torch.float64)
    dx = O.max_pool_split_backward(dy, x, window)
    # window (0,0) ties three 3s? no: 1,3,2,3 -> two 3s share 6; (0,1): 3,3,3,0 -> three
    expected = torch.tensor([[[[0, 3 + 4 / 3, 4 / 3], [0, 3 + 4 / 3 + 1.5 + 9, 0],
                               [1.5, 0, 0]]]], dtype=torch.float64)
    torch.testing.assert_close(dx, expected)
    # the double backward is the exact adjoint (linear in dy)
    assert torch.autograd.gradcheck(lambda g: O.max_pool_split_backward(g, x, window),
                                    (dy.clone().requires_grad_(),))
    assert torch.autograd.gradcheck(lambda g: O.max_pool_split_backward(g, x, window)
                                    .pow(2).sum(), (dy.clone().requires_grad_(),))


def test_max_pool_keeps_one_byte_per_output():
    saved = []

    def pack(t):
        saved.append(t)
        return t
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = pt.max_pool2d(x, 2)
    assert [(t.dtype, t.numel()) for t in saved] == [(torch.uint8, y.numel())]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        pt.max_pool1d(torch.randn(1, 2, 600, requires_grad=True), 300)
    assert saved[-1].dtype == torch.uint16


def test_eager_formulas_get_zeros_only_where_an_output_is_differentiable(monkeypatch):
    """Eager calls give a formula None, not a fresh tensor of zeros, for an output that
    takes no gradient (max pooling's winners), and zeros where a differentiable output
    got none (the weights' gradient of a blend's backward, when only ``dx`` is used), as
    the op's own autograd does: the gradients are the op's either way."""
    from poolgrad.torch import _autograd, _kind_ops

    received = []
    backward, setup = _autograd.AUTOGRAD[O.max_pool]

    def recording(ctx, *grads):
        received.append(grads)
        return backward(ctx, *grads)
    monkeypatch.setitem(_autograd.AUTOGRAD, O.max_pool, (recording, setup))
    window, scale = window2d(2, 2, 0), torch.arange(96.0).reshape(2, 3, 4, 4)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    (pt.max_pool2d(x, 2) * scale).sum().backward()
    [(dy, winners_grad)] = received
    assert winners_grad is None and dy.shape == (2, 3, 4, 4)
    assert torch.equal(x.grad, torch.autograd.grad(
        (O.max_pool(x, window, "first")[0] * scale).sum(), x)[0])

    weights = torch.tensor([0.3], dtype=torch.float64)
    dy = torch.randn(2, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    xs = torch.randn(2, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    grads = []
    for run in (_autograd.call, lambda op, *args: op(*args)):  # eager path, then the op
        dx, _ = run(_kind_ops.blend_pool_backward, dy, xs, weights, _kind_ops.MIXED, window)
        grads.append(torch.autograd.grad((dx * probe).sum(), (dy, xs), allow_unused=True))
    for eager, op in zip(*grads, strict=True):
        assert (eager is None and op is None) or torch.allclose(eager, op, rtol=0, atol=1e-12)


def test_cpu_tensors_run_zero_copy(monkeypatch):
    seen = []
    engine = cpu.engines.max_engine

    def spy(x, *args, **kwargs):
        seen.append(x)
        return engine(x, *args, **kwargs)
    monkeypatch.setattr(cpu.engines, "max_engine", spy)
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    pt.max_pool2d(x, 2)
    assert seen[0].__array_interface__["data"][0] == x.data_ptr()


# ------------------------------------------------------------------ dtypes, formats


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precisions_are_stored_as_such_and_computed_in_float32(dtype):
    x = torch.randn(2, 3, 9, 9).to(dtype)
    # (Lp's backward reads the saved output, rounded to the input's precision)
    for fn in (lambda t: pt.max_pool2d(t, 3, 2, 1), lambda t: pt.avg_pool2d(t, 3, 2, 1),
               lambda t: pt.adaptive_avg_pool2d(t, 4)):
        y = fn(x)
        dy = torch.randn(y.shape).to(dtype)  # exact in both precisions
        leaf = x.clone().requires_grad_()
        dx, = torch.autograd.grad(fn(leaf), leaf, dy)
        y32 = fn(x.float())
        leaf32 = x.float().requires_grad_()
        dx32, = torch.autograd.grad(fn(leaf32), leaf32, dy.float())
        assert y.dtype == dx.dtype == dtype
        assert torch.equal(y, y32.to(dtype))
        assert torch.equal(dx, dx32.to(dtype))


def test_channels_last_3d_keeps_its_format():
    x = torch.randn(2, 3, 4, 6, 6).contiguous(memory_format=torch.channels_last_3d)
    for fn in (lambda t: pt.max_pool3d(t, 2), lambda t: pt.avg_pool3d(t, 2)):
        y, dx = forward_backward(fn, x)
        assert y.is_contiguous(memory_format=torch.channels_last_3d) and not y.is_contiguous()
        assert dx.is_contiguous(memory_format=torch.channels_last_3d)


# ---------------------------------------------------------- compile, determinism


def small_cnn(pool_module):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), pool_module.MaxPool2d(3, 2, 1),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(), pool_module.AvgPool2d(2),
        pool_module.LPPool2d(2, 2), pool_module.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(8, 10))


def test_torch_compile_fullgraph_gives_eager_results():
    torch._dynamo.reset()
    x = torch.rand(4, 3, 16, 16)
    pools = torch.nn.Sequential(pt.MaxPool2d(3, 2, 1), pt.AvgPool2d(2), pt.LPPool2d(2, 2),
                                pt.AdaptiveMaxPool2d(1))
    compiled = torch.compile(pools, fullgraph=True)  # fullgraph: a graph break raises
    (y, dx), (y_c, dx_c) = forward_backward(pools, x), forward_backward(compiled, x)
    assert torch.equal(y, y_c) and torch.equal(dx, dx_c)  # the same kernels run

    model = small_cnn(pt)
    compiled = torch.compile(model, fullgraph=True)
    (y, dx), (y_c, dx_c) = forward_backward(model, x), forward_backward(compiled, x)
    # Inductor's convolutions and linear layers round differently from eager's
    torch.testing.assert_close(y_c, y, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dx_c, dx, rtol=1e-4, atol=1e-5)


def test_deterministic_mode_gives_the_same_bits_at_any_thread_count():
    import numba
    x = torch.randn(2, 4, 13, 13, dtype=torch.float64)

    def run():
        outputs = []
        for fn in (lambda t: pt.max_pool2d(t, 3, 1, 1), lambda t: pt.avg_pool2d(t, 3, 1, 1),
                   lambda t: pt.lp_pool2d(t, 2.5, 3, 1), lambda t: pt.adaptive_max_pool2d(t, 5),
                   lambda t: pt.adaptive_avg_pool2d(t, 5), lambda t: pt.max_pool2d(
                       t.round(), 3, 1, 1, ties="split")):
            outputs += list(forward_backward(fn, x))
        return outputs
    before, threads = torch.are_deterministic_algorithms_enabled(), numba.get_num_threads()
    torch.use_deterministic_algorithms(True)
    try:
        first = run()
        numba.set_num_threads(1)
        second = run()
    finally:
        numba.set_num_threads(threads)
        torch.use_deterministic_algorithms(before)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


# ------------------------------------------------------------------- modules


MODULES = ["MaxPool", "AvgPool", "LPPool", "AdaptiveMaxPool", "AdaptiveAvgPool", "MaxUnpool"]


@pytest.mark.parametrize("name", [f"{m}{n}d" for m in MODULES for n in (1, 2, 3)])
def test_modules_have_torch_constructors_and_no_state(name):
    ours, theirs = getattr(pt, name), getattr(torch.nn, name)
    assert issubclass(ours, theirs)
    ours_parameters = list(inspect.signature(ours.__init__).parameters.values())
    theirs_parameters = list(inspect.signature(theirs.__init__).parameters.values())
    positional = [p for p in ours_parameters if p.kind != p.KEYWORD_ONLY]
    assert [(p.name, p.default) for p in positional] == [
        (p.name, p.default) for p in theirs_parameters if p.kind != p.KEYWORD_ONLY] or (
        name == "AvgPool1d" and positional[-1].name == "divisor_override")
    args = {"MaxUnpool": (2,), "LPPool": (2, 2), "AdaptiveMaxPool": (3,),
            "AdaptiveAvgPool": (3,)}.get(name[:-2], (2,))
    module = ours(*args)
    assert not list(module.parameters()) and not list(module.buffers())
    assert repr(module) == f"poolgrad.{repr(theirs(*args))}"  # torch's, named as ours


def test_functions_have_torch_signatures():
    for name in pt.functional.__all__:
        ours = inspect.signature(getattr(pt, name)).parameters.values()
        try:
            theirs = inspect.signature(getattr(F, name)).parameters
        except ValueError:  # a builtin (avg_pool1d): its docstring gives the signature
            first_line = getattr(F, name).__doc__.strip().splitlines()[0]
            expected = first_line[first_line.index("(") + 1: first_line.index(")")]
            listed = ", ".join(str(p) for p in ours if p.kind != p.KEYWORD_ONLY)
            # torch's avg_pool1d has no divisor_override; poolgrad's takes one
            assert listed in (expected, expected + ", divisor_override=None"), name
            continue
        if "args" in theirs:  # torch's return_indices dispatcher: its values-only function
            theirs = inspect.signature(getattr(F, f"_{name}")).parameters
        for p in ours:
            if p.kind != p.KEYWORD_ONLY or p.name not in ("ties", "dilation", "padding"):
                assert p.name in theirs and theirs[p.name].default == p.default, (name, p)


def test_replace_pooling_swaps_every_pooling_module():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.MaxPool2d(3, 2, 1, ceil_mode=True),
        torch.nn.Sequential(torch.nn.AvgPool2d(2, count_include_pad=False),
                            torch.nn.LPPool2d(2, 2)),
        torch.nn.AdaptiveMaxPool2d((2, 3)), torch.nn.AdaptiveAvgPool2d(1))
    x = torch.rand(2, 3, 20, 20)
    expected = model(x)
    assert pt.replace_pooling(model) == 5
    assert pt.replace_pooling(model) == 0
    torch.testing.assert_close(model(x), expected)
    assert type(model[1]) is pt.MaxPool2d and model[1].ceil_mode
    # print(model) shows what changed: every pooling module is poolgrad's, the rest not
    printed = str(model)
    assert printed.count("poolgrad.") == 5 and "(0): Conv2d(" in printed
    assert "(1): poolgrad.MaxPool2d(kernel_size=3, stride=2, padding=1" in printed
    with pytest.raises(TypeError, match="torch.nn.Module"):
        pt.replace_pooling([model])


def test_replace_pooling_to_a_kind():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.MaxPool2d(2), torch.nn.MaxPool2d(3, 2, 1),
        torch.nn.AvgPool2d(2), torch.nn.AdaptiveAvgPool2d(1))
    x = torch.rand(2, 3, 21, 21)
    sizes = [t.shape for t in _activations(model, x)]
    assert pt.replace_pooling(model, to="max_blur") == 2
    # unpadded: the fused MaxBlurPool; padded (a ResNet stem): its max at stride 1 keeps
    # the padding, then the blur subsamples, so every size stays
    assert type(model[1]) is pt.MaxBlurPool and model[1].options["kernel_size"] == 2
    assert [type(m) for m in model[2]] == [pt.MaxPool2d, pt.BlurPool]
    assert model[2][0].stride == 1 and model[2][0].padding == 1
    assert type(model[3]) is torch.nn.AvgPool2d  # max_blur leaves average pooling alone
    assert [t.shape for t in _activations(model, x)] == sizes
    torch.testing.assert_close(model[1](x), pt.max_blur_pool(x, 2, 2))
    assert "(1): poolgrad.MaxBlurPool(" in str(model)
    assert pt.replace_pooling(model, to="gem") == 1 and type(model[4]) is pt.GeMPool

    mapped = torch.nn.Sequential(torch.nn.MaxPool2d(2), torch.nn.AvgPool2d(2),
                                 torch.nn.AdaptiveAvgPool2d(1)).eval()
    made = []
    count = pt.replace_pooling(mapped, to={torch.nn.MaxPool2d: pt.SoftPool,
                                           torch.nn.AvgPool2d: "mixed",
                                           torch.nn.AdaptiveAvgPool2d: lambda m: made.append(m)
                                           or torch.nn.Identity()})
    assert count == 3 and len(made) == 1 and not mapped[0].training
    assert (type(mapped[0]), type(mapped[1]), type(mapped[2])) == (
        pt.SoftPool, pt.MixedPool, torch.nn.Identity)
    torch.testing.assert_close(mapped[0](x), pt.soft_pool(x, 2, 2, 0))


def test_replace_pooling_shared_modules_stride_one_and_a_second_call():
    shared = torch.nn.MaxPool2d(2)
    inner = torch.nn.Sequential(shared)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared, inner,
                                torch.nn.MaxPool2d(3, 1, 1), torch.nn.MaxPool2d(3, 2, 1))
    assert pt.replace_pooling(model, to="max_blur") == 2  # shared, and the strided one
    assert model[0] is model[2] is inner[0] and type(model[0]) is pt.MaxBlurPool
    assert type(model[4]) is torch.nn.MaxPool2d  # stride 1: nothing to anti-alias
    blurred = str(model)
    assert pt.replace_pooling(model, to="max_blur") == 0 and str(model) == blurred
    gem = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1))
    gem.append(gem[0])
    assert pt.replace_pooling(gem, to="gem") == 1 and gem[0].p is gem[1].p  # one p


def _activations(model, x):
    out = []
    for module in model:
        x = module(x)
        out.append(x)
    return out


@pytest.mark.parametrize("model, to, error, words", [
    (torch.nn.MaxPool2d(2, ceil_mode=True), "max_blur", ValueError, "has no ceil_mode"),
    (torch.nn.MaxPool2d(2, dilation=2), "soft", ValueError, "has no dilation"),
    (torch.nn.MaxPool2d(2, return_indices=True), "stochastic", ValueError,
     "has no return_indices"),
    (torch.nn.AdaptiveAvgPool2d(3), "gem", ValueError, "GeM is global or sliding"),
    (torch.nn.MaxPool2d(2), "blurry", ValueError, "to must be one of max_blur"),
    (torch.nn.MaxPool2d(2), ["soft"], TypeError, "to must be None, a name or a mapping"),
    (torch.nn.MaxPool2d(2), {"MaxPool2d": "soft"}, TypeError, "keys of to must be"),
    (torch.nn.MaxPool2d(2), {torch.nn.MaxPool2d: 3}, TypeError, "must be a name, a"),
    (torch.nn.MaxPool2d(2), {torch.nn.MaxPool2d: lambda m: 3}, TypeError,
     "returned int, not a torch.nn.Module"),
    (torch.nn.MaxPool2d(2), {torch.nn.MaxPool2d: pt.BlurPool}, TypeError,
     "cannot build from a pooling module's settings"),
    (torch.nn.AdaptiveAvgPool2d((None, 1)), "gem", ValueError, "GeM is global or sliding"),
])
def test_replace_pooling_refuses_what_the_kind_cannot_be(model, to, error, words):
    fine = torch.nn.AdaptiveAvgPool2d(1) if to == "gem" else torch.nn.MaxPool2d(4)
    wrapped = torch.nn.Sequential(fine, model)
    with pytest.raises(error, match=words):
        pt.replace_pooling(wrapped, to=to)
    assert wrapped[0] is fine and wrapped[1] is model  # an error changes nothing


def _model_source(source):
    if source == "torchvision":  # where its wheel loads (not against this CPU build)
        try:
            return pytest.importorskip("torchvision").models
        except (ImportError, RuntimeError) as error:  # an ABI mismatch raises at import
            pytest.skip(f"torchvision does not load here: {error}")
    return pytest.importorskip("poolgrad.torch.zoo")


@pytest.mark.parametrize("source", ["zoo", "torchvision"])
@pytest.mark.parametrize("architecture", ["resnet18", "vgg11"])
def test_replace_pooling_on_torchvision_architectures(architecture, source):
    models = _model_source(source)
    torch.manual_seed(0)
    model = getattr(models, architecture)(num_classes=10).eval()
    x = torch.rand(2, 3, 64, 64)
    (y, dx) = forward_backward(model, x)
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    assert pt.replace_pooling(model) >= 2
    (y_pg, dx_pg) = forward_backward(model, x)
    torch.testing.assert_close(y_pg, y, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx_pg, dx, rtol=1e-4, atol=1e-6)
    for a, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, a, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call, error, words", [
    (lambda: pt.max_pool2d(torch.randn(2, 3, 4, 4, 4), 2), ValueError, "input must have"),
    (lambda: pt.max_pool2d(torch.randn(8, 8), 2), ValueError, "input must have"),
    (lambda: pt.max_pool2d(torch.randn(1, 1, 4, 4), 0), ValueError, "kernel_size"),
    (lambda: pt.avg_pool2d(torch.randn(1, 1, 4, 4), 2, 0), ValueError, "stride"),
    (lambda: pt.max_pool2d(torch.randn(1, 1, 4, 4), "2"), TypeError, "kernel_size"),
    (lambda: pt.max_pool2d(torch.randn(1, 1, 4, 4), 2, ties="all"), ValueError, "ties"),
    (lambda: pt.max_pool2d(torch.randn(1, 1, 4, 4), 9), ValueError, "kernel"),
    (lambda: pt.max_pool2d(torch.ones(1, 1, 4, 4, dtype=torch.bool), 2), TypeError, "float"),
    (lambda: pt.lp_pool2d(torch.ones(1, 1, 4, 4, dtype=torch.int64), 2, 2), TypeError,
     "float"),
    (lambda: pt.max_pool2d(np.ones((1, 1, 4, 4)), 2), TypeError, "torch.Tensor"),
    (lambda: pt.max_pool2d(torch.randn(1, 1, 4, 4, device="meta"), 2), ValueError, "CPU"),
    (lambda: pt.avg_pool2d(torch.randn(1, 1, 4, 4), 2, divisor_override=0), ValueError,
     "divisor_override"),
    (lambda: pt.lp_pool2d(torch.randn(1, 1, 4, 4), -1, 2), ValueError, "p must be"),
    (lambda: pt.adaptive_avg_pool2d(torch.randn(1, 1, 4, 4), (0, 2)), ValueError,
     "output_size"),
    (lambda: pt.max_unpool2d(torch.randn(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), 2), TypeError,
     "int64"),
    (lambda: pt.max_unpool2d(torch.randn(1, 1, 2, 2), torch.zeros(1, 1, 2, 3,
                                                                  dtype=torch.int64), 2),
     ValueError, "shape"),
    (lambda: pt.max_unpool2d(torch.randn(1, 1, 2, 2), torch.full((1, 1, 2, 2), 99), 2),
     ValueError, "indices must lie"),
    (lambda: O.max_pool_backward(torch.randn(1, 1, 3, 3), torch.zeros(1, 1, 2, 2,
                                                                      dtype=torch.uint8),
                                 window2d(2, 2, 0), [1, 1, 4, 4]), ValueError, "dy has shape"),
])
def test_bad_input_gets_a_clear_error(call, error, words):
    with pytest.raises(error, match=words):
        call()


@pytest.mark.parametrize("bad", [2.0, True, (2.0, 2), (True, 2)])
def test_kept_geometry_never_lets_a_bad_argument_through(bad):
    """The window of each call is kept per arguments; one equal to a kept good one (2.0,
    True + 1) is still refused, as on a first call (it once was not: 2.0 passed after 2)."""
    x = torch.randn(1, 2, 8, 8)
    pt.max_pool2d(x, 2)
    pt.max_pool2d(x, (2, 2))
    pt.kinds._blur_setup(tuple(x.shape), "none", 1, 2, 3, None, "reflect", None,
                         "blur_pool")  # blur_pool's check (no kernel to compile)
    with pytest.raises(TypeError, match="kernel_size"):
        pt.max_pool2d(x, bad)
    with pytest.raises(TypeError, match="stride"):
        pt.blur_pool(x, bad)


def test_inputs_are_never_modified():
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    kept = x.clone()
    y, dx = forward_backward(lambda t: pt.max_pool2d(t, 3, 1, 1), x)
    forward_backward(lambda t: pt.lp_pool2d(t, 3, 2), x)
    forward_backward(lambda t: pt.avg_pool2d(t, 3, 1, 1), x)
    assert torch.equal(x, kept)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32,
                                   torch.int64])
def test_integer_max_pooling_matches_torch(dtype):
    """Integers pool as torch's own max pooling does, values and indices, every layout;
    they carry no gradient (torch refuses requires_grad on them). torch has no integer
    adaptive max pooling: there its float64 result is the reference, exact below 2**52."""
    generator = torch.Generator().manual_seed(3)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -2**52), min(info.max, 2**52)
    # (torch's int8 max pooling numbers a plane's positions in int8: at most 127 of them)
    for shape, args in (((2, 3, 9), (3, 2, 1)), ((2, 3, 9, 10), (3, 2, 1)),
                        ((1, 2, 4, 5, 6), (2, 2))):
        x = torch.randint(low, high, shape, generator=generator, dtype=torch.int64)
        x = x.to(dtype)
        ndim = x.dim() - 2
        ours, theirs = getattr(pt, f"max_pool{ndim}d"), getattr(F, f"max_pool{ndim}d")
        layouts = [x] if ndim == 1 else [x, x.contiguous(memory_format=torch.channels_last
                                                        if ndim == 2 else
                                                        torch.channels_last_3d)]
        for xs in layouts:
            y, indices = ours(xs, *args, return_indices=True)
            expected, expected_indices = theirs(xs, *args, return_indices=True)
            assert y.dtype == dtype and torch.equal(y, expected)
            assert torch.equal(indices, expected_indices)
            assert torch.equal(ours(xs, *args), expected)
            adaptive, adaptive_indices = getattr(pt, f"adaptive_max_pool{ndim}d")(
                xs, 2, return_indices=True)
            reference, reference_indices = getattr(F, f"adaptive_max_pool{ndim}d")(
                xs.double(), 2, return_indices=True)
            assert adaptive.dtype == dtype and torch.equal(adaptive.double(), reference)
            assert torch.equal(adaptive_indices, reference_indices)
    with pytest.raises(TypeError, match=r"avg_pool2d: input must be float16, bfloat16, "
                                        r"float32 or float64, got torch.int64"):
        pt.avg_pool2d(torch.zeros(1, 1, 4, 4, dtype=torch.int64), 2)
    with pytest.raises(TypeError, match=r"max_pool2d: input must be .* or int64, got "
                                        r"torch.bool"):
        pt.max_pool2d(torch.zeros(1, 1, 4, 4, dtype=torch.bool), 2)
