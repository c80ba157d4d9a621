"""On a CUDA GPU: the blur kinds through poolgrad.torch (their Triton kernels) beside
eager PyTorch's composition (a stride-1 pool, padding and a depthwise binomial
convolution at stride 2), forward and forward+backward, both layouts, on a
(128, 64, 112, 112) float32 batch; medians of ``triton.testing.do_bench``. Then the
bits of a NaN that float32 and float64 arithmetic make on the GPU and on the CPU.

    OUT=folder PYTHONPATH=. python3 benchmarks/cuda_blur.py
"""
import json
import os

import torch
import torch.nn.functional as F
import triton

import poolgrad.torch as pt

dev = "cuda"
torch.manual_seed(0)
x0 = torch.randn(128, 64, 112, 112, device=dev)


def reference(kind, mode):
    w1 = torch.tensor([0.25, 0.5, 0.25], device=dev)
    weight = (w1[:, None] * w1[None, :]).expand(64, 1, 3, 3).contiguous()
    def f(t):
        if kind == "max":
            t = F.max_pool2d(t, 2, 1)
        elif kind == "avg":
            t = F.avg_pool2d(t, 2, 1)
        t = F.pad(t, (1, 1, 1, 1), mode="constant" if mode == "zeros" else mode)
        return F.conv2d(t, weight.to(t.dtype), stride=2, groups=64)
    return f


ours = {"none": pt.blur_pool, "max": pt.max_blur_pool, "avg": pt.avg_blur_pool}


def passes(fn, x, dy):
    def forward():
        with torch.no_grad():
            fn(x)

    def forward_backward():
        leaf = x.detach().requires_grad_()
        fn(leaf).backward(dy)
    return {"forward": forward, "forward+backward": forward_backward}


def nan_bits(dtype, width):
    """The bits of NaN + 1 and 1 + NaN on the GPU and on the CPU, in hex."""
    a = torch.tensor([float("nan"), 1.0], dtype=dtype)
    b = torch.tensor([1.0, float("nan")], dtype=dtype)
    mask = (1 << (8 * width)) - 1
    view = {4: torch.int32, 8: torch.int64}[width]
    return {where: [hex(v & mask) for v in (a.to(where) + b.to(where)).view(view).cpu().tolist()]
            for where in (dev, "cpu")}


rows = []
for kind in ("none", "max", "avg"):
    for mode in ("reflect", "zeros"):
        for layout in ("NCHW", "channels-last"):
            x = x0 if layout == "NCHW" else x0.contiguous(memory_format=torch.channels_last)
            args = (2, 3, mode) if kind == "none" else (2, 2, 3, mode)

            def mine(t, kind=kind, args=args):
                return ours[kind](t, *args)
            ref = reference(kind, mode)
            with torch.no_grad():
                torch.testing.assert_close(mine(x), ref(x), rtol=1e-4, atol=1e-5)
            dy = torch.randn_like(mine(x))
            ours_passes, eager_passes = passes(mine, x, dy), passes(ref, x, dy)
            for name in ours_passes:
                ta, tb = (triton.testing.do_bench(p[name], warmup=25, rep=150,
                                                  return_mode="median")
                          for p in (ours_passes, eager_passes))
                rows.append((kind, mode, layout, name, ta, tb))
                print(f"{kind:5s} {mode:8s} {layout:13s} {name:17s} poolgrad {ta:8.3f} ms  "
                      f"eager {tb:8.3f} ms  {tb / ta:5.2f}x", flush=True)

print("float32 NaN + 1:", nan_bits(torch.float32, 4))
print("float64 NaN + 1:", nan_bits(torch.float64, 8))
with open(os.path.join(os.environ.get("OUT", "."), "blur_timings.json"), "w") as stream:
    json.dump(rows, stream)
