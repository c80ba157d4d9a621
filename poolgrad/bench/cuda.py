"""``poolgrad bench --device cuda``: poolgrad.torch on a CUDA device (its Triton kernels)
against eager and ``torch.compile``d PyTorch, in one process.

For every layer of :data:`poolgrad.bench.suite.SUITE` and a large VGG layer
(256x64x224x224), in NCHW and channels-last, in float32 and bfloat16, three passes are
timed for three implementations of the same ``torch.nn.functional`` call
(poolgrad.torch, eager PyTorch, and that call compiled by Inductor with static shapes):

- *forward*: under ``torch.no_grad()`` (max pooling keeps no winners);
- *backward*: ``torch.autograd.grad`` of a kept forward with ``dy`` of ones;
- *forward+backward*: a fresh leaf, its forward and its gradient.

Times are medians of CUDA-event timings, the implementations taking turns round after
round after a warm-up. The roofline of a pass is the bytes it must read and write
(:func:`poolgrad.bench.suite.must_move`) over the device's copy bandwidth, measured in
the same run by ``Tensor.copy_`` of a large buffer and counted as bytes read plus
written.
Each backward also runs twice and records whether the two gradients have the same bits.

Before anything is timed, every implementation's result of every pass is checked
against eager PyTorch's: a benchmark of a wrong result measures nothing. Where they
disagree, PyTorch's float64 result on the CPU judges: a wrong poolgrad stops the
benchmark; a wrong PyTorch baseline is timed, its time kept apart
(``eager_wrong_result_ms``) and its row marked (``wrong_results``).
"""

from __future__ import annotations

import statistics
import time
import types
from dataclasses import asdict

from . import suite, torch_api

LARGE = suite.Layer("VGG 2x2/2 large", "max", (256, 64, 224, 224), 2, 2)
LAYERS = suite.SUITE + (LARGE,)
DTYPES = ("float32", "bfloat16")
PASSES = suite.PASSES
IMPLEMENTATIONS = {"poolgrad": "poolgrad_ms", "eager": "eager_ms", "compiled": "compiled_ms"}
WARMUP_CALLS = 3
COPY_BYTES = 2**30  # the roofline's copy: far beyond any cache (quick: 1 MiB)


def _import_torch(device: str):
    try:
        import torch
    except ImportError:
        raise ValueError("poolgrad bench --device cuda needs PyTorch and Triton: pip install "
                         "'poolgrad[cuda]'") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("poolgrad bench --device cuda needs a CUDA device, and "
                         "torch.cuda.is_available() is False here; run it on a machine "
                         "with an NVIDIA GPU")
    return torch


def _timer(torch, device: str):
    """``seconds(fn)``: one call of ``fn``, by CUDA events on a CUDA device (the wall
    clock otherwise: the pipeline's own tests run on the CPU)."""
    if device == "cuda":
        def seconds(fn):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return seconds

    def wall(fn):
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return wall


def median_seconds(functions: dict, repeats: int, seconds) -> dict[str, float]:
    """Median seconds per call of each of ``functions``, taking turns each round after
    :data:`WARMUP_CALLS` untimed calls each."""
    for function in functions.values():
        for _ in range(WARMUP_CALLS):
            function()
    samples = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            samples[name].append(seconds(function))
    return {name: statistics.median(values) for name, values in samples.items()}


