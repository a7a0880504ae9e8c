"""Batch optimisation with unconstrained L-BFGS on a deterministic objective.

:func:`minimize_lbfgs` maximises a deterministic objective with a limited
memory BFGS method written here in NumPy. Box bounds never reach the
optimiser: :class:`~.box.SmoothBox` maps an unbounded vector onto the box,
so the optimiser runs unconstrained.

Why not scipy's ``minimize(method="L-BFGS-B")``: with no bounds, its
machinery for them (generalised Cauchy point, subspace minimisation) is
wasted work, and on the GP's largest problem (about 270,000 coordinates,
one objective evaluation about 50 ms) a profile showed its Fortran
``setulb`` costing about 8.7 ms per call and two calls per iteration, about
17 ms per iteration and over 20 % of the fit. Here an iteration costs two
matrix-vector products with the ``(2m, n)`` memory, a few ``O(n)`` vector
operations and ``O(m^3)`` algebra on ``m = 20``; a few milliseconds at that
size.

The method:

* **Direction.** The inverse Hessian approximation is used in the compact
  form of Byrd, Nocedal and Schnabel (1994), eq. (3.1)::

      H = gamma I + [S  gamma Y] [[R^-T (D + gamma Y^T Y) R^-1, -R^-T],
                                  [-R^-1,                          0 ]]
                                 [S  gamma Y]^T

  with ``S``, ``Y`` the ``m`` most recent steps and gradient changes
  (oldest first), ``R`` the upper triangle of ``S^T Y``, ``D`` its diagonal
  and ``gamma = s^T y / y^T y`` of the newest pair. ``H g`` takes the
  products ``S g`` and ``Y g``, two small triangular solves and one product
  with ``[S Y]`` transposed; the same numbers as the two-loop recursion,
  without its ``4m`` separate passes over ``n``-vectors from Python. The
  pairs live in a preallocated ring buffer, and ``R`` and ``Y^T Y`` are
  updated when a pair enters. That needs the memory's products with the new
  ``y = g_new - g``: they are those with ``g_new`` (computed then, and kept
  for the next direction) minus those with ``g`` (kept from the last
  direction), so an iteration passes over the memory twice, not three
  times. A pair with ``s^T y <= eps * y^T y`` is not stored (as in
  L-BFGS-B). The pairs are stored in single precision: those passes are
  limited by memory bandwidth, and 20 pairs in single precision cost less
  than 10 in double. On the dev splits of ``benchmarks/dev_splits.py``
  20 pairs took 6 to 21 % fewer iterations than 10, and single precision
  within a few iterations of double, at the same errors (doc/
  benchmark_history.rst, commit 88f44e6).
* **Step.** A strong Wolfe line search (:func:`scipy.optimize.line_search`,
  ``c1 = 1e-4``, ``c2 = 0.9``) trying the unit step first; with an empty
  memory (first iteration, after a reset) the steepest-descent direction is
  scaled to step ``min(1, 1 / max|g|)``. Every point is evaluated once
  (value and gradient together). A non-finite value or gradient counts as
  a failed trial. When the Wolfe search gives up (near a region where the
  objective is infinite, the curvature condition may be out of reach), the
  lowest point it evaluated is taken if it satisfies the sufficient-decrease
  condition, else the step is halved, from the shortest step rejected, until
  it does. When no step is found the memory is dropped and steepest descent
  tried once; if that fails too the run stops. The best point evaluated is
  returned.
* **Convergence** (scipy's ``ftol``/``gtol`` rule): the relative change of
  the objective over an iteration, or the largest gradient entry, at most
  ``tol``.
"""

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import solve_triangular
from scipy.linalg.blas import daxpy
from scipy.optimize import line_search

from .._linalg import same_vector
from .box import SmoothBox, bound_arrays

__all__ = [
    "NonFiniteStart", "OptimizationResult", "minimize_lbfgs", "minimize_lbfgs_rounds",
]

