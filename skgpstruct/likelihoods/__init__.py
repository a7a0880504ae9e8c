"""Sequence likelihoods behind one interface; see :class:`Likelihood`.

Built in: the exact linear chain (``"crf"``, :class:`ChainCRF`), the
piecewise pseudo-likelihood (``"pseudo"``,
:class:`PiecewisePseudoLikelihood`), and :class:`CallableLikelihood`, the
adapter for a user's plain function ``log_lik(unary, pairwise, y)``.
"""

import builtins

from .base import Likelihood
from .callable import CallableLikelihood
from .chain import ChainCRF
from .pseudo import PiecewisePseudoLikelihood

__all__ = [
    "Likelihood",
    "ChainCRF",
    "PiecewisePseudoLikelihood",
    "CallableLikelihood",
    "get_likelihood",
]

_LIKELIHOODS = {"crf": ChainCRF, "pseudo": PiecewisePseudoLikelihood}


def get_likelihood(spec):
    """Return a likelihood object from a name, an instance or a function.

    Parameters
    ----------
    spec : {"crf", "pseudo"}, Likelihood or callable
        A registered name (``"crf"``: exact linear chain; ``"pseudo"``:
        piecewise pseudo-likelihood), a :class:`Likelihood` instance (used
        as is), or a plain function ``log_lik(unary, pairwise, y)``
        returning ``log p(y | f)`` of one sequence per sample, which is
        wrapped in a :class:`CallableLikelihood`. A function provides no
        gradient: the estimator then needs ``gradient="score"``.

    Returns
    -------
    likelihood : Likelihood

    Raises
    ------
    ValueError
        If ``spec`` is an unknown name, a Likelihood class instead of an
        instance, or anything else.

    Examples
    --------
    >>> import numpy as np
    >>> from skgpstruct.likelihoods import get_likelihood
    >>> get_likelihood("crf")
    ChainCRF()
    >>> get_likelihood("pseudo")
    PiecewisePseudoLikelihood()
    >>> def independent(unary, pairwise, y):
    ...     log_norm = np.logaddexp.reduce(unary, axis=2)
    ...     return (unary[:, np.arange(len(y)), y] - log_norm).sum(axis=1)
    >>> lik = get_likelihood(independent)
    >>> lik
    CallableLikelihood(func=independent)
    >>> lik.has_gradient
    False
    """
    if isinstance(spec, Likelihood):
        return spec
    if isinstance(spec, str):
        if spec in _LIKELIHOODS:
            return _LIKELIHOODS[spec]()
    elif isinstance(spec, type) and issubclass(spec, Likelihood):
        raise ValueError(
            f"likelihood must be a Likelihood instance, got the class "
            f"{spec.__name__}; pass {spec.__name__}()"
        )
    # builtins.callable: the submodule .callable shadows the built-in here.
    elif builtins.callable(spec):
        return CallableLikelihood(spec)
    raise ValueError(
        f"likelihood must be one of {sorted(_LIKELIHOODS)}, a Likelihood "
        "instance, or a callable log_lik(unary, pairwise, y) returning an "
        f"array of shape (n_samples,), got {spec!r}"
    )
