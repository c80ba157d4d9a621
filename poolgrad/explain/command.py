"""What ``poolgrad explain`` does: its settings, :class:`ExplainConfig`, checked in one
place, and the two sets of files it writes (:func:`explain`, :func:`explain_invariance`).
"""

from __future__ import annotations

import os
from dataclasses import InitVar, dataclass

import numpy as np

from ..tools.choices import check_choice
from ..tools.files import check_output_folder
from .figures import draw_batch, draw_classic, draw_examples, draw_overlap
from .inputs import load_batch
from .polyphase import draw_phases, phase_choices, render_phases
from .routing import KINDS, ExplainError, route
from .translation import draw_invariance, invariance

# the layers ``--kind`` explains: the routing kinds, and adaptive polyphase sampling's
# choice of phase (:mod:`.polyphase`)
EXPLAINED = (*KINDS, "aps")


@dataclass(frozen=True)
class ExplainConfig:
    """A run of ``poolgrad explain``: where the batch comes from and how many examples
    (``source``, ``batch``, ``seed``, ``channel``: see
    :func:`poolgrad.explain.inputs.load_batch`), the pooling layer (``kind``, one of
    :data:`~poolgrad.explain.routing.KINDS`, ``kernel``, ``stride``, ``padding``,
    ``ties``, ``p``; a checkpoint's layer brings its own), the upstream gradient
    ``dy`` (``"random"``: integers 1 to 9, so each window's value can be followed to
    where it lands; ``"ones"``), the ``examples`` drawn one by one, and the folder
    ``out``. With ``invariance``, the translation-invariance figure instead (``dy`` and
    ``examples`` unused). ``batch`` None: 16, or 100 with ``invariance``.

    Creating one checks the names and counts; the geometry is checked by the operators
    themselves. ``flags`` (not kept): name ``kind`` as the command line's ``--kind``."""

    source: str = "digits"
    out: str = "explain"
    kind: str = "max"
    kernel: int = 2
    stride: int | None = None
    padding: int = 0
    ties: str = "first"
    p: float = 2.0
    batch: int | None = None
    examples: int = 3
    seed: int = 0
    channel: int = 0
    dy: str = "random"
    invariance: bool = False
    flags: InitVar[bool] = False

    def __post_init__(self, flags: bool) -> None:
        check_choice(self.kind, EXPLAINED, "--kind" if flags else "kind", ExplainError)
        if not self.invariance:
            if self.dy not in ("random", "ones"):
                raise ExplainError(f"dy must be 'random' or 'ones', got {self.dy!r}")
            if self.examples < 1:
                raise ExplainError(f"examples must be >= 1, got {self.examples}")
        if self.batch is None:
            object.__setattr__(self, "batch", 100 if self.invariance else 16)


def explain(config: ExplainConfig) -> dict:
    """Write the default set of figures into ``config.out`` and return their paths with
    the routing numbers: ``examples.png``, ``batch.png``, ``overlap.png`` (3x3 stride-2
    windows over the same batch) and ``max_vs_avg.png`` (the classic 4x4 diagram). For
    ``kind="aps"``, ``aps.png`` and the phases' numbers (:func:`explain_phases`)."""
    out = config.out
    check_output_folder(out, ExplainError)  # before the work, not after it
    x, description, layer = load_batch(config.source, config.batch, config.seed,
                                       config.channel)
    if config.kind == "aps":
        return explain_phases(config, x, description)
    pool = {"kind": config.kind, "kernel": config.kernel, "stride": config.stride,
            "padding": config.padding, "ties": config.ties, "p": config.p}
    if layer is not None:  # a checkpoint's pooling layer brings its own settings
        pool.update(kind=layer["kind"], kernel=layer["kernel_size"], stride=layer.get("stride"),
                    padding=layer.get("padding", 0), p=layer.get("p", config.p))
    upstream = None
    if config.dy == "random":
        shape = route(x[:1], **pool).y.shape[1:]
        upstream = np.random.default_rng(config.seed).integers(1, 10, (len(x),) + shape)
    routing = route(x, **pool, dy=upstream)
    pooled_dims = routing.x.shape[2:] if routing.one_d else routing.x.shape[1:]
    overlap = (route(x, **{**pool, "kernel": 3, "stride": 2, "padding": 1})
               if min(pooled_dims) >= 3 else routing)
    files = {"examples": draw_examples(routing, os.path.join(out, "examples.png"),
                                       config.examples, description),
             "batch": draw_batch(routing, os.path.join(out, "batch.png"), description),
             "overlap": draw_overlap(overlap, os.path.join(out, "overlap.png")),
             "max_vs_avg": draw_classic(os.path.join(out, "max_vs_avg.png"))}
    return {"files": files, "routing": routing, "description": description,
            "summary": routing.summary()}


def explain_invariance(config: ExplainConfig) -> dict:
    """Write ``invariance.png`` into ``config.out``: how many outputs of
    ``config.kernel``-wide max and average pooling stay the same under shifts of the
    batch (:func:`~poolgrad.explain.translation.invariance`); returns its path and the
    numbers."""
    check_output_folder(config.out, ExplainError)
    x, description, _ = load_batch(config.source, config.batch, config.seed)
    rows = invariance(x, config.kernel)
    path = draw_invariance(rows, config.kernel, os.path.join(config.out, "invariance.png"),
                           description)
    return {"files": {"invariance": path}, "rows": rows, "description": description}


def explain_phases(config: ExplainConfig, x, description: str) -> dict:
    """``aps.png`` and the numbers of :func:`~poolgrad.explain.polyphase.phase_choices`
    for the batch ``x``, with the terminal table."""
    if x.ndim != 3:
        raise ExplainError(f"--kind aps explains 2-d maps, got {description}")
    numbers = phase_choices(x)
    path = draw_phases(numbers, os.path.join(config.out, "aps.png"), config.examples,
                       description)
    return {"files": {"aps": path}, "numbers": numbers, "description": description,
            "table": render_phases(numbers, config.examples)}
