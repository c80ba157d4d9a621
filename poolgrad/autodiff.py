"""``vjp``, the one way to get gradients of poolgrad's NumPy operators, and its registry.

Each family of operators registers its public operators here (:func:`register`), each
with the private function that runs it and, given ``want_pullback=True``, also returns
its pullback: :mod:`poolgrad.ops` the core's, each module of :mod:`poolgrad.kinds` its
own. This module imports neither, so the registry has one home and no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable

# public operator -> ``rule(x, *args, want_pullback=True, **kwargs) -> (y, pullback)``
_RULES: dict[Callable, Callable] = {}


def register(rules: dict[Callable, Callable]) -> None:
    """Make ``vjp(op, ...)`` run ``rules[op]`` for each public operator ``op``."""
    _RULES.update(rules)


def operators() -> tuple[Callable, ...]:
    """Every operator :func:`vjp` takes, by name."""
    return tuple(sorted(_RULES, key=lambda f: f.__name__))


def vjp(op, x, *args, **kwargs):
    """Run ``op(x, *args, **kwargs)`` and return ``(y, pullback)``.

    ``pullback(dy)`` is the exact vector-Jacobian product: it returns ``dx`` with x's
    shape and dtype, for ``dy`` with the output's shape, and may be called more than
    once. With ``return_indices=True``, ``y`` is ``(values, indices)`` and ``dy`` is the
    gradient of the values. For :func:`~poolgrad.max_unpool`, ``x`` is the pooled values
    ``y``. ``op`` may be any operator of :mod:`poolgrad.ops` or of :mod:`poolgrad.kinds`;
    for one with learnable parameters (``gem_pool``'s ``p``, ``mixed_pool``'s
    ``alpha``), the pullback returns ``(dx, dparam, ...)``, or ``dx`` alone when called
    with ``params=False``.

    Example:
        >>> import poolgrad as pg
        >>> y, pullback = pg.vjp(pg.max_pool, np.array([[[[1.0, 3.0], [2.0, 0.5]]]]), 2)
        >>> pullback(np.full_like(y, 2.5))
        array([[[[0. , 2.5],
                 [0. , 0. ]]]])
    """
    rule = _RULES.get(op) if callable(op) else None
    if rule is None:
        names = ", ".join(f.__name__ for f in operators())
        raise TypeError(f"vjp needs one of poolgrad's operators ({names}), got {op!r}")
    return rule(x, *args, want_pullback=True, **kwargs)
