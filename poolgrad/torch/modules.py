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

from torch import nn

from . import functional as F

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


def replace_pooling(model: nn.Module) -> int:
    """Swap every ``torch.nn`` pooling module inside ``model`` (``MaxPool*``, ``AvgPool*``,
    ``LPPool*``, ``AdaptiveMaxPool*``, ``AdaptiveAvgPool*``, ``MaxUnpool*``), in place, for
    poolgrad's module with the same settings, and return how many were replaced.

    The model computes the same function, except that ``LPPool`` now takes ``abs(x)``
    (the same on non-negative inputs, such as after a ReLU). A ``model`` that is itself a
    pooling module cannot be replaced in place: wrap it, or build poolgrad's module.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.MaxPool2d(2))
        >>> replace_pooling(model)
        1
        >>> type(model[2]).__module__
        'poolgrad.torch.modules'
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"replace_pooling takes a torch.nn.Module, got {type(model).__name__}")
    replaced = 0
    for parent in model.modules():
        for name, child in list(parent.named_children()):
            if type(child) in _REPLACEMENTS:
                setattr(parent, name, _rebuilt(child).train(child.training))
                replaced += 1
    return replaced
