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
matrix-vector products with the ``(2m, n)`` memory (four with its
halves), a few ``O(n)`` vector operations and ``O(m^3)`` algebra on ``m =
20``; a few milliseconds at that size.

The method:

* **Direction.** The two-loop recursion (Nocedal and Wright, Algorithm
  7.4) over the ``m = 20`` most recent steps ``S`` and gradient changes
  ``Y``, with a **diagonal** initial inverse Hessian ``H0 = t
  diag(b)^(-1/2)``: ``b`` a diagonal Hessian approximation that every
  stored pair updates (scaled so that ``s^T B s = s^T y``, then the
  diagonal of its BFGS update; after Gilbert and Lemarechal, 1989), and
  ``t`` such that ``y^T H0 y = s^T y`` for the newest pair, the property
  of the classical ``gamma I``, ``gamma = s^T y / y^T y`` (which is
  ``initial="scalar"``). The coordinates of the GP's objective are on
  very different scales (the weights of a template seen at thousands of
  tokens and of one seen at two, the kernel's hyperparameters, the
  transitions), which one scalar cannot follow; the square root takes
  half of the diagonal's correction, the whole of it making the unit
  step several times too long (:class:`_LBFGSMemory`). On the Table 1
  training folds the diagonal took fewer objective evaluations than
  ``gamma I`` on every fold, to a higher ELBO on every fold
  (doc/benchmark_history.rst, "A diagonal initial matrix for L-BFGS").
  The recursion is written in matrix form: its scalars come from ``S^T
  g``, ``Y^T H0 q`` and the upper triangle of ``S^T Y``, so that the
  ``n``-vectors are touched by three matrix-vector products with halves of
  the memory, not ``4m`` separate passes from Python; with ``gamma I`` it
  is the compact form of Byrd, Nocedal and Schnabel (1994), eq. (3.1).
  The pairs live in a preallocated ring buffer, and ``S^T Y`` is updated
  when a pair enters from ``S^T g_new`` (computed then, and kept for the
  next direction) minus ``S^T g`` (kept from the last one): two passes
  over the memory per iteration in all. A pair with ``s^T y <= eps * y^T
  y`` is not stored (as in L-BFGS-B). The pairs are stored in single
  precision: those passes are limited by memory bandwidth, and 20 pairs
  in single precision cost less than 10 in double. On the dev splits of
  ``benchmarks/dev_splits.py`` 20 pairs took 6 to 21 % fewer iterations
  than 10, and single precision within a few iterations of double, at the
  same errors (doc/benchmark_history.rst, commit 88f44e6, with ``gamma
  I``).
* **Step.** A strong Wolfe line search (:func:`scipy.optimize.line_search`,
  ``c1 = 1e-4``, ``c2 = 0.9``) trying the unit step first; with an empty
  memory (first iteration, after a reset) the steepest-descent direction is
  scaled to step ``min(1, 1 / max|g|)``. No trial takes a bounded
  coordinate more than ``MAX_OVERSHOOT = 2`` beyond its bound (or beyond
  itself, when it is there already; :meth:`SmoothBox.longest_step`):
  there the smooth box's slope is about ``exp(-2)``, and a coordinate
  thrown far beyond has a vanishing gradient and stays. (Under a narrow
  hyperprior far from a warm start, whose term dominated the objective,
  a step that gained on it threw the transitions' prior variance beyond
  its bound, where the fit ended.) Every point is evaluated once
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
from scipy.optimize import line_search

from .._linalg import same_vector
from .._vectors import diagonal_bfgs_update, secant_inverse_sqrt
from .box import SmoothBox, bound_arrays

__all__ = [
    "NonFiniteStart", "OptimizationResult", "minimize_lbfgs", "minimize_lbfgs_rounds",
]

#: Number of curvature pairs kept (scipy's ``maxcor`` is 10).
MEMORY = 20
#: Storage of the pairs in minimize_lbfgs (see _LBFGSMemory).
MEMORY_DTYPE = np.float32
#: The initial inverse Hessians of _LBFGSMemory (minimize_lbfgs' initial).
INITIAL_MATRICES = ("diagonal", "scalar")
#: Floor of the diagonal Hessian approximation, relative to 1 / gamma.
DIAGONAL_FLOOR = 1e-12
#: Wolfe constants: sufficient decrease and curvature.
C1, C2 = 1e-4, 0.9
#: Curvature threshold for storing a pair (L-BFGS-B's).
CURVATURE_EPS = np.finfo(np.float64).eps
#: How far beyond its bound (in the optimiser's unbounded coordinate) a
#: step may take a bounded coordinate, or beyond itself when it is there:
#: at d beyond, the smooth box's slope is about exp(-d) (see _line_search).
MAX_OVERSHOOT = 2.0
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


