"""Stochastic optimisation of a sum of item terms with SAGA.

The objective is ``F(x) = sum_i f_i(x) + g(x)``: ``f_i`` noisy item terms
(one mini-batch of sequences each) and ``g`` a cheap exact term (the KL
divergences). SAGA (Defazio, Bach and Lacoste-Julien, 2014) keeps the last
gradient ``phi_i`` computed for every item and their sum ``Phi``; a step on
item ``i`` uses

    d = n_items * (grad f_i(x) - phi_i) + Phi + grad g(x),

an unbiased estimate of ``grad F`` whose variance shrinks as the stored
gradients approach the current ones; then ``Phi += grad f_i - phi_i`` and
``phi_i = grad f_i`` (the sum is updated incrementally, never recomputed
within an epoch).

A gradient may be a dense vector or a :class:`SparseGradient` (zero
outside a set of coordinates: a mini-batch only touches the parameters of
its own features); an item's new gradient and its stored one then update
the direction and the sum on those coordinates only.

Stored gradients are opaque *records* in whatever compact form the caller
chooses (for the GP, the gradient with respect to the item's own sampled
potentials: memory in proportion to its tokens, not to the parameters); a
caller-supplied ``expand(record, x)`` maps a record to a gradient vector.
When that map depends on ``x`` (the GP's projection moves with the kernel
hyperparameters), ``phi_i`` is read through the current map, and ``Phi`` is
recomputed from the records at the start of every epoch so that it stays
their sum.

Steps are scaled per coordinate by Adam's moment estimates (Kingma and Ba,
2015) and by a step size per coordinate (one per parameter group), decayed
as ``step / sqrt(epoch)`` with the call's epochs counted from 1 (a warm
start too: it starts from the previous call's averaged point). The fit
stops, as
scikit-learn's SGD does, after ``n_iter_no_change`` epochs that do not beat
the best epoch by ``tol``, judged on a held-out score when one is given
(the best point on it is returned) or on an estimate of the training
objective. That estimate is kept as SAGA keeps its gradients: the last
value computed for every item, summed, plus ``g`` at the epoch's last step.
(The mean of an epoch's per-step estimates ``n_items * f_i(x) + g(x)``
varies with which items the epoch happened to draw, which on a few items
of different sizes is far noisier than the objective's own change from
one epoch to the next.)

Adam's steps are scale-free: every coordinate moves by about the step
size at every step, so the last iterate wanders around the optimum by
about that much however long the fit runs. Without a held-out score the
point returned is therefore an average of the iterates (Polyak and
Juditsky, 1992): that of the epochs' end points, weighted exponentially
over the last ``AVERAGE_EPOCHS`` epochs or so. With a held-out score, the
point of its best epoch is returned. This module knows nothing of GPs.
"""

import time
from dataclasses import dataclass, field

import numpy as np

from .._vectors import adam_ascent_step
from .box import bound_arrays

__all__ = ["SAGADiverged", "SAGAResult", "SparseGradient", "maximize_saga"]

#: Without a held-out score, the point returned is the average of the
#: epochs' end points, weighted exponentially over about this many epochs
#: (uniformly over the first ones).
AVERAGE_EPOCHS = 5


@dataclass(frozen=True)
class SparseGradient:
    """A gradient vector that is zero outside ``indices``.

    Attributes
    ----------
    indices : ndarray of int64
        Distinct coordinates. When an item's new and stored gradients have
        the same indices, they are subtracted entry by entry.
    values : ndarray of float64, of the shape of ``indices``
    """

    indices: np.ndarray
    values: np.ndarray

    def toarray(self, size):
        """The gradient as a dense vector of length ``size``."""
        out = np.zeros(size)
        out[self.indices] = self.values
        return out


def _difference(new, old, size):
    """``new - old`` for dense or sparse gradients, sparse when both are on
    the same coordinates (``new`` may be modified in place)."""
    if isinstance(new, SparseGradient) and isinstance(old, SparseGradient):
        if new.indices is old.indices or np.array_equal(new.indices, old.indices):
            return SparseGradient(new.indices, new.values - old.values)
    if isinstance(new, SparseGradient):
        new = new.toarray(size)
    if isinstance(old, SparseGradient):
        new[old.indices] -= old.values
    else:
        new -= old
    return new


def _add_scaled(target, gradient, scale=1.0):
    """``target += scale * gradient`` in place, on its support when sparse."""
    if isinstance(gradient, SparseGradient):
        if scale == 1.0:
            target[gradient.indices] += gradient.values
        else:
            target[gradient.indices] += scale * gradient.values
    elif scale == 1.0:
        target += gradient
    else:
        target += scale * gradient


