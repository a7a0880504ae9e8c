"""Batch optimisation with L-BFGS-B on a deterministic objective."""

import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import minimize

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
    bounds : sequence of (low, high) or None, default=None
        Per-coordinate bounds (``None`` entries for unbounded).
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

    def negated(x):
        value, grad = value_and_grad(x)
        return -value, -grad

    def on_iteration(intermediate_result):
        value = -float(intermediate_result.fun)
        history.append(value)
        if callback is not None:
            callback(len(history), value, intermediate_result.x)

    result = minimize(
        negated,
        x0,
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        callback=on_iteration,
        options={"maxiter": max_iter, "ftol": tol, "gtol": tol, "maxcor": 20},
    )
    converged = bool(result.success) and result.nit < max_iter
    return OptimizationResult(
        x=result.x,
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
