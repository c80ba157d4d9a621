"""Anti-aliased pooling and GeM on the CPU: poolgrad (NumPy kernels, and poolgrad.torch)
against kornia and plain PyTorch, eager and torch.compile'd, side by side in one run.

    python benchmarks/kinds_vs_kornia.py        # prints a Markdown table (a few minutes)

Rows:

* ``blur_pool`` (3x3 binomial, stride 2, zero padding: kornia's ``BlurPool2D(3, 2)``),
  ``max_blur_pool`` (2x2 stride-1 max, then that blur: kornia's ``MaxBlurPool2D(3)``) on a
  32x64x56x56 float32 batch (ResNet's first pooling's input, 25.7 MB);
* ``gem_pool`` global, p = 3 (the retrieval head) on 64x512x14x14, against the usual
  ``avg_pool2d(x.clamp(min=eps).pow(p), ...).pow(1/p)`` (kornia has no GeM).

Each time is the median of 7 calls after 2 warm-up calls, in milliseconds, forward
alone and forward+backward (from a fresh input's forward to its input gradient), with
torch using all the process's threads. The speedup columns are the reference's time
over poolgrad NumPy's.
"""

import os
import statistics
import time

import numpy as np
import torch

import poolgrad as pg
import poolgrad.torch as pt

REPEATS, WARMUP = 7, 2


def median_ms(fn) -> float:
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def numpy_passes(op, x, *args, **kwargs):
    y, pullback = pg.vjp(op, x, *args, **kwargs)
    dy = np.ones_like(y)

    def both():
        _, pullback = pg.vjp(op, x, *args, **kwargs)
        pullback(dy)
    return (lambda: op(x, *args, **kwargs)), both


def torch_passes(fn, x):
    with torch.no_grad():
        dy = torch.ones_like(fn(x))
    leaf = x.clone().requires_grad_()

    def forward():
        with torch.no_grad():
            fn(x)

    def both():
        leaf.grad = None
        fn(leaf).backward(dy)
    return forward, both


def gem_reference(x, p=3.0, eps=1e-6):
    return torch.nn.functional.avg_pool2d(x.clamp(min=eps).pow(p),
                                          x.shape[-2:]).pow(1.0 / p)


def main():
    import kornia

    rng = np.random.default_rng(0)
    big = rng.standard_normal((32, 64, 56, 56)).astype(np.float32)
    head = np.abs(rng.standard_normal((64, 512, 14, 14))).astype(np.float32)
    cases = [
        ("blur_pool", big, (pg.blur_pool, (), {"padding_mode": "zeros"}),
         {"poolgrad.torch": lambda t: pt.blur_pool(t, padding_mode="zeros"),
          "kornia BlurPool2D": kornia.filters.BlurPool2D(3, 2)}),
        ("max_blur_pool", big, (pg.max_blur_pool, (), {"padding_mode": "zeros"}),
         {"poolgrad.torch": lambda t: pt.max_blur_pool(t, padding_mode="zeros"),
          "kornia MaxBlurPool2D": kornia.filters.MaxBlurPool2D(3)}),
        ("gem_pool (global)", head, (pg.gem_pool, (3.0,), {}),
         {"poolgrad.torch": lambda t: pt.gem_pool(t, 3.0),
          "torch avg_pool2d(x^p)^(1/p)": gem_reference}),
    ]
    print(f"threads: numba {pg_threads()}, torch {torch.get_num_threads()}; "
          f"cpu count {os.cpu_count()}")
    print("| operation | pass | poolgrad NumPy | poolgrad.torch | reference eager "
          "| reference compiled | speedup vs eager / compiled |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, x, (op, args, kwargs), fns in cases:
        xt = torch.from_numpy(x)
        (ours_name, ours), (ref_name, ref) = fns.items()
        compiled = torch.compile(ref)
        columns = [numpy_passes(op, x, *args, **kwargs), torch_passes(ours, xt),
                   torch_passes(ref, xt), torch_passes(compiled, xt)]
        for index, label in enumerate(("forward", "forward+backward")):
            times = [median_ms(column[index]) for column in columns]
            print(f"| {name} ({ref_name}) | {label} | {times[0]:.2f} | {times[1]:.2f} | "
                  f"{times[2]:.2f} | {times[3]:.2f} | {times[2] / times[0]:.2f}x / "
                  f"{times[3] / times[0]:.2f}x |", flush=True)


def pg_threads():
    import numba
    return numba.get_num_threads()


if __name__ == "__main__":
    main()
