"""poolgrad.torch models exported to ONNX (poolgrad.torch.onnx), run by ONNX Runtime
against torch's outputs; and torch.jit.trace."""

import contextlib
import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from torch import nn  # noqa: E402

import poolgrad.torch as pt  # noqa: E402
from poolgrad.torch.onnx import ExportRefused  # noqa: E402

POOLING_NODES = {"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool",
                 "GlobalLpPool", "MaxUnpool"}


def exported(model, *inputs, export=None):
    """The ONNX model of ``model`` (poolgrad's export, or ``export``), quietly."""
    export = export or pt.onnx.export
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return export(model, inputs).model_proto


def run_onnx(proto, *inputs):
    options = ort.SessionOptions()
    options.log_severity_level = 3  # ORT's shape-merge notes on ceil_mode windows
    session = ort.InferenceSession(proto.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {n: t.numpy() for n, t in zip(names, inputs, strict=True)})


def node_types(proto) -> list[str]:
    return [node.op_type for node in proto.graph.node]


class Functions(nn.Module):
    """One module calling many poolgrad.torch functions on its input: one export for
    every case (an export costs about a second)."""

    def __init__(self, *functions):
        super().__init__()
        self.functions = functions

    def forward(self, x):
        outputs = []
        for function in self.functions:
            result = function(x)
            outputs.extend(result if isinstance(result, tuple) else (result,))
        return tuple(outputs)


def unpool_round_trip(x):
    y, indices = pt.max_pool2d(x, 3, 2, 1, return_indices=True)
    return pt.max_unpool2d(y, indices, 3, 2, 1, output_size=x.shape[-2:])


GEOMETRIES = [  # kernel, stride, padding, dilation, ceil_mode
    (2, 2, 0, 1, False), (3, 2, 1, 1, True), (3, 2, 1, 2, False), (2, 3, 1, 1, True),
    ((3, 2), (2, 1), (1, 0), (1, 2), True), (5, 2, ((3, 1), (0, 2)), 1, False),
    (3, 1, "same", 4, False), (2, 2, 2, 3, True),  # pads >= kernel: the Gather forms
]


def core_functions():
    """(name, function) for every core op and the options ONNX has."""
    cases = []
    for k, s, p, d, c in GEOMETRIES:
        tag = f"k{k} s{s} p{p} d{d} c{c}"
        cases += [
            (f"max {tag}", lambda x, k=k, s=s, p=p, d=d, c=c: pt.max_pool2d(x, k, s, p, d, c)),
            (f"max+indices {tag}", lambda x, k=k, s=s, p=p, d=d, c=c: pt.max_pool2d(
                x, k, s, p, d, c, return_indices=True)),
            (f"avg {tag}", lambda x, k=k, s=s, p=p, d=d, c=c: pt.avg_pool2d(
                x, k, s, p, c, True, dilation=d)),
            (f"avg exclude pad {tag}", lambda x, k=k, s=s, p=p, d=d, c=c: pt.avg_pool2d(
                x, k, s, p, c, False, dilation=d)),
            (f"avg divisor 5 {tag}", lambda x, k=k, s=s, p=p, d=d, c=c: pt.avg_pool2d(
                x, k, s, p, c, True, 5, dilation=d)),
            (f"lp 2 {tag}", lambda x, k=k, s=s, p=p, d=d, c=c: pt.lp_pool2d(
                x, 2, k, s, c, padding=p, dilation=d)),
            (f"lp 1.5 {tag}", lambda x, k=k, s=s, p=p, d=d, c=c: pt.lp_pool2d(
                x, 1.5, k, s, c, padding=p, dilation=d)),
        ]
    for size in [1, (5, 5), (4, 3), (3, 7)]:  # global, equal bins, unequal bins
        cases += [
            (f"adaptive avg {size}", lambda x, o=size: pt.adaptive_avg_pool2d(x, o)),
            (f"adaptive max {size}", lambda x, o=size: pt.adaptive_max_pool2d(
                x, o, return_indices=True)),
        ]
    cases += [("global lp 3", lambda x: pt.lp_pool2d(x, 3, x.shape[-2:])),
              ("split ties", lambda x: pt.max_pool2d(x, 2, 1, ties="split")),
              ("unpool", unpool_round_trip)]
    return cases