def _checked_initial(initial):
    """``initial`` if it names an initial matrix, else a ValueError."""
    if initial not in INITIAL_MATRICES:
        raise ValueError(f"initial must be one of {INITIAL_MATRICES}, got {initial!r}")
    return initial


class _LBFGSMemory:
    """The L-BFGS inverse Hessian on a ring buffer of pairs, with a diagonal
    or scalar initial matrix.

    ``H g`` is the two-loop recursion (Nocedal and Wright, Algorithm 7.4)
    with a diagonal initial matrix ``H0``, in matrix form: its two
    loops' scalars follow from the memory's products with ``g`` and with
    ``H0 q`` and from ``S^T Y``, so that the ``n``-vectors are touched by a
    few matrix-vector products, not by ``4m`` separate passes from Python.

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
        ``m x m`` algebra and the diagonal stay in double precision.
    initial : {"diagonal", "scalar"}, default="diagonal"
        ``H0``. ``"scalar"``: ``gamma I`` with ``gamma = s^T y / y^T y`` of
        the newest pair (Nocedal and Wright, eq. 7.20). ``"diagonal"``:
        ``t diag(b)^(-1/2)``, from a diagonal Hessian approximation ``b``
        that every stored pair updates, with ``t`` such that ``y^T H0 y =
        s^T y`` for the newest pair, as ``gamma I`` has. The update scales
        ``b`` by ``c = s^T y / s^T B s`` (so that ``s^T (c B) s = s^T y``,
        after Oren and Luenberger), then replaces it by the diagonal of the
        BFGS update of ``diag(c b)``::

            b_i <- c b_i - (c b_i s_i)^2 / s^T y + y_i^2 / s^T y

        (the diagonal updates of Gilbert and Lemarechal, 1989). It starts
        at ``1 / gamma`` of the first pair, and stays positive (``c b_i
        s_i^2 <= s^T y``); a floor of ``1e-12 / gamma`` guards against a
        zero. The square root takes half of the diagonal's scaling: the
        whole of it (``H0 = diag(1 / b)``) made the unit step several
        times too long, and cost more evaluations than ``gamma I``
        (doc/benchmark_history.rst, "A diagonal initial matrix for
        L-BFGS").

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
    gamma : float
        ``s^T y / y^T y`` of the newest pair (1 when empty).
    hessian_diagonal, initial_diagonal : ndarray of shape (n,) or None
        ``b`` and the diagonal of ``H0`` (``initial="diagonal"``, once a
        pair is stored), else None.

    Notes
    -----
    With ``R`` the upper triangle of ``S^T Y`` (pairs oldest first), the
    first loop's scalars are ``alpha = R^-1 S^T g``, then ``q = g - Y
    alpha``, and the second loop's are ``alpha - c`` with ``R^T c =
    diag(R) alpha - Y^T H0 q``; ``H g = H0 q + S c``. With ``H0 = gamma I``
    this is the compact form of Byrd, Nocedal and Schnabel (1994), eq.
    (3.1), whose ``Y^T Y`` term is here the product ``Y^T H0 q``. A
    direction passes over the memory three halves: ``Y alpha``, ``Y^T H0
    q`` and ``S c``. ``S^T g`` is taken when the pair enters
    (:meth:`push` computes it with the new gradient and keeps it), and
    gives ``S^T y = S^T g_new - S^T g_old`` with it: one more half, two
    passes over the memory per iteration in all.
    """

    def __init__(self, n, m=MEMORY, dtype=np.float64, initial="diagonal"):
        self.n, self.m = n, m
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float64, np.float32):
            raise ValueError(f"dtype must be float64 or float32, got {dtype!r}")
        self.initial = _checked_initial(initial)
        self.pairs = np.empty((m, 2, n), dtype=self.dtype)
        self.sy = np.zeros((m, m))
        self.reset()

    def __len__(self):
        return len(self.order)

    def reset(self):
        """Forget every pair (and the diagonal)."""
        self.order = []
        self.gamma = 1.0
        self.hessian_diagonal = self.initial_diagonal = None
        # (g, S^T g by slot) for the last gradient seen, or None.
        self._products = None

    def _rows(self, part):
        """The slots in use of ``s`` (``part=0``) or ``y`` (1), ``(k, n)``."""
        return self.pairs[: len(self.order), part]

    def _times(self, part, v):
        """``rows @ v`` in double precision: one pass over half the memory
        at its own precision."""
        products = self._rows(part) @ v.astype(self.dtype, copy=False)
        return products.astype(np.float64, copy=False)

    def _combination(self, part, coefficients):
        """``coefficients @ rows`` (by slot), at the memory's precision."""
        return coefficients.astype(self.dtype) @ self._rows(part)

    def push(self, s, y, gradient=None, previous_gradient=None):
        """Store the pair ``(s, y)`` unless its curvature is not positive.

        Parameters
        ----------
        s, y : ndarray of shape (n,)
            Step and gradient change of the last iteration.
        gradient, previous_gradient : ndarray of shape (n,) or None
            The gradients with ``y = gradient - previous_gradient``. When
            both are given and ``S^T previous_gradient`` (the very array)
            is kept from :meth:`inverse_hessian_times`, ``S^T y`` is ``S^T
            gradient`` (then kept for the next direction) minus the kept
            one.

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
            # One pass over S, with the new gradient; the other slots'
            # products with y follow from those with the previous one.
            products = self._times(0, gradient)
            self._products = (gradient, products)
            column = products.copy()
            column[: kept[1].size] -= kept[1]
            column[slot] = sy
        else:
            self._products = None
            column = self._times(0, y)
        self.sy[:k, slot] = column
        self.gamma = sy / yy
        if self.initial == "diagonal":
            if self.hessian_diagonal is None:
                self.hessian_diagonal = np.full(self.n, 1.0 / self.gamma)
                self.initial_diagonal = np.empty(self.n)
            y = np.ascontiguousarray(y, dtype=np.float64)
            diagonal_bfgs_update(
                self.hessian_diagonal, np.ascontiguousarray(s, dtype=np.float64),
                y, sy, DIAGONAL_FLOOR / self.gamma,
            )
            secant_inverse_sqrt(self.hessian_diagonal, y, sy, self.initial_diagonal)
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
        if k == 0 or scale == 0.0:  # H = I, or nothing to compute
            return np.multiply(g, scale, out=out)
        if self._products is not None and self._products[0] is g:
            products = self._products[1]
        else:
            products = self._times(0, g)  # s_j^T g by slot
            self._products = (g, products)
        order = np.asarray(self.order)
        R = np.triu(self.sy[np.ix_(order, order)])
        alpha = solve_triangular(R, products[order], lower=False)
        by_slot = np.empty(k)
        by_slot[order] = alpha
        if out is None:
            out = np.empty(self.n)
        # out = scale * H0 q with q = g - Y alpha (the sign of the
        # subtraction carries a scale of -1, the search direction's).
        combination = self._combination(1, by_slot)
        if scale == -1.0:
            np.subtract(combination, g, out=out)
        else:
            np.subtract(g, combination, out=out)
            if scale != 1.0:
                out *= scale
        if self.initial_diagonal is None:
            out *= self.gamma
        else:
            out *= self.initial_diagonal
        rhs = np.diag(R) * alpha - self._times(1, out)[order] / scale
        by_slot[order] = scale * solve_triangular(R, rhs, lower=False, trans="T")
        out += self._combination(0, by_slot)
        return out


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

    Strong Wolfe conditions first (scipy's search, unit step first, no
    step taking a bounded coordinate more than ``MAX_OVERSHOOT`` beyond its
    bound: :meth:`SmoothBox.longest_step`). When it
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
    longest = objective.box.longest_step(z, p, MAX_OVERSHOOT)
    amax = longest if np.isfinite(longest) else None

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
                c1=C1, c2=C2, amax=amax,
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
    alpha = min(0.5 * min(rejected, default=2.0), longest)
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
    start=None, initial="diagonal",
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
    initial : {"diagonal", "scalar"}, default="diagonal"
        The initial inverse Hessian of the L-BFGS approximation: from a
        diagonal Hessian approximation updated by every pair, or the
        classical ``gamma I`` (see the module docstring).

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
    _checked_initial(initial)  # before the objective is evaluated at x0
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
    memory = _LBFGSMemory(z.size, MEMORY, MEMORY_DTYPE, initial)
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
