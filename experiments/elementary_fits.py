"""Fit the polynomials of :func:`poolgrad.kernels.elementary.log2_for_float32` and
:func:`~poolgrad.kernels.elementary.exp2_for_float32`, and print their worst errors.

    python experiments/elementary_fits.py     # needs mpmath (PyTorch's sympy brings it)

Both are weighted minimax fits by Lawson's algorithm (iteratively reweighted least
squares) on Chebyshev nodes, against mpmath at 50 digits:

* ``log2 m = s P(s^2)``, ``s = (m - 1) / (m + 1)``, ``|s| <= (sqrt 2 - 1) / (sqrt 2 + 1)``:
  ``P``'s constant term is held at ``2 / ln 2`` (so that ``log2`` stays relative near
  ``m = 1``) and the rest, ``u Q(u)`` with ``Q`` cubic, minimise the absolute error
  ``|s| |P(s^2) - 2 atanh(s) / (s ln 2)|``: 5 terms where the Taylor series needs 6.
* ``2^r = 1 + r R(r)``, ``|r| <= 1/2``: the constant held at 1, ``R`` of degree 7
  minimising the relative error: 9 terms where the Taylor series needs 10.

The errors printed are those of the float64 evaluation in the kernels' order
(Estrin's scheme), on 200001 points; the module docstring states the bounds they meet.
"""

import mpmath
import numpy as np

mpmath.mp.dps = 50
NODES = 3000


def lawson(columns: np.ndarray, target: np.ndarray, rounds: int = 400) -> np.ndarray:
    """The coefficients minimising ``max |columns @ c - target|`` (rows already
    weighted), by Lawson's reweighting of least squares."""
    weights = np.full(len(target), 1.0 / len(target))
    for _ in range(rounds):
        root = np.sqrt(weights)
        coefficients = np.linalg.lstsq(columns * root[:, None], target * root, rcond=None)[0]
        weights *= np.abs(columns @ coefficients - target)
        weights /= weights.sum()
    return coefficients


def chebyshev_nodes(low, high):
    return [low + (high - low) * (1 - mpmath.cos(mpmath.pi * (i + 0.5) / NODES)) / 2
            for i in range(NODES)]


def log2_series():
    first = 2 / mpmath.log(2)
    top = (mpmath.sqrt(2) - 1) / (mpmath.sqrt(2) + 1)
    us = chebyshev_nodes(0, top ** 2)
    # (P(u) - first) / u against Q(u), weighted by |s| u = u^1.5
    target = np.array([float((first * mpmath.atanh(mpmath.sqrt(u)) / mpmath.sqrt(u) - first)
                             / u * u ** 1.5) for u in us])
    columns = np.array([[float(u ** k * u ** 1.5) for k in range(4)] for u in us])
    coefficients = (float(first), *lawson(columns, target))
    s = np.linspace(-float(top), float(top), 200001)
    s2 = s * s
    s4 = s2 * s2
    c = coefficients
    got = s * ((c[0] + c[1] * s2) + s4 * ((c[2] + c[3] * s2) + s4 * c[4]))
    exact = np.array([float(first * mpmath.atanh(mpmath.mpf(v))) for v in s])
    return coefficients, np.max(np.abs(got - exact))


def exp2_series():
    rs = chebyshev_nodes(mpmath.mpf(-0.5), mpmath.mpf(0.5))
    # (2^r - 1) / r against R(r), weighted by |r| / 2^r (relative)
    pairs = [(r, abs(r) / mpmath.power(2, r)) for r in rs]
    target = np.array([float((mpmath.power(2, r) - 1) / r * w) for r, w in pairs])
    columns = np.array([[float(r ** k * w) for k in range(8)] for r, w in pairs])
    coefficients = (1.0, *lawson(columns, target))
    r = np.linspace(-0.5, 0.5, 200001)
    r2 = r * r
    r4 = r2 * r2
    c = coefficients
    got = (((c[0] + c[1] * r) + r2 * (c[2] + c[3] * r))
           + r4 * (((c[4] + c[5] * r) + r2 * (c[6] + c[7] * r)) + r4 * c[8]))
    exact = np.array([float(mpmath.power(2, mpmath.mpf(v))) for v in r])
    return coefficients, np.max(np.abs(got - exact) / exact)


if __name__ == "__main__":
    for name, (coefficients, error) in (("log2, absolute", log2_series()),
                                        ("exp2, relative", exp2_series())):
        print(f"{name}: worst error 2**{np.log2(error):.2f}")
        print("    (" + ", ".join(repr(float(c)) for c in coefficients) + ")")
