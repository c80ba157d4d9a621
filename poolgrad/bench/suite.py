"""What the speed suites share (``poolgrad bench``, ``--torch``, ``--device cuda``): the
layers they time, the layouts and passes, the bytes a pass must move, the inputs
PyTorch gets, the machine's description, the summary and the table's header, and the
JSON they write."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import warnings
from dataclasses import dataclass

import numpy as np

from ..tools.files import write_atomically
from .timing import median_seconds


@dataclass(frozen=True)
class Layer:
    """A layer of a real network, as the suites time it."""
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
PASSES = ("forward", "backward", "forward+backward")

QUICK_NOTE = (
    "quick mode only checks that the suite runs: its tiny shapes take microseconds, so\n"
    "these times measure the fixed cost of a call (argument checks, dispatch, allocating\n"
    "the output), not pooling speed, and the speedup column is no speed comparison.\n"
    "Run `poolgrad bench` without --quick for that.")


def channels_last(x: np.ndarray) -> np.ndarray:
    """The same logical (N, C, *spatial) array stored with C fastest (PyTorch's
    channels_last memory format): a transposed view of an (N, *spatial, C) array."""
    order = (0,) + tuple(range(2, x.ndim)) + (1,)
    stored = np.ascontiguousarray(x.transpose(order))
    return stored.transpose((0, x.ndim - 1) + tuple(range(1, x.ndim - 1)))


def must_move(layer: Layer, pass_name: str, x: np.ndarray, y: np.ndarray) -> tuple[int, int]:
    """(bytes read, bytes written) that a pass cannot avoid: forward, read x and write
    y; backward, read dy and the saved state (one byte per output for max pooling) and
    write dx; forward+backward, both, with the state written once and read once."""
    state = y.size if layer.kind == "max" else 0
    return {"forward": (x.nbytes, y.nbytes),
            "backward": (y.nbytes + state, x.nbytes),
            "forward+backward": (x.nbytes + y.nbytes + state,
                                 y.nbytes + state + x.nbytes)}[pass_name]


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


def torch_passes(fn, xt, torch) -> dict:
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


def compile_static(function, torch):
    """``function`` compiled as every suite compiles its PyTorch baseline: Inductor,
    static shapes, one graph. Dynamo's caches are reset first: it keeps compiled graphs
    per code object, and the suites' wrappers share one, so that without a reset later
    layers would reach its recompile limit and run eager."""
    torch._dynamo.reset()
    return torch.compile(function, dynamic=False, fullgraph=True)


@contextlib.contextmanager
def quiet_compile():
    """Around a compiled function's first calls: Inductor's first compile imports
    torch.utils.mkldnn, which warns about itself."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`torch.jit.script_method` is deprecated",
                                DeprecationWarning)
        yield


def copy_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes per second of a large NumPy copy (read + write), in this process: recorded
    with the machine, as earlier tables were; the roofline is
    :mod:`poolgrad.bench.roofline`."""
    source = np.ones(nbytes // 8)
    target = np.empty_like(source)
    seconds = median_seconds({"copy": lambda: np.copyto(target, source)}, repeats)["copy"]
    return 2 * source.nbytes / seconds


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
            "copy_bandwidth_GBps": bandwidth / 1e9, "python": platform.python_version(),
            "numpy": np.__version__, "numba": numba.__version__}


def best_pytorch(rows: list[dict], same=("layer", "pass"),
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


def geometric_mean(values) -> float | None:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(rows: list[dict], ours: str = "poolgrad_ms", theirs: str = "torch_ms") -> dict:
    """Geometric-mean speedups (``theirs`` time over ``ours``) in NCHW for the max-pool
    rows, and the rows where ``ours`` is slower than ``theirs`` in its faster layout for
    the same layer and pass. Rows without a ``theirs`` time are left out. On the NumPy
    suite's rows it also compares with compiled PyTorch, with the best PyTorch time
    (:func:`best_pytorch`) and with the roofline."""
    timed = [r for r in rows if r.get(theirs) is not None]

    def speedups(pass_name, column=theirs):
        return [r[column] / r[ours] for r in rows if r.get(column) is not None
                and r["layout"] == "NCHW" and r["pass"] == pass_name and is_max(r["layer"])]

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


def is_max(name: str) -> bool:
    """Whether the suite's layer ``name`` is a max pooling."""
    return any(layer.name == name and layer.kind == "max" for layer in SUITE)


def header(result: dict, command: str = "poolgrad bench") -> str:
    """The first line of a table: the machine, threads, bandwidth and repeats."""
    machine = result["machine"]
    roofline = machine.get("roofline")
    bandwidth = (f"read {roofline['read_GBps']:.2f} GB/s, write {roofline['write_GBps']:.2f} "
                 f"GB/s, fresh write {roofline['fresh_write_GBps']:.2f} GB/s at "
                 f"{roofline['bytes'] / 2**20:.0f} MiB"
                 if roofline else f"NumPy copy {machine['copy_bandwidth_GBps']:.2f} GB/s")
    return (f"{command}: {machine['cpu']} (family {machine.get('cpu_family')} model "
            f"{machine.get('cpu_model')}, {machine.get('simd')}), {machine['threads']} "
            f"threads, {bandwidth}, float32, median of {result['repeats']}"
            + (" (quick mode: tiny shapes, see the note below)" if result["quick"] else ""))


def write_json(result: dict, path: str) -> None:
    """Write atomically: a crash never leaves a half-written file."""
    write_atomically(path, lambda stream: stream.write(json.dumps(result, indent=2).encode()))
