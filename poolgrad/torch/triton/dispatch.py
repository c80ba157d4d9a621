"""The one place that chooses a Triton kernel: by op, pass and (max forward) whether the
winners are recorded.

:mod:`poolgrad.torch._cuda` describes a call, ``choose(op, direction, plan)``, and runs
the :class:`~poolgrad.kernels.rule.Kernel` it gets back on 5-d tensors ``(N, C, D,
H, W)`` of any strides. The runs take the arguments of the Numba dispatch's signatures
(:mod:`poolgrad.kernels.dispatch`), except that:

* an average's ``divisor`` is ``(mode, override)``, ``mode`` ``"padded"`` or ``"real"``;
* max has a ``"gather"`` pass, ``run(src, pos, out)``: ``src`` read at each window's
  winner;
* an unpool forward with ``y`` None finds ``written`` alone;
* GeM (global windows included) takes ``p`` as the op's tensor and ``eps`` as a float:
  ``run(x, y, p, eps)``, ``run(x, y, dy, p, eps, dx)`` and ``p_terms``'
  ``run(x, y, dy, p, eps, terms)``.
* the weighted averages, the blends and the stochastic draw take the Numba
  signatures, with ``norm`` and ``pos`` stored as ``y``;
* fractional max pooling (``plan`` None) takes its windows' tables and the per-axis
  bound on their lengths: ``run(x, starts, lengths, extent, y, pos)``, ``run(dy, pos,
  starts, first, last, extent, dx)`` and ``run(pos, starts, extent, sizes, indices)``
  (:mod:`.fractional`);
* the blur kinds (``plan`` a :class:`~poolgrad.geometry.BlurPlan`) take ``run(x, y)``,
  ``run(x, pos)`` (a max-blur's ``"winners"``) and ``run(dy, g)``, ``g`` the input's
  gradient or a max-blur's stride-1 map's, which max pooling's backward routes
  (:mod:`.blur`);
* circular padding (``plan`` None) takes ``run(x, before, out)`` and its fold
  ``run(dy, before, dx)``, ``before`` the padding ahead of each axis ``(D, H, W)``.

There is one kernel per pass: the windows are recomputed per element, so every
geometry and layout takes the same kernel, with layout and adaptivity as its
compile-time constants. Triton itself is imported only when a kernel is first chosen,
so poolgrad.torch works on the CPU without it.
"""

from __future__ import annotations

import functools

from ...kernels.rule import Kernel, Rule, always, rules_of, values_only


def _launched(name: str, *args):
    """A ``bind`` that imports the launcher (and so Triton) on first use:
    ``plan -> run``."""
    def bind(plan):
        try:
            from . import launch
        except ImportError as error:
            raise ImportError(f"poolgrad's CUDA kernels need Triton ({error}); install it "
                              f"with: pip install triton") from error
        return getattr(launch, name)(plan, *args)
    return bind


_AVG = {
    "forward": [Rule("triton.avg_forward", always, _launched("avg_forward_run"))],
    "backward": [Rule("triton.avg_backward", always, _launched("avg_backward_run"))],
}

RULES = {
    ("max", "forward"): [
        Rule("triton.max_values_forward", values_only(always),
             _launched("max_forward_run", False)),
        Rule("triton.max_forward", always, _launched("max_forward_run", True),
             records=True),
    ],
    ("max", "backward"): [Rule("triton.max_backward", always, _launched("max_backward_run"))],
    ("max", "gather"): [Rule("triton.max_gather", always, _launched("max_gather_run"))],
    ("max", "indices"): [Rule("triton.max_indices", always, _launched("max_indices_run"))],
    ("max", "tie_count"): [
        Rule("triton.max_tie_count", always, _launched("tie_count_run"))],
    ("max", "split"): [
        Rule("triton.max_split_backward", always, _launched("split_backward_run"))],
    ("avg", "forward"): _AVG["forward"],
    ("avg", "backward"): _AVG["backward"],
    ("global_avg", "forward"): _AVG["forward"],
    ("global_avg", "backward"): _AVG["backward"],
    ("lp", "forward"): [Rule("triton.lp_forward", always, _launched("lp_forward_run"))],
    ("lp", "backward"): [Rule("triton.lp_backward", always, _launched("lp_backward_run"))],
    ("gem", "forward"): [Rule("triton.gem_forward", always, _launched("gem_forward_run"))],
    ("gem", "backward"): [Rule("triton.gem_backward", always, _launched("gem_backward_run"))],
    ("gem", "p_terms"): [Rule("triton.gem_p_terms", always, _launched("gem_p_terms_run"))],
    ("weighted", "forward"): [
        Rule("triton.weighted_forward", always, _launched("weighted_forward_run"))],
    ("weighted", "backward"): [
        Rule("triton.weighted_backward", always, _launched("weighted_backward_run"))],
    ("blend", "forward"): [
        Rule("triton.blend_forward", always, _launched("blend_forward_run"))],
    ("blend", "backward"): [
        Rule("triton.blend_backward", always, _launched("blend_backward_run"))],
    ("stochastic", "sample"): [
        Rule("triton.stochastic_sample", always, _launched("stochastic_sample_run"),
             records=True)],
    ("fractional", "forward"): [
        Rule("triton.fractional_forward", always, _launched("fractional_forward_run"),
             records=True)],
    ("fractional", "backward"): [
        Rule("triton.fractional_backward", always, _launched("fractional_backward_run"))],
    ("fractional", "indices"): [
        Rule("triton.fractional_indices", always, _launched("fractional_indices_run"))],
    ("blur", "forward"): [Rule("triton.blur_forward", always, _launched("blur_forward_run"))],
    ("blur", "winners"): [Rule("triton.blur_winners", always, _launched("blur_winners_run"))],
    ("blur", "backward"): [
        Rule("triton.blur_backward", always, _launched("blur_backward_run"))],
    ("polyphase", "norms"): [
        Rule("triton.phase_norm_partials", always, _launched("polyphase_norms_run"))],
    ("polyphase", "gather"): [
        Rule("triton.phase_gather", always, _launched("polyphase_gather_run"))],
    ("polyphase", "scatter"): [
        Rule("triton.phase_scatter", always, _launched("polyphase_scatter_run"))],
    ("circular", "pad"): [Rule("triton.circular_pad", always, _launched("circular_pad_run"))],
    ("circular", "fold"): [
        Rule("triton.circular_fold", always, _launched("circular_fold_run"))],
    ("unpool", "forward"): [
        Rule("triton.unpool_place", always, _launched("unpool_forward_run"))],
    ("unpool", "backward"): [
        Rule("triton.unpool_gather", always, _launched("unpool_backward_run"))],
}


def rules(op: str, direction: str) -> list[Rule]:
    """The rules of ``(op, direction)``, or a ValueError naming the known passes."""
    return rules_of(RULES, op, direction, "Triton")


@functools.lru_cache(maxsize=1024)
def choose(op: str, direction: str, plan, *, record: bool = False) -> Kernel:
    """The Triton kernel for one pass of one call (``plan`` None for unpooling); a max
    forward with ``record`` writes the winners."""
    for rule in rules(op, direction):
        if rule.serves(plan, None, record):
            return Kernel(rule.name, rule.bind(plan), rule.records)
    raise AssertionError("the last rule of every list serves every call")


def names(op: str, direction: str) -> list[str]:
    """Every kernel that may serve ``(op, direction)``, in the order they are tried."""
    return [rule.name for rule in rules(op, direction)]
