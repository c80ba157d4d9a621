"""Anti-aliased pooling on rows: 1-d and 2-d planes with no depth work, streamed an
output row at a time (the general plane chain is :mod:`.blur`'s, whose docstring gives
the passes' rules; these kernels give the same bits).

A plane is ``(H, W * inner)``: an ``(n, c)`` plane with ``inner`` 1, or an image of
``inner = C`` channels stored innermost (channels-last). The map row ``j`` (the
pre-pool's, or the input's own row) is built when an output row first needs it and
kept in a ring of ``taps_h`` rows; the output row is the H taps' weighted sum of map
rows (contiguous, so it vectorizes), padded along W by ``mode_w``, then the W taps at
the stride. The sums run in the chain's order (taps in increasing order, H before
W), the pre-pools' as documented below. Rows are passed as views, and scalars read
from arrays before a loop: LLVM vectorizes a loop over distinct views, and not the
same loop over offsets into flat arrays it cannot tell apart. Loops skip what needs
no work (the pads are filled by position, not found by a test per element): NCHW
rows are short, so per-row costs dominate.
"""

import numpy as np
from numba import prange

from . import beats, jit, parallel_kernel
from .blur import padded_source


@jit()
def _map_row(x, plane, j, inner, pre, kh, kw, box_weights, codes, row, taps, box):
    """Row ``j`` of the stride-1 pre-pool of ``x[plane]`` (rows ``(H, W * inner)``)
    into ``row`` (``MW * inner``), by :func:`_max_passes` (``pre`` 1 or 3) or
    :func:`_mean_passes` (2, each column's sum into ``box``), a tap's columns ``inner``
    apart. Channels-last rows take it (NCHW planes take the same passes over the whole
    plane); a call, not inlined: rows of ``W * C`` make a call's cost nothing
    measurable, and inlined at its three sites it made the forward kernel take 27 s to
    compile (15 s as a call)."""
    row_len = box.shape[0]
    src = x[plane].reshape(-1)[j * row_len:]
    if pre == 2:
        _mean_passes(src, row_len, kh, kw, inner, box_weights, box, row, row.shape[0])
    else:
        _max_passes(src, row_len, kh, kw, inner, pre, codes, row, taps, row.shape[0])


@jit(inline="always")
def _max_passes(src, row_step, kh, kw, column_step, pre, codes, out, taps, count):
    """A max map's passes: ``out[i]`` := the maximum of ``src[i + jh * row_step + jw *
    column_step]`` over the ``kh x kw`` window (``i < count``), the first maximum in
    row-major window order or the first NaN; ``pre`` 1 also writes each winning tap's
    entry of ``codes`` (``0 .. kh * kw - 1`` in the winners' dtype, so the selects
    stay in that dtype) into ``taps``, 3 the maxima alone (their selects were half the
    map's time). A 2x2 window without winners over an NCHW plane (``column_step`` 1)
    takes its four taps in one pass; over a channels-last row that pass was slower
    (1.62 -> 2.10 ms) than four."""
    if pre == 3 and kh == 2 and kw == 2 and column_step == 1:
        a, b = src[0: count], src[1: count + 1]
        c, d = src[row_step: row_step + count], src[row_step + 1: row_step + 1 + count]
        for i in range(count):
            best, v = a[i], b[i]
            best = v if beats(v, best) else best
            v = c[i]
            best = v if beats(v, best) else best
            v = d[i]
            out[i] = v if beats(v, best) else best
        return
    first, code = src[0: count], codes[0]  # scalars read before the loops: LLVM cannot
    for i in range(count):  # tell these arrays from the ones it writes
        out[i] = first[i]
    if pre == 1:
        for i in range(count):
            taps[i] = code
    for jh in range(kh):
        for jw in range(kw):
            if jh == 0 and jw == 0:
                continue
            at = jh * row_step + jw * column_step
            tap_in, code = src[at: at + count], codes[jh * kw + jw]
            if pre == 1:
                for i in range(count):
                    v, best = tap_in[i], out[i]
                    wins = beats(v, best)
                    out[i] = v if wins else best
                    taps[i] = code if wins else taps[i]
            else:
                for i in range(count):
                    v, best = tap_in[i], out[i]
                    out[i] = v if beats(v, best) else best


@jit(inline="always")
def _mean_passes(src, row_step, kh, kw, column_step, box_weights, box, out, count):
    """A mean map's two passes: ``box[i]`` := the weighted sum of ``src[i + jh *
    row_step]`` over ``kh`` rows (for every ``i`` of ``box``), then ``out[i]`` := the
    weighted sum of ``box[i + jw * column_step]`` over ``kw`` columns (``i <
    count``)."""
    _tap_sum(src, row_step, kh, box_weights[0], box, box.shape[0])
    _tap_sum(box, column_step, kw, box_weights[1], out, count)