@dataclass
class SAGAResult:
    """Outcome of :func:`maximize_saga`.

    Attributes
    ----------
    x : ndarray
        The average of the epochs' end points (see ``AVERAGE_EPOCHS``), or,
        with a held-out score, the end point of its best epoch.
    n_epochs : int
        Epochs of this call.
    n_steps : int
        Steps of this call (Adam's step count, in ``state``, continues a
        continued state's).
    converged : bool
    history : list of float
        Per epoch, the estimate of the objective at its end: the sum of the
        last value computed for every item (scaled up from the items seen
        so far while some are not) plus the exact term.
    validation_history : list of float
        Per epoch, the held-out score (empty without one).
    stored_bytes : int
        Memory held by the stored item gradients at the end.
    best_epoch : int
        The epoch whose point is returned (the last one without a held-out
        score).
    """

    x: np.ndarray
    n_epochs: int
    n_steps: int
    converged: bool
    history: list = field(default_factory=list)
    validation_history: list = field(default_factory=list)
    stored_bytes: int = 0
    best_epoch: int = 0


class SAGADiverged(FloatingPointError):
    """:func:`maximize_saga`'s objective overflowed: a NumPy overflow or
    invalid operation while evaluating it, or a non-finite direction.

    ``steps_taken`` counts the steps of the call before it: 0 means the
    objective fails at the starting point itself, not that steps diverged.
    """

    def __init__(self, message, steps_taken):
        super().__init__(message)
        self.steps_taken = steps_taken


