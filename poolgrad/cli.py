"""The ``poolgrad`` command.

``poolgrad demo``: max-pool a random batch and print where each example's gradient goes.
``poolgrad bench``: time the speed suite against PyTorch (see :mod:`poolgrad.bench`).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from . import ops


def _format_grid(values: np.ndarray, width: int = 6) -> str:
    def cell(v):
        if v == 0:
            return ".".rjust(width)
        return f"{v:{width}.2f}" if not float(v).is_integer() else f"{int(v):{width}d}"
    return "\n".join("  " + "".join(cell(v) for v in row) for row in values)


def demo(batch: int, size: int, kernel: int, stride: int | None, seed: int) -> str:
    """Pool a random batch (N, 1, size, size) and describe the routing of dy = 1."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, 1, size, size))
    y, pullback = ops.vjp(ops.max_pool, x, kernel, stride)
    dx = pullback(np.ones_like(y))
    per_example = [ops.vjp(ops.max_pool, x[n:n + 1], kernel, stride)[1] for n in range(batch)]
    alone = np.concatenate([pb(np.ones_like(y[:1])) for pb in per_example])
    receives = dx[:, 0] != 0
    lines = [
        f"max_pool of a batch of {batch} random {size}x{size} inputs, kernel {kernel}, "
        f"stride {stride or kernel}: output {y.shape[2]}x{y.shape[3]} per example",
        f"upstream gradient dy = 1 everywhere; the pullback keeps "
        f"{pullback.state_bytes_per_output:g} byte per output (PyTorch keeps 8)",
        "",
        "example 0, input:",
        _format_grid(np.round(x[0, 0], 2)),
        "example 0, gradient routed back (only each window's maximum receives it):",
        _format_grid(dx[0, 0]),
        "",
        f"how many of the {batch} examples send gradient to each input position:",
        _format_grid(receives.sum(axis=0)),
        f"each example reaches {receives.reshape(batch, -1).sum(axis=1).mean():.1f} of "
        f"{size * size} positions; the batch as a whole reaches {receives.any(axis=0).sum()}",
        "batch gradient == each example's gradient computed alone: "
        f"{np.array_equal(dx, alone)}",
    ]
    return "\n".join(lines)


def _at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text}")
        return value
    return parse


_positive = _at_least(1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="poolgrad", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("demo", help="show where a max-pool layer routes a batch's gradient")
    p.add_argument("--batch", type=_positive, default=100, help="examples in the batch")
    p.add_argument("--size", type=_positive, default=6, help="input height and width")
    p.add_argument("--kernel", type=_positive, default=2, help="window size")
    p.add_argument("--stride", type=_positive, default=None, help="default: the kernel")
    p.add_argument("--seed", type=_at_least(0), default=0)
    b = commands.add_parser("bench", help="time poolgrad against PyTorch on layers of real "
                                          "networks")
    b.add_argument("--quick", action="store_true", help="tiny shapes, one repetition")
    b.add_argument("--repeats", type=_positive, default=None,
                   help="timed repetitions per measurement (default 5, quick 1)")
    b.add_argument("--threads", type=_positive, default=None,
                   help="threads for both libraries (default: all cores)")
    b.add_argument("--out", default="bench.json", help="where to write the JSON results")
    return parser


def bench(args) -> None:
    from . import bench as suite
    result = suite.run(quick=args.quick, repeats=args.repeats, threads=args.threads,
                       progress=lambda text: print(f"  timing {text}", file=sys.stderr))
    suite.write_json(result, args.out)
    print(suite.format_table(result))
    print(f"results written to {args.out}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            print(demo(args.batch, args.size, args.kernel, args.stride, args.seed))
        elif args.command == "bench":
            bench(args)
    except (ValueError, TypeError, OSError) as error:
        print(f"poolgrad {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
