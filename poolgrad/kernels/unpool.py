"""Max unpooling: scatter values to flat indices in each (n, c) output plane."""

import numpy as np
from numba import prange

from . import parallel_kernel


@parallel_kernel
def max_unpool_forward(y, indices, out, written):
    """``out[n, c, indices[n, c, k]] = y[n, c, k]`` on a zeroed ``out`` (planes flattened).

    Where several entries name the same place, the last one in row-major order wins
    (a serial scatter); ``written[n, c, k]`` is 1 for the entries that landed.
    """
    n_batch, n_chan, count = y.shape
    plane = out.shape[2]
    for nc in prange(n_batch * n_chan):
        n = nc // n_chan
        c = nc % n_chan
        taken = np.zeros(plane, np.uint8)
        for k in range(count - 1, -1, -1):
            target = indices[n, c, k]
            if taken[target] == 0:
                taken[target] = 1
                out[n, c, target] = y[n, c, k]
                written[n, c, k] = 1
            else:
                written[n, c, k] = 0


@parallel_kernel
def max_unpool_backward(dout, indices, written, dy):
    """``dy[n, c, k] = dout[n, c, indices[n, c, k]]`` for the entries that landed, else 0."""
    n_batch, n_chan, count = dy.shape
    for nc in prange(n_batch * n_chan):
        n = nc // n_chan
        c = nc % n_chan
        for k in range(count):
            if written[n, c, k]:
                dy[n, c, k] = dout[n, c, indices[n, c, k]]
            else:
                dy[n, c, k] = 0
