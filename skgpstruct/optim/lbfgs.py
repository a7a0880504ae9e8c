"""Batch optimisation with L-BFGS-B on a deterministic objective."""

import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize

from .box import SmoothBox, bound_arrays

__all__ = ["OptimizationResult", "minimize_lbfgs"]


@dataclass
class OptimizationResult:
    """Outcome of an optimisation run.

    Attributes
    ----------
    x : ndarray
        The best point found.
    value : float
        Objective (to be maximised) at ``x``.
    n_iter : int
        Number of iterations performed.
    converged : bool
        Whether the convergence rule was met before ``max_iter``.
    message : str
        The optimiser's own message.
    history : list of float
        Objective after every iteration.
    """

    x: np.ndarray
    value: float
    n_iter: int
    converged: bool
    message: str
    history: list = field(default_factory=list)


def minimize_lbfgs(
    value_and_grad, x0, *, bounds=None, max_iter=200, tol=1e-6, callback=None
):
    """Maximise ``value_and_grad`` with L-BFGS-B.

    Parameters
    ----------
    value_and_grad : callable
        ``value_and_grad(x) -> (value, gradient)`` of the objective to
        **maximise**; it must be deterministic.
    x0 : ndarray of shape (n,)
    bounds : sequence of (low, high), array of shape (n, 2) or None
        Per-coordinate bounds (``None`` or infinite entries for unbounded).
        They are enforced by a smooth bijection (:class:`~.box.SmoothBox`,
        the identity well inside the box) and the optimiser itself runs
        unconstrained: L-BFGS-B costs about twice as much per iteration as
        soon as any coordinate is bounded.
    max_iter : int, default=200
    tol : float, default=1e-6
        Convergence rule: stop when the relative change of the objective
        between iterations, ``|f_k - f_{k+1}| / max(|f_k|, |f_{k+1}|, 1)``,
        falls below ``tol``, or the projected gradient's largest entry falls
        below ``tol``.
    callback : callable or None
        ``callback(iteration, value, x)`` after each iteration.

    Returns
    -------
    OptimizationResult
    """
    history = []
    box = SmoothBox(*bound_arrays(bounds, np.size(x0)))

    def negated(z):
        value, grad = value_and_grad(box.to_box(z))
        return -value, -box.chain(z, grad)

    def on_iteration(intermediate_result):
        value = -float(intermediate_result.fun)
        history.append(value)
        if callback is not None:
            callback(len(history), value, box.to_box(intermediate_result.x))

    result = minimize(
        negated,
        box.from_box(x0),
        jac=True,
        method="L-BFGS-B",
        callback=on_iteration,
        options={"maxiter": max_iter, "ftol": tol, "gtol": tol, "maxcor": 10},
    )
    converged = bool(result.success) and result.nit < max_iter
    return OptimizationResult(
        x=box.to_box(result.x),
        value=-float(result.fun),
        n_iter=int(result.nit),
        converged=converged,
        message=str(result.message),
        history=history,
    )


class Timer:
    """Seconds since construction (for progress lines)."""

    def __init__(self):
        self.start = time.perf_counter()

    def __call__(self):
        return time.perf_counter() - self.start


def minimize_lbfgs_rounds(
    make_value_and_grad,
    x0,
    *,
    round_size=10,
    bounds=None,
    max_iter=200,
    tol=1e-6,
    callback=None,
):
    """Maximise a sequence of deterministic surrogates with L-BFGS-B.

    Round ``r`` maximises ``make_value_and_grad(r, x_start)`` (a deterministic
    objective built around the round's starting point, such as an
    importance-weighted Monte Carlo estimate with samples drawn there) for
    at most ``round_size`` iterations, then the next round starts from its
    result.

    Parameters
    ----------
    make_value_and_grad : callable
        ``make_value_and_grad(round_index, x_start) -> value_and_grad``.
    x0 : ndarray of shape (n,)
    round_size : int, default=10
    bounds, max_iter, callback
        As in :func:`minimize_lbfgs` (``max_iter`` counts iterations over
        all rounds).
    tol : float, default=1e-6
        Stop when a round improves its own objective by less than ``tol``
        relative to the objective's magnitude.

    Returns
    -------
    OptimizationResult
    """
    x = np.asarray(x0, dtype=np.float64)
    history, n_iter, round_index = [], 0, 0
    converged, message, value = False, "", None

    def shifted_callback(iteration, value, x):
        if callback is not None:
            callback(n_iter + iteration, value, x)

    while n_iter < max_iter:
        value_and_grad = make_value_and_grad(round_index, x)
        start_value = value_and_grad(x)[0]
        result = minimize_lbfgs(
            value_and_grad,
            x,
            bounds=bounds,
            max_iter=min(round_size, max_iter - n_iter),
            tol=tol,
            callback=shifted_callback,
        )
        n_iter += max(result.n_iter, 1)
        history.extend(result.history)
        x, value, message = result.x, result.value, result.message
        round_index += 1
        if abs(value - start_value) <= tol * max(abs(value), abs(start_value), 1.0):
            converged = True
            break
    return OptimizationResult(
        x=x,
        value=value,
        n_iter=n_iter,
        converged=converged,
        message=f"{round_index} rounds; last: {message}",
        history=history,
    )
