"""``poolgrad bench``: poolgrad's speed against PyTorch's, side by side in one process.

- :mod:`~poolgrad.bench.numpy_api`: the NumPy operators against eager and compiled
  PyTorch, with each pass's memory roofline (``poolgrad bench``);
- :mod:`~poolgrad.bench.torch_api`: poolgrad.torch against eager and compiled PyTorch,
  the per-call overhead and training steps of VGG-11 and ResNet-18 (``--torch``);
- :mod:`~poolgrad.bench.kinds`: every pooling kind of :mod:`poolgrad.kinds` through
  both APIs against plain PyTorch formulations, eager and compiled, and kornia
  (``--kinds``);
- :mod:`~poolgrad.bench.cuda`: poolgrad.torch's Triton kernels on a GPU, float32 and
  bfloat16 (``--device cuda``);
- :mod:`~poolgrad.bench.suite`: what they share: the layers, layouts and passes,
  the bytes a pass must move, the summary, the JSON;
- :mod:`~poolgrad.bench.timing`: functions timed in turn, round after round, and the
  thread counts; :mod:`~poolgrad.bench.roofline`: the least time a pass can take.

Speed is never asserted by the tests; ``--quick`` (tiny shapes, one round) lets them run
every path.
"""
