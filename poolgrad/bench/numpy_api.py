"""The speed suite: poolgrad against PyTorch, side by side in one process.

Every row times one layer from a real network, one memory layout and one pass
(forward, backward, forward+backward) for both libraries at the same thread count,
and reports medians, the poolgrad/PyTorch time ratios, and the fraction of the memory
roofline: the least time to move the pass's bytes (read x and write y; read dy and the
saved state and write dx), from probes timed beside it (:mod:`poolgrad.roofline`).

``poolgrad bench`` runs it; ``--quick`` uses tiny shapes and one repetition, so the
test suite can run it too. Speed is never asserted by the tests.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import time
import warnings
import zlib
from dataclasses import asdict, dataclass

import numpy as np

from .. import ops
from ..tools.files import write_atomically
from .roofline import Roofline


@dataclass(frozen=True)
class Layer:
    name: str
    kind: str  # "max", "avg" or "global_avg"
    shape: tuple[int, ...]  # (N, C, *spatial)
    kernel: int = 1
    stride: int = 1
    padding: int = 0

    @property
    def ndim(self) -> int:
        return len(self.shape) - 2

    def quick(self) -> Layer:
        """The same layer on a tiny input (for the test suite)."""
        spatial = tuple(max(self.kernel + 3, s // 16) for s in self.shape[2:])
        return Layer(self.name, self.kind, (2, 3) + spatial, self.kernel, self.stride,
                     self.padding)


SUITE = (
    Layer("AlexNet 3x3/2", "max", (32, 96, 55, 55), 3, 2),
    Layer("VGG 2x2/2", "max", (32, 64, 112, 112), 2, 2),
    Layer("VGG 2x2/2 deep", "max", (64, 512, 14, 14), 2, 2),
    Layer("ResNet stem 3x3/2 p1", "max", (32, 64, 112, 112), 3, 2, 1),
    Layer("1D k4/4", "max", (64, 64, 4096), 4, 4),
    Layer("3D 2x2x2/2", "max", (8, 32, 32, 64, 64), 2, 2),
    Layer("global avg", "global_avg", (64, 2048, 7, 7)),
    Layer("VGG avg 2x2/2", "avg", (32, 64, 112, 112), 2, 2),
    Layer("ResNet avg 3x3/2 p1", "avg", (32, 64, 112, 112), 3, 2, 1),
)

LAYOUTS = ("NCHW", "channels-last")

QUICK_NOTE = (
    "quick mode only checks that the suite runs: its tiny shapes take microseconds, so\n"
    "these times measure the fixed cost of a call (argument checks, dispatch, allocating\n"
    "the output), not pooling speed, and the speedup column is no speed comparison.\n"
    "Run `poolgrad bench` without --quick for that.")
PASSES = ("forward", "backward", "forward+backward")


def channels_last(x: np.ndarray) -> np.ndarray:
    """The same logical (N, C, *spatial) array stored with C fastest (PyTorch's
    channels_last memory format): a transposed view of an (N, *spatial, C) array."""
    order = (0,) + tuple(range(2, x.ndim)) + (1,)
    stored = np.ascontiguousarray(x.transpose(order))
    return stored.transpose((0, x.ndim - 1) + tuple(range(1, x.ndim - 1)))


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


# how long each function runs untimed before each of its timed calls (see timed_samples)
SETTLE_SECONDS = 0.02


def timed_samples(functions: dict, repeats: int, calls: int = 1,
                  settle: bool = True) -> dict[str, list[float]]:
    """Seconds per call of each of ``functions`` (name: function of no arguments), one
    sample per round. Each is called once to warm up (compilation, caches, page faults
    of the first allocation), then ``repeats`` rounds run each function ``calls`` times
    in turn, so that a slow spell of a shared machine falls on all of them alike.

    With ``settle``, each function runs untimed for :data:`SETTLE_SECONDS` (at least
    once) before its timed calls: the cost of switching from another function (caches
    holding its data, another library's threads) is then not charged to it. One untimed
    call was not enough here: after 10 ms or more of other work, or of sleep, the next
    three or four calls of AlexNet's NCHW forward took 2.2-2.5 ms against 1.4 ms, and
    the bench charged that to whichever implementation was timed."""
    for function in functions.values():
        function()
    settle = settle and len(functions) > 1
    samples = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            if settle:
                start = time.perf_counter()
                function()
                while time.perf_counter() - start < SETTLE_SECONDS:
                    function()
            start = time.perf_counter()
            for _ in range(calls):
                function()
            samples[name].append((time.perf_counter() - start) / calls)
    return samples


def median_seconds(functions: dict, repeats: int, calls: int = 1,
                   settle: bool = True) -> dict[str, float]:
    """Median seconds per call of each of ``functions``, timed by
    :func:`timed_samples`."""
    return {name: statistics.median(times)
            for name, times in timed_samples(functions, repeats, calls, settle).items()}


def _median_seconds(fn, repeats: int) -> float:
    return median_seconds({"fn": fn}, repeats)["fn"]


def copy_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes per second of a large NumPy copy (read + write), in this process: recorded
    with the machine, as earlier tables were; the roofline is :mod:`poolgrad.roofline`."""
    source = np.ones(nbytes // 8)
    target = np.empty_like(source)
    seconds = _median_seconds(lambda: np.copyto(target, source), repeats)
    return 2 * source.nbytes / seconds


def must_move(layer: Layer, pass_name: str, x: np.ndarray, y: np.ndarray) -> tuple[int, int]:
    """(bytes read, bytes written) that a pass cannot avoid: forward, read x and write
    y; backward, read dy and the saved state (one byte per output for max pooling) and
    write dx; forward+backward, both, with the state written once and read once."""
    state = y.size if layer.kind == "max" else 0
    return {"forward": (x.nbytes, y.nbytes),
            "backward": (y.nbytes + state, x.nbytes),
            "forward+backward": (x.nbytes + y.nbytes + state,
                                 y.nbytes + state + x.nbytes)}[pass_name]


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


def torch_input(x: np.ndarray, layout: str, torch):
    """``x`` (NCHW, or its :func:`channels_last` view) as a tensor in PyTorch's format
    for ``layout``, on ``x``'s own memory wherever its strides are already that format.

    Every implementation then reads the same bytes: when PyTorch's eager and compiled
    passes shared a copy of their own, each warmed the caches for the other, and
    poolgrad, reading ``x``, measured up to 1.3x slower beside them than alone
    (VGG deep, channels-last forward: 0.81 ms on separate memory, 0.61 ms on shared)."""
    xt = torch.from_numpy(x)
    ndim = x.ndim - 2
    if layout == "channels-last":
        fmt = torch.channels_last if ndim == 2 else (
            torch.channels_last_3d if ndim == 3 else None)
        # 1-d tensors have no channels-last format; time the transposed view as stored
        if fmt is not None and not xt.is_contiguous(memory_format=fmt):
            xt = xt.contiguous(memory_format=fmt)
    elif not xt.is_contiguous():
        xt = xt.contiguous()
    return xt


def _torch_passes(fn, xt, torch) -> dict:
    """The three passes of PyTorch's ``fn`` (eager or compiled) on the tensor ``xt``."""
    leaf = xt.detach().requires_grad_()
    y = fn(leaf)
    dy = torch.ones_like(y)

    def forward():
        with torch.no_grad():
            return fn(xt)

    def both():
        fresh = xt.detach().requires_grad_()  # no gradient accumulates
        return torch.autograd.grad(fn(fresh), fresh, dy)[0]

    return {"forward": forward,
            "backward": lambda: torch.autograd.grad(y, leaf, dy, retain_graph=True)[0],
            "forward+backward": both}


def _compiled_passes(layer: Layer, xt, torch):
    """The passes of ``torch.compile`` of PyTorch's call (Inductor, static shapes, one
    graph), each called once to compile it; returns them and the seconds compiling
    took."""
    # Dynamo keeps compiled graphs per code object, and every layer's wrapper shares
    # one: without a reset, later layers would reach its recompile limit and run eager
    torch._dynamo.reset()
    compiled = torch.compile(_torch_call(layer, torch), dynamic=False, fullgraph=True)
    start = time.perf_counter()
    with warnings.catch_warnings():
        # Inductor's first compile imports torch.utils.mkldnn, which warns about itself
        warnings.filterwarnings("ignore", "`torch.jit.script_method` is deprecated",
                                DeprecationWarning)
        passes = _torch_passes(compiled, xt, torch)
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


def machine_info(threads: int, bandwidth: float) -> dict:
    """The CPU, threads, copy bandwidth and library versions, for the JSON."""
    cpu = platform.processor() or platform.machine()
    # the compiler vectorizes per CPU, so a table is only comparable with the same
    # CPU generation: record family, model and the widest vector instructions
    fields = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    cpu = fields.get("model name", cpu)
    flags = set(fields.get("flags", "").split())
    simd = next((name for name in ("avx512f", "avx2", "avx", "sse4_2", "neon", "asimd")
                 if name in flags), None)
    import numba
    return {"cpu": cpu, "cpu_family": fields.get("cpu family"), "cpu_model": fields.get("model"),
            "simd": simd, "cores": os.cpu_count(), "threads": threads,
            "copy_bandwidth_GBps": round(bandwidth / 1e9, 2), "python": platform.python_version(),
            "numpy": np.__version__, "numba": numba.__version__}


@contextlib.contextmanager
def thread_count(threads: int | None, torch=None):
    """Run Numba's kernels (and PyTorch's, when given) on ``threads`` threads (default:
    Numba's, all cores), restoring both after; yields the count."""
    import numba
    threads = threads or numba.config.NUMBA_NUM_THREADS
    previous = numba.get_num_threads()
    previous_torch = torch.get_num_threads() if torch is not None else None
    numba.set_num_threads(threads)
    if torch is not None:
        torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        numba.set_num_threads(previous)
        if torch is not None:
            torch.set_num_threads(previous_torch)


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
            results["eager"] = _torch_passes(_torch_call(layer, torch), xt, torch)
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


def _best_pytorch(rows: list[dict], same=("layer", "pass"),
                  columns=("torch_ms", "compiled_ms")) -> None:
    """Adds to each row the best PyTorch time for its layer and pass (the row fields
    ``same``), the fastest of eager and compiled (``columns``) in either layout, and
    poolgrad's speed relative to it."""
    best = {}
    for row in rows:
        key = tuple(row[field] for field in same)
        for column in columns:
            if row.get(column) is not None:
                best[key] = min(best.get(key, math.inf), row[column])
    for row in rows:
        key = tuple(row[field] for field in same)
        if key in best:
            row["best_torch_ms"] = best[key]
            row["speedup_vs_best"] = best[key] / row["poolgrad_ms"]


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
        _best_pytorch(rows)
        probe = max(row["write_bytes"] for row in rows)
        bandwidths = roofline.bandwidths(probe)
    machine = machine_info(threads, bandwidth)
    machine["roofline"] = bandwidths
    if torch is not None:
        machine["torch"] = torch.__version__
    return {"machine": machine, "quick": quick, "repeats": repeats,
            "layers": [asdict(layer) for layer in layers], "rows": rows,
            "summary": summarize(rows)}


def geometric_mean(values) -> float | None:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(rows: list[dict], ours: str = "poolgrad_ms", theirs: str = "torch_ms") -> dict:
    """Geometric-mean speedups (``theirs`` time over ``ours``) in NCHW for the max-pool
    rows, and the rows where ``ours`` is slower than ``theirs`` in its faster layout for
    the same layer and pass. Rows without a ``theirs`` time are left out. On the NumPy
    suite's rows it also compares with compiled PyTorch, with the best PyTorch time
    (:func:`_best_pytorch`) and with the roofline."""
    timed = [r for r in rows if r.get(theirs) is not None]

    def speedups(pass_name, column=theirs):
        return [r[column] / r[ours] for r in rows if r.get(column) is not None
                and r["layout"] == "NCHW" and r["pass"] == pass_name and _is_max(r["layer"])]

    # the baseline's faster layout for each (layer, pass)
    fastest = {}
    for r in timed:
        key = (r["layer"], r["pass"])
        fastest[key] = min(fastest.get(key, math.inf), r[theirs])
    slower = [f"{r['layer']} {r['layout']} {r['pass']}" for r in timed
              if r[ours] > fastest[(r["layer"], r["pass"])]]
    summary = {"max_forward_geomean_speedup_nchw": geometric_mean(speedups("forward")),
               "max_forward_backward_geomean_speedup_nchw":
                   geometric_mean(speedups("forward+backward")),
               "rows_slower_than_torch_fastest_layout": slower if fastest else None}
    if any("roofline_fraction" in r for r in rows):
        summary.update({
            "max_forward_geomean_speedup_vs_compiled_nchw":
                geometric_mean(speedups("forward", "compiled_ms")),
            "max_forward_backward_geomean_speedup_vs_compiled_nchw":
                geometric_mean(speedups("forward+backward", "compiled_ms")),
            "rows_slower_than_best_torch": [
                f"{r['layer']} {r['layout']} {r['pass']}" for r in rows
                if r.get("best_torch_ms") is not None and r[ours] > r["best_torch_ms"]],
            "rows_below_roofline_target": [
                f"{r['layer']} {r['layout']} {r['pass']} ({r['roofline_fraction']:.0%})"
                for r in rows if r["roofline_fraction"] < ROOFLINE_TARGET[r["pass"]]]})
    return summary


# the share of the roofline each pass should reach (issue 18's targets)
ROOFLINE_TARGET = {"forward": 0.8, "backward": 0.5, "forward+backward": 0.5}


def _is_max(name: str) -> bool:
    return any(layer.name == name and layer.kind == "max" for layer in SUITE)


def header(result: dict, command: str = "poolgrad bench") -> str:
    """The first line of a table: the machine, threads, bandwidth and repeats."""
    machine = result["machine"]
    roofline = machine.get("roofline")
    bandwidth = (f"read {roofline['read_GBps']} GB/s, write {roofline['write_GBps']} "
                 f"GB/s, fresh write {roofline['fresh_write_GBps']} GB/s at "
                 f"{roofline['bytes'] / 2**20:.0f} MiB"
                 if roofline else f"NumPy copy {machine['copy_bandwidth_GBps']} GB/s")
    return (f"{command}: {machine['cpu']} (family {machine.get('cpu_family')} model "
            f"{machine.get('cpu_model')}, {machine.get('simd')}), {machine['threads']} "
            f"threads, {bandwidth}, float32, median of {result['repeats']}"
            + (" (quick mode: tiny shapes, see the note below)" if result["quick"] else ""))


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
                 "roofline: the least time the\npass can take (poolgrad/roofline.py) over "
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


def write_json(result: dict, path: str) -> None:
    """Write atomically: a crash never leaves a half-written file."""
    write_atomically(path, lambda stream: stream.write(json.dumps(result, indent=2).encode()))
