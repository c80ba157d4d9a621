"""poolgrad.nn and poolgrad.optim: gradients against finite differences and PyTorch,
per-example routing against the batch, optimizers against their update formulas."""

import numpy as np
import pytest

import poolgrad as pg
from poolgrad import nn, optim


def small_net(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return nn.Sequential(
        nn.Conv(1, 2, 3, padding=1, rng=rng, dtype=dtype), nn.ReLU(), nn.MaxPool(2),
        nn.Flatten(), nn.Linear(2 * 3 * 3, 3, rng=rng, dtype=dtype))


def loss_of(model, x, labels):
    return nn.SoftmaxCrossEntropy().forward(model.forward(x), labels)


def backprop(model, x, labels):
    loss_fn = nn.SoftmaxCrossEntropy()
    loss_fn.forward(model.forward(x), labels)
    return model.backward(loss_fn.backward())


@pytest.mark.parametrize("seed", range(3))
def test_whole_network_gradients_match_finite_differences(seed):
    rng = np.random.default_rng(seed)
    model = small_net(seed=seed)
    x = rng.standard_normal((4, 1, 6, 6))
    labels = rng.integers(0, 3, 4)
    dx = backprop(model, x, labels)
    eps = 1e-6
    for layer, name in model.parameters():
        w = layer.params[name]
        numeric = np.zeros_like(w)
        for i in np.ndindex(w.shape):
            saved = w[i]
            w[i] = saved + eps
            up = loss_of(model, x, labels)
            w[i] = saved - eps
            down = loss_of(model, x, labels)
            w[i] = saved
            numeric[i] = (up - down) / (2 * eps)
        np.testing.assert_allclose(layer.grads[name], numeric, rtol=1e-5, atol=1e-8,
                                   err_msg=f"{layer!r} {name}")
    numeric_dx = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        shifted = x.copy()
        shifted[i] += eps
        up = loss_of(model, shifted, labels)
        shifted[i] -= 2 * eps
        numeric_dx[i] = (up - loss_of(model, shifted, labels)) / (2 * eps)
    np.testing.assert_allclose(dx, numeric_dx, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("ndim, kwargs", [
    (1, {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2}),
    (1, {"kernel_size": 4, "stride": 1, "padding": 0, "dilation": 1}),
    (2, {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 0), "dilation": (1, 2)}),
    (2, {"kernel_size": 2, "stride": 2, "padding": 0, "dilation": 1}),
])
def test_conv_matches_torch(ndim, kwargs):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(ndim)
    conv = nn.Conv(3, 4, ndim=ndim, rng=rng, dtype=np.float64, **kwargs)
    conv.params["b"] = rng.standard_normal(4)
    x = rng.standard_normal((2, 3) + (9,) * ndim)
    y = conv.forward(x)
    dy = rng.standard_normal(y.shape)
    dx = conv.backward(dy)

    xt = torch.from_numpy(x).requires_grad_()
    wt = torch.from_numpy(conv.params["W"]).requires_grad_()
    bt = torch.from_numpy(conv.params["b"]).requires_grad_()
    function = torch.nn.functional.conv1d if ndim == 1 else torch.nn.functional.conv2d
    yt = function(xt, wt, bt, kwargs["stride"], kwargs["padding"], kwargs["dilation"])
    yt.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(conv.grads["W"], wt.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(conv.grads["b"], bt.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_conv_output_size_is_the_pooling_rule():
    """Conv sizes its output with geometry.output_length, the rule of the pooling
    operators (floor mode): the same length, and no output is the same error."""
    from poolgrad import geometry
    for length in range(1, 9):
        for kernel, stride, dilation, padding in [(1, 1, 1, 0), (2, 2, 1, 0), (3, 2, 1, 1),
                                                  (3, 1, 2, 2), (4, 3, 1, 1), (2, 3, 3, 0)]:
            conv = nn.Conv(1, 1, kernel, stride, padding, dilation, ndim=1)
            x = np.zeros((1, 1, length), np.float32)
            try:
                expected = geometry.output_length(length, kernel, stride, dilation, padding,
                                                  padding, False)
            except ValueError:
                with pytest.raises(ValueError, match="Conv: input .* is smaller than the kernel"):
                    conv.forward(x)
                continue
            y = conv.forward(x)
            assert y.shape == (1, 1, expected)
            assert conv.backward(np.ones_like(y)).shape == x.shape


def test_batch_weight_gradient_is_the_mean_of_per_example_gradients():
    rng = np.random.default_rng(7)
    model = small_net()
    x = rng.standard_normal((5, 1, 6, 6))
    labels = rng.integers(0, 3, 5)
    backprop(model, x, labels)
    batch = {(id(layer), name): layer.grads[name].copy() for layer, name in model.parameters()}
    total = {key: 0 for key in batch}
    for n in range(5):  # each example alone: routed through its own argmax
        backprop(model, x[n:n + 1], labels[n:n + 1])
        for layer, name in model.parameters():
            total[(id(layer), name)] = total[(id(layer), name)] + layer.grads[name]
    for key, grad in batch.items():
        np.testing.assert_allclose(total[key] / 5, grad, rtol=1e-12, atol=1e-15)


POOL_LAYERS = [
    (nn.MaxPool(3, 2, 1), pg.max_pool, {"kernel_size": 3, "stride": 2, "padding": 1}),
    (nn.MaxPool(2, ties="split"), pg.max_pool, {"kernel_size": 2, "ties": "split"}),
    (nn.AvgPool(3, 2, 1, count_include_pad=False), pg.avg_pool,
     {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False}),
    (nn.LpPool(3, 2), pg.lp_pool, {"p": 3, "kernel_size": 2}),
    (nn.GlobalAvgPool(), pg.global_avg_pool, {}),
    (nn.GlobalMaxPool(), pg.global_max_pool, {}),
    (nn.AdaptiveAvgPool((2, 3)), pg.adaptive_avg_pool, {"output_size": (2, 3)}),
    (nn.AdaptiveMaxPool(3), pg.adaptive_max_pool, {"output_size": 3}),
    (nn.BlurPool(filter_size=4, padding_mode="zeros"), pg.blur_pool,
     {"filter_size": 4, "padding_mode": "zeros"}),
    (nn.MaxBlurPool(3, 2), pg.max_blur_pool, {"kernel_size": 3, "stride": 2}),
    (nn.AvgBlurPool(), pg.avg_blur_pool, {}),
    (nn.SoftPool(3, 2, 1), pg.soft_pool, {"kernel_size": 3, "stride": 2, "padding": 1}),
    (nn.APSPool((2, 3), norm="l1"), pg.aps_pool, {"stride": (2, 3), "norm": "l1"}),
    (nn.MaxAPSPool(3, 2, 3), pg.max_aps_pool, {"kernel_size": 3, "stride": 2,
                                               "filter_size": 3}),
]


@pytest.mark.parametrize("index", range(len(POOL_LAYERS)))
def test_pool_layers_are_the_core_vjp_and_release_their_state(index):
    layer, op, kwargs = POOL_LAYERS[index]
    rng = np.random.default_rng(index)
    x = rng.integers(-3, 4, (2, 3, 7, 8)).astype(np.float64)  # ties included
    y, pullback = pg.vjp(op, x, **kwargs)
    np.testing.assert_array_equal(layer.forward(x), y)
    dy = rng.standard_normal(y.shape)
    np.testing.assert_array_equal(layer.backward(dy), pullback(dy))
    assert "_pullback" not in layer.__dict__  # released once used
    with pytest.raises(RuntimeError, match="without a training forward"):
        layer.backward(dy)
    layer.training = False
    np.testing.assert_array_equal(layer.forward(x), y)
    assert "_pullback" not in layer.__dict__  # evaluation keeps nothing
    layer.training = True


LEARNED_LAYERS = [
    (nn.GeMPool(2.5), pg.gem_pool, {"p": 2.5}, "p"),
    (nn.GeMPool(3.0, kernel_size=2, eps=0.01), pg.gem_pool,
     {"p": 3.0, "kernel_size": 2, "eps": 0.01}, "p"),
    (nn.MixedPool(3, 2, 1, alpha=0.7), pg.mixed_pool,
     {"kernel_size": 3, "stride": 2, "padding": 1, "alpha": 0.7}, "alpha"),
    (nn.GatedPool(2), pg.gated_pool, {"gate": np.zeros((2, 2)), "kernel_size": (2, 2)},
     "gate"),
]


@pytest.mark.parametrize("index", range(len(LEARNED_LAYERS)))
def test_learned_pool_layers_give_the_parameter_gradient_and_learn(index):
    layer, op, kwargs, name = LEARNED_LAYERS[index]
    rng = np.random.default_rng(index)
    x = rng.random((2, 3, 7, 8))
    y, pullback = pg.vjp(op, x, **kwargs)
    np.testing.assert_array_equal(layer.forward(x), y)
    dy = rng.standard_normal(y.shape)
    dx, grad = pullback(dy)
    np.testing.assert_array_equal(layer.backward(dy), dx)
    np.testing.assert_array_equal(layer.grads[name], grad)
    before = layer.params[name].copy()
    optim.SGD([(layer, name)], lr=0.1).step()
    np.testing.assert_allclose(layer.params[name], before - 0.1 * np.asarray(grad))
    moved = layer.forward(x)  # the layer now pools with the stepped parameter
    assert not np.array_equal(moved, y)
    layer.backward(dy)


def test_fixed_parameters_and_stochastic_layers():
    fixed = nn.MixedPool(2, alpha=0.25, learn=False)
    assert fixed.params == {}
    x = np.random.default_rng(0).random((2, 3, 6, 6))
    np.testing.assert_array_equal(fixed.forward(x), pg.mixed_pool(x, 2, alpha=0.25))
    dy = np.ones((2, 3, 3, 3))
    np.testing.assert_array_equal(fixed.backward(dy),
                                  pg.vjp(pg.mixed_pool, x, 2, alpha=0.25)[1](dy)[0])
    assert fixed.grads == {}
    frozen = nn.GeMPool(p=2.5, learn=False)
    frozen.forward(x)
    np.testing.assert_array_equal(frozen.backward(dy[:, :, :1, :1]),
                                  pg.vjp(pg.gem_pool, x, 2.5)[1](dy[:, :, :1, :1])[0])
    first, second = nn.StochasticPool(2, rng=3), nn.StochasticPool(2, rng=3)
    np.testing.assert_array_equal(first.forward(x), second.forward(x))
    # the second draw comes from the layer's generator, advanced by the first
    np.testing.assert_array_equal(first.forward(x), pg.stochastic_pool(x, 2, rng=_advanced(3)))
    first.training = False
    np.testing.assert_array_equal(first.forward(x), pg.stochastic_pool(x, 2, training=False))


def _advanced(seed):
    """A generator seeded ``seed`` after one call of stochastic pooling (one seed)."""
    generator = np.random.default_rng(seed)
    generator.integers(2**63, dtype=np.uint64)
    return generator


def test_dropout_scales_in_training_and_is_identity_in_evaluation():
    layer = nn.Dropout(0.25, rng=0)
    x = np.ones((200, 50))
    y = layer.forward(x)
    kept = y != 0
    assert set(np.unique(y)) == {0.0, 1 / 0.75}
    assert 0.7 < kept.mean() < 0.8
    np.testing.assert_array_equal(layer.backward(np.ones_like(x)), y)  # same mask
    layer.training = False
    assert layer.forward(x) is x
    with pytest.raises(ValueError, match=r"Dropout p must be in \[0, 1\)"):
        nn.Dropout(1.0)


def test_state_dict_round_trip_and_mismatch():
    model, other = small_net(seed=0), small_net(seed=1)
    other.load_state_dict(model.state_dict())
    x = np.random.default_rng(0).standard_normal((2, 1, 6, 6))
    np.testing.assert_array_equal(other.eval().forward(x), model.eval().forward(x))
    state = model.state_dict()
    state["0.W"] = np.zeros((1, 1, 3, 3))
    with pytest.raises(ValueError, match="weight 0.W has shape"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="do not fit this model"):
        other.load_state_dict({"0.W": state["0.W"]})


def test_loss_rejects_bad_labels():
    loss = nn.SoftmaxCrossEntropy()
    logits = np.zeros((3, 4))
    with pytest.raises(ValueError, match=r"labels must be in \[0, 4\)"):
        loss.forward(logits, np.array([0, -1, 2]))
    with pytest.raises(ValueError, match=r"labels must be in \[0, 4\)"):
        loss.forward(logits, np.array([0, 4, 2]))
    with pytest.raises(TypeError, match="labels must be integers"):
        loss.forward(logits, np.array([0.0, 1.0, 2.0]))
    assert loss.forward(logits, np.array([0, 1, 3])) == pytest.approx(np.log(4))


def test_layers_reject_wrong_shapes():
    with pytest.raises(ValueError, match=r"Linear expects \(N, 4\) input"):
        nn.Linear(4, 2).forward(np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError, match="Conv expects"):
        nn.Conv(3, 2, 3).forward(np.zeros((1, 2, 5, 5), np.float32))
    with pytest.raises(ValueError, match="smaller than the kernel"):
        nn.Conv(1, 2, 5).forward(np.zeros((1, 1, 3, 3), np.float32))


# ------------------------------------------------------------------------ optimizers


class Weight:
    """A one-weight 'layer' whose gradient the test sets by hand."""

    def __init__(self, w):
        self.params = {"w": np.array(w, dtype=np.float64)}
        self.grads = {}


GRADIENTS = [np.array([0.5, -1.0, 2.0]), np.array([-0.25, 0.5, 1.0]),
             np.array([1.0, 0.0, -3.0])]


def run_optimizer(cls, **kwargs):
    weight = Weight([1.0, -2.0, 0.5])
    opt = cls([(weight, "w")], **kwargs)
    history = []
    for g in GRADIENTS:
        weight.grads["w"] = g
        opt.step()
        history.append(weight.params["w"].copy())
    return history


def test_sgd_momentum_nesterov_weight_decay_by_hand():
    lr, mu, wd = 0.1, 0.9, 0.01
    w = np.array([1.0, -2.0, 0.5])
    buf = None
    expected = []
    for g in GRADIENTS:
        g = g + wd * w
        buf = g if buf is None else mu * buf + g
        w = w - lr * (g + mu * buf)  # Nesterov
        expected.append(w)
    got = run_optimizer(optim.SGD, lr=lr, momentum=mu, nesterov=True, weight_decay=wd)
    np.testing.assert_allclose(got, expected, rtol=1e-14)
    plain = run_optimizer(optim.SGD, lr=0.5)
    np.testing.assert_allclose(plain[0], [0.75, -1.5, -0.5], rtol=1e-14)  # w - 0.5 g


def test_adam_adagrad_rmsprop_by_hand():
    w = np.array([1.0, -2.0, 0.5])
    m = v = np.zeros(3)
    adam = []
    for t, g in enumerate(GRADIENTS, start=1):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        w = w - 0.01 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        adam.append(w)
    np.testing.assert_allclose(run_optimizer(optim.Adam, lr=0.01), adam, rtol=1e-13)
    # Adam's first step moves every weight with a gradient by lr against its sign
    np.testing.assert_allclose(adam[0], [0.99, -1.99, 0.49], rtol=1e-6)

    w, total, expected = np.array([1.0, -2.0, 0.5]), np.zeros(3), []
    for g in GRADIENTS:
        total = total + g * g
        w = w - 0.1 * g / (np.sqrt(total) + 1e-10)
        expected.append(w)
    np.testing.assert_allclose(run_optimizer(optim.Adagrad, lr=0.1), expected, rtol=1e-13)

    w, avg, expected = np.array([1.0, -2.0, 0.5]), np.zeros(3), []
    for g in GRADIENTS:
        avg = 0.9 * avg + 0.1 * g * g
        w = w - 0.01 * g / (np.sqrt(avg) + 1e-8)
        expected.append(w)
    np.testing.assert_allclose(run_optimizer(optim.RMSProp, lr=0.01, alpha=0.9), expected,
                               rtol=1e-13)


@pytest.mark.parametrize("name, kwargs", [
    ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.1, "momentum": 0.5, "nesterov": True}),
    ("Adagrad", {"lr": 0.1, "weight_decay": 0.1}),
    ("RMSProp", {"lr": 0.01, "alpha": 0.9}),
    ("Adam", {"lr": 0.01, "betas": (0.8, 0.99), "weight_decay": 0.1}),
])
def test_optimizers_match_torch_optim(name, kwargs):
    torch = pytest.importorskip("torch")
    got = run_optimizer(getattr(optim, name), **kwargs)
    tensor = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64, requires_grad=True)
    torch_name = "RMSprop" if name == "RMSProp" else name
    opt = getattr(torch.optim, torch_name)([tensor], **kwargs)
    for g, ours in zip(GRADIENTS, got, strict=True):
        tensor.grad = torch.from_numpy(g.copy())
        opt.step()
        np.testing.assert_allclose(ours, tensor.detach().numpy(), rtol=1e-12, atol=1e-15)


