"""``poolgrad bench --kinds``: every pooling kind of :mod:`poolgrad.kinds`, and Lp
pooling, through poolgrad's NumPy API and through poolgrad.torch, against plain PyTorch and
kornia, in one process at the same thread count.

Each row of :data:`KINDS` is a kind with its settings, timed on one layer (default
:data:`SHAPE`, float32, drawn from a standard normal; after a ReLU for stochastic
pooling) in NCHW and channels-last, for two passes:

- *forward*: the NumPy operator, and the torch functions under ``torch.no_grad()``;
- *forward+backward*: ``poolgrad.vjp`` and the pullback of ``dy`` (``dx`` alone,
  ``params=False``); in torch, ``y = f(x)`` on a leaf that requires grad and
  ``y.backward(dy)``, the parameters plain tensors. ``dy`` is ones, stored as the
  contender's own ``y`` (the compiled reference takes the eager one's).

Five implementations run in turn, round after round
(:func:`~poolgrad.bench.timing.median_seconds`), and their medians are reported:

- ``numpy``: poolgrad's NumPy operator; ``poolgrad.torch``: its function of that name;
- ``eager``: the kind's ``reference``, a plain PyTorch formulation of the same function
  (``torch.nn.functional`` and window views, nothing of poolgrad's);
- ``compiled``: that formulation compiled by ``torch.compile`` (Inductor, static shapes,
  one graph) once per kind, layout and pass;
- ``kornia``: kornia's layer, where kornia has one (``BlurPool2D``, ``MaxBlurPool2D``).

*The same function* means the same values and input gradients for every input, up to
rounding: the same padding, filter, clamp and window, and for the random kinds the same
sample from the same draws. Before anything is timed, each implementation runs on the
row's input and is compared with the reference (:func:`check_agree`), the random kinds
given the draws each of poolgrad's APIs makes from one seed. kornia's layers pad with
zeros where poolgrad's default is reflection: on those rows kornia is timed and shown,
marked, but is no reference; the ``zeros`` rows give poolgrad kornia's padding, and there
it is one.

A row's best reference is the fastest reference in its own layout; the speedups are its
time over poolgrad's (above 1: poolgrad is faster).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import kinds as numpy_kinds
from .. import ops
from ..kinds.weighted import counted_draws
from . import suite, timing, torch_api

try:
    import torch
    from torch.nn import functional as F
except ImportError:  # run() says so
    torch = F = None

SHAPE = (32, 64, 56, 56)  # issue 34's layer
QUICK_SHAPE = (2, 3, 8, 8)
PASSES = torch_api.PASSES
REFERENCES = ("eager", "compiled", "kornia")
# the values and gradients every implementation must give, against the reference, in
# float32 on the full layer (the formulations round differently: GeM's scales by the
# window's maximum, attention's sums in another order)
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
SEED = 0  # the draws of the check
# how many kinds (the first ones) quick mode compiles, in NCHW: a compile takes seconds
_QUICK_COMPILED_KINDS = 1

GEM_P, GEM_EPS = 3.0, 1e-6
# GeM's p as training leaves it: a parameter a step away from its start. A whole p is
# raised by multiplying (poolgrad's kernels and compiled PyTorch's alike); this one
# takes exp and log, and PyTorch a pow with a tensor exponent
GEM_LEARNED_P = 3.01
LP_P = 2.0  # even: PyTorch's lp_pool, which takes no absolute value, is the same function
MIXED_ALPHA = 0.5
COMPILED_FRACTIONAL_WINDOWS = ("torch.compile'd fractional_max_pool2d places some windows "
                               "elsewhere than eager PyTorch (torch 2.13, k 3)")
KORNIA_PADS_ZEROS = "kornia pads with zeros, poolgrad's default reflects"


@dataclass(frozen=True)
class Kind:
    """One row of the suite: a pooling kind with its settings, as each implementation
    calls it. Both of poolgrad's APIs take ``(x, *parameters, *args, **kwargs)``, and
    ``rng`` (NumPy) or ``generator`` (torch) where the kind draws at random."""
    function: str  # the NumPy operator's name (poolgrad.kinds, else poolgrad.ops)
    settings: str  # what the table shows after the name
    args: tuple
    reference: Callable  # plain PyTorch, (x, draws, *parameters) -> y: the same function
    kwargs: dict = field(default_factory=dict)
    params: Callable | None = None  # (channels, rng, dtype) -> the parameters' arrays
    draws: Callable | None = None  # random kinds: (x, seed, like) -> the reference's draws
    kornia: Callable | None = None  # (the kornia module) -> its layer
    kornia_differs: str | None = None  # how kornia's layer's function differs, if it does
    compiled_differs: str | None = None  # how torch.compile's result differs, if it does
    non_negative: bool = False  # x after a ReLU (stochastic pooling's probabilities)
    torch_function: str | None = None  # poolgrad.torch's name, where it is not function's

    @property
    def name(self) -> str:
        return f"{self.function} {self.settings}"


# ----------------------------------------------------------------- the references


def _uniform(shape, seed, like, dtype):
    """Uniform draws in ``dtype``: fresh (``seed`` None), or those poolgrad's NumPy
    operators (``like="numpy"``: ``default_rng(seed).random``, float64) or poolgrad.torch
    (``like="torch"``: ``torch.rand`` from a generator seeded with ``seed``) make."""
    if like == "numpy":
        return torch.from_numpy(np.random.default_rng(seed).random(shape)).to(dtype)
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=generator, dtype=dtype)


def _stochastic_draws(x, seed=None, like=None):
    """One draw per 2x2 window, float64: fresh, or those both APIs count from the one
    seed they take from a generator seeded ``seed``."""
    shape = (*x.shape[:2], x.shape[2] // 2, x.shape[3] // 2)
    if like is None:
        return _uniform(shape, seed, like, torch.float64)
    if like == "numpy":
        counted = np.random.default_rng(seed).integers(2**63, dtype=np.uint64)
    else:
        counted = torch.randint(2**63 - 1, (1,), generator=torch.Generator().manual_seed(
            seed), dtype=torch.int64).item()
    return torch.from_numpy(counted_draws(int(counted), shape))


def _fractional_draws(x, seed=None, like=None):
    """The samples that place each plane's windows: PyTorch's ``_random_samples``,
    ``(N, C, 2)`` in x's dtype, as both APIs draw them."""
    return _uniform((*x.shape[:2], 2), seed, like, x.dtype)


