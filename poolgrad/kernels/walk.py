"""Walking code shared by the row kernels (:mod:`.row_passes`, :mod:`.blocks`,
:mod:`.tiled`, :mod:`.gather_rows`): how parallel steps take runs of output rows, where
an output row's windows and tap rows start, and the software prefetch.

Also the two ways those kernels compile their helpers: ``helper``, a plain compiled
call that LLVM inlines, and ``inlined``, inlined by Numba itself, for the helpers a
loop needs inlined to vectorize (it compiles slower: the per-tap helpers of the max
passes, as plain calls, shortened a first vjp's compile and ran as fast).
"""

from numba import uint64

from . import jit
from .simd import BLOCK, PREFETCH_BYTES, prefetch

helper = jit()
inlined = jit(inline="always")


@helper
def row_index(row, n_chan, depth, height):
    """``(n, c, d, h)`` of row ``row`` of an ``(N, n_chan, depth, height, W)`` array, its
    rows numbered in C order (``n_chan`` = 1 for the ``(N, D, H, W, C)`` rows of a
    channels-last array, whose ``c`` is then 0)."""
    h = row % height
    rest = row // height
    d = rest % depth
    rest //= depth
    return rest // n_chan, rest % n_chan, d, h


@helper
def row_steps(n_rows):
    """``(steps, rows per step)``: a parallel step takes a run of consecutive rows (up to
    32, keeping at least 256 steps), so that only its first row's (plane, od, oh) costs
    integer divisions. Short rows (VGG's deep 7-wide ones) spent much of their time on
    them."""
    per_step = max(1, min(32, n_rows // 256))
    return (n_rows + per_step - 1) // per_step, per_step


@helper
def step_start(row, out_h, out_d):
    """``(oh, od, plane)`` of output row ``row``."""
    return row % out_h, (row // out_h) % out_d, row // (out_h * out_d)


@helper
def next_row(oh, od, plane, out_h, out_d):
    """``(oh, od, plane)`` of the row after ``(oh, od, plane)``."""
    oh += 1
    if oh == out_h:
        oh = 0
        od += 1
        if od == out_d:
            od = 0
            plane += 1
    return oh, od, plane


@helper
def prefetch_count(n_streams, per_row, itemsize):
    """How many elements each output row asks for ahead (see :func:`prefetch_ahead`):
    ``per_row``, the input the next row adds, if the tap rows form one stream (a
    2-d window) of 512 B to 8 KB per row, else none. (The global average, one stream
    of short planes, asks for every plane.) The bounds come from 2x2/2 max forwards:
    wide 2-d rows ran faster for the asking; narrower ones ran slower (the asking costs
    more than it saves), as did longer 1-d rows and 3-d windows (a stream per slice)."""
    nbytes = per_row * itemsize
    return per_row if n_streams == 1 and 512 <= nbytes <= 8192 else 0


@inlined
def prefetch_ahead(xf, first, count):
    """Ask for ``count`` elements of the input :data:`~poolgrad.kernels.simd.PREFETCH_BYTES`
    past ``first``, the first tap row of the output row in hand."""
    if count > 0:
        prefetch(xf, first + PREFETCH_BYTES // xf.itemsize, count)


@helper
def block_tap_rows(table, dilation, od, oh, plane, in_d, in_h, in_w):
    """The real tap rows of output row ``(plane, od, oh)`` as the blocks of
    :mod:`.simd` take them, ``(first, n_d, step_d, n_h, step_h)``: they start at
    ``first + jd*step_d + jh*step_h`` for ``jd`` < ``n_d`` and ``jh`` < ``n_h``."""
    start_d, first_d, end_d, start_h, first_h, end_h = row_windows(table, od, oh)
    first = ((plane * in_d + start_d + first_d * dilation[0]) * in_h + start_h
             + first_h * dilation[1]) * in_w
    return (first, end_d - first_d, dilation[0] * in_h * in_w, end_h - first_h,
            dilation[1] * in_w)


@helper
def block_place(block, out_w, column, in_w):
    """``(at, start, edge)`` of block ``block`` (a multiple of ``BLOCK``) of an output
    row ``out_w`` windows long whose window 0 starts at column ``column`` (3 taps,
    stride 2): its first window, where that window starts, and whether its taps, columns
    ``start`` to ``start + 2*BLOCK``, reach outside ``[0, in_w)``. The last block ends at
    ``out_w`` and may overlap the one before: it writes the same values again, which
    costs less than a scalar tail."""
    at = min(block, out_w - BLOCK)
    start = column + 2 * at
    return at, start, start < 0 or start + 2 * BLOCK >= in_w


@helper
def input_per_row(table, out_h, in_h, in_w):
    """How far the tap rows move from one output row to the next along H (the H stride
    in rows; a whole slice when there is one output row)."""
    return (table[1, 0, 1] - table[1, 0, 0]) * in_w if out_h > 1 else in_h * in_w


@helper
def row_windows(table, od, oh):
    """``(start, first, end)`` along D of slice ``od``, then along H of row ``oh``: where
    the output row's windows start and which of their tap rows are real."""
    return (table[0, 0, od], table[0, 1, od], table[0, 2, od],
            table[1, 0, oh], table[1, 1, oh], table[1, 2, oh])


@inlined
def window_range(table, od, oh, ow):
    """The input coordinates window ``(od, oh, ow)`` reads (undilated), as half-open
    ranges ``(d0, d1, h0, h1, w0, w1)``: its real taps only."""
    return (table[0, 0, od] + table[0, 1, od], table[0, 0, od] + table[0, 2, od],
            table[1, 0, oh] + table[1, 1, oh], table[1, 0, oh] + table[1, 2, oh],
            table[2, 0, ow] + table[2, 1, ow], table[2, 0, ow] + table[2, 2, ow])


@inlined
def rows_task(task, chunks, rows):
    """The plane and the half-open range of its output rows that parallel task ``task``
    owns, ``chunks`` tasks per plane (the windows-as-rows kernels of
    :mod:`.power_mean` and :mod:`.weighted`)."""
    plane, part = task // chunks, task % chunks
    return plane, part * rows // chunks, (part + 1) * rows // chunks


@inlined
def quad_rows(x, plane, row, out_h, steps):
    """``(od, oh, top, bottom)``: output row ``row`` of a plane's ``(D, H)`` output rows
    (``out_h`` of them per D), and the two rows of ``x`` (rows ``(P, D, H, W * inner)``)
    that its 2x2 windows read, ``steps`` the stride per axis (the quads kernels)."""
    od, oh = row // out_h, row % out_h
    return (od, oh, x[plane, od * steps[0], oh * steps[1]],
            x[plane, od * steps[0], oh * steps[1] + 1])


@inlined
def quad_taps(o, inner, steps):
    """``(i, j)``: output ``o``'s 2x2 window along an output row of :func:`quad_rows`
    is ``top[i], top[j], bottom[i], bottom[j]`` (``inner`` values per position, W
    stride ``steps[2]``)."""
    ow, c = o // inner, o % inner
    i = uint64(ow * steps[2] * inner + c)
    return i, i + uint64(inner)


@inlined
def copy_row(row, copy):
    """``copy[:] = row``, both contiguous: a loop, as that slice assignment compiled to
    nothing inside the 2x2 kernels' prange loops (a copy of x for a pullback)."""
    for i in range(row.shape[0]):
        at = uint64(i)
        copy[at] = row[at]


@inlined
def gather_tap(src, start, step, inner, taps):
    """``taps[ow * inner + c] = src[(start + ow * step) * inner + c]``: the tap at
    ``start`` of every window of a row of ``(W * inner)`` values, as float64, so that
    the arithmetic on them runs over a contiguous buffer."""
    if inner == 1:
        for ow in range(taps.shape[0]):
            taps[uint64(ow)] = src[uint64(start + ow * step)]
        return
    for ow in range(taps.shape[0] // inner):
        base, first = (start + ow * step) * inner, ow * inner
        for c in range(inner):
            taps[uint64(first + c)] = src[uint64(base + c)]


@inlined
def scatter_tap(taps, start, step, inner, out):
    """The inverse of :func:`gather_tap`: ``out[(start + ow * step) * inner + c] =
    taps[ow * inner + c]``."""
    if inner == 1:
        for ow in range(taps.shape[0]):
            out[uint64(start + ow * step)] = taps[uint64(ow)]
        return
    for ow in range(taps.shape[0] // inner):
        base, first = (start + ow * step) * inner, ow * inner
        for c in range(inner):
            out[uint64(base + c)] = taps[uint64(first + c)]