#: Number of curvature pairs kept (scipy's ``maxcor`` is 10).
MEMORY = 20
#: Storage of the pairs in minimize_lbfgs (see _CompactMemory).
MEMORY_DTYPE = np.float32
#: Wolfe constants: sufficient decrease and curvature.
C1, C2 = 1e-4, 0.9
#: Curvature threshold for storing a pair (L-BFGS-B's).
CURVATURE_EPS = np.finfo(np.float64).eps
#: Halvings of the fallback backtracking (it stops earlier when the trial
#: point no longer differs from the current one).
MAX_HALVINGS = 60

#: The messages of scipy's line search warnings.
LINE_SEARCH_WARNINGS = r"(The line search algorithm|Rounding errors prevent the line)"

MESSAGE_LIMIT = "STOP: TOTAL NO. OF ITERATIONS REACHED LIMIT"
MESSAGE_GRADIENT = "CONVERGENCE: MAX |GRADIENT| <= TOL"
MESSAGE_REDUCTION = "CONVERGENCE: RELATIVE REDUCTION OF F <= TOL"
MESSAGE_LINE_SEARCH = (
    "ABNORMAL: line search failed: no step along steepest descent (nor "
    "along the L-BFGS direction, when there was one) improves the objective "
    "enough; rounding errors near the optimum, or a gradient inconsistent "
    "with the objective"
)


class NonFiniteStart(ValueError):
    """The objective or its gradient is not finite at the starting point."""


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


