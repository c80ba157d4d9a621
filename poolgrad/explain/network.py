"""``poolgrad explain --network``: the batch question answered for a whole network, with
its weight gradients and the optimizer's step.

A mini-batch of N examples goes through a CNN (conv, ReLU, max pooling, linear). Every
example picks its own maxima, so how can one backward pass serve the batch? The
answer: the batch's backward pass *is* N backward passes side by side. Each example is
routed through its own winners, and only the weight gradients are summed (the mean
loss makes them the mean) before one SGD, Adagrad or RMSProp step.
:func:`network_gradients` computes, for one batch:

- the batch's backward pass (one vectorised pass over all examples);
- each example's own backward pass, alone, and the mean of their weight gradients:
  the same numbers as the batch's, up to float rounding;
- the misconception: average the batch first (each layer's activations, and the loss
  gradient), then backpropagate once, as if the batch were one mean example. Its max
  pooling routes through the winners of the mean map and its ReLUs open where the mean
  is positive, so its weight gradient is another vector;
- at the pooling layer alone, the mean of the examples' routed gradients against the
  mean upstream gradient routed through the mean map: different for max pooling,
  equal for average pooling, which is linear and routes every example alike.

:func:`optimizer_steps` then takes one step of SGD, Adagrad and RMSProp
(:mod:`poolgrad.optim`'s formulas) from each gradient. :func:`trained_network` builds
and trains the network (a network ``poolgrad train`` wrote is loaded by
:func:`poolgrad.explain.inputs.checkpoint_model`), and :func:`render_network` prints the
numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import nn, ops, optim
from .inputs import test_indices
from .routing import ExplainError

# the optimizers of the step that follows, with one learning rate, their running
# averages warmed on this many training batches' gradients first
STEP_OPTIMIZERS = ("sgd", "adagrad", "rmsprop")
STEP_LR = 0.01
WARMUP_BATCHES = 10
# the network explained, when --network trains its own: one stage and a linear head
WIDTH, CONV_KERNEL = 8, 3


@dataclass
class NetworkGradients:
    """The numbers of one batch through one network (every array float64).

    ``batch``, ``mean_of_examples`` and ``misconception`` map each weight's name (the
    model's ``state_dict`` keys: ``"0.W"`` is the first layer's kernel) to its
    gradient; ``per_example`` maps it to the ``(N, *shape)`` stack of the examples' own.
    At the first pooling layer: ``pool_input`` ``(N, C, *spatial)``, the examples'
    ``winners`` ``(N, C, *pooled)`` (flat indices per plane; max pooling only),
    ``mean_winners`` ``(C, *pooled)`` (the mean map's), ``routed`` (each example's
    routed gradient at the pool's input, from the batch's backward pass) and
    ``pool_upstream`` (the gradient arriving at the pool's output).
    """

    pool: str
    description: str
    x: np.ndarray
    labels: np.ndarray
    batch: dict
    per_example: dict
    mean_of_examples: dict
    misconception: dict
    pool_input: np.ndarray
    routed: np.ndarray
    pool_upstream: np.ndarray
    pool_averaged_first: np.ndarray
    winners: np.ndarray | None = None
    mean_winners: np.ndarray | None = None
    numbers: dict = field(default_factory=dict)


def _flat(gradients: dict) -> np.ndarray:
    return np.concatenate([np.ravel(g) for g in gradients.values()])


def compare(estimate, truth) -> dict:
    """How far ``estimate`` is from ``truth`` (dicts of arrays, or arrays): the largest
    absolute difference, the relative error (the norm of the difference over the norm
    of ``truth``), the cosine of their angle and the fraction of entries whose signs
    disagree (one positive, the other negative)."""
    a = _flat(estimate) if isinstance(estimate, dict) else np.ravel(estimate)
    b = _flat(truth) if isinstance(truth, dict) else np.ravel(truth)
    norm_b = float(np.linalg.norm(b))
    norms = float(np.linalg.norm(a)) * norm_b
    return {"max_difference": float(np.max(np.abs(a - b))) if a.size else 0.0,
            "relative_error": float(np.linalg.norm(a - b)) / norm_b if norm_b else 0.0,
            "cosine": float(a @ b) / norms if norms else 1.0,
            "opposite_signs": float(np.mean(a * b < 0)) if a.size else 0.0}


def _gradients(model: nn.Sequential) -> dict:
    """The weight gradients the last backward pass left, by ``state_dict`` key."""
    return {f"{i}.{name}": np.array(layer.grads[name], dtype=np.float64)
            for i, layer in enumerate(model.layers) for name in layer.params}


def first_pool(model: nn.Sequential) -> tuple[int, str]:
    """``(index, "max" or "avg")`` of ``model``'s first max or average pooling layer;
    an ExplainError if it has none."""
    for i, layer in enumerate(model.layers):
        if isinstance(layer, (nn.MaxPool, nn.AvgPool)):
            return i, "max" if isinstance(layer, nn.MaxPool) else "avg"
    raise ExplainError("--network explains a network with a max or average pooling layer; "
                       f"this one has none: {[type(layer).__name__ for layer in model.layers]}")


def _backward_pass(model: nn.Sequential, x: np.ndarray, labels: np.ndarray):
    """One forward and backward pass of ``x`` (training mode): the mean loss, each
    layer's input and the gradient arriving at each layer's output."""
    model.train()
    inputs = [x]
    for layer in model.layers:
        inputs.append(layer.forward(inputs[-1]))
    loss_fn = nn.SoftmaxCrossEntropy()
    loss = loss_fn.forward(inputs[-1], labels)
    upstream = [None] * len(model.layers)
    dy = loss_fn.backward()
    for i in reversed(range(len(model.layers))):
        upstream[i] = dy
        dy = model.layers[i].backward(dy)
    return loss, inputs[:-1], upstream, dy


def network_gradients(model: nn.Sequential, x: np.ndarray, labels: np.ndarray,
                      description: str = "") -> NetworkGradients:
    """The batch's gradients three ways, and the routing at the first pooling layer (see
    the module's docstring). ``model`` computes in float64 (its weights' dtype): the
    comparisons then show float64's rounding, not float32's."""
    x = np.asarray(x, dtype=np.float64)
    labels = np.asarray(labels)
    if len(x) != len(labels) or len(x) < 2:
        raise ExplainError(f"--network needs a batch of 2 or more labelled examples, got "
                           f"{len(x)} inputs and {len(labels)} labels")
    pool, kind = first_pool(model)
    loss, inputs, upstream, dx = _backward_pass(model, x, labels)
    batch = _gradients(model)
    # the batch pass's gradient at the pool's input: each example's, routed by its winners
    pool_routed = upstream[pool - 1] if pool else dx

    per_example = {key: np.empty((len(x),) + g.shape) for key, g in batch.items()}
    for n in range(len(x)):
        _backward_pass(model, x[n:n + 1], labels[n:n + 1])
        for key, g in _gradients(model).items():
            per_example[key][n] = g
    mean_of_examples = {key: stack.mean(axis=0) for key, stack in per_example.items()}

    misconception = _averaged_first(model, inputs, upstream)
    # the pooling layer alone: the examples' upstream gradients averaged, then routed
    # once through the mean map, against each routed by its own map, then averaged
    pool_averaged_first = _through_mean(model.layers[pool], inputs[pool],
                                        upstream[pool].mean(axis=0, keepdims=True))[0]
    numbers = {"examples": len(x), "loss": loss,
               "examples_vs_batch": compare(mean_of_examples, batch),
               "misconception_vs_batch": compare(misconception, batch),
               "at_the_pool": compare(pool_averaged_first, pool_routed.mean(axis=0))}
    result = NetworkGradients(kind, description, x, labels, batch, per_example,
                              mean_of_examples, misconception, inputs[pool], pool_routed,
                              upstream[pool], pool_averaged_first, numbers=numbers)
    if kind == "max":
        result.winners = _winners(model.layers[pool], inputs[pool])
        result.mean_winners = _winners(model.layers[pool], inputs[pool].mean(axis=0,
                                                                             keepdims=True))[0]
        numbers["winners_differ"] = float(np.mean(result.winners != result.mean_winners))
    return result


def _averaged_first(model, inputs, upstream):
    """The misconception's weight gradients: one backward pass of the batch's mean loss
    gradient (one row: the mean of the examples' own) through the mean example, each
    layer taking the batch mean of its input, from the last layer to the first."""
    dy = upstream[-1].sum(axis=0, keepdims=True)  # the rows are each example's / N
    for i in reversed(range(len(model.layers))):
        dy = _through_mean(model.layers[i], inputs[i], dy)
    return _gradients(model)


def _through_mean(layer, x, dy):
    """``layer``'s backward pass of ``dy`` (one row) at the batch mean of its input
    ``x``: a training forward of that mean, then its backward."""
    layer.training = True  # (the model's train() set it: it saves what backward needs)
    layer.forward(x.mean(axis=0, keepdims=True))
    return layer.backward(dy)


def _winners(layer, x):
    """The flat index (per plane) of each window's winner under ``layer``'s options."""
    _, indices = ops.max_pool(x, **{**layer.options, "return_indices": True})
    return indices


def warmup_gradients(model: nn.Sequential, data, batches: int = WARMUP_BATCHES,
                     batch: int = 100, seed: int = 0) -> list:
    """The batch gradients of ``batches`` training batches at ``model``'s weights: what
    :func:`optimizer_steps` warms the optimizers' running averages with."""
    order = np.random.default_rng([seed, 1]).permutation(len(data.y_train))
    found = []
    for b in range(min(batches, -(-len(order) // batch))):
        chosen = order[b * batch:(b + 1) * batch]
        _backward_pass(model, data.x_train[chosen].astype(np.float64), data.y_train[chosen])
        found.append(_gradients(model))
    return found


def optimizer_steps(model: nn.Sequential, gradients: dict, warmup=(),
                    lr: float = STEP_LR) -> dict:
    """The update each optimizer of :data:`STEP_OPTIMIZERS` makes given each gradient of
    ``gradients`` (a name -> weight-gradient dict per route), all from one state: the
    optimizer's after it has stepped on each gradient of ``warmup`` in turn, the weights
    put back after each (so that its running averages are a trained optimizer's, not
    zero: from a fresh state Adagrad's first step is about ``lr`` times the gradient's
    sign, and RMSProp's ``lr / sqrt(1 - alpha)`` times it, 10 ``lr``).
    ``{optimizer: {route: flat update}}``, the update being new weights minus old."""
    weights = {key: np.array(w, dtype=np.float64) for key, w in model.state_dict().items()}

    def optimizer(name, state=None):
        holder = nn.Layer()
        holder.params = {k: w.copy() for k, w in weights.items()}
        stepper = optim.OPTIMIZERS[name]([(holder, k) for k in weights], lr=lr)
        if state is not None:
            stepper.load_state_dict(state)
        return holder, stepper

    steps = {}
    for name in STEP_OPTIMIZERS:
        holder, stepper = optimizer(name)
        for grads in warmup:
            holder.grads = dict(grads)
            stepper.step()
            for k, w in weights.items():
                holder.params[k][...] = w
        state = {k: np.array(v) for k, v in stepper.state_dict().items()}
        steps[name] = {}
        for route, grads in gradients.items():
            holder, stepper = optimizer(name, state)
            holder.grads = dict(grads)
            stepper.step()
            steps[name][route] = _flat({k: holder.params[k] - weights[k] for k in weights})
    return steps


def step_numbers(steps: dict) -> dict:
    """Per optimizer: the examples' route against the batch's (the largest difference)
    and the misconception's against the batch's (:func:`compare`)."""
    return {name: {"examples_vs_batch": compare(routes["examples"], routes["batch"]),
                   "misconception_vs_batch": compare(routes["misconception"],
                                                     routes["batch"])}
            for name, routes in steps.items()}


# ------------------------------------------------------------------------ the networks


def small_cnn(in_channels: int, spatial: tuple, classes: int, pool: str, seed: int = 0,
              dtype=np.float64) -> nn.Sequential:
    """conv (``WIDTH`` channels, ``CONV_KERNEL`` wide, same padding) -> ReLU -> 2x2
    ``pool`` pooling -> flatten -> linear, weights drawn from ``seed``."""
    from ..train import numpy_engine
    return numpy_engine.build_model(in_channels, spatial, classes, pool=pool,
                                    widths=(WIDTH,), conv_kernel=CONV_KERNEL, seed=seed,
                                    dtype=dtype)


def fit(model: nn.Sequential, data, epochs: int, seed: int = 0, batch: int = 100,
        lr: float = 0.01) -> float:
    """Train ``model`` on ``data``'s training split with Adam for ``epochs`` epochs, as
    ``poolgrad train``'s NumPy engine trains (epoch ``e`` shuffled by ``[seed, e]``);
    returns its test accuracy."""
    from ..train import numpy_engine
    opt = optim.Adam(model.parameters(), lr=lr)
    for epoch in range(epochs):
        order = np.random.default_rng([seed, epoch]).permutation(len(data.y_train))
        numpy_engine.train_epoch(model, opt, data.x_train, data.y_train, order, batch)
    return numpy_engine.evaluate(model, data.x_test, data.y_test)[1]


def trained_network(data, pool: str, epochs: int, seed: int = 0):
    """``(model, test accuracy)``: :func:`small_cnn` trained on ``data`` (a
    :class:`poolgrad.tools.datasets.Dataset`) in float32, as ``poolgrad train`` trains,
    then copied to float64."""
    shape = (data.x_train.shape[1], data.spatial, data.classes)
    model = small_cnn(*shape, pool, seed, dtype=np.float32)
    accuracy = fit(model, data, epochs, seed)
    exact = small_cnn(*shape, pool, seed)
    exact.load_state_dict(model.state_dict())
    return exact, accuracy


def swap_pooling(model: nn.Sequential, kind: str) -> nn.Sequential:
    """``model`` with each max or average pooling layer replaced by ``kind``'s (the same
    window, stride and padding) and the same weights."""
    layers = []
    for layer in model.layers:
        if isinstance(layer, (nn.MaxPool, nn.AvgPool)):
            options = {k: layer.options[k] for k in ("kernel_size", "stride", "padding")}
            layer = nn.POOLING[kind](**options)
        layers.append(layer)
    return nn.Sequential(*layers)


def test_batch(data, batch: int, seed: int):
    """``batch`` test examples drawn with ``seed`` (without repeats), and their labels."""
    chosen = test_indices(data, batch, seed)
    return data.x_test[chosen].astype(np.float64), data.y_test[chosen]


# ------------------------------------------------------------------------- the text


def _exp(value: float) -> str:
    return "0" if value == 0 else f"{value:.1e}"


def render_network(results: list, steps: list) -> str:
    """The terminal report: per network (max pooling, then average pooling) the three
    gradients compared, and the step each optimizer takes from them."""
    lines = []
    for result, step in zip(results, steps, strict=True):
        n = result.numbers
        same, wrong = n["examples_vs_batch"], n["misconception_vs_batch"]
        at_pool = n["at_the_pool"]
        lines += [f"== {result.pool} pooling: {result.description}",
                  f"  the batch's backward pass against the mean of the {n['examples']} "
                  f"examples' own: largest difference {_exp(same['max_difference'])}, "
                  f"relative {_exp(same['relative_error'])}: the same gradient",
                  f"  the misconception (average the activations and the loss gradient, then "
                  f"one backward pass): relative error {wrong['relative_error']:.3f}, cosine "
                  f"{wrong['cosine']:.3f}, {wrong['opposite_signs']:.1%} of the weights' "
                  f"gradients of the wrong sign"]
        if result.pool == "max":
            lines.append(f"  at the max pooling layer alone: {n['winners_differ']:.1%} of the "
                         f"examples' windows have another winner than the mean map's; "
                         f"routing the mean gradient there is off by "
                         f"{at_pool['relative_error']:.3f} (relative)")
        else:
            lines.append(f"  at the average pooling layer alone: routing the mean gradient "
                         f"equals the mean of the routed ones (largest difference "
                         f"{_exp(at_pool['max_difference'])}): the layer is linear and "
                         f"routes every example alike; the error above comes from the other "
                         f"layers' nonlinearity (the ReLU masks of a mean) and from the "
                         f"weight gradients' products of activations and errors (a mean of "
                         f"products is not a product of means)")
        lines.append(f"  one step (lr {STEP_LR}, from a state warmed on {WARMUP_BATCHES} "
                     f"batches):  examples' mean vs batch  |  misconception vs batch: "
                     f"relative, cosine, opposite moves")
        for name, numbers in step.items():
            ok, bad = numbers["examples_vs_batch"], numbers["misconception_vs_batch"]
            lines.append(f"    {name:8s} largest difference {_exp(ok['max_difference']):>8s}  "
                         f"|  {bad['relative_error']:6.3f}  {bad['cosine']:6.3f}  "
                         f"{bad['opposite_signs']:6.1%}")
    return "\n".join(lines)