def _windows(x, kernel):
    """``(N, C, H_out, W_out, kernel ** 2)``: each window's taps, row-major (stride the
    kernel, no padding)."""
    return x.unfold(2, kernel, kernel).unfold(3, kernel, kernel).flatten(-2)


def _blur_reference(x, draws, *, pre, padding_mode):
    """Zhang's anti-aliased pooling: the 2x2 max or mean at stride 1 (``pre``, if any),
    then the binomial filter ``[1, 2, 1] / 4`` (its outer product) at stride 2 on that
    map padded by 1 on each side, by reflection (``x[1]`` mirrors into ``x[-1]``) or
    with zeros."""
    if pre == "max":
        x = F.max_pool2d(x, 2, stride=1)
    elif pre == "avg":
        x = F.avg_pool2d(x, 2, stride=1)
    channels = x.shape[1]
    taps = x.new_tensor([0.25, 0.5, 0.25])
    weight = (taps[:, None] * taps).expand(channels, 1, 3, 3)
    if padding_mode == "zeros":
        return F.conv2d(x, weight, stride=2, padding=1, groups=channels)
    return F.conv2d(F.pad(x, (1, 1, 1, 1), mode=padding_mode), weight, stride=2,
                    groups=channels)


def _soft_reference(x, draws):
    """Each 2x2 window's average weighted by the softmax of its values (torch's softmax
    subtracts the maximum, as poolgrad does)."""
    taps = _windows(x, 2)
    return (torch.softmax(taps, -1) * taps).sum(-1)


def _stochastic_reference(x, draws):
    """Each 2x2 window's tap drawn with probability ``x_j / S``: the first whose running
    sum (row-major) exceeds ``u * S``, ``u`` the window's draw, taken in the draws'
    dtype. Where rounding lets none exceed it, the first to reach ``S``: that is the
    last positive tap, and in a window of zeros the first tap, poolgrad's fallbacks."""
    taps = _windows(x, 2)
    running = taps.detach().cumsum(-1)
    total = running[..., -1:]
    chosen = (running > draws.unsqueeze(-1) * total.to(draws.dtype)) | (running >= total)
    return taps.gather(-1, chosen.to(torch.uint8).argmax(-1, keepdim=True)).squeeze(-1)