@jit(inline="always")
def _tap_sum(src, step, taps, weight, out, count):
    """``out[i]`` := the sum over ``t < taps`` of ``weight * src[i + t * step]``, for ``i <
    count``; the first term starts the sum (0 + a is a: one pass less)."""
    first = src[0: count]
    for i in range(count):
        out[i] = weight * first[i]
    for t in range(1, taps):
        more = src[t * step: t * step + count]
        for i in range(count):
            out[i] += weight * more[i]


@jit(inline="always")
def _pad_row(padded, inner, before, length, mode):
    """Fill the W padding of ``padded`` (``(before + length + after) * inner``, the row
    at ``before``) from the row by ``mode`` (zeros: zeros)."""
    total = padded.shape[0] // inner
    for q in range(total - length):  # the pad positions only
        q = q if q < before else q + length
        i = padded_source(q - before, length, mode)
        for c in range(inner):
            padded[q * inner + c] = 0.0 if i < 0 else padded[(before + i) * inner + c]


@jit(inline="always")
def _w_pass(padded, inner, taps, stride, weights, out, plus_zero):
    """``out[o] = sum_t weights[t] * padded[o * stride + t]`` per pixel of ``inner``.
    Stride 2 is spelled out: LLVM vectorizes a constant stride's loads."""
    count = out.shape[0] // inner
    if inner > 1 and taps == 3:  # the 3-tap filter in one pass, in the sums' order
        w0, w1, w2 = weights[0], weights[1], weights[2]
        zero = plus_zero  # a loaded +0: fast-math folds a literal's sign away
        for o in range(count):
            target = out[o * inner: (o + 1) * inner]
            read = o * stride * inner
            first = padded[read: read + inner]
            second = padded[read + inner: read + 2 * inner]
            third = padded[read + 2 * inner: read + 3 * inner]
            for c in range(inner):
                target[c] = ((zero + w0 * first[c]) + w1 * second[c]) + w2 * third[c]
        return
    if inner == 1 and taps == 3 and stride == 2:  # NCHW's commonest, in one pass too
        w0, w1, w2 = weights[0], weights[1], weights[2]
        zero = plus_zero
        for o in range(count):
            out[o] = ((zero + w0 * padded[2 * o]) + w1 * padded[2 * o + 1]) + w2 * padded[
                2 * o + 2]
        return
    out[:] = 0.0
    for t in range(taps):
        w = weights[t]
        if inner > 1:
            for o in range(count):
                target = out[o * inner: (o + 1) * inner]
                source = padded[(o * stride + t) * inner: (o * stride + t + 1) * inner]
                for c in range(inner):
                    target[c] += w * source[c]
        elif stride == 2:
            source = padded[t:]
            for o in range(count):
                out[o] += w * source[2 * o]
        else:
            for o in range(count):
                out[o] += w * padded[o * stride + t]


@jit(inline="always")
def _w_adjoint(dy_row, inner, taps, stride, before, mode, weights, padded, g, plus_zero):
    """The adjoint of :func:`_pad_row` then :func:`_w_pass`: ``g`` (``length * inner``)
    from an output row's gradient, through the padded row (folded back onto what each
    pad copied, after the row's own sums). Each padded position adds its taps in
    increasing ``t`` from +0 (``plus_zero``, loaded)."""
    total = padded.shape[0] // inner
    count = dy_row.shape[0] // inner
    length = g.shape[0] // inner
    padded[:] = 0.0
    if inner == 1 and stride == 2 and taps == 3 and count > 0:
        # gathered (pairs of stores vectorize, a stride-2 scatter stays scalar):
        # position 2u takes taps 0 (output u) and 2 (u - 1), 2u + 1 tap 1 (output u)
        w0, w1, w2, zero = weights[0], weights[1], weights[2], plus_zero
        padded[0], padded[1] = zero + w0 * dy_row[0], zero + w1 * dy_row[0]
        for u in range(1, count):
            padded[2 * u] = (zero + w0 * dy_row[u]) + w2 * dy_row[u - 1]
            padded[2 * u + 1] = zero + w1 * dy_row[u]
        padded[2 * count] = zero + w2 * dy_row[count - 1]
        taps = 0  # done
    for t in range(taps):  # taps in increasing order at each position, as above
        w = weights[t]
        if inner > 1:
            for o in range(count):
                target = padded[(o * stride + t) * inner: (o * stride + t + 1) * inner]
                source = dy_row[o * inner: (o + 1) * inner]
                for c in range(inner):
                    target[c] += w * source[c]
        elif stride == 2:
            target = padded[t:]
            for o in range(count):
                target[2 * o] += w * dy_row[o]
        else:
            for o in range(count):
                padded[o * stride + t] += w * dy_row[o]
    g[:] = padded[before * inner: (before + length) * inner]
    for q in range(total - length):  # the pad positions only
        q = q if q < before else q + length
        i = padded_source(q - before, length, mode)
        if i >= 0:
            for c in range(inner):
                g[i * inner + c] += padded[q * inner + c]


