"""Forward values against ONNX's operator definitions, run by onnx's reference evaluator.

ONNX has what PyTorch's pooling lacks: asymmetric ``pads`` larger than half the
kernel, ``auto_pad="SAME_UPPER"``, dilated AveragePool and LpPool. Skipped cleanly
when the ``onnx`` package is not installed.
"""

import numpy as np
import pytest

import poolgrad as pg

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

OPSET = 22


def onnx_model(op, x_shape, outputs, attributes):
    node = helper.make_node(op, ["x"], list(outputs), **attributes)
    element = TensorProto.DOUBLE
    graph = helper.make_graph(
        [node], "pool", [helper.make_tensor_value_info("x", element, list(x_shape))],
        [helper.make_tensor_value_info(name, element if name == "y" else TensorProto.INT64, None)
         for name in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def run_onnx(op, x, outputs=("y",), **attributes):
    """The reference evaluator's outputs, after checking that ONNX's shape inference
    gives the same output shape as the evaluator (and, by the callers, as poolgrad)."""
    model = onnx_model(op, x.shape, outputs, attributes)
    inferred = onnx.shape_inference.infer_shapes(model).graph.output[0]
    shape = tuple(d.dim_value for d in inferred.type.tensor_type.shape.dim)
    try:
        results = ReferenceEvaluator(model).run(None, {"x": x})
    except (IndexError, ValueError, RuntimeError) as error:
        # onnx's Python evaluator has bugs with some asymmetric pads; its shape
        # inference (the operator's definition) still gives the size to compare with
        return shape, None, error
    if results[0].shape != shape:
        return shape, None, f"evaluator shape {results[0].shape} != inferred {shape}"
    return shape, results, None


def compare(actual, onnx_result, check):
    shape, results, error = onnx_result
    assert actual[0].shape == shape  # ONNX's output-size rule
    if results is None:
        pytest.xfail(f"onnx's reference evaluator fails here ({error!r}); shape checked")
    for a, r in zip(actual, results, strict=True):
        check(a, r)


def random_geometry(rng):
    """Asymmetric pads up to one less than the dilated kernel, resampled until valid."""
    while True:
        ndim = int(rng.integers(1, 4))
        kernel = [int(k) for k in rng.integers(1, 4, ndim)]
        stride = [int(s) for s in rng.integers(1, 4, ndim)]
        dilation = [int(d) for d in rng.integers(1, 3, ndim)]
        spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True)]
        before = [int(rng.integers(0, s)) for s in spans]
        after = [int(rng.integers(0, s)) for s in spans]
        spatial = tuple(s + int(rng.integers(0, 6)) for s in spans)
        ceil_mode = int(rng.integers(2))
        pads = tuple(zip(before, after, strict=True))
        try:
            pg.max_pool(np.zeros((1, 1) + spatial), kernel, stride, pads, dilation, ceil_mode)
        except ValueError:
            continue
        attributes = dict(kernel_shape=kernel, strides=stride, dilations=dilation,
                          pads=before + after, ceil_mode=ceil_mode)
        return spatial, (kernel, stride, pads, dilation, bool(ceil_mode)), attributes


def close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("seed", range(60))
def test_max_pool(seed):
    rng = np.random.default_rng(seed)
    spatial, args, attributes = random_geometry(rng)
    x = rng.integers(-3, 4, (2, 3) + spatial).astype(np.float64)  # ties: first wins
    y, indices = pg.max_pool(x, *args, return_indices=True)
    # ONNX indices run over the whole tensor; ours over each (n, c) plane
    plane = int(np.prod(spatial))
    offsets = np.arange(x.shape[0] * x.shape[1]) * plane
    whole = indices + offsets.reshape(x.shape[:2] + (1,) * len(spatial))
    compare((y, whole), run_onnx("MaxPool", x, ("y", "indices"), **attributes),
            np.testing.assert_array_equal)


@pytest.mark.parametrize("seed", range(60))
def test_average_pool(seed):
    rng = np.random.default_rng(100 + seed)
    spatial, args, attributes = random_geometry(rng)
    count_include_pad = int(rng.integers(2))
    x = rng.standard_normal((2, 3) + spatial)
    y = pg.avg_pool(x, *args, count_include_pad=bool(count_include_pad))
    compare((y,), run_onnx("AveragePool", x, count_include_pad=count_include_pad, **attributes),
            close)


@pytest.mark.parametrize("seed", range(40))
def test_lp_pool(seed):
    rng = np.random.default_rng(200 + seed)
    spatial, (kernel, stride, pads, dilation, ceil_mode), attributes = random_geometry(rng)
    p = int(rng.integers(1, 5))
    # onnx's evaluator computes LpPool as an average times the kernel size, which is
    # wrong for the partial windows of ceil_mode (the spec's Lp norm of the window is
    # what poolgrad computes, see test_naive_reference): compare in floor mode
    attributes["ceil_mode"], ceil_mode = 0, False
    x = rng.standard_normal((2, 3) + spatial)  # negative values: ONNX takes |x|
    y = pg.lp_pool(x, p, kernel, stride, pads, dilation, ceil_mode)
    compare((y,), run_onnx("LpPool", x, p=p, **attributes), close)


@pytest.mark.parametrize("seed", range(20))
def test_same_upper(seed):
    rng = np.random.default_rng(300 + seed)
    ndim = int(rng.integers(1, 4))
    kernel = [int(k) for k in rng.integers(1, 5, ndim)]
    # stride <= kernel: with a larger stride the spec's pad formula goes negative, which
    # poolgrad (like TensorFlow and ONNX Runtime) clamps to 0 while onnx's evaluator
    # crops the input instead
    stride = [int(rng.integers(1, k + 1)) for k in kernel]
    spatial = tuple(k + int(rng.integers(0, 6)) for k in kernel)
    x = rng.standard_normal((2, 2) + spatial)
    attributes = dict(kernel_shape=kernel, strides=stride, auto_pad="SAME_UPPER")
    compare((pg.max_pool(x, kernel, stride, "same"),), run_onnx("MaxPool", x, **attributes),
            np.testing.assert_array_equal)
    compare((pg.avg_pool(x, kernel, stride, "same", count_include_pad=False),),
            run_onnx("AveragePool", x, count_include_pad=0, **attributes), close)


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_global_pools(ndim):
    x = np.random.default_rng(ndim).standard_normal((2, 3) + (5,) * ndim)
    compare((pg.global_max_pool(x),), run_onnx("GlobalMaxPool", x),
            np.testing.assert_array_equal)
    compare((pg.global_avg_pool(x),), run_onnx("GlobalAveragePool", x), close)
