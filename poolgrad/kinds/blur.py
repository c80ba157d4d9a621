"""Anti-aliased pooling (Zhang, "Making Convolutional Networks Shift-Invariant Again",
ICML 2019): blur with a binomial filter before subsampling.

``blur_pool`` blurs and subsamples; ``max_blur_pool`` and ``avg_blur_pool`` first take
the stride-1 max or mean over ``kernel_size`` windows (no padding), then blur and
subsample that map. The stride-1 map is never stored whole: each ``(n, c)`` plane is
reduced, blurred and subsampled in one worker's scratch (:mod:`poolgrad.kernels.blur`),
and a max keeps only each stride-1 window's winning tap (1 byte up to 256 taps).
"""

from __future__ import annotations

from .. import _inputs as inputs
from .. import autodiff, geometry
from ..engines import Pullback, blur_backward, blur_forward, blur_kernels
from ..kernels.dispatch import is_channels_last


def _filter_sizes(filter_size, ndim):
    sizes = geometry.per_dim(filter_size, ndim, "filter_size")
    if any(f > geometry.MAX_FILTER_SIZE for f in sizes):
        raise ValueError(f"filter_size must be 1 to {geometry.MAX_FILTER_SIZE} (a binomial "
                         f"filter) in every spatial dim, got {sizes}")
    return sizes


