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


class KnownEvaluatorBug(Exception):
    """onnx's reference evaluator failed, on a case of KNOWN_EVALUATOR_BUGS, with the
    failure listed there."""


# The cases onnx's Python reference evaluator (onnx 1.23) gets wrong, each with the
# failure it gives: an exception (type and message) or an output shape that is not the
# one ONNX's shape inference (the operator's definition) gives. Every one is a
# MaxPool or GlobalMaxPool bug. MaxPool with all strides and dilations 1 (the cases
# below) goes through the evaluator's generic pooling code (CommonPool), which
# mis-sizes its padded input for a front pad larger than half the kernel, for
# ceil_mode with an end pad, and for SAME_UPPER; its GlobalMaxPool reduces axes
# (d, d + 1) for d spatial dims, right only for 2-d inputs. Each listed case is a
# strict xfail that must fail with exactly the listed failure (KnownEvaluatorBug):
# another failure fails the test, and so does the case passing (an evaluator fixed).
KNOWN_EVALUATOR_BUGS = {
    # 1-d, kernel 3, pads (2, 0)
    ("max_pool", 27): "IndexError: index 4 is out of bounds for axis 2 with size 4",
    # 1-d length 4, kernel 2, pads (0, 1), ceil_mode: the last window is dropped
    ("max_pool", 38): "output shape (2, 3, 3) but ONNX's shape inference gives (2, 3, 4)",
    # 1-d SAME_UPPER with stride 1 (lengths 3, 8 and 5; kernels 2, 3 and 3)
    ("same_upper", "MaxPool", 1): "IndexError: tuple index out of range",
    ("same_upper", "MaxPool", 10): "IndexError: tuple index out of range",
    ("same_upper", "MaxPool", 13): "IndexError: tuple index out of range",
    # 3-d SAME_UPPER, input 1x5x7, kernel 1x1x2, stride 1
    ("same_upper", "MaxPool", 6): "ValueError: operands could not be broadcast together with "
                                  "remapped shapes [original->remapped]: (4,2)  and requested "
                                  "shape (5,2)",
    ("global_pools", "GlobalMaxPool", 1): "output shape (2, 1) but ONNX's shape inference gives "
                                          "(2, 3, 1)",
    ("global_pools", "GlobalMaxPool", 3): "output shape (2, 3, 5, 1, 1, 1) but ONNX's shape "
                                          "inference gives (2, 3, 1, 1, 1)",
}
LISTED_CASES = set()  # the keys cases() has met, for test_every_known_bug_is_a_real_case


def cases(test, ids):
    """pytest params ``(*case, bug)`` for each case in ``ids`` (a value or a tuple):
    ``bug`` is the listed failure of KNOWN_EVALUATOR_BUGS, or None, and a listed case
    is a strict xfail that only a KnownEvaluatorBug satisfies."""
    params = []
    for case in ids:
        case = case if isinstance(case, tuple) else (case,)
        key = (test, *case)
        LISTED_CASES.add(key)
        bug = KNOWN_EVALUATOR_BUGS.get(key)
        marks = () if bug is None else pytest.mark.xfail(
            strict=True, raises=KnownEvaluatorBug, reason=f"onnx's reference evaluator: {bug}")
        params.append(pytest.param(*case, bug, marks=marks, id="-".join(map(str, case))))
    return params


def compare(actual, check, op, x, outputs=("y",), bug=None, **attributes):
    """poolgrad's outputs ``actual`` against ONNX's ``op`` on ``x``: the output shape
    against ONNX's shape inference, then each output against the reference evaluator's
    with ``check``. ``bug``: the failure KNOWN_EVALUATOR_BUGS lists for this case; when
    the evaluator fails with exactly it, KnownEvaluatorBug is raised (after the shape
    check), and any other failure fails the test."""
    model = onnx_model(op, x.shape, outputs, attributes)
    inferred = onnx.shape_inference.infer_shapes(model).graph.output[0]
    shape = tuple(d.dim_value for d in inferred.type.tensor_type.shape.dim)
    assert actual[0].shape == shape  # ONNX's output-size rule
    try:
        results = ReferenceEvaluator(model).run(None, {"x": x})
    except Exception as error:
        if bug is None:
            raise
        failure = f"{type(error).__name__}: {error}"
    else:
        failure = None
        if results[0].shape != shape:
            failure = (f"output shape {results[0].shape} but ONNX's shape inference gives "
                       f"{shape}")
    if failure is not None and failure == bug:
        raise KnownEvaluatorBug(failure)
    assert failure is None, f"onnx's reference evaluator: {failure} (listed: {bug!r})"
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