def copy_bandwidth(torch, device: str, nbytes: int, repeats: int, seconds) -> float:
    """Bytes per second (read + written) of the fastest of ``repeats`` device copies."""
    source = torch.ones(nbytes // 4, device=device)
    target = torch.empty_like(source)
    for _ in range(WARMUP_CALLS):
        target.copy_(source)
    fastest = min(seconds(lambda: target.copy_(source)) for _ in range(max(repeats, 5)))
    return 2 * source.numel() * source.element_size() / fastest


def layout_input(x, layout: str, torch):
    """``x`` stored as ``layout`` says: NCHW, or channels-last (C fastest; 1-d tensors,
    which have no such memory format, as the transposed view)."""
    if layout == "NCHW":
        return x.contiguous()
    if x.dim() == 3:
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    return x.contiguous(memory_format=fmt)


def _same_bits(a, b, torch) -> bool:
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return bool(torch.equal(a.contiguous().view(width), b.contiguous().view(width)))


def _agree(result, reference, torch) -> bool:
    try:
        # bfloat16: a float32 sum rounded once against PyTorch's rounding
        torch.testing.assert_close(result.float().cpu(), reference.float().cpu(), rtol=1e-2,
                                   atol=1e-2, equal_nan=True)
    except AssertionError:
        return False
    return True


def _check_agree(passes: dict, what: str, torch, cpu_passes) -> dict[str, list[str]]:
    """Each implementation's result of each pass against eager PyTorch's. Where they
    differ, each is checked against ``cpu_passes()`` (eager PyTorch in float64 on the
    CPU, NCHW): a wrong poolgrad raises an AssertionError; a wrong baseline (torch
    2.11's CUDA avg_pool2d backward of a padded channels-last input, pytorch#188344)
    is returned, ``{implementation: [passes]}``, for its rows to say so."""
    wrong, cpu = {}, None
    for pass_name in PASSES:
        reference = passes["eager"][pass_name]()
        results = {name: implementation[pass_name]()
                   for name, implementation in passes.items()}
        if all(_agree(result, reference, torch) for result in results.values()):
            continue
        cpu = cpu or cpu_passes()
        truth = cpu[pass_name]()
        for name, result in results.items():
            if _agree(result, truth, torch):
                continue
            if name == "poolgrad":
                raise AssertionError(f"poolgrad and eager PyTorch disagree on {what}, "
                                     f"{pass_name}, and poolgrad is not PyTorch's float64 "
                                     f"result on the CPU either")
            wrong.setdefault(name, []).append(pass_name)
    return wrong


def _cpu_passes(layer, x, torch) -> dict:
    """The passes of eager PyTorch on the CPU in float64, x stored NCHW: the judge where
    the device's implementations disagree."""
    return suite.torch_passes(torch_api.functional_call(layer, torch.nn.functional),
                              x.detach().cpu().double().contiguous(), torch)


def _bytes(layer, pass_name: str, x, y) -> int:
    """What the pass must read and write, in bytes
    (:func:`poolgrad.bench.suite.must_move`)."""
    def sized(t):
        return types.SimpleNamespace(nbytes=t.numel() * t.element_size(), size=t.numel())
    return sum(suite.must_move(layer, pass_name, sized(x), sized(y)))


def _time_layer(layer, front_end, torch, device, repeats, compile_variants, bandwidth,
                seconds, progress) -> list[dict]:
    rows = []
    generator = torch.Generator(device=device).manual_seed(0)
    base = torch.randn(layer.shape, generator=generator, device=device)
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        for layout in suite.LAYOUTS:
            x = layout_input(base.to(dtype), layout, torch)
            calls = {"poolgrad": torch_api.functional_call(layer, front_end),
                     "eager": torch_api.functional_call(layer, torch.nn.functional)}
            compile_start = time.perf_counter()
            if (layout, dtype_name) in compile_variants:
                calls["compiled"] = suite.compile_static(
                    torch_api.functional_call(layer, torch.nn.functional), torch)
            with suite.quiet_compile():
                passes = {name: suite.torch_passes(call, x, torch)
                          for name, call in calls.items()}
                wrong = _check_agree(passes, f"{layer.name} {layout} {dtype_name}", torch,
                                     lambda x=x: _cpu_passes(layer, x, torch))
            compile_s = (time.perf_counter() - compile_start) if "compiled" in calls else None
            with torch.no_grad():
                y = calls["eager"](x)
            for pass_name in PASSES:
                if progress:
                    progress(f"{layer.name} {layout} {dtype_name} {pass_name}")
                timed = median_seconds({name: p[pass_name] for name, p in passes.items()},
                                       repeats, seconds)
                row = {"layer": layer.name, "shape": list(layer.shape), "layout": layout,
                       "dtype": dtype_name, "pass": pass_name, "compile_s": compile_s}
                for name, column in IMPLEMENTATIONS.items():
                    row[column] = timed[name] * 1e3 if name in timed else None
                    if pass_name in wrong.get(name, ()):  # its time, kept out of the ratios
                        row[f"{name}_wrong_result_ms"], row[column] = row[column], None
                row["wrong_results"] = sorted(name for name, bad in wrong.items()
                                              if pass_name in bad)
                row["roofline_ms"] = _bytes(layer, pass_name, x, y) / bandwidth * 1e3
                row["roofline_fraction"] = row["roofline_ms"] / row["poolgrad_ms"]
                for name in ("eager", "compiled"):
                    theirs = row[IMPLEMENTATIONS[name]]
                    row[f"speedup_vs_{name}"] = (theirs / row["poolgrad_ms"]
                                                 if theirs is not None else None)
                if pass_name == "backward":
                    for name in ("poolgrad", "eager"):
                        first, second = passes[name]["backward"](), passes[name]["backward"]()
                        row[f"{name}_deterministic"] = _same_bits(first, second, torch)
                rows.append(row)
    return rows


def summarize(rows: list[dict]) -> dict:
    """The figures issue 19 sets targets for."""
    def geomean(pass_name, column, max_only=False):
        return suite.geometric_mean(
            r[column] for r in rows
            if r["pass"] == pass_name and r[column] is not None
            and (not max_only or suite.is_max(r["layer"]) or r["layer"] == LARGE.name))
    bf16_ratio = {}
    for row in rows:
        if row["dtype"] == "bfloat16":
            twin = next(r for r in rows if r["dtype"] == "float32" and r["layer"] == row["layer"]
                        and r["layout"] == row["layout"] and r["pass"] == row["pass"])
            bf16_ratio[f"{row['layer']} {row['layout']} {row['pass']}"] = (
                twin["poolgrad_ms"] / row["poolgrad_ms"])
    return {
        "forward_geomean_speedup_vs_eager": geomean("forward", "speedup_vs_eager"),
        "forward_backward_geomean_speedup_vs_eager":
            geomean("forward+backward", "speedup_vs_eager"),
        "max_forward_geomean_speedup_vs_eager": geomean("forward", "speedup_vs_eager", True),
        "forward_geomean_speedup_vs_compiled": geomean("forward", "speedup_vs_compiled"),
        "rows_slower_than_best_torch": [
            f"{r['layer']} {r['layout']} {r['dtype']} {r['pass']} ({r['speedup_vs_best']:.2f}x)"
            for r in rows if r.get("speedup_vs_best", 1) < 1],
        "wrong_pytorch_results": [
            f"{r['layer']} {r['layout']} {r['dtype']} {r['pass']}: {', '.join(r['wrong_results'])}"
            for r in rows if r.get("wrong_results")],
        "large_layer_forward_roofline": {
            f"{r['layout']} {r['dtype']}": r["roofline_fraction"] for r in rows
            if r["layer"] == LARGE.name and r["pass"] == "forward"},
        "bfloat16_speedup_over_float32": bf16_ratio,
        "nondeterministic_backwards": {
            name: [f"{r['layer']} {r['layout']} {r['dtype']}" for r in rows
                   if r["pass"] == "backward" and not r[f"{name}_deterministic"]]
            for name in ("poolgrad", "eager")},
    }


def machine_info(torch, device: str, bandwidth: float) -> dict:
    info = {"device": device, "copy_bandwidth_GBps": bandwidth / 1e9,
            "torch": torch.__version__}
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        info.update(gpu=properties.name, capability=f"{properties.major}.{properties.minor}",
                    memory_GiB=round(properties.total_memory / 2**30, 1),
                    cuda=torch.version.cuda)
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def run(quick: bool = False, repeats: int | None = None, threads: int | None = None,
        device: str = "cuda", layers: tuple[suite.Layer, ...] = LAYERS,
        progress=None) -> dict:
    """Time the layers on ``device``; returns the JSON-ready result. ``quick``: tiny
    shapes, one round, and one compiled variant (to run the path). ``threads`` is
    accepted for the CLI's sake and unused: the work is on the device."""
    torch = _import_torch(device)
    front_end = torch_api.import_front_end()
    repeats = repeats or (1 if quick else 50)
    timed_layers = tuple(layer.quick() if quick else layer for layer in layers)
    every_variant = {(layout, dtype) for layout in suite.LAYOUTS for dtype in DTYPES}
    seconds = _timer(torch, device)
    bandwidth = copy_bandwidth(torch, device, 2**20 if quick else COPY_BYTES, repeats, seconds)
    rows = []
    for index, layer in enumerate(timed_layers):
        variants = every_variant if not quick else (
            {("NCHW", "float32")} if index == 0 else set())
        rows += _time_layer(layer, front_end, torch, device, repeats, variants, bandwidth,
                            seconds, progress)
    # the best PyTorch time of each layer, dtype and pass: eager or compiled, either layout
    suite.best_pytorch(rows, ("layer", "dtype", "pass"), ("eager_ms", "compiled_ms"))
    return {"machine": machine_info(torch, device, bandwidth), "mode": "cuda", "quick": quick,
            "repeats": repeats, "layers": [asdict(layer) for layer in layers], "rows": rows,
            "summary": summarize(rows)}


def _cell(value, width: int, suffix: str = "", digits: int = 3) -> str:
    if value is None:
        return f"{'-':>{width}}"
    return f"{value:{width - len(suffix)}.{digits}f}{suffix}"


def format_table(result: dict) -> str:
    machine = result["machine"]
    where = machine.get("gpu", machine["device"])
    lines = [f"poolgrad bench --device cuda: {where}, copy roofline "
             f"{machine['copy_bandwidth_GBps']:.1f} GB/s (read + written), torch "
             f"{machine['torch']}, triton {machine['triton']}, median of {result['repeats']}"
             + (" (quick mode: tiny shapes, see the note below)" if result["quick"] else ""),
             "",
             f"{'layer':<20} {'layout':<13} {'dtype':<8} {'pass':<16} {'poolgrad ms':>11} "
             f"{'eager ms':>9} {'compiled ms':>11} {'vs eager':>8} {'vs best':>8} "
             f"{'roofline':>8} {'same bits':>9}"]
    for row in result["rows"]:
        same = {True: "yes", False: "NO"}.get(row.get("poolgrad_deterministic"), "")
        lines.append(
            f"{row['layer']:<20} {row['layout']:<13} {row['dtype']:<8} {row['pass']:<16} "
            f"{row['poolgrad_ms']:11.3f} {_cell(row['eager_ms'], 9)} "
            f"{_cell(row['compiled_ms'], 11)} {_cell(row['speedup_vs_eager'], 8, 'x', 2)} "
            f"{_cell(row.get('speedup_vs_best'), 8, 'x', 2)} {row['roofline_fraction']:8.0%} "
            f"{same:>9}" + "".join(f"  {name} WRONG" for name in row.get("wrong_results", ())))
    lines.append("vs eager: eager PyTorch's time over poolgrad's, same layout and dtype; vs "
                 "best: the best PyTorch time\n(eager or compiled, either layout) over "
                 "poolgrad's; roofline: the pass's bytes at the copy bandwidth over\n"
                 "poolgrad's time; same bits: two backward runs gave identical gradients")
    if result["quick"]:
        return "\n".join(lines + ["", suite.QUICK_NOTE])
    summary = result["summary"]
    for key, label in [("forward_geomean_speedup_vs_eager", "forward, all rows"),
                       ("max_forward_geomean_speedup_vs_eager", "forward, max layers"),
                       ("forward_backward_geomean_speedup_vs_eager",
                        "forward+backward, all rows")]:
        if summary[key] is not None:
            lines.append(f"geometric-mean speedup over eager PyTorch, {label}: "
                         f"{summary[key]:.2f}x")
    lines.append(f"rows slower than the best PyTorch: "
                 f"{len(summary['rows_slower_than_best_torch'])} of {len(result['rows'])}"
                 + "".join(f"\n  {name}" for name in summary["rows_slower_than_best_torch"]))
    for variant, share in summary["large_layer_forward_roofline"].items():
        lines.append(f"large layer forward, {variant}: {share:.0%} of the copy roofline")
    wrong = summary["wrong_pytorch_results"]
    lines.append(f"PyTorch baselines whose result was wrong (timed, left out of the ratios; "
                 f"PyTorch's float64 CPU result judged): {len(wrong)}"
                 + "".join(f"\n  {row}" for row in wrong))
    for name, rows in summary["nondeterministic_backwards"].items():
        lines.append(f"backwards with different bits on two runs, {name}: {len(rows)}"
                     + "".join(f"\n  {row}" for row in rows))
    return "\n".join(lines)