def test_every_core_op_runs_in_onnx_runtime_as_in_torch():
    names, functions = zip(*core_functions(), strict=True)
    model = Functions(*functions)
    x = torch.randn(2, 3, 11, 10, generator=torch.Generator().manual_seed(0))
    proto = exported(model, x)
    assert not [n for n in proto.graph.node if n.domain not in ("", "ai.onnx")]
    assert {"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool",
            "MaxUnpool"} <= set(node_types(proto))
    got = run_onnx(proto, x)
    want = [t.numpy() for t in model(x)]
    assert len(got) == len(want)
    checked = 0
    for name in names:
        count = 2 if "indices" in name or "adaptive max" in name else 1
        for g, w in zip(got[checked:checked + count], want[checked:checked + count],
                        strict=True):
            assert g.shape == w.shape, name
            if g.dtype == np.int64 or name.startswith(("max", "adaptive max", "split")):
                np.testing.assert_array_equal(g, w, err_msg=name)  # max: bit for bit
            else:
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=name)
        checked += count


def test_1d_and_3d_pools_and_dtypes_run_in_onnx_runtime():
    x1 = torch.randn(2, 3, 13, generator=torch.Generator().manual_seed(1))
    x3 = torch.randn(1, 2, 6, 7, 5, generator=torch.Generator().manual_seed(2))

    class Mixed(nn.Module):
        def forward(self, a, b):
            wide, small = (a * 40).to(torch.int32), (a * 40).to(torch.int8)
            return (*pt.max_pool1d(a, 3, 2, 1, ceil_mode=True, return_indices=True),
                    pt.avg_pool1d(a, 3, 2, 1, ceil_mode=True),
                    *pt.max_pool3d(b, 2, 2, 1, return_indices=True),
                    pt.avg_pool3d(b, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                    pt.lp_pool3d(b, 2, 2), pt.max_pool1d(wide, 2), pt.max_pool1d(small, 3, 1, 1),
                    pt.avg_pool1d(a.half(), 2), pt.max_pool1d(a.bfloat16(), 2).float(),
                    pt.adaptive_max_pool1d(small, 1), pt.adaptive_max_pool1d(wide, 1),
                    *pt.max_pool1d((a * 40).long(), 3, 2, 1, return_indices=True))
    model = Mixed()
    got = run_onnx(exported(model, x1, x3), x1, x3)
    for g, w in zip(got, model(x1, x3), strict=True):
        assert g.dtype == w.numpy().dtype
        if w.dtype in (torch.float32, torch.float16) and not torch.equal(w, w.round()):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(g, w.numpy())


def test_replaced_model_exports_the_nodes_torchs_own_model_does():
    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True),
                             nn.Conv2d(8, 8, 3, padding=1), nn.AvgPool2d(3, 2, 1),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten()).eval()
    x = torch.rand(2, 3, 20, 20)
    theirs = exported(model(), x, export=torch.onnx.export)
    replaced = model()
    assert pt.replace_pooling(replaced) == 3
    ours = exported(replaced, x)
    pooling = [t for t in node_types(ours) if t in POOLING_NODES]
    assert pooling == ["MaxPool", "AveragePool", "GlobalAveragePool"]
    # torch exports a global average as ReduceMean, and its LPPool as Pow, AveragePool
    # and Mul; poolgrad's are GlobalAveragePool and LpPool nodes
    as_torch = {"GlobalAveragePool": "ReduceMean"}
    assert [as_torch.get(t, t) for t in pooling] == [
        t for t in node_types(theirs) if t in {*POOLING_NODES, "ReduceMean"}]
    np.testing.assert_allclose(run_onnx(ours, x)[0], replaced(x).detach().numpy(),
                               rtol=1e-6, atol=1e-6)


def test_translation_table_works_with_torch_onnx_export():
    model = nn.Sequential(pt.MaxPool2d(2), pt.AdaptiveAvgPool2d(1)).eval()
    x = torch.randn(1, 2, 6, 6)
    with torch.no_grad():
        proto = exported(model, x, export=lambda m, args: torch.onnx.export(
            m, args, custom_translation_table=pt.onnx.translations()))
    assert node_types(proto) == ["MaxPool", "GlobalAveragePool"]
    np.testing.assert_allclose(run_onnx(proto, x)[0], model(x).numpy(), rtol=1e-6)


def test_kinds_export_as_compositions_of_standard_nodes():
    torch.manual_seed(0)
    kinds = [pt.BlurPool(), pt.MaxBlurPool(), pt.SoftPool(2), pt.GeMPool(),
             pt.GeMPool(kernel_size=2), pt.MixedPool(2), pt.GatedPool(2), pt.AttentionPool(4)]
    model = Functions(*kinds)
    x = torch.rand(2, 4, 12, 12)
    proto = exported(model, x)
    assert not [n for n in proto.graph.node if n.domain not in ("", "ai.onnx")]
    for g, w in zip(run_onnx(proto, x), model(x), strict=True):
        np.testing.assert_allclose(g, w.detach().numpy(), rtol=1e-6, atol=1e-6)


