"""Exact linear-chain CRF likelihood (paper eq. 1 and 5)."""

from .. import chain
from .base import Likelihood

__all__ = ["ChainCRF"]


class ChainCRF(Likelihood):
    """Exact linear-chain CRF likelihood, computed by forward-backward.

    ``log p(y | f) = sum_t f_{y_t}(x_t) + sum_t f_bin[y_t, y_{t+1}] - log Z(f)``.
    Its gradient with respect to the potentials is observed minus expected
    counts, from the compiled kernels of :mod:`skgpstruct.chain`.
    """

    has_gradient = True

    def _log_prob(self, unary, pairwise, offsets, labels):
        return chain.log_likelihood(unary, pairwise, offsets, labels)

    def _log_prob_and_gradient(self, unary, pairwise, offsets, labels):
        return chain.log_likelihood(
            unary, pairwise, offsets, labels, return_gradient=True
        )
