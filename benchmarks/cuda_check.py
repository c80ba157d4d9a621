"""On a CUDA GPU: poolgrad.torch's public functions and modules on CUDA tensors against
the same calls on CPU tensors, and what a GPU user relies on beside the values.

    python benchmarks/cuda_check.py --out runs/cuda-check.json

Checks, each recorded in the JSON and summed up on the last lines (exit status 1 if
any failed):

* **parity**: every op and kind, forward and backward (``dy`` random), float32 in
  both layouts, float64 and bfloat16 for the core ops. Max pooling's values and
  winners (and unpooling, fractional and APS) must give the CPU's bits; the rest agree
  within a tolerance of the dtype. Parameter gradients (GeM's ``p``, the gate, the
  attention weights) are compared too.
* **determinism**: each case's forward and backward twice on CUDA, and once more
  under ``torch.use_deterministic_algorithms(True)``: the same bits every time;
  stochastic pooling's training draw with one seed twice.
* **refused by PyTorch**: the modules whose CUDA backward PyTorch refuses in
  deterministic mode (MaxPool3d, AvgPool3d, AdaptiveAvgPool2d, AdaptiveMaxPool2d)
  train there through poolgrad.torch; whether torch's own raise is recorded.
* **compile**: a chain of ops under ``torch.compile(fullgraph=True)``, values and
  gradients against eager.
* **CUDA graphs**: forward and backward captured with
  ``torch.cuda.make_graphed_callables`` and replayed on new data.
* **gradcheck** and **gradgradcheck** in float64 on CUDA.

``--device cpu`` runs the same code with CPU tensors on both sides (a dry run of the
script where there is no GPU: every comparison then holds trivially).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

import poolgrad.torch as pt

F = torch.nn.functional
EXACT = "exact"


def randn(shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64).to(dtype)


def with_ties(shape, dtype=torch.float32, seed=0):
    """Small integers (ties in most windows), a NaN, -0 and both infinities."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, shape, generator=g).to(torch.float64)
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=g)[:4]
    flat[picks[0]], flat[picks[1]] = float("nan"), -0.0
    flat[picks[2]], flat[picks[3]] = float("inf"), -float("inf")
    return x.to(dtype)


def positive(shape, dtype=torch.float32, seed=0):
    return randn(shape, dtype, seed).abs() + 0.1


S1, S2, S3 = (3, 5, 29), (3, 5, 17, 19), (2, 3, 7, 9, 8)


def _unpool(x):
    y, i = pt.max_pool2d(x, 2, 2, return_indices=True)
    return pt.max_unpool2d(y, i, 2, 2, output_size=x.shape[-2:])


def _gate():
    return randn((2, 2), seed=7)


def _attention_weights():
    return randn((2, 5), seed=8), randn((5, 5), seed=9) * 0.3


def _lps_weights():
    g = torch.Generator().manual_seed(10)
    return (torch.randn(4, 5, generator=g) * 0.3, torch.randn(4, generator=g),
            torch.randn(4, generator=g))