@jit(inline="always")
def _cached_map_row(x, plane, j, inner, pre, kh, kw, box_weights, codes, ring, tags, done,
                    own_lo, own_hi, winners, taps_scratch, box):
    """Map row ``j`` into its slot of the ring (``j % len(ring)``) unless it is there;
    a max writes the winners of the rows its task owns (``own_lo <= j < own_hi``)."""
    slot = j % ring.shape[0]
    if tags[slot] != j:
        mine = pre == 1 and own_lo <= j < own_hi
        _map_row(x, plane, j, inner, pre, kh, kw, box_weights, codes, ring[slot],
                 winners[plane, j] if mine else taps_scratch, box)
        tags[slot] = j
        done[j] = done[j] or mine


@parallel_kernel
def blur_rows_forward(x, inner, pre, window, blurs, weights, box_weights, chunks, groups,
                      y, winners):
    """``y`` ``(P, OH, OW * inner)`` from ``x`` ``(P, H, W * inner)``, C-contiguous;
    ``winners`` ``(P, MH, MW * inner)`` for a max (else unused). ``window``, ``blurs``
    and ``weights``: the plan's per-axis ``(D, H, W)`` tables (no work along D);
    ``box_weights``: the mean's row and column weights, then a +0 (loaded from the
    array, so that fast-math keeps the sign a sum from +0 gives a window of -0s);
    ``pre`` 0 none, 1 max, 2 mean, 3 max without the winners; ``chunks`` splits
    each plane's output rows into that many tasks, and the ``planes * chunks`` tasks
    run as ``groups`` parallel runs (each allocating its scratch once). The map rows
    are split among a plane's tasks at the first row each task's first output row
    reads, and each task writes the winners of its own map rows (all of them, read or
    not), so every winner is written once."""
    planes, height, row_len = x.shape
    width = row_len // inner
    kh, kw = window[1], window[2]
    map_h, map_w = height - kh + 1, width - kw + 1
    taps_h, stride_h, before_h, mode_h = blurs[1, 0], blurs[1, 1], blurs[1, 2], blurs[1, 4]
    taps_w, stride_w, before_w = blurs[2, 0], blurs[2, 1], blurs[2, 2]
    after_w, mode_w = blurs[2, 3], blurs[2, 4]
    out_h = y.shape[1]
    total_w = before_w + map_w + after_w
    tasks = planes * chunks
    for group in prange(groups):
        ring = np.empty((taps_h, map_w * inner), x.dtype)
        tags = np.empty(taps_h, np.int64)
        taps_scratch = np.empty(map_w * inner, winners.dtype)
        box = np.empty(row_len, x.dtype)
        padded = np.empty(total_w * inner, x.dtype)
        done = np.empty(map_h, np.bool_)
        codes = np.empty(kh * kw, winners.dtype)
        for tap in range(kh * kw):
            codes[tap] = tap
        acc = padded[before_w * inner: (before_w + map_w) * inner]
        flat = inner == 1 and pre != 0  # NCHW: the plane's whole map, in flat passes
        plane_map = np.empty(map_h * width if flat else 0, x.dtype)
        plane_taps = np.empty(map_h * width if flat and pre == 1 else 0, winners.dtype)
        plane_box = np.empty(map_h * width if flat and pre == 2 else 0, x.dtype)
        mapped = -1
        for task in range(group * tasks // groups, (group + 1) * tasks // groups):
            plane, chunk = task // chunks, task % chunks
            if flat and plane != mapped:
                # the whole plane's map in flat passes, not 55 loops of 55 (per-row
                # costs: a 32x64x56x56 max-blur's forward 4.6 ms, 2.8 this way); a
                # row's last windows wrap into the next row and are never read
                src, count = x[plane].reshape(-1), map_h * width - (kw - 1)
                if pre == 2:
                    _mean_passes(src, width, kh, kw, 1, box_weights, plane_box, plane_map,
                                 count)
                else:
                    _max_passes(src, width, kh, kw, 1, pre, codes, plane_map, plane_taps,
                                count)
                mapped = plane
            o0, o1 = chunk * out_h // chunks, (chunk + 1) * out_h // chunks
            own_lo = 0 if chunk == 0 else min(max(o0 * stride_h - before_h, 0), map_h)
            own_hi = (map_h if chunk == chunks - 1
                      else min(max(o1 * stride_h - before_h, 0), map_h))
            tags[:] = -1
            done[:] = False
            for o in range(o0, o1):
                top = o * stride_h - before_h
                if taps_h == 3 and 0 <= top and top + 2 < map_h:
                    # three rows inside the map, summed in one pass in the taps' order
                    # (three passes over a channels-last row took 1.5x as long)
                    if pre == 0:
                        first, second, third = x[plane, top], x[plane, top + 1], x[plane,
                                                                                   top + 2]
                    elif flat:
                        at = top * width
                        first = plane_map[at: at + map_w]
                        second = plane_map[at + width: at + width + map_w]
                        third = plane_map[at + 2 * width: at + 2 * width + map_w]
                    else:
                        for j in range(top, top + 3):
                            _cached_map_row(x, plane, j, inner, pre, kh, kw, box_weights,
                                            codes, ring, tags, done, own_lo, own_hi,
                                            winners, taps_scratch, box)
                        first, second, third = ring[top % 3], ring[(top + 1) % 3], ring[
                            (top + 2) % 3]
                    w0, w1, w2 = weights[1, 0], weights[1, 1], weights[1, 2]
                    for k in range(map_w * inner):
                        acc[k] = (w0 * first[k] + w1 * second[k]) + w2 * third[k]
                    _pad_row(padded, inner, before_w, map_w, mode_w)
                    _w_pass(padded, inner, taps_w, stride_w, weights[2], y[plane, o],
                            box_weights[2])
                    continue
                started = False
                for t in range(taps_h):
                    j = padded_source(o * stride_h - before_h + t, map_h, mode_h)
                    if j < 0:
                        continue
                    if pre == 0:
                        row = x[plane, j]
                    elif flat:
                        row = plane_map[j * width: j * width + map_w]
                    else:
                        _cached_map_row(x, plane, j, inner, pre, kh, kw, box_weights, codes,
                                        ring, tags, done, own_lo, own_hi, winners,
                                        taps_scratch, box)
                        row = ring[j % taps_h]
                    w = weights[1, t]
                    if started:
                        for k in range(map_w * inner):
                            acc[k] += w * row[k]
                    else:  # the first tap read starts the sum
                        for k in range(map_w * inner):
                            acc[k] = w * row[k]
                        started = True
                if not started:  # every H tap fell in a zero pad
                    acc[:] = 0.0
                _pad_row(padded, inner, before_w, map_w, mode_w)
                _w_pass(padded, inner, taps_w, stride_w, weights[2], y[plane, o],
                            box_weights[2])
            if pre == 1 and flat:
                for j in range(own_lo, own_hi):
                    own, kept = winners[plane, j], plane_taps[j * width: j * width + map_w]
                    for k in range(map_w):
                        own[k] = kept[k]
            elif pre == 1:
                for j in range(own_lo, own_hi):
                    if not done[j]:
                        _map_row(x, plane, j, inner, pre, kh, kw, box_weights, codes,
                                 ring[0], winners[plane, j], box)


@jit(inline="always")
def _blur_row_gradient(dy, i, reads_ptr, reads_row, reads_tap, inner, taps_w, stride_w,
                       before_w, mode_w, weights, padded, g_ring, g_tags, out, plus_zero):
    """Row ``i`` of a plain blur's ``dx`` (no pre-pool): the sum from +0 (loaded) in
    increasing ``(o, t)`` of ``weights[1, t]`` times ``dy`` row ``o``'s W adjoint (each
    taken once, into ``g_ring``), the first read written, not added to a zeroed row."""
    first, end = reads_ptr[i], reads_ptr[i + 1]
    if first == end:  # a row no output reads
        out[:] = 0.0
        return
    for r in range(first, end):
        o, t = reads_row[r], reads_tap[r]
        g_slot = o % g_ring.shape[0]
        if g_tags[g_slot] != o:
            _w_adjoint(dy[o], inner, taps_w, stride_w, before_w, mode_w, weights[2], padded,
                       g_ring[g_slot], plus_zero)
            g_tags[g_slot] = o
        w, g = weights[1, t], g_ring[g_slot]
        if r == first:
            for k in range(out.shape[0]):
                out[k] = plus_zero + w * g[k]
        else:
            for k in range(out.shape[0]):
                out[k] += w * g[k]


@parallel_kernel
def blur_rows_backward(dy, inner, pre, window, blurs, weights, box_weights, reads_ptr,
                       reads_row, reads_tap, chunks, groups, winners, dx):
    """The adjoint of :func:`blur_rows_forward`: ``dx`` ``(P, H, W * inner)`` from
    ``dy``. Each task owns a run of ``dx`` rows and gathers into them, so nothing is
    shared: map row ``j``'s gradient sums, in increasing order, ``weights[1, t]`` times
    the W adjoint of output row ``o`` over the reads ``(o, t)`` of it
    (``reads_row[reads_ptr[j]:reads_ptr[j + 1]]``); a max routes it to the winners in
    increasing map order (adding an exact 0 where a tap did not win: ``dx`` starts at
    +0, so the sums are unchanged), a mean spreads it back (``kw`` columns, then ``kh``
    rows)."""
    planes, height, row_len = dx.shape
    width = row_len // inner
    kh, kw = window[1], window[2]
    map_h, map_w = height - kh + 1, width - kw + 1
    taps_w, stride_w, before_w = blurs[2, 0], blurs[2, 1], blurs[2, 2]
    after_w, mode_w = blurs[2, 3], blurs[2, 4]
    total_w = before_w + map_w + after_w
    slots = blurs[1, 0] + 1
    tasks = planes * chunks
    for group in prange(groups):
        g_ring = np.empty((slots, map_w * inner), dx.dtype)
        g_tags = np.empty(slots, np.int64)
        d_ring = np.empty((kh, row_len), dx.dtype)
        d_tags = np.empty(kh, np.int64)
        dmap = np.empty(map_w * inner, dx.dtype)
        padded = np.empty(total_w * inner, dx.dtype)
        codes = np.empty(kh * kw, winners.dtype)  # tap numbers in the winners' dtype
        for tap in range(kh * kw):
            codes[tap] = tap
        zero = np.zeros(1, dx.dtype)[0]
        for task in range(group * tasks // groups, (group + 1) * tasks // groups):
            plane, chunk = task // chunks, task % chunks
            g_tags[:] = -1
            d_tags[:] = -1
            for i in range(chunk * height // chunks, (chunk + 1) * height // chunks):
                out = dx[plane, i]
                if pre == 0:  # the blur alone: row i is map row i, its reads written
                    _blur_row_gradient(dy[plane], i, reads_ptr, reads_row, reads_tap,
                                       inner, taps_w, stride_w, before_w, mode_w, weights,
                                       padded, g_ring, g_tags, out, box_weights[2])
                    continue
                out[:] = 0.0
                for j in range(max(0, i - kh + 1), min(i, map_h - 1) + 1):
                    slot = j % kh
                    if d_tags[slot] != j:  # map row j's gradient (for a mean: spread)
                        target = d_ring[slot, : map_w * inner] if pre == 1 else dmap
                        target[:] = 0.0
                        for r in range(reads_ptr[j], reads_ptr[j + 1]):
                            o, t = reads_row[r], reads_tap[r]
                            g_slot = o % slots
                            if g_tags[g_slot] != o:
                                _w_adjoint(dy[plane, o], inner, taps_w, stride_w, before_w,
                                           mode_w, weights[2], padded, g_ring[g_slot],
                                           box_weights[2])
                                g_tags[g_slot] = o
                            w = weights[1, t]
                            g = g_ring[g_slot]
                            for k in range(map_w * inner):
                                target[k] += w * g[k]
                        if pre == 2:
                            spread = d_ring[slot]
                            spread[:] = 0.0
                            for jw in range(kw):
                                offset = jw * inner
                                for k in range(map_w * inner):
                                    spread[offset + k] += box_weights[1] * dmap[k]
                        d_tags[slot] = j
                    if pre == 1:  # a select per column tap, not a scatter: it
                        # vectorizes and never mispredicts; columns in decreasing jw
                        # keep the increasing map order of each element's sum
                        jh = i - j
                        gradient, taps = d_ring[slot], winners[plane, j]
                        for jw in range(kw - 1, -1, -1):
                            code = codes[jh * kw + jw]
                            target = out[jw * inner: (jw + map_w) * inner]
                            for k in range(map_w * inner):
                                target[k] += gradient[k] if taps[k] == code else zero
                    elif pre == 2:
                        spread = d_ring[slot]
                        for k in range(row_len):
                            out[k] += box_weights[0] * spread[k]
