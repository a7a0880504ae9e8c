"""Sequence likelihoods behind one interface; see :class:`Likelihood`."""

from .base import Likelihood
from .chain import ChainCRF

__all__ = ["Likelihood", "ChainCRF", "get_likelihood"]

_LIKELIHOODS = {"crf": ChainCRF}


def get_likelihood(spec):
    """Return a likelihood object from a name or an instance.

    Parameters
    ----------
    spec : {"crf"} or Likelihood
        A registered name or a :class:`Likelihood` instance (used as is).

    Returns
    -------
    likelihood : Likelihood
    """
    if isinstance(spec, Likelihood):
        return spec
    if isinstance(spec, str) and spec in _LIKELIHOODS:
        return _LIKELIHOODS[spec]()
    raise ValueError(
        f"likelihood must be one of {sorted(_LIKELIHOODS)} or a Likelihood "
        f"instance, got {spec!r}"
    )
