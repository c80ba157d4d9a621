"""Optimizers for :mod:`poolgrad.nn` models, with PyTorch's update formulas.

An optimizer steps the weights of ``model.parameters()`` (``(layer, name)`` pairs) with
the gradients the last ``backward`` left in ``layer.grads``. Weight decay is L2 added to
the gradient (``g + weight_decay * w``), as in ``torch.optim``. ``state_dict`` and
``load_state_dict`` carry the step count and every running average, so a checkpoint
resumes exactly.
"""

from __future__ import annotations

import numpy as np


class Optimizer:
    """Base class. Subclasses name their per-weight running arrays in ``slots``."""

    slots: tuple[str, ...] = ()

    def __init__(self, parameters, lr: float, weight_decay: float = 0.0):
        self.parameters = list(parameters)
        _check_number("lr", lr, positive=True)
        _check_number("weight_decay", weight_decay)
        self.lr, self.weight_decay = float(lr), float(weight_decay)
        self.steps = 0
        self.state = {slot: [np.zeros_like(layer.params[name])
                             for layer, name in self.parameters] for slot in self.slots}

    def step(self) -> None:
        self.steps += 1
        for i, (layer, name) in enumerate(self.parameters):
            w = layer.params[name]
            g = layer.grads[name].astype(w.dtype, copy=False)
            if self.weight_decay:
                g = g + w.dtype.type(self.weight_decay) * w
            w -= self._update(i, g).astype(w.dtype, copy=False)

    def _update(self, i: int, g: np.ndarray) -> np.ndarray:
        """The amount to subtract from weight ``i`` given its gradient ``g``."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {"steps": np.array(self.steps)}
        for slot, arrays in self.state.items():
            for i, array in enumerate(arrays):
                state[f"{slot}.{i}"] = array
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        expected = self.state_dict()
        if set(state) != set(expected):
            raise ValueError(f"optimizer state does not fit: expected {sorted(expected)}, "
                             f"got {sorted(state)}")
        for key, value in state.items():
            if np.shape(value) != np.shape(expected[key]):
                raise ValueError(f"optimizer state {key} has shape {np.shape(value)}, "
                                 f"expected {np.shape(expected[key])}")
        self.steps = int(state["steps"])
        for slot, arrays in self.state.items():
            for i in range(len(arrays)):
                arrays[i][...] = state[f"{slot}.{i}"]


def _check_number(name, value, positive=False, below_one=False):
    if not isinstance(value, (int, float, np.floating, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not np.isfinite(value) or value < 0 or (positive and value == 0) or (
            below_one and value >= 1):
        allowed = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {allowed}"
                         + (" and < 1" if below_one else "") + f", got {value!r}")


class SGD(Optimizer):
    """``buf = momentum * buf + g`` (``buf = g`` on the first step); the step is
    ``lr * buf``, or with Nesterov ``lr * (g + momentum * buf)``."""

    slots = ("momentum_buffer",)

    def __init__(self, parameters, lr: float = 0.001, momentum: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0):
        super().__init__(parameters, lr, weight_decay)
        _check_number("momentum", momentum, below_one=True)
        if nesterov and momentum == 0:
            raise ValueError("nesterov needs a momentum > 0")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)

    def _update(self, i, g):
        if self.momentum == 0:
            return self.lr * g
        buf = self.state["momentum_buffer"][i]
        if self.steps == 1:
            buf[...] = g
        else:
            buf *= self.momentum
            buf += g
        return self.lr * (g + self.momentum * buf if self.nesterov else buf)


class Adagrad(Optimizer):
    """``sum += g**2``; the step is ``lr * g / (sqrt(sum) + eps)``."""

    slots = ("sum",)

    def __init__(self, parameters, lr: float = 0.01, eps: float = 1e-10,
                 weight_decay: float = 0.0):
        super().__init__(parameters, lr, weight_decay)
        _check_number("eps", eps, positive=True)
        self.eps = float(eps)

    def _update(self, i, g):
        total = self.state["sum"][i]
        total += g * g
        return self.lr * g / (np.sqrt(total) + self.eps)


class RMSProp(Optimizer):
    """``v = alpha * v + (1 - alpha) * g**2``; the step is ``lr * g / (sqrt(v) + eps)``."""

    slots = ("square_avg",)

    def __init__(self, parameters, lr: float = 0.01, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(parameters, lr, weight_decay)
        _check_number("alpha", alpha, below_one=True)
        _check_number("eps", eps, positive=True)
        self.alpha, self.eps = float(alpha), float(eps)

    def _update(self, i, g):
        v = self.state["square_avg"][i]
        v *= self.alpha
        v += (1 - self.alpha) * g * g
        return self.lr * g / (np.sqrt(v) + self.eps)


class Adam(Optimizer):
    """``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g**2``; the step is
    ``lr * m_hat / (sqrt(v_hat) + eps)`` with ``m_hat = m / (1 - b1**t)`` and
    ``v_hat = v / (1 - b2**t)``."""

    slots = ("m", "v")

    def __init__(self, parameters, lr: float = 0.001, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(parameters, lr, weight_decay)
        if len(betas) != 2:
            raise ValueError(f"betas must be two numbers, got {betas!r}")
        for name, beta in zip(("beta1", "beta2"), betas, strict=True):
            _check_number(name, beta, below_one=True)
        _check_number("eps", eps, positive=True)
        self.betas, self.eps = (float(betas[0]), float(betas[1])), float(eps)

    def _update(self, i, g):
        beta1, beta2 = self.betas
        m, v = self.state["m"][i], self.state["v"][i]
        m *= beta1
        m += (1 - beta1) * g
        v *= beta2
        v += (1 - beta2) * g * g
        m_hat = m / (1 - beta1 ** self.steps)
        v_hat = v / (1 - beta2 ** self.steps)
        return self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


OPTIMIZERS = {"sgd": SGD, "adagrad": Adagrad, "rmsprop": RMSProp, "adam": Adam}
