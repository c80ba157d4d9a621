"""The dispatch's rules for the pooling kinds of :mod:`poolgrad.kinds`: anti-aliased
pooling (:mod:`.blur`), the weighted window averages (:mod:`.weighted`), fractional
max pooling (:mod:`.fractional`, whose windows come with each call) and GeM
(:mod:`.power_mean`: global on ``(N, C, L)`` views, channels innermost or planes, and
over sliding windows). Each has one kernel per pass and layout; the run signatures are
in :mod:`.dispatch`."""

from __future__ import annotations

from . import blur, fractional, power_mean, weighted
from .rule import Rule, always


def _blur(plan):
    def run(x, y, winners):
        blur.blur_pool_forward(x, plan.pre_kernel, plan.passes, plan.shapes,
                               plan.weights(x.dtype), y, winners)
    return run


def _blur_back(plan):
    def run(dy, winners, dx):
        blur.blur_pool_backward(dy, plan.pre_kernel, plan.passes, plan.shapes,
                                plan.weights(dy.dtype), winners, dx)
    return run


def _weighted(plan):
    return lambda x, y, norm, kind: weighted.weighted_pool_forward(x, plan.table, kind, y, norm)


def _weighted_back(plan):
    ptr, outs, _ = plan.cover
    return lambda x, y, norm, dy, kind, dx: weighted.weighted_pool_backward(
        x, y, norm, dy, kind, ptr, outs, dx)


def _sample(plan):
    return lambda x, draws, y, pos: weighted.stochastic_pool_sample(
        x, plan.table, plan.extent, draws, y, pos)


def _gem(plan):
    return lambda x, eps, p, whole, y: power_mean.gem_window_forward(
        x, plan.table, eps, p, whole, y)


def _gem_back(plan):
    ptr, outs, _ = plan.cover
    return lambda x, y, dy, eps, p, whole, dx: power_mean.gem_window_backward(
        x, y, dy, plan.table, eps, p, whole, ptr, outs, dx)


def _gem_p_terms(plan):
    return lambda x, y, dy, eps, p, whole, terms: power_mean.gem_window_p_terms(
        x, y, dy, plan.table, eps, p, whole, terms)


def _channels_innermost(plan, operand, record):
    return operand.layout == "channels_last"


def _bound(kernel):
    return lambda plan: kernel


RULES = {
    ("gem_global", "forward"): [
        Rule("power_mean.gem_global_forward_channels_last", _channels_innermost,
             _bound(power_mean.gem_global_forward_channels_last)),
        Rule("power_mean.gem_global_forward_planes", always,
             _bound(power_mean.gem_global_forward_planes))],
    ("gem_global", "backward"): [
        Rule("power_mean.gem_global_backward_channels_last", _channels_innermost,
             _bound(power_mean.gem_global_backward_channels_last)),
        Rule("power_mean.gem_global_backward_planes", always,
             _bound(power_mean.gem_global_backward_planes))],
    ("gem", "forward"): [Rule("power_mean.gem_window_forward", always, _gem)],
    ("gem", "backward"): [Rule("power_mean.gem_window_backward", always, _gem_back)],
    ("gem", "p_terms"): [Rule("power_mean.gem_window_p_terms", always, _gem_p_terms)],
    ("blur", "forward"): [Rule("blur.blur_pool_forward", always, _blur, records=True)],
    ("blur", "backward"): [Rule("blur.blur_pool_backward", always, _blur_back)],
    ("weighted", "forward"): [
        Rule("weighted.weighted_pool_forward", always, _weighted)],
    ("weighted", "backward"): [
        Rule("weighted.weighted_pool_backward", always, _weighted_back)],
    ("stochastic", "sample"): [
        Rule("weighted.stochastic_pool_sample", always, _sample, records=True)],
    ("fractional", "forward"): [Rule("fractional.fractional_max_forward", always,
                                     _bound(fractional.fractional_max_forward),
                                     records=True)],
    ("fractional", "backward"): [Rule("fractional.fractional_max_backward", always,
                                      _bound(fractional.fractional_max_backward))],
    ("fractional", "indices"): [Rule("fractional.fractional_max_indices", always,
                                     _bound(fractional.fractional_max_indices))],
}
