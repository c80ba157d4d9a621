"""``poolgrad bench --torch``: poolgrad's PyTorch front end against eager and compiled
PyTorch, in one process at the same thread count.

For every layer of :data:`poolgrad.bench.suite.SUITE`, in NCHW and channels-last, two
passes are timed for three implementations of the same ``torch.nn.functional`` call:

- ``poolgrad.torch``, the front end (the same function names and signatures);
- ``eager``: ``torch.nn.functional`` itself;
- ``compiled``: a function wrapping that ``torch.nn.functional`` call, compiled by
  ``torch.compile`` (Inductor, static shapes) once per layer, layout and pass.

*forward* runs under ``torch.no_grad()``; *forward+backward* is ``y = f(x)`` on a leaf
that requires grad and ``y.backward(dy)``. The three run in turn, round after round, and
the medians are reported with the speedups of poolgrad.torch (a baseline's time over
poolgrad.torch's: above 1 means poolgrad.torch is faster).

Besides the layers: the fixed cost of a call on a small tensor (poolgrad.torch against
poolgrad's NumPy API and eager PyTorch), what the front end adds on a large layer, and,
with ``--models``, a training step of VGG-11 and ResNet-18 (:mod:`poolgrad.torch.zoo`)
with PyTorch's pooling modules and with poolgrad's (``replace_pooling``).
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict

import numpy as np

from .. import ops
from . import suite, timing

IMPLEMENTATIONS = ("poolgrad.torch", "eager", "compiled")
PASSES = ("forward", "forward+backward")
COLUMNS = {"poolgrad.torch": "poolgrad_torch_ms", "eager": "eager_ms",
           "compiled": "compiled_ms"}

SMALL_SHAPE = (8, 16, 32, 32)  # the per-call overhead: a max pool 2x2/2 on this
SMALL_CALLS = 200  # calls per timed round on the small tensor (quick: 3)
LARGE_LAYER = "VGG 2x2/2"  # the front end's overhead on a large layer: poolgrad's API
LARGE_REPEATS = 15  # the overhead target is 5%: more rounds than the rows get

MODEL_BATCH, MODEL_SIZE = 16, 224  # a training step's input: 16 x 3 x 224 x 224
QUICK_MODEL_BATCH, QUICK_MODEL_SIZE = 2, 32  # the smallest input VGG-11 takes
MODEL_REPEATS = 3  # a VGG-11 step takes seconds: 3 rounds unless --repeats says
POOLING = ("torch.nn pooling", "poolgrad.torch pooling")


def _import_torch():
    try:
        import torch
    except ImportError:
        raise ValueError("poolgrad bench --torch needs PyTorch: pip install torch (or pip "
                         "install 'poolgrad[torch]')") from None
    return torch


def import_front_end():
    """``poolgrad.torch``: functions with ``torch.nn.functional``'s names, and
    ``replace_pooling``."""
    from .. import torch as front_end  # imported late: it imports PyTorch
    return front_end


def functional_call(layer: suite.Layer, functional):
    """The layer as a call of ``functional`` (``torch.nn.functional`` or poolgrad.torch,
    which has its names): the global average is the adaptive average pool to size 1."""
    if layer.kind == "global_avg":
        adaptive = getattr(functional, f"adaptive_avg_pool{layer.ndim}d")
        return lambda t: adaptive(t, 1)
    pool = getattr(functional, f"{layer.kind}_pool{layer.ndim}d")
    return lambda t: pool(t, layer.kernel, layer.stride, layer.padding)


def passes(fn, x, dy, torch):
    """The two timed passes of ``fn`` on ``x``: functions of no arguments."""
    def forward():
        with torch.no_grad():
            return fn(x)

    def forward_backward():
        leaf = x.detach().requires_grad_()  # a fresh leaf: no gradient accumulates
        fn(leaf).backward(dy)
        return leaf.grad

    return {"forward": forward, "forward+backward": forward_backward}


def _check_agree(ours, eager, what: str, torch) -> None:
    """A benchmark of a wrong result measures nothing: the values and the gradient must
    match PyTorch's before anything is timed."""
    for pass_name in PASSES:
        try:
            torch.testing.assert_close(ours[pass_name](), eager[pass_name]())
        except AssertionError as error:
            raise AssertionError(f"poolgrad.torch and PyTorch disagree on {what}, "
                                 f"{pass_name}: {error}") from None


