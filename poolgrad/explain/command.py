"""What ``poolgrad explain`` does: its settings, :class:`ExplainConfig`, checked in one
place, and the two sets of files it writes (:func:`explain`, :func:`explain_invariance`).
"""

from __future__ import annotations

import os
from dataclasses import InitVar, dataclass

import numpy as np

from ..tools import datasets
from ..tools.choices import check_choice
from ..tools.files import check_output_folder
from .figures import draw_batch, draw_classic, draw_examples, draw_overlap
from .inputs import SOURCES, checkpoint_model, load_batch
from .kinds import KINDS as WINDOW_KINDS
from .kinds import draw_window, render_window, window_gradient
from .polyphase import draw_phases, phase_choices, render_phases
from .routing import KINDS, ExplainError, route
from .translation import draw_invariance, invariance

# the bundled datasets --network trains on (checkpoint:DIR brings its own)
NETWORK_SOURCES = ("digits", "mnist1d")

# the layers ``--kind`` explains: the routing kinds, the other kinds' one-output
# gradients (:mod:`.kinds`), and adaptive polyphase sampling's choice of phase
# (:mod:`.polyphase`)
EXPLAINED = (*KINDS, *WINDOW_KINDS, "aps")


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
    ``examples`` unused). With ``network``, the batch question for a whole network
    (:func:`explain_network`; ``epochs`` of training first). ``batch`` None: 16, or 100
    with ``invariance`` or ``network``.

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
    network: bool = False
    epochs: int = 3
    flags: InitVar[bool] = False

    def __post_init__(self, flags: bool) -> None:
        check_choice(self.kind, EXPLAINED, "--kind" if flags else "kind", ExplainError)
        if not isinstance(self.source, str):
            raise ExplainError(f"source must be a string ({SOURCES}), got {self.source!r}")
        if self.network and self.invariance:
            raise ExplainError("--network and --invariance are two explanations: give one")
        if self.network and self.kind != "max":
            raise ExplainError(f"--network explains max and average pooling side by side; "
                               f"leave out --kind ({self.kind!r} given)")
        if self.network and not (self.source in NETWORK_SOURCES
                                 or self.source.startswith("checkpoint:")):
            raise ExplainError(f"--network needs labelled examples: --source "
                               f"{', '.join(NETWORK_SOURCES)} or checkpoint:DIR, got "
                               f"{self.source!r}")
        if not isinstance(self.epochs, int) or isinstance(self.epochs, bool) or self.epochs < 1:
            raise ExplainError(f"epochs must be an integer >= 1, got {self.epochs!r}")
        self._refuse_unused()
        if not self.invariance:
            if self.dy not in ("random", "ones"):
                raise ExplainError(f"dy must be 'random' or 'ones', got {self.dy!r}")
            if self.examples < 1:
                raise ExplainError(f"examples must be >= 1, got {self.examples}")
        if self.batch is None:
            object.__setattr__(self, "batch", 100 if self.invariance or self.network else 16)
        least = 2 if self.network else 1
        if not isinstance(self.batch, int) or isinstance(self.batch, bool) or self.batch < least:
            raise ExplainError(f"batch must be an integer >= {least}"
                               + (" with --network (a batch to average)" if self.network
                                  else "") + f", got {self.batch!r}")

    def _refuse_unused(self) -> None:
        """An ExplainError naming the settings the chosen explanation would ignore:
        ``--network`` builds its own layers, the kinds of :mod:`.kinds` use their 2x2
        windows, and a checkpoint is not trained again."""
        layer = ("kernel", "stride", "padding", "ties", "p", "dy")
        if self.network and self.source.startswith("checkpoint:"):
            unused = layer + ("channel", "epochs")
            what = "--network on a checkpoint (trained already, its own layers)"
        elif self.network:
            unused, what = layer + ("channel",), "--network (its own layers)"
        elif self.kind in (*WINDOW_KINDS, "aps"):
            unused = layer + ("epochs",)
            what = f"--kind {self.kind} " + ("(stride 2)" if self.kind == "aps"
                                             else "(2x2 windows, stride 2)")
        else:
            unused, what = ("epochs",), "this explanation (--epochs goes with --network)"
        given = [f"--{name}" for name in unused
                 if getattr(self, name) != self.__dataclass_fields__[name].default]
        if given:
            raise ExplainError(f"{what} takes no {', '.join(given)}")


