"""``torch.nn``'s pooling modules on poolgrad's operators, and :func:`replace_pooling`.

Each module subclasses its ``torch.nn`` namesake, so it has the same constructor and
attributes, no parameters or buffers, and passes ``isinstance`` checks written for
torch's; only ``forward`` changes, to :mod:`poolgrad.torch.functional`. Its ``repr`` is
torch's with the name ``poolgrad.MaxPool2d`` and so on, so that ``print(model)`` after
:func:`replace_pooling` shows which modules are poolgrad's.
poolgrad's extras (``ties``, ``dilation`` for average and Lp, padding for Lp) are
keyword-only constructor arguments.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from .. import geometry
from . import functional as F
from . import kinds, polyphase

__all__ = [f"{kind}{n}d" for kind in ("MaxPool", "AvgPool", "LPPool", "AdaptiveMaxPool",
                                      "AdaptiveAvgPool", "MaxUnpool") for n in (1, 2, 3)]
__all__.append("replace_pooling")


def _make_max_pool(ndim):
    base = getattr(nn, f"MaxPool{ndim}d")
    function = getattr(F, f"max_pool{ndim}d")

    class MaxPool(base):
        __doc__ = f"``torch.nn.MaxPool{ndim}d`` on poolgrad (``ties``: see max_pool{ndim}d)."

        def __init__(self, kernel_size, stride=None, padding=0, dilation=1,
                     return_indices=False, ceil_mode=False, *, ties="first"):
            super().__init__(kernel_size, stride, padding, dilation, return_indices, ceil_mode)
            self.ties = ties

        def forward(self, input):
            return function(input, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode, self.return_indices, ties=self.ties)

        def extra_repr(self):
            ties = "" if self.ties == "first" else f", ties={self.ties!r}"
            return super().extra_repr() + ties
    return _named(MaxPool, f"MaxPool{ndim}d")


def _make_avg_pool(ndim):
    base = getattr(nn, f"AvgPool{ndim}d")
    function = getattr(F, f"avg_pool{ndim}d")

    class AvgPool(base):
        __doc__ = f"``torch.nn.AvgPool{ndim}d`` on poolgrad (``dilation``: a poolgrad extra)."

        def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                     count_include_pad=True, divisor_override=None, *, dilation=1):
            if ndim == 1:  # torch's AvgPool1d has no divisor_override
                super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)
                self.divisor_override = divisor_override
            else:
                super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad,
                                 divisor_override)
            self.dilation = dilation

        def forward(self, input):
            return function(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override,
                            dilation=self.dilation)
    return _named(AvgPool, f"AvgPool{ndim}d")


def _make_lp_pool(ndim):
    base = getattr(nn, f"LPPool{ndim}d")
    function = getattr(F, f"lp_pool{ndim}d")

    class LPPool(base):
        __doc__ = (f"``torch.nn.LPPool{ndim}d`` on poolgrad: ``abs(x)`` is taken (ONNX "
                   f"LpPool); ``padding`` and ``dilation`` are poolgrad extras.")

        def __init__(self, norm_type, kernel_size, stride=None, ceil_mode=False, *,
                     padding=0, dilation=1):
            super().__init__(norm_type, kernel_size, stride, ceil_mode)
            self.padding, self.dilation = padding, dilation

        def forward(self, input):
            return function(input, self.norm_type, self.kernel_size, self.stride,
                            self.ceil_mode, padding=self.padding, dilation=self.dilation)
    return _named(LPPool, f"LPPool{ndim}d")


def _make_adaptive_max_pool(ndim):
    base = getattr(nn, f"AdaptiveMaxPool{ndim}d")
    function = getattr(F, f"adaptive_max_pool{ndim}d")

    class AdaptiveMaxPool(base):
        __doc__ = f"``torch.nn.AdaptiveMaxPool{ndim}d`` on poolgrad."

        def forward(self, input):
            return function(input, self.output_size, self.return_indices)
    return _named(AdaptiveMaxPool, f"AdaptiveMaxPool{ndim}d")


def _make_adaptive_avg_pool(ndim):
    base = getattr(nn, f"AdaptiveAvgPool{ndim}d")
    function = getattr(F, f"adaptive_avg_pool{ndim}d")

    class AdaptiveAvgPool(base):
        __doc__ = f"``torch.nn.AdaptiveAvgPool{ndim}d`` on poolgrad."

        def forward(self, input):
            return function(input, self.output_size)
    return _named(AdaptiveAvgPool, f"AdaptiveAvgPool{ndim}d")


def _make_max_unpool(ndim):
    base = getattr(nn, f"MaxUnpool{ndim}d")
    function = getattr(F, f"max_unpool{ndim}d")

    class MaxUnpool(base):
        __doc__ = f"``torch.nn.MaxUnpool{ndim}d`` on poolgrad."

        def forward(self, input, indices, output_size=None):
            return function(input, indices, self.kernel_size, self.stride, self.padding,
                            output_size)
    return _named(MaxUnpool, f"MaxUnpool{ndim}d")


def _named(cls, name):
    cls.__name__ = cls.__qualname__ = name
    cls.__module__ = __name__
    cls._get_name = lambda self: f"poolgrad.{name}"  # the name repr and print(model) show
    return cls


MaxPool1d, MaxPool2d, MaxPool3d = (_make_max_pool(n) for n in (1, 2, 3))
AvgPool1d, AvgPool2d, AvgPool3d = (_make_avg_pool(n) for n in (1, 2, 3))
LPPool1d, LPPool2d, LPPool3d = (_make_lp_pool(n) for n in (1, 2, 3))
AdaptiveMaxPool1d, AdaptiveMaxPool2d, AdaptiveMaxPool3d = (
    _make_adaptive_max_pool(n) for n in (1, 2, 3))
AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d = (
    _make_adaptive_avg_pool(n) for n in (1, 2, 3))
MaxUnpool1d, MaxUnpool2d, MaxUnpool3d = (_make_max_unpool(n) for n in (1, 2, 3))

# torch.nn class -> poolgrad class, and how to rebuild one from the other's attributes
_REPLACEMENTS = {
    getattr(nn, name): globals()[name] for name in __all__ if name != "replace_pooling"
}


def _rebuilt(module: nn.Module) -> nn.Module:
    cls = _REPLACEMENTS[type(module)]
    if isinstance(module, nn.modules.pooling._MaxPoolNd):
        return cls(module.kernel_size, module.stride, module.padding, module.dilation,
                   module.return_indices, module.ceil_mode)
    if isinstance(module, nn.modules.pooling._AvgPoolNd):
        return cls(module.kernel_size, module.stride, module.padding, module.ceil_mode,
                   module.count_include_pad, getattr(module, "divisor_override", None))
    if isinstance(module, nn.modules.pooling._LPPoolNd):
        return cls(module.norm_type, module.kernel_size, module.stride, module.ceil_mode)
    if isinstance(module, nn.modules.pooling._AdaptiveMaxPoolNd):
        return cls(module.output_size, module.return_indices)
    if isinstance(module, nn.modules.pooling._AdaptiveAvgPoolNd):
        return cls(module.output_size)
    return cls(module.kernel_size, module.stride, module.padding)  # MaxUnpool


def _spatial_dims(module: nn.Module) -> int:
    """1, 2 or 3: the dims of a ``torch.nn`` pooling module (from its class's name)."""
    for cls in type(module).__mro__:
        if cls.__name__[-2:] in ("1d", "2d", "3d") and "Pool" in cls.__name__:
            return int(cls.__name__[-2])
    raise ValueError(f"{type(module).__name__} is not a torch.nn pooling module")


def _settings(module: nn.Module, kind: str) -> tuple:
    """``(kernel_size, stride, padding)`` of a sliding pooling ``module`` that becomes
    ``kind``; a ValueError naming each setting that changes the windows or the outputs
    and that the kind has no equivalent for. (An average's divisor settings are the
    average's own: the kind replaces them.)"""
    if not isinstance(module, (nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd)):
        raise ValueError(f"{module!r} cannot become {kind}: {kind} replaces max or average "
                         f"pooling")
    ndim = _spatial_dims(module)
    unsupported = {
        "ceil_mode": getattr(module, "ceil_mode", False),
        "return_indices": getattr(module, "return_indices", False),
        "dilation": geometry.per_dim(getattr(module, "dilation", 1), ndim,
                                     "dilation") != (1,) * ndim,
    }
    found = [name for name, used in unsupported.items() if used]
    if found:
        raise ValueError(f"{module!r} cannot become {kind}: {kind} has no {', '.join(found)}")
    return module.kernel_size, module.stride, module.padding


def _no_padding(padding) -> bool:
    return padding in (0, None) or (isinstance(padding, tuple) and not any(padding))


def _blurred(module: nn.Module, kind: str) -> nn.Module:
    """``max_blur`` or ``avg_blur``: the pool at stride 1, then the blur at the stride
    (Zhang 2019). Unpadded, that is the fused MaxBlurPool or AvgBlurPool; padded (a
    ResNet stem's ``MaxPool2d(3, 2, 1)``), the pool keeps its padding, so the output
    keeps its size, as antialiased-cnns and timm's ``aa_layer`` do."""
    ndim = _spatial_dims(module)
    kernel, stride, padding = _settings(module, kind)
    if _no_padding(padding):
        fused = kinds.MaxBlurPool if kind == "max_blur" else kinds.AvgBlurPool
        return fused(kernel_size=kernel, stride=stride, spatial_dims=ndim)
    if kind == "max_blur":
        pool = _REPLACEMENTS[getattr(nn, f"MaxPool{ndim}d")](kernel, 1, padding)
    else:
        pool = _REPLACEMENTS[getattr(nn, f"AvgPool{ndim}d")](
            kernel, 1, padding, count_include_pad=getattr(module, "count_include_pad", True))
    return nn.Sequential(pool, kinds.BlurPool(stride=stride, spatial_dims=ndim))


def _gem(module: nn.Module) -> nn.Module:
    ndim = _spatial_dims(module)
    if isinstance(module, nn.modules.pooling._AdaptiveAvgPoolNd):
        size = module.output_size
        size = tuple(size) if isinstance(size, (tuple, list)) else (size,) * ndim
        if size != (1,) * ndim:
            raise ValueError(f"{module!r} cannot become gem: GeM is global or sliding, and "
                             f"this pools to {size}")
        return kinds.GeMPool(spatial_dims=ndim)
    kernel, stride, padding = _settings(module, "gem")
    if not _no_padding(padding):
        raise ValueError(f"{module!r} cannot become gem: GeM has no padding")
    return kinds.GeMPool(kernel_size=kernel, stride=stride, spatial_dims=ndim)


def _aps(module: nn.Module, blur) -> nn.Module:
    """A max pooling as APS's: its max at stride 1 (circular), then adaptive polyphase
    sampling at its stride. The output is ``ceil(L / stride)`` long, as the module's is
    where its padding is ``(kernel_size - 1) // 2`` or the window equals the stride on a
    multiple of it (a ValueError otherwise names the padding)."""
    name = "aps" if blur is None else "aps_blur"
    kernel, stride, padding = _settings(module, name)
    ndim = _spatial_dims(module)
    kernel, padding = geometry.per_dim(kernel, ndim, "kernel_size"), geometry.per_dim(
        padding, ndim, "padding", minimum=0)
    stride = geometry.per_dim(stride if stride is not None else kernel, ndim, "stride")
    same = all(p == (k - 1) // 2 or (p == 0 and k == s)
               for k, s, p in zip(kernel, stride, padding, strict=True))
    if not same:
        raise ValueError(f"{module!r} cannot become {name}: APS pads circularly to "
                         f"ceil(L / stride), which its padding {padding} does not match")
    return polyphase.MaxAPSPool(kernel, stride, blur, spatial_dims=ndim)


def _windowed(cls, kind: str):
    """The factory of a kind that takes a pooling's window: ``cls(kernel_size, stride,
    padding)`` from the module's, as many spatial dims as it has."""
    return lambda module: cls(*_settings(module, kind), spatial_dims=_spatial_dims(module))


# target name -> (the torch.nn pooling it replaces, its factory from such a module)
_SLIDING = (nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd)
_TARGETS = {
    "max_blur": ((nn.modules.pooling._MaxPoolNd,), lambda m: _blurred(m, "max_blur")),
    "avg_blur": ((nn.modules.pooling._AvgPoolNd,), lambda m: _blurred(m, "avg_blur")),
    "soft": (_SLIDING, _windowed(kinds.SoftPool, "soft")),
    "mixed": (_SLIDING, _windowed(kinds.MixedPool, "mixed")),
    "gated": (_SLIDING, _windowed(kinds.GatedPool, "gated")),
    "stochastic": ((nn.modules.pooling._MaxPoolNd,),
                   _windowed(kinds.StochasticPool, "stochastic")),
    "gem": ((nn.modules.pooling._AdaptiveAvgPoolNd,), _gem),
    "aps": ((nn.modules.pooling._MaxPoolNd,), lambda m: _aps(m, None)),
    "aps_blur": ((nn.modules.pooling._MaxPoolNd,), lambda m: _aps(m, 3)),
}
_TARGET_OF_CLASS = {kinds.MaxBlurPool: "max_blur", kinds.AvgBlurPool: "avg_blur",
                    kinds.SoftPool: "soft", kinds.MixedPool: "mixed", kinds.GatedPool: "gated",
                    kinds.StochasticPool: "stochastic", kinds.GeMPool: "gem",
                    polyphase.MaxAPSPool: "aps"}


def _subsamples(module: nn.Module) -> bool:
    """Whether a pooling module has a stride above 1 somewhere: the blur kinds replace
    only those (a stride-1 pool has nothing to anti-alias, and the stride-1 max a padded
    ``max_blur`` swap leaves stays as it is)."""
    stride = module.stride if module.stride is not None else module.kernel_size
    return any(s > 1 for s in (stride if isinstance(stride, (tuple, list)) else (stride,)))


def _applies(name: str):
    return (_subsamples if name in ("max_blur", "avg_blur", "aps", "aps_blur")
            else lambda module: True)


def _rules(to) -> list:
    """``to`` as ``[(module types, factory, which of them)]``, the first match winning."""
    if to is None:
        return [(tuple(_REPLACEMENTS), _rebuilt, lambda module: True)]
    if isinstance(to, str):
        if to not in _TARGETS:
            raise ValueError(f"replace_pooling: to must be one of {', '.join(_TARGETS)} or a "
                             f"mapping of torch.nn module types, got {to!r}")
        return [(*_TARGETS[to], _applies(to))]
    if not isinstance(to, Mapping):
        raise TypeError(f"replace_pooling: to must be None, a name or a mapping, got "
                        f"{type(to).__name__}")
    rules = []
    for source, target in to.items():
        if not (isinstance(source, type) and issubclass(source, nn.Module)):
            raise TypeError(f"replace_pooling: the keys of to must be torch.nn module "
                            f"types, got {source!r}")
        target = _TARGET_OF_CLASS.get(target, target)
        if isinstance(target, str):
            types, factory, applies = _rules(target)[0]
            rules.append(((source,), factory, applies))
        elif isinstance(target, type):  # a class it cannot build from the module's settings
            raise TypeError(f"replace_pooling: to[{source.__name__}] is the class "
                            f"{target.__name__}, which replace_pooling cannot build from a "
                            f"pooling module's settings; give a name ({', '.join(_TARGETS)}),"
                            f" one of their classes, or a factory such as "
                            f"lambda module: {target.__name__}(...)")
        elif callable(target):
            rules.append(((source,), target, lambda module: True))
        else:
            raise TypeError(f"replace_pooling: to[{source.__name__}] must be a name, a "
                            f"poolgrad module class or a factory, got {target!r}")
    return rules


def replace_pooling(model: nn.Module, to=None) -> int:
    """Swap pooling modules inside ``model``, in place, and return how many were
    replaced.

    With ``to=None``, every ``torch.nn`` pooling module (``MaxPool*``, ``AvgPool*``,
    ``LPPool*``, ``AdaptiveMaxPool*``, ``AdaptiveAvgPool*``, ``MaxUnpool*``) becomes
    poolgrad's module with the same settings, and the model computes the same function,
    except that ``LPPool`` now takes ``abs(x)`` (the same on non-negative inputs, such as
    after a ReLU).

    ``to`` swaps the kind instead:

    - a name: ``"max_blur"`` (every max pooling becomes anti-aliased: MaxBlurPool, or
      for a padded one its max at stride 1 and a BlurPool, so the sizes stay),
      ``"avg_blur"``, ``"soft"``, ``"mixed"``, ``"gated"`` (max and average pooling),
      ``"stochastic"`` (max pooling), ``"gem"`` (global average pooling), ``"aps"``
      and ``"aps_blur"`` (max pooling with a stride becomes :class:`MaxAPSPool`: the
      max at stride 1 with circular padding, without or with a 3-tap blur, then
      adaptive polyphase sampling; with circular convolutions and a global average
      head, the model is then invariant to circular shifts of its input);
    - a mapping from ``torch.nn`` module types to a name, a poolgrad kind's class
      (``pt.SoftPool``: built from the module's settings) or a factory called with the
      module, e.g. ``{nn.MaxPool2d: "max_blur", nn.AdaptiveAvgPool2d: lambda m: MyPool()}``.

    Other modules stay, and so do stride-1 pools for the blur and APS kinds (nothing to
    anti-alias or sample). A setting the kind has no equivalent for (``ceil_mode``, ``dilation``,
    ``return_indices``...) is a ValueError naming the module. Replaced modules keep the
    train or eval mode, and print as poolgrad's; a module used in two places becomes one
    new module used in both. The count is of modules replaced. A ``model`` that is
    itself a pooling module cannot be replaced in place: wrap it, or build poolgrad's.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.MaxPool2d(2))
        >>> replace_pooling(model)
        1
        >>> model[2]
        poolgrad.MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)
        >>> replace_pooling(model, to="max_blur")
        1
        >>> print(model[2])  # doctest: +ELLIPSIS
        poolgrad.MaxBlurPool(kernel_size=2, stride=2, ..., spatial_dims=2)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"replace_pooling takes a torch.nn.Module, got {type(model).__name__}")
    rules = _rules(to)
    exact = to is None  # like for like: torch's own classes only, not poolgrad's subclasses
    built = {}  # id(module) -> its replacement: a module used twice stays one module
    swaps = []  # every new module is built before any is set: an error changes nothing
    for parent in model.modules():
        for name, child in parent._modules.items():  # (named_children skips repeats)
            if child is None:
                continue
            if id(child) not in built:
                built[id(child)] = _replacement(child, rules, exact)
            if built[id(child)] is not None:
                swaps.append((parent, name, built[id(child)]))
    for parent, name, new in swaps:
        setattr(parent, name, new)
    return sum(new is not None for new in built.values())


def _replacement(module: nn.Module, rules, exact: bool) -> nn.Module | None:
    """The first matching rule's module for ``module`` (its train or eval mode), or
    None."""
    for types, factory, applies in rules:
        if (type(module) in types if exact else isinstance(module, types)) and applies(module):
            new = factory(module)
            if not isinstance(new, nn.Module):
                raise TypeError(f"replace_pooling: the factory for {type(module).__name__} "
                                f"returned {type(new).__name__}, not a torch.nn.Module")
            return new.train(module.training)
    return None
