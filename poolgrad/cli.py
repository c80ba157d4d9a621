"""The ``poolgrad`` command.

``poolgrad demo``: max-pool a random batch and print where each example's gradient goes.
``poolgrad bench``: time the speed suite against PyTorch (see :mod:`poolgrad.bench`);
``--torch``: poolgrad's PyTorch front end against eager and compiled PyTorch;
``--kinds``: every pooling kind through both APIs against plain PyTorch and kornia;
``--device cuda``: its Triton kernels on a GPU.
``poolgrad train``: train a small CNN on a local dataset (see :mod:`poolgrad.train`).
``poolgrad explain``: draw where each example's gradient goes (see :mod:`poolgrad.explain`).
``poolgrad study shift``: does pooling make a network shift-invariant? (see
:mod:`poolgrad.study`).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from . import __doc__ as _ABOUT  # the package's first line: what poolgrad is
from . import ops
from .tools.files import check_output_file


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


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, as poolgrad's own are: what was
    wrong, and where the allowed values are (argparse prints its usage block first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# --overwrite's rule, the same for both commands that take it
_OVERWRITE = ("replace OUT's {what} whole with this one once it is written: until then OUT "
              "stays as it was, and a crash leaves the old {what} or the new, never a mix. "
              "Only a {what} of this command is replaced: a folder holding anything else is "
              "refused, never deleted")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="poolgrad", description=_ABOUT.splitlines()[0])
    commands = parser.add_subparsers(dest="command", metavar="COMMAND",
                                     title="commands (poolgrad COMMAND --help for each)")
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
                   help="timed repetitions per measurement (default 5, quick 1; the "
                        "training steps of --models: 3)")
    b.add_argument("--threads", type=_positive, default=None,
                   help="threads for both libraries (default: all cores)")
    b.add_argument("--out", default=None,
                   help="where to write the JSON results (default: runs/bench.json; "
                        "runs/bench-torch.json with --torch, runs/bench-kinds.json with "
                        "--kinds, runs/bench-cuda.json with --device cuda)")
    b.add_argument("--torch", action="store_true",
                   help="time poolgrad.torch against eager and torch.compiled PyTorch instead, "
                        "with the per-call overhead")
    b.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (default): the NumPy API's kernels; cuda: poolgrad.torch's "
                        "Triton kernels on the GPU, float32 and bfloat16, with a large layer")
    b.add_argument("--models", action="store_true",
                   help="with --torch: also time training steps of VGG-11 and ResNet-18 "
                        "with and without poolgrad's pooling (a few minutes)")
    b.add_argument("--kinds", action="store_true",
                   help="time every pooling kind (blur, soft, stochastic, fractional, GeM, "
                        "mixed, gated, attention) through the NumPy API and poolgrad.torch "
                        "against plain PyTorch, eager and compiled, and kornia instead")
    t = commands.add_parser("train", help="train a CNN with poolgrad's layers on a local dataset")
    t.add_argument("--dataset", default="digits",
                   help="digits (default), mnist1d, or idx:PATH (a folder of MNIST IDX files)")
    t.add_argument("--pool", default="max",
                   help="downsampling layer: max (default), avg, lp (p = 2), blur, max-blur, "
                        "avg-blur, soft, stochastic, fractional, gem, mixed, gated, aps, "
                        "max-aps, lps (polyphase sampling), or strided-conv")
    t.add_argument("--head", default=None,
                   help="what the linear classifier reads: flatten (default, all features), "
                        "gap (their global average) or attention (an attention pooling)")
    t.add_argument("--gap-head", action="store_true", help="the same as --head gap")
    t.add_argument("--epochs", type=_positive, default=None, help="default: per dataset")
    t.add_argument("--batch-size", type=_positive, default=100)
    t.add_argument("--accumulate", type=_positive, default=1, metavar="K",
                   help="batches per optimizer step (Caffe's iter_size): K batches of "
                        "--batch-size, their gradients summed as the mean over all their "
                        "examples; trains like --batch-size K times as large")
    t.add_argument("--optimizer", default=None,
                   help="sgd, adagrad, rmsprop or adam (default: per dataset)")
    t.add_argument("--lr", type=_positive_float, default=None,
                   help="learning rate (default: per dataset)")
    t.add_argument("--seed", type=_at_least(0), default=0)
    t.add_argument("--out", default=None,
                   help="output folder (default: runs/DATASET), which holds one run and "
                        "nothing else: a folder holding another run is refused unless "
                        "--resume or --overwrite, one holding other files always")
    t.add_argument("--resume", action="store_true",
                   help="continue from OUT/checkpoint.npz, or checkpoint.pt with --engine "
                        "torch (--epochs may extend the run)")
    t.add_argument("--overwrite", action="store_true", help=_OVERWRITE.format(what="run"))
    t.add_argument("--engine", choices=("numpy", "torch"), default="numpy",
                   help="numpy (default): poolgrad.nn's layers; torch: torch.nn layers with "
                        "poolgrad.torch's pooling modules")
    t.add_argument("--nproc", type=_positive, default=1,
                   help="with --engine torch: processes training data-parallel, each on an "
                        "equal share of every batch (--batch-size is the global batch)")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="with --engine torch: auto (default): the GPU when torch sees one "
                        "(and --nproc is 1); cpu; cuda")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    e = commands.add_parser("explain", help="draw where each example's gradient goes through "
                                            "a pooling layer")
    e.add_argument("--source", default="digits",
                   help="random, digits (default), mnist1d, a .npy file of (N, H, W) maps, or "
                        "checkpoint:DIR (the input of a trained model's first pooling layer, "
                        "with that layer's kind, kernel, stride and padding)")
    e.add_argument("--kind", default="max",
                   help="max (default), avg, lp; blur, max-blur, avg-blur, soft, stochastic, "
                        "gem, fractional, mixed or gated (where one output's gradient goes); "
                        "or aps (adaptive polyphase sampling's choice of phase and how a "
                        "1-pixel shift moves it)")
    e.add_argument("--kernel", type=_positive, default=2)
    e.add_argument("--stride", type=_positive, default=None, help="default: the kernel")
    e.add_argument("--padding", type=_at_least(0), default=0)
    e.add_argument("--ties", default="first", help="first (default) or split")
    e.add_argument("--p", type=_positive_float, default=2.0, help="the p of lp pooling")
    e.add_argument("--batch", type=_positive, default=None,
                   help="examples in the batch (default 16; 100 with --invariance or "
                        "--network)")
    e.add_argument("--examples", type=_positive, default=3, help="examples drawn one by one")
    e.add_argument("--channel", type=_at_least(0), default=0,
                   help="which channel of a checkpoint's pooling input")
    e.add_argument("--seed", type=_at_least(0), default=0)
    e.add_argument("--invariance", action="store_true",
                   help="the translation-invariance demonstration instead")
    e.add_argument("--network", action="store_true",
                   help="the batch question for a whole network instead: a small CNN with "
                        "max and with average pooling (trained here, or checkpoint:DIR's), "
                        "its weight gradients per example, for the batch and averaged "
                        "first, and the optimizer's step")
    e.add_argument("--epochs", type=_positive, default=3,
                   help="with --network: epochs of training first (default 3)")
    e.add_argument("--out", default="explain", help="folder for the figures")
    e.add_argument("--dy", default="random",
                   help="upstream gradient: random (default, integers 1-9) or ones")
    e.add_argument("--no-color", action="store_true", help="plain terminal output")
    s = commands.add_parser("study", help="answer a question about pooling with trained "
                                          "networks")
    studies = s.add_subparsers(dest="study", metavar="STUDY", required=True,
                               title="studies")
    shift = studies.add_parser(
        "shift", help="does pooling make a network shift-invariant? (about 15 minutes)",
        description="Train every downsampling with every head on MNIST-1D and on digits on "
                    "a 16x16 canvas (with and without translation in training), several "
                    "seeds each, and measure how the predictions move under shifts. A study "
                    "stopped halfway goes on where it stopped when run again.")
    shift.add_argument("--out", default=os.path.join("runs", "shift-study"),
                       help="output folder (default runs/shift-study); finished runs in it "
                            "are kept and never redone. It holds one study and nothing "
                            "else: a folder holding anything else is refused")
    shift.add_argument("--overwrite", action="store_true",
                       help=_OVERWRITE.format(what="study"))
    shift.add_argument("--quick", action="store_true",
                       help="check the pipeline on a sliver of the data in seconds; its "
                            "numbers mean nothing")
    shift.add_argument("--seeds", type=_positive, default=None, help="seeds per cell "
                                                                     "(default 3)")
    shift.add_argument("--epochs", type=_positive, default=None,
                       help="epochs per run (default: 15 for mnist1d, 20 for the digits)")
    shift.add_argument("--datasets", type=_names, default=None,
                       help="comma-separated, from mnist1d, digits16, digits16-translated "
                            "(default: all)")
    shift.add_argument("--pools", type=_names, default=None,
                       help="comma-separated downsamplings (default: max, avg, lp, "
                            "strided-conv, blur, max-blur, gem, soft, stochastic, fractional, "
                            "aps, max-aps, lps)")
    shift.add_argument("--conv-padding", choices=("zeros", "circular"), default="zeros",
                       help="the convolutions' padding (default zeros); circular commutes "
                            "with circular shifts, as adaptive polyphase sampling needs")
    shift.add_argument("--heads", type=_names, default=None,
                       help="comma-separated, from flatten, gap, attention (default: all)")
    shift.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                       help="auto (default): the GPU when torch sees one")
    shift.add_argument("--workers", type=_positive, default=None,
                       help="processes training side by side (default: one per core on the "
                            "CPU, one on the GPU)")
    shift.add_argument("--quiet", action="store_true", help="no line per finished run")
    return parser


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (value > 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def train(args) -> None:
    from . import train as trainer
    config = trainer.TrainConfig(
        dataset=args.dataset, out=args.out or None, engine=args.engine, pool=args.pool,
        head=args.head, gap_head=args.gap_head, epochs=args.epochs, batch_size=args.batch_size,
        accumulate=args.accumulate, optimizer=args.optimizer, lr=args.lr, seed=args.seed,
        resume=args.resume, overwrite=args.overwrite, nproc=args.nproc, device=args.device,
        progress=not args.quiet, flags=True)
    metrics = trainer.train(config)
    settings = metrics["settings"]
    where = "" if args.engine == "numpy" else (
        f" (torch, {args.nproc} process{'es' if args.nproc > 1 else ''}, "
        f"{settings['device']})")
    print(f"{settings['dataset']}, {settings['pool']} pooling{where}: test accuracy "
          f"{metrics['test_accuracy']:.2%} ({metrics['test_examples']} test examples) after "
          f"{metrics['epochs_run']} epochs, {metrics['train_time_s']:.1f} s of training")
    print(f"plot: {metrics['plot']}")
    print(f"checkpoint: {metrics['checkpoint']}")
    print(f"metrics: {os.path.join(config.out, trainer.METRICS)}")


def study(args) -> None:
    from . import study as studies
    plan = studies.make_plan(quick=args.quick, datasets=args.datasets, pools=args.pools,
                             heads=args.heads, seeds=args.seeds, epochs=args.epochs,
                             conv_padding=args.conv_padding)
    progress = None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    paths = studies.shift_study(args.out, plan, device=args.device, workers=args.workers,
                                progress=progress, overwrite=args.overwrite)
    with open(paths["findings"]) as stream:
        verdicts = [line for line in stream if line.startswith(("## ", "**Verdict"))]
    print("".join(verdicts), end="")
    if args.quick:
        print("(--quick: a check of the pipeline; its numbers mean nothing)")
    for name, path in paths.items():
        print(f"{name}: {path}")


def bench(args) -> None:
    from .bench import suite
    if args.kinds:
        for given, why in ((args.torch, "times poolgrad.torch already: leave out --torch"),
                           (args.models, "times no models: leave out --models"),
                           (args.device == "cuda", "times the CPU kernels: leave out "
                                                   "--device cuda")):
            if given:
                raise ValueError(f"--kinds {why}")
    if args.models and not args.torch:
        raise ValueError("--models times models through poolgrad.torch: give --torch too")
    if args.device == "cuda" and args.torch:
        raise ValueError("--device cuda times poolgrad.torch already: leave out --torch")
    if args.out is None:
        mode = ("-cuda" if args.device == "cuda" else "-torch" if args.torch
                else "-kinds" if args.kinds else "")
        args.out = os.path.join("runs", f"bench{mode}.json")
    check_output_file(args.out)  # before the minutes of timing, not after them
    if args.device == "cuda":
        from .bench import cuda as timer
        options = {"device": "cuda"}
    elif args.torch:
        from .bench import torch_api as timer
        options = {"models": args.models}
    elif args.kinds:
        from .bench import kinds as timer
        options = {}
    else:
        from .bench import numpy_api as timer
        options = {}
    result = timer.run(quick=args.quick, repeats=args.repeats, threads=args.threads,
                       progress=lambda text: print(f"  timing {text}", file=sys.stderr),
                       **options)
    suite.write_json(result, args.out)
    print(timer.format_table(result))
    print(f"results written to {args.out}")


def explain(args) -> None:
    from . import explain as explainer
    config = explainer.ExplainConfig(
        source=args.source, out=args.out, kind=args.kind, kernel=args.kernel,
        stride=args.stride, padding=args.padding, ties=args.ties, p=args.p, batch=args.batch,
        examples=args.examples, seed=args.seed, channel=args.channel, dy=args.dy,
        invariance=args.invariance, network=args.network, epochs=args.epochs, flags=True)
    if config.network:
        result = explainer.explain_network(config)
        print(result["text"])
    elif config.invariance:
        result = explainer.explain_invariance(config)
        print(f"translation invariance, {args.kernel}x{args.kernel} windows with stride "
              f"{args.kernel}, on {result['description']}")
        print("shift  max: outputs unchanged  avg: outputs unchanged")
        for row in result["rows"]:
            inside = "inside the window" if row["shift"] < args.kernel else ""
            print(f"{row['shift']:5d}  {row['max']:22.1%}  {row['avg']:22.1%}  {inside}")
    elif config.kind not in explainer.KINDS:  # aps and the other kinds: their table
        result = explainer.explain(config)
        print(f"{result['description']}")
        print(result["table"])
    else:
        result = explainer.explain(config)
        summary = result["summary"]
        rendered = explainer.render_terminal(result["routing"], color=not args.no_color)
        _print_rich(rendered)
        print(f"{result['description']}: each example sends gradient to "
              f"{summary['mean_positions_reached_per_example']:.1f} of {summary['positions']} "
              f"positions; the batch reaches {summary['positions_reached_by_batch']}; batch "
              f"pullback == each example alone: {summary['batch_equals_examples_alone']}")
    for name, path in result["files"].items():
        print(f"{name}: {path}")


def _print_rich(rendered) -> None:
    if isinstance(rendered, str):
        print(rendered)
        return
    from rich.console import Console
    Console(highlight=False).print(rendered)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `poolgrad`: what it can do, not an error
        parser.print_help()
        return 0
    try:
        if args.command == "demo":
            print(demo(args.batch, args.size, args.kernel, args.stride, args.seed))
        elif args.command == "bench":
            bench(args)
        elif args.command == "train":
            train(args)
        elif args.command == "explain":
            explain(args)
        elif args.command == "study":
            study(args)
    except ChildProcessError as error:  # a rank of a data-parallel run failed
        print(f"poolgrad {args.command}: error: {error}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, OSError) as error:
        print(f"poolgrad {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: files are written atomically, so none is half done
        print(f"poolgrad {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
