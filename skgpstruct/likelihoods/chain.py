"""Exact linear-chain CRF likelihood (paper eq. 1 and 5)."""

from .. import chain
from .base import Likelihood

__all__ = ["ChainCRF"]


class ChainCRF(Likelihood):
    """Exact linear-chain CRF likelihood, computed by forward-backward.

    ``log p(y | f) = sum_t f_{y_t}(x_t) + sum_t f_bin[y_t, y_{t+1}] - log Z(f)``.
    Its gradient with respect to the potentials is observed minus expected
    counts, from the compiled kernels of :mod:`skgpstruct.chain`
    (``has_gradient = True``). This is ``likelihood="crf"``, the default of
    :class:`~skgpstruct.GPStructClassifier`.

    Examples
    --------
    One sample of zero potentials, a sequence of 3 tokens with 2 labels:
    every labelling has probability ``1 / 2**3``.

    >>> import numpy as np
    >>> from skgpstruct.likelihoods import ChainCRF
    >>> crf = ChainCRF()
    >>> unary, pairwise = np.zeros((1, 3, 2)), np.zeros((1, 2, 2))
    >>> offsets, labels = np.array([0, 3]), np.array([0, 1, 1])
    >>> bool(np.isclose(crf.log_prob(unary, pairwise, offsets, labels)[0, 0],
    ...                 -3 * np.log(2)))
    True
    >>> log_p, grad_unary, grad_pairwise = crf.log_prob_and_gradient(
    ...     unary, pairwise, offsets, labels)
    >>> grad_unary[0, 0]  # observed minus expected: [1, 0] - [0.5, 0.5]
    array([ 0.5, -0.5])
    >>> grad_pairwise.shape  # (n_samples, n_sequences, n_classes, n_classes)
    (1, 1, 2, 2)
    """

    has_gradient = True

    # The arguments arrive checked (Likelihood.log_prob): the chain's own
    # checks are not repeated.
    def _log_prob(self, unary, pairwise, offsets, labels):
        return chain._log_likelihood_unchecked(unary, pairwise, offsets, labels, False)

    def _log_prob_and_gradient(self, unary, pairwise, offsets, labels):
        return chain._log_likelihood_unchecked(unary, pairwise, offsets, labels, True)