class _CompactMemory:
    """The L-BFGS inverse Hessian in compact form, on a ring buffer of pairs.

    Parameters
    ----------
    n : int
        Number of coordinates.
    m : int
        Number of pairs kept.
    dtype : {numpy.float64, numpy.float32}, default=numpy.float64
        Storage of the pairs. In single precision the passes over the memory
        (the products with it, which are limited by memory bandwidth) move
        half the bytes; their rounding, about ``1e-7`` relative, perturbs
        the approximation, not the objective or its gradient, and the small
        ``m x m`` algebra stays in double precision.

    Attributes
    ----------
    pairs : ndarray of shape (m, 2, n)
        ``pairs[j] = (s, y)`` for buffer slot ``j``; slots ``0 .. len - 1``
        are in use.
    order : list of int
        Slots in use, oldest pair first.
    sy : ndarray of shape (m, m)
        ``sy[i, j] = s_i^T y_j`` (slots) for ``i`` not newer than ``j``;
        the other entries are stale and never read.
    yy : ndarray of shape (m, m)
        ``yy[i, j] = y_i^T y_j`` (slots).
    gamma : float
        ``s^T y / y^T y`` of the newest pair (1 when empty).

    Notes
    -----
    Each iteration needs the products of the memory with the new gradient
    (for the direction) and with ``y`` (for ``S^T Y`` and ``Y^T Y``). The
    products with the gradient are kept (:meth:`inverse_hessian_times`
    stores them, :meth:`push` computes them for the next gradient), so that
    ``memory @ y = memory @ g_new - memory @ g_old`` costs no pass over the
    memory: one matrix-vector product per iteration fewer, out of three.
    """

    def __init__(self, n, m=MEMORY, dtype=np.float64):
        self.n, self.m = n, m
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float64, np.float32):
            raise ValueError(f"dtype must be float64 or float32, got {dtype!r}")
        self.pairs = np.empty((m, 2, n), dtype=self.dtype)
        # The combination of the pairs in inverse_hessian_times, before it
        # is added to the float64 result (single precision storage only).
        self._combination = (
            np.empty(n, dtype=self.dtype) if self.dtype != np.float64 else None
        )
        self.sy = np.zeros((m, m))
        self.yy = np.zeros((m, m))
        self.order = []
        self.gamma = 1.0
        # (g, memory @ g by slot) for the last gradient seen, or None.
        self._products = None

    def __len__(self):
        return len(self.order)

    def reset(self):
        """Forget every pair."""
        self.order = []
        self.gamma = 1.0
        self._products = None

    def _memory_times(self, g):
        """``memory @ g`` by slot (``s_j^T g, y_j^T g`` interleaved), kept."""
        products = self._times(g)
        self._products = (g, products)
        return products

    def _memory(self, k):
        """The ``k`` slots in use as one ``(2k, n)`` matrix (a view)."""
        return self.pairs[:k].reshape(2 * k, self.n)

    def _times(self, v):
        """``memory @ v`` (slots in use) in double precision: one pass over
        the memory at its own precision."""
        products = self._memory(len(self.order)) @ v.astype(self.dtype, copy=False)
        return products.astype(np.float64, copy=False)

    def push(self, s, y, gradient=None, previous_gradient=None):
        """Store the pair ``(s, y)`` unless its curvature is not positive.

        Parameters
        ----------
        s, y : ndarray of shape (n,)
            Step and gradient change of the last iteration.
        gradient, previous_gradient : ndarray of shape (n,) or None
            The gradients with ``y = gradient - previous_gradient``. When
            both are given and the memory's products with
            ``previous_gradient`` (the very array) are kept from
            :meth:`inverse_hessian_times`, the products with ``y`` are
            their difference with the products with ``gradient``, which
            are then kept for the next direction.

        Returns
        -------
        bool
            Whether the pair was stored: not when ``s^T y <= eps * y^T y``
            (nor when either is not finite); the memory is then unchanged.
        """
        sy, yy = float(s @ y), float(y @ y)
        if not (np.isfinite(sy) and np.isfinite(yy) and sy > CURVATURE_EPS * yy):
            return False
        if len(self.order) < self.m:
            slot = len(self.order)
        else:
            slot = self.order.pop(0)  # overwrite the oldest
        kept = self._products
        self.pairs[slot, 0] = s
        self.pairs[slot, 1] = y
        self.order.append(slot)
        k = len(self.order)
        if (
            gradient is not None
            and kept is not None
            and kept[0] is previous_gradient
        ):
            # One pass over the memory, with the new gradient; the other
            # slots' products with y follow from those with the previous one.
            products = self._memory_times(gradient).copy()
            n_old = kept[1].size
            products[:n_old] -= kept[1]
            products[2 * slot : 2 * slot + 2] = sy, yy
        else:
            # One pass over the memory: s_i^T y and y_i^T y for every slot i.
            self._products = None
            products = self._times(y)
        self.sy[:k, slot] = products[0::2]
        self.yy[:k, slot] = products[1::2]
        self.yy[slot, :k] = products[1::2]
        self.gamma = sy / yy
        return True

    def inverse_hessian_times(self, g, scale=1.0, out=None):
        """``scale * H g`` for the current memory (``H = I`` when empty).

        Parameters
        ----------
        g : ndarray of shape (n,)
        scale : float, default=1.0
            ``-1`` gives the search direction with no extra pass over ``n``.
        out : ndarray of shape (n,) or None
            Where to write the result (a new array when None).

        Returns
        -------
        ndarray of shape (n,)
        """
        k = len(self.order)
        if k == 0:
            return np.multiply(g, scale, out=out)
        memory = self._memory(k)
        if self._products is not None and self._products[0] is g:
            products = self._products[1]
        else:
            products = self._memory_times(g)  # s_j^T g, y_j^T g, by slot
        order = np.asarray(self.order)
        a = products[0::2][order]  # S^T g, oldest first
        b = products[1::2][order]  # Y^T g
        inner = self.sy[np.ix_(order, order)]
        R = np.triu(inner)
        yy = self.yy[np.ix_(order, order)]
        u = solve_triangular(R, a, lower=False)  # R^-1 S^T g
        rhs = np.diag(R) * u + self.gamma * (yy @ u - b)
        c_s = solve_triangular(R, rhs, lower=False, trans="T")
        coefficients = np.empty(2 * k)
        coefficients[0::2][order] = c_s
        coefficients[1::2][order] = -self.gamma * u
        coefficients *= scale
        if self._combination is None:
            out = np.matmul(coefficients, memory, out=out)
        else:
            combination = np.matmul(
                coefficients.astype(self.dtype), memory, out=self._combination
            )
            if out is None:
                out = combination.astype(np.float64)
            else:
                out[:] = combination
        return daxpy(g, out, a=scale * self.gamma)  # in place: out += ... g


