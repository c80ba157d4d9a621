"""On a CUDA GPU, within a deadline: ``poolgrad bench --device cuda``'s layers one at a
time, then every pooling kind of ``poolgrad bench --kinds`` through poolgrad.torch
against plain PyTorch, eager and compiled, on the same device.

    python benchmarks/cuda_timings.py --out runs/cuda-timings.json --seconds 300

A lent GPU comes with minutes, not hours: the layers go first (the large one first),
each written to the JSON as soon as it is timed, then the kinds, and whatever the
deadline leaves out is listed as left out. The layers' rows are those of
:func:`poolgrad.bench.cuda.run`; the kinds' rows time each call with CUDA events
(medians of ``--repeats`` after three warm-up calls, implementations taking turns) on
a ``(128, 64, 112, 112)`` float32 batch, in both layouts. Each kind is checked
against its eager reference before it is timed. The random kinds' references take
their draws made once on the device, where poolgrad.torch draws at every call.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

from poolgrad.bench import cuda as bench_cuda
from poolgrad.bench import kinds as bench_kinds
from poolgrad.bench import suite, torch_api

KIND_SHAPE = (128, 64, 112, 112)


def write(result: dict, path: str) -> None:
    temporary = path + ".part"
    with open(temporary, "w") as stream:
        json.dump(result, stream, indent=1)
    os.replace(temporary, path)


def kind_rows(kind, front_end, base, repeats, device, seconds) -> list[dict]:
    rows = []
    x0 = base.clamp(min=0) if kind.non_negative else base
    params = kind.params(base.shape[1], np.random.default_rng(1), np.float32) if (
        kind.params) else ()
    tensors = tuple(torch.from_numpy(p).to(device) for p in params)
    for layout in suite.LAYOUTS:
        xt = bench_cuda.layout_input(x0, layout, torch)
        draws = kind.draws(xt).to(device) if kind.draws else None
        if draws is not None and kind.function == "fractional_max_pool":
            draws = draws.to(xt.dtype)
        ours = bench_kinds.front_end_call(kind, front_end, tensors,
                                          torch.Generator().manual_seed(2))
        eager = bench_kinds.reference_call(kind, tensors, draws)
        with torch.no_grad():
            dy = torch.ones_like(eager(xt))
            dy_ours = torch.ones_like(ours(xt))
        implementations = {"poolgrad": torch_api.passes(ours, xt, dy_ours, torch),
                           "eager": torch_api.passes(eager, xt, dy, torch)}
        if not kind.draws:  # the same function: the same values and gradient
            for pass_name in bench_kinds.PASSES:
                bench_kinds._assert_close(
                    implementations["poolgrad"][pass_name](),
                    implementations["eager"][pass_name](), bench_kinds.TOLERANCE,
                    f"poolgrad.torch and eager PyTorch disagree on {kind.name} {layout} "
                    f"{pass_name}")
        compiled = suite.compile_static(lambda t, u: kind.reference(t, u, *tensors), torch)
        for pass_name in bench_kinds.PASSES:
            contenders = {name: p[pass_name] for name, p in implementations.items()}
            started = time.perf_counter()
            with suite.quiet_compile():
                run = torch_api.passes(lambda t, c=compiled, d=draws: c(t, d), xt, dy,
                                       torch)[pass_name]
                bench_kinds._assert_close(run(), contenders["eager"](), bench_kinds.TOLERANCE,
                                          f"compiled and eager disagree on {kind.name}")
            contenders["compiled"] = run
            compile_s = time.perf_counter() - started
            ms = {k: v * 1e3 for k, v in bench_cuda.median_seconds(contenders, repeats,
                                                                   seconds).items()}
            best = min(ms["eager"], ms["compiled"])
            rows.append({"kind": kind.function, "settings": kind.settings, "layout": layout,
                         "pass": pass_name, "poolgrad_ms": ms["poolgrad"],
                         "eager_ms": ms["eager"], "compiled_ms": ms["compiled"],
                         "compile_s": compile_s, "speedup_vs_best": best / ms["poolgrad"]})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/cuda-timings.json")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--skip-layers", action="store_true",
                        help="time the kinds alone (a lease too short for both)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a dry run of the pipeline on tiny shapes")
    args = parser.parse_args(argv)
    deadline = time.perf_counter() + args.seconds
    device = args.device
    quick = device == "cpu"
    front_end = torch_api.import_front_end()
    result = {"layers": [], "layer_rows": [], "kinds": [], "kind_rows": [], "left_out": [],
              "repeats": args.repeats, "kind_shape": list(KIND_SHAPE)}
    layers = () if args.skip_layers else (bench_cuda.LARGE, *suite.SUITE)
    for layer in layers:
        if time.perf_counter() > deadline:
            result["left_out"].append(layer.name)
            continue
        started = time.perf_counter()
        try:
            done = bench_cuda.run(quick=quick, repeats=args.repeats, device=device,
                                  layers=(layer,))
        except Exception as error:  # recorded; the next layer is timed
            result["layers"].append(f"{layer.name}: FAILED {type(error).__name__}: "
                                    f"{str(error)[:300]}")
            print(result["layers"][-1], flush=True)
            continue
        result["machine"] = done["machine"]
        result["layers"].append(layer.name)
        result["layer_rows"] += done["rows"]
        print(f"{layer.name}: {time.perf_counter() - started:.0f} s", flush=True)
        write(result, args.out)
    if result["layer_rows"]:
        suite.best_pytorch(result["layer_rows"], ("layer", "dtype", "pass"),
                           ("eager_ms", "compiled_ms"))
        result["layer_summary"] = bench_cuda.summarize(result["layer_rows"])
        print(bench_cuda.format_table({**result, "rows": result["layer_rows"],
                                       "summary": result["layer_summary"], "quick": quick,
                                       "mode": "cuda", "layers": []}), flush=True)
        write(result, args.out)
    shape = bench_kinds.QUICK_SHAPE if quick else KIND_SHAPE
    base = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device)
    seconds = bench_cuda._timer(torch, device)
    for kind in bench_kinds.KINDS:
        if time.perf_counter() > deadline:
            result["left_out"].append(kind.name)
            continue
        started = time.perf_counter()
        try:
            result["kind_rows"] += kind_rows(kind, front_end, base, args.repeats, device,
                                             seconds)
            result["kinds"].append(kind.name)
        except Exception as error:  # recorded; the next kind is timed
            result["kinds"].append(f"{kind.name}: FAILED {type(error).__name__}: "
                                   f"{str(error)[:300]}")
            print(result["kinds"][-1], flush=True)
        print(f"{kind.name}: {time.perf_counter() - started:.0f} s", flush=True)
        write(result, args.out)
    for row in result["kind_rows"]:
        print(f"{row['kind']:20s} {row['settings']:18s} {row['layout']:13s} {row['pass']:16s} "
              f"{row['poolgrad_ms']:8.3f} {row['eager_ms']:8.3f} {row['compiled_ms']:8.3f} "
              f"{row['speedup_vs_best']:6.2f}x")
    print("left out:", result["left_out"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