# name -> (function of x and the parameters, x's maker and shape, parameter makers,
#          "exact" where the CPU's bits are required, dtypes)
CORE = ("float32", "float64", "bfloat16")
CASES = {
    "max_pool1d 3/2 pad 1": (lambda x: pt.max_pool1d(x, 3, 2, 1), with_ties, S1, (), EXACT, CORE),
    "max_pool2d 2/2": (lambda x: pt.max_pool2d(x, 2), with_ties, S2, (), EXACT, CORE),
    "max_pool2d 3/2 pad 1": (lambda x: pt.max_pool2d(x, 3, 2, 1), with_ties, S2, (), EXACT, CORE),
    "max_pool2d 3/1 dil 2 ceil": (lambda x: pt.max_pool2d(x, 3, 1, 1, 2, True), with_ties, S2,
                                  (), EXACT, CORE),
    "max_pool2d split ties": (lambda x: pt.max_pool2d(x, 2, 1, ties="split"), with_ties, S2,
                              (), None, ("float32", "float64")),
    "max_pool3d 2/2": (lambda x: pt.max_pool3d(x, 2), with_ties, S3, (), EXACT, CORE),
    "max_pool3d 3/2 pad 1 ceil": (lambda x: pt.max_pool3d(x, 3, 2, 1, ceil_mode=True), with_ties,
                                  S3, (), EXACT, CORE),
    "adaptive_max_pool2d (5, 4)": (lambda x: pt.adaptive_max_pool2d(x, (5, 4)), with_ties, S2,
                                   (), EXACT, CORE),
    "adaptive_max_pool3d (2, 3, 2)": (lambda x: pt.adaptive_max_pool3d(x, (2, 3, 2)),
                                      with_ties, S3, (), EXACT, CORE),
    "max_unpool2d": (_unpool, randn, S2, (), EXACT, CORE),
    "avg_pool1d 3/2 pad 1": (lambda x: pt.avg_pool1d(x, 3, 2, 1), randn, S1, (), None, CORE),
    "avg_pool2d 3/2 pad 1 no pad count": (
        lambda x: pt.avg_pool2d(x, 3, 2, 1, count_include_pad=False), randn, S2, (), None, CORE),
    "avg_pool2d 2/2 ceil divisor 3": (
        lambda x: pt.avg_pool2d(x, 2, 2, ceil_mode=True, divisor_override=3), randn, S2, (),
        None, CORE),
    "avg_pool3d 3/2 pad 1": (lambda x: pt.avg_pool3d(x, 3, 2, 1), randn, S3, (), None, CORE),
    "adaptive_avg_pool2d (5, 4)": (lambda x: pt.adaptive_avg_pool2d(x, (5, 4)), randn, S2, (),
                                   None, CORE),
    "adaptive_avg_pool2d 1": (lambda x: pt.adaptive_avg_pool2d(x, 1), randn, S2, (), None, CORE),
    "adaptive_avg_pool3d (2, 3, 2)": (lambda x: pt.adaptive_avg_pool3d(x, (2, 3, 2)), randn, S3,
                                      (), None, CORE),
    "lp_pool2d p=2 3/2": (lambda x: pt.lp_pool2d(x, 2, 3, 2), randn, S2, (), None, CORE),
    "lp_pool2d p=1.5 2/2": (lambda x: pt.lp_pool2d(x, 1.5, 2), positive, S2, (), None, CORE),
    "blur_pool": (lambda x: pt.blur_pool(x), randn, S2, (), None, ("float32", "float64")),
    "max_blur_pool": (lambda x: pt.max_blur_pool(x), randn, S2, (), None,
                      ("float32", "float64")),
    "avg_blur_pool": (lambda x: pt.avg_blur_pool(x), randn, S2, (), None,
                      ("float32", "float64")),
    "soft_pool 2": (lambda x: pt.soft_pool(x, 2), randn, S2, (), None, ("float32", "float64")),
    "soft_pool 3/2 pad 1": (lambda x: pt.soft_pool(x, 3, 2, 1), randn, S2, (), None,
                            ("float32", "float64")),
    "stochastic_pool evaluation": (lambda x: pt.stochastic_pool(x, 2, training=False), positive,
                                   S2, (), None, ("float32", "float64")),
    "gem_pool p=3 2/2": (lambda x: pt.gem_pool(x, 3.0, 2), positive, S2, (), None,
                         ("float32", "float64")),
    "gem_pool learned p 2/2": (lambda x, p: pt.gem_pool(x, p, 2), positive, S2,
                               (lambda: torch.tensor(3.01),), None, ("float32", "float64")),
    "gem_pool learned p global": (lambda x, p: pt.gem_pool(x, p), positive, S2,
                                  (lambda: torch.tensor(2.5),), None, ("float32", "float64")),
    "mixed_pool learned alpha": (lambda x, a: pt.mixed_pool(x, 3, 2, 1, a), randn, S2,
                                 (lambda: torch.tensor(0.3),), None, ("float32", "float64")),
    "gated_pool": (lambda x, g: pt.gated_pool(x, g, 2), randn, S2, (_gate,), None,
                   ("float32", "float64")),
    "attention_pool": (lambda x, q, k: pt.attention_pool(x, q, k), randn, S2,
                       (lambda: _attention_weights()[0], lambda: _attention_weights()[1]), None,
                       ("float32", "float64")),
    "fractional_max_pool (7, 8)": (
        lambda x: pt.fractional_max_pool(x, 2, output_size=(7, 8),
                                         samples=torch.rand(x.shape[0], x.shape[1], 2,
                                                            generator=torch.Generator()
                                                            .manual_seed(4)).to(x.device)),
        randn, S2, (), EXACT, ("float32", "float64")),
    "aps_pool": (lambda x: pt.aps_pool(x), randn, S2, (), EXACT, ("float32", "float64")),
    "max_aps_pool": (lambda x: pt.max_aps_pool(x), randn, S2, (), None, ("float32", "float64")),
    "lps_pool evaluation": (lambda x, a, b, c: pt.lps_pool(x, (a, b, c)), randn, S2,
                            tuple(lambda k=k: _lps_weights()[k] for k in range(3)), None,
                            ("float32", "float64")),
}