def _compile(layer, pass_name, x, dy, eager, torch):
    """The compiled variant of one (layer, layout, pass), called once so that it is
    compiled and checked against ``eager`` (the same pass); returns it and the seconds
    compiling took."""
    compiled = suite.compile_static(functional_call(layer, torch.nn.functional), torch)
    run = passes(compiled, x, dy, torch)[pass_name]
    start = time.perf_counter()
    with suite.quiet_compile():
        result = run()  # forward+backward: also compiles the backward graph
    seconds = time.perf_counter() - start
    torch.testing.assert_close(result, eager())
    return run, seconds


def _time_layer(layer, base, front_end, torch, repeats, compile_layouts, progress):
    rows = []
    eager_call = functional_call(layer, torch.nn.functional)
    ours_call = functional_call(layer, front_end)
    for layout in suite.LAYOUTS:
        x = suite.torch_input(base if layout == "NCHW" else suite.channels_last(base),
                              layout, torch)
        with torch.no_grad():
            dy = torch.ones_like(eager_call(x))  # in the layout PyTorch's output has
        ours, eager = passes(ours_call, x, dy, torch), passes(eager_call, x, dy, torch)
        _check_agree(ours, eager, f"{layer.name} {layout}", torch)
        for pass_name in PASSES:
            if progress:
                progress(f"{layer.name} {layout} {pass_name}")
            contenders = {"poolgrad.torch": ours[pass_name], "eager": eager[pass_name]}
            compile_seconds = None
            if layout in compile_layouts:
                contenders["compiled"], compile_seconds = _compile(
                    layer, pass_name, x, dy, eager[pass_name], torch)
            seconds = timing.median_seconds(contenders, repeats)
            row = {"layer": layer.name, "shape": list(layer.shape), "layout": layout,
                   "pass": pass_name, "compile_s": compile_seconds}
            for name in IMPLEMENTATIONS:
                row[COLUMNS[name]] = seconds[name] * 1e3 if name in seconds else None
            for baseline in ("eager", "compiled"):
                theirs = row[COLUMNS[baseline]]
                row[f"speedup_vs_{baseline}"] = (
                    theirs / row["poolgrad_torch_ms"] if theirs is not None else None)
            rows.append(row)
    return rows


def call_overhead(front_end, torch, quick: bool, repeats: int) -> dict:
    """Microseconds per call of a max pool 2x2/2 on a small tensor, where the fixed
    cost of a call dominates: poolgrad.torch, poolgrad's NumPy API and eager PyTorch."""
    x = np.random.default_rng(1).standard_normal(SMALL_SHAPE, dtype=np.float32)
    y = ops.max_pool(x, 2, 2)
    dy = np.ones_like(y)
    xt, dyt = torch.from_numpy(x), torch.from_numpy(dy)

    def numpy_forward_backward():
        _, pullback = ops.vjp(ops.max_pool, x, 2, 2)
        return pullback(dy)

    ours_pool, eager_pool = front_end.max_pool2d, torch.nn.functional.max_pool2d
    ours = passes(lambda t: ours_pool(t, 2, 2), xt, dyt, torch)
    eager = passes(lambda t: eager_pool(t, 2, 2), xt, dyt, torch)
    numpy_passes = {"forward": lambda: ops.max_pool(x, 2, 2),
                    "forward+backward": numpy_forward_backward}
    calls = 3 if quick else SMALL_CALLS
    micros = {}
    for pass_name in PASSES:
        seconds = timing.median_seconds({"poolgrad.torch": ours[pass_name],
                                        "numpy": numpy_passes[pass_name],
                                        "eager": eager[pass_name]}, repeats, calls)
        micros[pass_name] = {name: s * 1e6 for name, s in seconds.items()}
    return {"shape": list(SMALL_SHAPE), "kernel": 2, "stride": 2,
            "calls_per_round": calls, "us": micros,
            "front_end_minus_numpy_us": {
                p: micros[p]["poolgrad.torch"] - micros[p]["numpy"] for p in PASSES}}