@inputs.memoized
def blur_arguments(shape, kernel_size, stride, filter_size, padding, padding_mode,
                   spatial_dims, where=""):
    """``(ndim, kernel, stride, filter sizes, padding pairs)`` of an anti-aliased pooling
    of an input of ``shape``, checked; the padding is the blur's, around the stride-1 map.
    ``where`` prefixes the errors of the input's shape."""
    per_dim_args = {"kernel_size": kernel_size, "stride": stride, "filter_size": filter_size}
    if padding is not None and not isinstance(padding, str):
        per_dim_args["padding"] = padding
    ndim = inputs.resolve_spatial_dims(shape, spatial_dims, where, **per_dim_args)
    kernel = geometry.per_dim(kernel_size, ndim, "kernel_size")
    stride = geometry.per_dim(stride, ndim, "stride")
    sizes = _filter_sizes(filter_size, ndim)
    if padding_mode not in geometry.BLUR_PADDING_MODES:
        raise ValueError(f"padding_mode must be one of "
                         f"{', '.join(geometry.BLUR_PADDING_MODES)}, got {padding_mode!r}")
    mapped = tuple(max(length - k + 1, 1)
                   for length, k in zip(shape[-ndim:], kernel, strict=True))
    if padding is None:  # Zhang's and kornia's: (f - 1) // 2 before, the rest after
        pads = tuple(((f - 1) // 2, f - 1 - (f - 1) // 2) for f in sizes)
    else:
        pads = geometry.resolve_padding(padding, mapped, sizes, stride, (1,) * ndim)
    return ndim, kernel, stride, sizes, pads


def _blur(x, pre, kernel_size, stride, filter_size, padding, padding_mode, spatial_dims, op,
          want_pullback):
    x = inputs.check_array(x, "x", floating=True)
    ndim, kernel, stride, sizes, pads = blur_arguments(x.shape, kernel_size, stride,
                                                       filter_size, padding, padding_mode,
                                                       spatial_dims)
    layout = inputs.Layout(x.shape, ndim)
    plan = geometry.blur_plan(layout.spatial, pre, kernel, sizes, stride, pads, padding_mode)

    xk = inputs.compute_view(x, layout)
    y, winners = blur_forward(xk, plan, record=want_pullback)
    result = y.astype(x.dtype, copy=False).reshape(layout.user_shape(plan.out_spatial))
    if not want_pullback:
        return result, None

    def backward(dy):  # dx in x's layout, as the core's pullbacks store it
        return blur_backward(layout.to_kernel(dy), winners, plan,
                             channels_last=is_channels_last(xk))
    saved = {"winners": winners} if pre == "max" else {}
    return result, Pullback(op, backward, result.shape, x.shape, x.dtype, saved,
                            blur_kernels(xk, plan))


_SHARED_ARGS = """stride: int or per dim, the subsampling step (default 2).
        filter_size: 1 to 7, or per dim: the binomial filter's taps (3: ``[1, 2, 1] / 4``;
            1: no blur). The N-d filter is the outer product of the per-dim ones.
        padding: None (default: ``(filter_size - 1) // 2`` before and the rest after,
            as Zhang's code and kornia pad), an int, per-dim ints or ``(before, after)``
            pairs, ``"valid"`` or ``"same"`` (output ``ceil(M / stride)``).
        padding_mode: how the padding is filled: ``"reflect"`` (default, Zhang's and
            timm's: ``x[1]`` mirrors into ``x[-1]``; padding must be shorter than the
            length), ``"replicate"``, ``"zeros"`` (kornia's) or ``"circular"``.
        spatial_dims: 1, 2 or 3, how many trailing dims are spatial (default: a per-dim
            argument's length, else ``x.ndim - 2``, batched); lets x be unbatched.

    Shape:
        Per spatial dim, with ``M = L - kernel_size + 1`` (``M = L`` for blur_pool):
        ``L_out = (M + before + after - filter_size) // stride + 1``; with the default
        padding, ``ceil(M / stride)``."""


def _shared_args(fn):
    """Put the arguments the three share in place of ``{shared}`` in ``fn``'s docstring."""
    fn.__doc__ = fn.__doc__.replace("{shared}", _SHARED_ARGS)
    return fn


def _blur_pool(x, stride=2, filter_size=3, padding_mode="reflect", padding=None, *,
               spatial_dims=None, want_pullback=False):
    return _blur(x, "none", 1, stride, filter_size, padding, padding_mode, spatial_dims,
                 "blur_pool", want_pullback)


@_shared_args
def blur_pool(x, stride=2, filter_size=3, padding_mode="reflect", padding=None, *,
              spatial_dims=None):
    r"""Anti-aliased subsampling (BlurPool, Zhang 2019): a binomial blur, then every
    ``stride``-th output.

    .. math:: y[o] = \sum_t w[t] \, \tilde x[o \cdot s - p_{\text{before}} + t]

    with ``w`` the normalised binomial filter and ``x~`` the input padded by
    ``padding_mode``. The gradient is the transposed blur: each ``dy[o] * w[t]`` goes
    to the element tap ``t`` read (padding folds onto the element it copied).

    Args:
        x: ``(N, C, *spatial)``, 1-3 spatial dims, or ``(C, *spatial)`` where
            ``spatial_dims`` or a per-dim argument gives their number; float16/32/64.
        {shared}

    Example:
        >>> blur_pool(np.arange(4.0).reshape(1, 1, 4), filter_size=3)
        array([[[0.5, 2. ]]])
    """
    return _blur_pool(x, stride, filter_size, padding_mode, padding,
                      spatial_dims=spatial_dims)[0]


def _max_blur_pool(x, kernel_size=2, stride=2, filter_size=3, padding_mode="reflect",
                   padding=None, *, spatial_dims=None, want_pullback=False):
    return _blur(x, "max", kernel_size, stride, filter_size, padding, padding_mode,
                 spatial_dims, "max_blur_pool", want_pullback)


@_shared_args
def max_blur_pool(x, kernel_size=2, stride=2, filter_size=3, padding_mode="reflect",
                  padding=None, *, spatial_dims=None):
    r"""Anti-aliased max pooling (MaxBlurPool, Zhang 2019): the max over every
    ``kernel_size`` window at stride 1, then :func:`blur_pool`'s blur and subsampling.

    The max follows :func:`poolgrad.max_pool` (first maximum, NaN wins). The
    gradient goes through the transposed blur to each stride-1 window, and from there
    to its winner; where windows share a winner, their gradients add up. The
    pullback keeps one byte per stride-1 window (its winning tap), not the map.

    Args:
        x: ``(N, C, *spatial)``, 1-3 spatial dims, or ``(C, *spatial)`` where
            ``spatial_dims`` or a per-dim argument gives their number; float16/32/64.
        kernel_size: int or per dim, the max's window (default 2, no padding).
        {shared}

    Example:
        >>> max_blur_pool(np.array([[[0.0, 4.0, 0.0, 0.0, 8.0]]]), filter_size=1)
        array([[[4., 0.]]])
    """
    return _max_blur_pool(x, kernel_size, stride, filter_size, padding_mode, padding,
                          spatial_dims=spatial_dims)[0]


def _avg_blur_pool(x, kernel_size=2, stride=2, filter_size=3, padding_mode="reflect",
                   padding=None, *, spatial_dims=None, want_pullback=False):
    return _blur(x, "avg", kernel_size, stride, filter_size, padding, padding_mode,
                 spatial_dims, "avg_blur_pool", want_pullback)


@_shared_args
def avg_blur_pool(x, kernel_size=2, stride=2, filter_size=3, padding_mode="reflect",
                  padding=None, *, spatial_dims=None):
    r"""Anti-aliased average pooling: the mean over every ``kernel_size`` window at
    stride 1 (no padding), then :func:`blur_pool`'s blur and subsampling. With
    ``kernel_size=1`` it is :func:`blur_pool`. The gradient spreads evenly over each
    window, through the transposed blur.

    Args:
        x: ``(N, C, *spatial)``, 1-3 spatial dims, or ``(C, *spatial)`` where
            ``spatial_dims`` or a per-dim argument gives their number; float16/32/64.
        kernel_size: int or per dim, the mean's window (default 2, no padding).
        {shared}
    """
    return _avg_blur_pool(x, kernel_size, stride, filter_size, padding_mode, padding,
                          spatial_dims=spatial_dims)[0]


autodiff.register({blur_pool: _blur_pool, max_blur_pool: _max_blur_pool,
                   avg_blur_pool: _avg_blur_pool})
