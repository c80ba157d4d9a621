"""The batches ``poolgrad explain`` pools (``--source``): random maps, test examples of
a bundled dataset, a ``.npy`` file of maps, or the input of a trained model's first
pooling layer."""

from __future__ import annotations

import os

import numpy as np

from .. import nn
from ..tools import datasets
from .routing import ExplainError

SOURCES = f"random, {', '.join(datasets.BUNDLED)}, a .npy file, or checkpoint:DIR"


def test_indices(data, batch: int, seed: int) -> np.ndarray:
    """The indices of ``batch`` test examples of ``data`` (all, if it has fewer), drawn
    with ``seed`` without repeats: the examples every explain batch takes."""
    return np.random.default_rng(seed).choice(len(data.y_test), size=min(batch, len(
        data.y_test)), replace=False)


def load_batch(source: str, batch: int = 16, seed: int = 0, channel: int = 0):
    """``(x, description, layer_settings)``: a batch of ``(N, H, W)`` or ``(N, L)`` maps
    from ``source`` (see :data:`SOURCES`); ``layer_settings`` is the checkpoint's pooling
    layer for ``checkpoint:DIR`` and None otherwise."""
    rng = np.random.default_rng(seed)
    if batch < 1:
        raise ExplainError(f"batch must be >= 1, got {batch}")
    if source == "random":
        return rng.standard_normal((batch, 6, 6)).round(2), f"{batch} random 6x6 maps", None
    if source in datasets.BUNDLED:
        data = datasets.load(source)
        chosen = test_indices(data, batch, seed)
        x = data.x_test[chosen][:, 0]
        labels = " ".join(str(label) for label in data.y_test[chosen][:8])
        more = " ..." if len(chosen) > 8 else ""
        return x, f"{len(chosen)} {source} test examples (labels {labels}{more})", None
    if source.startswith("checkpoint:"):
        return _checkpoint_batch(source[len("checkpoint:"):], batch, seed, channel)
    if source.endswith(".npy"):
        try:
            x = np.load(source, allow_pickle=False)
        except FileNotFoundError:
            raise ExplainError(f".npy file not found: {source}") from None
        except (OSError, ValueError) as error:
            raise ExplainError(f"cannot read {source} as a .npy array: {error}") from None
        if x.ndim == 4:
            if x.shape[1] != 1:
                raise ExplainError(f"{source}: a 4-d array must be (N, 1, H, W), got {x.shape}")
            x = x[:, 0]
        if x.ndim not in (2, 3) or not np.issubdtype(x.dtype, np.number) or x.size == 0:
            raise ExplainError(f"{source}: expected numbers shaped (H, W) for one map, (N, H, W) "
                               f"or (N, 1, H, W), got {x.dtype} {x.shape}")
        if x.ndim == 2:
            x = x[None]
        return x[:batch].astype(np.float64), f"{min(batch, len(x))} maps from {source}", None
    raise ExplainError(f"unknown source {source!r}: choose {SOURCES}")


def checkpoint_model(folder: str, dtype=np.float32):
    """``(model, data, settings)``: the network of the NumPy engine's checkpoint in
    ``folder`` (``poolgrad train``'s), its weights in ``dtype``, and its dataset."""
    from ..train import checkpoints, numpy_engine
    weights, _, meta = checkpoints.load_numpy(os.path.join(folder, numpy_engine.CHECKPOINT),
                                              purpose=f"in {folder} to explain")
    settings = meta["settings"]
    data = datasets.load(settings["dataset"])
    model = numpy_engine.build_model(data.x_train.shape[1], data.spatial, data.classes,
                                     pool=settings["pool"], widths=settings["widths"],
                                     conv_kernel=settings["conv_kernel"],
                                     gap_head=settings["gap_head"], head=settings.get("head"),
                                     seed=settings["seed"], dtype=dtype)
    model.load_state_dict(weights)
    return model, data, settings


def _checkpoint_batch(folder, batch, seed, channel):
    """The input of a trained model's first pooling layer, on real test examples."""
    model, data, settings = checkpoint_model(folder)
    model.eval()
    kinds = {layer: kind for kind, layer in nn.POOLING.items()}
    pools = [i for i, layer in enumerate(model.layers) if type(layer) in kinds]
    if not pools:
        raise ExplainError(f"the model in {folder} has no max, avg or lp pooling layer "
                           f"(it was trained with --pool {settings['pool']})")
    layer = model.layers[pools[0]]
    chosen = test_indices(data, batch, seed)
    features = nn.Sequential(*model.layers[:pools[0]]).eval().forward(data.x_test[chosen])
    if not 0 <= channel < features.shape[1]:
        raise ExplainError(f"channel must be in [0, {features.shape[1]}), got {channel}")
    options = dict(layer.options, kind=kinds[type(layer)])
    x = features[:, channel].astype(np.float64)
    return (x, f"channel {channel} of the input of layer {pools[0]} ({layer!r}) of the model in "
               f"{folder}, on {len(chosen)} {settings['dataset']} test examples", options)
