"""The speed suite: poolgrad against PyTorch, side by side in one process.

Every row times one layer from a real network, one memory layout and one pass
(forward, backward, forward+backward) for both libraries at the same thread count,
and reports medians, the poolgrad/PyTorch time ratios, and the fraction of the memory
roofline: the least time to move the pass's bytes (read x and write y; read dy and the
saved state and write dx), from probes timed beside it (:mod:`poolgrad.bench.roofline`).

``poolgrad bench`` runs it; ``--quick`` uses tiny shapes and one repetition, so the
test suite can run it too. Speed is never asserted by the tests.
"""

from __future__ import annotations

import statistics
import time
import zlib
from dataclasses import asdict

import numpy as np

from .. import ops
from .roofline import Roofline
from .suite import (
    LAYOUTS,
    PASSES,
    QUICK_NOTE,
    SUITE,
    Layer,
    best_pytorch,
    channels_last,
    compile_static,
    copy_bandwidth,
    header,
    machine_info,
    must_move,
    quiet_compile,
    summarize,
    torch_input,
    torch_passes,
)
from .timing import thread_count, timed_samples


def _poolgrad_call(layer: Layer):
    if layer.kind == "global_avg":
        return ops.global_avg_pool, (), {}
    op = ops.max_pool if layer.kind == "max" else ops.avg_pool
    return op, (layer.kernel, layer.stride, layer.padding), {}


def _torch_call(layer: Layer, torch):
    functional = torch.nn.functional
    if layer.kind == "global_avg":
        dims = tuple(range(2, 2 + layer.ndim))
        return lambda t: t.mean(dim=dims, keepdim=True)
    fn = getattr(functional, f"{layer.kind}_pool{layer.ndim}d")
    return lambda t: fn(t, layer.kernel, layer.stride, layer.padding)


def _poolgrad_passes(layer: Layer, x: np.ndarray) -> dict:
    """poolgrad's three passes on ``x``: functions of no arguments."""
    op, args, kwargs = _poolgrad_call(layer)
    y, pullback = ops.vjp(op, x, *args, **kwargs)
    dy = np.ones_like(y)

    def both():
        _, pb = ops.vjp(op, x, *args, **kwargs)
        return pb(dy)

    return {"forward": lambda: op(x, *args, **kwargs), "backward": lambda: pullback(dy),
            "forward+backward": both}


def _compiled_passes(layer: Layer, xt, torch):
    """The passes of ``torch.compile`` of PyTorch's call (Inductor, static shapes, one
    graph), each called once to compile it; returns them and the seconds compiling
    took."""
    compiled = compile_static(_torch_call(layer, torch), torch)
    start = time.perf_counter()
    with quiet_compile():
        passes = torch_passes(compiled, xt, torch)
        for function in passes.values():
            function()
    return passes, time.perf_counter() - start


def _check_agree(results: dict, what: str) -> None:
    """A benchmark of a wrong result measures nothing: every implementation's output of
    every pass must match eager PyTorch's before anything is timed."""
    for pass_name in PASSES:
        reference = np.asarray(results["eager"][pass_name]())
        for name, passes in results.items():
            try:
                np.testing.assert_allclose(np.asarray(passes[pass_name]()), reference,
                                           rtol=1e-5, atol=1e-6)
            except AssertionError as error:
                raise AssertionError(f"{name} and eager PyTorch disagree on {what}, "
                                     f"{pass_name}: {error}") from None


def _time_layer(layer: Layer, base: np.ndarray, torch, repeats: int, compile_layouts,
                roofline, progress) -> list[dict]:
    """The rows of one layer: both layouts, three passes, every implementation timed in
    turn with the roofline's probes (:func:`timed_samples`). PyTorch's tensors share
    ``base``'s memory (:func:`torch_input`), so the layer ends by checking that no
    implementation wrote into it."""
    rows = []
    checksum = zlib.crc32(base)
    for layout in LAYOUTS:
        if progress:
            progress(f"{layer.name} {layout}")
        x = base if layout == "NCHW" else channels_last(base)
        op, args, kwargs = _poolgrad_call(layer)
        y = op(x, *args, **kwargs)  # its size, for the bytes each pass moves
        results = {"poolgrad": _poolgrad_passes(layer, x)}
        compile_seconds = None
        if torch is not None:
            xt = torch_input(x, layout, torch)
            results["eager"] = torch_passes(_torch_call(layer, torch), xt, torch)
            if layout in compile_layouts:
                results["compiled"], compile_seconds = _compiled_passes(layer, xt, torch)
            _check_agree(results, f"{layer.name} {layout}")
        for pass_name in PASSES:
            read, written = must_move(layer, pass_name, x, y)
            # the roofline's probes are timed in the same rounds as the pass, so that a
            # slow spell of a shared machine does not lower the bound
            probes = roofline.probes(read, written)
            samples = timed_samples({**{name: passes[pass_name]
                                        for name, passes in results.items()}, **probes},
                                    repeats)
            seconds = {name: statistics.median(samples[name]) for name in results}
            bound = roofline.bound({name: samples[name] for name in probes})
            # free the probes' buffers before the next pass allocates its own
            del probes, samples
            row = {"layer": layer.name, "shape": list(layer.shape), "layout": layout,
                   "pass": pass_name, "poolgrad_ms": seconds["poolgrad"] * 1e3,
                   "read_bytes": read, "write_bytes": written, "roofline_ms": bound * 1e3,
                   "roofline_fraction": bound / seconds["poolgrad"]}
            if "eager" in seconds:
                row["torch_ms"] = seconds["eager"] * 1e3
                row["speedup"] = seconds["eager"] / seconds["poolgrad"]
                row["compiled_ms"] = None
                row["compile_s"] = compile_seconds
                if "compiled" in seconds:
                    row["compiled_ms"] = seconds["compiled"] * 1e3
                    row["speedup_vs_compiled"] = seconds["compiled"] / seconds["poolgrad"]
            rows.append(row)
    if zlib.crc32(base) != checksum:
        raise AssertionError(f"an implementation wrote into the input of {layer.name}")
    return rows


