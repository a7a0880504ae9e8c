"""Box constraints as arrays, and a smooth map that removes them.

The variational parameters are unbounded: only a few kernel
hyperparameters are not. :class:`SmoothBox` maps an unbounded vector onto
the box, with the identity well inside it, so that the batch optimiser
(:func:`~skgpstruct.optim.minimize_lbfgs`) runs unconstrained. (scipy's
L-BFGS-B, used before, also did noticeably more work per iteration as soon
as one coordinate was bounded.)
"""

import numpy as np

__all__ = ["bound_arrays", "SmoothBox"]


def bound_arrays(bounds, n):
    """``bounds`` as two arrays ``(low, high)`` of shape (n,), with infinities.

    Parameters
    ----------
    bounds : None, sequence of (low, high) pairs or array of shape (n, 2)
        ``None`` (in a pair) or an infinity means no bound on that side.
    n : int

    Returns
    -------
    low, high : ndarray of shape (n,)
    """
    if bounds is None:
        return np.full(n, -np.inf), np.full(n, np.inf)
    if isinstance(bounds, np.ndarray):
        pairs = np.asarray(bounds, dtype=np.float64)
    else:
        pairs = np.array(
            [
                (-np.inf if lo is None else lo, np.inf if hi is None else hi)
                for lo, hi in bounds
            ],
            dtype=np.float64,
        )
    if pairs.shape != (n, 2):
        raise ValueError(f"bounds must have shape ({n}, 2), got {pairs.shape}")
    low, high = pairs[:, 0].copy(), pairs[:, 1].copy()
    if np.any(np.isnan(pairs)) or np.any(low >= high):
        raise ValueError("bounds must have low < high on every coordinate")
    return low, high


def _softplus(x):
    return np.logaddexp(0.0, x)


def _expit(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


class SmoothBox:
    """Smooth increasing bijection from the real line onto ``(low, high)``.

    Per coordinate, ``x = z + softplus(low - z) - softplus(z - high)``
    (a term is dropped when its bound is infinite). More than a few units
    inside the box, ``x = z`` to within ``exp(-distance)``; the map
    saturates at the bounds, which are never reached.

    Parameters
    ----------
    low, high : ndarray of shape (n,)
        From :func:`bound_arrays`.
    """

    def __init__(self, low, high):
        self.low, self.high = low, high
        self.index = np.flatnonzero(np.isfinite(low) | np.isfinite(high))
        self._low = low[self.index]
        self._high = high[self.index]
        self._has_low = np.isfinite(self._low)
        self._has_high = np.isfinite(self._high)

    def to_box(self, z):
        """The point ``x`` in the box for the unbounded vector ``z``."""
        x = np.array(z, dtype=np.float64)
        zb = x[self.index]
        x[self.index] = (
            zb
            + np.where(self._has_low, _softplus(self._low - zb), 0.0)
            - np.where(self._has_high, _softplus(zb - self._high), 0.0)
        )
        return x

    def from_box(self, x):
        """Inverse of :meth:`to_box`; ``x`` is first moved strictly inside."""
        z = np.array(x, dtype=np.float64)
        xb = z[self.index]
        # A margin keeps the logarithms finite for a point on a bound (at
        # most a quarter of the box: a narrower box than twice the margin
        # clipped every point outside it, and the logarithms were NaN).
        margin = np.minimum(
            1e-8 * np.maximum(1.0, np.abs(xb)), 0.25 * (self._high - self._low)
        )
        xb = np.clip(xb, self._low + margin, self._high - margin)
        with np.errstate(divide="ignore"):
            z[self.index] = (
                xb
                + np.where(self._has_low, np.log(-np.expm1(self._low - xb)), 0.0)
                - np.where(self._has_high, np.log(-np.expm1(xb - self._high)), 0.0)
            )
        return z

    def longest_step(self, z, p, overshoot):
        """The largest ``alpha`` with which ``z + alpha p`` takes no bounded
        coordinate more than ``overshoot`` beyond its bound, or beyond
        itself when it is already there (``inf`` when nothing limits it).

        Beyond a bound by ``d`` the map's slope is about ``exp(-d)``: a
        coordinate thrown far beyond it has a vanishing gradient and
        cannot come back.
        """
        zb, pb = np.asarray(z)[self.index], np.asarray(p)[self.index]
        with np.errstate(divide="ignore", invalid="ignore"):
            up = np.where(
                self._has_high & (pb > 0),
                (np.maximum(zb, self._high) + overshoot - zb) / pb, np.inf,
            )
            down = np.where(
                self._has_low & (pb < 0),
                (np.minimum(zb, self._low) - overshoot - zb) / pb, np.inf,
            )
        return float(min(up.min(initial=np.inf), down.min(initial=np.inf)))

    def chain(self, z, grad):
        """Gradient with respect to ``z`` from the gradient at ``to_box(z)``."""
        out = np.array(grad, dtype=np.float64)
        zb = np.asarray(z)[self.index]
        slope = (
            1.0
            - np.where(self._has_low, _expit(self._low - zb), 0.0)
            - np.where(self._has_high, _expit(zb - self._high), 0.0)
        )
        out[self.index] *= slope
        return out