TOLERANCE = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.float64: dict(rtol=1e-11,
             atol=1e-11), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


def layouts(x):
    yield "NCHW", x
    if x.dim() in (4, 5):
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        yield "channels-last", x.contiguous(memory_format=fmt)


def as_tuple(y):
    return y if isinstance(y, tuple) else (y,)


def run_case(function, x, params, dy_seed, device):
    """Outputs, and the gradients of x and of every floating parameter, on ``device``."""
    x = x.to(device).detach().requires_grad_()
    ps = [p.to(device=device, dtype=x.dtype).detach().requires_grad_() for p in params]
    outputs = as_tuple(function(x, *ps))
    floating = [y for y in outputs if y.dtype.is_floating_point]
    dys = [randn(y.shape, torch.float64, dy_seed + k).to(y.dtype).to(device)
           for k, y in enumerate(floating)]
    grads = torch.autograd.grad(floating, [x, *ps], dys, allow_unused=True)
    return [y.detach() for y in outputs], [g for g in grads if g is not None]


def bits(t):
    t = t.detach().cpu().contiguous()
    if t.dtype.is_floating_point:
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        return t.view(width)
    return t


def same_bits(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def close(a, b, tolerance) -> tuple[bool, float]:
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    if a.shape != b.shape:
        return False, float("inf")
    both_nan = a.isnan() & b.isnan()
    a, b = a.masked_fill(both_nan, 0.0), b.masked_fill(both_nan, 0.0)
    if torch.equal(a.isinf() & (a > 0), b.isinf() & (b > 0)) and torch.equal(
            a.isinf() & (a < 0), b.isinf() & (b < 0)):
        finite = a.isfinite() & b.isfinite()
        error = (a[finite] - b[finite]).abs()
        allowed = tolerance["atol"] + tolerance["rtol"] * b[finite].abs()
        worst = float((error / allowed).max()) if error.numel() else 0.0
        return bool((error <= allowed).all()) and not (a.isnan() ^ b.isnan()).any(), worst
    return False, float("inf")


def cpu_references() -> dict:
    """Every case's CPU outputs and gradients, by label."""
    references = {}
    for label, function, x, params, _ in _parity_cases():
        try:
            references[label] = run_case(function, x, params, 100, "cpu")
        except Exception as error:
            references[label] = _error(error)
    return references


def _parity_cases():
    """``(label, function, x, parameters, exact)`` for every case, dtype and layout."""
    for name, (function, maker, shape, param_makers, exact, dtypes) in CASES.items():
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            for layout, x in layouts(maker(shape, dtype, seed=len(name))):
                yield (f"{name} {dtype_name} {layout}", function, x,
                       [make() for make in param_makers], exact)


def compare(mine, theirs, exact, dtype) -> tuple[bool, dict]:
    """Whether the outputs and gradients ``mine`` match ``theirs``, and how far off."""
    details, ok = {}, True
    for kind, a_list, b_list in (("output", mine[0], theirs[0]),
                                 ("gradient", mine[1], theirs[1])):
        if len(a_list) != len(b_list):
            details[kind] = f"{len(a_list)} tensors, the CPU gave {len(b_list)}"
            ok = False
            continue
        worst = 0.0
        for a, b in zip(a_list, b_list, strict=True):
            if exact == EXACT and (kind == "output" or not a.is_floating_point()):
                same = same_bits(a, b)
                ok &= same
                worst = max(worst, 0.0 if same else float("inf"))
            else:
                good, w = close(a, b, TOLERANCE[dtype])
                ok &= good
                worst = max(worst, w)
            if kind == "output" and a.dim() > 1 and a.stride() != b.stride():
                ok = False
                details["strides"] = f"{a.stride()} against {b.stride()}"
        details[f"{kind}_worst_over_tolerance"] = worst
    return ok, details


def parity(device: str, record, references=None) -> None:
    """Each case on ``device`` against the CPU (computed here, or ``references``), then
    twice more on ``device``, the second time in deterministic mode: the same bits."""
    for label, function, x, params, exact in _parity_cases():
        started = time.perf_counter()
        try:
            if references is None:
                expected = run_case(function, x, params, 100, "cpu")
            elif isinstance(references[label], str):
                raise RuntimeError(f"on the CPU: {references[label]}")
            else:
                expected = references[label]
            got = run_case(function, x, params, 100, device)
            ok, details = compare(got, expected, exact, x.dtype)
            again = run_case(function, x, params, 100, device)
            torch.use_deterministic_algorithms(True)
            try:
                strict = run_case(function, x, params, 100, device)
            finally:
                torch.use_deterministic_algorithms(False)
            repeated = all(same_bits(a, b) for run in (again, strict)
                           for a, b in zip(run[0] + run[1], got[0] + got[1], strict=True))
            record("parity", label, ok, details)
            record("determinism", label, repeated, {})
        except Exception as error:  # recorded, and the sweep goes on
            record("parity", label, False, {"error": _error(error)})
        _note_time(label, started)


def _error(error) -> str:
    return f"{type(error).__name__}: {str(error)[:400]} @ " + "".join(
        traceback.format_tb(error.__traceback__)[-2:])[-600:]


_SLOW = []


def _note_time(label, started):
    seconds = time.perf_counter() - started
    if seconds > 2:
        _SLOW.append((round(seconds, 1), label))


def stochastic_training(device: str, record) -> None:
    x = positive(S2, seed=3).to(device)
    runs = [pt.stochastic_pool(x, 2, generator=11) for _ in range(2)]
    # a CPU generator's seed counts the same draws on either device
    on_cpu = pt.stochastic_pool(x.cpu(), 2, generator=torch.Generator().manual_seed(12))
    here = pt.stochastic_pool(x, 2, generator=torch.Generator().manual_seed(12))
    record("parity", "stochastic_pool training, one CPU generator's seed: the CPU's draws",
           same_bits(here, on_cpu), {})
    windows = F.unfold(x, 2, stride=2).view(S2[0], S2[1], 4, -1)
    picked = (windows == runs[0].flatten(2).unsqueeze(2)).any(2).all()
    record("determinism", "stochastic_pool training, seed 11, twice", same_bits(*runs), {})
    record("parity", "stochastic_pool training draws a value of its window", bool(picked), {})


def refused_by_pytorch(device: str, record) -> None:
    layers = {"MaxPool3d": ((pt.MaxPool3d(3, 2, 1), torch.nn.MaxPool3d(3, 2, 1)), S3),
              "AvgPool3d": ((pt.AvgPool3d(3, 2, 1), torch.nn.AvgPool3d(3, 2, 1)), S3),
              "AdaptiveAvgPool2d": ((pt.AdaptiveAvgPool2d((5, 4)),
                                     torch.nn.AdaptiveAvgPool2d((5, 4))), S2),
              "AdaptiveMaxPool2d": ((pt.AdaptiveMaxPool2d((5, 4)),
                                     torch.nn.AdaptiveMaxPool2d((5, 4))), S2)}
    torch.use_deterministic_algorithms(True)
    try:
        for name, ((mine, theirs), shape) in layers.items():
            x = randn(shape, seed=5).to(device)
            grads = []
            for _ in range(2):
                xr = x.clone().requires_grad_()
                mine(xr).sum().backward()
                grads.append(xr.grad)
            xr = x.clone().requires_grad_()
            try:
                theirs(xr).sum().backward()
                torch_refuses = False
            except RuntimeError as error:
                torch_refuses = "deterministic" in str(error)
            record("deterministic mode", f"poolgrad.torch.{name} trains, the same bits twice",
                   same_bits(*grads), {"torch_refuses_its_own": torch_refuses})
    finally:
        torch.use_deterministic_algorithms(False)


class Chain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(5, 8, 3, padding=1)
        self.p = torch.nn.Parameter(torch.tensor(3.0))

    def forward(self, x):
        x = self.conv(x)
        a = pt.max_pool2d(x, 3, 2, 1)
        b = pt.avg_pool2d(x, 3, 2, 1)
        c = pt.soft_pool(x, 2, 2)
        d = pt.gem_pool(pt.blur_pool(x.relu() + 0.1), self.p)
        return a.sum((2, 3)) + b.mean((2, 3)) + c.amax((2, 3)) + d.flatten(1)


def compiled(device: str, record) -> None:
    torch.manual_seed(0)
    model = Chain().to(device)
    x = randn(S2, seed=6).to(device)
    results = []
    for function in (model, torch.compile(model, fullgraph=True)):
        model.zero_grad()
        xr = x.clone().requires_grad_()
        y = function(xr)
        y.backward(torch.ones_like(y))
        results.append((y.detach(), xr.grad, model.conv.weight.grad.clone(),
                        model.p.grad.clone()))
    oks = [close(a, b, TOLERANCE[torch.float32]) for a, b in zip(*results, strict=True)]
    record("compile", "torch.compile(fullgraph=True): values and gradients (x, conv, p)",
           all(ok for ok, _ in oks), {"worst_over_tolerance": max(w for _, w in oks)})


def graphs(device: str, record) -> None:
    if device != "cuda":
        return
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(5, 8, 3, padding=1), pt.MaxPool2d(3, 2, 1),
                                pt.SoftPool(2), pt.AvgPool2d(2)).to(device)
    sample = randn(S2, seed=12).to(device).requires_grad_()
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    oks = []
    for seed in (13, 14):
        x = randn(S2, seed=seed).to(device)
        outs = []
        for function in (graphed, model):
            model.zero_grad()
            xr = x.clone().requires_grad_()
            y = function(xr)
            y.backward(torch.ones_like(y))
            outs.append((y.detach().clone(), xr.grad.clone(), model[0].weight.grad.clone()))
        oks += [close(a, b, TOLERANCE[torch.float32])[0] for a, b in zip(*outs, strict=True)]
    record("cuda graphs", "make_graphed_callables: replays give eager's values and gradients",
           all(oks), {})


