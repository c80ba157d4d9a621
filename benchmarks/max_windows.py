"""Max pooling over whole planes and wide windows on NCHW float32 arrays, and the
averages over whole planes: poolgrad's NumPy API against PyTorch eager and compiled
(``torch.compile``), side by side in one process (docs/performance.md, "Global and
wide-window max pooling").

    python benchmarks/max_windows.py              # 2 threads, about three minutes
    python benchmarks/max_windows.py --threads 1

Each row times the forward (PyTorch under no_grad) and forward+backward (``dy`` ones,
``poolgrad.vjp`` against autograd) with :func:`poolgrad.bench.timing.median_seconds`,
which interleaves the contenders, in three rounds of 9 calls; the table gives each
contender's range of round medians in ms and the ratio of the best reference's best
median to poolgrad's best median (above 1: poolgrad faster). The values are checked
against PyTorch's before anything is timed.
"""

import argparse

import numpy as np
import torch
import torch.nn.functional as F

import poolgrad as pg
from poolgrad.bench.timing import median_seconds, thread_count

# (name, input shape, poolgrad operator and its arguments after x, PyTorch call of t)
LAYERS = [
    ("global max 56x56", (32, 64, 56, 56), pg.global_max_pool, (),
     lambda t: F.adaptive_max_pool2d(t, 1)),
    ("global max 7x7", (64, 2048, 7, 7), pg.global_max_pool, (),
     lambda t: F.adaptive_max_pool2d(t, 1)),
    ("adaptive avg to 1, 56x56", (32, 64, 56, 56), pg.adaptive_avg_pool, (1,),
     lambda t: F.adaptive_avg_pool2d(t, 1)),
    ("adaptive max to 2", (32, 64, 56, 56), pg.adaptive_max_pool, (2,),
     lambda t: F.adaptive_max_pool2d(t, 2)),
    ("adaptive max to 7", (32, 64, 56, 56), pg.adaptive_max_pool, (7,),
     lambda t: F.adaptive_max_pool2d(t, 7)),
    ("max 8x8/8", (32, 64, 56, 56), pg.max_pool, (8,), lambda t: F.max_pool2d(t, 8)),
    ("max 5x5/1", (8, 64, 56, 56), pg.max_pool, (5, 1), lambda t: F.max_pool2d(t, 5, 1)),
]
ROUNDS, REPEATS = 3, 9


def _passes(layer, x, compiled):
    _, _, op, args, reference = layer
    t = torch.from_numpy(x)

    def no_grad(function):
        def run():
            with torch.no_grad():
                return function(t)
        return run

    def autograd(function):
        def run():
            leaf = t.detach().requires_grad_()
            y = function(leaf)
            y.backward(torch.ones_like(y))
            return leaf.grad
        return run

    def vjp():
        y, pullback = pg.vjp(op, x, *args)
        return pullback(np.ones_like(y))

    return {"forward": {"poolgrad": lambda: op(x, *args), "eager": no_grad(reference),
                        "compiled": no_grad(compiled)},
            "forward+backward": {"poolgrad": vjp, "eager": autograd(reference),
                                 "compiled": autograd(compiled)}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print("| layer | pass | poolgrad ms | eager ms | compiled ms | best reference / poolgrad |")
    print("|---|---|---:|---:|---:|---:|")
    with thread_count(args.threads, torch):
        for layer in LAYERS:
            x = np.random.default_rng(0).standard_normal(layer[1], dtype=np.float32)
            _, _, op, op_args, reference = layer
            compiled = torch.compile(reference)
            torch.testing.assert_close(torch.from_numpy(op(x, *op_args)),
                                       reference(torch.from_numpy(x)), rtol=1e-6, atol=1e-6)
            for pass_name, contenders in _passes(layer, x, compiled).items():
                for run in contenders.values():
                    run()  # compiles (and warms) each contender before it is timed
                rounds = [median_seconds(contenders, REPEATS) for _ in range(ROUNDS)]
                spans = {k: (min(r[k] for r in rounds) * 1e3, max(r[k] for r in rounds) * 1e3)
                         for k in contenders}
                ratio = min(spans["eager"][0], spans["compiled"][0]) / spans["poolgrad"][0]
                cells = " | ".join(f"{lo:.2f}-{hi:.2f}" for lo, hi in spans.values())
                print(f"| {layer[0]} | {pass_name} | {cells} | {ratio:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