def explain(config: ExplainConfig) -> dict:
    """Write the default set of figures into ``config.out`` and return their paths with
    the routing numbers: ``examples.png``, ``batch.png``, ``overlap.png`` (3x3 stride-2
    windows over the same batch) and ``max_vs_avg.png`` (the classic 4x4 diagram). For
    ``kind="aps"``, ``aps.png`` and the phases' numbers (:func:`explain_phases`); for
    the other kinds, ``KIND.png`` and one output's gradient (:func:`explain_window`)."""
    out = config.out
    check_output_folder(out, ExplainError)  # before the work, not after it
    x, description, layer = load_batch(config.source, config.batch, config.seed,
                                       config.channel)
    if config.kind == "aps":
        return explain_phases(config, x, description)
    if config.kind in WINDOW_KINDS:
        return explain_window(config, x, description)
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


def explain_window(config: ExplainConfig, x, description: str) -> dict:
    """``KIND.png`` and the numbers of :func:`~poolgrad.explain.kinds.window_gradient`
    for the batch ``x`` (where the gradient of one output goes), with the terminal
    grids."""
    if x.ndim != 3:
        raise ExplainError(f"--kind {config.kind} explains 2-d maps, got {description}")
    numbers = window_gradient(x, config.kind, config.seed)
    path = draw_window(numbers, os.path.join(config.out, f"{config.kind}.png"),
                       config.examples, description)
    return {"files": {config.kind: path}, "numbers": numbers, "description": description,
            "table": render_window(numbers, min(config.examples, 2))}


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


def explain_network(config: ExplainConfig) -> dict:
    """The batch question for a whole network (:mod:`.network`): a small CNN with max
    pooling and the same with average pooling, trained ``config.epochs`` epochs on
    ``config.source`` (or the network of ``checkpoint:DIR`` and the same weights with
    the other pooling), a batch of ``config.batch`` test examples, its gradients three
    ways and the optimizers' steps. Writes ``network_examples.png``,
    ``network_batch.png`` and ``network_steps.png``; returns their paths, the numbers
    and the terminal report."""
    from ..train import numpy_engine
    from . import network
    from .network_figures import draw_network_batch, draw_network_examples, draw_network_steps
    check_output_folder(config.out, ExplainError)  # before the training, not after it
    if config.source.startswith("checkpoint:"):
        folder = config.source[len("checkpoint:"):]
        model, data, settings = checkpoint_model(folder, dtype=np.float64)
        trained = network.first_pool(model)[1]
        other = "avg" if trained == "max" else "max"
        accuracy = numpy_engine.evaluate(model, data.x_test, data.y_test)[1]
        models = {trained: (model, f"the network in {folder} ({settings['dataset']}, "
                                    f"test accuracy {accuracy:.1%})"),
                  other: (network.swap_pooling(model, other),
                          f"the network in {folder} with {other} pooling in place of "
                          f"{trained}, the same weights")}
        dataset = settings["dataset"]
    else:
        dataset = config.source
        data = datasets.load(dataset)
        models = {}
        for pool in ("max", "avg"):
            model, accuracy = network.trained_network(data, pool, config.epochs, config.seed)
            models[pool] = (model, f"conv-ReLU-{pool} pool-linear, {config.epochs} epochs on "
                                   f"{dataset} (test accuracy {accuracy:.1%})")
    x, labels = network.test_batch(data, config.batch, config.seed)
    results, steps = [], []
    for pool in ("max", "avg"):
        model, description = models[pool]
        result = network.network_gradients(model, x, labels,
                                           f"{description}; {len(x)} {dataset} test examples")
        results.append(result)
        warmup = network.warmup_gradients(model, data, seed=config.seed)
        steps.append(network.optimizer_steps(model, {
            "examples": result.mean_of_examples, "batch": result.batch,
            "misconception": result.misconception}, warmup))
    out = config.out
    files = {"network_examples": draw_network_examples(
                 results[0], os.path.join(out, "network_examples.png"), config.examples),
             "network_batch": draw_network_batch(results, os.path.join(out, "network_batch.png")),
             "network_steps": draw_network_steps(results, steps,
                                                 os.path.join(out, "network_steps.png"))}
    step_numbers = [network.step_numbers(step) for step in steps]
    return {"files": files, "results": results, "steps": step_numbers,
            "text": network.render_network(results, step_numbers)}