def test_optimizer_state_round_trip_continues_exactly():
    straight = run_optimizer(optim.Adam, lr=0.01)
    weight = Weight([1.0, -2.0, 0.5])
    first = optim.Adam([(weight, "w")], lr=0.01)
    weight.grads["w"] = GRADIENTS[0]
    first.step()
    second = optim.Adam([(weight, "w")], lr=0.01)
    second.load_state_dict({k: v.copy() for k, v in first.state_dict().items()})
    for g in GRADIENTS[1:]:
        weight.grads["w"] = g
        second.step()
    np.testing.assert_array_equal(weight.params["w"], straight[-1])


@pytest.mark.parametrize("cls, kwargs, message", [
    (optim.SGD, {"lr": 0}, "lr must be a finite number > 0"),
    (optim.SGD, {"lr": 0.1, "nesterov": True}, "nesterov needs a momentum > 0"),
    (optim.Adam, {"betas": (0.9, 1.0)}, "beta2 must be a finite number >= 0 and < 1"),
    (optim.RMSProp, {"lr": "fast"}, "lr must be a number"),
])
def test_optimizer_bad_settings(cls, kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        cls([], **kwargs)


def test_loss_backward_releases_its_state_like_the_layers():
    loss = nn.SoftmaxCrossEntropy()
    with pytest.raises(RuntimeError, match=r"^SoftmaxCrossEntropy.backward called without a "
                                           r"forward before it \(or twice\)"):
        loss.backward()
    logits = np.array([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
    loss.forward(logits, np.array([1, 2]))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    expected = (probs - np.eye(3)[[1, 2]]) / 2
    np.testing.assert_allclose(loss.backward(), expected, rtol=1e-12)
    assert not {"_probs", "_labels"} & set(vars(loss))  # released once used
    with pytest.raises(RuntimeError, match=r"called without a forward before it \(or twice\)"):
        loss.backward()  # a second call, as for every layer (see the pool layers' test)
    loss.forward(logits, np.array([1, 2]))  # a new forward makes backward usable again
    np.testing.assert_allclose(loss.backward(), expected, rtol=1e-12)


def test_fractional_layer_draws_fresh_windows_from_its_generator():
    x = np.random.default_rng(1).random((2, 3, 9, 9))
    layer = nn.FractionalMaxPool(2, output_size=5, rng=4)
    generator = np.random.default_rng(4)
    y = layer.forward(x)
    expected, pullback = pg.vjp(pg.fractional_max_pool, x, 2, 5, rng=generator)
    np.testing.assert_array_equal(y, expected)
    dy = np.ones_like(y)
    np.testing.assert_array_equal(layer.backward(dy), pullback(dy))
    # the next call's windows come from the advanced generator
    np.testing.assert_array_equal(layer.forward(x),
                                  pg.fractional_max_pool(x, 2, 5, rng=generator))


def test_attention_pool_layer_starts_as_global_average_and_learns():
    rng = np.random.default_rng(2)
    x = rng.random((3, 4, 5, 6))
    layer = nn.AttentionPool(4, heads=2, queries=2, rng=0)
    y = layer.forward(x)
    assert y.shape == (3, 8)  # queries * channels, flattened for the classifier
    np.testing.assert_allclose(y.reshape(3, 2, 4), np.repeat(x.mean(axis=(2, 3))[:, None], 2, 1),
                               atol=1e-15)
    dy = rng.standard_normal(y.shape)
    _, pullback = pg.vjp(pg.attention_pool, x, layer.params["queries"],
                         layer.params["key_weight"], 2)
    dx, d_queries, d_weight = pullback(dy.reshape(3, 2, 4))
    np.testing.assert_array_equal(layer.backward(dy), dx)
    np.testing.assert_array_equal(layer.grads["queries"], d_queries)
    assert np.abs(d_queries).max() > 0  # the queries move first: the keys' gradient is
    np.testing.assert_array_equal(layer.grads["key_weight"], d_weight)  # 0 at q = 0
    optim.SGD([(layer, "queries"), (layer, "key_weight")], lr=0.5).step()
    assert not np.allclose(layer.forward(x), y)
    with pytest.raises(ValueError, match="must divide channels"):
        nn.AttentionPool(6, heads=4)


def test_aps_layers_keep_their_phases_for_a_shortcut():
    """The phases of the last forward, training or not, are the operator's, so that a
    residual shortcut can downsample with the main path's."""
    x = np.random.default_rng(12).standard_normal((3, 2, 6, 6))
    for layer, op in ((nn.APSPool(2), pg.aps_pool), (nn.MaxAPSPool(2, 2), pg.max_aps_pool)):
        for training in (True, False):
            layer.training = training
            y = layer.forward(x)
            expected, phases = op(x, 2, return_indices=True) if op is pg.aps_pool else op(
                x, 2, 2, return_indices=True)
            np.testing.assert_array_equal(y, expected)
            np.testing.assert_array_equal(layer.phases, phases)


def test_lps_layer_is_its_operator_with_learned_weights():
    """Training: the Gumbel-softmax mixture with the layer's generator, the scoring
    network's gradients in grads; evaluation: the hard choice, nothing kept."""
    x = np.random.default_rng(13).standard_normal((3, 4, 6, 6))
    layer = nn.LPSPool(4, 2, hidden=3, temperature=0.5, rng=2)
    weights = (layer.params["W1"], layer.params["b1"], layer.params["w2"])
    generator = np.random.default_rng(2)
    generator.standard_normal((3, 4)), generator.standard_normal(3)  # the weights' draws
    (y, phases), pullback = pg.vjp(pg.lps_pool, x, weights, 2, training=True,
                                   temperature=0.5, rng=generator, return_indices=True)
    np.testing.assert_array_equal(layer.forward(x), y)
    np.testing.assert_array_equal(layer.phases, phases)
    dy = np.random.default_rng(14).standard_normal(y.shape)
    dx, dW1, db1, dw2 = pullback(dy)
    np.testing.assert_array_equal(layer.backward(dy), dx)
    for name, grad in (("W1", dW1), ("b1", db1), ("w2", dw2)):
        np.testing.assert_array_equal(layer.grads[name], grad)
    layer.training = False
    np.testing.assert_array_equal(layer.forward(x), pg.lps_pool(x, weights, 2))
    assert "_pullback" not in layer.__dict__
    assert repr(layer).startswith("LPSPool(4, hidden=3")