def large_layer_overhead(front_end, torch, quick: bool, repeats: int) -> dict:
    """What the front end adds to poolgrad's NumPy API on a large layer: the two run in
    turn on the same data (the NumPy API on the tensor's memory, viewed as an array)."""
    layer = next(layer for layer in suite.SUITE if layer.name == LARGE_LAYER)
    layer = layer.quick() if quick else layer
    base = np.random.default_rng(2).standard_normal(layer.shape, dtype=np.float32)
    args = (layer.kernel, layer.stride, layer.padding)
    rows = []
    for layout in suite.LAYOUTS:
        x = suite.torch_input(base if layout == "NCHW" else suite.channels_last(base),
                              layout, torch)
        array = x.numpy()  # shares the tensor's memory and strides
        y = ops.max_pool(array, *args)
        dy, dyt = np.ones_like(y), torch.ones_like(torch.from_numpy(y))

        def numpy_forward_backward(array=array, dy=dy):
            _, pullback = ops.vjp(ops.max_pool, array, *args)
            return pullback(dy)

        ours = passes(functional_call(layer, front_end), x, dyt, torch)
        numpy_passes = {"forward": lambda array=array: ops.max_pool(array, *args),
                        "forward+backward": numpy_forward_backward}
        for pass_name in PASSES:
            seconds = timing.median_seconds({"poolgrad.torch": ours[pass_name],
                                            "numpy": numpy_passes[pass_name]}, repeats)
            rows.append({"layout": layout, "pass": pass_name,
                         "poolgrad_torch_ms": seconds["poolgrad.torch"] * 1e3,
                         "numpy_ms": seconds["numpy"] * 1e3,
                         "overhead": seconds["poolgrad.torch"] / seconds["numpy"] - 1})
    return {"layer": layer.name, "shape": list(layer.shape), "repeats": repeats,
            "rows": rows}


def _is_pooling(module) -> bool:
    return type(module).__module__ == "torch.nn.modules.pooling"


def _pooling_alone(model, x, front_end, torch, repeats: int) -> dict:
    """Forward+backward of the model's pooling layers alone, on the inputs they get in
    the model: how much of a step pooling can account for."""
    inputs = []
    hooks = [module.register_forward_hook(
        lambda module, args, out: inputs.append((module, args[0].detach().clone())))
        for module in model.modules() if _is_pooling(module)]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    total = dict.fromkeys(POOLING, 0.0)
    for module, pooled in inputs:
        swapped = torch.nn.Sequential(copy.deepcopy(module))
        front_end.replace_pooling(swapped)
        with torch.no_grad():
            dy = torch.ones_like(module(pooled))
        seconds = timing.median_seconds({
            POOLING[0]: passes(module, pooled, dy, torch)["forward+backward"],
            POOLING[1]: passes(swapped[0], pooled, dy, torch)["forward+backward"]}, repeats)
        for name in POOLING:
            total[name] += seconds[name] * 1e3
    return {"layers": len(inputs), "ms": total}


def _training_step(model, x, target, torch):
    """A function of no arguments taking one training step of ``model`` on a batch."""
    # torchvision's reference recipe for VGG: SGD, learning rate 0.01, momentum 0.9
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), target).backward()
        optimizer.step()
    return step


def model_steps(front_end, torch, quick: bool, repeats: int | None = None,
                models=None) -> dict:
    """One training step (forward, cross-entropy loss, backward, SGD step) of each of
    ``models`` (name: function building it; default VGG-11 and ResNet-18) with PyTorch's
    pooling modules and with poolgrad's, in turn, median of ``repeats`` (default 3,
    quick 1)."""
    from ..torch import zoo
    models = models or {"vgg11": zoo.vgg11, "resnet18": zoo.resnet18}
    batch, size = (QUICK_MODEL_BATCH, QUICK_MODEL_SIZE) if quick else (MODEL_BATCH,
                                                                       MODEL_SIZE)
    repeats = repeats or (1 if quick else MODEL_REPEATS)
    results = []
    for name, build in models.items():
        torch.manual_seed(0)
        stock = build()
        swapped = copy.deepcopy(stock)  # the same weights
        replaced = front_end.replace_pooling(swapped)
        x = torch.randn(batch, 3, size, size)
        target = torch.randint(0, 1000, (batch,))
        seconds = timing.median_seconds({
            POOLING[0]: _training_step(stock.train(), x, target, torch),
            POOLING[1]: _training_step(swapped.train(), x, target, torch)}, repeats,
            settle=False)  # a step takes seconds: switching costs nothing beside it
        step_ms = {pooling: s * 1e3 for pooling, s in seconds.items()}
        pooling = _pooling_alone(stock.eval(), x, front_end, torch, repeats)
        results.append({
            "model": name, "pooling_layers": pooling["layers"],
            "pooling_layers_replaced": replaced, "step_ms": step_ms,
            "speedup": step_ms[POOLING[0]] / step_ms[POOLING[1]],
            "pooling_alone_ms": pooling["ms"],
            "pooling_share_of_step": pooling["ms"][POOLING[0]] / step_ms[POOLING[0]]})
        del stock, swapped  # VGG-11 with gradients and momentum holds 1.6 GB a copy
    return {"batch": batch, "input": [3, size, size], "repeats": repeats,
            "optimizer": "SGD, learning rate 0.01, momentum 0.9", "models": results}


