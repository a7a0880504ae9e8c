"""Adapter that turns a user's plain Python function into a likelihood."""

import numpy as np

from .base import Likelihood, _checked, _finite_log_prob

__all__ = ["CallableLikelihood"]


def _read_only(array):
    view = array.view()
    view.flags.writeable = False
    return view


class CallableLikelihood(Likelihood):
    """A likelihood given by a plain function of one sequence's potentials.

    The function is called once per (non-empty) sequence, with all Monte
    Carlo samples at once, and returns ``log p(y | f)`` for every sample.
    It provides no gradient (``has_gradient = False``), so the estimator
    must use ``gradient="score"``.

    Parameters
    ----------
    func : callable
        ``func(unary, pairwise, y) -> log_prob`` with

        - ``unary`` : ndarray of shape (S, T, V), the unary potentials of
          the sequence's ``T`` tokens under ``S`` samples;
        - ``pairwise`` : ndarray of shape (S, V, V), the transition
          potentials (``pairwise[s, i, j]``: label ``i`` followed by ``j``);
        - ``y`` : ndarray of int64 of shape (T,), the sequence's label
          indices in ``[0, V)`` (columns of ``unary``, in the order of the
          estimator's ``classes_``);
        - ``log_prob`` : array-like of shape (S,), finite.

        The arrays are read-only views; copy them before modifying. Under
        ``n_jobs`` other than 1 the function is sent to worker processes,
        so it must be picklable (defined at module level, not a lambda).

    Attributes
    ----------
    func : callable
        The wrapped function.

    Notes
    -----
    A zero-length sequence gets ``log p = 0`` (the probability of its empty
    labelling) without calling ``func``. Every value must be finite: NaN
    is a bug in ``func``, and ``-inf`` (a labelling with probability zero
    under some sample of Gaussian potentials) makes the expected
    log-likelihood, hence the ELBO, ``-inf`` so that nothing can be
    learned; give every labelling a positive probability instead (for
    example by mixing in a small uniform noise). Both raise a ValueError
    naming the sequence.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.special import log_softmax
    >>> from skgpstruct.likelihoods import CallableLikelihood
    >>> def independent(unary, pairwise, y):
    ...     return log_softmax(unary, axis=2)[:, np.arange(len(y)), y].sum(axis=1)
    >>> lik = CallableLikelihood(independent)
    >>> lik.log_prob(np.zeros((2, 3, 4)), np.zeros((2, 4, 4)),
    ...              np.array([0, 1, 3]), np.array([0, 1, 2])).shape
    (2, 2)
    """

    has_gradient = False

    def __init__(self, func):
        if isinstance(func, type) and issubclass(func, Likelihood):
            raise TypeError(
                f"func must be a plain function, got the Likelihood class "
                f"{func.__name__}; use an instance of it, {func.__name__}(), "
                "as the likelihood directly"
            )
        if not callable(func):
            raise TypeError(
                "func must be a callable log_lik(unary, pairwise, y) returning "
                f"an array of shape (n_samples,), got {func!r}"
            )
        self.func = func

    def _log_prob(self, unary, pairwise, offsets, labels):
        # The arguments arrive checked (Likelihood.log_prob).
        n_samples = unary.shape[0]
        n_seq = offsets.shape[0] - 1
        log_prob = np.zeros((n_samples, n_seq))
        pairwise = _read_only(pairwise)
        for n in range(n_seq):
            t0, t1 = offsets[n], offsets[n + 1]
            if t1 == t0:
                continue
            value = self.func(
                _read_only(unary[:, t0:t1]), pairwise, _read_only(labels[t0:t1])
            )
            log_prob[:, n] = self._check_output(value, n, n_samples)
        return log_prob

    def _check_output(self, value, n, n_samples):
        name = self._name()
        value = _checked(
            name, "log-likelihood (one per sample)", value, (n_samples,),
            sequence=n,
        ).astype(np.float64, copy=False)
        return _finite_log_prob(name, value, sequence=n)

    def _name(self):
        return getattr(self.func, "__qualname__", None) or repr(self.func)

    def __repr__(self):
        return f"{type(self).__name__}(func={self._name()})"