def maximize_saga(
    item_value_and_grad,
    expand,
    exact_value_and_grad,
    x0,
    n_items,
    *,
    step_size,
    max_epochs=50,
    tol=1e-4,
    n_iter_no_change=3,
    bounds=None,
    rng=None,
    callback=None,
    state=None,
    validation=None,
    shuffle=False,
):
    """Maximise ``sum_i f_i(x) + g(x)`` with SAGA and Adam-scaled steps.

    Parameters
    ----------
    item_value_and_grad : callable
        ``item_value_and_grad(i, step, x) -> (value, record, gradient)`` of
        item ``i`` (fresh Monte Carlo samples selected by ``step``):
        ``gradient`` as a new vector (the optimiser may modify it in place)
        or a :class:`SparseGradient`, ``record`` the same gradient in the
        form to store (anything with an ``nbytes`` attribute).
    expand : callable
        ``expand(record, x) -> gradient`` (a vector or a
        :class:`SparseGradient`) of a stored record at ``x``.
    exact_value_and_grad : callable
        ``exact_value_and_grad(x) -> (value, gradient)`` of ``g``.
    x0 : ndarray of shape (n,)
    n_items : int
    step_size : float or ndarray of shape (n,)
        Step size per coordinate in the call's first epoch, ``step_size /
        sqrt(e)`` in its e-th (a continued ``state`` included: see the
        comment at the schedule).
    max_epochs : int, default=50
        One epoch is ``n_items`` steps on items drawn uniformly at random
        (or, with ``shuffle``, on every item once).
    tol : float, default=1e-4
        Stop after ``n_iter_no_change`` consecutive epochs whose score (the
        held-out one if given, else the estimate of the training objective
        of ``history``) does not
        exceed the best epoch so far by ``tol * max(|best|, 1)`` (relative to
        the best score, absolute below 1).
    n_iter_no_change : int, default=3
    bounds : sequence of (low, high), array of shape (n, 2) or None
        Coordinates are clipped to these bounds after every step.
    rng : numpy.random.Generator
    callback : callable or None
        ``callback(epoch, value, seconds)`` after each epoch.
    state : dict or None
        The stored gradients and Adam's moments of a previous call
        (returned in ``result.state``), to continue from them (a warm
        start; the step size schedule starts again). Not
        modified: ``result.state`` is a new one (sharing the stored
        records, which are never changed in place), so a call that fails
        leaves it to be continued as if the call had not been made.
    validation : callable or None
        ``validation(x) -> float``, a held-out score to maximise, evaluated
        after every epoch; the point of its best epoch is returned.
    shuffle : bool, default=False
        Visit every item once per epoch, in a random order, instead of
        drawing the epoch's items independently (with replacement: an
        epoch then misses about a third of them). For an epoch that must
        see all its items, as one ``partial_fit`` call on a piece of data.

    Returns
    -------
    result : SAGAResult
        With an extra attribute ``state`` holding the stored gradients and
        Adam moments.

    Raises
    ------
    SAGADiverged
        When a step's direction is not finite (steps too large for the
        objective): ``x`` would become NaN.
    """
    rng = np.random.default_rng() if rng is None else rng
    x = np.array(x0, dtype=np.float64)
    n = x.size
    step_size = np.broadcast_to(np.asarray(step_size, dtype=np.float64), (n,))
    low = high = None
    if bounds is not None:
        low, high = bound_arrays(bounds, n)
    if state is None or state.get("n_items") != n_items or state["total"].size != n:
        state = {
            "n_items": n_items,
            "stored": [None] * n_items,
            "total": np.zeros(n),
            "m": np.zeros(n),
            "v": np.zeros(n),
            "t": 0,
        }
    else:
        # O(n) copies, once per call (the records themselves are shared).
        state = {
            name: value.copy() if isinstance(value, (np.ndarray, list)) else value
            for name, value in state.items()
        }
    stored, total = state["stored"], state["total"]
    # The last value of every item, and whether it has been drawn yet.
    item_values = state.setdefault("values", np.zeros(n_items))
    drawn = state.setdefault("drawn", np.zeros(n_items, dtype=bool))
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    # Work buffer of the update: a step allocates no n-vector of its own.
    direction = np.empty(n)
    history, validation_history = [], []
    no_change, converged = 0, False
    best, best_x, best_epoch = -np.inf, None, 0
    # Of the epochs' end points (the first epoch's replaces x0).
    average = np.array(x)
    start = time.perf_counter()
    epoch = taken = 0  # taken: steps of this call so far
    for epoch in range(1, max_epochs + 1):
        if epoch > 1 or any(r is not None for r in stored):
            # Re-read every stored gradient through the current map.
            total[:] = 0.0
            for record in stored:
                if record is not None:
                    _add_scaled(total, expand(record, x))
        # Every call's schedule starts at step_size, a warm start's too: it
        # starts from the previous call's returned point, the average of
        # its epochs' end points, not from its last iterate, and resuming
        # the decayed steps from there ended lower (review h29c: 4 + 4
        # warm epochs below one 8-epoch fit on 4 seeds of 4).
        rate = np.ascontiguousarray(step_size / np.sqrt(epoch))
        if shuffle:
            draws = rng.permutation(n_items)
        else:
            draws = (int(rng.integers(n_items)) for _ in range(n_items))
        for i in draws:
            i = int(i)
            state["t"] += 1
            try:
                # Steps too large for the objective show as an overflow
                # (exp of a log-scale parameter) or an undefined product
                # (inf * 0) before a non-finite direction, and would fail
                # further in with a message that does not say why.
                with np.errstate(over="raise", invalid="raise"):
                    value, record, delta = item_value_and_grad(i, state["t"], x)
                    if stored[i] is not None:
                        delta = _difference(delta, expand(stored[i], x), n)
                    exact_value, exact_grad = exact_value_and_grad(x)
            except FloatingPointError as exc:
                raise SAGADiverged(
                    f"evaluating the objective at step {state['t']} (epoch "
                    f"{epoch}) hit {exc}", taken,
                ) from None
            stored[i] = record
            # direction = total + exact_grad + n_items * delta
            np.add(total, exact_grad, out=direction)
            _add_scaled(direction, delta, n_items)
            _add_scaled(total, delta)
            if not np.isfinite(direction).all():
                raise SAGADiverged(
                    f"the stochastic gradient is not finite at step {state['t']} "
                    f"(epoch {epoch})", taken,
                )
            item_values[i], drawn[i] = value, True
            adam_ascent_step(
                x, state["m"], state["v"], direction, rate, beta1, beta2, eps,
                state["t"], low, high,
            )
            taken += 1
        history.append(float(n_items * item_values[drawn].mean() + exact_value))
        if validation is None:
            average += (x - average) / min(epoch, AVERAGE_EPOCHS)
        else:
            validation_history.append(float(validation(x)))
        score = history[-1] if validation is None else validation_history[-1]
        if callback is not None:
            callback(epoch, history[-1], time.perf_counter() - start)
        # As scikit-learn's SGD: stop after n_iter_no_change epochs that do
        # not beat the best epoch so far by tol (relative); single noisy
        # epochs that fall do not end the fit by themselves.
        if epoch == 1 or score > best + tol * max(abs(best), 1.0):
            no_change = 0
        else:
            no_change += 1
        if epoch == 1 or score > best:
            best, best_epoch = score, epoch
            if validation is not None:
                best_x = x.copy()
        if no_change >= n_iter_no_change:
            converged = True
            break
    if best_x is None:
        best_x, best_epoch = average, epoch
    stored_bytes = sum(r.nbytes for r in stored if r is not None)
    result = SAGAResult(
        x=best_x,
        n_epochs=epoch,
        n_steps=taken,
        converged=converged,
        history=history,
        validation_history=validation_history,
        stored_bytes=stored_bytes,
        best_epoch=best_epoch,
    )
    result.state = state
    return result