def summarize(rows: list[dict]) -> dict:
    """For each baseline: the geometric-mean speedups of poolgrad.torch in NCHW (over
    the max layers, as the NumPy suite's headline, and over all layers), and the rows
    where poolgrad.torch is slower than the baseline in its faster layout."""
    summary = {}
    for baseline in ("eager", "compiled"):
        numbers = suite.summarize(rows, "poolgrad_torch_ms", COLUMNS[baseline])
        for pass_name in PASSES:
            speedups = [r[f"speedup_vs_{baseline}"] for r in rows
                        if r["layout"] == "NCHW" and r["pass"] == pass_name
                        and r[f"speedup_vs_{baseline}"] is not None]
            key = pass_name.replace("+", "_")
            numbers[f"all_{key}_geomean_speedup_nchw"] = suite.geometric_mean(speedups)
        numbers["rows_slower_than_fastest_layout"] = numbers.pop(
            "rows_slower_than_torch_fastest_layout")
        summary[baseline] = numbers
    return summary


def run(quick: bool = False, repeats: int | None = None, threads: int | None = None,
        layers: tuple[suite.Layer, ...] = suite.SUITE, models: bool = False,
        progress=None) -> dict:
    """Time the suite through poolgrad.torch, eager and compiled PyTorch; returns the
    JSON-ready result."""
    torch = _import_torch()
    front_end = import_front_end()
    model_repeats = repeats  # the model steps take seconds: fewer rounds unless given
    repeats = repeats or (1 if quick else 5)
    timed_layers = tuple(layer.quick() if quick else layer for layer in layers)
    # compiling takes seconds a variant: quick mode compiles one layer and layout (its
    # two passes), so that the path runs
    compiled = {layer.name: suite.LAYOUTS if not quick else ("NCHW",) if index == 0 else ()
                for index, layer in enumerate(timed_layers)}
    with timing.thread_count(threads, torch) as threads:
        bandwidth = suite.copy_bandwidth(2**20 if quick else 256 * 2**20, repeats)
        rng = np.random.default_rng(0)
        rows = []
        for layer in timed_layers:
            base = rng.standard_normal(layer.shape, dtype=np.float32)
            rows += _time_layer(layer, base, front_end, torch, repeats, compiled[layer.name],
                                progress)
        if progress:
            progress("call overhead and the large layer")
        overhead = call_overhead(front_end, torch, quick, repeats)
        large = large_layer_overhead(front_end, torch, quick,
                                     1 if quick else max(repeats, LARGE_REPEATS))
        if models and progress:
            progress("training steps of VGG-11 and ResNet-18")
        steps = model_steps(front_end, torch, quick, model_repeats) if models else None
    machine = suite.machine_info(threads, bandwidth)
    machine["torch"] = torch.__version__
    return {"machine": machine, "mode": "torch", "quick": quick, "repeats": repeats,
            "layers": [asdict(layer) for layer in layers], "rows": rows,
            "summary": summarize(rows), "call_overhead": overhead,
            "large_layer_overhead": large, "model_steps": steps}


def _ms(value, width: int) -> str:
    return f"{value:{width}.2f}" if value is not None else f"{'-':>{width}}"


