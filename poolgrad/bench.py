"""The speed suite: poolgrad against PyTorch, side by side in one process.

Every row times one layer from a real network, one memory layout and one pass
(forward, backward, forward+backward) for both libraries at the same thread count,
and reports medians, the poolgrad/PyTorch time ratio, and the fraction of the memory
roofline: the bytes that must move (read x and write y; read dy and the saved state
and write dx) divided by the bandwidth of a large NumPy copy measured in the same run.

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
from dataclasses import asdict, dataclass

import numpy as np

from . import ops
from ._files import write_atomically


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


def median_seconds(functions: dict, repeats: int, calls: int = 1,
                   settle: bool = True) -> dict[str, float]:
    """Median seconds per call of each of ``functions`` (name: function of no
    arguments). Each is called once to warm up (compilation, caches, page faults of the
    first allocation), then ``repeats`` rounds run each function ``calls`` times in turn,
    so that a slow spell of a shared machine falls on all of them alike.

    With ``settle``, each function's timed calls follow an untimed call of it: the
    cost of switching from another function (another library's threads still spinning
    for work, caches holding its data) is then not charged to it."""
    for function in functions.values():
        function()
    settle = settle and len(functions) > 1
    samples = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            if settle:
                function()
            start = time.perf_counter()
            for _ in range(calls):
                function()
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(times) for name, times in samples.items()}


def _median_seconds(fn, repeats: int) -> float:
    return median_seconds({"fn": fn}, repeats)["fn"]


def copy_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes per second of a large NumPy copy (read + write), in this process."""
    source = np.ones(nbytes // 8)
    target = np.empty_like(source)
    seconds = _median_seconds(lambda: np.copyto(target, source), repeats)
    return 2 * source.nbytes / seconds


def _must_move(layer: Layer, pass_name: str, x: np.ndarray, y: np.ndarray) -> int:
    """Bytes a pass cannot avoid moving: x and y forward; dy, the saved state (one byte
    per output for max pooling) and dx backward."""
    state = y.size if layer.kind == "max" else 0
    forward = x.nbytes + y.nbytes
    backward = y.nbytes + state + x.nbytes
    return {"forward": forward, "backward": backward,
            "forward+backward": forward + state + backward}[pass_name]


def _time_poolgrad(layer: Layer, x: np.ndarray, repeats: int) -> dict[str, float]:
    op, args, kwargs = _poolgrad_call(layer)
    y, pullback = ops.vjp(op, x, *args, **kwargs)
    dy = np.ones_like(y)

    def both():
        _, pb = ops.vjp(op, x, *args, **kwargs)
        pb(dy)

    return {
        "forward": _median_seconds(lambda: op(x, *args, **kwargs), repeats),
        "backward": _median_seconds(lambda: pullback(dy), repeats),
        "forward+backward": _median_seconds(both, repeats),
    }


def torch_input(x: np.ndarray, layout: str, torch):
    """``x`` (NCHW, or its :func:`channels_last` view) as a tensor in PyTorch's format
    for ``layout``."""
    xt = torch.from_numpy(np.ascontiguousarray(x))
    ndim = x.ndim - 2
    if layout == "channels-last":
        fmt = torch.channels_last if ndim == 2 else (
            torch.channels_last_3d if ndim == 3 else None)
        # 1-d tensors have no channels-last format; time the transposed view as stored
        xt = xt.contiguous(memory_format=fmt) if fmt else torch.from_numpy(x)
    return xt


def _time_torch(layer: Layer, x: np.ndarray, layout: str, repeats: int, torch):
    fn = _torch_call(layer, torch)
    xt = torch_input(x, layout, torch)
    with torch.no_grad():
        forward = _median_seconds(lambda: fn(xt), repeats)
    leaf = xt.detach().requires_grad_()
    y = fn(leaf)
    dy = torch.ones_like(y)
    backward = _median_seconds(lambda: torch.autograd.grad(y, leaf, dy, retain_graph=True),
                               repeats)

    def both():
        out = fn(leaf)
        torch.autograd.grad(out, leaf, dy)

    return {"forward": forward, "backward": backward,
            "forward+backward": _median_seconds(both, repeats)}


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


def run(quick: bool = False, repeats: int | None = None, threads: int | None = None,
        layers: tuple[Layer, ...] = SUITE, progress=None) -> dict:
    """Time the suite; returns ``{"machine": ..., "rows": [...]}``."""
    try:
        import torch
    except ImportError:
        torch = None
    repeats = repeats or (1 if quick else 5)
    with thread_count(threads, torch) as threads:
        bandwidth = copy_bandwidth(2**20 if quick else 256 * 2**20, repeats)
        rows = []
        rng = np.random.default_rng(0)
        for layer in layers:
            layer = layer.quick() if quick else layer
            base = rng.standard_normal(layer.shape, dtype=np.float32)
            for layout in LAYOUTS:
                x = base if layout == "NCHW" else channels_last(base)
                y = _poolgrad_call(layer)[0](x, *_poolgrad_call(layer)[1])
                if progress:
                    progress(f"{layer.name} {layout}")
                ours = _time_poolgrad(layer, x, repeats)
                theirs = _time_torch(layer, x, layout, repeats, torch) if torch else None
                for pass_name in PASSES:
                    seconds = ours[pass_name]
                    must = _must_move(layer, pass_name, x, y)
                    row = {"layer": layer.name, "shape": list(layer.shape), "layout": layout,
                           "pass": pass_name, "poolgrad_ms": seconds * 1e3,
                           "roofline_fraction": must / bandwidth / seconds}
                    if theirs:
                        row["torch_ms"] = theirs[pass_name] * 1e3
                        row["speedup"] = theirs[pass_name] / seconds
                    rows.append(row)
    machine = machine_info(threads, bandwidth)
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
    the same layer and pass. Rows without a ``theirs`` time are left out."""
    timed = [r for r in rows if r.get(theirs) is not None]

    def speedups(pass_name):
        return [r[theirs] / r[ours] for r in timed if r["layout"] == "NCHW"
                and r["pass"] == pass_name and _is_max(r["layer"])]

    # the baseline's faster layout for each (layer, pass)
    fastest = {}
    for r in timed:
        key = (r["layer"], r["pass"])
        fastest[key] = min(fastest.get(key, math.inf), r[theirs])
    slower = [f"{r['layer']} {r['layout']} {r['pass']}" for r in timed
              if r[ours] > fastest[(r["layer"], r["pass"])]]
    return {"max_forward_geomean_speedup_nchw": geometric_mean(speedups("forward")),
            "max_forward_backward_geomean_speedup_nchw":
                geometric_mean(speedups("forward+backward")),
            "rows_slower_than_torch_fastest_layout": slower if fastest else None}


def _is_max(name: str) -> bool:
    return any(layer.name == name and layer.kind == "max" for layer in SUITE)


def header(result: dict, command: str = "poolgrad bench") -> str:
    """The first line of a table: the machine, threads, bandwidth and repeats."""
    machine = result["machine"]
    return (f"{command}: {machine['cpu']} (family {machine.get('cpu_family')} model "
            f"{machine.get('cpu_model')}, {machine.get('simd')}), {machine['threads']} "
            f"threads, NumPy copy {machine['copy_bandwidth_GBps']} GB/s, float32, median of "
            f"{result['repeats']}"
            + (" (quick mode: tiny shapes, see the note below)" if result["quick"] else ""))


def format_table(result: dict) -> str:
    lines = [
        header(result),
        "",
        f"{'layer':<22} {'layout':<14} {'pass':<17} {'poolgrad ms':>11} {'torch ms':>9} "
        f"{'speedup':>8} {'roofline':>9}",
    ]
    for row in result["rows"]:
        torch_ms = f"{row['torch_ms']:9.2f}" if "torch_ms" in row else f"{'-':>9}"
        speedup = f"{row['speedup']:7.2f}x" if "speedup" in row else f"{'-':>8}"
        lines.append(
            f"{row['layer']:<22} {row['layout']:<14} {row['pass']:<17} "
            f"{row['poolgrad_ms']:11.2f} {torch_ms} {speedup} {row['roofline_fraction']:8.0%}")
    if result["quick"]:  # no speed verdict from shapes this small
        return "\n".join(lines + ["", QUICK_NOTE])
    summary = result["summary"]
    for key, label in [("max_forward_geomean_speedup_nchw", "max forward, NCHW"),
                       ("max_forward_backward_geomean_speedup_nchw",
                        "max forward+backward, NCHW")]:
        if summary.get(key):
            lines.append(f"geometric-mean speedup over PyTorch, {label}: {summary[key]:.2f}x")
    slower = summary.get("rows_slower_than_torch_fastest_layout")
    if slower is not None:
        lines.append(f"rows slower than PyTorch's faster layout for the same layer and pass: "
                     f"{len(slower)} of {len(result['rows'])}"
                     + "".join(f"\n  {name}" for name in slower))
    return "\n".join(lines)


def write_json(result: dict, path: str) -> None:
    """Write atomically: a crash never leaves a half-written file."""
    write_atomically(path, lambda stream: stream.write(json.dumps(result, indent=2).encode()))