def run(quick: bool = False, repeats: int | None = None, threads: int | None = None,
        layers: tuple[Layer, ...] = SUITE, progress=None) -> dict:
    """Time the suite; returns ``{"machine": ..., "rows": [...], ...}``."""
    try:
        import torch
    except ImportError:
        torch = None
    repeats = repeats or (1 if quick else 5)
    timed_layers = tuple(layer.quick() if quick else layer for layer in layers)
    # compiling takes seconds a variant: quick mode compiles only the first layer in
    # NCHW, so that the path runs
    compiled = {layer.name: LAYOUTS if not quick else ("NCHW",) if index == 0 else ()
                for index, layer in enumerate(timed_layers)}
    with thread_count(threads, torch) as threads:
        bandwidth = copy_bandwidth(2**20 if quick else 256 * 2**20, repeats)
        roofline = Roofline(repeats=3 if quick else 7)
        rows = []
        rng = np.random.default_rng(0)
        for layer in timed_layers:
            base = rng.standard_normal(layer.shape, dtype=np.float32)
            rows += _time_layer(layer, base, torch, repeats, compiled[layer.name],
                                roofline, progress)
        best_pytorch(rows)
        probe = max(row["write_bytes"] for row in rows)
        bandwidths = roofline.bandwidths(probe)
    machine = machine_info(threads, bandwidth)
    machine["roofline"] = bandwidths
    if torch is not None:
        machine["torch"] = torch.__version__
    return {"machine": machine, "quick": quick, "repeats": repeats,
            "layers": [asdict(layer) for layer in layers], "rows": rows,
            "summary": summarize(rows)}


def _cell(value, width: int, suffix: str = "") -> str:
    if value is None:
        return f"{'-':>{width}}"
    return f"{value:{width - len(suffix)}.2f}{suffix}"


def format_table(result: dict) -> str:
    lines = [
        header(result),
        "",
        f"{'layer':<22} {'layout':<14} {'pass':<17} {'poolgrad ms':>11} {'eager ms':>9} "
        f"{'compiled ms':>11} {'vs eager':>9} {'vs best':>8} {'roofline':>9}",
    ]
    for row in result["rows"]:
        lines.append(
            f"{row['layer']:<22} {row['layout']:<14} {row['pass']:<17} "
            f"{row['poolgrad_ms']:11.2f} {_cell(row.get('torch_ms'), 9)} "
            f"{_cell(row.get('compiled_ms'), 11)} {_cell(row.get('speedup'), 9, 'x')} "
            f"{_cell(row.get('speedup_vs_best'), 8, 'x')} {row['roofline_fraction']:8.0%}")
    lines.append("vs eager: eager PyTorch's time over poolgrad's, same layout; vs best: the "
                 "best PyTorch time\n(eager or compiled, either layout) over poolgrad's; "
                 "roofline: the least time the\npass can take (poolgrad/bench/roofline.py) over "
                 "poolgrad's")
    if result["quick"]:  # no speed verdict from shapes this small
        return "\n".join(lines + ["", QUICK_NOTE])
    summary = result["summary"]
    for key, label in [("max_forward_geomean_speedup_nchw", "max forward, NCHW"),
                       ("max_forward_backward_geomean_speedup_nchw",
                        "max forward+backward, NCHW")]:
        if summary.get(key):
            lines.append(f"geometric-mean speedup over PyTorch, {label}: {summary[key]:.2f}x")
    for key, label in [("max_forward_geomean_speedup_vs_compiled_nchw", "max forward, NCHW"),
                       ("max_forward_backward_geomean_speedup_vs_compiled_nchw",
                        "max forward+backward, NCHW")]:
        if summary.get(key):
            lines.append(f"geometric-mean speedup over torch.compile, {label}: "
                         f"{summary[key]:.2f}x")
    slower = summary.get("rows_slower_than_torch_fastest_layout")
    if slower is not None:
        lines.append(f"rows slower than PyTorch's faster layout for the same layer and pass: "
                     f"{len(slower)} of {len(result['rows'])}"
                     + "".join(f"\n  {name}" for name in slower))
    for key, label in [("rows_slower_than_best_torch",
                        "rows slower than the best PyTorch time (eager or compiled, either "
                        "layout)"),
                       ("rows_below_roofline_target",
                        "rows below the roofline target (forward 80%, backward and "
                        "forward+backward 50%)")]:
        if summary.get(key) is not None:
            lines.append(f"{label}: {len(summary[key])} of {len(result['rows'])}"
                         + "".join(f"\n  {name}" for name in summary[key]))
    return "\n".join(lines)