def gradients(device: str, record) -> None:
    x = randn((1, 2, 5, 6), torch.float64, 15).to(device).requires_grad_()
    cases = {"max_pool2d 3/2 pad 1": lambda t: pt.max_pool2d(t, 3, 2, 1),
             "avg_pool2d 3/2 pad 1": lambda t: pt.avg_pool2d(t, 3, 2, 1),
             "lp_pool2d p=3": lambda t: pt.lp_pool2d(t, 3.0, 2),
             "soft_pool 2/1": lambda t: pt.soft_pool(t, 2, 1),
             "gem_pool 2/1": lambda t: pt.gem_pool(t.abs() + 0.1, 2.5, 2, 1),
             "blur_pool": lambda t: pt.blur_pool(t),
             "adaptive_avg_pool2d (3, 4)": lambda t: pt.adaptive_avg_pool2d(t, (3, 4)),
             "aps_pool": lambda t: pt.aps_pool(t)}
    for name, function in cases.items():
        try:
            first = torch.autograd.gradcheck(function, (x,), eps=1e-6, atol=1e-6)
            second = torch.autograd.gradgradcheck(function, (x,), eps=1e-6, atol=1e-6)
            record("gradcheck", f"{name}: gradcheck and gradgradcheck", first and second, {})
        except Exception as error:
            record("gradcheck", name, False, {"error": _error(error)})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", default="runs/cuda-check.json")
    parser.add_argument("--save-references", metavar="FILE",
                        help="compute the CPU side of the parity checks into FILE and stop")
    parser.add_argument("--references", metavar="FILE",
                        help="the CPU side from FILE (made with --save-references), where "
                             "compiling poolgrad's CPU kernels on the GPU's machine would "
                             "take minutes")
    args = parser.parse_args(argv)
    if args.save_references:
        torch.save(cpu_references(), args.save_references)
        return 0
    references = torch.load(args.references) if args.references else None
    if args.device == "cuda" and not torch.cuda.is_available():
        print("cuda_check: torch sees no CUDA GPU here (use --device cpu for a dry run)",
              file=sys.stderr)
        return 2
    results = []
    info = {"torch": torch.__version__, "device": args.device}
    if args.device == "cuda":
        import triton
        info.update(gpu=torch.cuda.get_device_name(0), triton=triton.__version__,
                    cuda=torch.version.cuda)
    started = time.perf_counter()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def save():  # as the checks go: a run cut short keeps what it found
        temporary = args.out + ".part"
        with open(temporary, "w") as stream:
            json.dump({"info": info, "seconds": time.perf_counter() - started,
                       "slowest": sorted(_SLOW)[-10:], "results": results}, stream, indent=1)
        os.replace(temporary, args.out)

    def record(group, label, ok, details):
        results.append({"group": group, "check": label, "ok": bool(ok), **details})
        if not ok:
            print(f"FAILED {group}: {label} {details}", flush=True)
        if len(results) % 25 == 0:
            save()

    # the short checks first, the long parity sweep last
    for step in (stochastic_training, refused_by_pytorch, compiled, graphs, gradients,
                 parity):
        step_started = time.perf_counter()
        try:
            if step is parity:
                step(args.device, record, references)
            else:
                step(args.device, record)
        except Exception as error:
            record(step.__name__, "the whole step", False, {"error": _error(error)})
        print(f"{step.__name__}: {time.perf_counter() - step_started:.1f} s", flush=True)
        save()
    groups = {}
    for r in results:
        passed, total = groups.get(r["group"], (0, 0))
        groups[r["group"]] = (passed + r["ok"], total + 1)
    for group, (passed, total) in groups.items():
        print(f"{group:20s} {passed}/{total} passed")
    failed = sum(total - passed for passed, total in groups.values())
    print(f"cuda_check on {info}: {failed} failed, {time.perf_counter() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
