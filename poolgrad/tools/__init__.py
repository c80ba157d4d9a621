"""What several tools share (``poolgrad train``, ``explain``, ``study``, ``bench``), in
one place with public names:

- :mod:`~poolgrad.tools.files`: output files checked before the work and written
  atomically;
- :mod:`~poolgrad.tools.figures`: matplotlib's Figure without pyplot, PNGs written
  atomically;
- :mod:`~poolgrad.tools.datasets`: digits, MNIST-1D and IDX files, made or read locally;
- :mod:`~poolgrad.tools.processes`: cores, Numba's and PyTorch's threads, the
  environment of spawned processes;
- :mod:`~poolgrad.tools.choices`: the check of a name against a menu.

The tools import the library; nothing in the library imports them.
"""
