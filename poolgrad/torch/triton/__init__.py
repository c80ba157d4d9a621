"""poolgrad.torch's CUDA backend: Triton kernels for every pass of the core operators.

* :mod:`.dispatch` chooses the kernel of a pass (the Numba dispatch's counterpart for
  CUDA tensors), importing nothing heavy;
* :mod:`.launch` turns a window plan and torch tensors into a kernel's arguments and
  launches it (imports Triton);
* :mod:`.kernels` holds the core's kernels (max, average, Lp, unpooling) and the
  contract every kernel keeps; :mod:`.power_mean` and :mod:`.weighted` the kinds'
  kernels, grouped by family; :mod:`.walk` what they all share (lanes, windows, covers).

:mod:`poolgrad.torch._cuda` is the only caller. Under ``TRITON_INTERPRET=1`` the same
kernels run on CPU tensors, which is how the tests check them without a GPU.
"""