def _stochastic_evaluation_reference(x, draws):
    """``sum(x^2) / sum(x)`` over each 2x2 window, 0 where the sum is 0."""
    total = F.avg_pool2d(x, 2)
    positive = total > 0
    return torch.where(positive, F.avg_pool2d(x * x, 2) / torch.where(positive, total, 1), 0)


def _fractional_reference(x, draws, *, kernel):
    return F.fractional_max_pool2d(x, kernel, output_ratio=(0.5, 0.5), _random_samples=draws)


def _gem_reference(x, draws, p=GEM_P, *, kernel):
    """Radenovic et al.'s formulation, ``avg_pool(clamp(x, eps)^p)^(1/p)``, over
    ``kernel`` windows or (None) the whole plane; ``p`` a number, or the learned
    parameter (a 0-d tensor). poolgrad scales each window by its maximum first (no
    overflow for large p): the same function, rounded otherwise."""
    return F.avg_pool2d(x.clamp(min=GEM_EPS).pow(p), kernel or tuple(x.shape[2:])).pow(1 / p)


def _gem_learned_p(channels, rng, dtype):
    """GeM's learned ``p`` (:data:`GEM_LEARNED_P`), a 0-d parameter."""
    return np.array(GEM_LEARNED_P, dtype),


def _lp_reference(x, draws):
    """PyTorch's own: ``(sum x^p)^(1/p)``, without ONNX's (and poolgrad's) absolute
    value, which an even p does not need."""
    return F.lp_pool2d(x, LP_P, 2)


def _mixed_reference(x, draws):
    return MIXED_ALPHA * F.max_pool2d(x, 2) + (1 - MIXED_ALPHA) * F.avg_pool2d(x, 2)


def _gated_reference(x, draws, gate):
    """Each 2x2 window's max and mean blended by ``sigmoid(gate . window)``, the gate's
    dot products as a depthwise convolution (one gate shared by every channel)."""
    channels = x.shape[1]
    share = torch.sigmoid(F.conv2d(x, gate.expand(channels, 1, 2, 2), stride=2,
                                   groups=channels))
    return share * F.max_pool2d(x, 2) + (1 - share) * F.avg_pool2d(x, 2)


def _attention_reference(x, draws, queries, key_weight):
    """One head: the softmax over positions of ``q . (W_k x) / sqrt(C)`` averages the
    features. The scores are taken as ``(q W_k) x``, the same function with C times
    fewer multiplications than forming the keys ``W_k x`` (poolgrad forms them)."""
    features = x.flatten(2)  # (N, C, L)
    scores = (queries @ key_weight) @ features / math.sqrt(x.shape[1])  # (N, M, L)
    return torch.softmax(scores, -1) @ features.transpose(1, 2)  # (N, M, C)


