"""How a trained network's top-1 predictions move when its input shifts: the measures
of ``poolgrad study shift``.

- :func:`shift` moves a batch, each example by its own offset, with zeros coming in
  (``"zero"``) or what leaves coming back on the other side (``"circular"``).
- :func:`shift_curve`: for each shift ``s``, how often the prediction at ``s`` equals
  the unshifted one (and how often it is right), averaged over the directions along
  each spatial axis. One minus its value at ``s = 1`` is Azulay & Weiss's (2019)
  probability that a 1-pixel shift changes the top-1 prediction.
- :func:`circular_invariance`: how many examples keep their prediction under every
  circular shift, the exact invariance that adaptive polyphase sampling promises a
  network of circular convolutions with a global head.
- :func:`consistency`: Zhang's (2019) consistency, how often two copies of an input
  shifted by two random offsets get the same prediction. Zhang's offsets (crops of 224
  from 256 pixels) span 32 pixels, VGG's total stride; here each offset is drawn from a
  range as wide as the network's total stride, centred on the unshifted input.
- :func:`layer_invariance`: ``poolgrad explain --invariance``'s measure (the fraction
  of pooled outputs unchanged by a shift of the maps, see
  :func:`poolgrad.explain.translation.unchanged_outputs`) for a trained network's first
  downsampling, on the maps it receives.

Fractional max pooling draws new windows at every call; every pass here reseeds it, so
an input and its shifted copy meet the same windows and only the shift differs.
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import torch

from ..explain.translation import unchanged_outputs

MODES = ("zero", "circular")


def shift(x: torch.Tensor, offsets, mode: str = "zero") -> torch.Tensor:
    """``x`` (N, C, *spatial) moved by ``offsets`` positions along each spatial dim:
    ``(ndim,)`` for the whole batch or ``(N, ndim)``, one row per example; positive
    offsets move towards higher indices. ``mode``: ``"zero"`` (what leaves is lost,
    zeros come in) or ``"circular"`` (``torch.roll``'s wrap-around)."""
    if mode not in MODES:
        raise ValueError(f"unknown shift mode {mode!r}: choose one of {', '.join(MODES)}")
    ndim = x.dim() - 2
    offsets = torch.as_tensor(offsets, dtype=torch.int64, device=x.device)
    offsets = offsets.reshape(-1, ndim).expand(len(x), ndim)
    for axis in range(ndim):
        dim, size = 2 + axis, x.shape[2 + axis]
        source = torch.arange(size, device=x.device) - offsets[:, axis:axis + 1]  # (N, size)
        view = [len(x)] + [1] * (x.dim() - 1)
        view[dim] = size
        if mode == "circular":
            x = torch.gather(x, dim, (source % size).reshape(view).expand(x.shape))
        else:
            inside = (source >= 0) & (source < size)
            index = source.clamp(0, size - 1).reshape(view).expand(x.shape)
            x = torch.gather(x, dim, index) * inside.reshape(view).to(x.dtype)
    return x


def _reseed(model, seed: int = 0) -> None:
    from ..torch import FractionalMaxPool
    for layer in model.modules():
        if isinstance(layer, FractionalMaxPool):
            layer.manual_seed(seed)


@contextlib.contextmanager
def _evaluating(model):
    """``model`` in evaluation mode without gradients; its mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def predict(model, x: torch.Tensor, batch: int = 500) -> torch.Tensor:
    """The top-1 class of each example, in evaluation mode (the model's mode is
    restored); the same fractional windows for every call."""
    labels = []
    with _evaluating(model):
        for start in range(0, len(x), batch):
            _reseed(model)
            labels.append(model(x[start:start + batch]).argmax(dim=1))
    return torch.cat(labels)


def directions(ndim: int) -> list[tuple[int, ...]]:
    """The unit steps along each spatial axis, both ways: (1,), (-1,) in 1-d."""
    steps = []
    for axis in range(ndim):
        for sign in (1, -1):
            step = [0] * ndim
            step[axis] = sign
            steps.append(tuple(step))
    return steps


def shift_curve(model, x: torch.Tensor, y: torch.Tensor, shifts, mode: str) -> dict:
    """``{"shift", "agreement", "accuracy"}``: for each shift ``s`` of ``shifts``, the
    fraction of examples whose prediction at ``s`` equals the unshifted one, and the
    fraction predicted right, each averaged over :func:`directions`."""
    base = predict(model, x)
    curve = {"shift": [], "agreement": [], "accuracy": []}
    for s in shifts:
        agree, right = [], []
        for step in directions(x.dim() - 2):
            labels = predict(model, shift(x, [s * d for d in step], mode))
            agree.append(float((labels == base).double().mean()))
            right.append(float((labels == y).double().mean()))
        curve["shift"].append(int(s))
        curve["agreement"].append(float(np.mean(agree)))
        curve["accuracy"].append(float(np.mean(right)))
    return curve


def consistency(model, x: torch.Tensor, reach: int, mode: str, seed: int) -> float:
    """Zhang's consistency: the fraction of examples whose predictions agree on two
    copies shifted by independent offsets drawn uniformly from ``-(reach // 2)`` to
    ``reach - reach // 2`` along each spatial dim (a range ``reach`` wide), with a
    generator seeded by ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    low, high = -(reach // 2), reach - reach // 2
    size = (len(x), x.dim() - 2)
    first = torch.randint(low, high + 1, size, generator=generator)
    second = torch.randint(low, high + 1, size, generator=generator)
    labels = [predict(model, shift(x, offsets.to(x.device), mode))
              for offsets in (first, second)]
    return float((labels[0] == labels[1]).double().mean())


def circular_invariance(model, x: torch.Tensor) -> dict:
    """APS's promise, measured exactly: ``{"invariant", "flips"}``, the fraction of
    examples whose prediction is the same under every circular shift of the input
    (every offset along every spatial dim, ``prod(spatial)`` shifts), and the fraction
    of (example, shift) pairs whose prediction differs from the unshifted one."""
    base = predict(model, x)
    same = torch.ones(len(x), dtype=torch.bool, device=x.device)
    changed = 0
    offsets = list(itertools.product(*(range(n) for n in x.shape[2:])))
    for offset in offsets:
        labels = predict(model, shift(x, offset, "circular"))
        same &= labels == base
        changed += int((labels != base).sum())
    return {"invariant": float(same.double().mean()),
            "flips": changed / (len(x) * len(offsets))}


def first_downsampling(model) -> tuple:
    """``(before, block)``: the layers of a :func:`poolgrad.train.torch_engine.build_model`
    network before its first downsampling (the first convolution and its ReLU), and
    the downsampling itself (a pooling layer, or a strided convolution without the ReLU
    after it: a ReLU's zeros would count as outputs a shift leaves unchanged)."""
    layers = list(model)
    end = 3
    while end < len(layers) and not _starts_stage(layers[end]):
        end += 1
    block = layers[2:end]
    if isinstance(block[0], (torch.nn.Conv1d, torch.nn.Conv2d)):
        block = block[:1]  # the strided convolution itself, as a pooling layer is itself
    return torch.nn.Sequential(*layers[:2]), torch.nn.Sequential(*block)


def _starts_stage(layer) -> bool:
    """A stride-1 convolution opens a stage; Flatten opens the head."""
    if isinstance(layer, torch.nn.Flatten):
        return True
    return isinstance(layer, (torch.nn.Conv1d, torch.nn.Conv2d)) and max(layer.stride) == 1


def layer_invariance(model, x: torch.Tensor, shifts, window: int = 2) -> dict:
    """``{"shift", "unchanged"}``: the fraction of the first downsampling's outputs that
    a shift of its input maps (those of the examples ``x``) leaves unchanged, for each
    of ``shifts``, by :func:`poolgrad.explain.translation.unchanged_outputs` with
    ``window``-sized windows."""
    before, block = first_downsampling(model)
    parameter = next(model.parameters())

    def pooled(canvas):
        _reseed(block)
        inputs = torch.from_numpy(canvas).to(parameter.device, parameter.dtype)
        return block(inputs).double().cpu().numpy()

    with _evaluating(model):
        maps = before(x).double().cpu().numpy()
        rows = unchanged_outputs(maps, {"block": pooled}, (window,) * (x.dim() - 2),
                                 list(shifts))
    return {"shift": [row["shift"] for row in rows],
            "unchanged": [row["block"] for row in rows]}
