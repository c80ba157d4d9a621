"""The dispatch's rules for the ``"triton"`` backend (CUDA tensors): one Triton kernel
per pass (:mod:`.triton_pool`), launched by :mod:`.triton_runs`, which imports Triton
only when a Triton kernel is first chosen."""

from __future__ import annotations

from .rule import Rule, always, values_only


def _triton(name: str, *args):
    """A ``bind`` that imports the Triton runs on first use: ``plan -> run``."""
    def bind(plan):
        try:
            from . import triton_runs
        except ImportError as error:
            raise ImportError(f"poolgrad's CUDA kernels need Triton ({error}); install it "
                              f"with: pip install triton") from error
        return getattr(triton_runs, name)(plan, *args)
    return bind


_TRITON_AVG = {
    "forward": [Rule("triton_pool.avg_forward", always, _triton("avg_forward_run"))],
    "backward": [Rule("triton_pool.avg_backward", always, _triton("avg_backward_run"))],
}

# One kernel per pass: the windows are recomputed per element, so every geometry and
# layout takes the same kernel (layout and adaptivity are its compile-time constants).
RULES = {
    ("max", "forward"): [
        Rule("triton_pool.max_values_forward", values_only(always),
              _triton("max_forward_run", False)),
        Rule("triton_pool.max_forward", always, _triton("max_forward_run", True),
              records=True),
    ],
    ("max", "backward"): [
        Rule("triton_pool.max_backward", always, _triton("max_backward_run"))],
    ("max", "gather"): [Rule("triton_pool.max_gather", always, _triton("max_gather_run"))],
    ("max", "indices"): [
        Rule("triton_pool.max_indices", always, _triton("max_indices_run"))],
    ("avg", "forward"): _TRITON_AVG["forward"],
    ("avg", "backward"): _TRITON_AVG["backward"],
    ("global_avg", "forward"): _TRITON_AVG["forward"],
    ("global_avg", "backward"): _TRITON_AVG["backward"],
    ("lp", "forward"): [Rule("triton_pool.lp_forward", always, _triton("lp_forward_run"))],
    ("lp", "backward"): [Rule("triton_pool.lp_backward", always, _triton("lp_backward_run"))],
    ("max", "tie_count"): [
        Rule("triton_pool.max_tie_count", always, _triton("tie_count_run"))],
    ("max", "split"): [
        Rule("triton_pool.max_split_backward", always, _triton("split_backward_run"))],
    ("unpool", "forward"): [
        Rule("triton_pool.unpool_place", always, _triton("unpool_forward_run"))],
    ("unpool", "backward"): [
        Rule("triton_pool.unpool_gather", always, _triton("unpool_backward_run"))],
}