class _Objective:
    """The minimised objective in the unbounded space, one evaluation per point.

    ``f(z) = -value(to_box(z))`` and its gradient. The last point evaluated
    is cached (a line search asks for the value and the gradient at a point
    separately), the best point evaluated is remembered, and so are the
    steps tried by the current line search. A non-finite value or gradient
    becomes ``f = +inf``: a failed trial. Points are kept by reference:
    callers must not modify them in place.
    """

    def __init__(self, value_and_grad, box):
        self.value_and_grad = value_and_grad
        self.box = box
        self.last = None
        self.best_z, self.best_f = None, np.inf
        self.new_search(None, None)

    def raw(self, z, evaluated=None):
        """``(f, g)`` at ``z`` without the non-finite handling, uncached;
        from ``evaluated``, the objective's ``(value, gradient)`` there,
        when the caller has it."""
        if evaluated is None:
            evaluated = self.value_and_grad(self.box.to_box(z))
        value, grad = evaluated
        g = self.box.chain(z, grad)  # a new array
        return -float(value), np.negative(g, out=g)

    def new_search(self, z, p):
        """Record the steps of a line search from ``z`` along ``p``.

        ``steps`` lists ``(alpha, f)`` for every point evaluated from now on
        and ``trial`` is ``(z, f, g, alpha)`` at the lowest of them.
        """
        if z is None:
            self.search = None
        else:
            # The step is read off the coordinate that moves most.
            j = int(np.argmax(np.abs(p)))
            self.search = (z.flat[j], p.flat[j], j)
        self.steps = []
        self.trial = (None, np.inf, None, None)

    def remember(self, z, f, g):
        """Cache ``(f, g)`` at ``z`` and update the records."""
        self.last = (z, f, g)
        if f < self.best_f:
            self.best_z, self.best_f = z, f
        if self.search is not None:
            start, step, j = self.search
            alpha = float(z.flat[j] - start) / step  # z = start + alpha p
            self.steps.append((alpha, f))
            if f < self.trial[1]:
                self.trial = (z, f, g, alpha)

    def __call__(self, z):
        if self.last is not None and same_vector(z, self.last[0]):
            return self.last[1], self.last[2]
        f, g = self.raw(z)
        if not (np.isfinite(f) and np.all(np.isfinite(g))):
            f = np.inf
        self.remember(z, f, g)
        return f, g

    def value(self, z):
        return self(z)[0]

    def gradient(self, z):
        return self(z)[1]


def _line_search(objective, z, f, g, p):
    """A step along ``p`` from ``z`` that decreases ``f``, or None.

    Strong Wolfe conditions first (scipy's search, unit step first). When it
    fails (on a cliff where the objective becomes infinite, the curvature
    condition may be out of reach), the lowest point it evaluated if that
    one satisfies the sufficient-decrease condition; otherwise the first of
    the steps ``a/2, a/4, ...`` that does, from the shortest step ``a``
    rejected so far.

    Parameters
    ----------
    objective : _Objective
    z : ndarray of shape (n,)
        Current point, with value ``f`` and gradient ``g``.
    p : ndarray of shape (n,)
        A descent direction (``g^T p < 0``).

    Returns
    -------
    (z_new, f_new, g_new) or None
    """
    slope = float(g @ p)

    def sufficient(alpha, f_new):
        # Armijo's condition, and a strict decrease: at a step so short that
        # C1 * alpha * slope is below f's rounding, f_new == f passed it, and
        # a step that gains nothing was taken as convergence (a gradient
        # inconsistent with the objective then "converged" at once).
        return (
            np.isfinite(f_new) and f_new <= f + C1 * alpha * slope and f_new < f
        )

    objective.new_search(z, p)
    with warnings.catch_warnings():
        # scipy's LineSearchWarning (a RuntimeWarning, not public): a
        # failure is handled below.
        warnings.filterwarnings(
            "ignore", message=LINE_SEARCH_WARNINGS, category=RuntimeWarning
        )
        with np.errstate(over="ignore", invalid="ignore"):
            alpha, _, _, f_new, _, _ = line_search(
                objective.value, objective.gradient, z, p, gfk=g, old_fval=f,
                c1=C1, c2=C2,
            )
    # scipy may return a step without the curvature condition (its new
    # slope is then None): it is still taken if it decreases f enough.
    if alpha is not None and f_new is not None and sufficient(alpha, f_new):
        # scipy evaluates the point it returns last: it is in the cache.
        z_new, f_last, g_new = objective.last
        if f_last != f_new:
            z_new = z + alpha * p
            f_new, g_new = objective(z_new)
        if np.isfinite(f_new):
            return z_new, f_new, g_new
    z_new, f_new, g_new, alpha = objective.trial
    if z_new is not None and alpha > 0 and sufficient(alpha, f_new):
        return z_new, f_new, g_new
    rejected = [a for a, f_a in objective.steps if a > 0 and not sufficient(a, f_a)]
    alpha = 0.5 * min(rejected, default=2.0)
    for _ in range(MAX_HALVINGS):
        z_new = z + alpha * p
        if same_vector(z_new, z):
            break
        f_new, g_new = objective(z_new)
        if sufficient(alpha, f_new):
            return z_new, f_new, g_new
        alpha *= 0.5
    return None