@pytest.mark.parametrize("seed, bug", cases("max_pool", range(60)))
def test_max_pool(seed, bug):
    rng = np.random.default_rng(seed)
    spatial, args, attributes = random_geometry(rng)
    x = rng.integers(-3, 4, (2, 3) + spatial).astype(np.float64)  # ties: first wins
    y, indices = pg.max_pool(x, *args, return_indices=True)
    # ONNX indices run over the whole tensor; ours over each (n, c) plane
    plane = int(np.prod(spatial))
    offsets = np.arange(x.shape[0] * x.shape[1]) * plane
    whole = indices + offsets.reshape(x.shape[:2] + (1,) * len(spatial))
    compare((y, whole), np.testing.assert_array_equal, "MaxPool", x, ("y", "indices"), bug,
            **attributes)


@pytest.mark.parametrize("seed, bug", cases("average_pool", range(60)))
def test_average_pool(seed, bug):
    rng = np.random.default_rng(100 + seed)
    spatial, args, attributes = random_geometry(rng)
    count_include_pad = int(rng.integers(2))
    x = rng.standard_normal((2, 3) + spatial)
    y = pg.avg_pool(x, *args, count_include_pad=bool(count_include_pad))
    compare((y,), close, "AveragePool", x, bug=bug, count_include_pad=count_include_pad,
            **attributes)


@pytest.mark.parametrize("seed, bug", cases("lp_pool", range(40)))
def test_lp_pool(seed, bug):
    rng = np.random.default_rng(200 + seed)
    spatial, (kernel, stride, pads, dilation, ceil_mode), attributes = random_geometry(rng)
    p = int(rng.integers(1, 5))
    # onnx's evaluator computes LpPool as an average times the kernel size, which is
    # wrong for the partial windows of ceil_mode (the spec's Lp norm of the window is
    # what poolgrad computes, see test_naive_reference): compare in floor mode
    attributes["ceil_mode"], ceil_mode = 0, False
    x = rng.standard_normal((2, 3) + spatial)  # negative values: ONNX takes |x|
    y = pg.lp_pool(x, p, kernel, stride, pads, dilation, ceil_mode)
    compare((y,), close, "LpPool", x, bug=bug, p=p, **attributes)


@pytest.mark.parametrize("op, seed, bug", cases(
    "same_upper", [(op, seed) for op in ("MaxPool", "AveragePool") for seed in range(20)]))
def test_same_upper(op, seed, bug):
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
    if op == "MaxPool":
        compare((pg.max_pool(x, kernel, stride, "same"),), np.testing.assert_array_equal,
                op, x, bug=bug, **attributes)
    else:
        compare((pg.avg_pool(x, kernel, stride, "same", count_include_pad=False),), close,
                op, x, bug=bug, count_include_pad=0, **attributes)


@pytest.mark.parametrize("op, ndim, bug", cases(
    "global_pools", [(op, ndim) for op in ("GlobalMaxPool", "GlobalAveragePool")
                     for ndim in (1, 2, 3)]))
def test_global_pools(op, ndim, bug):
    x = np.random.default_rng(ndim).standard_normal((2, 3) + (5,) * ndim)
    if op == "GlobalMaxPool":
        compare((pg.global_max_pool(x),), np.testing.assert_array_equal, op, x, bug=bug)
    else:
        compare((pg.global_avg_pool(x),), close, op, x, bug=bug)


def test_every_known_bug_is_a_real_case():
    assert set(KNOWN_EVALUATOR_BUGS) <= LISTED_CASES, set(KNOWN_EVALUATOR_BUGS) - LISTED_CASES