def test_blur_kinds_export_in_every_padding_mode_dimension_and_dtype():
    torch.manual_seed(0)
    model = Functions(
        lambda x: pt.blur_pool(x, 2, 3, "zeros"),
        lambda x: pt.blur_pool(x, (2, 3), (4, 2), "circular"),
        lambda x: pt.max_blur_pool(x, 3, 2, 5, "replicate"),
        lambda x: pt.avg_blur_pool(x, 2, 2, 3, "reflect"),
        lambda x: pt.max_blur_pool(x.half(), 2, 2, 3).float(),
        lambda x: pt.blur_pool(x.bfloat16(), 2, 3).float(),
        lambda x: pt.blur_pool(x[..., 0], 2, 3),
        lambda x: pt.max_blur_pool(x[:, :, None, :6], (1, 2, 2), (1, 2, 2), (1, 3, 3),
                                   "circular"))
    x = torch.rand(2, 3, 11, 10)
    proto = exported(model, x)
    assert {"Conv", "MaxPool", "AveragePool", "Pad", "Gather"} <= set(node_types(proto))
    assert "ArgMax" not in node_types(proto)  # the unused winners are pruned
    # float16's blurs of float16 maxima often fall on a rounding tie, which ONNX
    # Runtime's float32 Conv may break the other way: one float16 ulp
    half_ulp = [0, 0, 0, 0, 2 ** -11, 0, 0, 0]
    for got, want, ulp in zip(run_onnx(proto, x), model(x), half_ulp, strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=max(ulp, 1e-6))


@pytest.mark.parametrize("module, match", [
    (pt.StochasticPool(2).eval(), "stochastic_pool cannot be exported"),
    (pt.FractionalMaxPool(2, output_size=4, seed=0), "fractional_max_pool cannot be exported"),
])
def test_what_onnx_cannot_express_is_refused(module, match):
    with pytest.raises(ExportRefused, match=match):
        exported(module, torch.rand(1, 2, 8, 8))


def test_dynamic_spatial_sizes_export_and_gather_forms_refuse_them():
    from torch.export import Dim
    sizes = {"x": {0: Dim("batch"), 2: Dim("height", min=6), 3: Dim("width", min=6)}}
    model = Functions(lambda x: pt.avg_pool2d(x, 3, 2, 1), lambda x: pt.max_pool2d(x, 2),
                      lambda x: pt.adaptive_avg_pool2d(x, 1), lambda x: pt.lp_pool2d(x, 2, 2))
    proto = exported(model, torch.rand(2, 3, 8, 8),
                     export=lambda m, args: pt.onnx.export(m, args, dynamic_shapes=sizes))
    x = torch.rand(3, 3, 11, 9)  # another size than the export's
    for got, want in zip(run_onnx(proto, x), model(x), strict=True):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ExportRefused, match="needs static spatial sizes"):
        exported(Functions(lambda x: pt.adaptive_avg_pool2d(x, 3)), torch.rand(2, 3, 8, 8),
                 export=lambda m, args: pt.onnx.export(m, args, dynamic_shapes=sizes))


def test_split_ties_keep_their_gradient_through_torch_export():
    class Split(nn.Module):
        def forward(self, x):
            return pt.max_pool2d(x, 2, ties="split")
    x = torch.ones(1, 1, 2, 2, requires_grad=True)
    torch.export.export(Split(), (x,)).module()(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 0.25))


def test_export_options_are_checked():
    model = pt.MaxPool2d(2)
    x = torch.rand(1, 1, 4, 4)
    with pytest.raises(ValueError, match="opset_version >= 19, got 17"):
        pt.onnx.export(model, (x,), opset_version=17)
    with pytest.raises(ValueError, match="needs the dynamo exporter"):
        pt.onnx.export(model, (x,), dynamo=False)


def test_missing_onnxscript_is_named(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "onnxscript", None)
    with pytest.raises(ImportError, match="pip install onnxscript"):
        pt.onnx.translations()


def test_jit_trace_records_poolgrads_operators():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.AvgPool2d(2))
    pt.replace_pooling(model)
    x = torch.randn(2, 2, 14, 14)
    with warnings.catch_warnings():  # torch 2.13 deprecates torch.jit; shapes become constants
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(model, (x,))
        graph = str(traced.inlined_graph)
        assert "poolgrad::max_pool_values" in graph and "poolgrad::avg_pool" in graph
        assert torch.equal(traced(x), model(x))
        traced(x).sum().backward()
    reference = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    for got, want in zip(reference, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(got, want)