def _same_to_rounding(a, b):
    """Whether ``a`` and ``b`` differ by a few units in the last place at
    most, entry by entry."""
    return bool(np.all(np.abs(a - b) <= 4 * np.finfo(float).eps * np.maximum(
        np.abs(a), np.abs(b)
    )))


def _max_abs(v):
    """``max |v|`` without a temporary array."""
    return max(float(v.max()), -float(v.min())) if v.size else 0.0


def _steepest_descent(g):
    """``-g`` scaled to step ``min(1, 1 / max|g|)`` (an empty memory's step)."""
    return g * -min(1.0, 1.0 / _max_abs(g))


def minimize_lbfgs(
    value_and_grad, x0, *, bounds=None, max_iter=200, tol=1e-6, callback=None,
    start=None,
):
    """Maximise ``value_and_grad`` with L-BFGS (compact form, Wolfe steps).

    The method is described in the module docstring.

    Parameters
    ----------
    value_and_grad : callable
        ``value_and_grad(x) -> (value, gradient)`` of the objective to
        **maximise**; it must be deterministic. A non-finite value or
        gradient away from ``x0`` rejects that trial point (for example an
        objective that is ``-inf`` outside its domain).
    x0 : ndarray of shape (n,)
    bounds : sequence of (low, high), array of shape (n, 2) or None
        Per-coordinate bounds (``None`` or infinite entries for unbounded).
        They are enforced by a smooth bijection (:class:`~.box.SmoothBox`,
        the identity well inside the box) and the optimiser itself runs
        unconstrained.
    max_iter : int, default=200
    tol : float, default=1e-6
        Convergence rule: stop when the relative change of the objective
        over an iteration, ``|f_k - f_{k+1}| / max(|f_k|, |f_{k+1}|, 1)``,
        is at most ``tol``, or the largest entry of the gradient (with
        respect to the unbounded variables) is at most ``tol``.
    callback : callable or None
        ``callback(iteration, value, x)`` after each iteration (``iteration``
        counts from 1, ``x`` is in the box).
    start : (value, gradient) or None
        ``value_and_grad(x0)``, when the caller has evaluated it: then not
        evaluated again where the run's first point (``x0`` taken to the
        optimiser's unbounded coordinates and back) is ``x0`` up to
        rounding, as inside the bounds; on or beyond a bound that point
        is elsewhere and is evaluated.

    Returns
    -------
    OptimizationResult
        ``converged`` is False when ``max_iter`` iterations were done
        without meeting the rule (the message then contains ``ITERATIONS
        REACHED LIMIT``) or when no step decreasing the objective could be
        found (the message says the line search failed). ``x`` is the best
        point evaluated.

    Raises
    ------
    NonFiniteStart
        A ValueError: the objective's value or gradient is not finite at
        ``x0``.
    """
    x0 = np.asarray(x0, dtype=np.float64)
    box = SmoothBox(*bound_arrays(bounds, x0.size))
    objective = _Objective(value_and_grad, box)
    z = box.from_box(x0)
    if start is not None and not _same_to_rounding(box.to_box(z), x0):
        start = None
    f, g = objective.raw(z, start)
    if not np.isfinite(f):
        raise NonFiniteStart(f"the objective is not finite at x0: {-f}")
    n_bad = int(np.count_nonzero(~np.isfinite(g)))
    if n_bad:
        raise NonFiniteStart(
            f"the gradient is not finite at x0 ({n_bad} of {g.size} entries)"
        )
    objective.remember(z, f, g)
    memory = _CompactMemory(z.size, MEMORY, MEMORY_DTYPE)
    # Buffers for the direction and the pair: no n-vector allocated there.
    p, s, y = np.empty_like(z), np.empty_like(z), np.empty_like(z)
    history, n_iter, converged = [], 0, False

    if _max_abs(g) <= tol:
        converged, message = True, MESSAGE_GRADIENT
    while not converged:
        if n_iter >= max_iter:
            message = MESSAGE_LIMIT
            break
        step = None
        if len(memory):
            memory.inverse_hessian_times(g, scale=-1.0, out=p)
            slope = g @ p  # not finite if p is not
            if np.isfinite(slope) and slope < 0:
                step = _line_search(objective, z, f, g, p)
            if step is None:  # start again from steepest descent
                memory.reset()
        if step is None:
            step = _line_search(objective, z, f, g, _steepest_descent(g))
        if step is None:
            message = MESSAGE_LINE_SEARCH
            break
        z_new, f_new, g_new = step
        memory.push(
            np.subtract(z_new, z, out=s), np.subtract(g_new, g, out=y),
            gradient=g_new, previous_gradient=g,
        )
        change = abs(f - f_new) / max(abs(f), abs(f_new), 1.0)
        z, f, g = z_new, f_new, g_new
        n_iter += 1
        history.append(-f)
        if callback is not None:
            callback(n_iter, -f, box.to_box(z))
        if change <= tol:
            converged, message = True, MESSAGE_REDUCTION
        elif _max_abs(g) <= tol:
            converged, message = True, MESSAGE_GRADIENT

    if objective.best_f < f:  # a trial point beat the last iterate
        z, f = objective.best_z, objective.best_f
    return OptimizationResult(
        x=box.to_box(z),
        value=-float(f),
        n_iter=n_iter,
        converged=converged,
        message=message,
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
    """Maximise a sequence of deterministic surrogates with L-BFGS.

    Round ``r`` maximises ``make_value_and_grad(r, x_start)`` (a deterministic
    objective built around the round's starting point, such as an
    importance-weighted Monte Carlo estimate with samples drawn there) for
    at most ``round_size`` iterations, then the next round starts from its
    result.

    A round's objective at its own start is a fresh estimate of the
    objective there (its samples were drawn there), while its value at its
    end was optimised on those samples. The point returned is the round
    start (or the last round's end, estimated afresh by one more surrogate)
    with the highest fresh estimate: a run whose rounds drift downwards
    does not return its worst point.

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
        callback(n_iter + iteration, value, x)

    best_x, best_value = None, -np.inf
    while n_iter < max_iter:
        value_and_grad = make_value_and_grad(round_index, x)
        # Evaluated once, for the round's fresh estimate and as the run's
        # first point (an importance-weighted evaluation is the costliest
        # step of the score estimator's rounds).
        start = value_and_grad(x)
        start_value = start[0]
        if start_value > best_value or best_x is None:
            best_x, best_value = x.copy(), start_value
        result = minimize_lbfgs(
            value_and_grad,
            x,
            bounds=bounds,
            max_iter=min(round_size, max_iter - n_iter),
            tol=tol,
            callback=None if callback is None else shifted_callback,
            start=start,
        )
        n_iter += result.n_iter
        history.extend(result.history)
        x, value, message = result.x, result.value, result.message
        round_index += 1
        if result.n_iter == 0:
            # No step from the round's start: converged there (a vanishing
            # gradient), or no step improves the round's objective (a failed
            # line search, not a convergence).
            converged = result.converged
            break
        if abs(value - start_value) <= tol * max(abs(value), abs(start_value), 1.0):
            converged = True
            break
    if n_iter:
        end_value = make_value_and_grad(round_index, x)(x)[0]
        if end_value >= best_value or not np.isfinite(best_value):
            best_x, best_value = x, end_value
        x, value = best_x, best_value
    return OptimizationResult(
        x=x,
        value=value,
        n_iter=n_iter,
        converged=converged,
        message=f"{round_index} rounds; last: {message}",
        history=history,
    )