def _aps_reference(x, draws):
    """Adaptive polyphase sampling at stride 2 (even sizes): the four components as a
    view, each example's squared norms summed in float64 (as poolgrad sums them), the
    first largest taken by index."""
    n, c, h, w = x.shape
    components = x.reshape(n, c, h // 2, 2, w // 2, 2).permute(0, 3, 5, 1, 2, 4).flatten(1, 2)
    norms = components.detach().square().sum((2, 3, 4), dtype=torch.float64)
    return components[torch.arange(n, device=x.device), norms.argmax(1)]


def _max_aps_reference(x, draws):
    """The 2x2 max at stride 1 with circular padding (one after, as padding="same"
    splits it), then :func:`_aps_reference`."""
    return _aps_reference(F.max_pool2d(F.pad(x, (0, 1, 0, 1), mode="circular"), 2, 1), draws)


def _gate(channels, rng, dtype):
    return (0.5 * rng.standard_normal((2, 2))).astype(dtype),


def _attention_parameters(channels, rng, dtype):
    """One query and a key projection scaled so that the scores are about N(0, 1): the
    softmax neither uniform nor one-hot."""
    queries = rng.standard_normal((1, channels))
    key_weight = rng.standard_normal((channels, channels)) / math.sqrt(channels)
    return queries.astype(dtype), key_weight.astype(dtype)


def _blur(pre, padding_mode="reflect"):
    return functools.partial(_blur_reference, pre=pre, padding_mode=padding_mode)


def _kornia_blur(kornia):
    return kornia.filters.BlurPool2D(3, 2)


def _kornia_max_blur(kornia):
    return kornia.filters.MaxBlurPool2D(3, 2, max_pool_size=2)


KINDS = (
    Kind("blur_pool", "3-tap/2", (2, 3), _blur(None), kornia=_kornia_blur,
         kornia_differs=KORNIA_PADS_ZEROS),
    Kind("blur_pool", "3-tap/2 zeros", (2, 3, "zeros"), _blur(None, "zeros"),
         kornia=_kornia_blur),
    Kind("max_blur_pool", "2x2 3-tap/2", (2, 2, 3), _blur("max"), kornia=_kornia_max_blur,
         kornia_differs=KORNIA_PADS_ZEROS),
    Kind("max_blur_pool", "2x2 3-tap/2 zeros", (2, 2, 3, "zeros"), _blur("max", "zeros"),
         kornia=_kornia_max_blur),
    Kind("avg_blur_pool", "2x2 3-tap/2", (2, 2, 3), _blur("avg")),
    Kind("soft_pool", "2x2", (2,), _soft_reference),
    Kind("stochastic_pool", "2x2 training", (2,), _stochastic_reference,
         draws=_stochastic_draws, non_negative=True),
    Kind("stochastic_pool", "2x2 evaluation", (2,), _stochastic_evaluation_reference,
         {"training": False}, non_negative=True),
    # k2 ratio 0.5 of 56: every plane's windows form the 2x2/2 grid, max pooling's; k3:
    # windows placed apart in every plane, the fractional kernels
    Kind("fractional_max_pool", "k2 ratio 0.5", (2,),
         functools.partial(_fractional_reference, kernel=2), {"output_ratio": 0.5},
         draws=_fractional_draws),
    Kind("fractional_max_pool", "k3 ratio 0.5", (3,),
         functools.partial(_fractional_reference, kernel=3), {"output_ratio": 0.5},
         draws=_fractional_draws, compiled_differs=COMPILED_FRACTIONAL_WINDOWS),
    Kind("gem_pool", "global p3", (GEM_P,), functools.partial(_gem_reference, kernel=None),
         {"eps": GEM_EPS}),
    Kind("gem_pool", "2x2 p3", (GEM_P, 2), functools.partial(_gem_reference, kernel=2),
         {"eps": GEM_EPS}),
    Kind("gem_pool", "2x2 learned p", (2,), functools.partial(_gem_reference, kernel=2),
         {"eps": GEM_EPS}, params=_gem_learned_p),
    Kind("lp_pool", "2x2 p2", (LP_P, 2), _lp_reference, torch_function="lp_pool2d"),
    Kind("mixed_pool", "2x2 alpha 0.5", (2, None, 0, MIXED_ALPHA), _mixed_reference),
    Kind("gated_pool", "2x2", (2,), _gated_reference, params=_gate),
    Kind("attention_pool", "global 1 query", (), _attention_reference,
         params=_attention_parameters),
    Kind("aps_pool", "stride 2", (2,), _aps_reference),
    Kind("max_aps_pool", "2x2/2", (2, 2), _max_aps_reference),
)


# --------------------------------------------------------------------- the calls


def numpy_call(kind: Kind, params, rng):
    """``(operator, args, kwargs)``: poolgrad's NumPy call of ``kind`` on x, for the
    operator and for :func:`poolgrad.vjp`; ``rng`` (a seed or a Generator) where it
    draws."""
    kwargs = {**kind.kwargs, "rng": rng} if kind.draws else kind.kwargs
    operator = getattr(numpy_kinds, kind.function, None) or getattr(ops, kind.function)
    # a 0-d parameter (GeM's p) is a number to the NumPy API, a tensor to the others
    params = tuple(p.item() if np.ndim(p) == 0 else p for p in params)
    return operator, (*params, *kind.args), kwargs


def front_end_call(kind: Kind, front_end, params, generator):
    """poolgrad.torch's call of ``kind``, a function of x; ``generator`` (a seed or a
    torch.Generator) where it draws."""
    function = getattr(front_end, kind.torch_function or kind.function)
    kwargs = {**kind.kwargs, "generator": generator} if kind.draws else kind.kwargs
    return lambda t: function(t, *params, *kind.args, **kwargs)


def reference_call(kind: Kind, params, draws=None, function=None):
    """The reference (or ``function``, its compiled form) as a function of x: given
    ``draws``, or drawing fresh ones at every call as poolgrad does."""
    function = function or kind.reference
    if kind.draws is None or draws is not None:
        return lambda t: function(t, draws, *params)
    return lambda t: function(t, kind.draws(t), *params)


def _numpy_passes(kind, x, params, dy, rng) -> dict:
    op, args, kwargs = numpy_call(kind, params, rng)

    def forward_backward():  # dx alone: the references' parameters need no gradient
        _, pullback = ops.vjp(op, x, *args, **kwargs)
        return pullback(dy, params=False)

    return {"forward": lambda: op(x, *args, **kwargs), "forward+backward": forward_backward}


def check_agree(kind: Kind, x: np.ndarray, params, front_end, kornia_layer=None,
                tolerance=TOLERANCE, layout: str = "NCHW") -> None:
    """A benchmark of a wrong result measures nothing: poolgrad's NumPy operator,
    poolgrad.torch and (where it computes the same function) kornia's layer must give
    the reference's values and input gradient for ``dy`` = ones on ``x``, the random
    kinds with the draws each of poolgrad's APIs makes from one seed. Raises an
    AssertionError naming the implementation, the kind and the pass."""
    xt = suite.torch_input(x, layout, torch)
    tensors = tuple(torch.from_numpy(p) for p in params)
    op, args, kwargs = numpy_call(kind, params, SEED)
    y, pullback = ops.vjp(op, x, *args, **kwargs)
    gradient = pullback(np.ones_like(y), params=False)
    ours = front_end_call(kind, front_end, tensors, SEED)
    implementations = {  # name: (whose draws it makes, its two passes)
        "poolgrad's NumPy API": ("numpy", {"forward": lambda: torch.from_numpy(y),
                                           "forward+backward": lambda: torch.from_numpy(
                                               gradient)}),
        "poolgrad.torch": ("torch", torch_api.passes(ours, xt, _ones_as_output(ours, xt),
                                                     torch))}
    if kornia_layer is not None and kind.kornia_differs is None:
        implementations["kornia"] = (None, torch_api.passes(
            kornia_layer, xt, _ones_as_output(kornia_layer, xt), torch))
    for name, (like, passes) in implementations.items():
        draws = kind.draws(xt, SEED, like) if kind.draws else None
        reference = reference_call(kind, tensors, draws)
        expected = torch_api.passes(reference, xt, _ones_as_output(reference, xt), torch)
        for pass_name in PASSES:
            _assert_close(passes[pass_name](), expected[pass_name](), tolerance,
                          f"{name} and the plain PyTorch reference disagree on {kind.name} "
                          f"{layout}, {pass_name}")


def _assert_close(actual, expected, tolerance, what: str) -> None:
    try:
        torch.testing.assert_close(actual, expected, **tolerance)
    except AssertionError as error:
        raise AssertionError(f"{what}: {error}") from None


def _compile(kind, params, xt, dyt, pass_name):
    """The compiled reference for one pass, called once so that it compiles, and
    checked against the eager reference on the same draws; returns it (drawing fresh
    ones at every call, as the eager one) and the seconds compiling took."""
    compiled = suite.compile_static(lambda t, u: kind.reference(t, u, *params), torch)
    draws = kind.draws(xt) if kind.draws else None  # in the dtype it is timed with
    run = torch_api.passes(reference_call(kind, (), draws, compiled), xt, dyt,
                            torch)[pass_name]
    start = time.perf_counter()
    with suite.quiet_compile():
        result = run()  # forward+backward: also compiles the backward graph
    seconds = time.perf_counter() - start
    expected = torch_api.passes(reference_call(kind, params, draws), xt, dyt, torch)
    if kind.compiled_differs is None:  # else timed, marked, and no reference
        _assert_close(result, expected[pass_name](), TOLERANCE,
                      f"compiled and eager PyTorch disagree on {kind.name}, {pass_name}")
    timed = reference_call(kind, (), function=compiled)
    return torch_api.passes(timed, xt, dyt, torch)[pass_name], seconds


# ------------------------------------------------------------------------- timing


def _ones_as_output(function, xt):
    """Ones shaped and stored as ``function(xt)``'s output."""
    with torch.no_grad():
        return torch.ones_like(function(xt))


def _time_kind(kind, base, front_end, kornia, repeats, compile_layouts, progress):
    """The rows of one kind: both layouts, both passes, every implementation timed in
    turn."""
    rows = []
    x0 = np.maximum(base, 0) if kind.non_negative else base
    params = kind.params(base.shape[1], np.random.default_rng(1), base.dtype) if (
        kind.params) else ()
    tensors = tuple(torch.from_numpy(p) for p in params)
    layer = kind.kornia(kornia) if kind.kornia and kornia else None
    for layout in suite.LAYOUTS:
        x = x0 if layout == "NCHW" else suite.channels_last(x0)
        if progress:
            progress(f"{kind.name} {layout}: checking against the reference")
        check_agree(kind, x, params, front_end, layer, layout=layout)
        xt = suite.torch_input(x, layout, torch)
        # Each contender's dy is stored as its own y, as autograd's ones would be: a dy
        # stored otherwise would cost it a layout copy that the others do not pay (the
        # references' gathers return NCHW outputs for channels-last inputs, poolgrad's
        # ops channels-last ones)
        op, args, kwargs = numpy_call(kind, params, np.random.default_rng(3))
        dy = np.ones_like(op(x, *args, **kwargs))
        ours = front_end_call(kind, front_end, tensors, torch.Generator().manual_seed(2))
        eager = reference_call(kind, tensors)
        dyt = _ones_as_output(eager, xt)
        implementations = {
            "numpy": _numpy_passes(kind, x, params, dy, np.random.default_rng(2)),
            "poolgrad.torch": torch_api.passes(ours, xt, _ones_as_output(ours, xt), torch),
            "eager": torch_api.passes(eager, xt, dyt, torch)}
        if layer is not None:
            implementations["kornia"] = torch_api.passes(layer, xt, _ones_as_output(layer, xt),
                                                         torch)
        for pass_name in PASSES:
            if progress:
                progress(f"{kind.name} {layout} {pass_name}")
            contenders = {name: passes[pass_name] for name, passes in implementations.items()}
            compile_seconds = None
            if layout in compile_layouts:
                contenders["compiled"], compile_seconds = _compile(kind, tensors, xt, dyt,
                                                                   pass_name)
            seconds = timing.median_seconds(contenders, repeats)
            rows.append(_row(kind, layout, pass_name, seconds, compile_seconds))
    return rows


def _row(kind, layout, pass_name, seconds, compile_seconds) -> dict:
    ms = {name: s * 1e3 for name, s in seconds.items()}
    kornia_timed = "kornia" in ms
    references = {name: ms[name] for name in REFERENCES if name in ms
                  and (name != "kornia" or kind.kornia_differs is None)
                  and (name != "compiled" or kind.compiled_differs is None)}
    best = min(references, key=references.get)
    return {"kind": kind.function, "settings": kind.settings, "layout": layout,
            "pass": pass_name, "numpy_ms": ms["numpy"],
            "poolgrad_torch_ms": ms["poolgrad.torch"], "eager_ms": ms["eager"],
            "compiled_ms": ms.get("compiled"), "kornia_ms": ms.get("kornia"),
            "kornia_differs": kind.kornia_differs if kornia_timed else None,
            "compiled_differs": kind.compiled_differs if "compiled" in ms else None,
            "compile_s": compile_seconds, "best_reference": best,
            "best_reference_ms": references[best],
            "speedup_numpy": references[best] / ms["numpy"],
            "speedup_torch": references[best] / ms["poolgrad.torch"],
            "torch_overhead": ms["poolgrad.torch"] / ms["numpy"] - 1}


def _import_kornia():
    try:
        import kornia
    except ImportError:  # its column stays empty
        return None
    return kornia


def run(quick: bool = False, repeats: int | None = None, threads: int | None = None,
        kinds: tuple[Kind, ...] = KINDS, progress=None) -> dict:
    """Time every kind through both of poolgrad's APIs and the references; returns the
    JSON-ready result."""
    if torch is None:
        raise ValueError("poolgrad bench --kinds needs PyTorch: pip install torch (or pip "
                         "install 'poolgrad[torch]')")
    front_end = torch_api.import_front_end()
    kornia = _import_kornia()
    repeats = repeats or (1 if quick else 5)
    shape = QUICK_SHAPE if quick else SHAPE
    with timing.thread_count(threads, torch) as threads:
        bandwidth = suite.copy_bandwidth(2**20 if quick else 256 * 2**20, repeats)
        base = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
        rows = []
        for index, kind in enumerate(kinds):
            # compiling takes seconds a variant: quick mode compiles the first kinds in
            # NCHW, so that the path runs
            compiled = ("NCHW",) if index < _QUICK_COMPILED_KINDS else ()
            rows += _time_kind(kind, base, front_end, kornia, repeats,
                               compiled if quick else suite.LAYOUTS, progress)
    machine = suite.machine_info(threads, bandwidth)
    machine["torch"] = torch.__version__
    machine["kornia"] = kornia.__version__ if kornia else None
    return {"machine": machine, "mode": "kinds", "quick": quick, "repeats": repeats,
            "shape": list(shape), "tolerance": TOLERANCE,
            "kinds": [{"kind": kind.function, "settings": kind.settings,
                       "kornia_differs": kind.kornia_differs} for kind in kinds],
            "rows": rows, "summary": summarize(rows)}


def summarize(rows: list[dict]) -> dict:
    """Per pass and API, the geometric-mean speedup over each row's best reference, and
    the rows where poolgrad is slower than it."""
    summary = {}
    for pass_name in PASSES:
        these = [row for row in rows if row["pass"] == pass_name]
        key = pass_name.replace("+", "_")
        for api in ("numpy", "torch"):
            column = f"speedup_{api}"
            summary[f"{api}_{key}_geomean_speedup"] = suite.geometric_mean(
                row[column] for row in these)
            summary[f"{api}_{key}_rows_slower"] = [
                f"{row['kind']} {row['settings']} {row['layout']}" for row in these
                if row[column] < 1]
    return summary


# -------------------------------------------------------------------------- table


def _ms(value, marked: bool = False) -> str:
    if value is None:
        return f"{'-':>8}"
    return f"{value:7.2f}*" if marked else f"{value:8.2f}"


def format_table(result: dict) -> str:
    lines = [suite.header(result, "poolgrad bench --kinds"),
             f"layer {'x'.join(map(str, result['shape']))}; ms per call"]
    for pass_name in PASSES:
        lines += ["", f"{pass_name}:",
                  f"{'kind':<32} {'layout':<13} {'NumPy':>8} {'torch':>8} {'eager':>8} "
                  f"{'compiled':>8} {'kornia':>8} {'best':>8} {'vs NumPy':>8} "
                  f"{'vs torch':>8} {'torch/NumPy':>11}"]
        for row in result["rows"]:
            if row["pass"] != pass_name:
                continue
            lines.append(
                f"{row['kind'] + ' ' + row['settings']:<32} {row['layout']:<13} "
                f"{_ms(row['numpy_ms'])} {_ms(row['poolgrad_torch_ms'])} "
                f"{_ms(row['eager_ms'])} "
                f"{_ms(row['compiled_ms'], row['compiled_differs'] is not None)} "
                f"{_ms(row['kornia_ms'], row['kornia_differs'] is not None)} "
                f"{row['best_reference']:>8} {row['speedup_numpy']:7.2f}x "
                f"{row['speedup_torch']:7.2f}x {row['torch_overhead']:+11.0%}")
    lines += [
        "NumPy: poolgrad's NumPy operator; torch: poolgrad.torch; eager, compiled: a plain "
        "PyTorch\nformulation of the same function, eager and torch.compile'd; kornia: its "
        "layer. best: the\nfastest reference in the row's layout; vs NumPy, vs torch: its "
        "time over poolgrad's (above\n1x: poolgrad is faster); torch/NumPy: poolgrad.torch's "
        "time against the NumPy API's."]
    differs = sorted({row["kornia_differs"] for row in result["rows"]
                      if row["kornia_differs"] is not None})
    lines += [f"*: {note}: another function, timed but no\n"
              f"   reference; the 'zeros' rows give poolgrad kornia's padding" for note in differs]
    lines += sorted({f"*: {row['compiled_differs']}: timed, no reference" for row in
                     result["rows"] if row["compiled_differs"] is not None})
    if result["quick"]:  # no speed verdict from shapes this small
        return "\n".join(lines + ["", suite.QUICK_NOTE])
    summary = result["summary"]
    lines.append("")
    for pass_name in PASSES:
        key = pass_name.replace("+", "_")
        count = sum(row["pass"] == pass_name for row in result["rows"])
        if not count:
            continue
        for api, label in (("numpy", "poolgrad's NumPy API"), ("torch", "poolgrad.torch")):
            slower = summary[f"{api}_{key}_rows_slower"]
            lines.append(f"{label}, {pass_name}: geometric-mean speedup over the best "
                         f"reference {summary[f'{api}_{key}_geomean_speedup']:.2f}x; "
                         f"slower in {len(slower)} of {count} rows"
                         + "".join(f"\n  {name}" for name in slower))
    return "\n".join(lines)
