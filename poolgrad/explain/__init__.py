"""``poolgrad explain``: where each example's gradient goes through a pooling layer, as
numbers, pictures and terminal grids.

- :mod:`~poolgrad.explain.routing`: :func:`route` pools a batch with the core's
  :func:`poolgrad.vjp` and collects the numbers (:class:`Routing`);
- :mod:`~poolgrad.explain.inputs`: the batches (``--source``);
- :mod:`~poolgrad.explain.figures` and :mod:`~poolgrad.explain.sequences` (1-d data):
  the PNGs; :mod:`~poolgrad.explain.terminal`: the coloured grids;
- :mod:`~poolgrad.explain.translation`: ``--invariance``'s measure and figure;
- :mod:`~poolgrad.explain.network` and :mod:`~poolgrad.explain.network_figures`:
  ``--network``, the batch question for a whole network (weight gradients per example,
  for the batch, averaged first; the optimizer's step);
- :mod:`~poolgrad.explain.command`: :class:`ExplainConfig` and the sets of files,
  :func:`explain`, :func:`explain_invariance` and :func:`explain_network`.
"""

from __future__ import annotations

from .command import ExplainConfig, explain, explain_invariance, explain_network
from .figures import draw_batch, draw_classic, draw_examples, draw_overlap
from .inputs import SOURCES, load_batch
from .routing import KINDS, ExplainError, Routing, classic_routings, route
from .terminal import render_terminal
from .translation import draw_invariance, invariance, unchanged_outputs

__all__ = ["KINDS", "SOURCES", "ExplainConfig", "ExplainError", "Routing", "classic_routings",
           "draw_batch", "draw_classic", "draw_examples", "draw_invariance", "draw_overlap",
           "explain", "explain_invariance", "explain_network", "invariance", "load_batch",
           "render_terminal", "route", "unchanged_outputs"]