def _times(value, width: int) -> str:
    return f"{value:{width - 1}.2f}x" if value is not None else f"{'-':>{width}}"


def format_table(result: dict) -> str:
    lines = [suite.header(result, "poolgrad bench --torch"), "",
             f"{'layer':<22} {'layout':<14} {'pass':<17} {'poolgrad.torch ms':>17} "
             f"{'eager ms':>9} {'compiled ms':>11} {'vs eager':>9} {'vs compiled':>11}"]
    for row in result["rows"]:
        lines.append(
            f"{row['layer']:<22} {row['layout']:<14} {row['pass']:<17} "
            f"{row['poolgrad_torch_ms']:17.2f} {_ms(row['eager_ms'], 9)} "
            f"{_ms(row['compiled_ms'], 11)} {_times(row['speedup_vs_eager'], 9)} "
            f"{_times(row['speedup_vs_compiled'], 11)}")
    lines.append("vs eager, vs compiled: the baseline's time over poolgrad.torch's, same "
                 "layout (above 1x: poolgrad.torch is faster)")
    overhead = result["call_overhead"]
    lines += ["", f"per call, max pool 2x2/2 on {'x'.join(map(str, overhead['shape']))} "
                  f"(microseconds): poolgrad.torch, NumPy API, eager PyTorch"]
    for pass_name, micros in overhead["us"].items():
        lines.append(f"  {pass_name:<17} {micros['poolgrad.torch']:9.1f} "
                     f"{micros['numpy']:9.1f} {micros['eager']:9.1f}")
    large = result["large_layer_overhead"]
    lines += ["", f"{large['layer']} ({'x'.join(map(str, large['shape']))}): poolgrad.torch "
                  f"against the NumPy API, in turn, median of {large['repeats']}"]
    for row in large["rows"]:
        lines.append(f"  {row['layout']:<14} {row['pass']:<17} "
                     f"{row['poolgrad_torch_ms']:9.2f} ms {row['numpy_ms']:9.2f} ms "
                     f"{row['overhead']:+7.1%}")
    if result["model_steps"]:
        lines += _format_models(result["model_steps"])
    if result["quick"]:  # no speed verdict from shapes this small
        return "\n".join(lines + ["", suite.QUICK_NOTE])
    return "\n".join(lines + _format_summary(result["summary"], len(result["rows"])))


def _format_models(steps: dict) -> list[str]:
    lines = ["", f"training step, batch {steps['batch']} x {'x'.join(map(str, steps['input']))}"
                 f", {steps['optimizer']}, median of {steps['repeats']}:"]
    for model in steps["models"]:
        step, alone = model["step_ms"], model["pooling_alone_ms"]
        lines += [
            f"  {model['model']:<9} torch.nn pooling {step[POOLING[0]]:.1f} ms, poolgrad.torch "
            f"pooling {step[POOLING[1]]:.1f} ms: {model['speedup']:.3f}x "
            f"({model['pooling_layers_replaced']} of {model['pooling_layers']} layers replaced)",
            f"  {'':<9} its pooling layers alone, forward+backward: {alone[POOLING[0]]:.1f} ms "
            f"and {alone[POOLING[1]]:.1f} ms ({model['pooling_share_of_step']:.1%} of the "
            f"torch.nn step)"]
    return lines


def _format_summary(summary: dict, row_count: int) -> list[str]:
    lines = [""]
    for baseline, label in (("eager", "eager PyTorch"), ("compiled", "torch.compile")):
        numbers = summary[baseline]
        for key, what in [("max_forward_geomean_speedup_nchw", "max forward"),
                          ("max_forward_backward_geomean_speedup_nchw",
                           "max forward+backward"),
                          ("all_forward_geomean_speedup_nchw", "all layers forward"),
                          ("all_forward_backward_geomean_speedup_nchw",
                           "all layers forward+backward")]:
            if numbers.get(key):
                lines.append(f"geometric-mean speedup over {label}, {what}, NCHW: "
                             f"{numbers[key]:.2f}x")
        slower = numbers["rows_slower_than_fastest_layout"]
        if slower is not None:
            lines.append(f"rows slower than {label}'s faster layout for the same layer and "
                         f"pass: {len(slower)} of {row_count}"
                         + "".join(f"\n  {name}" for name in slower))
    return lines
